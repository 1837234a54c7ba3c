//! `scale` (issue 12, the benchmark half): how many handshakes a server completes per second,
//! how much memory an idle connection costs at each end, and how long a server takes to
//! accept N connections — tern against quinn and kernel TCP + TLS 1.3 (rustls), in the same
//! run on loopback, the protocols alternating.
//!
//! Every measurement has a server agent and a client agent, each its own process (hidden
//! subcommands `agent-scale-server` and `agent-scale-client`), so that each end's resident
//! memory (`VmRSS` of `/proc/<pid>/status`) and CPU time (`/proc/<pid>/stat`) are its own.
//! The collector drives both with lines on their stdin and reads JSON lines back.
//!
//! - **handshakes per second**: the client connects, waits until it can send application
//!   data (tern: `Endpoint::connect` returned; quinn: the connection is established; TLS: the
//!   client's handshake finished), closes, and does it again, for a fixed time; once with one
//!   such client (`clients = 1`, sequential) and once with 100 tasks doing it at once
//!   (`clients = 100`). The server runs a tokio runtime of 1 or 2 worker threads
//!   (`--threads`). tern and quinn clients share one client endpoint (one UDP socket) in the
//!   client process, as an application with many connections to one server does; each TLS
//!   handshake has its own TCP connection (as TCP must).
//! - **idle connections**: a fresh server and client; the client opens 100 connections (so
//!   that both processes have made every lazy allocation), both RSS are read, then it opens
//!   N more (100 at a time) and holds them; after [`IDLE_WAIT_S`] of idleness both RSS are
//!   read again. Bytes per idle connection = ΔRSS / N at each end. The server's time to
//!   accept the N is from the collector's go to the N-th accept. The kernel's own memory
//!   (TCP socket buffers and structures, not in any RSS) is recorded apart: `/proc/meminfo`
//!   `Slab` and `/proc/net/sockstat` `TCP mem`, both ends together.
//!
//! Idle timeouts are raised to [`IDLE_TIMEOUT_S`] in every protocol (tern's default is 30 s,
//! the quinn runs' 30 s; TCP has none), so that no connection closes while measured; no
//! keep-alive is sent by any.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::proto::{ternp, tls};
use crate::results::{stats, Case, Row, RunFile};
use crate::scenario::RunOpts;
use crate::spec::Proto;
use crate::sysinfo;

/// The protocols of `scale`, in the order they alternate.
pub const PROTOCOLS: [Proto; 3] = [Proto::Tern, Proto::Quic, Proto::TcpTls];

/// Concurrent clients of the concurrent handshake test.
pub const CONCURRENT: u32 = 100;

/// Idle timeout of every protocol in `scale`, seconds.
pub const IDLE_TIMEOUT_S: u64 = 600;

/// How long the connections stay idle before the RSS is read.
pub const IDLE_WAIT_S: f64 = 5.0;

/// Connections opened before the baseline RSS is read.
const WARM_CONNS: u64 = 100;

/// Connections in flight while opening N.
const OPEN_CONCURRENCY: u64 = 100;

/// Listening ports of the TLS server: connections are spread over them, so that the
/// client's ephemeral ports (28 232 per destination) do not run out at 100 000.
const TLS_PORTS: usize = 8;

/// Most connections a process may hold (tern's `max_connections`, the file limit).
const MAX_CONNS: usize = 250_000;

// ---------------------------------------------------------------------------------------
// Agents.

fn print_line(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Raises the open-file limit (TLS at 100 000 connections needs one descriptor each).
fn raise_nofile() {
    use nix::sys::resource::{setrlimit, Resource};
    let n = (MAX_CONNS + 10_000) as u64;
    if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, n, n) {
        eprintln!("could not raise RLIMIT_NOFILE to {n}: {e}");
    }
}

fn tern_config(server: bool) -> anyhow::Result<tern::EndpointConfig> {
    // The configuration of every tern-bench tern run (trust_start, per-source handshake
    // limit off, …), with room for the idle connections and a long idle timeout.
    let mut cfg = ternp::config(server, "flows")?;
    cfg.max_connections = MAX_CONNS;
    cfg.connection.idle_timeout = Duration::from_secs(IDLE_TIMEOUT_S);
    if !server {
        cfg.connection.max_paths = 1;
    }
    Ok(cfg)
}

/// quinn's transport in `scale`: the windows of every tern-bench quinn run (4 MiB per
/// stream, 16 MiB per connection), the long idle timeout, and quinn's default stream limits
/// (100 each way). Not the other runs' 100 000 bidirectional streams: quinn-proto makes the
/// state of every stream the peer may open when the connection starts
/// (`StreamsState::new`), which at 100 000 costs about 6 MB and 12 ms of CPU per connection
/// — a setting of the benchmark, not a cost of QUIC.
fn quic_transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window((4u32 << 20).into())
        .receive_window((16u32 << 20).into())
        .send_window(16 << 20)
        .max_idle_timeout(Some(
            Duration::from_secs(IDLE_TIMEOUT_S)
                .try_into()
                .expect("valid timeout"),
        ));
    Arc::new(t)
}

#[derive(Default)]
struct Accepts {
    accepted: AtomicU64,
    live: AtomicI64,
    /// ns since `mark` of the latest accept.
    last_ns: AtomicU64,
    mark: Mutex<Option<Instant>>,
    /// Accepts per second since `mark`.
    bins: Mutex<Vec<u64>>,
}

impl Accepts {
    fn on_accept(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.live.fetch_add(1, Ordering::Relaxed);
        let mark = *self.mark.lock().expect("mark");
        if let Some(m) = mark {
            let ns = m.elapsed().as_nanos() as u64;
            self.last_ns.fetch_max(ns, Ordering::Relaxed);
            let bin = (ns / 1_000_000_000) as usize;
            let mut b = self.bins.lock().expect("bins");
            if b.len() <= bin {
                b.resize(bin + 1, 0);
            }
            b[bin] += 1;
        }
    }
}

/// `tern-bench agent-scale-server --proto P --threads T`: a server of `P` on 127.0.0.1 in a
/// tokio runtime of `T` worker threads. It holds every connection until its peer closes it.
/// Prints `{"ready", "addrs", "credential"}`; then per stdin line: `mark` (counting restarts
/// from 0 and accept times are taken from now; answers `{"marked"}`) or `stats` (answers
/// `{"accepted", "live", "last_accept_s"}`). Exits when stdin closes.
pub fn server_agent(proto: Proto, threads: usize) -> anyhow::Result<()> {
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    let acc: Arc<Accepts> = Arc::default();
    {
        let acc = acc.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                match line.trim() {
                    "mark" => {
                        acc.accepted.store(0, Ordering::Relaxed);
                        acc.last_ns.store(0, Ordering::Relaxed);
                        acc.bins.lock().expect("bins").clear();
                        *acc.mark.lock().expect("mark") = Some(Instant::now());
                        print_line(&json!({"marked": true}));
                    }
                    _ => print_line(&json!({"stats": {
                        "accepted": acc.accepted.load(Ordering::Relaxed),
                        "live": acc.live.load(Ordering::Relaxed),
                        "last_accept_s": acc.last_ns.load(Ordering::Relaxed) as f64 / 1e9,
                        "accepts_per_s_bins": *acc.bins.lock().expect("bins"),
                    }})),
                }
            }
            std::process::exit(0);
        });
    }
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    rt.block_on(async move {
        match proto {
            Proto::Tern => {
                // One worker (socket and driver) per thread: SO_REUSEPORT, steering by the
                // server ID in the connection ID (tern::Workers).
                let cfg = tern_config(true)?;
                let ep = tern::Endpoint::builder(cfg.keypair.clone())
                    .config(cfg)
                    .bind(lo)
                    .build_workers(threads.max(1))?;
                let key = tern::keys::encode_public(&ep.public_key());
                print_line(&json!({"ready": true, "addrs": [ep.local_addr()], "credential": key}));
                while let Some(conn) = ep.accept().await {
                    acc.on_accept();
                    let acc = acc.clone();
                    tokio::spawn(async move {
                        let _ = conn.closed().await;
                        acc.live.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            }
            Proto::Quic => {
                let (cfg, cert) = tls::server_config()?;
                let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(cfg)?;
                let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
                sc.transport_config(quic_transport());
                let ep = crate::proto::quic::endpoint(lo, Some(sc))?;
                print_line(
                    &json!({"ready": true, "addrs": [ep.local_addr()?], "credential": cert}),
                );
                while let Some(incoming) = ep.accept().await {
                    let acc = acc.clone();
                    tokio::spawn(async move {
                        let Ok(conn) = incoming.await else { return };
                        acc.on_accept();
                        let _ = conn.closed().await;
                        acc.live.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            }
            Proto::TcpTls => {
                let (cfg, cert) = tls::server_config()?;
                let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                let mut listeners = Vec::new();
                let mut addrs = Vec::new();
                for _ in 0..TLS_PORTS {
                    let s = tokio::net::TcpSocket::new_v4()?;
                    s.set_reuseaddr(true)?;
                    s.bind(lo)?;
                    let l = s.listen(4096)?;
                    addrs.push(l.local_addr()?);
                    listeners.push(l);
                }
                print_line(&json!({"ready": true, "addrs": addrs, "credential": cert}));
                let mut tasks = Vec::new();
                for l in listeners {
                    let (acc, acceptor) = (acc.clone(), acceptor.clone());
                    tasks.push(tokio::spawn(async move {
                        loop {
                            let Ok((tcp, _)) = l.accept().await else {
                                // Out of descriptors: wait for some to be freed.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            };
                            let _ = tcp.set_nodelay(true);
                            let _ = socket2::SockRef::from(&tcp).set_tcp_congestion(b"cubic");
                            let (acc, acceptor) = (acc.clone(), acceptor.clone());
                            tokio::spawn(async move {
                                let Ok(mut s) = acceptor.accept(tcp).await else {
                                    return;
                                };
                                acc.on_accept();
                                let mut b = [0u8; 64];
                                while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
                                acc.live.fetch_sub(1, Ordering::Relaxed);
                            });
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            }
            p => bail!("scale does not run {p}"),
        }
        Ok(())
    })
}

/// What the collector tells a client agent at its start.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientSpec {
    /// Protocol.
    pub proto: Proto,
    /// The server's addresses (TLS: one per listening port; the others one).
    pub addrs: Vec<SocketAddr>,
    /// The server's key (tern) or certificate (quinn, TLS).
    pub credential: String,
}

/// Client sockets (endpoints) of tern and quinn: connections go round robin over them, as
/// from a few hosts, so that a server with several workers sees several 4-tuples.
const CLIENT_SOCKETS: usize = 4;

enum Client {
    Tern {
        eps: Vec<tern::Endpoint>,
        addr: SocketAddr,
        key: tern::PublicKey,
    },
    Quic {
        eps: Vec<quinn::Endpoint>,
        addr: SocketAddr,
    },
    Tls {
        connector: tokio_rustls::TlsConnector,
        addrs: Vec<SocketAddr>,
    },
}

enum Held {
    Tern(tern::Connection),
    Quic(quinn::Connection),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl Client {
    fn new(spec: &ClientSpec) -> anyhow::Result<Self> {
        let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let addr = *spec.addrs.first().context("no server address")?;
        Ok(match spec.proto {
            Proto::Tern => {
                let key = tern::PublicKey::parse(spec.credential.trim())
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                let mut eps = Vec::new();
                for _ in 0..CLIENT_SOCKETS {
                    eps.push(tern::Endpoint::bind(lo, tern_config(false)?)?);
                }
                Client::Tern { eps, addr, key }
            }
            Proto::Quic => {
                let crypto = tls::client_config(&spec.credential, false)?;
                let mut cfg = quinn::ClientConfig::new(Arc::new(
                    quinn::crypto::rustls::QuicClientConfig::try_from((*crypto).clone())?,
                ));
                cfg.transport_config(quic_transport());
                let mut eps = Vec::new();
                for _ in 0..CLIENT_SOCKETS {
                    let mut ep = crate::proto::quic::endpoint(lo, None)?;
                    ep.set_default_client_config(cfg.clone());
                    eps.push(ep);
                }
                Client::Quic { eps, addr }
            }
            Proto::TcpTls => Client::Tls {
                connector: tokio_rustls::TlsConnector::from(tls::client_config(
                    &spec.credential,
                    false,
                )?),
                addrs: spec.addrs.clone(),
            },
            p => bail!("scale does not run {p}"),
        })
    }

    /// Connects (the `i`-th connection: TLS spreads them over the server's ports) and
    /// returns once the client can send application data.
    async fn connect(&self, i: u64) -> Result<Held, String> {
        match self {
            Client::Tern { eps, addr, key } => eps[i as usize % eps.len()]
                .connect(*addr, Some(*key))
                .await
                .map(Held::Tern)
                .map_err(|e| format!("{e}")),
            Client::Quic { eps, addr } => eps[i as usize % eps.len()]
                .connect(*addr, tls::SERVER_NAME)
                .map_err(|e| e.to_string())?
                .await
                .map(Held::Quic)
                .map_err(|e| e.to_string()),
            Client::Tls { connector, addrs } => {
                let addr = addrs[i as usize % addrs.len()];
                let s = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
                let _ = socket2::SockRef::from(&s).set_tcp_congestion(b"cubic");
                let _ = s.set_nodelay(true);
                let tcp = s.connect(addr).await.map_err(|e| format!("connect: {e}"))?;
                connector
                    .connect(tls::server_name(), tcp)
                    .await
                    .map(|s| Held::Tls(Box::new(s)))
                    .map_err(|e| format!("handshake: {e}"))
            }
        }
    }
}

impl Held {
    async fn close(self) {
        match self {
            Held::Tern(c) => c.close(0, b""),
            Held::Quic(c) => c.close(0u32.into(), b""),
            Held::Tls(mut s) => {
                let _ = s.shutdown().await;
            }
        }
    }
}

/// Sequential handshakes by `clients` tasks for `secs`.
async fn handshakes(client: Arc<Client>, clients: u32, secs: f64) -> Value {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let cpu0 = crate::agent::cpu_seconds();
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|t| {
            let (client, counter) = (client.clone(), counter.clone());
            tokio::spawn(async move {
                let (mut lat, mut errors, mut first_error) = (Vec::new(), 0u64, None);
                let mut in_window = 0u64;
                while Instant::now() < end {
                    let i = counter.fetch_add(1, Ordering::Relaxed) + u64::from(t);
                    let s = Instant::now();
                    let r = tokio::time::timeout(Duration::from_secs(10), client.connect(i)).await;
                    match r {
                        Ok(Ok(h)) => {
                            lat.push(s.elapsed().as_secs_f64() * 1e3);
                            in_window += u64::from(Instant::now() <= end);
                            h.close().await;
                        }
                        Ok(Err(e)) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                        Err(_) => {
                            errors += 1;
                            first_error.get_or_insert("handshake timed out (10 s)".into());
                        }
                    }
                }
                (lat, errors, first_error, in_window)
            })
        })
        .collect();
    let (mut lat, mut errors, mut first_error, mut in_window) = (Vec::new(), 0, None, 0);
    for t in tasks {
        if let Ok((l, e, f, w)) = t.await {
            lat.extend(l);
            errors += e;
            in_window += w;
            if first_error.is_none() {
                first_error = f;
            }
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    json!({
        "handshakes": lat.len(),
        // The rate counts what completed within the window, over the window: handshakes in
        // flight at its end finish later, while the server is nearly idle (dividing every
        // completion by the time until the last one understated a protocol whose handshakes
        // straggle; found by an outside read).
        "handshakes_in_window": in_window,
        "window_s": secs,
        "errors": errors,
        "first_error": first_error,
        "elapsed_s": elapsed,
        "latency_p50_ms": stats::median(&lat),
        "latency_p99_ms": stats::percentile(&lat, 99.0),
        "client_cpu_s": crate::agent::cpu_seconds() - cpu0,
    })
}

/// Opens `n` connections, `conc` at a time, into `held`. Gives up after 1 000 failures or
/// `limit_s` seconds.
async fn open(
    client: Arc<Client>,
    held: Arc<Mutex<Vec<Held>>>,
    n: u64,
    conc: u64,
    limit_s: f64,
) -> Value {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(limit_s);
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let base = held.lock().expect("held").len() as u64;
    let tasks: Vec<_> = (0..conc.min(n))
        .map(|_| {
            let (client, held, next, failed, first_error) = (
                client.clone(),
                held.clone(),
                next.clone(),
                failed.clone(),
                first_error.clone(),
            );
            tokio::spawn(async move {
                loop {
                    if failed.load(Ordering::Relaxed) >= 1_000 || Instant::now() >= deadline {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let r = tokio::time::timeout(Duration::from_secs(15), client.connect(base + i))
                        .await
                        .unwrap_or_else(|_| Err("handshake timed out (15 s)".into()));
                    match r {
                        Ok(h) => held.lock().expect("held").push(h),
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().expect("error").get_or_insert(e);
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let opened = held.lock().expect("held").len() as u64 - base;
    let first_error = first_error.lock().expect("error").clone();
    let elapsed = t0.elapsed().as_secs_f64();
    json!({
        "timed_out": opened < n && elapsed >= limit_s,
        "limit_s": limit_s,
        "opened": opened,
        "failed": failed.load(Ordering::Relaxed),
        "first_error": first_error,
        "elapsed_s": elapsed,
    })
}

/// `tern-bench agent-scale-client --spec JSON`: a client of the server in [`ClientSpec`].
/// Per stdin line it answers one JSON line: `handshakes CLIENTS SECS`, `open N LIMIT_S`, `count`
/// (connections held and still open). Exits when stdin closes.
pub fn client_agent(spec: &str) -> anyhow::Result<()> {
    raise_nofile();
    let spec: ClientSpec = serde_json::from_str(spec).context("client spec")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = Arc::new(Client::new(&spec)?);
        let held: Arc<Mutex<Vec<Held>>> = Arc::default();
        print_line(&json!({"ready": true}));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            let w: Vec<&str> = line.split_whitespace().collect();
            let v = match w.as_slice() {
                ["handshakes", c, s] => handshakes(client.clone(), c.parse()?, s.parse()?).await,
                ["open", n, limit] => {
                    open(
                        client.clone(),
                        held.clone(),
                        n.parse()?,
                        OPEN_CONCURRENCY,
                        limit.parse()?,
                    )
                    .await
                }
                ["count"] => {
                    let h = held.lock().expect("held");
                    // tern: the connections its endpoint still has (warm-up ones included).
                    let open = match &*client {
                        Client::Tern { eps, .. } => {
                            eps.iter().map(tern::Endpoint::connection_count).sum()
                        }
                        _ => h
                            .iter()
                            .filter(|c| match c {
                                Held::Quic(c) => c.close_reason().is_none(),
                                _ => true,
                            })
                            .count(),
                    };
                    json!({"held": h.len(), "open": open})
                }
                _ => json!({"error": format!("unknown command {line:?}")}),
            };
            print_line(&v);
        }
        std::process::exit(0);
    })
}

// ---------------------------------------------------------------------------------------
// The collector.

/// A running agent and its JSON lines.
struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
}

impl Proc {
    fn start(args: &[String], log: &Path) -> anyhow::Result<(Self, Value)> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("scale agent")?;
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
        let mut p = Self {
            child,
            stdin,
            lines,
        };
        let ready = p
            .lines
            .recv_timeout(Duration::from_secs(20))
            .with_context(|| format!("agent gave no ready line (log: {})", log.display()))?;
        let _ = &mut p;
        Ok((p, ready))
    }

    /// Sends a command and waits up to `within` for its answer.
    fn ask(&mut self, cmd: &str, within: Duration) -> anyhow::Result<Value> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("no answer to {cmd:?} within {within:?}"))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn cpu(&self) -> f64 {
        crate::runner::proc_cpu_seconds(self.pid()).unwrap_or(f64::NAN)
    }

    fn rss_bytes(&self) -> f64 {
        proc_status_kb(self.pid(), "VmRSS").map_or(f64::NAN, |kb| kb as f64 * 1024.0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, `RssAnon`).
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_kb(&text, field)
}

/// A `kB` field of a `/proc/<pid>/status` text.
pub fn status_kb(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The kernel memory that TCP sockets cost and no process's RSS shows: `/proc/meminfo`
/// `Slab` (socket structures, and everything else in slabs) and `/proc/net/sockstat`
/// `TCP … mem` (pages of socket buffers), bytes.
fn kernel_memory() -> (f64, f64) {
    let slab = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| status_kb(&t, "Slab"))
        .map_or(f64::NAN, |kb| kb as f64 * 1024.0);
    let tcp_mem = std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|t| {
            let l = t.lines().find(|l| l.starts_with("TCP:"))?;
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|x| *x == "mem")?;
            f.get(i + 1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |pages| pages * 4096.0);
    (slab, tcp_mem)
}

struct Pair {
    server: Proc,
    client: Proc,
}

fn start_pair(proto: Proto, threads: usize, logs: &Path, tag: &str) -> anyhow::Result<Pair> {
    let (server, ready) = Proc::start(
        &[
            "agent-scale-server".into(),
            "--proto".into(),
            proto.name().into(),
            "--threads".into(),
            threads.to_string(),
        ],
        &logs.join(format!("{tag}-server.log")),
    )?;
    let addrs: Vec<SocketAddr> = serde_json::from_value(ready["addrs"].clone())?;
    let spec = ClientSpec {
        proto,
        addrs,
        credential: ready["credential"].as_str().unwrap_or_default().into(),
    };
    let (client, _) = Proc::start(
        &[
            "agent-scale-client".into(),
            "--spec".into(),
            serde_json::to_string(&spec)?,
        ],
        &logs.join(format!("{tag}-client.log")),
    )?;
    Ok(Pair { server, client })
}

/// The host's UDP error counters (both agents run in its namespace).
fn udp_counters() -> Option<sysinfo::UdpCounters> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let snmp6 = std::fs::read_to_string("/proc/net/snmp6").unwrap_or_default();
    sysinfo::udp_counters(&snmp, &snmp6)
}

/// Puts the UDP counters' growth since `before` into `v`.
fn put_udp(v: &mut Value, before: Option<sysinfo::UdpCounters>) {
    if let (Some(b), Some(a)) = (before, udp_counters()) {
        let d = a.since(&b);
        v["udp_rcvbuf_errors"] = json!(d.rcvbuf_errors);
        v["udp_sndbuf_errors"] = json!(d.sndbuf_errors);
        v["udp_in_errors"] = json!(d.in_errors);
    }
}

/// One handshake test: `clients` tasks for `secs`; the server's CPU over it.
fn run_handshakes(p: &mut Pair, clients: u32, secs: f64) -> anyhow::Result<Value> {
    let udp0 = udp_counters();
    let cpu0 = p.server.cpu();
    let mut v = p.client.ask(
        &format!("handshakes {clients} {secs}"),
        Duration::from_secs_f64(secs + 60.0),
    )?;
    v["server_cpu_s"] = json!(p.server.cpu() - cpu0);
    put_udp(&mut v, udp0);
    Ok(v)
}

/// The idle-connection test: warm-up, baseline, N connections, idleness, RSS.
fn run_idle(p: &mut Pair, n: u64, idle_s: f64, limit_s: f64) -> anyhow::Result<Value> {
    let long = Duration::from_secs_f64(limit_s + 120.0);
    let warm = p.client.ask(&format!("open {WARM_CONNS} 60"), long)?;
    std::thread::sleep(Duration::from_secs(1));
    let (s0, c0) = (p.server.rss_bytes(), p.client.rss_bytes());
    let (slab0, tcpmem0) = kernel_memory();
    let (scpu0, ccpu0) = (p.server.cpu(), p.client.cpu());
    let udp0 = udp_counters();
    p.server.ask("mark", Duration::from_secs(10))?;
    let opened = p.client.ask(&format!("open {n} {limit_s}"), long)?;
    let accept = p.server.ask("stats", Duration::from_secs(10))?;
    let (scpu, ccpu) = (p.server.cpu() - scpu0, p.client.cpu() - ccpu0);
    std::thread::sleep(Duration::from_secs_f64(idle_s));
    let (s1, c1) = (p.server.rss_bytes(), p.client.rss_bytes());
    let (slab1, tcpmem1) = kernel_memory();
    let after = p.server.ask("stats", Duration::from_secs(10))?;
    let count = p.client.ask("count", Duration::from_secs(30))?;
    let got = opened["opened"].as_u64().unwrap_or(0);
    let per = |a: f64, b: f64| (got > 0).then(|| (a - b) / got as f64);
    let mut v = json!({
        "n": n,
        "warm": warm,
        "open": opened,
        "opened": got,
        "server_accepted": accept["stats"]["accepted"],
        "accept_s": accept["stats"]["last_accept_s"],
        "accepts_per_s_bins": accept["stats"]["accepts_per_s_bins"],
        "server_live_after_idle": after["stats"]["live"],
        "client_open_after_idle": count["open"],
        "idle_s": idle_s,
        "server_rss_before": s0, "server_rss_after": s1,
        "client_rss_before": c0, "client_rss_after": c1,
        "server_bytes_per_conn": per(s1, s0),
        "client_bytes_per_conn": per(c1, c0),
        "kernel_slab_bytes_per_conn": per(slab1, slab0),
        "kernel_tcp_mem_bytes_per_conn": per(tcpmem1, tcpmem0),
        "server_cpu_s": scpu,
        "client_cpu_s": ccpu,
    });
    put_udp(&mut v, udp0);
    Ok(v)
}

/// Runs `tern-bench run scale [--quick] [--threads 1,2] [--count N] [--protocols …]` and
/// writes its results file.
pub fn run(opts: &RunOpts, out: &Path) -> anyhow::Result<std::path::PathBuf> {
    if opts.profile.as_deref().is_some_and(|p| p != "loopback") {
        bail!("scale runs on loopback only");
    }
    let q = opts.quick;
    let secs = if q { 2.0 } else { 5.0 };
    let threads: Vec<usize> = match &opts.threads {
        Some(t) => t.iter().map(|&t| t.max(1) as usize).collect(),
        None if q => vec![1],
        None => vec![1, 2],
    };
    let ns: Vec<u64> = match opts.count {
        Some(n) => vec![u64::from(n)],
        None if q => vec![10_000],
        None => vec![10_000, 100_000],
    };
    let mem_threads = threads.iter().copied().max().unwrap_or(1);
    // Opening N stops after this long (a server whose accept rate falls with the number of
    // connections could take hours); the row then says how many were opened.
    let open_limit_s = if q { 120.0 } else { 300.0 };
    let protocols: Vec<Proto> = match &opts.protocols {
        Some(p) => p.clone(),
        None => PROTOCOLS.to_vec(),
    };
    let mut skipped = Vec::new();
    let protocols: Vec<Proto> = protocols
        .into_iter()
        .filter(|p| {
            let ok = PROTOCOLS.contains(p);
            if !ok {
                skipped.push(crate::results::Skipped {
                    protocol: p.name().into(),
                    reason: "scale runs tern, quic and tcp-tls".into(),
                });
            }
            ok
        })
        .collect();
    let started = Instant::now();
    let mut file = RunFile::new(
        "scale",
        "loopback",
        variant(q, opts),
        q,
        json!({
            "handshake_s": secs,
            "concurrent_clients": CONCURRENT,
            "threads": threads,
            "idle_connections": ns,
            "idle_threads": mem_threads,
            "idle_wait_s": IDLE_WAIT_S,
            "open_limit_s": open_limit_s,
            "idle_timeout_s": IDLE_TIMEOUT_S,
            "warm_connections": WARM_CONNS,
            "open_concurrency": OPEN_CONCURRENCY,
            "tls_server_ports": TLS_PORTS,
            "client": "one process, tokio runtime of 2 worker threads; tern and quinn: one client endpoint (one UDP socket) for every connection; TLS: a TCP connection each, spread over the server's ports",
            "tls": "rustls 0.23, ring, TLS 1.3, self-signed ECDSA P-256 certificate; client session resumption off (every handshake a full one, as tern's IK)",
            "tern": "tern-bench's tern configuration (trust_start, per-source handshake limit off), max_connections 250000, idle timeout 600 s",
            "quinn": "tern-bench's quinn windows (4/16 MiB), quinn's default stream limits (100: quinn-proto allocates every stream the peer may open at the start, 6 MB per connection at the other runs' 100 000), idle timeout 600 s",
        }),
        skipped,
    );
    let logs = out.join("logs").join(file.file_stem());
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let push = |file: &mut RunFile, case: Case| -> anyhow::Result<()> {
        if let Some(e) = &case.error {
            eprintln!("  {} {:?}: {e}", case.protocol, case.params);
        }
        file.cases.push(case);
        file.duration_s = started.elapsed().as_secs_f64();
        file.summary = summarize(file);
        file.write(out)?;
        Ok(())
    };
    // Handshakes: per thread count, the protocols in turn.
    for &t in &threads {
        for &proto in &protocols {
            eprintln!("scale: {proto} handshakes, server threads {t} …");
            let tag = format!("{proto}-hs-t{t}");
            let started_case = Instant::now();
            let mut cases = Vec::new();
            let r = (|| -> anyhow::Result<()> {
                let mut p = start_pair(proto, t, &logs, &tag)?;
                // Warm-up: lazy initialisation of both ends.
                let _ = run_handshakes(&mut p, 1, 0.3)?;
                for clients in [1, CONCURRENT] {
                    let v = run_handshakes(&mut p, clients, secs)?;
                    cases.push((clients, v));
                }
                Ok(())
            })();
            for (clients, v) in &cases {
                let mut case = Case {
                    protocol: proto.name().into(),
                    params: BTreeMap::from([
                        ("test".to_string(), json!("handshakes")),
                        ("clients".to_string(), json!(clients)),
                        ("threads".to_string(), json!(t)),
                    ]),
                    extra: v.clone(),
                    wall_s: started_case.elapsed().as_secs_f64(),
                    ..Default::default()
                };
                if v["handshakes"].as_u64() == Some(0) {
                    case.error = Some(format!("no handshake completed: {}", v["first_error"]));
                }
                push(&mut file, case)?;
            }
            if let Err(e) = r {
                let case = Case {
                    protocol: proto.name().into(),
                    params: BTreeMap::from([
                        ("test".to_string(), json!("handshakes")),
                        ("threads".to_string(), json!(t)),
                    ]),
                    error: Some(format!("{e:#}")),
                    wall_s: started_case.elapsed().as_secs_f64(),
                    ..Default::default()
                };
                push(&mut file, case)?;
            }
        }
    }
    // Idle connections: per N, the protocols in turn, each in fresh processes.
    for &n in &ns {
        for &proto in &protocols {
            eprintln!("scale: {proto} {n} idle connections, server threads {mem_threads} …");
            let tag = format!("{proto}-idle-{n}");
            let t0 = Instant::now();
            let r = start_pair(proto, mem_threads, &logs, &tag)
                .and_then(|mut p| run_idle(&mut p, n, IDLE_WAIT_S, open_limit_s));
            let mut case = Case {
                protocol: proto.name().into(),
                params: BTreeMap::from([
                    ("test".to_string(), json!("idle")),
                    ("n".to_string(), json!(n)),
                    ("threads".to_string(), json!(mem_threads)),
                ]),
                ..Default::default()
            };
            match r {
                Ok(v) => {
                    if v["opened"].as_u64().unwrap_or(0) < n {
                        let why = if v["open"]["timed_out"].as_bool() == Some(true) {
                            format!("stopped after {open_limit_s} s")
                        } else {
                            v["open"]["first_error"].to_string()
                        };
                        case.error = Some(format!(
                            "opened {} of {n}: {why} (failures: {}, first: {})",
                            v["opened"], v["open"]["failed"], v["open"]["first_error"]
                        ));
                    }
                    case.extra = v;
                }
                Err(e) => case.error = Some(format!("{e:#}")),
            }
            case.wall_s = t0.elapsed().as_secs_f64();
            push(&mut file, case)?;
        }
    }
    file.duration_s = started.elapsed().as_secs_f64();
    file.summary = summarize(&file);
    let path = file.write(out)?;
    eprintln!("wrote {} in {:.0} s", path.display(), file.duration_s);
    println!("{}", markdown(&file));
    Ok(path)
}

/// The results file's variant: `quick`, and what `--count`, `--threads` and `--protocols`
/// changed (`n2000`, `t2`, `tern-quic`), so that such runs never overwrite the standard ones.
fn variant(quick: bool, o: &RunOpts) -> String {
    let mut v = Vec::new();
    if quick {
        v.push("quick".to_string());
    }
    if let Some(n) = o.count {
        v.push(format!("n{n}"));
    }
    if let Some(t) = &o.threads {
        v.push(format!(
            "t{}",
            t.iter().map(u32::to_string).collect::<Vec<_>>().join("-")
        ));
    }
    if let Some(p) = &o.protocols {
        v.push(p.iter().map(|p| p.name()).collect::<Vec<_>>().join("-"));
    }
    v.join("-")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The rows of a `scale` run, one per (protocol, test, clients or N, threads), with the
/// ratios of tern's row to quinn's and TLS's of the same test (`_vs_quic`, `_vs_tcp-tls`).
pub fn summarize(run: &RunFile) -> Vec<Row> {
    let mut rows = Vec::new();
    for case in &run.cases {
        let x = &case.extra;
        let mut m = BTreeMap::new();
        match case.params.get("test").and_then(Value::as_str) {
            Some("handshakes") if !x.is_null() => {
                let n = num(&x["handshakes"]);
                m.insert("handshakes".into(), n);
                // Files from before 2026-11-30 have no window count: every completion over
                // the time until the last one.
                let rate = match (x["handshakes_in_window"].as_f64(), x["window_s"].as_f64()) {
                    (Some(w), Some(s)) if s > 0.0 => w / s,
                    _ => n / num(&x["elapsed_s"]),
                };
                m.insert("handshakes_per_s".into(), rate);
                m.insert("errors".into(), num(&x["errors"]));
                m.insert("latency_p50_ms".into(), num(&x["latency_p50_ms"]));
                m.insert("latency_p99_ms".into(), num(&x["latency_p99_ms"]));
                m.insert("server_cpu_s".into(), num(&x["server_cpu_s"]));
                m.insert("client_cpu_s".into(), num(&x["client_cpu_s"]));
                if n > 0.0 {
                    m.insert(
                        "server_cpu_us_per_handshake".into(),
                        1e6 * num(&x["server_cpu_s"]) / n,
                    );
                    m.insert(
                        "client_cpu_us_per_handshake".into(),
                        1e6 * num(&x["client_cpu_s"]) / n,
                    );
                }
            }
            Some("idle") if !x.is_null() => {
                for k in [
                    "opened",
                    "server_accepted",
                    "accept_s",
                    "server_bytes_per_conn",
                    "client_bytes_per_conn",
                    "kernel_slab_bytes_per_conn",
                    "kernel_tcp_mem_bytes_per_conn",
                    "server_live_after_idle",
                    "client_open_after_idle",
                    "server_rss_before",
                    "server_rss_after",
                    "client_rss_before",
                    "client_rss_after",
                    "server_cpu_s",
                ] {
                    m.insert(k.to_string(), num(&x[k]));
                }
                let (acc, s) = (num(&x["server_accepted"]), num(&x["accept_s"]));
                if s > 0.0 {
                    m.insert("accepts_per_s".into(), acc / s);
                }
                let opened = num(&x["opened"]);
                if opened > 0.0 {
                    m.insert(
                        "server_cpu_us_per_accept".into(),
                        1e6 * num(&x["server_cpu_s"]) / opened,
                    );
                }
            }
            _ => {}
        }
        if !x.is_null() {
            for k in ["udp_rcvbuf_errors", "udp_sndbuf_errors", "udp_in_errors"] {
                m.insert(k.to_string(), num(&x[k]));
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
    for base in ["quic", "tcp-tls"] {
        add_ratios(&mut rows, base);
    }
    for r in &mut rows {
        r.metrics.retain(|_, v| v.is_finite());
    }
    rows
}

/// `<metric>_vs_<base>` for the headline metrics: each row over `base`'s row with the same
/// parameters (errors aside).
fn add_ratios(rows: &mut [Row], base: &str) {
    let strip = |r: &Row| {
        let mut p = r.params.clone();
        p.remove("error");
        p
    };
    let bases: Vec<(BTreeMap<String, Value>, BTreeMap<String, f64>)> = rows
        .iter()
        .filter(|r| r.protocol == base)
        .map(|r| (strip(r), r.metrics.clone()))
        .collect();
    for r in rows.iter_mut() {
        let p = strip(r);
        let Some((_, b)) = bases.iter().find(|(k, _)| *k == p) else {
            continue;
        };
        for key in [
            "handshakes_per_s",
            "server_cpu_us_per_handshake",
            "server_bytes_per_conn",
            "client_bytes_per_conn",
            "accept_s",
        ] {
            if let (Some(a), Some(bv)) = (r.metrics.get(key).copied(), b.get(key).copied()) {
                if bv > 0.0 && a.is_finite() && bv.is_finite() {
                    r.metrics.insert(format!("{key}_vs_{base}"), a / bv);
                }
            }
        }
    }
}

fn cell(r: &Row, k: &str, scale: f64, d: usize) -> String {
    match r.metric(k) {
        Some(v) => format!("{:.*}", d, v * scale),
        None => "–".into(),
    }
}

/// The two tables of a `scale` run (docs/BENCHMARKS.md).
pub fn markdown(run: &RunFile) -> String {
    use std::fmt::Write as _;
    let mut m = String::new();
    let _ = writeln!(
        m,
        "**scale on loopback** — {} (kernel {}, {} × {}), {}\n",
        run.date,
        run.machine.kernel,
        run.machine.cpus,
        run.machine.cpu_model,
        if run.quick { "--quick" } else { "full" }
    );
    let rows = &run.summary;
    let text = |r: &Row, k: &str| r.text(k);
    m += "Handshakes per second (client connects, can send, closes; `clients` at once, each sequential), server tokio threads; CPU µs per handshake of the server process; ratios of tern's row:\n\n";
    m += "| threads | clients | protocol | handshakes/s | p50 ms | p99 ms | errors | server CPU µs/hs | client CPU µs/hs | UDP rcvbuf errs | tern/quinn | tern/TLS |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let tern_ratio = |r: &Row, key: &str, base: &str| {
        rows.iter()
            .find(|t| {
                t.protocol == "tern"
                    && t.params.get("test") == r.params.get("test")
                    && t.params.get("clients") == r.params.get("clients")
                    && t.params.get("n") == r.params.get("n")
                    && t.params.get("threads") == r.params.get("threads")
            })
            .map_or("–".into(), |t| {
                cell(t, &format!("{key}_vs_{base}"), 1.0, 2)
            })
    };
    for r in rows.iter().filter(|r| r.text("test") == "handshakes") {
        let first = r.protocol == "tern";
        let _ = writeln!(
            m,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            text(r, "threads"),
            text(r, "clients"),
            if first { "**tern**" } else { &r.protocol },
            if r.params.contains_key("error") {
                " (error)"
            } else {
                ""
            },
            cell(r, "handshakes_per_s", 1.0, 0),
            cell(r, "latency_p50_ms", 1.0, 2),
            cell(r, "latency_p99_ms", 1.0, 2),
            cell(r, "errors", 1.0, 0),
            cell(r, "server_cpu_us_per_handshake", 1.0, 0),
            cell(r, "client_cpu_us_per_handshake", 1.0, 0),
            cell(r, "udp_rcvbuf_errors", 1.0, 0),
            if first {
                tern_ratio(r, "handshakes_per_s", "quic")
            } else {
                String::new()
            },
            if first {
                tern_ratio(r, "handshakes_per_s", "tcp-tls")
            } else {
                String::new()
            },
        );
    }
    m += "\nIdle connections: bytes of RSS per connection at each end (ΔVmRSS / N after the connections sat idle), the kernel's slab and TCP buffer memory per connection (both ends, no RSS shows it), the server's time to accept the N (100 in flight) and its CPU per accepted connection:\n\n";
    m += "| N | protocol | opened | server B/conn | client B/conn | kernel slab B/conn | kernel TCP buf B/conn | accept s | accepts/s | server CPU µs/conn | UDP rcvbuf errs | server B tern/quinn | server B tern/TLS |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows.iter().filter(|r| r.text("test") == "idle") {
        let first = r.protocol == "tern";
        let _ = writeln!(
            m,
            "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            text(r, "n"),
            if first { "**tern**" } else { &r.protocol },
            if r.params.contains_key("error") {
                " (error)"
            } else {
                ""
            },
            cell(r, "opened", 1.0, 0),
            cell(r, "server_bytes_per_conn", 1.0, 0),
            cell(r, "client_bytes_per_conn", 1.0, 0),
            cell(r, "kernel_slab_bytes_per_conn", 1.0, 0),
            cell(r, "kernel_tcp_mem_bytes_per_conn", 1.0, 0),
            cell(r, "accept_s", 1.0, 2),
            cell(r, "accepts_per_s", 1.0, 0),
            cell(r, "server_cpu_us_per_accept", 1.0, 0),
            cell(r, "udp_rcvbuf_errors", 1.0, 0),
            if first {
                tern_ratio(r, "server_bytes_per_conn", "quic")
            } else {
                String::new()
            },
            if first {
                tern_ratio(r, "server_bytes_per_conn", "tcp-tls")
            } else {
                String::new()
            },
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kb() {
        let t = "Name:\ttern-bench\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\nRssAnon:\t  512 kB\n";
        assert_eq!(status_kb(t, "VmRSS"), Some(1024));
        assert_eq!(status_kb(t, "RssAnon"), Some(512));
        assert_eq!(status_kb(t, "Vm"), None);
        assert!(proc_status_kb(std::process::id(), "VmRSS").is_some_and(|kb| kb > 0));
    }

    fn case(proto: &str, params: &[(&str, Value)], extra: Value) -> Case {
        Case {
            protocol: proto.into(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .collect(),
            extra,
            ..Default::default()
        }
    }

    #[test]
    fn rows_and_ratios_come_from_the_same_run() {
        let hs = |p: &str, n: u64| {
            case(
                p,
                &[
                    ("test", json!("handshakes")),
                    ("clients", json!(100)),
                    ("threads", json!(1)),
                ],
                json!({"handshakes": n, "elapsed_s": 2.0, "errors": 0, "server_cpu_s": 1.0,
                       "client_cpu_s": 0.5, "latency_p50_ms": 1.0, "latency_p99_ms": 2.0}),
            )
        };
        let idle = |p: &str, s: f64| {
            case(
                p,
                &[
                    ("test", json!("idle")),
                    ("n", json!(10_000)),
                    ("threads", json!(1)),
                ],
                json!({"opened": 10_000, "server_accepted": 10_000, "accept_s": 4.0,
                       "server_bytes_per_conn": s, "client_bytes_per_conn": 1000.0,
                       "server_cpu_s": 2.0}),
            )
        };
        let mut run = RunFile::new("scale", "loopback", String::new(), true, json!({}), vec![]);
        run.cases = vec![
            hs("tern", 4000),
            hs("quic", 2000),
            hs("tcp-tls", 8000),
            idle("tern", 2000.0),
            idle("quic", 8000.0),
            idle("tcp-tls", 4000.0),
        ];
        let rows = summarize(&run);
        let t = &rows[0].metrics;
        assert_eq!(t["handshakes_per_s"], 2000.0);
        assert_eq!(t["handshakes_per_s_vs_quic"], 2.0);
        assert_eq!(t["handshakes_per_s_vs_tcp-tls"], 0.5);
        assert_eq!(t["server_cpu_us_per_handshake"], 250.0);
        let i = &rows[3].metrics;
        assert_eq!(i["server_bytes_per_conn_vs_quic"], 0.25);
        assert_eq!(i["server_bytes_per_conn_vs_tcp-tls"], 0.5);
        assert_eq!(i["accepts_per_s"], 2500.0);
        assert_eq!(i["server_cpu_us_per_accept"], 200.0);
        let md = markdown(&RunFile {
            summary: rows,
            ..run
        });
        assert!(md.contains("| 1 | 100 | **tern** | 2000 |"), "{md}");
        assert!(md.contains("| – | 2.00 | 0.50 |"), "{md}");
        assert!(
            md.contains("| 10000 | **tern** | 10000 | 2000 | 1000 |"),
            "{md}"
        );
    }
}
