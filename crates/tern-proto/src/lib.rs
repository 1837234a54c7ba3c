//! # tern-proto: the sans-I/O core of tern
//!
//! This crate is deterministic: it contains no networking code, never reads the clock, never
//! spawns threads and never draws from a global RNG. Datagrams, the current time and random
//! seeds come in as arguments; datagrams to send go out into buffers the caller owns. Most
//! users want the `tern` crate, which drives this core over real UDP sockets with tokio;
//! `tern-sim` drives it in virtual time.
//!
//! The main types:
//! - [`Endpoint`] owns many [`Connection`]s, routes datagrams to them by connection ID and
//!   accepts new ones; it is driven by `handle`, `poll_transmit`, `poll_timeout`,
//!   `handle_timeout` and `poll_event`.
//! - [`Connection`] carries ordered byte [flows](flow) without head-of-line blocking between
//!   them, with per-flow and per-connection credit.
//! - [`wire`] is the wire format of docs/PROTOCOL.md; [`crypto`] the Noise handshake and
//!   packet protection; [`recovery`] ACKs, NACKs and loss detection; [`cc`] the pluggable
//!   congestion controllers and the pacer.
//!
//! What is implemented and what is not is listed in the README's feature table.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cc;
pub mod config;
pub mod connection;
pub mod crypto;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod flow;
pub(crate) mod path;
pub mod recovery;
pub mod wire;

pub use config::{ConnectionConfig, EndpointConfig, FlowConfig, RetryPolicy};
pub use connection::{Connection, ConnectionStats, Transmit};
pub use crypto::{PublicKey, StaticKeypair};
pub use endpoint::{ConnectionHandle, Endpoint, EndpointStats};
pub use error::{ConnectError, ConnectionError, OpenError, ReadError, WriteError};
pub use event::{Event, Violation};
pub use flow::{Dir, FlowId};

/// Which end of a connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The end that started the connection.
    Client,
    /// The end that accepted it.
    Server,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Self {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}
