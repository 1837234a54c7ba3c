//! `robustness` (issue 13, "Floods and bounds"): one paced bulk transfer into a real tern
//! server per attack, while an attacker sends junk at a fixed rate: nothing (`baseline`),
//! random datagrams (`garbage`), copies of the connection's recorded packets (`replay`),
//! recorded packets with bits flipped or cut short (`mutation`), real IK first flights from
//! 253 loopback addresses (`initial-flood`) and stateless-reset look-alikes at the client
//! (`reset-injection`). Reported per attack: goodput and its ratio to the baseline ("goodput
//! kept"), whether every byte arrived intact, the server's endpoint and connection counters,
//! and the server's CPU per junk datagram.
//!
//! Topology, all on loopback, no emulator:
//!
//! ```text
//!   client (this process) ──▶ relay front │ relay back ──▶ server (own process)
//!                                          ▲                  ▲
//!   attacker (this process, 506 sockets on 127.0.0.2–254) ────┘ (and through the relay's
//!                                                               sockets: spoofed sources)
//! ```
//!
//! The relay (two UDP sockets and two threads) forwards every datagram and records copies of
//! both directions; it is in every case, the baseline included, so each case pays for it
//! alike. Its back socket is the client's address as the server sees it, so the attacker
//! sends half its replays, mutations and garbage from there ("from the client's address");
//! its front socket is the server's address as the client sees it, which is where the forged
//! resets come from. The server runs as a separate process (`tern-bench agent-robust`) so that
//! its CPU time can be read from `/proc/<pid>/stat` alone.
//!
//! The sender is paced by the application at a fixed rate (100 Mbit/s): on a 2-core box an
//! unpaced transfer would make the CPU, shared with the attacker and the relay, decide the
//! goodput, and a paced one measures what the issue asks, whether the attack takes goodput
//! away from a connection that needs a given rate.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::results::{Case, Row, RunFile};
use crate::scenario::RunOpts;
use crate::sysinfo;

/// The attacks, in the order they run (`baseline` first: the others are compared to it).
pub const ATTACKS: [&str; 6] = [
    "baseline",
    "garbage",
    "replay",
    "mutation",
    "initial-flood",
    "reset-injection",
];

/// The transfer's pace, bits per second.
pub const RATE_BPS: f64 = 100e6;

/// Junk datagrams per second, every attack.
pub const ATTACK_PPS: u32 = 20_000;

/// Transfer sizes: full and `--quick`.
pub const SIZE_FULL: u64 = 256 << 20;
/// See [`SIZE_FULL`].
pub const SIZE_QUICK: u64 = 32 << 20;

/// Attacker source addresses: 127.0.0.2 ..= 127.0.0.254, this many sockets each.
const SOCKETS_PER_IP: usize = 2;

/// Distinct IK first flights made for `initial-flood` (then sent again in turn).
const MAX_INITIALS: usize = 6_000;

/// The server's timeline of bytes read: one bin per this many ms from the first byte.
const BIN_MS: u64 = 100;

/// Bins (whole ones: the last is left out) in which the server read less than this share of
/// the paced rate.
const SLOW_SHARE: f64 = 0.9;

/// Seconds of `bins` (bytes per `bin_ms`, the last bin partial and not counted) below
/// [`SLOW_SHARE`] of `rate_bps`.
pub fn slow_seconds(bins: &[u64], bin_ms: u64, rate_bps: f64) -> f64 {
    let full = rate_bps / 8.0 * bin_ms as f64 / 1e3;
    let whole = &bins[..bins.len().saturating_sub(1)];
    whole
        .iter()
        .filter(|&&b| (b as f64) < SLOW_SHARE * full)
        .count() as f64
        * bin_ms as f64
        / 1e3
}

/// Recorded datagrams kept per direction (the latest ones, plus the first 16: the
/// handshake).
const RECORD_CAP: usize = 4_096;

// ---------------------------------------------------------------------------------------
// Pure helpers: the stream, its hash, the junk generators.

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The transferred stream: byte `o` is byte `o % 8` of `splitmix64(seed + o / 8)`; both
/// ends make it, so the receiver checks every byte without the sender's help.
pub fn pattern_fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let o = offset + i as u64;
        *b = splitmix64(seed.wrapping_add(o / 8)).to_le_bytes()[(o % 8) as usize];
    }
}

/// FNV-1a, 64 bits: the hash both ends report of the bytes sent and received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A random datagram (`garbage`): three in four random bytes of a random length 1–1500; one
/// in four shaped like a short-header packet (first byte `01xxxxxx`, a random 8-byte
/// connection ID, random rest, 21–1500 bytes).
pub fn garbage(rng: &mut impl Rng) -> Vec<u8> {
    if rng.random_range(0..4) == 0 {
        let mut d = vec![0u8; rng.random_range(21..=1500)];
        rng.fill(&mut d[..]);
        d[0] = 0x40 | (d[0] & 0x3f);
        d
    } else {
        let mut d = vec![0u8; rng.random_range(1..=1500)];
        rng.fill(&mut d[..]);
        d
    }
}

/// A recorded datagram changed (`mutation`): 1–8 random bit flips (half the time), cut
/// short to a random length (a quarter), or both (a quarter). Never empty, never equal to
/// `pkt` unless `pkt` is one byte long and is only cut.
pub fn mutate(rng: &mut impl Rng, pkt: &[u8]) -> Vec<u8> {
    let mut d = pkt.to_vec();
    if d.is_empty() {
        return vec![rng.random()];
    }
    let how = rng.random_range(0..4);
    if how >= 2 && d.len() > 1 {
        d.truncate(rng.random_range(1..d.len()));
    }
    if how != 2 {
        for _ in 0..rng.random_range(1..=8) {
            let bit = rng.random_range(0..d.len() * 8);
            d[bit / 8] ^= 1 << (bit % 8);
        }
    }
    d
}

/// A forged stateless reset (`reset-injection`): 21–64 bytes, first byte `01xxxxxx`, random
/// bytes, a random 16-byte token at the end. With `template` (a recorded server→client
/// short-header datagram) its first byte and the 8-byte connection ID are copied, so the
/// forgery names the client's real connection (the token is a guess).
pub fn forged_reset(rng: &mut impl Rng, template: Option<&[u8]>) -> Vec<u8> {
    let mut d = vec![0u8; rng.random_range(21..=64)];
    rng.fill(&mut d[..]);
    d[0] = 0x40 | (d[0] & 0x3f);
    if let Some(t) = template.filter(|t| t.len() >= 9 && t[0] & 0xc0 == 0x40) {
        d[..9].copy_from_slice(&t[..9]);
    }
    d
}

// ---------------------------------------------------------------------------------------
// The server agent (its own process).

fn print_line(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn endpoint_stats_json(s: &tern::EndpointStats) -> Value {
    json!({
        "malformed": s.malformed,
        "unroutable": s.unroutable,
        "retries_sent": s.retries_sent,
        "invalid_tokens": s.invalid_tokens,
        "refused": s.refused,
        "resets_sent": s.resets_sent,
        "version_negotiations": s.version_negotiations,
        "short_initials": s.short_initials,
        "replayed_first_flights": s.replayed_first_flights,
        "unproven_first_flights": s.unproven_first_flights,
        "half_open_refused": s.half_open_refused,
        "rate_limited": s.rate_limited,
        "half_open_expired": s.half_open_expired,
    })
}

fn conn_stats_json(s: &tern::ConnectionStats) -> Value {
    json!({
        "auth_failures": s.auth_failures,
        "replays": s.replays,
        "datagrams_received": s.datagrams_received,
        "datagrams_dropped": s.datagrams_dropped,
        "packets_lost": s.packets_lost,
        "bytes_retransmitted": s.bytes_retransmitted,
    })
}

#[derive(Default)]
struct Progress {
    received: AtomicU64,
    corrupt: AtomicBool,
}

/// `tern-bench agent-robust`: a tern server on 127.0.0.1 with default settings (but first
/// flights trusted from the start: its key is new). Prints `{"ready", "addr", "key"}`; one
/// `{"done": …}` line per flow it read to its end (bytes, whether every byte matched
/// [`pattern_fill`], the hash, first byte to last byte, the longest gap); and one
/// `{"stats": …}` line (endpoint counters, the transfer connection's counters, connections
/// accepted, the socket's kernel drops, bytes so far)
/// per line read on stdin. Exits when stdin closes.
pub fn server_agent(seed: u64) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut cfg = tern::EndpointConfig::new(
            tern::StaticKeypair::generate(tern::entropy()),
            tern::entropy(),
        )
        .server();
        cfg.first_flight.trust_start = true;
        let ep = tern::Endpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), cfg)?;
        let key = tern::keys::encode_public(&ep.public_key());
        let port = ep.local_addr()?.port();
        print_line(&json!({"ready": true, "addr": ep.local_addr()?, "key": key}));
        let conns: Arc<Mutex<Vec<tern::Connection>>> = Arc::default();
        let progress: Arc<Progress> = Arc::default();
        let accepted = Arc::new(AtomicU64::new(0));
        {
            let (ep, conns, progress, accepted) = (
                ep.clone(),
                conns.clone(),
                progress.clone(),
                accepted.clone(),
            );
            std::thread::spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    if line.is_err() {
                        break;
                    }
                    let mut sum: BTreeMap<String, u64> = BTreeMap::new();
                    for c in conns.lock().expect("conns").iter() {
                        if let Value::Object(m) = conn_stats_json(&c.stats()) {
                            for (k, v) in m {
                                *sum.entry(k).or_default() += v.as_u64().unwrap_or(0);
                            }
                        }
                    }
                    print_line(&json!({"stats": {
                        "endpoint": endpoint_stats_json(&ep.stats()),
                        "connections": sum,
                        "accepted": accepted.load(Ordering::Relaxed),
                        "socket_drops": sysinfo::udp_socket_drops_of("self", port),
                        "received": progress.received.load(Ordering::Relaxed),
                        "intact": !progress.corrupt.load(Ordering::Relaxed),
                    }}));
                }
                std::process::exit(0);
            });
        }
        while let Some(conn) = ep.accept().await {
            // The first connection is the transfer's (the attack starts once it is up); the
            // others are counted, their handles held only while they accept flows, as a
            // server application would.
            let n = accepted.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                conns.lock().expect("conns").push(conn.clone());
            }
            let progress = progress.clone();
            tokio::spawn(async move {
                while let Ok(mut flow) = conn.accept_uni().await {
                    let progress = progress.clone();
                    tokio::spawn(async move {
                        let (mut off, mut hash, mut intact) = (0u64, Fnv::default(), true);
                        let mut expect = Vec::new();
                        let (mut first, mut last) = (None::<Instant>, Instant::now());
                        let mut max_gap = Duration::ZERO;
                        let mut bins: Vec<u64> = Vec::new();
                        let error = loop {
                            match flow.read_chunk(1 << 16).await {
                                Ok(Some(b)) => {
                                    let now = Instant::now();
                                    if first.is_some() {
                                        max_gap = max_gap.max(now - last);
                                    } else {
                                        first = Some(now);
                                    }
                                    last = now;
                                    let bin = first.map_or(0, |f| {
                                        ((now - f).as_millis() / u128::from(BIN_MS)) as usize
                                    });
                                    if bins.len() <= bin {
                                        bins.resize(bin + 1, 0u64);
                                    }
                                    bins[bin] += b.len() as u64;
                                    expect.resize(b.len(), 0);
                                    pattern_fill(seed, off, &mut expect);
                                    if expect[..] != b[..] {
                                        intact = false;
                                        progress.corrupt.store(true, Ordering::Relaxed);
                                    }
                                    hash.update(&b);
                                    off += b.len() as u64;
                                    progress.received.store(off, Ordering::Relaxed);
                                }
                                Ok(None) => break None,
                                Err(e) => break Some(e.to_string()),
                            }
                        };
                        let span = first.map_or(0.0, |f| (last - f).as_secs_f64());
                        print_line(&json!({"done": {
                            "bytes": off, "intact": intact, "hash": format!("{:016x}", hash.0),
                            "span_s": span, "max_gap_ms": max_gap.as_secs_f64() * 1e3,
                            "bin_ms": BIN_MS, "bins": bins,
                            "error": error,
                        }}));
                    });
                }
            });
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// The collector side: server process, relay, attacker, client.

struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    addr: SocketAddr,
    key: String,
}

impl Server {
    fn start(seed: u64, log: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["agent-robust", "--seed", &seed.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("server agent")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let ready = lines
            .recv_timeout(Duration::from_secs(10))
            .context("server agent gave no ready line")?;
        let addr = ready["addr"].as_str().context("addr")?.parse()?;
        let key = ready["key"].as_str().context("key")?.to_string();
        Ok(Self {
            child,
            stdin,
            lines,
            addr,
            key,
        })
    }

    fn cpu(&self) -> f64 {
        crate::runner::proc_cpu_seconds(self.child.id()).unwrap_or(f64::NAN)
    }

    /// Asks for a stats line; `done` lines read meanwhile go to `done`.
    fn stats(&mut self, done: &mut Option<Value>) -> Value {
        if writeln!(self.stdin, "stats").is_err() {
            return Value::Null;
        }
        let end = Instant::now() + Duration::from_secs(5);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) if v.get("stats").is_some() => return v["stats"].clone(),
                Ok(v) if v.get("done").is_some() => *done = Some(v["done"].clone()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        Value::Null
    }

    fn wait_done(&mut self, within: Duration) -> Option<Value> {
        let end = Instant::now() + within;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) if v.get("done").is_some() => return Some(v["done"].clone()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Recorded datagrams of one direction: the first 16, then a ring of the latest.
#[derive(Default)]
struct Record {
    pkts: Mutex<Vec<Vec<u8>>>,
    seen: AtomicU64,
}

impl Record {
    fn push(&self, d: &[u8]) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as usize;
        let mut p = self.pkts.lock().expect("record");
        if p.len() < RECORD_CAP {
            p.push(d.to_vec());
        } else {
            let i = 16 + (n - RECORD_CAP) % (RECORD_CAP - 16);
            p[i] = d.to_vec();
        }
    }

    fn pick(&self, rng: &mut impl Rng) -> Option<Vec<u8>> {
        let p = self.pkts.lock().expect("record");
        (!p.is_empty()).then(|| p[rng.random_range(0..p.len())].clone())
    }

    fn pick_short(&self, rng: &mut impl Rng) -> Option<Vec<u8>> {
        let p = self.pkts.lock().expect("record");
        for _ in 0..8 {
            if p.is_empty() {
                return None;
            }
            let d = &p[rng.random_range(0..p.len())];
            if d.len() >= 9 && d[0] & 0xc0 == 0x40 {
                return Some(d.clone());
            }
        }
        None
    }
}

struct Relay {
    front: UdpSocket,
    back: UdpSocket,
    c2s: Arc<Record>,
    s2c: Arc<Record>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn udp(addr: SocketAddr) -> anyhow::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&addr.into())?;
    Ok(s.into())
}

impl Relay {
    fn start(server: SocketAddr) -> anyhow::Result<Self> {
        let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let (front, back) = (udp(lo)?, udp(lo)?);
        let (c2s, s2c): (Arc<Record>, Arc<Record>) = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let mut threads = Vec::new();
        for dir in 0..2 {
            let (rx, tx) = if dir == 0 {
                (front.try_clone()?, back.try_clone()?)
            } else {
                (back.try_clone()?, front.try_clone()?)
            };
            rx.set_read_timeout(Some(Duration::from_millis(50)))?;
            let (rec, stop, client) = (
                if dir == 0 { c2s.clone() } else { s2c.clone() },
                stop.clone(),
                client.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = rx.recv_from(&mut buf) else {
                        continue;
                    };
                    let to = if dir == 0 {
                        *client.lock().expect("client") = Some(from);
                        Some(server)
                    } else if from == server {
                        *client.lock().expect("client")
                    } else {
                        None
                    };
                    if let Some(to) = to {
                        let _ = tx.send_to(&buf[..n], to);
                        rec.push(&buf[..n]);
                    }
                }
            }));
        }
        Ok(Self {
            front,
            back,
            c2s,
            s2c,
            stop,
            threads,
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Where the attacker sends from and to.
struct Targets {
    server: SocketAddr,
    client: SocketAddr,
    /// The relay's back socket: the client's address as the server sees it.
    as_client: UdpSocket,
    /// The relay's front socket: the server's address as the client sees it.
    as_server: UdpSocket,
    pool: Vec<UdpSocket>,
}

fn attacker_pool() -> anyhow::Result<Vec<UdpSocket>> {
    let mut pool = Vec::new();
    for ip in 2..=254u8 {
        for _ in 0..SOCKETS_PER_IP {
            let s = UdpSocket::bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, ip), 0)))?;
            s.set_nonblocking(true)?;
            pool.push(s);
        }
    }
    Ok(pool)
}

/// Real IK first flights to `server`, each from a new client endpoint with a new static key
/// and the wall clock set (so each carries a fresh timestamp, PROTOCOL.md §7.6).
fn make_initials(n: usize, server: SocketAddr, key: tern::PublicKey) -> Vec<Vec<u8>> {
    let now = Instant::now();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut cfg = tern::EndpointConfig::new(
            tern::StaticKeypair::generate(tern::entropy()),
            tern::entropy(),
        );
        cfg.wall_clock = wall;
        let mut ep = tern_proto::Endpoint::new(cfg, now);
        if ep.connect(now, server, Some(key)).is_err() {
            continue;
        }
        let mut buf = Vec::new();
        if let Some(t) = ep.poll_transmit(now, &mut buf) {
            buf.truncate(t.size);
            out.push(buf);
        }
    }
    out
}

#[derive(Default)]
struct AttackCount {
    sent: u64,
    send_errors: u64,
    from_client_addr: u64,
}

/// Sends `attack`'s junk at `pps` until `stop`.
fn attack(
    kind: &str,
    pps: u32,
    seed: u64,
    t: &Targets,
    relay: (&Record, &Record),
    initials: &[Vec<u8>],
    stop: &AtomicBool,
) -> AttackCount {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut c = AttackCount::default();
    let start = Instant::now();
    let (mut pool_i, mut init_i) = (0usize, 0usize);
    let (c2s, s2c) = relay;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * f64::from(pps)) as u64;
        let mut batch = due.saturating_sub(c.sent).min(2_000);
        while batch > 0 {
            batch -= 1;
            pool_i = (pool_i + 1) % t.pool.len();
            let pooled = &t.pool[pool_i];
            // Half of replays, mutations and garbage from the client's own address.
            let spoof = rng.random_bool(0.5);
            let (sock, dest, data) = match kind {
                "garbage" => (
                    if spoof { &t.as_client } else { pooled },
                    t.server,
                    garbage(&mut rng),
                ),
                "replay" | "mutation" => {
                    let Some(p) = c2s.pick(&mut rng) else {
                        c.sent += 1;
                        continue;
                    };
                    let d = if kind == "mutation" {
                        mutate(&mut rng, &p)
                    } else {
                        p
                    };
                    (if spoof { &t.as_client } else { pooled }, t.server, d)
                }
                "initial-flood" => {
                    init_i = (init_i + 1) % initials.len().max(1);
                    let Some(d) = initials.get(init_i) else {
                        c.sent += 1;
                        continue;
                    };
                    (pooled, t.server, d.clone())
                }
                "reset-injection" => {
                    let tpl = if rng.random_bool(0.5) {
                        s2c.pick_short(&mut rng)
                    } else {
                        None
                    };
                    (
                        if spoof { &t.as_server } else { pooled },
                        t.client,
                        forged_reset(&mut rng, tpl.as_deref()),
                    )
                }
                _ => return c,
            };
            c.sent += 1;
            if std::ptr::eq(sock, &t.as_client) {
                c.from_client_addr += 1;
            }
            if sock.send_to(&data, dest).is_err() {
                c.send_errors += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    c
}

/// What the client saw of its transfer.
#[derive(Default)]
struct ClientOut {
    written: u64,
    hash: Fnv,
    elapsed_s: f64,
    error: Option<String>,
    stats: Value,
    endpoint: Value,
}

async fn client_transfer(
    relay: SocketAddr,
    key: &str,
    size: u64,
    seed: u64,
    timeout: Duration,
    connected: std::sync::mpsc::Sender<SocketAddr>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> ClientOut {
    let mut out = ClientOut::default();
    let r: anyhow::Result<()> = async {
        let key = tern::PublicKey::parse(key.trim()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let ep = tern::Endpoint::builder(tern::StaticKeypair::generate(tern::entropy()))
            .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .build()?;
        let conn = ep.connect(relay, Some(key)).await?;
        let mut flow = conn.open_uni().await?;
        let _ = connected.send(ep.local_addr()?);
        let _ = go.await;
        let rate = RATE_BPS / 8.0;
        let start = Instant::now();
        let mut buf = vec![0u8; 1 << 16];
        let work = async {
            while out.written < size {
                let allowed = start.elapsed().as_secs_f64() * rate;
                let ahead = out.written as f64 - allowed;
                if ahead > 0.0 {
                    tokio::time::sleep(Duration::from_secs_f64(ahead / rate)).await;
                }
                let n = (size - out.written).min(buf.len() as u64) as usize;
                pattern_fill(seed, out.written, &mut buf[..n]);
                out.hash.update(&buf[..n]);
                flow.write_all(&buf[..n]).await?;
                out.written += n as u64;
            }
            flow.finish()?;
            flow.finished().await?;
            Ok::<_, anyhow::Error>(())
        };
        let res = match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(
                "transfer timed out after {timeout:?} ({} bytes written)",
                out.written
            )),
        };
        out.elapsed_s = start.elapsed().as_secs_f64();
        out.stats = conn_stats_json(&conn.stats());
        out.endpoint = endpoint_stats_json(&ep.stats());
        conn.close(0, b"done");
        res
    }
    .await;
    out.error = r.err().map(|e| format!("{e:#}"));
    out
}

fn delta(after: &Value, before: &Value) -> Value {
    match (after, before) {
        (Value::Object(a), Value::Object(b)) => Value::Object(
            a.iter()
                .map(|(k, v)| (k.clone(), delta(v, b.get(k).unwrap_or(&Value::Null))))
                .collect(),
        ),
        (Value::Number(a), Value::Number(b)) => json!(a
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(b.as_u64().unwrap_or(0))),
        (a, _) => a.clone(),
    }
}

/// Junk datagrams per second: [`ATTACK_PPS`] unless `TERN_BENCH_ROBUST_PPS` says otherwise.
fn attack_pps() -> u32 {
    std::env::var("TERN_BENCH_ROBUST_PPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ATTACK_PPS)
}

/// Runs one attack case; its results go in `Case::extra`.
fn run_case(kind: &str, size: u64, seed: u64, logs: &Path) -> anyhow::Result<Value> {
    let pps = attack_pps();
    let mut server = Server::start(seed, &logs.join(format!("server-{kind}.log")))?;
    let relay = Relay::start(server.addr)?;
    let key = tern::PublicKey::parse(server.key.trim()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let ideal = size as f64 * 8.0 / RATE_BPS;
    let initials = if kind == "initial-flood" {
        let n = ((ideal * f64::from(pps)) as usize).min(MAX_INITIALS);
        make_initials(n, server.addr, key)
    } else {
        Vec::new()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (ctx, crx) = mpsc::channel();
    let (gtx, grx) = tokio::sync::oneshot::channel();
    let front = relay.front.local_addr()?;
    let skey = server.key.clone();
    let timeout = Duration::from_secs_f64(3.0 * ideal + 15.0);
    let client =
        rt.spawn(async move { client_transfer(front, &skey, size, seed, timeout, ctx, grx).await });
    let client_addr = crx
        .recv_timeout(Duration::from_secs(10))
        .context("the client did not connect through the relay")?;
    let targets = Targets {
        server: server.addr,
        client: client_addr,
        as_client: relay.back.try_clone()?,
        as_server: relay.front.try_clone()?,
        pool: if kind == "baseline" {
            Vec::new()
        } else {
            attacker_pool()?
        },
    };
    let mut done = None;
    let before = server.stats(&mut done);
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = server.cpu();
    let t0 = Instant::now();
    let count = std::thread::scope(|s| {
        let h = (kind != "baseline").then(|| {
            let stop = &stop;
            let (t, c2s, s2c, initials) = (&targets, &relay.c2s, &relay.s2c, &initials);
            s.spawn(move || attack(kind, pps, seed ^ 0xa77a, t, (c2s, s2c), initials, stop))
        });
        let _ = gtx.send(());
        let out = rt.block_on(async {
            tokio::time::timeout(timeout + Duration::from_secs(10), client).await
        });
        if done.is_none() {
            done = server.wait_done(Duration::from_secs(3));
        }
        stop.store(true, Ordering::Relaxed);
        (out, h.map(|h| h.join().unwrap_or_default()))
    });
    let wall = t0.elapsed().as_secs_f64();
    let cpu = server.cpu() - cpu0;
    let after = server.stats(&mut done);
    let (out, attack) = count;
    let client = match out {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => ClientOut {
            error: Some(format!("client task: {e}")),
            ..Default::default()
        },
        Err(_) => ClientOut {
            error: Some("transfer timed out".into()),
            ..Default::default()
        },
    };
    rt.shutdown_timeout(Duration::from_millis(200));
    let attack = attack.unwrap_or_default();
    let received = done
        .as_ref()
        .and_then(|d| d["bytes"].as_u64())
        .or_else(|| after["received"].as_u64())
        .unwrap_or(0);
    let span = done.as_ref().and_then(|d| d["span_s"].as_f64());
    let hash_ok = done
        .as_ref()
        .and_then(|d| d["hash"].as_str())
        .is_some_and(|h| h == format!("{:016x}", client.hash.0));
    let completed = received == size && done.as_ref().is_some_and(|d| d["error"].is_null());
    let intact = done.as_ref().map_or_else(
        || after["intact"].as_bool().unwrap_or(false),
        |d| d["intact"].as_bool().unwrap_or(false),
    ) && (!completed || hash_ok);
    Ok(json!({
        "attack": kind,
        "size": size,
        "received": received,
        "completed": completed,
        "intact": intact,
        "hash_match": hash_ok,
        "span_s": span,
        "goodput_mbps": span.filter(|s| *s > 0.0).map(|s| received as f64 * 8.0 / s / 1e6),
        "max_gap_ms": done.as_ref().and_then(|d| d["max_gap_ms"].as_f64()),
        "bin_ms": BIN_MS,
        "bins": done.as_ref().map(|d| d["bins"].clone()),
        "client_elapsed_s": client.elapsed_s,
        "client_error": client.error,
        "server_error": done.as_ref().map(|d| d["error"].clone()),
        "client_stats": client.stats,
        "client_endpoint": client.endpoint,
        "wall_s": wall,
        "server_cpu_s": cpu,
        "attack_sent": attack.sent,
        "attack_send_errors": attack.send_errors,
        "attack_from_client_addr": attack.from_client_addr,
        "initials_made": initials.len(),
        "server": delta(&after, &before),
    }))
}

fn metric(v: &Value) -> f64 {
    match v {
        Value::Bool(b) => f64::from(u8::from(*b)),
        v => v.as_f64().unwrap_or(f64::NAN),
    }
}

/// Runs the scenario (`tern-bench run robustness [--quick]`) and writes its results file.
pub fn run(opts: &RunOpts, out: &Path) -> anyhow::Result<std::path::PathBuf> {
    if opts.profile.as_deref().is_some_and(|p| p != "loopback") {
        bail!("robustness runs on loopback only");
    }
    let started = Instant::now();
    let size = if opts.quick { SIZE_QUICK } else { SIZE_FULL };
    // Another attack rate must not overwrite the standard run's file.
    let variant = if attack_pps() == ATTACK_PPS {
        String::new()
    } else {
        format!("pps{}", attack_pps())
    };
    let mut file = RunFile::new(
        "robustness",
        "loopback",
        variant,
        opts.quick,
        json!({
            "size": size, "rate_mbps": RATE_BPS / 1e6, "attack_pps": attack_pps(),
            "attack_sources": format!("127.0.0.2-254, {SOCKETS_PER_IP} sockets each"),
            "seed": opts.seed, "server": "tern default EndpointConfig, trust_start",
        }),
        Vec::new(),
    );
    let logs = out.join("logs").join(file.file_stem());
    std::fs::create_dir_all(&logs)?;
    // `TERN_BENCH_ROBUST_ATTACKS=baseline,initial-flood`: a subset (baseline is needed for
    // the ratios).
    let only = std::env::var("TERN_BENCH_ROBUST_ATTACKS").ok();
    for kind in ATTACKS {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|a| a == kind))
        {
            continue;
        }
        eprintln!("robustness: {kind} …");
        let t = Instant::now();
        let mut case = Case {
            protocol: "tern".into(),
            params: [("attack".to_string(), json!(kind))].into_iter().collect(),
            ..Default::default()
        };
        match run_case(kind, size, opts.seed, &logs) {
            Ok(v) => {
                if let Some(e) = v["client_error"].as_str() {
                    case.error = Some(e.to_string());
                }
                case.extra = v;
            }
            Err(e) => case.error = Some(format!("{e:#}")),
        }
        case.wall_s = t.elapsed().as_secs_f64();
        if let Some(e) = &case.error {
            eprintln!("  {kind}: {e}");
        }
        file.cases.push(case);
        file.duration_s = started.elapsed().as_secs_f64();
        file.summary = summarize(&file);
        file.write(out)?;
    }
    let path = file.write(out)?;
    eprintln!("wrote {} in {:.0} s", path.display(), file.duration_s);
    println!("{}", crate::report::markdown(&file));
    Ok(path)
}

/// The rows of a `robustness` run: one per attack, with goodput kept against `baseline` and
/// the server's CPU per junk datagram beyond the baseline's CPU rate.
pub fn summarize(run: &RunFile) -> Vec<Row> {
    let base = run
        .cases
        .iter()
        .find(|c| c.params.get("attack") == Some(&json!("baseline")))
        .map(|c| &c.extra);
    let base_goodput = base.map_or(f64::NAN, |b| metric(&b["goodput_mbps"]));
    let base_cpu_rate = base.map_or(f64::NAN, |b| {
        metric(&b["server_cpu_s"]) / metric(&b["wall_s"])
    });
    let mut rows = Vec::new();
    for case in &run.cases {
        let x = &case.extra;
        let mut m = BTreeMap::new();
        for k in [
            "goodput_mbps",
            "completed",
            "intact",
            "max_gap_ms",
            "server_cpu_s",
            "attack_sent",
        ] {
            m.insert(k.to_string(), metric(&x[k]));
        }
        let wall = metric(&x["wall_s"]);
        if let Some(bins) = x["bins"].as_array() {
            let bins: Vec<u64> = bins.iter().filter_map(Value::as_u64).collect();
            let bin_ms = x["bin_ms"].as_u64().unwrap_or(BIN_MS);
            let rate = run.settings["rate_mbps"].as_f64().unwrap_or(RATE_BPS / 1e6) * 1e6;
            m.insert("slow_s".into(), slow_seconds(&bins, bin_ms, rate));
        }
        // A transfer that did not complete kept nothing: its goodput up to the point it
        // died would read as kept (found by an outside read).
        let completed = x["completed"].as_bool().unwrap_or(false);
        let kept = if completed {
            metric(&x["goodput_mbps"]) / base_goodput
        } else {
            0.0
        };
        m.insert("goodput_kept".into(), kept);
        m.insert(
            "server_cpu_pct".into(),
            100.0 * metric(&x["server_cpu_s"]) / wall,
        );
        m.insert("attack_pps".into(), metric(&x["attack_sent"]) / wall);
        let sent = metric(&x["attack_sent"]);
        if sent > 0.0 {
            let extra_cpu = metric(&x["server_cpu_s"]) - base_cpu_rate * wall;
            m.insert("cpu_us_per_junk".into(), 1e6 * extra_cpu / sent);
        }
        if let Some(Value::Object(e)) = x["server"].get("endpoint") {
            for (k, v) in e {
                m.insert(format!("ep_{k}"), metric(v));
            }
        }
        for k in ["accepted", "socket_drops"] {
            if let Some(v) = x["server"].get(k) {
                m.insert(format!("server_{k}"), metric(v));
            }
        }
        if let Some(Value::Object(e)) = x["server"].get("connections") {
            for (k, v) in e {
                m.insert(format!("server_{k}"), metric(v));
            }
        }
        if let Value::Object(e) = &x["client_endpoint"] {
            for (k, v) in e {
                m.insert(format!("client_ep_{k}"), metric(v));
            }
        }
        if let Value::Object(e) = &x["client_stats"] {
            for (k, v) in e {
                m.insert(format!("client_{k}"), metric(v));
            }
        }
        let mut params = case.params.clone();
        if case.error.is_some() {
            params.insert("error".into(), json!(true));
        }
        rows.push(Row {
            protocol: case.protocol.clone(),
            params,
            metrics: m,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_seconds_count_whole_bins_below_ninety_percent() {
        // 100 Mbit/s: 1.25 MB per 100 ms bin; 90 % is 1.125 MB.
        let bins = [1_250_000, 1_125_000, 1_124_999, 0, 1_300_000, 10];
        assert!((slow_seconds(&bins, 100, 100e6) - 0.2).abs() < 1e-9);
        assert_eq!(slow_seconds(&[], 100, 100e6), 0.0);
    }

    #[test]
    fn pattern_is_the_same_in_any_chunking() {
        let mut whole = vec![0u8; 1000];
        pattern_fill(7, 0, &mut whole);
        let mut parts = vec![0u8; 1000];
        let (a, b) = parts.split_at_mut(333);
        pattern_fill(7, 0, a);
        pattern_fill(7, 333, b);
        assert_eq!(whole, parts);
        let mut other = vec![0u8; 1000];
        pattern_fill(8, 0, &mut other);
        assert_ne!(whole, other);
        let (mut h1, mut h2) = (Fnv::default(), Fnv::default());
        h1.update(&whole);
        h2.update(&whole[..500]);
        h2.update(&whole[500..]);
        assert_eq!(h1, h2);
    }

    #[test]
    fn junk_is_deterministic_from_its_seed_and_shaped_as_said() {
        let make = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let pkt: Vec<u8> = (0..1200u32).map(|i| i as u8).collect();
            let tpl = [0x45u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
            (0..200)
                .map(|_| {
                    (
                        garbage(&mut rng),
                        mutate(&mut rng, &pkt),
                        forged_reset(&mut rng, Some(&tpl)),
                        forged_reset(&mut rng, None),
                    )
                })
                .collect::<Vec<_>>()
        };
        let a = make(3);
        assert_eq!(a, make(3));
        assert_ne!(a, make(4));
        let pkt: Vec<u8> = (0..1200u32).map(|i| i as u8).collect();
        for (g, m, r, r2) in &a {
            assert!((1..=1500).contains(&g.len()));
            assert!(!m.is_empty() && m.len() <= pkt.len());
            assert_ne!(m, &pkt);
            for r in [r, r2] {
                assert!((21..=64).contains(&r.len()));
                assert_eq!(r[0] & 0xc0, 0x40);
            }
            assert_eq!(&r[..9], &[0x45, 1, 2, 3, 4, 5, 6, 7, 8]);
        }
        // Some of each kind of garbage and mutation.
        assert!(a.iter().any(|x| x.0[0] & 0xc0 == 0x40 && x.0.len() >= 21));
        assert!(a.iter().any(|x| x.1.len() < pkt.len()));
        assert!(a.iter().any(|x| x.1.len() == pkt.len()));
    }
}
