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
//!   congestion controllers and the pacer; [`router`] the F12 explicit-rate router that
//!   `tern-sim` and `tern-netem` run on links.
//!
//! What is implemented and what is not is listed in the README's feature table.
//!
//! # Example
//! Two endpoints in one process; the client knows the server's key (Noise IK), so its first
//! datagram already carries flow data.
//! ```
//! use std::time::{Instant, SystemTime, UNIX_EPOCH};
//! use tern_proto::{Dir, Endpoint, EndpointConfig, StaticKeypair};
//!
//! let now = Instant::now();
//! // The core reads no clock: the wall clock comes from the driver. With it the client
//! // timestamps its first flight, so that a server drops replays of it (PROTOCOL.md §7.6).
//! let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
//! let server_keys = StaticKeypair::generate([1; 32]); // use OS entropy in real code
//! let mut server_config = EndpointConfig::new(server_keys, [2; 32]).server();
//! server_config.wall_clock = Some(wall);
//! let mut server = Endpoint::new(server_config, now);
//! let client_keys = StaticKeypair::generate([3; 32]);
//! let mut client_config = EndpointConfig::new(client_keys, [4; 32]);
//! client_config.wall_clock = Some(wall);
//! let mut client = Endpoint::new(client_config, now);
//!
//! let server_addr = "127.0.0.1:4433".parse().unwrap();
//! let conn = client.connect(now, server_addr, Some(server.public_key())).unwrap();
//! let c = client.connection_mut(conn).unwrap();
//! let flow = c.open_flow(Dir::Uni).unwrap();
//! c.write(flow, b"hello").unwrap();
//!
//! // Send what poll_transmit writes; feed what arrives to handle(). The server hands the
//! // connection out once the client proved it is live (its first packet after message 2).
//! let (client_addr, server_addr) = ("127.0.0.1:5000".parse().unwrap(), server_addr);
//! let mut buf = Vec::new();
//! let accepted = loop {
//!     while let Some(t) = client.poll_transmit(now, &mut buf) {
//!         let mut datagram = buf.split_off(buf.len() - t.size);
//!         server.handle(now, client_addr, None, &mut datagram);
//!     }
//!     while let Some(t) = server.poll_transmit(now, &mut buf) {
//!         let mut datagram = buf.split_off(buf.len() - t.size);
//!         client.handle(now, server_addr, None, &mut datagram);
//!     }
//!     if let Some(handle) = server.accept() {
//!         break handle;
//!     }
//! };
//! let s = server.connection_mut(accepted).unwrap();
//! let id = s.accept_flow(Dir::Uni).unwrap();
//! let mut out = [0u8; 16];
//! assert_eq!(s.read(id, &mut out).unwrap(), Some(5));
//! assert_eq!(&out[..5], b"hello");
//! ```
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
pub mod lb;
mod limits;
pub mod message;
pub(crate) mod path;
pub mod qlog;
pub mod recovery;
pub mod router;
mod schedule;
pub mod wire;

pub use config::{ConnectionConfig, EndpointConfig, FirstFlightConfig, FlowConfig, RetryPolicy};
pub use connection::{Connection, ConnectionStats, RateSource, TargetRate, Transmit};
pub use crypto::{KeyUpdateError, PublicKey, StaticKeypair};
pub use endpoint::{ConnectionHandle, Endpoint, EndpointStats};
pub use error::{ConnectError, ConnectionError, OpenError, ReadError, WriteError};
pub use event::{Event, Violation};
pub use flow::{Dir, FlowId};
pub use message::{
    DatagramError, Message, MessageId, MessageOptions, SendMessageError, MESSAGE_CREDIT_OVERHEAD,
};
pub use path::scheduler::{
    AckClocked, Backup, Candidate, Context as SchedulerContext, Deadline, MinRtt, Redundant,
    RoundRobin, Scheduler, SchedulerKind, UnknownScheduler,
};
pub use path::{PathState, PathStats, MAX_PATHS};
pub use recovery::{EcnCodepoint, EcnState};

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
