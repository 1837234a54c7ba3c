//! # tern
//!
//! tern is a transport protocol over UDP for the mobile edge: encrypted (Noise IK/XX) in one
//! round trip with data in the first packet, many ordered flows without head-of-line blocking,
//! NACK-driven loss recovery, pluggable congestion control. This crate runs it over real UDP
//! sockets with tokio; the protocol itself is the sans-I/O `tern-proto`.
//!
//! - [`Endpoint`] binds a socket ([`Endpoint::builder`] for the bind address, socket buffers,
//!   GSO, or a socket of your own: a bound `std::net::UdpSocket`, or any
//!   [`socket::AsyncUdpSocket`]); `connect` and `accept` give [`Connection`]s;
//!   [`Endpoint::close`] and [`Endpoint::wait_idle`] shut it down gracefully.
//! - A connection opens and accepts flows: [`SendFlow`] and [`RecvFlow`], with quinn-style
//!   methods and typed errors ([`WriteError`], [`ReadError`]: a reset is not a lost
//!   connection), and tokio's `AsyncWrite`/`AsyncRead`. Dropping a `SendFlow` finishes it;
//!   dropping a `RecvFlow` before its end stops it.
//! - Messages with deadlines and priorities ([`Connection::request`], [`Connection::reply`]),
//!   and unreliable datagrams ([`Connection::send_datagram`]).
//! - Events (F8) come two ways: as a stream per connection ([`Connection::events`]) or as
//!   up-calls on the endpoint ([`Endpoint::on_event`]).
//! - Media encoders follow [`Connection::target_rate`] (F13) and its [`Event::TargetRate`]
//!   updates; with the explicit-rate controller ([`cc::Algorithm::Explicit`]) a tern router's
//!   rate (F12) sets it, and [`Connection::set_expected_rate`] declares what the application
//!   wants.
//!
//! ```
//! use tern::{Endpoint, StaticKeypair};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Endpoint::server("127.0.0.1:0".parse()?, StaticKeypair::generate(tern::entropy()))?;
//! let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
//! let addr = server.local_addr()?;
//! let key = server.public_key();
//!
//! tokio::spawn(async move {
//!     let conn = server.accept().await.unwrap();
//!     let mut flow = conn.accept_uni().await.unwrap();
//!     let mut text = String::new();
//!     flow.read_to_string(&mut text).await.unwrap();
//!     println!("server got {text:?}");
//! });
//!
//! let conn = client.connect(addr, Some(key)).await?;
//! let mut flow = conn.open_uni().await?;
//! flow.write_all(b"hello from the edge").await?;
//! flow.finish()?;
//! flow.finished().await?;
//! conn.close(0, b"done");
//! conn.closed().await;
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod connection;
mod driver;
mod endpoint;
mod flow;
pub mod keys;
mod qlog;
mod runtime;
pub mod socket;
mod workers;

pub use connection::{Connection, EventStream, RequestError, EVENT_QUEUE};
pub use driver::{ConnectionId, IoStats, Upcall};
pub use endpoint::{entropy, ConnectError, Endpoint, EndpointBuilder};
pub use flow::{ReadError, ReadExactError, ReadToEndError, RecvFlow, SendFlow, WriteError};
pub use qlog::QLOG_DIR_ENV;
/// Congestion controllers (F10): [`cc::Algorithm`] to pick a built-in one by name,
/// [`cc::CubicConfig`] and [`cc::NewRenoConfig`] to tune one, and the [`cc::Controller`] and
/// [`cc::ControllerFactory`] traits to plug in your own (set
/// [`ConnectionConfig::congestion`]).
pub use tern_proto::cc;
/// QUIC-LB connection IDs (a server ID in every ID, for stateless load balancers):
/// [`lb::QuicLb`] is the configuration a balancer and its servers share.
pub use tern_proto::lb;
/// Why a connection could not even be started (the inner error of [`ConnectError::Start`]).
pub use tern_proto::ConnectError as StartError;
/// The details of a [`ConnectionError`]: why a handshake failed, which end closed, the
/// transport error code, key file errors.
pub use tern_proto::{
    crypto::KeyError, error::HandshakeError, wire::error_code::TransportErrorCode, Side,
};
pub use tern_proto::{
    ConnectionConfig, ConnectionError, ConnectionStats, DatagramError, Dir, EcnCodepoint, EcnState,
    EndpointConfig, EndpointStats, Event, FlowConfig, FlowId, Message, MessageId, MessageOptions,
    PathState, PathStats, PublicKey, RateSource, RetryPolicy, SchedulerKind, SendMessageError,
    StaticKeypair, TargetRate, Violation, MESSAGE_CREDIT_OVERHEAD,
};
pub use workers::Workers;

/// Which AES-GCM implementation protects this process's packets (`"ring"` or `"aws-lc-rs"`),
/// picked from the CPU's features; the wire is the same with either.
pub use tern_proto::crypto::packet_cipher;
