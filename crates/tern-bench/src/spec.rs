//! What the collector tells an agent to do (passed as one JSON argument), what an agent
//! reports back (one JSON line on stdout), and the framing every driver speaks on the wire.
//!
//! Wire framing, the same for every reliable protocol (kernel TCP/MPTCP, TCP + TLS (inside
//! the TLS stream), UDT, SRT on one connection; quinn and tern on one bidirectional stream/flow):
//! - `b'R'`, then requests `[u32 payload_len][u32 reply_len][payload]`; the server answers
//!   each with `reply_len` bytes. quinn and tern send one request per stream/flow and end it
//!   with FIN; the connection-based transports keep a connection per request-size phase.
//! - `b'F'`, then `[u64 size]`; the server sends `size` bytes (`u64::MAX`: until the peer
//!   goes away) and closes. Flow completion time is measured at the client from the start
//!   of the connection set-up to the last byte.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::results::{FlowSample, RpcSample, TransferSample};

/// A protocol under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proto {
    /// tern over UDP.
    Tern,
    /// Kernel TCP with CUBIC named per socket (TCP_CONGESTION), IW10 (the kernel default).
    Tcp,
    /// Kernel TCP with BBR.
    TcpBbr,
    /// Kernel TCP (CUBIC) with TLS 1.3 from rustls (ring): the deployed reference.
    TcpTls,
    /// Kernel MPTCP (IPPROTO_MPTCP sockets; a second subflow on two-path topologies).
    Mptcp,
    /// QUIC with quinn (rustls, ring).
    Quic,
    /// Raw UDP, no reliability (a request is lost if any of its datagrams is).
    Udp,
    /// RTP over UDP, packetised with the `rtp` crate, no reliability.
    Rtp,
    /// UDT4 (Debian libudt) through a C++ shim.
    Udt,
    /// SRT (Debian libsrt) in file/stream mode through a C shim.
    Srt,
}

impl Proto {
    /// Every protocol, in report order.
    pub const ALL: [Proto; 10] = [
        Proto::Tern,
        Proto::Tcp,
        Proto::TcpBbr,
        Proto::TcpTls,
        Proto::Mptcp,
        Proto::Quic,
        Proto::Udp,
        Proto::Rtp,
        Proto::Udt,
        Proto::Srt,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tern => "tern",
            Proto::Tcp => "tcp",
            Proto::TcpBbr => "tcp-bbr",
            Proto::TcpTls => "tcp-tls",
            Proto::Mptcp => "mptcp",
            Proto::Quic => "quic",
            Proto::Udp => "udp",
            Proto::Rtp => "rtp",
            Proto::Udt => "udt",
            Proto::Srt => "srt",
        }
    }

    /// Whether it retransmits (flows need it).
    pub fn reliable(self) -> bool {
        !matches!(self, Proto::Udp | Proto::Rtp)
    }

    /// Why it cannot run in this build/machine, if it cannot.
    pub fn unavailable(self) -> Option<String> {
        match self {
            Proto::Udt if !cfg!(tern_bench_udt) => {
                Some("built without UDT (install libudt-dev and rebuild)".into())
            }
            Proto::Srt if !cfg!(tern_bench_srt) => {
                Some("built without SRT (install libsrt-openssl-dev and rebuild)".into())
            }
            _ => None,
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Proto {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Proto::ALL
            .into_iter()
            .find(|p| p.name() == s || (s == "quinn" && *p == Proto::Quic))
            .ok_or_else(|| {
                let names: Vec<&str> = Proto::ALL.iter().map(|p| p.name()).collect();
                format!("unknown protocol {s:?}; known: {}", names.join(", "))
            })
    }
}

/// Server or client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Answers requests and flows until killed.
    Server,
    /// Runs the workload and prints a [`ClientReport`].
    Client,
}

/// Request/response workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcPlan {
    /// Request sizes, one phase each, in this order.
    pub sizes: Vec<u32>,
    /// Requests per size.
    pub per_size: u32,
    /// Open loop: one request every this many ms, whatever the replies do. `None`: closed
    /// loop (the next request goes when the reply is in).
    pub interval_ms: Option<f64>,
    /// Reply size; `None`: echo (reply = request size).
    pub reply: Option<u32>,
    /// After the last request of a phase, wait this long for replies still missing.
    pub drain_ms: u64,
}

/// Flow workload: per client thread, the sizes of its back-to-back flows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowPlan {
    /// `sizes[t]` are thread t's flows, in order.
    pub sizes: Vec<Vec<u64>>,
    /// Give a flow up after this long.
    pub flow_timeout_ms: u64,
}

/// One long transfer from the server to the client on one connection, metered at the
/// receiver (`multipath`, `handover`): what arrived when, and the longest gap in delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferPlan {
    /// Bytes asked for; `u64::MAX` with `duration_ms`: whatever arrives in that time.
    pub size: u64,
    /// Stop reading after this long (time-bounded bulk); `None`: until `size` arrived.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// Give the transfer up after this long (from the connection's start).
    pub timeout_ms: u64,
    /// tern: use every path (local_ips and the server's advertised addresses); otherwise
    /// one path (`max_paths = 1`).
    #[serde(default)]
    pub multipath: bool,
    /// tern: close the receive window at `.0` ms after the client started and open it
    /// again at `.1` (the SLTP handover, F7).
    #[serde(default)]
    pub window_ms: Option<(u64, u64)>,
    /// Watch the client's local addresses and tell the transport when they change, if it
    /// has a way to be told (quinn: `Endpoint::rebind` on a new socket).
    #[serde(default)]
    pub follow_address: bool,
    /// Stream protocols: a connection that delivers nothing for this long (after its first
    /// byte) is given up and the rest fetched on a new one (the application reconnects).
    #[serde(default)]
    pub resume_after_ms: Option<u64>,
    /// Width of the delivery timeline's bins.
    pub bin_ms: u64,
    /// When the case's network event happens (ms after the client starts): the meter then
    /// also keeps the longest gap that ends after it (`event_gap_ms`), so that a gap at the
    /// start is not taken for the event's stall.
    #[serde(default)]
    pub event_at_ms: Option<u64>,
    /// A video source on the sender instead of backlogged data (`fairness`, `load=video`):
    /// `duration_ms` of frames, each sized from the sender's rate hint (`proto::video`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoPlan>,
}

/// The video workload of a transfer (`proto::video`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct VideoPlan {
    /// Frames per second.
    pub fps: u32,
    /// A frame completing more than this after its production misses its playout.
    pub playout_ms: f64,
}

impl VideoPlan {
    /// The frames a flow of `duration_ms` produces.
    pub fn frames(&self, duration_ms: u64) -> u32 {
        (duration_ms * u64::from(self.fps) / 1000) as u32
    }
}

/// What a client does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Work {
    /// Requests and replies.
    Rpc(RpcPlan),
    /// Flows.
    Flows(FlowPlan),
    /// One metered transfer.
    Transfer(TransferPlan),
}

/// Everything an agent needs (the collector passes it as JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// Protocol.
    pub proto: Proto,
    /// Server or client.
    pub role: Role,
    /// Server: address to listen on. Client: server address.
    pub addr: SocketAddr,
    /// Client: local address to bind (selects the path on multihomed hosts).
    #[serde(default)]
    pub bind: Option<IpAddr>,
    /// Client: the server's credential from its ready line (tern public key, quinn
    /// certificate).
    #[serde(default)]
    pub credential: Option<String>,
    /// Client: the workload.
    #[serde(default)]
    pub work: Option<Work>,
    /// The agent exits by itself after this many seconds.
    pub deadline_s: f64,
    /// tern only: `flows` (one two-way flow per request); `messages` is reserved.
    #[serde(default = "default_tern_mode")]
    pub tern_mode: String,
    /// Client (tern, multipath): the client's other local addresses to open paths from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_ips: Vec<IpAddr>,
    /// Server (tern): other addresses of the server to advertise (same port); the server
    /// then listens on every address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advertise: Vec<IpAddr>,
    /// Async agents (tern, quinn): the tokio runtime's worker threads (`bulk --threads`);
    /// `None`: two. Stream transports use a thread per connection whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
}

fn default_tern_mode() -> String {
    "flows".into()
}

/// A server's first stdout line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    /// Always true.
    pub ready: bool,
    /// Where it listens.
    pub addr: SocketAddr,
    /// What the client needs to authenticate it, if anything.
    #[serde(default)]
    pub credential: Option<String>,
}

/// A client's last stdout line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientReport {
    /// Request samples.
    #[serde(default)]
    pub rpc: Vec<RpcSample>,
    /// Flow samples.
    #[serde(default)]
    pub flows: Vec<FlowSample>,
    /// The metered transfer ([`Work::Transfer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferSample>,
    /// CPU seconds of the client process.
    pub cpu_s: f64,
    /// Protocol-specific details.
    #[serde(default)]
    pub extra: Value,
    /// Datagrams the kernel dropped at the client's UDP socket (`/proc/net/udp` `drops`),
    /// for protocols whose client has one socket (tern, quinn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_socket_drops: Option<u64>,
    /// Set if the workload failed part-way.
    #[serde(default)]
    pub error: Option<String>,
}

/// The request header: payload length and reply length.
pub fn rpc_header(payload: u32, reply: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&payload.to_be_bytes());
    h[4..].copy_from_slice(&reply.to_be_bytes());
    h
}

/// Parses [`rpc_header`].
pub fn parse_rpc_header(h: &[u8; 8]) -> (u32, u32) {
    (
        u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
    )
}

/// A reusable buffer of `len` pattern bytes (payloads are not checked; all protocols under
/// test authenticate or checksum their packets).
pub fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}
