//! Connections and flows as async objects.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tern_proto::{
    ConnectionError, ConnectionStats, DatagramError, Dir, Event, FlowId, Message, MessageId,
    MessageOptions, OpenError, PublicKey, SendMessageError,
};
use tokio::sync::mpsc;

use crate::driver::{ConnectionId, Shared};
use crate::flow::{RecvFlow, SendFlow};

/// An established tern connection. Cheap to clone; every clone is the same connection.
///
/// Dropping the last handle (clones, and the flow halves, which hold one each) closes the
/// connection with code 0 and drops what was not sent yet, as quinn does; [`close`] and
/// [`closed`] end it gracefully.
///
/// [`close`]: Connection::close
/// [`closed`]: Connection::closed
///
/// ```no_run
/// # async fn f(conn: tern::Connection) -> Result<(), Box<dyn std::error::Error>> {
/// use tokio::io::AsyncWriteExt;
/// let mut flow = conn.open_uni().await?;
/// flow.write_all(b"frame").await?;
/// flow.finish()?;
/// flow.finished().await?; // everything acknowledged
/// # Ok(()) }
/// ```
pub struct Connection {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: ConnectionId,
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        Self::new(self.shared.clone(), self.id)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let closed = self.shared.lock().release(self.id);
        if closed {
            self.shared.transmit_now();
        }
        self.shared.drop_handle();
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("id", &self.id).finish()
    }
}

/// The error of an operation on a closed connection.
pub(crate) fn closed_error(shared: &Shared, id: ConnectionId) -> ConnectionError {
    let mut inner = shared.lock();
    if let Some(reason) = inner.state(id).and_then(|s| s.error.clone()) {
        return reason;
    }
    inner
        .proto
        .connection(id.handle)
        .and_then(|c| c.close_reason().cloned())
        .unwrap_or(ConnectionError::TimedOut)
}

impl Connection {
    pub(crate) fn new(shared: Arc<Shared>, id: ConnectionId) -> Self {
        if let Some(s) = shared.lock().state(id) {
            s.handles += 1;
        }
        shared.add_handle();
        Self { shared, id }
    }

    /// This connection's name within its endpoint (as passed to up-calls).
    pub fn id(&self) -> ConnectionId {
        self.id
    }

    /// The peer's address on the primary path.
    pub fn remote_address(&self) -> Option<std::net::SocketAddr> {
        let mut inner = self.shared.lock();
        inner.connection(self.id).map(|c| c.remote_address())
    }

    /// The peer's static public key (its identity).
    pub fn peer_key(&self) -> Option<PublicKey> {
        let mut inner = self.shared.lock();
        inner.connection(self.id).and_then(|c| c.peer_key())
    }

    /// Round-trip time, congestion window, pacing rate, bytes and losses.
    pub fn stats(&self) -> ConnectionStats {
        let mut inner = self.shared.lock();
        inner
            .connection(self.id)
            .map(|c| c.stats())
            .unwrap_or_default()
    }

    /// Every path of the connection (DESIGN.md F15) with its own figures: addresses, state
    /// (active, standby, dead), validation, RTT, window, bytes each way.
    pub fn paths(&self) -> Vec<crate::PathStats> {
        let mut inner = self.shared.lock();
        inner
            .connection(self.id)
            .map(|c| c.path_stats())
            .unwrap_or_default()
    }

    /// The rate the application should produce data at now (DESIGN.md F13), or `None` before
    /// it is known (no RTT sample yet): a tern router's rate where one stamps the path and
    /// the explicit-rate controller runs ([`cc::Algorithm::Explicit`](crate::cc::Algorithm)),
    /// else the congestion controller's estimate; scaled by min RTT / RTT so that an encoder
    /// whose data queues up is asked for less; less packet overheads; summed over the active
    /// paths. Changes of more than 10 % arrive as [`Event::TargetRate`] on
    /// [`events`](Self::events), at most once per round trip.
    pub fn target_rate(&self) -> Option<crate::TargetRate> {
        let mut inner = self.shared.lock();
        inner.connection(self.id).and_then(|c| c.target_rate())
    }

    /// Declares the rate the application expects to produce, in bytes per second (`None`:
    /// unset, the default). The explicit-rate controller never paces above it and declares it
    /// to routers, which weight their shares by it (F12); other controllers ignore it.
    pub fn set_expected_rate(&self, bytes_per_second: Option<u64>) {
        let mut inner = self.shared.lock();
        if let Some(c) = inner.connection(self.id) {
            c.set_expected_rate(bytes_per_second);
        }
        drop(inner);
        self.transmit_now();
    }

    /// Makes a path active, standby (used only while no active path works: the handover
    /// mode) or abandoned (never used again); the peer is told, so both ends agree. Returns
    /// false if the connection has no such path, it was abandoned, or `state` is `Dead`.
    pub fn set_path_state(&self, id: u32, state: crate::PathState) -> bool {
        let mut inner = self.shared.lock();
        let done = inner
            .connection(self.id)
            .is_some_and(|c| c.set_path_state(crate::runtime::now(), id, state));
        drop(inner);
        self.transmit_now();
        done
    }

    /// Server: withdraws one of the addresses this endpoint advertised
    /// (`ConnectionConfig::advertise`), e.g. before that interface goes down: the client
    /// abandons its paths to it and moves their data elsewhere. Returns false if the address
    /// was not advertised or was already withdrawn.
    pub fn remove_address(&self, addr: std::net::SocketAddr) -> bool {
        let done = self
            .shared
            .lock()
            .connection(self.id)
            .is_some_and(|c| c.remove_address(addr));
        self.transmit_now();
        done
    }

    /// The stream of this connection's events (F8), from now on. Each call makes a new,
    /// independent subscription. It holds at most [`EVENT_QUEUE`] events: a reader that falls
    /// further behind loses the newest ones, counted by [`EventStream::lagged`], so that a
    /// subscriber that never reads cannot make the runtime buffer without bound.
    pub fn events(&self) -> EventStream {
        self.subscribe(None)
    }

    /// Like [`events`](Self::events), but only the events `wanted` accepts reach the
    /// stream. The test runs on the endpoint's driver for each of this connection's events,
    /// before the event is copied or the reader woken: a task that waits for path events or
    /// the close costs nothing per packet, whereas an [`events`](Self::events) reader is
    /// sent a `FlowReadable` and woken for every batch of data that arrives (on a
    /// multi-threaded runtime, often on the other core). Keep it a cheap test such as a
    /// `matches!`; it must not call into the connection or the endpoint.
    ///
    /// ```no_run
    /// # async fn f(conn: tern::Connection) {
    /// use tern::Event;
    /// let mut path_events = conn.events_where(|e| {
    ///     matches!(e, Event::PathDead { .. } | Event::PathAlive { .. } | Event::Closed(_))
    /// });
    /// while let Some(e) = path_events.next().await {
    ///     println!("{e:?}");
    /// }
    /// # }
    /// ```
    pub fn events_where(
        &self,
        wanted: impl Fn(&Event) -> bool + Send + Sync + 'static,
    ) -> EventStream {
        self.subscribe(Some(Box::new(wanted)))
    }

    fn subscribe(&self, filter: crate::driver::EventFilter) -> EventStream {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let lagged = Arc::new(AtomicU64::new(0));
        let mut inner = self.shared.lock();
        let dead = inner.dead.is_some();
        // A drained connection (or a stopped endpoint) has no events to come: the stream
        // ends at once (its sender is dropped here).
        if let Some(s) = inner.state(self.id).filter(|s| !s.drained && !dead) {
            s.events.push(crate::driver::Subscription {
                tx,
                lagged: lagged.clone(),
                filter,
            });
        }
        EventStream { rx, lagged }
    }

    /// What the application just did may have given the connection something to send:
    /// send it now from this task if the socket is free, and wake the driver.
    pub(crate) fn transmit_now(&self) {
        self.shared.transmit_now();
    }

    /// Wakes the driver whether or not it has work now.
    pub(crate) fn wake_driver(&self) {
        self.shared.wake.notify_one();
    }

    /// Runs `f` on the core's connection under the lock, then sends what it gave the
    /// connection to send ([`Connection::transmit_now`]). `None` if the connection is gone.
    pub(crate) fn with_core<T>(
        &self,
        f: impl FnOnce(&mut tern_proto::Connection) -> T,
    ) -> Option<T> {
        let r = self.shared.lock().connection(self.id).map(f);
        self.transmit_now();
        r
    }

    async fn open(&self, dir: Dir) -> Result<FlowId, ConnectionError> {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            let Some(conn) = inner.connection(self.id) else {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            };
            match conn.open_flow(dir) {
                Ok(id) => Poll::Ready(Ok(id)),
                Err(OpenError::Blocked) => {
                    if let Some(s) = inner.state(self.id) {
                        crate::driver::wait_on(&mut s.waiters, cx.waker());
                    }
                    Poll::Pending
                }
                Err(_) => {
                    drop(inner);
                    Poll::Ready(Err(closed_error(&self.shared, self.id)))
                }
            }
        })
        .await
    }

    /// Opens a one-way flow. Costs no round trip; waits only if the peer's flow limit is
    /// reached.
    pub async fn open_uni(&self) -> Result<SendFlow, ConnectionError> {
        let id = self.open(Dir::Uni).await?;
        Ok(SendFlow::new(self.clone(), id))
    }

    /// Opens a two-way flow.
    pub async fn open_bi(&self) -> Result<(SendFlow, RecvFlow), ConnectionError> {
        let id = self.open(Dir::Bi).await?;
        Ok((
            SendFlow::new(self.clone(), id),
            RecvFlow::new(self.clone(), id),
        ))
    }

    async fn accept(&self, dir: Dir) -> Result<FlowId, ConnectionError> {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            let Some(conn) = inner.connection(self.id) else {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            };
            if let Some(id) = conn.accept_flow(dir) {
                return Poll::Ready(Ok(id));
            }
            if conn.is_closed() {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            }
            if let Some(s) = inner.state(self.id) {
                crate::driver::wait_on(&mut s.waiters, cx.waker());
            }
            Poll::Pending
        })
        .await
    }

    /// Waits for the next one-way flow the peer opens.
    pub async fn accept_uni(&self) -> Result<RecvFlow, ConnectionError> {
        let id = self.accept(Dir::Uni).await?;
        Ok(RecvFlow::new(self.clone(), id))
    }

    /// Waits for the next two-way flow the peer opens.
    pub async fn accept_bi(&self) -> Result<(SendFlow, RecvFlow), ConnectionError> {
        let id = self.accept(Dir::Bi).await?;
        Ok((
            SendFlow::new(self.clone(), id),
            RecvFlow::new(self.clone(), id),
        ))
    }

    /// Sends a message (F5): framed, delivered whole or not at all, with the options' order,
    /// deadline and priority. Returns at once.
    pub fn send_message(
        &self,
        data: Bytes,
        opts: MessageOptions,
    ) -> Result<MessageId, SendMessageError> {
        let now = crate::runtime::now();
        let mut inner = self.shared.lock();
        let conn = inner
            .connection(self.id)
            .ok_or(SendMessageError::ConnectionClosed)?;
        let id = conn.send_message(now, data, opts)?;
        drop(inner);
        self.transmit_now();
        Ok(id)
    }

    /// The next message that is not a reply to a `request` of ours.
    ///
    /// Messages wait in the protocol core until taken here, holding their share of the
    /// connection window: a peer sending to an application that does not call this is
    /// stopped by flow control once the window (`FlowConfig::connection_window`) is full,
    /// instead of filling memory.
    pub async fn recv_message(&self) -> Result<Message, ConnectionError> {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            if let Some(m) = inner.take_inbox(self.id) {
                drop(inner);
                // Taking it gave credit back: the driver may have a MaxData to send.
                self.transmit_now();
                return Poll::Ready(Ok(m));
            }
            let Some(s) = inner.state(self.id) else {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            };
            if s.error.is_some() || s.drained {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            }
            crate::driver::wait_on(&mut s.message_waiters, cx.waker());
            Poll::Pending
        })
        .await
    }

    /// Sends a request message and waits for the peer's reply to it (the MAR pattern: one
    /// connection, no flow per request). With a deadline in `opts`, gives up with
    /// [`RequestError::Expired`] if no reply arrived by then; without one, only the
    /// connection's end stops the wait.
    pub async fn request(
        &self,
        data: Bytes,
        opts: MessageOptions,
    ) -> Result<Message, RequestError> {
        let deadline = opts.deadline.map(|d| crate::runtime::now() + d);
        let id = {
            let now = crate::runtime::now();
            let mut inner = self.shared.lock();
            let Some(conn) = inner.connection(self.id) else {
                drop(inner);
                return Err(closed_error(&self.shared, self.id).into());
            };
            let id = match conn.send_message(now, data, opts) {
                Ok(id) => id,
                Err(SendMessageError::ConnectionClosed) => {
                    drop(inner);
                    return Err(closed_error(&self.shared, self.id).into());
                }
                Err(e) => return Err(RequestError::NotSent(e)),
            };
            if let Some(s) = inner.state(self.id) {
                s.requests().pending.insert(id);
            }
            id
        };
        self.transmit_now();
        // Whatever ends this call (reply, deadline, error, or the caller dropping it), the
        // request stops waiting; a reply arriving later is dropped.
        let _pending = PendingRequest { conn: self, id };
        let wait = poll_fn(|cx| {
            let mut inner = self.shared.lock();
            let Some(s) = inner.state(self.id) else {
                return Poll::Ready(None);
            };
            if let Some(m) = s.requests().replies.remove(&id) {
                return Poll::Ready(Some(m));
            }
            if s.error.is_some() || s.drained {
                return Poll::Ready(None);
            }
            s.requests().reply_waiters.insert(id, cx.waker().clone());
            Poll::Pending
        });
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), wait).await.ok().flatten(),
            None => wait.await,
        };
        match result {
            Some(m) => Ok(m),
            None => {
                let mut inner = self.shared.lock();
                if let Some(s) = inner.state(self.id) {
                    if s.error.is_none() && !s.drained {
                        return Err(RequestError::Expired);
                    }
                }
                drop(inner);
                Err(closed_error(&self.shared, self.id).into())
            }
        }
    }

    /// Messages sent and not yet acknowledged in full nor given up at their deadline (zero:
    /// everything sent has been dealt with). Messages the peer's flow control holds back
    /// count here: it is how far a sender is ahead of a slow reader.
    pub fn outstanding_messages(&self) -> usize {
        let mut inner = self.shared.lock();
        inner
            .connection(self.id)
            .map_or(0, |c| c.outstanding_messages())
    }

    /// Answers the peer's message `to` (sent with `request`).
    pub fn reply(
        &self,
        to: MessageId,
        data: Bytes,
        opts: MessageOptions,
    ) -> Result<MessageId, SendMessageError> {
        self.send_message(data, opts.reply_to(to))
    }

    /// Sends an unreliable datagram (F6).
    pub fn send_datagram(&self, data: Bytes) -> Result<(), DatagramError> {
        let mut inner = self.shared.lock();
        let conn = inner
            .connection(self.id)
            .ok_or(DatagramError::ConnectionClosed)?;
        conn.send_datagram(data)?;
        drop(inner);
        self.transmit_now();
        Ok(())
    }

    /// The next datagram.
    pub async fn recv_datagram(&self) -> Result<Bytes, ConnectionError> {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            let Some(conn) = inner.connection(self.id) else {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            };
            if let Some(d) = conn.recv_datagram() {
                return Poll::Ready(Ok(d));
            }
            let closed = conn.is_closed();
            if closed {
                drop(inner);
                return Poll::Ready(Err(closed_error(&self.shared, self.id)));
            }
            if let Some(s) = inner.state(self.id) {
                crate::driver::wait_on(&mut s.datagram_waiters, cx.waker());
            }
            Poll::Pending
        })
        .await
    }

    /// The largest datagram that fits in a packet now (`None`: the peer takes none).
    pub fn max_datagram_payload(&self) -> Option<usize> {
        let mut inner = self.shared.lock();
        inner.connection(self.id)?.max_datagram_payload()
    }

    /// Closes this side's receive window (F7), e.g. before a handover; the peer holds its
    /// data until `open_window`. Nothing is lost.
    pub fn close_window(&self, code: u64, reason: &[u8]) {
        let mut inner = self.shared.lock();
        if let Some(c) = inner.connection(self.id) {
            c.close_window(code, reason);
        }
        drop(inner);
        self.transmit_now();
    }

    /// Opens this side's receive window again.
    pub fn open_window(&self) {
        let mut inner = self.shared.lock();
        if let Some(c) = inner.connection(self.id) {
            c.open_window();
        }
        drop(inner);
        self.transmit_now();
    }

    /// Closes the connection with an application code and reason. The peer answers and both
    /// ends free everything (fast close); `closed()` resolves when that is done.
    pub fn close(&self, code: u64, reason: &[u8]) {
        let now = crate::runtime::now();
        let mut inner = self.shared.lock();
        if let Some(c) = inner.connection(self.id) {
            c.close(now, code, reason);
        }
        drop(inner);
        self.transmit_now();
    }

    /// Waits until the connection is closed at both ends (or timed out) and returns why it
    /// ended.
    pub async fn closed(&self) -> ConnectionError {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            let dead = inner.dead.is_some();
            match inner.state(self.id) {
                Some(s) if s.drained || dead => {
                    Poll::Ready(s.error.clone().unwrap_or(ConnectionError::TimedOut))
                }
                Some(s) => {
                    crate::driver::wait_on(&mut s.waiters, cx.waker());
                    Poll::Pending
                }
                None => Poll::Ready(ConnectionError::TimedOut),
            }
        })
        .await
    }
}

/// A request in progress; forgets it when dropped.
struct PendingRequest<'a> {
    conn: &'a Connection,
    id: MessageId,
}

impl Drop for PendingRequest<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.conn.shared.lock().state(self.conn.id) {
            s.abandon_request(self.id);
        }
    }
}

/// Why [`Connection::request`] got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request's deadline passed before the reply arrived (only for requests sent with a
    /// deadline): the request was given up, and a late reply is dropped.
    #[error("no reply before the deadline")]
    Expired,
    /// The request was refused before it was sent (too large for the peer).
    #[error("request not sent: {0}")]
    NotSent(SendMessageError),
    /// The connection ended before the reply arrived.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
}

/// A connection's events, as a stream (`next().await`).
pub struct EventStream {
    rx: mpsc::Receiver<Event>,
    lagged: Arc<AtomicU64>,
}

/// Events an [`EventStream`] holds for a reader that is behind.
pub const EVENT_QUEUE: usize = 1024;

impl EventStream {
    /// Events lost so far because more than [`EVENT_QUEUE`] were waiting to be read.
    pub fn lagged(&self) -> u64 {
        self.lagged.load(Ordering::Relaxed)
    }

    /// Events waiting to be read (at most [`EVENT_QUEUE`]).
    pub fn pending(&self) -> usize {
        self.rx.len()
    }

    /// The next event, or `None` once the connection is gone.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for EventStream {
    type Item = Event;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}
