//! One tern connection: handshake, flows, recovery and close, as a sans-I/O state machine.
//!
//! # Driving a connection
//! Connections live inside an [`Endpoint`](crate::Endpoint), which routes datagrams to them
//! and drives their timers; applications reach one through `Endpoint::connection_mut`.
//! The methods fall into four kinds:
//! - getters (`stats`, `side`, `remote_address`, `is_established`, …);
//! - commands from the application (`open_flow`, `write`, `finish`, `read`, `close`, …);
//! - `handle_*` inputs, called by the endpoint (a datagram arrived, a timer fired);
//! - `poll_*` outputs: `poll_transmit` (a datagram to send), `poll_timeout` (when to call
//!   `handle_timeout` next) and `poll_event` (something for the application).
//!
//! After any command or input, call `poll_transmit` until it returns `None`, then re-read
//! `poll_timeout` and drain `poll_event`. Time only moves forward: every `now` passed in must
//! be at least the previous one.

#[cfg(test)]
mod bounds_tests;
pub(crate) mod handshake;
mod paths;
mod pmtu;
pub(crate) mod rate;
mod recv;
mod send;
mod stats;

pub use rate::{RateSource, TargetRate};
pub use send::Transmit;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use stats::ConnectionStats;

use crate::config::ConnectionConfig;
use crate::crypto::{Handshake, KeySchedule, KeyUpdateError, PublicKey, RESET_TOKEN_LEN};
use crate::error::{ConnectionError, OpenError, ReadError, WriteError};
use crate::event::Event;
use crate::flow::{Dir, FlowId, FlowSet};
use crate::path::Path;
use crate::wire::{ConnectionId, TransportErrorCode, TransportParams};
use crate::Side;

/// Smallest amplification budget worth building a packet for.
pub(crate) const MIN_PACKET_BUDGET: u64 = 200;

/// Where a connection is in its life.
#[derive(Debug)]
pub(crate) enum State {
    /// Handshake messages are being exchanged.
    Handshake(handshake::HandshakeState),
    /// Keys are in place; flows carry data.
    Established,
    /// We closed: our Close frame is (re)sent until the peer answers or the deadline passes.
    Closing { deadline: Instant, resends: u32 },
    /// The peer closed: we answer once and wait out stragglers until the deadline.
    Draining { deadline: Instant },
    /// Resources may be freed.
    Drained,
}

/// Whether a server connection's client is proven live, and whether the application has
/// been told of it (docs/PROTOCOL.md §7.4, §7.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// A half-open handshake: the client has not yet proven it is live (XX message 3, or its
    /// first protected packet after IK). Its events wait.
    Hidden,
    /// Unproven but handed to `accept` early (`EndpointConfig::early_accept`, a fresh IK
    /// first flight): the application may answer its first-flight data at once.
    Early,
    /// Proven: the endpoint hands it to `accept` at its next chance.
    Ready,
    /// Proven after an early hand-out: the endpoint stops counting it as half-open.
    ProvenEarly,
    /// Proven, and the application has it.
    Announced,
}

impl Announce {
    /// Whether the client has not proven it is live yet.
    pub(crate) fn is_unproven(self) -> bool {
        matches!(self, Announce::Hidden | Announce::Early)
    }

    /// Whether the application has the connection.
    pub(crate) fn is_visible(self) -> bool {
        matches!(
            self,
            Announce::Early | Announce::ProvenEarly | Announce::Announced
        )
    }
}

/// The application receive window of F7 (docs/PROTOCOL.md §12), both directions.
#[derive(Debug, Default)]
pub(crate) struct WindowState {
    /// Our application closed its window: (reason code, reason).
    pub(crate) local_closed: Option<(u64, Bytes)>,
    /// Our current state must be (re)sent.
    pub(crate) update_pending: bool,
    /// The peer closed its window: we send no data until it opens.
    pub(crate) peer_closed: bool,
    /// When to poll the peer next (SLTP STATUS), and the backoff step.
    pub(crate) status_at: Option<Instant>,
    pub(crate) status_step: u32,
    pub(crate) status_pending: bool,
}

/// A close frame waiting to be sent.
#[derive(Debug, Clone)]
pub(crate) struct PendingClose {
    pub(crate) application: bool,
    pub(crate) code: u64,
    pub(crate) reason: Bytes,
}

/// A tern connection (see the module documentation for how to drive it).
#[derive(Debug)]
pub struct Connection {
    side: Side,
    /// qlog records for the driver (`ConnectionConfig::qlog`), with each path's last
    /// congestion state.
    qlog: Option<crate::qlog::QlogQueue>,
    pub(crate) state: State,
    config: Arc<ConnectionConfig>,
    pub(crate) local_cid: ConnectionId,
    pub(crate) remote_cid: ConnectionId,
    /// The client's first destination CID (names the connection until the server's is known).
    pub(crate) original_dcid: ConnectionId,
    /// Packet keys of both directions, with key phase and usage counts (§6.4); `None`
    /// until the handshake is done.
    pub(crate) keys: Option<KeySchedule>,
    /// Boxed: a kilobyte that idle connections should not carry once it is gone.
    pub(crate) handshake: Option<Box<Handshake>>,
    pub(crate) peer_params: Option<TransportParams>,
    pub(crate) local_params: TransportParams,
    pub(crate) peer_key: Option<PublicKey>,
    pub(crate) peer_reset_token: Option<[u8; RESET_TOKEN_LEN]>,
    pub(crate) paths: Vec<Path>,
    pub(crate) flows: FlowSet,
    pub(crate) events: VecDeque<Event>,
    /// SecurityViolation events queued and not yet polled, one bit per kind (see
    /// `report_violation`).
    pub(crate) violations_queued: u8,
    pub(crate) stats: stats::Counters,
    /// Handshake is confirmed: no more handshake retransmissions are needed.
    pub(crate) confirmed: bool,
    pub(crate) handshake_done_pending: bool,
    pub(crate) close: Option<PendingClose>,
    /// Why the connection ended, once it did.
    pub(crate) error: Option<ConnectionError>,
    pub(crate) idle_timeout: Duration,
    pub(crate) idle_deadline: Option<Instant>,
    pub(crate) handshake_deadline: Instant,
    /// A PING is due (keep-alive or probe).
    pub(crate) ping_pending: bool,
    /// Chooses the path of each data packet.
    pub(crate) scheduler: Box<dyn crate::path::scheduler::Scheduler>,
    /// Addresses the peer advertised (AddAddress), by sequence number.
    pub(crate) peer_addresses: Vec<(u64, SocketAddr)>,
    /// Our `advertise` list must be (re)sent to the peer.
    pub(crate) advertise_pending: bool,
    /// Our local addresses to open paths from (`ConnectionConfig::local_ips`, as they are
    /// now: `local_ip_changed` updates them).
    pub(crate) local_ips: Vec<std::net::IpAddr>,
    /// Addresses the peer withdrew (RemoveAddress): never opened again.
    pub(crate) removed_peer_addresses: Vec<SocketAddr>,
    /// Server: sequence numbers of our advertised addresses we withdrew.
    pub(crate) withdrawn: Vec<u64>,
    /// Server: RemoveAddress frames to (re)send.
    pub(crate) remove_pending: Vec<u64>,
    /// Redundant copies of data packets waiting for their path (see `send.rs`).
    pub(crate) copies: VecDeque<send::PendingCopy>,
    /// The client opened its paths (done once, when the handshake completes, and again for
    /// each address the peer advertises later).
    pub(crate) paths_opened: bool,
    /// Server: the client padded its first flight (padding Initials, PROTOCOL.md §4.3), asking
    /// for a probe train with the handshake.
    pub(crate) handshake_train_asked: bool,
    /// Makes path challenges unpredictable (seeded by the endpoint's generator).
    pub(crate) path_rng: Option<Box<rand_chacha::ChaCha8Rng>>,
    /// Its seed (from the endpoint): the generator is built when the first challenge is
    /// sent, so that connections that never validate a path carry 32 bytes, not 320.
    pub(crate) path_seed: [u8; 32],
    /// Flows whose application was told the buffer was full.
    pub(crate) write_blocked: Vec<FlowId>,
    pub(crate) drained_reported: bool,
    /// The last handshake datagram, resent until the handshake is confirmed.
    pub(crate) flight: Option<handshake::Flight>,
    /// A Close frame must be (re)sent.
    pub(crate) close_resend: bool,
    /// Closing: when to resend our Close if the peer has not answered.
    pub(crate) close_resend_at: Option<Instant>,
    pub(crate) messages_out: crate::message::MessageSender,
    pub(crate) messages_in: crate::message::MessageReceiver,
    pub(crate) datagrams_out: VecDeque<Bytes>,
    pub(crate) datagrams_in: VecDeque<Bytes>,
    /// Bytes in `datagrams_in` (bounded by `ConnectionConfig::datagram_queue_bytes`).
    pub(crate) datagrams_in_bytes: u64,
    pub(crate) window: WindowState,
    /// Server: the Initial payload this connection was built from (see `Endpoint::handle_long`).
    pub(crate) initial_payload: Vec<u8>,
    /// Server: the frames of an IK first flight not yet proven fresh, held until the client
    /// proves it is live (§7.6), so that a replay never delivers them.
    pub(crate) held_first_flight: Option<Vec<u8>>,
    /// Whether the application knows of this connection (see [`Announce`]).
    pub(crate) announce: Announce,
    /// The `Probe` frame of the packet being processed, if it had one (F11): recorded with
    /// the datagram's size and arrival time once its frames are processed.
    pub(crate) probe_seen: Option<(u64, u8, u8)>,
    /// The application's expected rate, bytes per second (F12: declared in the rate area).
    pub(crate) expected_rate: Option<u64>,
    /// The last target rate reported in an `Event::TargetRate`, and when (F13).
    pub(crate) target_reported: Option<(Instant, TargetRate)>,
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        side: Side,
        now: Instant,
        config: Arc<ConnectionConfig>,
        local_cid: ConnectionId,
        remote_cid: ConnectionId,
        original_dcid: ConnectionId,
        remote: SocketAddr,
        local_params: TransportParams,
        handshake: Handshake,
    ) -> Self {
        let path = Path::new(
            now,
            0,
            remote,
            crate::wire::MIN_INITIAL_DATAGRAM_SIZE as u16,
            &config,
            config.congestion.as_ref(),
        );
        let mut path = path;
        // A client trusts the address it chose; a server must validate the client's.
        path.validated = side == Side::Client;
        let flows = FlowSet::new(side, &config.flows);
        Self {
            side,
            state: State::Handshake(handshake::HandshakeState::default()),
            local_cid,
            remote_cid,
            original_dcid,
            keys: None,
            handshake: Some(Box::new(handshake)),
            peer_params: None,
            local_params,
            peer_key: None,
            peer_reset_token: None,
            paths: vec![path],
            flows,
            events: VecDeque::new(),
            violations_queued: 0,
            qlog: config.qlog.then(Default::default),
            stats: stats::Counters::default(),
            confirmed: false,
            handshake_done_pending: false,
            close: None,
            error: None,
            idle_timeout: config.idle_timeout,
            idle_deadline: (!config.idle_timeout.is_zero()).then(|| now + config.idle_timeout),
            handshake_deadline: now + config.handshake_timeout,
            ping_pending: false,
            scheduler: config.scheduler.build(),
            peer_addresses: Vec::new(),
            advertise_pending: side == Side::Server && !config.advertise.is_empty(),
            local_ips: config.local_ips.clone(),
            removed_peer_addresses: Vec::new(),
            withdrawn: Vec::new(),
            remove_pending: Vec::new(),
            copies: VecDeque::new(),
            paths_opened: false,
            handshake_train_asked: false,
            path_rng: None,
            path_seed: [0; 32],
            write_blocked: Vec::new(),
            drained_reported: false,
            flight: None,
            close_resend: false,
            initial_payload: Vec::new(),
            held_first_flight: None,
            // A client's connection is the application's from `connect`; a server's is
            // announced once a replay or a spoofed Initial could not have made it.
            announce: if side == Side::Client {
                Announce::Announced
            } else {
                Announce::Hidden
            },
            probe_seen: None,
            expected_rate: None,
            target_reported: None,
            close_resend_at: None,
            messages_out: Default::default(),
            messages_in: Default::default(),
            datagrams_out: VecDeque::new(),
            datagrams_in: VecDeque::new(),
            datagrams_in_bytes: 0,
            window: WindowState::default(),
            config,
        }
    }

    // ---- getters ----------------------------------------------------------------------

    /// Which side of the connection this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The peer's current address on the primary path (the usable path with the lowest RTT).
    pub fn remote_address(&self) -> SocketAddr {
        self.paths[self.primary()].remote
    }

    /// Every path of this connection, with its figures, in the order they were opened.
    pub fn path_stats(&self) -> Vec<crate::path::PathStats> {
        self.paths.iter().map(crate::path::Path::stats).collect()
    }

    /// The primary path: usable with the lowest RTT, or the first path when none is usable.
    pub(crate) fn primary(&self) -> usize {
        self.paths
            .iter()
            .enumerate()
            .filter(|(_, p)| p.usable())
            .min_by_key(|(i, p)| (p.state != crate::path::PathState::Active, p.rank_rtt(), *i))
            .map_or(0, |(i, _)| i)
    }

    /// The index of the path with this ID.
    pub(crate) fn path_index(&self, id: u32) -> Option<usize> {
        self.paths.iter().position(|p| p.id == id)
    }

    /// The peer's static public key, once the handshake revealed it.
    pub fn peer_key(&self) -> Option<PublicKey> {
        self.peer_key
    }

    /// Server side of an `XX` handshake still waiting for the client's last message.
    pub(crate) fn awaiting_client_finish(&self) -> bool {
        self.side == Side::Server && matches!(self.state, State::Handshake(_))
    }

    /// Whether the handshake completed and flows can carry data.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// Whether the connection ended (closing, draining or drained).
    pub fn is_closed(&self) -> bool {
        matches!(
            self.state,
            State::Closing { .. } | State::Draining { .. } | State::Drained
        )
    }

    /// Whether all resources may be freed.
    pub fn is_drained(&self) -> bool {
        matches!(self.state, State::Drained)
    }

    /// Why the connection ended, if it did.
    pub fn close_reason(&self) -> Option<&ConnectionError> {
        self.error.as_ref()
    }

    /// Current statistics; path figures (RTT, window, …) are the primary path's (see
    /// [`path_stats`](Self::path_stats) for every path).
    pub fn stats(&self) -> ConnectionStats {
        let mut s = self.stats.to_stats();
        let p = &self.paths[self.primary()];
        s.rtt = p.rtt.smoothed();
        s.rtt_var = p.rtt.var();
        s.min_rtt = p.rtt.min().unwrap_or_default();
        s.cwnd = p.cc.window();
        s.max_datagram_size = p.mtu;
        s.bytes_in_flight = p.sent.bytes_in_flight;
        let m = p.cc.metrics();
        s.pacing_rate =
            p.cc.pacing_rate(&p.rtt)
                .unwrap_or_else(|| crate::cc::Pacer::default_rate(p.cc.window(), p.rtt.smoothed()));
        s.congestion_events = m.congestion_events;
        s.non_congestive_losses = m.non_congestive_losses;
        s.persistent_congestion_events = m.persistent_congestion_events;
        s.congestion_events_undone = m.undone_congestion_events;
        s.reorder_threshold = p.sent.reorder.packet_threshold;
        s.reorder_window = p.sent.reorder.window;
        s.ecn = p.ecn.state;
        s.ecn_ce_reported = p.ecn.ce_reported;
        s.ack_threshold = p.acks.threshold(self.config.ack_frequency);
        s.ack_threshold_requested = p.ack_request.threshold;
        s.paths = self.paths.len();
        if let Some((rate, at)) = p.probe_tx.estimate {
            s.rate_estimate = rate;
            s.rate_estimate_at = Some(at);
        }
        s.feedback_rate = p.rate.stamped();
        if let Some(keys) = &self.keys {
            s.key_generation = keys.send_generation();
            s.packets_sealed_current_key = keys.sealed();
        }
        s.datagrams_buffered = self.datagrams_in.len() as u64;
        s.datagram_bytes_buffered = self.datagrams_in_bytes;
        let m = self.messages_in.buffered();
        s.messages_buffered = m.count;
        s.message_bytes_buffered = m.bytes;
        s.flow_bytes_buffered = self.flows.recv_buffered();
        s.recv_credit_used = self
            .flows
            .data_received
            .saturating_sub(self.flows.data_consumed);
        s.recv_ranges = (self.flows.recv_ranges() + self.messages_in.ranges()) as u64;
        s
    }

    /// Bytes held in this connection's receive buffers (bounded by the configured windows).
    pub fn recv_buffered(&self) -> u64 {
        self.flows.recv_buffered()
    }

    // ---- application commands -----------------------------------------------------------

    /// Opens a flow of ours. Costs no round trip: the peer learns of it with its first data.
    pub fn open_flow(&mut self, dir: Dir) -> Result<FlowId, OpenError> {
        if self.is_closed() {
            return Err(OpenError::ConnectionClosed);
        }
        self.flows.open(dir).ok_or(OpenError::Blocked)
    }

    /// Takes the next flow the peer opened, if any.
    pub fn accept_flow(&mut self, dir: Dir) -> Option<FlowId> {
        self.flows.incoming[FlowSet::dir_index(dir)].pop_front()
    }

    /// Queues bytes on a flow; returns how many were taken (bounded by the send buffer).
    pub fn write(&mut self, id: FlowId, data: &[u8]) -> Result<usize, WriteError> {
        let len = self.writable_len(id, data.len())?;
        let copy = self.flows.buffers.copy(&data[..len]);
        self.queue_bytes(id, copy, true)
    }

    /// Queues an owned buffer on a flow without copying; takes all of it or returns
    /// `Blocked` if it does not fit the send buffer (unless the buffer is empty).
    pub fn write_bytes(&mut self, id: FlowId, data: Bytes) -> Result<usize, WriteError> {
        self.queue_bytes(id, data, false)
    }

    /// [`write_bytes`](Self::write_bytes); `pooled` if the flows' buffer pool made `data`.
    fn queue_bytes(&mut self, id: FlowId, data: Bytes, pooled: bool) -> Result<usize, WriteError> {
        let room = self.writable_len(id, data.len())?;
        let buffered = self
            .flows
            .flows
            .get(&id)
            .and_then(|f| f.send.as_ref())
            .map_or(0, |s| s.buffered());
        if room < data.len() && buffered > 0 {
            self.note_write_blocked(id);
            return Err(WriteError::Blocked);
        }
        let len = data.len();
        if let Some(send) = self.flows.send_mut(id) {
            send.write_chunk(data, pooled);
        }
        self.flows.mark_ready(id);
        Ok(len)
    }

    /// The code of the peer's StopSending for our sending half of `id`, if it sent one (a
    /// runtime that hands out a flow after the event may have passed asks here).
    pub fn flow_stop_requested(&self, id: FlowId) -> Option<u64> {
        self.flows.flows.get(&id)?.send.as_ref()?.stop_requested
    }

    fn writable_len(&mut self, id: FlowId, want: usize) -> Result<usize, WriteError> {
        if self.is_closed() {
            return Err(WriteError::ConnectionClosed);
        }
        let limit = self.flows.send_buffer;
        let send = self
            .flows
            .flows
            .get(&id)
            .and_then(|f| f.send.as_ref())
            .ok_or(WriteError::ClosedFlow)?;
        if let Some(code) = send.stop_requested {
            return Err(WriteError::Stopped(code));
        }
        if send.fin || send.reset.is_some() {
            return Err(WriteError::ClosedFlow);
        }
        let room = limit.saturating_sub(send.buffered()) as usize;
        if room == 0 && want > 0 {
            self.note_write_blocked(id);
            return Err(WriteError::Blocked);
        }
        Ok(room.min(want))
    }

    fn note_write_blocked(&mut self, id: FlowId) {
        if !self.write_blocked.contains(&id) {
            self.write_blocked.push(id);
        }
    }

    /// Ends a flow's sending half after the queued data (FIN).
    pub fn finish(&mut self, id: FlowId) -> Result<(), WriteError> {
        if self.is_closed() {
            return Err(WriteError::ConnectionClosed);
        }
        let send = self.flows.send_mut(id).ok_or(WriteError::ClosedFlow)?;
        if send.fin || send.reset.is_some() {
            return Err(WriteError::ClosedFlow);
        }
        send.fin = true;
        send.fin_pending = true;
        self.flows.mark_ready(id);
        Ok(())
    }

    /// Abandons a flow's sending half: unsent and unacknowledged data is dropped.
    pub fn reset_flow(&mut self, id: FlowId, code: u64) -> Result<(), WriteError> {
        self.flows.send_mut(id).ok_or(WriteError::ClosedFlow)?;
        if self.flows.reset_send(id, code) {
            self.flows.mark_ready(id);
        }
        Ok(())
    }

    /// Asks the peer to stop sending on a flow; received data is discarded from now on, and
    /// its share of the connection's credit is given back. A flow that already arrived whole
    /// (FIN included) is only discarded: nothing more would come, so nothing is sent.
    pub fn stop_flow(&mut self, id: FlowId, code: u64) -> Result<(), ReadError> {
        let recv = self.flows.recv_mut(id).ok_or(ReadError::ClosedFlow)?;
        if recv.stop.is_none() && !recv.is_finished() && recv.reset.is_none() {
            let whole = recv.fully_received();
            recv.stop = Some(code);
            recv.stop_pending = !whole;
            let discarded = recv.discard();
            self.flows.on_consumed(discarded);
            if whole {
                self.flows.reap(id);
            } else {
                self.flows.mark_ready(id);
            }
        }
        Ok(())
    }

    /// Reads in-order bytes from a flow. `Ok(None)` means the flow is finished (all data up to
    /// FIN read); `Err(Blocked)` means wait for `FlowReadable`.
    pub fn read(&mut self, id: FlowId, buf: &mut [u8]) -> Result<Option<usize>, ReadError> {
        let recv = self.recv_half(id)?;
        let n = recv.read(buf);
        self.after_read(id, n)
    }

    /// Reads the next in-order chunk without copying (at most `max` bytes).
    pub fn read_chunk(&mut self, id: FlowId, max: usize) -> Result<Option<Bytes>, ReadError> {
        let recv = self.recv_half(id)?;
        match recv.read_chunk(max) {
            Some(chunk) => {
                let n = chunk.len();
                self.after_read(id, n)?;
                Ok(Some(chunk))
            }
            None => self.after_read(id, 0).map(|_| None),
        }
    }

    fn recv_half(&mut self, id: FlowId) -> Result<&mut crate::flow::RecvFlow, ReadError> {
        let reset = self.flows.recv_mut(id).ok_or(ReadError::ClosedFlow)?.reset;
        if let Some(code) = reset {
            // The application has been told: the flow's state and its place among the
            // peer's concurrent flows are freed (else resets would use up the flow limit).
            self.flows.reap(id);
            return Err(ReadError::Reset(code));
        }
        let recv = self.flows.recv_mut(id).ok_or(ReadError::ClosedFlow)?;
        if recv.stop.is_some() {
            // We stopped it: its data was discarded and nothing more will be kept.
            return Err(ReadError::ClosedFlow);
        }
        Ok(recv)
    }

    fn after_read(&mut self, id: FlowId, n: usize) -> Result<Option<usize>, ReadError> {
        let Some(recv) = self.flows.recv_mut(id) else {
            return Err(ReadError::ClosedFlow);
        };
        if n > 0 {
            if recv.credit_update().is_some() {
                self.flows.credit_pending.push(id);
            }
            self.flows.on_consumed(n as u64);
            return Ok(Some(n));
        }
        if recv.is_finished() {
            self.flows.reap(id);
            return Ok(None);
        }
        if self.is_closed() {
            return Err(ReadError::ConnectionClosed);
        }
        Err(ReadError::Blocked)
    }

    /// Sends a message (F5): delivered whole or not at all, ordered or not, reliable or with
    /// a deadline, by priority. Costs no round trip.
    pub fn send_message(
        &mut self,
        now: Instant,
        data: Bytes,
        opts: crate::message::MessageOptions,
    ) -> Result<crate::message::MessageId, crate::message::SendMessageError> {
        use crate::message::SendMessageError;
        if self.is_closed() {
            return Err(SendMessageError::ConnectionClosed);
        }
        let max = self
            .peer_params
            .as_ref()
            .map_or(crate::flow::PRE_HANDSHAKE_CREDIT, |p| p.max_message_size);
        // A message must fit half the peer's connection window with its overhead, or it
        // could wait for credit for good.
        let window = self.flows.peer_connection_window();
        let max = max.min(crate::message::max_message_for_window(window));
        if data.len() as u64 > max {
            return Err(SendMessageError::TooLarge {
                size: data.len() as u64,
                max,
            });
        }
        Ok(self.messages_out.push(now, data, opts))
    }

    /// Messages sent and not yet acknowledged in full nor given up at their deadline: zero
    /// means everything sent has been dealt with (a "flush" check before closing).
    pub fn outstanding_messages(&self) -> usize {
        self.messages_out.outstanding()
    }

    /// The next message received whole, if any.
    pub fn recv_message(&mut self) -> Option<crate::message::Message> {
        self.take_message(0)
    }

    /// The `index`-th message received whole and not yet taken (in delivery order), left
    /// where it is. With [`take_message`](Self::take_message), a runtime takes the replies
    /// to its requests without taking, and so having to buffer, the messages before them.
    pub fn peek_message(&self, index: usize) -> Option<&crate::message::Message> {
        self.messages_in.ready.get(index)
    }

    /// Takes the `index`-th message received whole (see [`peek_message`](Self::peek_message)).
    /// Its credit goes back to the peer only now: messages nobody takes keep holding theirs,
    /// which is what stops a peer from making us buffer more than the connection window.
    pub fn take_message(&mut self, index: usize) -> Option<crate::message::Message> {
        let msg = self.messages_in.ready.remove(index)?;
        self.flows
            .on_consumed(crate::message::credit_cost(msg.data.len() as u64));
        Some(msg)
    }

    /// The largest datagram that fits in one packet now, or `None` if the peer takes none.
    pub fn max_datagram_payload(&self) -> Option<usize> {
        self.datagram_payload(false)
    }

    /// The datagram payload the usable paths carry: all of them (`largest` false: what
    /// `send_datagram` accepts), or at least one (`largest`: whether a queued one can still
    /// leave).
    pub(crate) fn datagram_payload(&self, largest: bool) -> Option<usize> {
        let peer = self.peer_params.as_ref()?.max_datagram_frame_size;
        if peer == 0 {
            return None;
        }
        // Short header (up to 14 bytes, 22 with the explicit-rate area on any path), AEAD
        // tag, frame type and length varints.
        let usable = self.paths.iter().filter(|p| p.usable()).map(|p| p.mtu);
        let mtu = if largest { usable.max() } else { usable.min() };
        let mtu = mtu.unwrap_or(self.paths[0].mtu);
        let area = if self.paths.iter().any(|p| p.cc.wants_rate_area()) {
            crate::wire::RATE_AREA_LEN
        } else {
            0
        };
        let room = usize::from(mtu).saturating_sub(14 + area + crate::crypto::TAG_LEN + 1 + 2);
        Some(room.min(peer as usize))
    }

    /// Sends an unreliable, unordered, congestion-controlled datagram (F6). When more are
    /// queued than the configured limit, the oldest is dropped.
    pub fn send_datagram(&mut self, data: Bytes) -> Result<(), crate::message::DatagramError> {
        use crate::message::DatagramError;
        if self.is_closed() {
            return Err(DatagramError::ConnectionClosed);
        }
        let max = self
            .max_datagram_payload()
            .ok_or(DatagramError::Unsupported)?;
        if data.len() > max {
            return Err(DatagramError::TooLarge {
                size: data.len(),
                max,
            });
        }
        if self.datagrams_out.len() >= self.config.datagram_queue {
            self.datagrams_out.pop_front();
            self.stats.datagrams_dropped += 1;
        }
        self.datagrams_out.push_back(data);
        Ok(())
    }

    /// The next datagram received, if any.
    pub fn recv_datagram(&mut self) -> Option<Bytes> {
        let d = self.datagrams_in.pop_front()?;
        self.datagrams_in_bytes -= d.len() as u64;
        Some(d)
    }

    /// Closes this side's receive window (F7), e.g. before a handover: the peer stops
    /// sending, polls now and then, and resumes when `open_window` is called. Nothing is lost.
    pub fn close_window(&mut self, code: u64, reason: &[u8]) {
        let reason =
            Bytes::copy_from_slice(&reason[..reason.len().min(crate::wire::MAX_REASON_LEN)]);
        self.events.push_back(Event::WindowClosed {
            local: true,
            code,
            reason: String::from_utf8_lossy(&reason).into_owned(),
        });
        self.window.local_closed = Some((code, reason));
        self.window.update_pending = true;
    }

    /// Opens this side's receive window again.
    pub fn open_window(&mut self) {
        if self.window.local_closed.take().is_some() {
            self.window.update_pending = true;
            self.events.push_back(Event::WindowOpened { local: true });
        }
    }

    /// Whether the peer has closed its receive window (this side holds its data).
    pub fn is_peer_window_closed(&self) -> bool {
        self.window.peer_closed
    }

    // ---- key update (PROTOCOL.md §6.4) ------------------------------------------------

    /// Moves our send key to its next generation now (the peer's follows when our first
    /// packet under it arrives). Updates also happen by themselves at half of
    /// `ConnectionConfig::confidentiality_limit`; this is for applications that want fresh
    /// keys sooner. Refused while the previous update (or, right after the handshake, the
    /// first key) has no acknowledged packet: the peer could not derive the key after next;
    /// and for 3 PTO after the last update: the peer keeps one previous key only, and
    /// packets of the key before the current one may still be on their way.
    pub fn initiate_key_update(&mut self, now: Instant) -> Result<(), KeyUpdateError> {
        if !matches!(self.state, State::Established) {
            return Err(KeyUpdateError::NoKeys);
        }
        let min_age = 3 * self.pto();
        let generation = self
            .keys
            .as_mut()
            .ok_or(KeyUpdateError::NoKeys)?
            .initiate_update(now, min_age)?;
        self.on_key_updated(now, generation, true, true);
        Ok(())
    }

    /// Closes with AEAD_LIMIT_REACHED: a key reached a usage limit (RFC 9001 §6.6).
    pub(crate) fn fail_aead_limit(&mut self, now: Instant, reason: &'static str) {
        self.fail_with(
            now,
            TransportErrorCode::AEAD_LIMIT_REACHED,
            reason,
            ConnectionError::AeadLimitReached { reason },
        );
    }

    /// Before a packet is built: updates the send key at half the confidentiality limit;
    /// false (and the connection closing with AEAD_LIMIT_REACHED) when the key is about to
    /// reach the limit and cannot be updated yet.
    pub(crate) fn check_send_key(&mut self, now: Instant) -> bool {
        if !self.keys.as_ref().is_some_and(|k| k.send_check_due()) {
            return true;
        }
        let min_age = 3 * self.pto();
        let Some(keys) = self.keys.as_mut() else {
            return true;
        };
        match keys.check_send(now, min_age) {
            crate::crypto::SendCheck::Ok => true,
            crate::crypto::SendCheck::Updated(generation) => {
                self.on_key_updated(now, generation, true, true);
                true
            }
            crate::crypto::SendCheck::LimitReached => {
                self.fail_aead_limit(
                    now,
                    "confidentiality limit: the key update was not acknowledged",
                );
                false
            }
        }
    }

    /// Counts and logs a key that moved to `generation`: the send key (`send`) or the
    /// receive key, by our decision (`local`) or the peer's.
    pub(crate) fn on_key_updated(
        &mut self,
        now: Instant,
        generation: u64,
        send: bool,
        local: bool,
    ) {
        if send {
            if local {
                self.stats.key_updates_initiated += 1;
            } else {
                self.stats.key_updates_received += 1;
            }
        }
        tracing::debug!(generation, send, local, "key updated");
        self.qlog(now, |_| crate::qlog::QlogEvent::KeyUpdated {
            send,
            generation,
            local,
        });
    }

    /// Closes the connection with an application error code and reason. The peer answers
    /// with its own close, after which both ends free everything (fast close, F3).
    pub fn close(&mut self, now: Instant, code: u64, reason: &[u8]) {
        if self.is_closed() {
            return;
        }
        let reason = &reason[..reason.len().min(crate::wire::MAX_REASON_LEN)];
        self.close = Some(PendingClose {
            application: true,
            code,
            reason: Bytes::copy_from_slice(reason),
        });
        if self.keys.is_none() {
            // Nothing can be protected yet: just stop.
            self.enter_drained(ConnectionError::LocallyClosed { code });
            return;
        }
        self.set_error(ConnectionError::LocallyClosed { code });
        self.close_resend = true;
        self.state = State::Closing {
            deadline: now + 3 * self.pto(),
            resends: 0,
        };
    }

    /// Ends the connection because of a protocol error by the peer.
    pub(crate) fn fail(&mut self, now: Instant, code: TransportErrorCode, reason: &'static str) {
        self.fail_with(
            now,
            code,
            reason,
            ConnectionError::ProtocolViolation { code, reason },
        );
    }

    /// Ends the connection with a transport error: `code` and `reason` for the peer,
    /// `error` for the application.
    pub(crate) fn fail_with(
        &mut self,
        now: Instant,
        code: TransportErrorCode,
        reason: &'static str,
        error: ConnectionError,
    ) {
        if self.is_closed() {
            return;
        }
        tracing::debug!(?code, reason, "closing on protocol error");
        self.close = Some(PendingClose {
            application: false,
            code: code.into(),
            reason: Bytes::from_static(reason.as_bytes()),
        });
        self.set_error(error);
        if self.keys.is_none() {
            self.state = State::Drained;
            return;
        }
        self.close_resend = true;
        self.state = State::Closing {
            deadline: now + 3 * self.pto(),
            resends: 0,
        };
    }

    pub(crate) fn set_error(&mut self, error: ConnectionError) {
        if self.error.is_none() {
            self.error = Some(error.clone());
            self.events.push_back(Event::Closed(error));
        }
    }

    pub(crate) fn enter_drained(&mut self, error: ConnectionError) {
        self.set_error(error);
        self.state = State::Drained;
    }

    /// Probe timeout of the slowest usable path (path 0 while none is), with the peer's ACK
    /// delay: long enough for a close to cross any path.
    pub(crate) fn pto(&self) -> Duration {
        let base = self
            .paths
            .iter()
            .filter(|p| p.usable())
            .map(|p| p.rtt.pto_base())
            .max()
            .unwrap_or_else(|| self.paths[0].rtt.pto_base());
        base + self.peer_max_ack_delay()
    }

    /// Heard from the peer: the idle timeout starts again (a zero timeout means none).
    pub(crate) fn restart_idle_timer(&mut self, now: Instant) {
        if !self.idle_timeout.is_zero() {
            self.idle_deadline = Some(now + self.idle_timeout);
        }
    }

    /// Backoff never stretches the probe interval beyond two seconds (or two probe timeouts on
    /// a very slow path) nor a sixth of the idle timeout: an outage is then met by a steady
    /// trickle of two small probes, which finds the path as soon as it is back, instead of
    /// one probe after minutes of silence.
    pub(crate) fn max_probe_interval(&self, path: &Path) -> Duration {
        let floor = Duration::from_secs(2).max(path.rtt.pto_base() * 2);
        if self.idle_timeout.is_zero() {
            return floor;
        }
        floor
            .min(self.idle_timeout / 6)
            .max(Duration::from_millis(100))
    }

    pub(crate) fn peer_max_ack_delay(&self) -> Duration {
        self.peer_params
            .as_ref()
            .map_or(Duration::from_millis(25), |p| {
                Duration::from_millis(p.max_ack_delay_ms)
            })
    }

    // ---- polls ----------------------------------------------------------------------------

    /// The next qlog record (only with [`ConnectionConfig::qlog`](crate::ConnectionConfig)):
    /// the driver writes them out, in order.
    #[must_use]
    pub fn poll_qlog(&mut self) -> Option<crate::qlog::QlogRecord> {
        self.qlog.as_mut()?.pop()
    }

    /// qlog records dropped because the driver did not drain them in time.
    pub fn qlog_dropped(&self) -> u64 {
        self.qlog.as_ref().map_or(0, |q| q.dropped)
    }

    /// Records a qlog event when qlog is on (`make` runs only then).
    pub(crate) fn qlog(
        &mut self,
        now: Instant,
        make: impl FnOnce(&Self) -> crate::qlog::QlogEvent,
    ) {
        if self.qlog.is_some() {
            let event = make(self);
            if let Some(q) = &mut self.qlog {
                q.push(now, event);
            }
        }
    }

    /// Records path `index`'s RTT and controller metrics, and its congestion state if that
    /// changed (`reduced`: the controller just responded to congestion).
    pub(crate) fn qlog_metrics(&mut self, now: Instant, index: usize, reduced: bool) {
        use crate::qlog::{CongestionState, QlogEvent};
        if self.qlog.is_none() {
            return;
        }
        let p = &mut self.paths[index];
        let m = p.cc.metrics();
        let pacing = m
            .pacing_rate
            .unwrap_or_else(|| crate::cc::Pacer::default_rate(m.window, p.rtt.smoothed()));
        let state = if reduced {
            CongestionState::Recovery
        } else if m.in_slow_start {
            CongestionState::SlowStart
        } else {
            CongestionState::CongestionAvoidance
        };
        let old = p.qlog_state.replace(state);
        let (path, metrics) = (
            p.id,
            QlogEvent::MetricsUpdated {
                path: p.id,
                min_rtt: p.rtt.min().unwrap_or_default(),
                smoothed_rtt: p.rtt.smoothed(),
                latest_rtt: p.rtt.latest(),
                rtt_variance: p.rtt.var(),
                congestion_window: m.window,
                bytes_in_flight: p.sent.bytes_in_flight,
                pacing_rate_bps: pacing.saturating_mul(8),
                feedback_rate_bps: p.rate.stamped().map(|r| r.saturating_mul(8)),
            },
        );
        self.qlog(now, |_| metrics);
        if old != Some(state) {
            self.qlog(now, |_| QlogEvent::CongestionStateUpdated {
                path,
                old: old.unwrap_or(CongestionState::SlowStart),
                new: state,
            });
        }
    }

    /// Whether [`poll_event`](Self::poll_event) has an event.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty() || (self.is_drained() && !self.drained_reported)
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop_front() {
            if let Event::SecurityViolation(v) = e {
                self.violations_queued &= !(1 << v as u8);
            }
            return Some(e);
        }
        if self.events.capacity() > 4 {
            // A burst of events (the handshake's) grew the queue: an idle connection gives
            // the memory back.
            self.events = VecDeque::new();
        }
        if self.is_drained() && !self.drained_reported {
            self.drained_reported = true;
            return Some(Event::Drained);
        }
        None
    }

    /// When `handle_timeout` must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        match &self.state {
            State::Drained => return None,
            State::Closing { deadline, .. } => {
                return Some(self.close_resend_at.map_or(*deadline, |r| r.min(*deadline)))
            }
            State::Draining { deadline } => return Some(*deadline),
            State::Handshake(_) => {
                consider(Some(self.handshake_deadline));
                consider(self.flight_timer());
            }
            State::Established => {
                consider(self.flight_timer());
                if self.announce.is_unproven() {
                    consider(Some(self.handshake_deadline));
                }
            }
        }
        consider(self.idle_deadline);
        if self.keys.is_some() {
            let sendable = self.has_sendable_data();
            // The tail-loss probe waits only while nothing may be sent.
            let lone = !sendable && self.one_usable_path();
            for path in &self.paths {
                consider(self.loss_timer(path));
                if !sendable {
                    consider(self.tail_probe_timer(path, lone));
                }
                consider(self.challenge_timer(path));
                // Timers that only lead to sending are not armed while nothing may be sent
                // (the anti-amplification limit), or they would fire again and again at once.
                if path.amplification_budget() >= MIN_PACKET_BUDGET {
                    consider(path.acks.deadline.filter(|_| path.acks.dirty));
                    if sendable {
                        consider(path.pacing_until);
                    }
                }
            }
            if !self.ping_pending {
                consider(self.keep_alive_at());
            }
            consider(self.messages_out.next_deadline());
            consider(self.messages_in.next_deadline());
            if !self.window.status_pending {
                consider(self.window.status_at);
            }
        }
        t
    }

    fn keep_alive_at(&self) -> Option<Instant> {
        let interval = self.config.keep_alive?;
        let created = self.handshake_deadline - self.config.handshake_timeout;
        let last = self
            .paths
            .iter()
            .filter_map(|p| p.sent.time_of_last_ack_eliciting)
            .max()
            .unwrap_or(created);
        Some(last + interval)
    }

    /// When an unanswered challenge on a path is sent again (or, after the last, the path
    /// given up): a probe timeout after it left, doubling with each one.
    fn challenge_timer(&self, path: &Path) -> Option<Instant> {
        if path.validated || path.challenge.is_none() || path.challenge_pending {
            return None;
        }
        let sent = path.challenge_sent_at?;
        let backoff = 1u32 << path.challenges_sent.saturating_sub(1).min(10);
        let pto = self.probe_timeout(path) * backoff;
        Some(sent + pto.min(self.max_probe_interval(path)))
    }

    /// Loss-detection timer of a path: time threshold or probe timeout (RFC 9002 §6.2).
    fn loss_timer(&self, path: &Path) -> Option<Instant> {
        if let Some(t) = path.sent.loss_time {
            return Some(t);
        }
        if !path.sent.has_ack_eliciting_in_flight() {
            return None;
        }
        let last = path.sent.time_of_last_ack_eliciting?;
        let last = path.sent.last_pto.map_or(last, |p| p.max(last));
        let backoff = 1u32 << path.sent.pto_count.min(10);
        let pto = self.probe_timeout(path) * backoff;
        Some(last + pto.min(self.max_probe_interval(path)))
    }

    /// Tail-loss probe timer of a path (the idea of RFC 8985's TLP): a probe timeout after
    /// the oldest outstanding packet left, rather than after the latest. The probe timeout
    /// counts from the latest ack-eliciting packet, so a sender of periodic messages (30 Hz
    /// frames) pushes it back with every message, and a message whose last packet was lost
    /// waited for the next message to reveal the gap: a whole period more. Armed only
    /// - while nothing waits to be sent (a window-limited sender has later packets whose
    ///   acknowledgements detect the loss sooner; the caller checks),
    /// - on the only usable path (`lone`; with others, the probe timeout is what moves the
    ///   data to them, and a probe on this path would put it off),
    /// - when a later packet did put the probe timeout off (else the probe timeout is as
    ///   early, and does the same),
    /// - before any probe timeout of the current episode (its probes resend the same), and
    /// - once per episode: after a probe, not again until something sent after the probed
    ///   packet is acknowledged (RFC 8985 §7.4), or during an outage each probe would be the
    ///   next probe's "later packet" and the probe timeout, its backoff and black-hole
    ///   detection would never come;
    ///
    /// never for a redundant copy or a PMTU probe.
    fn tail_probe_timer(&self, path: &Path, lone: bool) -> Option<Instant> {
        let sent = &path.sent;
        if !lone || sent.loss_time.is_some() || sent.pto_count > 0 || !path.usable() {
            return None;
        }
        if sent
            .tail_probed
            .is_some_and(|t| sent.largest_acked.is_none_or(|acked| acked <= t))
        {
            return None;
        }
        let (_, oldest) = sent.tail_probe_candidate()?;
        if sent.time_of_last_ack_eliciting? <= oldest.time {
            return None;
        }
        Some(oldest.time + self.probe_timeout(path))
    }

    /// Whether at most one path is usable (the tail-loss probe's condition).
    fn one_usable_path(&self) -> bool {
        self.paths.iter().filter(|p| p.usable()).nth(1).is_none()
    }

    /// A path's probe timeout without backoff: RTT, four variations and the peer's ACK delay.
    fn probe_timeout(&self, path: &Path) -> Duration {
        path.rtt.pto_base() + self.peer_max_ack_delay()
    }

    /// Resends what the oldest outstanding packet of path `index` carried, once, as a probe:
    /// nothing is declared lost, and the probe timeout's backoff is left alone.
    fn on_tail_probe_timer(&mut self, index: usize) {
        let path = &mut self.paths[index];
        let Some((pn, oldest)) = path.sent.tail_probe_candidate() else {
            return;
        };
        let frames = oldest.frames.clone();
        path.sent.tail_probed = Some(pn);
        path.probes = path.probes.max(1);
        self.stats.tail_probes += 1;
        self.probe_with(&frames);
    }

    /// Re-queues `frames` for a probe (without declaring them lost), or a Ping when they
    /// carried nothing to resend and nothing else waits.
    fn probe_with(&mut self, frames: &[crate::recovery::SentFrame]) {
        self.requeue(frames, true);
        if !self.has_sendable_data() {
            self.ping_pending = true;
        }
    }

    /// Handles expired timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Drained => return,
            State::Closing { deadline, resends } => {
                if now >= deadline {
                    self.state = State::Drained;
                } else if self.close_resend_at.is_some_and(|t| now >= t) {
                    // No answer yet: the Close (or the answer) was lost. Say it again.
                    self.close_resend_at = None;
                    self.close_resend = true;
                    self.state = State::Closing {
                        deadline,
                        resends: resends + 1,
                    };
                }
                return;
            }
            State::Draining { deadline } => {
                if now >= deadline {
                    self.state = State::Drained;
                }
                return;
            }
            State::Handshake(_) => {
                if now >= self.handshake_deadline {
                    self.enter_drained(ConnectionError::HandshakeTimedOut);
                    return;
                }
                self.handshake_timeout(now);
            }
            State::Established => {
                if self.announce.is_unproven() && now >= self.handshake_deadline {
                    // A client that never showed it is live: a replay, a spoofed source, or
                    // a client gone. Unless handed out early, nobody was told of it.
                    self.enter_drained(ConnectionError::HandshakeTimedOut);
                    return;
                }
                self.handshake_timeout(now)
            }
        }
        if self.idle_deadline.is_some_and(|d| now >= d) {
            // What a silent connection was waiting for: a sender with data, window and
            // nothing in flight points at a timer that was never armed.
            tracing::debug!(
                sendable = self.has_sendable_data(),
                in_flight = self
                    .paths
                    .iter()
                    .map(|p| p.sent.bytes_in_flight)
                    .sum::<u64>(),
                window = self.paths.iter().map(|p| p.cc.window()).sum::<u64>(),
                "idle timeout"
            );
            self.enter_drained(ConnectionError::TimedOut);
            return;
        }
        if self.keys.is_none() {
            return;
        }
        for i in 0..self.paths.len() {
            if self.loss_timer(&self.paths[i]).is_some_and(|t| now >= t) {
                self.on_loss_timer(now, i);
            } else if self
                .tail_probe_timer(&self.paths[i], self.one_usable_path())
                .is_some_and(|t| now >= t)
                && !self.has_sendable_data()
            {
                self.on_tail_probe_timer(i);
            }
            if self
                .challenge_timer(&self.paths[i])
                .is_some_and(|t| now >= t)
            {
                self.on_challenge_unanswered(i);
            }
        }
        if self.keep_alive_at().is_some_and(|t| now >= t) {
            self.ping_pending = true;
        }
        self.expire_messages(now);
        if self.window.status_at.is_some_and(|t| now >= t) {
            // Still closed: ask the peer for its window state (SLTP STATUS).
            self.window.status_pending = true;
            self.window.status_at = None;
        }
        for path in &mut self.paths {
            if path.pacing_until.is_some_and(|t| now >= t) {
                path.pacing_until = None;
            }
        }
    }

    fn on_loss_timer(&mut self, now: Instant, index: usize) {
        let path = &mut self.paths[index];
        if path.sent.loss_time.is_some() {
            let mut out = crate::recovery::Outcome::default();
            path.sent.detect_lost(now, &path.rtt, &mut out);
            self.on_lost(now, index, out.lost, crate::recovery::PeerReport::Nothing);
            return;
        }
        if self.pmtu_probe_timeout(index) {
            // Nothing but a PMTU probe was out: it is lost, and the path is not silent.
            return;
        }
        let path = &mut self.paths[index];
        // Probe timeout: send up to two ack-eliciting packets on this path regardless of its
        // window.
        path.sent.pto_count += 1;
        path.sent.last_pto = Some(now);
        path.probes = 2;
        self.stats.ptos += 1;
        if self.paths.len() > 1 && self.on_path_silent(now, index) {
            // Its data went to the other paths; the probes only ask whether it is back.
            return;
        }
        // Resend what the oldest outstanding packet carried (without declaring it lost),
        // so the probe carries data when there is no new data to send.
        let frames = self.paths[index]
            .sent
            .oldest_ack_eliciting()
            .map(|p| p.frames.clone())
            .unwrap_or_default();
        self.probe_with(&frames);
    }

    /// Gives up messages whose deadline passed, on both sides.
    pub(crate) fn expire_messages(&mut self, now: Instant) {
        self.report_hopeless_messages();
        for (id, late_by) in self.messages_out.expire(now) {
            self.stats.messages_expired_sent += 1;
            self.events.push_back(Event::MessageExpired {
                id,
                by_sender: true,
                late_by,
            });
        }
        let ready_before = self.messages_in.ready.len();
        for s in self.messages_in.expire(now) {
            self.on_message_skipped(s);
        }
        self.on_messages_ready(now, ready_before);
    }

    /// After messages may have become ready (those from index `ready_before` on): drops the
    /// ones whose deadline passed before they could be delivered, and tells the application
    /// of the rest, once (unread ones stay there and must not make an event of every later
    /// fragment).
    pub(crate) fn on_messages_ready(&mut self, now: Instant, ready_before: usize) {
        for s in self.messages_in.drop_late(ready_before, now) {
            self.on_message_skipped(s);
        }
        if self.messages_in.ready.len() > ready_before {
            self.events.push_back(Event::MessageReceived);
        }
    }

    /// Reports messages the sender gave up before starting them (they could not arrive by
    /// their deadline).
    pub(crate) fn report_hopeless_messages(&mut self) {
        for id in std::mem::take(&mut self.messages_out.hopeless) {
            self.stats.messages_expired_sent += 1;
            self.events.push_back(Event::MessageExpired {
                id,
                by_sender: true,
                late_by: Duration::ZERO,
            });
        }
    }

    pub(crate) fn on_message_skipped(&mut self, s: crate::message::recv::Skipped) {
        self.stats.messages_expired_received += 1;
        self.flows.data_received += s.counted;
        self.flows.on_consumed(s.release);
        self.events.push_back(Event::MessageExpired {
            id: s.id,
            by_sender: false,
            late_by: s.late_by,
        });
    }

    /// Whether data may flow to the peer (its application window is open).
    pub(crate) fn data_allowed_by_window(&self) -> bool {
        !self.window.peer_closed
    }

    /// Whether flow data or flow control frames are waiting (pacing applies to these).
    pub(crate) fn has_sendable_data(&self) -> bool {
        let data = self.data_allowed_by_window()
            && (!self.flows.ready.is_empty()
                || self.messages_out.has_pending()
                || !self.datagrams_out.is_empty());
        data || self.window.update_pending
            || self.window.status_pending
            || !self.messages_out.skips.is_empty()
            || self.ping_pending
            || self.flows.max_data_pending
            || !self.flows.credit_pending.is_empty()
            || self.flows.max_flows_pending.iter().any(|p| *p)
            || self.handshake_done_pending
            || self.advertise_pending
            || !self.remove_pending.is_empty()
            || self.paths.iter().any(|p| p.status_pending)
            || self.paths.iter().any(|p| p.probe_rx.pending.is_some())
    }
}
