//! Events the application sees (DESIGN.md F8). The runtime turns them into an event stream
//! and optional up-calls.

use crate::error::ConnectionError;
use crate::flow::{Dir, FlowId};

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
    /// A packet was dropped for a security reason.
    SecurityViolation(Violation),
    /// The connection ended (by either side, timeout or reset).
    Closed(ConnectionError),
    /// The connection's resources were freed: closed at both ends (no more events).
    Drained,
}
