//! Flows: ordered byte streams multiplexed on a connection without head-of-line blocking
//! between them (DESIGN.md F4, docs/PROTOCOL.md §10). Either side opens one at no round-trip
//! cost; credit is granted per flow and per connection.

pub(crate) mod recv;
mod send;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

pub(crate) use recv::{RecvError, RecvFlow};
pub(crate) use send::{BufferPool, SendFlow};

use crate::Side;

/// Whether a flow carries data both ways or only from its opener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Both sides send.
    Bi,
    /// Only the opener sends.
    Uni,
}

/// A flow's identifier: bit 0 says who opened it (0 client, 1 server), bit 1 its direction
/// (0 both ways, 1 one way), the rest is a per-kind counter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(pub u64);

impl FlowId {
    /// The ID of flow number `index` of the given kind.
    pub fn from_parts(initiator: Side, dir: Dir, index: u64) -> Self {
        Self::new(initiator, dir, index)
    }

    pub(crate) fn new(initiator: Side, dir: Dir, index: u64) -> Self {
        let side_bit = match initiator {
            Side::Client => 0,
            Side::Server => 1,
        };
        let dir_bit = match dir {
            Dir::Bi => 0,
            Dir::Uni => 2,
        };
        Self((index << 2) | dir_bit | side_bit)
    }

    /// Which side opened the flow.
    pub fn initiator(self) -> Side {
        if self.0 & 1 == 0 {
            Side::Client
        } else {
            Side::Server
        }
    }

    /// The flow's direction.
    pub fn dir(self) -> Dir {
        if self.0 & 2 == 0 {
            Dir::Bi
        } else {
            Dir::Uni
        }
    }

    /// The per-(initiator, direction) counter.
    pub fn index(self) -> u64 {
        self.0 >> 2
    }
}

impl fmt::Debug for FlowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FlowId({})", self.0)
    }
}

impl fmt::Display for FlowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Both halves of one flow; a uni flow has only one.
#[derive(Debug, Default)]
pub(crate) struct FlowState {
    pub(crate) send: Option<SendFlow>,
    pub(crate) recv: Option<RecvFlow>,
}

impl FlowState {
    /// Both halves are finished and the state can be dropped.
    pub(crate) fn is_closed(&self) -> bool {
        let send_done = self
            .send
            .as_ref()
            .is_none_or(|s| s.is_done() || s.reset_acked);
        // A stopped half is done once its final size is known (a FIN or a ResetFlow) and its
        // StopSending left: nobody reads it, and the peer sends nothing more.
        let recv_done = self.recv.as_ref().is_none_or(|r| {
            r.is_finished()
                || r.reset.is_some()
                || (r.stop.is_some() && !r.stop_pending && r.final_size.is_some())
        });
        send_done && recv_done
    }
}

/// All flows of a connection plus connection-level credit.
#[derive(Debug)]
pub(crate) struct FlowSet {
    pub(crate) side: Side,
    pub(crate) flows: BTreeMap<FlowId, FlowState>,
    /// Next index for flows we open, per direction.
    next_local: [u64; 2],
    /// Peer's limit on flows we may open (MaxFlows), per direction.
    pub(crate) peer_max: [u64; 2],
    /// Flows the peer opened (highest index + 1), per direction.
    remote_opened: [u64; 2],
    /// Our limit on flows the peer may open, per direction.
    pub(crate) local_max: [u64; 2],
    /// The limit the peer was last told (transport parameter, then MaxFlows), per direction.
    pub(crate) advertised_max: [u64; 2],
    /// Our configured concurrency for peer-opened flows (refreshes local_max).
    local_concurrency: [u64; 2],
    /// Peer-opened flows not yet accepted by the application.
    pub(crate) incoming: [VecDeque<FlowId>; 2],
    /// Flows with something to send, in round-robin order.
    pub(crate) ready: VecDeque<FlowId>,
    /// Connection-level credit the peer gave us, and how much new data we sent.
    pub(crate) peer_max_data: u64,
    /// See [`peer_connection_window`](Self::peer_connection_window).
    pub(crate) peer_window: u64,
    pub(crate) data_sent: u64,
    /// Connection-level credit we gave, its window, and how much we received / consumed.
    pub(crate) local_max_data: u64,
    pub(crate) local_window: u64,
    pub(crate) data_received: u64,
    pub(crate) data_consumed: u64,
    /// Initial per-flow credits we grant and that the peer grants.
    pub(crate) local_flow_window: u64,
    pub(crate) peer_flow_credit_bidi_local: u64,
    pub(crate) peer_flow_credit_bidi_remote: u64,
    pub(crate) peer_flow_credit_uni: u64,
    /// Per-flow send buffer limit.
    pub(crate) send_buffer: u64,
    /// Flows whose receive credit must be advertised.
    pub(crate) credit_pending: Vec<FlowId>,
    /// MaxFlows frames pending, per direction.
    pub(crate) max_flows_pending: [bool; 2],
    pub(crate) max_data_pending: bool,
    /// Buffers for the data `Connection::write` copies.
    pub(crate) buffers: BufferPool,
}

/// Flows of each kind every endpoint must allow its peer (docs/PROTOCOL.md §8), so that a
/// client can open flows and send first-flight data before the server's parameters arrive.
pub const PRE_HANDSHAKE_FLOWS: u64 = 4;
/// Credit (per flow and per connection) every endpoint must grant at least.
pub const PRE_HANDSHAKE_CREDIT: u64 = 16 * 1024;

fn dir_index(dir: Dir) -> usize {
    match dir {
        Dir::Bi => 0,
        Dir::Uni => 1,
    }
}

/// Errors when opening or addressing flows, mapped to transport errors by the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlowError {
    /// The peer opened more flows than we allowed.
    Limit,
    /// The frame does not fit the flow's direction (e.g. data on our receive-only flow).
    State,
}

impl FlowSet {
    /// The sending half of flow `id`, if it has one still open.
    pub(crate) fn send_mut(&mut self, id: FlowId) -> Option<&mut SendFlow> {
        self.flows.get_mut(&id).and_then(|f| f.send.as_mut())
    }

    /// Abandons the sending half of flow `id` with `code` (unsent and unacknowledged data is
    /// dropped), unless it is reset or done already. Its data may never be acknowledged now,
    /// so the write-buffer pool is emptied too. Returns whether it reset the flow now.
    pub(crate) fn reset_send(&mut self, id: FlowId, code: u64) -> bool {
        let Some(send) = self.send_mut(id) else {
            return false;
        };
        if send.reset.is_some() || send.is_done() {
            return false;
        }
        send.reset = Some(code);
        send.reset_pending = true;
        send.retransmit = Default::default();
        self.buffers.clear();
        true
    }

    /// The receiving half of flow `id`, if it has one still open.
    pub(crate) fn recv_mut(&mut self, id: FlowId) -> Option<&mut RecvFlow> {
        self.flows.get_mut(&id).and_then(|f| f.recv.as_mut())
    }

    pub(crate) fn new(side: Side, local: &crate::config::FlowConfig) -> Self {
        Self {
            side,
            flows: BTreeMap::new(),
            next_local: [0, 0],
            peer_max: [PRE_HANDSHAKE_FLOWS, PRE_HANDSHAKE_FLOWS],
            remote_opened: [0, 0],
            local_max: [local.max_concurrent_bidi, local.max_concurrent_uni],
            advertised_max: [local.max_concurrent_bidi, local.max_concurrent_uni],
            local_concurrency: [local.max_concurrent_bidi, local.max_concurrent_uni],
            incoming: [VecDeque::new(), VecDeque::new()],
            ready: VecDeque::new(),
            peer_max_data: PRE_HANDSHAKE_CREDIT,
            peer_window: PRE_HANDSHAKE_CREDIT,
            data_sent: 0,
            local_max_data: local.connection_window,
            local_window: local.connection_window,
            data_received: 0,
            data_consumed: 0,
            local_flow_window: local.flow_window,
            peer_flow_credit_bidi_local: PRE_HANDSHAKE_CREDIT,
            peer_flow_credit_bidi_remote: PRE_HANDSHAKE_CREDIT,
            peer_flow_credit_uni: PRE_HANDSHAKE_CREDIT,
            send_buffer: local.send_buffer,
            credit_pending: Vec::new(),
            max_flows_pending: [false, false],
            max_data_pending: false,
            buffers: BufferPool::default(),
        }
    }

    /// Opens a flow of ours; None when the peer's MaxFlows limit is reached.
    pub(crate) fn open(&mut self, dir: Dir) -> Option<FlowId> {
        let d = dir_index(dir);
        if self.next_local[d] >= self.peer_max[d] {
            return None;
        }
        let id = FlowId::new(self.side, dir, self.next_local[d]);
        self.next_local[d] += 1;
        let credit = match dir {
            // The peer's "bidi remote" credit applies to flows we open.
            Dir::Bi => self.peer_flow_credit_bidi_remote,
            Dir::Uni => self.peer_flow_credit_uni,
        };
        let state = FlowState {
            send: Some(SendFlow::new(credit)),
            recv: (dir == Dir::Bi).then(|| RecvFlow::new(self.local_flow_window)),
        };
        self.flows.insert(id, state);
        Some(id)
    }

    /// Finds a flow a frame refers to, creating peer-opened flows (and all lower-numbered
    /// ones of the same kind, which may arrive later) on first sight.
    /// `sending` is true for frames about the peer's sending half (Flow, ResetFlow).
    pub(crate) fn get_or_open_remote(
        &mut self,
        id: FlowId,
        sending: bool,
    ) -> Result<Option<&mut FlowState>, FlowError> {
        let ours = id.initiator() == self.side;
        if ours {
            // Our own uni flow has no half the peer sends on; and a flow we never opened
            // cannot be spoken of (closed and forgotten ones can, which is fine).
            if (id.dir() == Dir::Uni && sending)
                || id.index() >= self.next_local[dir_index(id.dir())]
            {
                return Err(FlowError::State);
            }
            return Ok(self.flows.get_mut(&id));
        }
        if id.dir() == Dir::Uni && !sending {
            // The peer's uni flow has no half that the peer receives on.
            return Err(FlowError::State);
        }
        let d = dir_index(id.dir());
        if id.index() >= self.local_max[d] {
            return Err(FlowError::Limit);
        }
        while self.remote_opened[d] <= id.index() {
            let new = FlowId::new(self.side.peer(), id.dir(), self.remote_opened[d]);
            self.remote_opened[d] += 1;
            let credit = self.peer_flow_credit_bidi_local;
            let state = FlowState {
                send: (id.dir() == Dir::Bi).then(|| SendFlow::new(credit)),
                recv: Some(RecvFlow::new(self.local_flow_window)),
            };
            self.flows.insert(new, state);
            self.incoming[d].push_back(new);
            self.check_max_flows(d);
        }
        Ok(self.flows.get_mut(&id))
    }

    /// Marks a flow as having something to send.
    pub(crate) fn mark_ready(&mut self, id: FlowId) {
        if !self.ready.contains(&id) {
            self.ready.push_back(id);
        }
    }

    /// Drops a finished flow and, if the peer opened it, lets the peer open another.
    pub(crate) fn reap(&mut self, id: FlowId) {
        let closed = self.flows.get(&id).is_some_and(|f| f.is_closed());
        if !closed {
            return;
        }
        self.flows.remove(&id);
        self.ready.retain(|f| *f != id);
        self.buffers.clear();
        if id.initiator() != self.side {
            let d = dir_index(id.dir());
            self.local_max[d] += 1;
            self.check_max_flows(d);
        }
    }

    /// Queues a MaxFlows for direction `d` when slots freed since the last one make half the
    /// concurrency, or when the peer is within that of the limit it was told and any are free.
    /// (Comparing with the flows the peer opened instead of the limit it was told stalled it
    /// for good: with half its flows long-lived, the freed slots never added up to a batch.)
    fn check_max_flows(&mut self, d: usize) {
        let half = (self.local_concurrency[d] / 2).max(1);
        let unadvertised = self.local_max[d].saturating_sub(self.advertised_max[d]);
        let room = self.advertised_max[d].saturating_sub(self.remote_opened[d]);
        if unadvertised >= half || (unadvertised > 0 && room < half) {
            self.max_flows_pending[d] = true;
        }
    }

    /// The receive window the peer granted for the whole connection (its first MaxData, the
    /// size every later one keeps open ahead of what it consumed).
    pub(crate) fn peer_connection_window(&self) -> u64 {
        self.peer_window
    }

    /// Connection-level credit left for new bytes.
    pub(crate) fn conn_credit(&self) -> u64 {
        self.peer_max_data.saturating_sub(self.data_sent)
    }

    /// Application consumed bytes: maybe refresh connection credit.
    pub(crate) fn on_consumed(&mut self, n: u64) {
        self.data_consumed += n;
        let target = self.data_consumed + self.local_window;
        if target - self.local_max_data >= self.local_window / 2 {
            self.local_max_data = target;
            self.max_data_pending = true;
        }
    }

    /// Bytes held in receive buffers of all flows.
    pub(crate) fn recv_buffered(&self) -> u64 {
        self.flows
            .values()
            .filter_map(|f| f.recv.as_ref())
            .map(|r| r.buffered())
            .sum()
    }

    /// Disjoint ranges held by the receive halves of all flows.
    pub(crate) fn recv_ranges(&self) -> usize {
        self.flows
            .values()
            .filter_map(|f| f.recv.as_ref())
            .map(|r| r.ranges())
            .sum()
    }

    /// The peer's transport parameters arrived: they replace the pre-handshake minimums
    /// (they are never lower, which the handshake checks).
    pub(crate) fn apply_peer_limits(
        &mut self,
        max_data: u64,
        max_flows: [u64; 2],
        bidi_local: u64,
        bidi_remote: u64,
        uni: u64,
    ) {
        self.peer_max_data = self.peer_max_data.max(max_data);
        self.peer_window = self.peer_window.max(max_data);
        for (limit, new) in self.peer_max.iter_mut().zip(max_flows) {
            *limit = (*limit).max(new);
        }
        self.peer_flow_credit_bidi_local = bidi_local;
        self.peer_flow_credit_bidi_remote = bidi_remote;
        self.peer_flow_credit_uni = uni;
        let side = self.side;
        for (id, state) in self.flows.iter_mut() {
            let credit = match (id.initiator() == side, id.dir()) {
                (true, Dir::Bi) => bidi_remote,
                (true, Dir::Uni) => uni,
                (false, _) => bidi_local,
            };
            if let Some(send) = state.send.as_mut() {
                send.max_data = send.max_data.max(credit);
            }
        }
    }

    pub(crate) fn dir_index(dir: Dir) -> usize {
        dir_index(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_id_bits() {
        let id = FlowId::new(Side::Server, Dir::Uni, 5);
        assert_eq!(id.0, (5 << 2) | 3);
        assert_eq!(id.initiator(), Side::Server);
        assert_eq!(id.dir(), Dir::Uni);
        assert_eq!(id.index(), 5);
    }
}
