//! The endpoint's driver: one tokio task per endpoint owns the socket and runs the protocol
//! core. Application handles share the core's state behind a mutex, issue commands on it and
//! wake the driver; the driver sends what the core produces, feeds it what arrives, runs its
//! timers and wakes the tasks that wait on events.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use tern_proto::{ConnectionError, ConnectionHandle, Event, FlowId, Message, MessageId};
use tokio::sync::{mpsc, Notify};

use crate::runtime;
use crate::socket::{AsyncUdpSocket, RecvMeta, Transmit, MAX_TRANSMIT_BYTES, RECV_BATCH};

/// Datagrams the driver takes from the socket before it runs timers and sends: a receiver
/// acknowledges within a burst instead of after it (which would delay the sender's clock by
/// the whole burst), and a flood cannot starve existing connections' ACKs and timers.
const RECV_BUDGET: usize = 256;

/// A callback run by the driver on every connection event (the up-call style, F8). It runs
/// on the driver task with the endpoint unlocked: it must be quick and must not block.
pub type Upcall = Arc<dyn Fn(ConnectionId, &Event) + Send + Sync>;

/// Names a connection for the lifetime of its endpoint (handles of the core are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionId {
    pub(crate) handle: ConnectionHandle,
    pub(crate) generation: u64,
}

/// Which events a subscription takes: `None` for all of them.
pub(crate) type EventFilter = Option<Box<dyn Fn(&Event) -> bool + Send + Sync>>;

/// One `Connection::events` subscription: bounded, with its count of events lost because its
/// reader fell behind, and its filter, applied before an event is copied or its reader woken.
pub(crate) struct Subscription {
    pub(crate) tx: mpsc::Sender<Event>,
    pub(crate) lagged: Arc<AtomicU64>,
    pub(crate) filter: EventFilter,
}

/// What tasks wait for on one connection.
#[derive(Default)]
pub(crate) struct ConnState {
    pub(crate) generation: u64,
    pub(crate) connected: bool,
    pub(crate) error: Option<ConnectionError>,
    pub(crate) drained: bool,
    /// Application handles alive (`Connection` clones); state is freed when this is zero and
    /// the connection is drained.
    pub(crate) handles: usize,
    /// What flow tasks wait for, made on first use: a connection that never uses a flow
    /// (requests and messages, or an idle one) does not carry five empty tables.
    pub(crate) flows: Option<Box<FlowWaits>>,
    pub(crate) waiters: Vec<Waker>,
    /// Subscriptions of `Connection::events` and `Connection::events_where`.
    pub(crate) events: Vec<Subscription>,
    /// How many messages at the head of the core's ready queue are for `recv_message`
    /// (sorted by `sort_messages`). They stay in the core until the application takes them:
    /// their credit goes back to the peer only then, so a peer can make us hold no more than
    /// the connection window (`FlowConfig::connection_window`) for an application that does
    /// not read, instead of whatever it sends.
    pub(crate) inbox_len: usize,
    pub(crate) message_waiters: Vec<Waker>,
    pub(crate) datagram_waiters: Vec<Waker>,
    /// `Connection::request` bookkeeping, made on the first request: most connections never
    /// make one, and 100 000 idle ones should not each carry five empty tables.
    pub(crate) requests: Option<Box<Requests>>,
}

/// What a connection's flow tasks wait for.
#[derive(Default)]
pub(crate) struct FlowWaits {
    pub(crate) read_wakers: HashMap<FlowId, Waker>,
    pub(crate) write_wakers: HashMap<FlowId, Waker>,
    pub(crate) finish_wakers: HashMap<FlowId, Waker>,
    /// Of the flows with a `SendFlow` alive (`held`), those finished and acknowledged, and
    /// those the peer stopped: kept for `finished()` and `stopped()`, and only while a
    /// handle could ask.
    pub(crate) finished: HashSet<FlowId>,
    pub(crate) stopped: HashMap<FlowId, u64>,
    pub(crate) held: HashSet<FlowId>,
}

/// What a connection's `request` calls wait for.
#[derive(Default)]
pub(crate) struct Requests {
    /// Replies taken from the core for the `request` awaiting each (one per request).
    pub(crate) replies: HashMap<MessageId, Message>,
    pub(crate) reply_waiters: HashMap<MessageId, Waker>,
    /// Requests sent with `Connection::request` that await a reply.
    pub(crate) pending: HashSet<MessageId>,
    /// Requests whose caller gave up (deadline or cancellation), oldest first: a late reply
    /// to one is dropped rather than left in the inbox. Bounded by [`ABANDONED_REMEMBERED`].
    abandoned: VecDeque<MessageId>,
    /// The same, to look them up.
    abandoned_set: HashSet<MessageId>,
}

/// How many abandoned requests a connection remembers so as to drop their late replies.
const ABANDONED_REMEMBERED: usize = 4096;

impl ConnState {
    /// The caller of `request` stopped waiting for the reply to `id`.
    pub(crate) fn abandon_request(&mut self, id: MessageId) {
        let Some(r) = self.requests.as_deref_mut() else {
            return;
        };
        if r.pending.remove(&id) {
            if r.abandoned.len() == ABANDONED_REMEMBERED {
                if let Some(old) = r.abandoned.pop_front() {
                    r.abandoned_set.remove(&old);
                }
            }
            r.abandoned.push_back(id);
            r.abandoned_set.insert(id);
        }
        r.reply_waiters.remove(&id);
        r.replies.remove(&id);
    }

    /// The request bookkeeping, made on first use.
    pub(crate) fn requests(&mut self) -> &mut Requests {
        self.requests.get_or_insert_with(Default::default)
    }

    /// Whether `request` awaits its reply.
    fn is_pending(&self, request: MessageId) -> bool {
        self.requests
            .as_ref()
            .is_some_and(|r| r.pending.contains(&request))
    }

    /// Whether `request` was abandoned (forgetting it if so: it has one reply at most).
    fn take_abandoned(&mut self, request: MessageId) -> bool {
        let Some(r) = self.requests.as_deref_mut() else {
            return false;
        };
        if !r.abandoned_set.remove(&request) {
            return false;
        }
        if let Some(i) = r.abandoned.iter().position(|a| *a == request) {
            r.abandoned.remove(i);
        }
        true
    }

    /// Looks at the messages the core completed since the last look (past `inbox_len`):
    /// replies to our pending requests are taken for them, late replies to abandoned ones
    /// are taken and dropped, and the rest stay in the core, in order, for `recv_message`.
    fn sort_messages(&mut self, conn: &mut tern_proto::Connection) {
        let mut inbox_grew = false;
        while let Some(m) = conn.peek_message(self.inbox_len) {
            let request = m.reply_to;
            match request {
                Some(r) if self.is_pending(r) => {
                    let Some(m) = conn.take_message(self.inbox_len) else {
                        break;
                    };
                    let requests = self.requests();
                    requests.pending.remove(&r);
                    if let Some(w) = requests.reply_waiters.remove(&r) {
                        w.wake();
                    }
                    requests.replies.insert(r, m);
                }
                Some(r) if self.take_abandoned(r) => {
                    conn.take_message(self.inbox_len);
                }
                _ => {
                    self.inbox_len += 1;
                    inbox_grew = true;
                }
            }
        }
        if inbox_grew {
            for w in self.message_waiters.drain(..) {
                w.wake();
            }
        }
    }

    /// The flow tables, made on first use.
    pub(crate) fn flow_waits(&mut self) -> &mut FlowWaits {
        self.flows.get_or_insert_with(Default::default)
    }

    fn wake_all(&mut self) {
        if let Some(f) = self.flows.as_deref_mut() {
            let wakers = f.read_wakers.drain().chain(f.write_wakers.drain());
            for (_, w) in wakers.chain(f.finish_wakers.drain()) {
                w.wake();
            }
        }
        for w in self.waiters.drain(..) {
            w.wake();
        }
        for w in self.message_waiters.drain(..) {
            w.wake();
        }
        if let Some(r) = self.requests.as_deref_mut() {
            for (_, w) in r.reply_waiters.drain() {
                w.wake();
            }
        }
        for w in self.datagram_waiters.drain(..) {
            w.wake();
        }
    }
}

/// Adds `waker` to a list of tasks to wake, once: a task that polls a fresh future on every
/// turn of a loop (`select!` on `closed()` and a read) must not add a clone per turn to a
/// list only an event drains.
pub(crate) fn wait_on(wakers: &mut Vec<Waker>, waker: &Waker) {
    if !wakers.iter().any(|w| w.will_wake(waker)) {
        wakers.push(waker.clone());
    }
}

/// State shared by the driver and the application handles.
pub(crate) struct Inner {
    pub(crate) proto: tern_proto::Endpoint,
    /// Boxed: the table's spare slots cost a pointer each, not a whole state.
    pub(crate) conns: HashMap<ConnectionHandle, Box<ConnState>>,
    next_generation: u64,
    pub(crate) incoming: VecDeque<ConnectionId>,
    pub(crate) accept_waiters: Vec<Waker>,
    pub(crate) upcalls: Vec<Upcall>,
    /// The driver stopped (socket error or endpoint dropped): why.
    pub(crate) dead: Option<String>,
    /// `Endpoint::close` was called with this code and reason: every connection is closed,
    /// and new ones are closed as soon as they arrive.
    pub(crate) closing: Option<(u64, Vec<u8>)>,
    /// Tasks waiting in `Endpoint::wait_idle`.
    pub(crate) idle_waiters: Vec<Waker>,
    pub(crate) gso_segments: usize,
    pub(crate) gro_segments: usize,
    /// Where connections' qlog records go (`EndpointBuilder::qlog_dir`, `TERN_QLOG_DIR`).
    pub(crate) qlog: Option<crate::qlog::QlogDir>,
    /// For a worker of a [`crate::Workers`] server: where datagrams for the other workers'
    /// connections go.
    pub(crate) steering: Option<crate::workers::Steering>,
    /// Connections in `conns` not drained yet (so that `is_idle`, asked at every `Drained`,
    /// does not walk 100 000 of them).
    undrained: usize,
    /// The core's timeout the driver last read (it sleeps until then at the latest, or
    /// runs again first): an inline sender that leaves no earlier timer and no event need
    /// not wake it.
    driver_deadline: Option<std::time::Instant>,
}

impl Inner {
    pub(crate) fn new(
        proto: tern_proto::Endpoint,
        gso_segments: usize,
        gro_segments: usize,
    ) -> Self {
        Self {
            proto,
            conns: HashMap::new(),
            next_generation: 1,
            incoming: VecDeque::new(),
            accept_waiters: Vec::new(),
            upcalls: Vec::new(),
            dead: None,
            closing: None,
            idle_waiters: Vec::new(),
            gso_segments,
            gro_segments,
            qlog: None,
            steering: None,
            undrained: 0,
            driver_deadline: None,
        }
    }

    /// Writes every connection's new qlog records; closes the files of drained ones.
    fn write_qlog(&mut self) {
        let handles: Vec<(ConnectionHandle, u64, bool)> = match self.qlog {
            Some(_) => self
                .conns
                .iter()
                .map(|(&h, s)| (h, s.generation, s.drained))
                .collect(),
            None => return,
        };
        for (handle, generation, drained) in handles {
            self.write_qlog_of(handle, generation, drained);
        }
    }

    /// Writes one connection's new qlog records, and closes its file if `finish`.
    fn write_qlog_of(&mut self, handle: ConnectionHandle, generation: u64, finish: bool) {
        let Some(q) = &mut self.qlog else { return };
        let mut result = Ok(());
        if let Some(c) = self.proto.connection_mut(handle) {
            let side = c.side();
            let records = std::iter::from_fn(|| c.poll_qlog());
            result = q.write(handle, generation, side, records);
        }
        if finish {
            result = result.and(q.finish(handle, generation));
        }
        if let Err(e) = result {
            tracing::warn!("qlog: {e}; no more qlog for this endpoint");
            self.qlog = None;
        }
    }

    /// Frees a drained connection nobody holds any more: its last qlog records and its
    /// file first.
    fn forget(&mut self, handle: ConnectionHandle, generation: u64) {
        self.write_qlog_of(handle, generation, true);
        self.conns.remove(&handle);
        self.proto.release(handle);
    }

    /// Registers a connection the core just created.
    pub(crate) fn register(&mut self, handle: ConnectionHandle) -> ConnectionId {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.undrained += 1;
        self.conns.insert(
            handle,
            Box::new(ConnState {
                generation,
                ..ConnState::default()
            }),
        );
        ConnectionId { handle, generation }
    }

    /// Whether every connection has finished closing (or the driver stopped).
    pub(crate) fn is_idle(&self) -> bool {
        self.dead.is_some()
            || (self.undrained == 0 && self.proto.connection_count() == self.conns.len())
    }

    /// Closes every connection the application knows of (see `Endpoint::close`).
    pub(crate) fn close_all(&mut self, now: std::time::Instant) {
        let Some((code, reason)) = self.closing.clone() else {
            return;
        };
        let handles: Vec<ConnectionHandle> = self.conns.keys().copied().collect();
        for h in handles {
            if let Some(c) = self.proto.connection_mut(h) {
                c.close(now, code, &reason);
            }
        }
    }

    /// The state of `id`, if it is still that connection.
    pub(crate) fn state(&mut self, id: ConnectionId) -> Option<&mut ConnState> {
        self.conns
            .get_mut(&id.handle)
            .filter(|s| s.generation == id.generation)
            .map(|s| &mut **s)
    }

    /// The core's connection for `id`, if still alive (none once the endpoint stopped: a
    /// core nobody drives any more would take writes that never leave).
    pub(crate) fn connection(&mut self, id: ConnectionId) -> Option<&mut tern_proto::Connection> {
        if self.dead.is_some() {
            return None;
        }
        self.state(id)?;
        self.proto.connection_mut(id.handle)
    }

    /// Stops the endpoint (aborted, its socket failed, or its driver ended): every
    /// connection ends with [`ConnectionError::EndpointStopped`], its event streams end,
    /// and every waiting task is woken to see it. Returns the subscriptions taken off, for
    /// the caller to drop once the lock is released (a filter may hold a `Connection`, whose
    /// drop takes the lock).
    #[must_use]
    pub(crate) fn stop(&mut self, reason: &str) -> Vec<Subscription> {
        let mut ended = Vec::new();
        if self.dead.is_some() {
            return ended;
        }
        self.dead = Some(reason.to_owned());
        for s in self.conns.values_mut() {
            s.error
                .get_or_insert_with(|| ConnectionError::EndpointStopped {
                    reason: reason.to_owned(),
                });
            ended.append(&mut s.events);
            s.wake_all();
        }
        for w in self.accept_waiters.drain(..) {
            w.wake();
        }
        for w in self.idle_waiters.drain(..) {
            w.wake();
        }
        ended
    }

    /// One application handle of `id` is gone. The last one frees a drained connection,
    /// and closes a live one (code 0, no reason; what was not yet sent is dropped, as a
    /// quinn connection is): nobody is left to use it, and left alone it would live on until
    /// its idle timeout, or for good against a peer that keeps it alive. Returns whether it
    /// closed one (it has a Close to send).
    pub(crate) fn release(&mut self, id: ConnectionId) -> bool {
        let Some(s) = self.state(id) else {
            return false;
        };
        s.handles = s.handles.saturating_sub(1);
        if s.handles > 0 {
            return false;
        }
        if s.drained {
            self.forget(id.handle, id.generation);
            return false;
        }
        let dead = self.dead.is_some();
        match self.proto.connection_mut(id.handle) {
            Some(c) if !dead && !c.is_closed() => {
                c.close(runtime::now(), 0, b"");
                true
            }
            _ => false,
        }
    }

    /// Takes the next message for `recv_message` from the core (giving its credit back).
    pub(crate) fn take_inbox(&mut self, id: ConnectionId) -> Option<Message> {
        let s = self
            .conns
            .get_mut(&id.handle)
            .filter(|s| s.generation == id.generation)?;
        if s.inbox_len == 0 {
            return None;
        }
        let m = self.proto.connection_mut(id.handle)?.take_message(0);
        match m {
            Some(_) => s.inbox_len -= 1,
            // Cannot happen (the core only drops ready messages when taken); recount.
            None => s.inbox_len = 0,
        }
        m
    }

    fn id_of(&self, handle: ConnectionHandle) -> Option<ConnectionId> {
        self.conns.get(&handle).map(|s| ConnectionId {
            handle,
            generation: s.generation,
        })
    }
}

/// The shared half: state plus the driver's wake-up.
pub(crate) struct Shared {
    pub(crate) inner: Mutex<Inner>,
    pub(crate) wake: Notify,
    /// Counters of the socket I/O, kept outside the lock (the driver sends without it).
    pub(crate) io: IoCounters,
    /// Datagrams other workers received for this one's connections (see
    /// [`crate::workers`]); a leaf lock, never held while taking `inner`.
    pub(crate) forwarded: Mutex<Vec<crate::workers::Forwarded>>,
    /// The socket: the driver receives on it, and whoever holds `send` sends on it.
    pub(crate) socket: Arc<dyn AsyncUdpSocket>,
    /// The right to send, so that datagrams leave in the order the core wrote them: the
    /// driver holds it from collecting its transmits to the end of its sends; an
    /// application task that just gave a connection something to send takes it if free
    /// (`try_lock`, never waiting while it holds `inner`) and sends at once itself
    /// ([`Shared::transmit_now`]), sparing the driver's wake-up on the way out.
    pub(crate) send: tokio::sync::Mutex<SendState>,
    /// Application handles alive (`Endpoint` and `Connection` clones): the driver ends
    /// once there are none and no connection is left to serve. Counted, not read from the
    /// `Arc`'s count, so that a handle's drop can wake the driver after it no longer counts.
    pub(crate) handles: AtomicUsize,
}

/// Buffers of the sending side, shared by the driver and inline senders.
#[derive(Default)]
pub(crate) struct SendState {
    batches: Vec<Batch>,
    spare: Vec<Vec<u8>>,
    /// Batches an inline sender found the socket too full for: the driver sends them first.
    deferred: Vec<Batch>,
}

/// Socket-level counters of an endpoint (see [`crate::IoStats`]).
#[derive(Default)]
pub(crate) struct IoCounters {
    pub(crate) send_calls: AtomicU64,
    pub(crate) datagrams_sent: AtomicU64,
    pub(crate) send_errors: AtomicU64,
    pub(crate) recv_calls: AtomicU64,
    pub(crate) datagrams_received: AtomicU64,
    pub(crate) datagrams_forwarded: AtomicU64,
}

/// What an endpoint's socket did: how well GSO and GRO batch, and send errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoStats {
    /// `sendmsg` calls (one per GSO batch or single datagram).
    pub send_calls: u64,
    /// Datagrams the kernel took: `datagrams_sent / send_calls` is the GSO batch size.
    pub datagrams_sent: u64,
    /// Sends the kernel refused (the datagrams are left to loss recovery).
    pub send_errors: u64,
    /// Receive calls that returned data (`recvmmsg`, each up to 32 buffers).
    pub recv_calls: u64,
    /// Datagrams received (GRO segments counted one by one).
    pub datagrams_received: u64,
    /// Of those, datagrams passed to another worker of a [`crate::Workers`] server (their
    /// connection is that worker's: a client that moved).
    pub datagrams_forwarded: u64,
}

impl IoCounters {
    /// One send call of `count` datagrams to `dest`.
    fn count_send(&self, dest: &SocketAddr, count: usize, sent: std::io::Result<()>) {
        self.send_calls.fetch_add(1, Ordering::Relaxed);
        match sent {
            Ok(()) => {
                self.datagrams_sent
                    .fetch_add(count as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%dest, "send error: {e}");
            }
        }
    }

    pub(crate) fn snapshot(&self) -> IoStats {
        IoStats {
            send_calls: self.send_calls.load(Ordering::Relaxed),
            datagrams_sent: self.datagrams_sent.load(Ordering::Relaxed),
            send_errors: self.send_errors.load(Ordering::Relaxed),
            recv_calls: self.recv_calls.load(Ordering::Relaxed),
            datagrams_received: self.datagrams_received.load(Ordering::Relaxed),
            datagrams_forwarded: self.datagrams_forwarded.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    /// Sends what the core has to send now from the calling task if nobody else is sending
    /// (else the driver will), then wakes the driver if it has work: something left to
    /// send, an event to deliver, or a timer earlier than the one it sleeps on. Called after
    /// every application command that may give a connection something to send: a request
    /// leaves without waiting for the driver task to be scheduled, and a request or reply
    /// that only moves a timer later costs no driver pass (a task wake-up per message, on
    /// another core when the runtime has several).
    pub(crate) fn transmit_now(&self) {
        if !self.send_inline() {
            self.wake.notify_one();
        }
    }

    /// The sending half of [`Shared::transmit_now`]: whether the driver can sleep on.
    fn send_inline(&self) -> bool {
        let now = runtime::now();
        let mut inner = self.lock();
        let sender = match self.send.try_lock() {
            Ok(s) if inner.dead.is_none() => Some(s),
            _ => None,
        };
        let Some(mut tx) = sender else {
            return false;
        };
        let tx = &mut *tx;
        collect_transmits(&mut inner, now, &mut tx.batches, &mut tx.spare);
        let asleep = !inner.proto.may_have_events()
            && match (inner.proto.poll_timeout(), inner.driver_deadline) {
                (None, _) => true,
                (Some(t), Some(deadline)) => t >= deadline,
                (Some(_), None) => false,
            };
        drop(inner);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut blocked = !tx.deferred.is_empty();
        for batch in tx.batches.drain(..) {
            if blocked {
                tx.deferred.push(batch);
                continue;
            }
            match self.socket.poll_send(&mut cx, &batch.transmit()) {
                Poll::Pending => {
                    blocked = true;
                    tx.deferred.push(batch);
                }
                Poll::Ready(Err(_)) if gso_refused(&*self.socket, &batch) => {
                    // GSO does not work here: the driver sends it one by one.
                    blocked = true;
                    tx.deferred.push(batch);
                }
                Poll::Ready(sent) => {
                    self.io.count_send(&batch.destination, batch.count, sent);
                    tx.spare.push(batch.data);
                }
            }
        }
        asleep && !blocked
    }

    /// Stops the endpoint ([`Inner::stop`]); the subscriptions it ends are dropped after the
    /// lock is released.
    pub(crate) fn stop(&self, reason: &str) {
        let ended = self.lock().stop(reason);
        drop(ended);
    }

    /// A new application handle.
    pub(crate) fn add_handle(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    /// An application handle is gone. The last one closes what nobody can use any more
    /// (connections not accepted yet, or still in their handshake, as `Endpoint::close` with
    /// code 0 does) and wakes the driver, which ends once no connection is left (it would
    /// otherwise sleep on, holding its socket and port).
    pub(crate) fn drop_handle(&self) {
        if self.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut inner = self.lock();
            if inner.closing.is_none() && inner.dead.is_none() {
                inner.closing = Some((0, Vec::new()));
                inner.close_all(runtime::now());
            }
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// Locks the state. A panic while holding the lock is a bug in tern; the state is still
    /// consistent enough to shut down, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A batch of datagrams for one destination and ECN codepoint, all `segment` bytes but the
/// last.
struct Batch {
    destination: SocketAddr,
    source: Option<std::net::IpAddr>,
    ecn: Option<tern_proto::EcnCodepoint>,
    data: Vec<u8>,
    segment: usize,
    count: usize,
    /// A PMTU probe, alone in its batch: the kernel may refuse it (`EMSGSIZE`) if it is
    /// larger than the interface takes, and must not take other datagrams down with it.
    pmtu_probe: bool,
}

impl Batch {
    fn transmit(&self) -> Transmit<'_> {
        Transmit {
            destination: self.destination,
            src_ip: self.source,
            ecn: self.ecn,
            contents: &self.data,
            segment_size: (self.count > 1).then_some(self.segment),
        }
    }
}

/// Whether a GSO batch the kernel refused failed as a batch (the socket now allows fewer
/// segments than it holds: quinn-udp lowers the limit when GSO itself fails), not for a
/// reason every datagram shares (an unreachable network), which sending them one by one
/// would only repeat.
fn gso_refused(socket: &dyn AsyncUdpSocket, batch: &Batch) -> bool {
    batch.count > 1 && socket.max_transmit_segments() < batch.count
}

/// Size of each receive buffer: the largest UDP datagram, or a GRO batch.
const RECV_BUFFER: usize = 64 * 1024;

/// Stops the endpoint when the driver ends, however it ends (a panic included): tasks
/// waiting on it get an error instead of waiting for good.
struct StopOnExit<'a>(&'a Shared);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        let reason = if std::thread::panicking() {
            "the endpoint's task panicked"
        } else {
            "the endpoint's task ended"
        };
        self.0.stop(reason);
    }
}

/// Whether a receive error concerns one datagram or peer (an ICMP error on a connected
/// socket, an interrupted call, memory short for a moment), not the socket: the driver
/// skips it and goes on.
fn transient(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | Interrupted
            | WouldBlock
            | TimedOut
            | OutOfMemory
            | HostUnreachable
            | NetworkUnreachable
    ) || [Errno::ENOBUFS, Errno::EMSGSIZE]
        .iter()
        .any(|n| e.raw_os_error() == Some(*n as i32))
}

/// Runs the endpoint until every handle is gone and nothing is left to send.
pub(crate) async fn drive(shared: Arc<Shared>) {
    let _stop = StopOnExit(&shared);
    let socket = shared.socket.clone();
    let mut storage = vec![0u8; RECV_BATCH * RECV_BUFFER];
    let mut metas = [RecvMeta::default(); RECV_BATCH];
    let mut events: Vec<(ConnectionHandle, Event)> = Vec::new();
    let mut ended: Vec<Subscription> = Vec::new();
    // Buffers the wait below filled, to hand to the core first.
    let mut waiting = 0;
    let mut forwarded = Vec::new();
    loop {
        // 0. What other workers received for our connections.
        std::mem::swap(
            &mut forwarded,
            &mut *shared.forwarded.lock().unwrap_or_else(|p| p.into_inner()),
        );
        if !forwarded.is_empty() {
            let now = runtime::now();
            let mut inner = shared.lock();
            for mut f in forwarded.drain(..) {
                inner
                    .proto
                    .handle_on(now, f.local, f.remote, f.ecn, &mut f.data);
            }
        }
        // 1. Receive what is ready, up to the budget.
        let mut received = 0;
        while received < RECV_BUDGET {
            let n = if waiting > 0 {
                std::mem::take(&mut waiting)
            } else {
                // Poll once with the task's own waker: `Pending` means nothing is waiting.
                std::future::poll_fn(|cx| {
                    let mut bufs = recv_bufs(&mut storage);
                    Poll::Ready(match socket.poll_recv(cx, &mut bufs, &mut metas) {
                        Poll::Ready(Ok(n)) => n,
                        Poll::Ready(Err(e)) => {
                            // ICMP errors and the like surface here; they are not fatal.
                            tracing::debug!("recv error: {e}");
                            0
                        }
                        Poll::Pending => 0,
                    })
                })
                .await
            };
            if n == 0 {
                break;
            }
            shared.io.recv_calls.fetch_add(1, Ordering::Relaxed);
            let before = received;
            let now = runtime::now();
            let mut guard = shared.lock();
            let inner = &mut *guard;
            for (meta, buf) in metas.iter().zip(storage.chunks_mut(RECV_BUFFER)).take(n) {
                // No stride (a socket that does not say) is one datagram, not a byte each.
                let stride = if meta.stride == 0 {
                    meta.len
                } else {
                    meta.stride
                }
                .max(1);
                for datagram in buf[..meta.len.min(RECV_BUFFER)].chunks_mut(stride) {
                    received += 1;
                    if let Some(steering) = &inner.steering {
                        if steering.forward(&inner.proto, meta, datagram) {
                            shared
                                .io
                                .datagrams_forwarded
                                .fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                    inner
                        .proto
                        .handle_on(now, meta.dst_ip, meta.addr, meta.ecn, datagram);
                }
            }
            drop(guard);
            shared
                .io
                .datagrams_received
                .fetch_add((received - before) as u64, Ordering::Relaxed);
        }
        // The budget ran out: more may be waiting, so do not sleep below.
        let more_to_read = received >= RECV_BUDGET;

        // 2. Timers, transmits and events, under the lock; the right to send first, so
        //    that what an inline sender left behind goes before what is collected now.
        let mut send = shared.send.lock().await;
        let timeout = {
            let now = runtime::now();
            let mut inner = shared.lock();
            if inner.proto.poll_timeout().is_some_and(|t| t <= now) {
                inner.proto.handle_timeout(now);
            }
            accept_incoming(&mut inner);
            let tx = &mut *send;
            collect_transmits(&mut inner, now, &mut tx.batches, &mut tx.spare);
            while let Some(e) = inner.proto.poll_event() {
                events.push(e);
            }
            let upcalls = dispatch(&mut inner, &events, &mut ended);
            // After dispatch, under the same lock: a connection it found drained has its
            // file complete before anyone woken by that can look.
            inner.write_qlog();
            // The up-calls run outside the lock (one may call into the endpoint); those
            // registered now see this pass's events, one registered by an up-call the next.
            let calls = if upcalls.is_empty() {
                Vec::new()
            } else {
                inner.upcalls.clone()
            };
            drop(inner);
            ended.clear();
            for (id, event) in upcalls {
                for call in &calls {
                    call(id, &event);
                }
            }
            events.clear();
            let mut inner = shared.lock();
            if inner.dead.is_some() {
                return;
            }
            let timeout = inner.proto.poll_timeout();
            inner.driver_deadline = timeout;
            timeout
        };

        // 3. Send outside the lock: what an inline sender deferred, then the new batches.
        let tx = &mut *send;
        let deferred = std::mem::take(&mut tx.deferred);
        let batches = std::mem::take(&mut tx.batches);
        for batch in deferred.into_iter().chain(batches) {
            let transmit = batch.transmit();
            let sent = std::future::poll_fn(|cx| socket.poll_send(cx, &transmit)).await;
            if sent.is_err() && gso_refused(&*socket, &batch) {
                // GSO does not work on this route: quinn-udp lowered the socket's segment
                // limit after EIO or EINVAL (an IPsec route, a NIC without checksum
                // offload). The datagrams go one by one, and later batches follow the limit.
                tracing::debug!(dest = %batch.destination, "GSO batch refused; sent one by one");
                shared.lock().gso_segments = socket.max_transmit_segments().max(1);
                for datagram in batch.data.chunks(batch.segment) {
                    let transmit = Transmit {
                        contents: datagram,
                        segment_size: None,
                        ..batch.transmit()
                    };
                    let sent = std::future::poll_fn(|cx| socket.poll_send(cx, &transmit)).await;
                    shared.io.count_send(&batch.destination, 1, sent);
                }
            } else {
                shared.io.count_send(&batch.destination, batch.count, sent);
            }
            tx.spare.push(batch.data);
        }
        drop(send);
        // 4. Wait for a datagram, a timer or a command; a batch just sent may have left more
        //    to send, so only wait if the core is idle now.
        let more_now = more_to_read || timeout.is_some_and(|t| t <= runtime::now());
        if more_now {
            continue;
        }
        if shared.handles.load(Ordering::Acquire) == 0
            && shared.lock().proto.connection_count() == 0
        {
            // Every application handle is gone and no connection is left to serve.
            return;
        }
        // Nothing to do until the next datagram: the next handshake's X25519 work now (once;
        // a handshake in flight is waiting for its peer anyway), not when it starts.
        shared.lock().proto.prepare_handshake();
        let sleep = async {
            match timeout {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let recv = std::future::poll_fn(|cx| {
            let mut bufs = recv_bufs(&mut storage);
            socket.poll_recv(cx, &mut bufs, &mut metas)
        });
        tokio::select! {
            r = recv => match r {
                Ok(n) => waiting = n,
                Err(e) if transient(&e) => tracing::debug!("recv error: {e}"),
                Err(e) => {
                    shared.stop(&format!("socket failed: {e}"));
                    return;
                }
            },
            _ = sleep => {}
            _ = shared.wake.notified() => {}
        }
    }
}

/// A cleared buffer, reused from `spare` when one is there.
fn empty_buffer(spare: &mut Vec<Vec<u8>>) -> Vec<u8> {
    let mut data = spare.pop().unwrap_or_default();
    data.clear();
    data
}

/// The receive buffers over `storage`, one per datagram (or GRO batch).
fn recv_bufs(storage: &mut [u8]) -> Vec<IoSliceMut<'_>> {
    storage
        .chunks_mut(RECV_BUFFER)
        .map(IoSliceMut::new)
        .collect()
}

/// Polls the core for datagrams and groups consecutive ones to the same destination into
/// GSO batches of equal-sized segments.
fn collect_transmits(
    inner: &mut Inner,
    now: std::time::Instant,
    batches: &mut Vec<Batch>,
    spare: &mut Vec<Vec<u8>>,
) {
    let max_segments = inner.gso_segments.max(1);
    loop {
        // The core appends each datagram straight to the open batch (no copy); one that turns
        // out not to belong there (another address or ECN mark, larger than the batch's
        // segments, or past its byte cap) is moved to a new batch.
        let open = batches
            .last_mut()
            .filter(|b| b.count < max_segments && b.data.len() % b.segment == 0 && !b.pmtu_probe);
        let (t, moved) = match open {
            Some(b) => {
                let start = b.data.len();
                // `None` appends nothing (the core's guarantee): the batch stays whole.
                let Some(t) = inner.proto.poll_transmit(now, &mut b.data) else {
                    break;
                };
                let fits = b.destination == t.destination
                    && b.source == t.source
                    && b.ecn == t.ecn
                    && t.size <= b.segment
                    && !t.pmtu_probe
                    && b.data.len() <= MAX_TRANSMIT_BYTES;
                if fits {
                    b.count += 1;
                    continue;
                }
                let mut data = empty_buffer(spare);
                data.extend_from_slice(&b.data[start..]);
                b.data.truncate(start);
                (t, data)
            }
            None => {
                let mut data = empty_buffer(spare);
                let Some(t) = inner.proto.poll_transmit(now, &mut data) else {
                    spare.push(data);
                    break;
                };
                (t, data)
            }
        };
        batches.push(Batch {
            destination: t.destination,
            source: t.source,
            ecn: t.ecn,
            data: moved,
            segment: t.size,
            count: 1,
            pmtu_probe: t.pmtu_probe,
        });
    }
}

/// Registers the connections the core accepted and hands them to `accept`, or, while the
/// endpoint is closing, closes them at once (before the next transmit, so the close leaves in
/// the same pass).
fn accept_incoming(inner: &mut Inner) {
    while let Some(handle) = inner.proto.accept() {
        let id = inner.register(handle);
        if inner.closing.is_some() {
            // The endpoint is shutting down: refuse it with the endpoint's close.
            inner.close_all(runtime::now());
            continue;
        }
        inner.incoming.push_back(id);
        for w in inner.accept_waiters.drain(..) {
            w.wake();
        }
    }
}

/// Wakes the tasks waiting on these events and returns the ones up-calls should see (none
/// when no up-call is registered).
///
/// Subscriptions that end go to `ended`, for the caller to drop once the lock is released:
/// a filter may hold a `Connection`, whose drop takes the lock.
fn dispatch(
    inner: &mut Inner,
    events: &[(ConnectionHandle, Event)],
    ended: &mut Vec<Subscription>,
) -> Vec<(ConnectionId, Event)> {
    // New incoming connections first, so that their events below find their state.
    accept_incoming(inner);
    let upcalls = !inner.upcalls.is_empty();
    let mut out = Vec::new();
    for (handle, event) in events {
        let Some(id) = inner.id_of(*handle) else {
            continue;
        };
        let Some(s) = inner.conns.get_mut(handle) else {
            continue;
        };
        match event {
            Event::Connected => {
                s.connected = true;
                s.wake_all();
            }
            Event::FlowOpened { .. } | Event::FlowsAvailable(_) => {
                for w in s.waiters.drain(..) {
                    w.wake();
                }
            }
            Event::FlowReadable(f) => {
                let waker = s.flows.as_deref_mut().and_then(|w| w.read_wakers.remove(f));
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Event::FlowWritable(f) => {
                let waker = s
                    .flows
                    .as_deref_mut()
                    .and_then(|w| w.write_wakers.remove(f));
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Event::FlowFinished(f) => {
                let waits = s.flow_waits();
                if waits.held.contains(f) {
                    waits.finished.insert(*f);
                }
                if let Some(w) = waits.finish_wakers.remove(f) {
                    w.wake();
                }
            }
            Event::FlowStopped { id: f, code } => {
                let waits = s.flow_waits();
                if waits.held.contains(f) {
                    waits.stopped.insert(*f, *code);
                }
                if let Some(w) = waits.write_wakers.remove(f) {
                    w.wake();
                }
                if let Some(w) = waits.finish_wakers.remove(f) {
                    w.wake();
                }
            }
            Event::Closed(e) => {
                s.error.get_or_insert_with(|| e.clone());
                s.wake_all();
            }
            Event::Drained => {
                if !s.drained {
                    s.drained = true;
                    inner.undrained -= 1;
                }
                s.wake_all();
            }
            Event::MessageReceived => {
                // Replies go to their requests; the rest wait in the core for `recv_message`.
                if let Some(conn) = inner.proto.connection_mut(*handle) {
                    s.sort_messages(conn);
                }
            }
            Event::DatagramReceived => {
                for w in s.datagram_waiters.drain(..) {
                    w.wake();
                }
            }
            _ => {}
        }
        let keep = |sub: &Subscription| {
            if sub.filter.as_ref().is_some_and(|wants| !wants(event)) {
                return !sub.tx.is_closed();
            }
            match sub.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    sub.lagged.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        };
        for sub in std::mem::take(&mut s.events) {
            if keep(&sub) {
                s.events.push(sub);
            } else {
                ended.push(sub);
            }
        }
        if upcalls {
            out.push((id, event.clone()));
        }
        if matches!(event, Event::Drained) {
            if let Some(s) = inner.conns.get_mut(handle) {
                // Nothing more will come: the streams end (their readers see `None`).
                ended.append(&mut s.events);
                if s.handles == 0 {
                    inner.forget(id.handle, id.generation);
                }
            }
            if inner.is_idle() {
                for w in inner.idle_waiters.drain(..) {
                    w.wake();
                }
            }
        }
    }
    out
}
