//! Events the application sees (DESIGN.md F8). The runtime turns them into an event stream
//! and optional up-calls.

use std::time::Duration;

use crate::error::ConnectionError;
use crate::flow::{Dir, FlowId};
use crate::message::MessageId;

/// Kinds of security violation, counted and reported, never fatal on their own (a forged
/// packet must not be able to end a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A packet failed authentication (tampered, or not from the peer).
    Authentication,
    /// A packet number was seen before (replay).
    Replay,
}

/// Something the application may act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The handshake completed; flows can be used.
    Connected,
    /// The peer opened a flow; accept it with `accept_flow`.
    FlowOpened {
        /// Its direction.
        dir: Dir,
    },
    /// A flow has data (or its end) to read.
    FlowReadable(FlowId),
    /// A flow's send buffer has room again.
    FlowWritable(FlowId),
    /// Everything sent on a flow, FIN included, was acknowledged.
    FlowFinished(FlowId),
    /// The peer asked us to stop sending on a flow.
    FlowStopped {
        /// The flow.
        id: FlowId,
        /// Application code.
        code: u64,
    },
    /// The peer's flow limit was raised: more flows can be opened.
    FlowsAvailable(Dir),
    /// A message arrived whole: take it with `recv_message`.
    MessageReceived,
    /// A message with a deadline was given up. On the sender (`by_sender`), its deadline passed
    /// before it was acknowledged; on the receiver, it was skipped (the sender gave it up, or
    /// it was not complete by its deadline): `late_by` is how far past the deadline.
    MessageExpired {
        /// The message.
        id: MessageId,
        /// Whether this side sent it.
        by_sender: bool,
        /// How far past the deadline (zero when the sender's skip arrived first).
        late_by: Duration,
    },
    /// A datagram arrived: take it with `recv_datagram`.
    DatagramReceived,
    /// A receive window was closed (F7): by this side's application (`local`) or by the
    /// peer's, which means this side stops sending until it opens.
    WindowClosed {
        /// Closed by this side.
        local: bool,
        /// The application's reason code (e.g. an impending handover).
        code: u64,
        /// The reason text.
        reason: String,
    },
    /// A receive window opened again.
    WindowOpened {
        /// Opened by this side.
        local: bool,
    },
    /// A packet was dropped for a security reason. While one of a kind waits to be polled,
    /// more of that kind are only counted (`auth_failures`, `replays` in the stats): a flood
    /// of forged packets must not grow the event queue.
    SecurityViolation(Violation),
    /// The connection ended (by either side, timeout or reset).
    Closed(ConnectionError),
    /// The connection's resources were freed: closed at both ends (no more events).
    Drained,
    /// A path was opened (by us, or by the peer from a new address); it carries data once
    /// validated.
    PathOpened {
        /// The path's ID.
        id: u32,
        /// The peer's address on it.
        remote: std::net::SocketAddr,
    },
    /// The peer answered our challenge on a path: it may carry data.
    PathValidated {
        /// The path's ID.
        id: u32,
    },
    /// A path stopped answering (or never answered its challenge): its data in flight was
    /// moved to the other paths; it is still probed and comes back when it answers.
    PathDead {
        /// The path's ID.
        id: u32,
    },
    /// A dead path answered again.
    PathAlive {
        /// The path's ID.
        id: u32,
    },
    /// A path was made active, standby or abandoned, by the application of either end
    /// (`by_peer`: the peer's PathStatus, or its RemoveAddress). An abandoned path's data in
    /// flight was moved to the other paths.
    PathStateChanged {
        /// The path's ID.
        id: u32,
        /// Its new state.
        state: crate::path::PathState,
        /// The peer asked for it.
        by_peer: bool,
    },
    /// A probe train measured a path's bottleneck rate (packet-pair fast start, F11): the
    /// path's controller now starts from it. `bytes_per_second` is the estimate as applied
    /// (after the sender's bounds).
    RateEstimate {
        /// The path's ID.
        path: u32,
        /// The estimate, bytes per second.
        bytes_per_second: u64,
    },
    /// The rate the application should produce data at (F13, see
    /// `Connection::target_rate`): reported the first time it is known, then when it moves
    /// by more than 10 % or changes source, at most once per smoothed RTT.
    TargetRate(crate::connection::TargetRate),
    /// A path's datagram size changed (PMTU discovery, PROTOCOL.md §5.5): a probe of `size`
    /// bytes was acknowledged, or a black hole sent it back to 1 200.
    PathMtuChanged {
        /// The path's ID.
        id: u32,
        /// Its new datagram size (largest UDP payload).
        size: u16,
    },
    /// The peer's address on a path changed (NAT rebinding, a new lease, a new roadside
    /// unit): the new address is being validated.
    PeerAddressChanged {
        /// The path's ID.
        id: u32,
        /// The new address.
        remote: std::net::SocketAddr,
    },
}
