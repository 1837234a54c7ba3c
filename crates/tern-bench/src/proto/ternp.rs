//! tern through its public API (`tern::Endpoint`). The server prints its public key in its
//! ready line; clients connect with Noise IK. Two ways to carry a request ([`TernMode`]):
//! - `flows`: one two-way flow per request (request bytes + FIN, then the reply + FIN), the
//!   same exchange quinn makes with a stream;
//! - `messages[:MS][:redundant]`: one unordered message per request and one reply message
//!   matched to it (`Connection::request` / `reply`, F5), optionally with a deadline of MS
//!   milliseconds after which both ends give the exchange up (the server answers with the time
//!   its request has left, so a reply never travels after the requester stopped waiting), and
//!   optionally redundant (every fragment of request and reply sent twice when there is room).
//!
//! The server serves both on every connection; the client picks.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use tern::MessageOptions;

use super::mux::{serve_stream, ChunkWrite, Mux};
use super::video::RateHint;
use crate::spec::payload;

/// The rate an encoder on this connection should produce, bytes per second (`None`: no
/// estimate yet): [`tern_video_hint`] without its source, for the `mar` adaptive mode.
pub fn tern_rate_hint(conn: &tern::Connection) -> Option<u64> {
    tern_video_hint(conn).map(|h| h.bytes_per_second)
}

/// tern's F13 target rate, `Connection::target_rate()`: the routers' rate where they stamp
/// one (explicit controller), else the controller's estimate, scaled by min RTT / RTT and
/// less packet overheads. Marked as given by the network when routers set it on every path
/// (`RateSource::Router`), so that the `fairness` video encoder does not probe above it. The
/// one place tern-bench asks tern for a rate (`fairness` video, and `mar` adaptive through
/// [`tern_rate_hint`]).
pub fn tern_video_hint(conn: &tern::Connection) -> Option<RateHint> {
    conn.target_rate().map(|t| RateHint {
        bytes_per_second: t.bytes_per_second,
        given: t.source == tern::RateSource::Router,
    })
}

/// How the client carries requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TernMode {
    /// One two-way flow per request.
    Flows,
    /// One message per request, one reply message.
    Messages {
        /// Per-request deadline, after which both ends give the exchange up (`None`: fully
        /// reliable).
        deadline: Option<Duration>,
        /// Requests and replies are sent redundantly (`MessageOptions::redundant`).
        redundant: bool,
    },
    /// The client is an encoder following tern's target rate (`mar`): one connection, one
    /// request message per 30 Hz frame with this deadline, its size the largest MAR size
    /// the target rate allows per frame, less a pushback while earlier frames are late
    /// ([`crate::scenario::MarEncoder`]).
    Adaptive {
        /// Per-frame deadline, as `Messages`' (required: a late frame is useless).
        deadline: Duration,
    },
}

/// The settings a tern mode may end with, each `:KEY=VALUE` (how `--tern-cc` and the
/// `initwin` and `mss` scenarios reach the agents: `flows:cc=bbr`, `flows:iw=32`,
/// `flows:mss=9000`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModeSettings {
    /// `cc=NAME`: the congestion controller (tern's default without it).
    pub controller: Option<tern::cc::Algorithm>,
    /// `iw=N`: the controller's initial window, in datagrams.
    pub initial_window: Option<u32>,
    /// `mss=N`: the packet size, IP and UDP headers included (as UDT counts its MSS): tern's
    /// datagrams carry N − 28 bytes (IPv4).
    pub mss: Option<u16>,
    /// `sndbuf=N`: the per-flow send buffer, bytes unacknowledged (the `fairness` video
    /// sender's bound, `proto::video::SEND_BUFFER`). Not in the row's label: the workload
    /// sets it for every row alike.
    pub send_buffer: Option<u32>,
    /// `tolerance=off`: CUBIC or NewReno without the random-loss tolerance (RFC 9002's
    /// response to every loss; `coexist` compares the two beside kernel TCP).
    pub loss_tolerance: Option<bool>,
    /// `htrain=on`: a probe train with the handshake at both ends
    /// (`ConnectionConfig::handshake_train`: the client pads its first flight, the server
    /// sends its first train right behind its response).
    pub handshake_train: bool,
}

/// IPv4 + UDP headers, what an MSS counts beyond the UDP payload.
const IP_UDP_HEADERS: u16 = 28;

impl ModeSettings {
    /// The UDP payload size an `mss` asks for.
    pub fn datagram_size(&self) -> Option<u16> {
        self.mss.map(|m| m.saturating_sub(IP_UDP_HEADERS))
    }

    /// The label suffix: `-bbr`, `-iw32`, `-mss9000`, in that order.
    fn label(&self) -> String {
        let mut l = String::new();
        if let Some(cc) = self.controller {
            l += &format!("-{cc}");
        }
        if let Some(iw) = self.initial_window {
            l += &format!("-iw{iw}");
        }
        if let Some(mss) = self.mss {
            l += &format!("-mss{mss}");
        }
        if self.loss_tolerance == Some(false) {
            l += "-strict";
        }
        if self.handshake_train {
            l += "-htrain";
        }
        l
    }
}

/// Splits a tern mode into the way requests are carried (with `:multipath`) and its
/// trailing `:KEY=VALUE` settings.
pub fn split_settings(mode: &str) -> Result<(&str, ModeSettings), String> {
    let mut rest = mode;
    let mut settings = ModeSettings::default();
    while let Some((head, tail)) = rest.rsplit_once(':') {
        let Some((key, value)) = tail.split_once('=') else {
            break;
        };
        let bad = |what: &str| format!("bad {what} {value:?} in tern mode {mode:?}");
        match key {
            "cc" => {
                settings.controller = Some(
                    value
                        .parse()
                        .map_err(|e: tern::cc::UnknownAlgorithm| e.to_string())?,
                )
            }
            "iw" => {
                settings.initial_window = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|n| (2..=10_000).contains(n))
                        .ok_or_else(|| bad("initial window"))?,
                )
            }
            "mss" => {
                // tern's datagrams are never below 1200 bytes (the handshake's padding and
                // the amplification limit rest on it), so an MSS below 1228 is refused.
                settings.mss = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|n| (1200 + IP_UDP_HEADERS..=65_000).contains(n))
                        .ok_or_else(|| {
                            bad("mss (1228 to 65000: tern's datagrams are at least 1200 bytes)")
                        })?,
                )
            }
            "sndbuf" => {
                settings.send_buffer = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|n| *n >= 4_096)
                        .ok_or_else(|| bad("send buffer (at least 4096 bytes)"))?,
                )
            }
            "tolerance" => {
                settings.loss_tolerance = Some(match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad("random-loss tolerance (on, off)")),
                })
            }
            "htrain" => {
                settings.handshake_train = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad("handshake train (on, off)")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown setting {key:?} in tern mode {mode:?} (cc, iw, mss, sndbuf, tolerance, htrain)"
                ))
            }
        }
        rest = head;
    }
    Ok((rest, settings))
}

/// The congestion controller a tern mode names (`…:cc=NAME`); `None`: tern's default.
pub fn controller_of(mode: &str) -> Result<Option<tern::cc::Algorithm>, String> {
    Ok(split_settings(mode)?.1.controller)
}

/// Whether a `--tern-mode` asks for every path (`…:multipath`).
pub fn is_multipath(mode: &str) -> bool {
    split_settings(mode).is_ok_and(|(m, _)| m.ends_with(":multipath"))
}

/// The results row name of a `--tern-mode`: [`TernMode::label`], plus `-mp` for
/// `…:multipath` (tern on every path: `tern-mp`), plus the settings' suffix
/// (`tern-bbr`, `tern-mp-copa`, `tern-iw32`, `tern-mss9000`).
pub fn label_for(mode: &str) -> Result<String, String> {
    let mut label = TernMode::parse(mode)?.label();
    if is_multipath(mode) {
        label += "-mp";
    }
    Ok(label + &split_settings(mode)?.1.label())
}

impl TernMode {
    /// Parses `flows`, `messages[:MS][:redundant]` or `adaptive:MS`, each optionally
    /// followed by `:multipath` (which [`is_multipath`] reads; the way requests are carried
    /// is the same) and by `:cc=NAME` (a built-in congestion controller, which
    /// [`controller_of`] reads).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown --tern-mode {s:?} (flows, messages[:MS][:redundant] or adaptive:MS, then optionally :multipath)"
            )
        };
        let s = split_settings(s)?.0;
        let s = s.strip_suffix(":multipath").unwrap_or(s);
        let mut parts = s.split(':');
        match parts.next() {
            Some("flows") if parts.next().is_none() => return Ok(Self::Flows),
            Some("messages") => {}
            Some("adaptive") => {
                return match (parts.next().map(str::parse::<u64>), parts.next()) {
                    (Some(Ok(ms)), None) if ms > 0 => Ok(Self::Adaptive {
                        deadline: Duration::from_millis(ms),
                    }),
                    _ => Err(bad()),
                }
            }
            _ => return Err(bad()),
        }
        let (mut deadline, mut redundant) = (None, false);
        for p in parts {
            match p {
                "redundant" if !redundant => redundant = true,
                ms if deadline.is_none() && !redundant => match ms.parse::<u64>() {
                    Ok(ms) if ms > 0 => deadline = Some(Duration::from_millis(ms)),
                    _ => return Err(bad()),
                },
                _ => return Err(bad()),
            }
        }
        Ok(Self::Messages {
            deadline,
            redundant,
        })
    }

    /// The name results carry: `tern` (flows), `tern-msg`, `tern-msg-150ms`,
    /// `tern-msg-150ms-red`, `tern-adaptive-150ms`.
    pub fn label(self) -> String {
        match self {
            Self::Flows => "tern".into(),
            Self::Adaptive { deadline } => format!("{ADAPTIVE_LABEL}-{}ms", deadline.as_millis()),
            Self::Messages {
                deadline,
                redundant,
            } => {
                let mut l = String::from("tern-msg");
                if let Some(d) = deadline {
                    l += &format!("-{}ms", d.as_millis());
                }
                if redundant {
                    l += "-red";
                }
                l
            }
        }
    }
}

/// How the labels of adaptive rows begin: `summarize` gives such a row one line over every
/// frame instead of one per size (its sizes are the encoder's choice, not a sweep).
pub const ADAPTIVE_LABEL: &str = "tern-adaptive";

/// Request bytes: `R`, reply size (u32), redundancy flag (u8), payload. The flag tells the
/// server to send the reply redundantly too.
fn reply_request(data: &[u8]) -> Option<(u32, bool)> {
    let (&kind, rest) = data.split_first()?;
    let reply = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
    (kind == b'R').then_some((reply, rest.get(4) == Some(&1)))
}

/// The endpoint configuration of a tern agent in `mode` (which may name its controller).
pub(crate) fn config(server: bool, mode: &str) -> io::Result<tern::EndpointConfig> {
    let mut cfg = tern::EndpointConfig::new(
        tern::StaticKeypair::generate(tern::entropy()),
        tern::entropy(),
    );
    if server {
        cfg = cfg.server();
    }
    // The key was generated just now: no earlier server had it, so first-flight timestamps
    // are trusted from the start (PROTOCOL.md §7.6), as on a long-running server.
    cfg.first_flight.trust_start = true;
    // Every benchmark client comes from one host: the per-source handshake limit would
    // measure itself, not the handshake.
    cfg.handshakes_per_source = (f64::INFINITY, f64::INFINITY);
    // Open-loop request streams can pile up on a saturated link; do not let the flow limit
    // (rather than the link) decide the latency. quinn gets the same treatment.
    cfg.connection.flows.max_concurrent_bidi = 100_000;
    let (_, settings) = split_settings(mode).map_err(io::Error::other)?;
    let cc = settings.controller.unwrap_or_default();
    match settings.initial_window {
        Some(iw) => cfg.connection.congestion = cc.factory_with_initial_window(iw),
        None if settings.controller.is_some() => cfg.connection.congestion = cc.factory(),
        None => {}
    }
    if let Some(tolerance) = settings.loss_tolerance {
        let iw = settings
            .initial_window
            .unwrap_or(tern::cc::DEFAULT_INITIAL_WINDOW_PACKETS);
        cfg.connection.congestion =
            cc.factory_with_loss_tolerance(iw, tolerance)
                .ok_or_else(|| {
                    io::Error::other(format!("tolerance= applies to cubic and newreno, not {cc}"))
                })?;
    }
    if let Some(b) = settings.send_buffer {
        cfg.connection.flows.send_buffer = u64::from(b);
    }
    cfg.connection.handshake_train = settings.handshake_train;
    if let Some(size) = settings.datagram_size() {
        // Both ends: what we send, and what we say we take; a fixed size (no PMTU search).
        cfg.connection.max_datagram_size = size;
        cfg.connection.max_recv_datagram_size = size;
        cfg.connection.max_pmtu = size;
    }
    Ok(cfg)
}

/// Starts a server; returns it and its public key to print. With `advertise` (the
/// server's other addresses) it listens on every address of the port and advertises those
/// (AddAddress), so that a multipath client opens a path to each.
pub fn server(
    addr: SocketAddr,
    advertise: &[IpAddr],
    mode: &str,
) -> io::Result<(tern::Endpoint, String)> {
    let ep = if advertise.is_empty() {
        tern::Endpoint::bind(addr, config(true, mode)?)?
    } else {
        let socket = std::net::UdpSocket::bind(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            addr.port(),
        ))?;
        let port = socket.local_addr()?.port();
        let cfg = config(true, mode)?;
        let keypair = cfg.keypair.clone();
        let advertise: Vec<SocketAddr> = advertise
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        tern::Endpoint::builder(keypair)
            .config(cfg)
            .configure(|c| c.connection.advertise = advertise)
            .socket(socket)
            .build()?
    };
    let key = tern::keys::encode_public(&ep.public_key());
    Ok((ep, key))
}

/// Serves until the process is killed: flows and messages on every connection.
pub async fn serve(ep: tern::Endpoint) {
    while let Some(conn) = ep.accept().await {
        let c = conn.clone();
        tokio::spawn(async move {
            while let Ok((w, r)) = c.accept_bi().await {
                let conn = c.clone();
                let h = c.clone();
                tokio::spawn(async move {
                    let stats = move || {
                        let mut s = stats_json(&conn.stats());
                        s["paths"] = paths_json(&conn.paths());
                        s
                    };
                    let _ = serve_stream(w, r, stats, move || tern_video_hint(&h)).await;
                });
            }
        });
        tokio::spawn(serve_messages(conn.clone()));
        // Into the server's log (results/logs/…): path events as they happen, how each
        // connection ended and its paths then (handover: connections that die before the
        // client can ask).
        tokio::spawn(log_path_events(conn.events_where(is_logged)));
        tokio::spawn(async move {
            let why = conn.closed().await;
            eprintln!(
                "connection {:?} closed: {why}; paths {}; stats {}",
                conn.id(),
                paths_json(&conn.paths()),
                stats_json(&conn.stats())
            );
        });
    }
}

/// The events the agents log: a connection's path events and its end.
fn is_logged(e: &tern::Event) -> bool {
    use tern::Event as E;
    matches!(
        e,
        E::PathOpened { .. }
            | E::PathValidated { .. }
            | E::PathDead { .. }
            | E::PathAlive { .. }
            | E::PathStateChanged { .. }
            | E::PeerAddressChanged { .. }
            | E::Closed(_)
    )
}

/// Writes the events of a subscription made with [`is_logged`] to the agent's log (stderr),
/// with the time since the call. (Subscribing to every event would wake this task for each
/// batch of data received: 35–50 % of bulk goodput with two worker threads per end.)
async fn log_path_events(mut events: tern::EventStream) {
    let t0 = Instant::now();
    while let Some(e) = events.next().await {
        eprintln!("{:9.3} s {e:?}", t0.elapsed().as_secs_f64());
    }
}

impl ChunkWrite for tern::SendFlow {
    async fn write_owned(&mut self, data: Bytes) -> io::Result<()> {
        self.write_chunk(data).await.map_err(io::Error::other)
    }
}

/// Answers each request message (`R`, u32 reply size, payload) with a reply of that size.
async fn serve_messages(conn: tern::Connection) {
    // Replies are slices of one payload, made again only when a larger reply is asked for
    // (making 1 MiB of pattern per reply would cost the server a millisecond each).
    let mut chunk = Bytes::from(payload(64 << 10));
    while let Ok(m) = conn.recv_message().await {
        let Some((reply, redundant)) = reply_request(&m.data) else {
            continue;
        };
        if reply as usize > chunk.len() {
            chunk = Bytes::from(payload(reply as usize));
        }
        let data = chunk.slice(..reply as usize);
        let mut opts = MessageOptions::default().unordered();
        if redundant {
            opts = opts.redundant();
        }
        if let Some(d) = m.deadline {
            // Answer with the time the requester still waits; nothing if it has given up.
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                continue;
            }
            opts = opts.deadline(left);
        }
        if conn.reply(m.id, data, opts).is_err() {
            return;
        }
    }
}

/// The client side.
pub struct TernClient {
    ep: tern::Endpoint,
    addr: SocketAddr,
    key: tern::PublicKey,
    mode: TernMode,
}

/// Which paths a client uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Paths {
    /// One path: `max_paths = 1` (the server's advertised addresses are ignored).
    #[default]
    One,
    /// Every path tern opens: from the bound address and each of these local addresses to
    /// the server's address and each address it advertises (DESIGN.md F15).
    Multi(Vec<IpAddr>),
}

impl TernClient {
    /// A client endpoint that expects the server key `key` (as printed by the server).
    pub fn new(
        addr: SocketAddr,
        bind: Option<IpAddr>,
        key: &str,
        mode: &str,
        paths: Paths,
    ) -> io::Result<Self> {
        let mut cfg = config(false, mode)?;
        let mode = TernMode::parse(mode).map_err(io::Error::other)?;
        let key =
            tern::PublicKey::parse(key.trim()).map_err(|e| io::Error::other(format!("{e:?}")))?;
        let local = SocketAddr::new(bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0);
        match paths {
            Paths::One => cfg.connection.max_paths = 1,
            Paths::Multi(ips) => cfg.connection.local_ips = ips,
        }
        let ep = tern::Endpoint::bind(local, cfg)?;
        Ok(Self {
            ep,
            addr,
            key,
            mode,
        })
    }

    /// The client endpoint's UDP port.
    pub fn local_port(&self) -> Option<u16> {
        self.ep.local_addr().ok().map(|a| a.port())
    }
}

/// A connection and the way it carries requests.
#[derive(Clone)]
pub struct TernConn {
    conn: tern::Connection,
    mode: TernMode,
}

impl Mux for TernClient {
    type Conn = TernConn;
    type W = tern::SendFlow;
    type R = tern::RecvFlow;

    async fn connect(&self) -> io::Result<TernConn> {
        let conn = self
            .ep
            .connect(self.addr, Some(self.key))
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        tokio::spawn(log_path_events(conn.events_where(is_logged)));
        Ok(TernConn {
            conn,
            mode: self.mode,
        })
    }

    async fn open_bi(c: &TernConn) -> io::Result<(Self::W, Self::R)> {
        c.conn
            .open_bi()
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }

    async fn request(c: &TernConn, msg: Arc<[u8]>, reply: u32) -> io::Result<bool> {
        let (deadline, redundant) = match c.mode {
            TernMode::Messages {
                deadline,
                redundant,
            } => (deadline, redundant),
            // An adaptive client's frames are deadline messages like `messages:MS`'.
            TernMode::Adaptive { deadline } => (Some(deadline), false),
            TernMode::Flows => {
                return super::mux::one_request::<Self>(c, &msg, reply)
                    .await
                    .map(|()| true)
            }
        };
        let mut opts = MessageOptions::default().unordered();
        if let Some(d) = deadline {
            opts = opts.deadline(d);
        }
        if redundant {
            opts = opts.redundant();
        }
        // `msg` is `R`, reply size, payload: insert the redundancy flag after the size.
        let mut data = Vec::with_capacity(msg.len() + 1);
        data.extend_from_slice(&msg[..5]);
        data.push(u8::from(redundant));
        data.extend_from_slice(&msg[5..]);
        match c.conn.request(Bytes::from(data), opts).await {
            Ok(m) if m.data.len() == reply as usize => Ok(true),
            Ok(m) => Err(io::Error::other(format!(
                "reply of {} bytes, expected {reply}",
                m.data.len()
            ))),
            Err(tern::RequestError::Expired) => Ok(false),
            Err(e) => Err(io::Error::other(e.to_string())),
        }
    }

    fn close(c: &TernConn) {
        c.conn.close(0, b"done");
    }

    fn stats(c: &TernConn) -> Value {
        let mut s = stats_json(&c.conn.stats());
        s["paths"] = paths_json(&c.conn.paths());
        s
    }

    const HAS_WINDOW: bool = true;

    fn adaptive(&self) -> bool {
        matches!(self.mode, TernMode::Adaptive { .. })
    }

    fn rate_hint(c: &TernConn) -> Option<u64> {
        tern_rate_hint(&c.conn)
    }

    /// The client's addresses changed (`old` → `new` pairs): `Endpoint::local_ip_changed`
    /// moves every path that used `old` (new source, fresh RTT and controller, what was in
    /// flight resent) and announces it from `new` at once with a padded challenge, so that
    /// the server follows even when the client, a receiver, has nothing else to send. (Before
    /// main's `24c4dcd` it sent nothing, and the connection died unless the application sent
    /// something itself: docs/BENCHMARKS.md.)
    fn rebind(&self, changes: &[(IpAddr, IpAddr)]) -> io::Result<bool> {
        let mut moved = 0;
        for &(old, new) in changes {
            moved += self.ep.local_ip_changed(old, new);
        }
        Ok(moved > 0)
    }

    fn close_window(c: &TernConn) {
        c.conn.close_window(1, b"handover");
    }

    fn open_window(c: &TernConn) {
        c.conn.open_window();
    }
}

/// Per-path figures (`Connection::paths()`): addresses, state, RTT, bytes each way.
fn paths_json(paths: &[tern::PathStats]) -> Value {
    Value::Array(
        paths
            .iter()
            .map(|p| {
                json!({
                    "id": p.id,
                    "local": p.local.map(|ip| ip.to_string()),
                    "remote": p.remote.to_string(),
                    "state": format!("{:?}", p.state),
                    "validated": p.validated,
                    "rtt_ms": p.rtt.as_secs_f64() * 1e3,
                    "min_rtt_ms": p.min_rtt.as_secs_f64() * 1e3,
                    "cwnd": p.cwnd,
                    "bytes_sent": p.bytes_sent,
                    "bytes_received": p.bytes_received,
                    "packets_sent": p.packets_sent,
                })
            })
            .collect(),
    )
}

/// A connection's statistics: the loss-recovery figures as numbers (the collector sums or
/// maxes them per case, `scenario::summarize`), the ECN state as its name (`testing`,
/// `capable`, `failed`, `disabled`), and everything as the `Debug` text (`stats`).
fn stats_json(s: &tern::ConnectionStats) -> Value {
    json!({
        "packets_lost": s.packets_lost,
        "spurious_losses": s.spurious_losses,
        "bytes_retransmitted": s.bytes_retransmitted,
        "congestion_events": s.congestion_events,
        "congestion_events_undone": s.congestion_events_undone,
        "persistent_congestion_events": s.persistent_congestion_events,
        "datagrams_sent": s.datagrams_sent,
        "datagrams_received": s.datagrams_received,
        "datagrams_dropped": s.datagrams_dropped,
        "nacks_received": s.nacks_received,
        "nacks_sent": s.nacks_sent,
        "ptos": s.ptos,
        "tail_probes": s.tail_probes,
        "non_congestive_losses": s.non_congestive_losses,
        "reorder_threshold": s.reorder_threshold,
        "reorder_window_ms": s.reorder_window.as_secs_f64() * 1e3,
        "ecn": s.ecn.to_string(),
        "ecn_ce_reported": s.ecn_ce_reported,
        "rtt_ms": s.rtt.as_secs_f64() * 1e3,
        "min_rtt_ms": s.min_rtt.as_secs_f64() * 1e3,
        "max_datagram_size": s.max_datagram_size,
        "stats": format!("{s:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_label() {
        assert_eq!(TernMode::parse("flows"), Ok(TernMode::Flows));
        assert_eq!(TernMode::parse("messages").unwrap().label(), "tern-msg");
        assert_eq!(
            TernMode::parse("messages:150").unwrap().label(),
            "tern-msg-150ms"
        );
        assert_eq!(
            TernMode::parse("messages:150:redundant").unwrap().label(),
            "tern-msg-150ms-red"
        );
        assert_eq!(
            TernMode::parse("messages:redundant").unwrap().label(),
            "tern-msg-red"
        );
        assert!(TernMode::parse("messages:redundant:150").is_err());
        assert!(TernMode::parse("messages:1:2").is_err());
        assert!(TernMode::parse("flows:1").is_err());
        assert!(TernMode::parse("messages:0").is_err());
        assert!(TernMode::parse("messages:x").is_err());
        assert!(TernMode::parse("datagrams").is_err());
        assert_eq!(
            TernMode::parse("adaptive:150"),
            Ok(TernMode::Adaptive {
                deadline: Duration::from_millis(150)
            })
        );
        assert_eq!(
            label_for("adaptive:150:cc=explicit").unwrap(),
            "tern-adaptive-150ms-explicit"
        );
        // The deadline is required: a frame without one is never late.
        assert!(TernMode::parse("adaptive").is_err());
        assert!(TernMode::parse("adaptive:0").is_err());
        assert!(TernMode::parse("adaptive:150:redundant").is_err());
        assert_eq!(label_for("flows:multipath").unwrap(), "tern-mp");
        assert_eq!(label_for("flows").unwrap(), "tern");
        assert_eq!(
            label_for("messages:150:redundant:multipath").unwrap(),
            "tern-msg-150ms-red-mp"
        );
        assert!(is_multipath("flows:multipath"));
        assert!(!is_multipath("flows"));
        assert!(label_for("multipath").is_err());
        assert!(label_for("flows:multipath:multipath").is_err());
    }

    #[test]
    fn a_mode_names_its_controller_last() {
        assert_eq!(label_for("flows:cc=newreno").unwrap(), "tern-newreno");
        assert_eq!(
            label_for("messages:150:multipath:cc=cubic").unwrap(),
            "tern-msg-150ms-mp-cubic"
        );
        assert!(is_multipath("flows:multipath:cc=cubic"));
        assert_eq!(
            controller_of("flows:cc=reno").unwrap(),
            Some(tern::cc::Algorithm::NewReno)
        );
        assert_eq!(controller_of("flows").unwrap(), None);
        let err = label_for("flows:cc=nonesuch").unwrap_err();
        assert!(err.contains("nonesuch"), "{err}");
        assert!(TernMode::parse("flows:cc=nonesuch").is_err());
        // The controller is stripped before the mode is read.
        assert_eq!(TernMode::parse("flows:cc=cubic").unwrap(), TernMode::Flows);
    }

    #[test]
    fn modes_carry_initial_window_and_mss() {
        assert_eq!(label_for("flows:iw=32").unwrap(), "tern-iw32");
        assert_eq!(label_for("flows:mss=9000").unwrap(), "tern-mss9000");
        assert_eq!(
            label_for("messages:multipath:cc=bbr:iw=16").unwrap(),
            "tern-msg-mp-bbr-iw16"
        );
        let (base, s) = split_settings("flows:mss=1500:cc=copa").unwrap();
        assert_eq!(base, "flows");
        assert_eq!(s.datagram_size(), Some(1472));
        assert_eq!(s.controller, Some(tern::cc::Algorithm::Copa));
        // tern's datagrams are at least 1200 bytes: an MSS of 512 is refused, clearly.
        let err = split_settings("flows:mss=512").unwrap_err();
        assert!(err.contains("1200"), "{err}");
        assert!(split_settings("flows:iw=0").is_err());
        assert!(split_settings("flows:colour=red").is_err());
        let (_, s) = split_settings("flows:cc=cubic:sndbuf=32768").unwrap();
        assert_eq!(s.send_buffer, Some(32_768));
        assert_eq!(
            label_for("flows:cc=cubic:sndbuf=32768").unwrap(),
            "tern-cubic"
        );
        assert!(split_settings("flows:sndbuf=10").is_err());
        assert_eq!(label_for("flows:htrain=on").unwrap(), "tern-htrain");
        assert!(
            config(false, "flows:htrain=on")
                .unwrap()
                .connection
                .handshake_train
        );
        assert!(split_settings("flows:htrain=yes").is_err());
        let cfg = config(true, "flows:sndbuf=32768").unwrap();
        assert_eq!(cfg.connection.flows.send_buffer, 32_768);
        let cfg = config(false, "flows:mss=9000:iw=64").unwrap();
        assert_eq!(cfg.connection.max_datagram_size, 8972);
        assert_eq!(cfg.connection.max_recv_datagram_size, 8972);
    }

    #[test]
    fn a_mode_can_switch_the_random_loss_tolerance_off() {
        assert_eq!(
            label_for("flows:cc=cubic:tolerance=off").unwrap(),
            "tern-cubic-strict"
        );
        assert_eq!(
            label_for("flows:cc=cubic:tolerance=on").unwrap(),
            "tern-cubic"
        );
        let (_, s) = split_settings("flows:tolerance=off").unwrap();
        assert_eq!(s.loss_tolerance, Some(false));
        assert!(split_settings("flows:tolerance=maybe").is_err());
        let strict = format!(
            "{:?}",
            config(false, "flows:cc=cubic:tolerance=off:iw=16")
                .unwrap()
                .connection
                .congestion
        );
        assert!(strict.contains("random_loss_tolerance: false"), "{strict}");
        assert!(strict.contains("initial_window_packets: 16"), "{strict}");
        let default = format!(
            "{:?}",
            config(false, "flows:tolerance=on")
                .unwrap()
                .connection
                .congestion
        );
        assert!(default.contains("random_loss_tolerance: true"), "{default}");
        // BBR and Copa have no such rule to switch.
        let err = config(false, "flows:cc=bbr:tolerance=off").unwrap_err();
        assert!(err.to_string().contains("cubic and newreno"), "{err}");
    }
}
