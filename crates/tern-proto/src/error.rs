//! Errors at every boundary (STYLE.md example 14): one typed error per boundary, mapped to
//! wire codes where they cross the wire.

use crate::wire::TransportErrorCode;

/// Why a handshake failed. Never carries snow's detail, which must not reach a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Local key material could not be set up.
    #[error("handshake setup failed")]
    Crypto,
    /// A handshake message did not authenticate.
    #[error("handshake message failed authentication")]
    Authentication,
}

/// Why a connection could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The endpoint has too many connections.
    #[error("too many connections")]
    TooManyConnections,
    /// The handshake could not be set up.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The application closed it.
    #[error("closed locally with code {code}")]
    LocallyClosed {
        /// Application error code.
        code: u64,
    },
    /// The peer's application closed it.
    #[error("closed by peer with code {code}: {reason}")]
    ApplicationClosed {
        /// Application error code.
        code: u64,
        /// Reason text from the peer.
        reason: String,
    },
    /// The peer's transport closed it with an error.
    #[error("peer reported transport error {code}: {reason}")]
    TransportError {
        /// Transport error code.
        code: TransportErrorCode,
        /// Reason text.
        reason: String,
    },
    /// We closed it because the peer broke the protocol.
    #[error("protocol error {code}: {reason}")]
    ProtocolViolation {
        /// The code sent to the peer.
        code: TransportErrorCode,
        /// What was wrong.
        reason: &'static str,
    },
    /// A packet key reached an AEAD usage limit (PROTOCOL.md §6.4): `integrity_limit`
    /// packets failed authentication (forgeries, or a badly corrupting path), or a key was
    /// about to seal its `confidentiality_limit` of packets and could not be updated. The
    /// peer is told AEAD_LIMIT_REACHED.
    #[error("AEAD usage limit reached: {reason}")]
    AeadLimitReached {
        /// Which limit.
        reason: &'static str,
    },
    /// Nothing heard from the peer for the idle timeout.
    #[error("timed out: nothing heard from the peer")]
    TimedOut,
    /// The handshake did not complete in time.
    #[error("handshake timed out (is the server running and reachable?)")]
    HandshakeTimedOut,
    /// The server could not authenticate our first message: with IK this means the server's
    /// key given to `connect` is not the server's.
    #[error("server refused the handshake (wrong server public key?)")]
    HandshakeRefused,
    /// The server refused the connection (full, or not accepting).
    #[error("server refused the connection")]
    ConnectionRefused,
    /// The peer sent a stateless reset: it lost its state (crash or restart).
    #[error("peer reset the connection (it lost its state)")]
    Reset,
    /// The peer does not speak our version.
    #[error("peer does not support tern version 1")]
    VersionMismatch,
    /// The endpoint carrying the connection stopped: it was aborted, its socket failed, or
    /// its task ended. Set by a runtime (the `tern` crate), never by the protocol core.
    #[error("endpoint stopped: {reason}")]
    EndpointStopped {
        /// What stopped it.
        reason: String,
    },
}

/// Why a write to a flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The send buffer is full: wait for a `FlowWritable` event.
    #[error("send buffer full")]
    Blocked,
    /// The peer asked us to stop sending, with this code.
    #[error("peer stopped the flow with code {0}")]
    Stopped(u64),
    /// No such flow, or its sending half is closed.
    #[error("unknown or closed flow")]
    ClosedFlow,
    /// The connection is closed.
    #[error("connection closed")]
    ConnectionClosed,
}

/// Why a read from a flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Nothing to read now: wait for a `FlowReadable` event.
    #[error("no data ready")]
    Blocked,
    /// The peer reset the flow with this code.
    #[error("peer reset the flow with code {0}")]
    Reset(u64),
    /// No such flow, or its receiving half is closed.
    #[error("unknown or closed flow")]
    ClosedFlow,
    /// The connection is closed.
    #[error("connection closed")]
    ConnectionClosed,
}

/// Why opening a flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The peer's flow limit is reached: wait for a `FlowsAvailable` event.
    #[error("peer's flow limit reached")]
    Blocked,
    /// The connection is closed.
    #[error("connection closed")]
    ConnectionClosed,
}
