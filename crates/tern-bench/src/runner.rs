//! The collector: builds the network (loopback or a tern-netem topology), starts a server
//! and a client agent per case and protocol, bounds them in time, reads their JSON lines,
//! reads the server's CPU time from /proc and kills it by PID, and adds the emulator's
//! counters. Background traffic and the CPU hog are agents too.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tern_netem::{DelayHistogram, Direction, EmulationConfig, Topology, TopologySpec};

use crate::profile::NetKind;
use crate::results::{Case, CpuUse, EventRecord, FairFlowRun, LinkStat, LinkWindow};
use crate::scenario::{CaseDef, NetEvent};
use crate::spec::{AgentSpec, ClientReport, FlowPlan, Proto, Ready, Role, Work};
use crate::sysinfo;

/// The network the agents run in.
pub struct Net {
    kind: NetKind,
    topo: Option<Topology>,
    logs: PathBuf,
    exe: PathBuf,
    runs: u32,
    /// `--qlog DIR`: tern agents write their connections' qlog files under it.
    qlog: Option<PathBuf>,
}

/// The senders' access rate on the parking lot (DESIGN.md §3: 1024 kbit/s access links):
/// a token bucket (`tc tbf`) on each sender's interface toward its junction. It is above the
/// 660 kbit/s bottlenecks, so it only keeps a sender from bursting faster than its access.
pub const PARKING_LOT_ACCESS_MBPS: f64 = 1.024;

/// A started agent process, killed on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPU seconds (user + system) of a live process, from /proc.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some((utime + stime) / tck)
}

impl Net {
    /// tern agents write qlog files (one per connection) under `dir`.
    pub fn with_qlog(mut self, dir: Option<PathBuf>) -> Self {
        self.qlog = dir;
        self
    }

    /// Builds the network for `kind`; agent logs go to `logs`.
    pub fn new(kind: NetKind, logs: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs)?;
        let topo = match kind {
            NetKind::Loopback => None,
            _ => {
                tern_netem::check_environment().map_err(|e| anyhow!("{e}"))?;
                let spec = match kind {
                    NetKind::Single => TopologySpec::single(),
                    NetKind::Mobile => TopologySpec::mobile(),
                    NetKind::ParkingLot => TopologySpec::parking_lot(),
                    NetKind::Rtts => crate::profile::rtts_topology(),
                    _ => TopologySpec::dual(),
                };
                let topo =
                    Topology::build(&spec).map_err(|e| anyhow!("building the topology: {e}"))?;
                let hosts: Vec<String> = spec
                    .nodes
                    .iter()
                    .filter(|n| n.role == tern_netem::topology::Role::Host)
                    .map(|n| n.name.clone())
                    .collect();
                if kind == NetKind::ParkingLot {
                    let rate = format!("{}kbit", (PARKING_LOT_ACCESS_MBPS * 1e3).round());
                    for (node, dev) in [("src0", "to-j1"), ("src1", "to-j1"), ("src2", "to-j2")] {
                        let out = topo
                            .command(node, "tc")
                            .map_err(|e| anyhow!("{e}"))?
                            .args(["qdisc", "replace", "dev", dev, "root", "tbf", "rate"])
                            .args([rate.as_str(), "burst", "4500", "latency", "100ms"])
                            .output()
                            .context("running tc")?;
                        if !out.status.success() {
                            bail!(
                                "tc tbf on {node} {dev}: {}",
                                String::from_utf8_lossy(&out.stderr).trim()
                            );
                        }
                    }
                }
                for node in &hosts {
                    // The namespace default (used by MPTCP subflows if the per-socket name is
                    // refused); every socket names its controller anyway.
                    let ns = topo.ns(node).map_err(|e| anyhow!("{e}"))?;
                    run_quiet(Command::new("ip").args([
                        "netns",
                        "exec",
                        &ns,
                        "sysctl",
                        "-qw",
                        "net.ipv4.tcp_congestion_control=cubic",
                    ]));
                }
                Some(topo)
            }
        };
        Ok(Self {
            kind,
            topo,
            logs: logs.to_path_buf(),
            exe: std::env::current_exe()?,
            runs: 0,
            qlog: None,
        })
    }

    /// The topology kind.
    pub fn kind(&self) -> NetKind {
        self.kind
    }

    /// A short description for the results file.
    pub fn describe(&self) -> String {
        match &self.topo {
            Some(t) => t.describe(),
            None => "loopback 127.0.0.1".into(),
        }
    }

    /// (Re)starts the emulator with `cfg` (a fresh start resets counters, queues and the
    /// random streams, so every protocol sees the same losses).
    pub fn configure(&self, cfg: Option<&EmulationConfig>) -> anyhow::Result<()> {
        if let (Some(t), Some(cfg)) = (&self.topo, cfg) {
            t.stop();
            t.start(cfg)
                .map_err(|e| anyhow!("starting the emulator: {e}"))?;
        }
        Ok(())
    }

    /// Configures MPTCP's in-kernel path manager: the server announces its second address,
    /// the client accepts one extra subflow to it (which its routing sends over path 2).
    pub fn setup_mptcp(&self) -> anyhow::Result<()> {
        let Some(t) = &self.topo else { return Ok(()) };
        let c = t.ns("c").map_err(|e| anyhow!("{e}"))?;
        let s = t.ns("s").map_err(|e| anyhow!("{e}"))?;
        let run = |args: &[&str]| -> anyhow::Result<()> {
            let out = Command::new("ip").args(args).output()?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                if !err.contains("exists") {
                    bail!("ip {}: {}", args.join(" "), err.trim());
                }
            }
            Ok(())
        };
        run(&[
            "-n",
            &c,
            "mptcp",
            "limits",
            "set",
            "subflows",
            "2",
            "add_addr_accepted",
            "2",
        ])?;
        run(&[
            "-n",
            &s,
            "mptcp",
            "limits",
            "set",
            "subflows",
            "2",
            "add_addr_accepted",
            "2",
        ])?;
        if self.kind == NetKind::Dual {
            let s2 = self.server_ip(1).to_string();
            run(&[
                "-n", &s, "mptcp", "endpoint", "add", &s2, "dev", "to-r2", "signal",
            ])?;
        }
        Ok(())
    }

    /// Server address on path `p` (0-based).
    pub fn server_ip(&self, p: usize) -> IpAddr {
        match &self.topo {
            Some(t) => t
                .addrs("s")
                .ok()
                .and_then(|a| a.get(p).or(a.first()).copied())
                .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4),
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// Client address on path `p`, if the client is multihomed.
    pub fn client_ip(&self, p: usize) -> Option<IpAddr> {
        match (&self.topo, self.kind) {
            (Some(t), NetKind::Dual) => t
                .addrs("c")
                .ok()
                .and_then(|a| a.get(p).copied())
                .map(IpAddr::V4),
            _ => None,
        }
    }

    fn command(&self, node: &str) -> anyhow::Result<Command> {
        Ok(match &self.topo {
            Some(t) => t.command(node, &self.exe).map_err(|e| anyhow!("{e}"))?,
            None => Command::new(&self.exe),
        })
    }

    fn spawn(&mut self, node: &str, spec: &AgentSpec, tag: &str) -> anyhow::Result<Agent> {
        self.runs += 1;
        let log = self
            .logs
            .join(format!("{:04}-{tag}-{}.log", self.runs, spec.proto));
        let mut cmd = self.command(node)?;
        if let (Some(dir), Proto::Tern) = (&self.qlog, spec.proto) {
            // One directory per agent run, named like its log.
            cmd.env(
                tern::QLOG_DIR_ENV,
                dir.join(format!("{:04}-{tag}", self.runs)),
            );
        }
        cmd.arg("agent")
            .arg("--spec")
            .arg(serde_json::to_string(spec)?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&log)?);
        let child = cmd.spawn().context("starting an agent")?;
        Ok(Agent { child, log })
    }

    /// Starts `proto`'s server for `path`; a tern server runs `tern_mode`'s controller (the
    /// sender's controller is what a `--tern-cc` row measures, whichever end sends). An
    /// async server runs `workers` worker threads (`None`: the agent's default).
    fn start_server(
        &mut self,
        proto: Proto,
        path: usize,
        deadline_s: f64,
        tern_mode: &str,
        workers: Option<u32>,
    ) -> anyhow::Result<(Agent, Ready)> {
        self.start_server_on("s", proto, path, deadline_s, tern_mode, workers)
    }

    /// [`Net::start_server`] on `node` (the parking lot's and `rtts`' senders); a node other
    /// than `s` listens on its first address.
    fn start_server_on(
        &mut self,
        node: &str,
        proto: Proto,
        path: usize,
        deadline_s: f64,
        tern_mode: &str,
        workers: Option<u32>,
    ) -> anyhow::Result<(Agent, Ready)> {
        // Kernel TCP/MPTCP servers listen on every address (MPTCP's extra subflow arrives at
        // the server's second address; background flows use both paths). UDP-based servers
        // bind the path's address so replies leave from the address the client talks to.
        // A tern server on two paths listens on every address and advertises the second
        // (a multipath client opens paths to it; a single-path one ignores it).
        let advertise = if proto == Proto::Tern && self.kind == NetKind::Dual {
            vec![self.server_ip(1 - path.min(1))]
        } else {
            vec![]
        };
        let ip = if self.kind == NetKind::Loopback {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else if matches!(
            proto,
            Proto::Tcp | Proto::TcpBbr | Proto::Mptcp | Proto::TcpTls
        ) || !advertise.is_empty()
        {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else if node != "s" {
            self.node_ip(node)?
        } else {
            self.server_ip(path)
        };
        let spec = AgentSpec {
            proto,
            role: Role::Server,
            addr: SocketAddr::new(ip, 0),
            bind: None,
            credential: None,
            work: None,
            deadline_s,
            tern_mode: tern_mode.into(),
            local_ips: vec![],
            advertise,
            workers,
        };
        let mut agent = self.spawn(node, &spec, "server")?;
        let stdout = agent.child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(15))
            .map_err(|_| anyhow!("{proto} server did not start: {}", agent.log_tail()))?;
        let ready: Ready = serde_json::from_str(line.trim())
            .map_err(|e| anyhow!("{proto} server: {e}: {line:?} {}", agent.log_tail()))?;
        Ok((agent, ready))
    }

    fn start_client(
        &mut self,
        spec: &AgentSpec,
        tag: &str,
    ) -> anyhow::Result<(Agent, mpsc::Receiver<String>)> {
        self.start_client_on("c", spec, tag)
    }

    /// The first address of `node`.
    fn node_ip(&self, node: &str) -> anyhow::Result<IpAddr> {
        let t = self.topo.as_ref().context("no topology")?;
        let addrs = t.addrs(node).map_err(|e| anyhow!("{e}"))?;
        addrs
            .first()
            .map(|a| IpAddr::V4(*a))
            .with_context(|| format!("{node} has no address"))
    }

    fn start_client_on(
        &mut self,
        node: &str,
        spec: &AgentSpec,
        tag: &str,
    ) -> anyhow::Result<(Agent, mpsc::Receiver<String>)> {
        let mut agent = self.spawn(node, spec, tag)?;
        let stdout = agent.child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                text = line;
            }
            let _ = tx.send(text);
        });
        Ok((agent, rx))
    }

    /// Runs one protocol on one case: server, client, the case's network events at their
    /// times, collect; then undoes the events (addresses moved back; the emulator, restarted
    /// before the next run, brings links back). Never fails: errors go into the case.
    pub fn run_case(&mut self, proto: Proto, def: &CaseDef, tern_mode: &str, tag: &str) -> Case {
        let started = Instant::now();
        let mut case = empty_case(proto, tern_mode);
        let (path, timeout_s) = (def.path, def.timeout_s);
        let multipath = proto == Proto::Tern
            && (crate::proto::ternp::is_multipath(tern_mode)
                || matches!(&def.work, Work::Transfer(t) if t.multipath));
        let mut extras: Vec<Agent> = Vec::new();
        let mut undo: Vec<Undo> = Vec::new();
        let rcvbuf_before = self.udp_counters();
        let r = (|| -> anyhow::Result<()> {
            if def.background {
                extras.extend(self.start_background(timeout_s + 30.0)?);
            }
            if let Some(load) = def.hog {
                if load > 0.0 {
                    extras.push(self.start_hog(load, timeout_s + 30.0)?);
                }
            }
            let (mut server, ready) =
                self.start_server(proto, path, timeout_s + 30.0, tern_mode, def.workers)?;
            // A multipath tern client, or one that must follow its moves, binds the wildcard
            // address: its first path's source then follows the routes, and it opens its
            // other paths from its other addresses.
            let bind = if def.wildcard_client || multipath {
                None
            } else {
                self.client_ip(path)
            };
            let local_ips = if multipath {
                (0..2)
                    .filter(|p| *p != path)
                    .filter_map(|p| self.client_ip(p))
                    .collect()
            } else {
                vec![]
            };
            let spec = AgentSpec {
                proto,
                role: Role::Client,
                addr: SocketAddr::new(self.server_ip(path), ready.addr.port()),
                bind,
                credential: ready.credential.clone(),
                work: Some(def.work.clone()),
                deadline_s: timeout_s,
                tern_mode: tern_mode.into(),
                local_ips,
                advertise: vec![],
                workers: def.workers,
            };
            let client_started = Instant::now();
            let (mut client, rx) = self.start_client(&spec, tag)?;
            let mut events: Vec<&NetEvent> = def.events.iter().collect();
            events.sort_by_key(|e| e.at_ms());
            let end = client_started + Duration::from_secs_f64(timeout_s + 5.0);
            let mut line = None;
            for e in events {
                let at = client_started + Duration::from_millis(e.at_ms());
                match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(l) => {
                        line = Some(l);
                        break;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                let at_ms = client_started.elapsed().as_secs_f64() * 1e3;
                let (what, result) = self.apply_event(e, proto, &mut undo);
                case.events.push(EventRecord {
                    at_ms,
                    what,
                    error: result.err().map(|e| format!("{e:#}")),
                });
            }
            let line = match line {
                Some(l) => Ok(l),
                None => rx.recv_timeout(end.saturating_duration_since(Instant::now())),
            };
            let server_cpu = proc_cpu_seconds(server.child.id());
            // The server socket's own drops, read in its namespace through its /proc entry.
            case.server_socket_drops =
                sysinfo::udp_socket_drops_of(&server.child.id().to_string(), ready.addr.port());
            server.kill();
            client.kill();
            let line = match line {
                Ok(l) if !l.trim().is_empty() => l,
                _ => bail!(
                    "{proto} client gave no report within {timeout_s:.0} s: {} / server: {}",
                    client.log_tail(),
                    server.log_tail()
                ),
            };
            let report: ClientReport = serde_json::from_str(line.trim())
                .map_err(|e| anyhow!("{proto} client report: {e}"))?;
            case.rpc = report.rpc;
            case.flows = report.flows;
            case.transfer = report.transfer;
            case.extra = report.extra;
            case.client_socket_drops = report.udp_socket_drops;
            case.error = report.error;
            case.cpu = Some(CpuUse {
                client_s: report.cpu_s,
                server_s: server_cpu,
            });
            Ok(())
        })();
        for mut a in extras {
            a.kill();
        }
        if let Err(e) = r {
            case.error = Some(format!("{e:#}"));
        }
        case.links = self.link_stats();
        if let Err(e) = self.undo(undo) {
            case.error
                .get_or_insert(format!("undoing the case's events: {e:#}"));
        }
        if let (Some(before), Some(after)) = (rcvbuf_before, self.udp_counters()) {
            let by_ns: BTreeMap<String, sysinfo::UdpCounters> = after
                .iter()
                .map(|(ns, n)| (ns.clone(), n.since(before.get(ns).unwrap_or(n))))
                .collect();
            let sum = by_ns
                .values()
                .fold(sysinfo::UdpCounters::default(), |a, b| a.add(b));
            case.udp_rcvbuf_errors = Some(sum.rcvbuf_errors);
            case.udp_sndbuf_errors = Some(sum.sndbuf_errors);
            case.udp_in_errors = Some(sum.in_errors);
            case.udp_rcvbuf_errors_by_ns = by_ns
                .iter()
                .map(|(ns, c)| (ns.clone(), c.rcvbuf_errors))
                .collect();
        }
        case.wall_s = started.elapsed().as_secs_f64();
        case
    }

    /// Runs one protocol on a case of concurrent flows (`fairness`): a server per flow on its
    /// sender's node, then each flow's client at its start time, each a time-bounded
    /// backlogged transfer metered at the receiver; collects every report, then kills the
    /// servers. Never fails: errors go into the case (and the flow).
    pub fn run_flows(&mut self, proto: Proto, def: &CaseDef, tern_mode: &str, tag: &str) -> Case {
        let started = Instant::now();
        let mut case = empty_case(proto, tern_mode);
        let r = (|| -> anyhow::Result<()> {
            let multi = def.multi.as_ref().context("a case without flows")?;
            let Work::Transfer(template) = &def.work else {
                bail!("concurrent flows run transfers only");
            };
            // A video sender's transport holds little unacknowledged data, so that its
            // encoder sees frames wait (`proto::video::SEND_BUFFER`); kernel TCP's server
            // sets SO_SNDBUF itself when asked for video.
            let tern_mode = &match (proto, template.video) {
                (Proto::Tern, Some(_)) => {
                    format!("{tern_mode}:sndbuf={}", crate::proto::video::SEND_BUFFER)
                }
                _ => tern_mode.to_string(),
            };
            let mut servers = Vec::new();
            for f in &multi.flows {
                let ip = self.node_ip(&f.server)?;
                let (agent, ready) = self.start_server_on(
                    &f.server,
                    f.proto.unwrap_or(proto),
                    0,
                    def.timeout_s + 30.0,
                    tern_mode,
                    def.workers,
                )?;
                servers.push((agent, ready, ip));
            }
            let mut order: Vec<usize> = (0..multi.flows.len()).collect();
            order.sort_by_key(|&i| multi.flows[i].start_ms);
            let t0 = Instant::now();
            let mut clients = Vec::new();
            for i in order {
                let f = &multi.flows[i];
                std::thread::sleep(
                    (t0 + Duration::from_millis(f.start_ms))
                        .saturating_duration_since(Instant::now()),
                );
                let mut plan = template.clone();
                plan.duration_ms = Some(f.duration_ms);
                plan.timeout_ms = f.duration_ms + 20_000;
                let (_, ready, ip) = &servers[i];
                let spec = AgentSpec {
                    proto: f.proto.unwrap_or(proto),
                    role: Role::Client,
                    addr: SocketAddr::new(*ip, ready.addr.port()),
                    bind: None,
                    credential: ready.credential.clone(),
                    work: Some(Work::Transfer(plan)),
                    deadline_s: f.duration_ms as f64 / 1e3 + 25.0,
                    tern_mode: tern_mode.into(),
                    local_ips: vec![],
                    advertise: vec![],
                    workers: def.workers,
                };
                let start_ms = t0.elapsed().as_secs_f64() * 1e3;
                let (agent, rx) =
                    self.start_client_on(&f.client, &spec, &format!("{tag}-flow{i}"))?;
                clients.push((i, start_ms, agent, rx));
            }
            // The links' bytes and queue waits over the steady part (from the last scheduled
            // start plus the warm-up to the first end, whole seconds; Jain's index in
            // `scenario::fairness_metrics` starts from the actual starts, up to a second
            // later), read at its two ends while the flows run.
            let warm = def
                .params
                .get("warmup_s")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
            let last_start = multi.flows.iter().map(|f| f.start_ms).max().unwrap_or(0);
            let ends = multi.flows.iter().map(|f| f.start_ms + f.duration_ms);
            let first_end = ends.clone().min().unwrap_or(0);
            let from_s = (last_start as f64 / 1e3 + warm).ceil();
            let to_s = (first_end as f64 / 1e3).floor();
            if to_s > from_s {
                let at = |s: f64| t0 + Duration::from_secs_f64(s);
                std::thread::sleep(at(from_s).saturating_duration_since(Instant::now()));
                let before = self.link_counters();
                std::thread::sleep(at(to_s).saturating_duration_since(Instant::now()));
                let after = self.link_counters();
                case.link_windows = after
                    .into_iter()
                    .filter_map(|(link, dir, bytes, waits)| {
                        let (_, _, was, waited) =
                            before.iter().find(|b| b.0 == link && b.1 == dir)?;
                        let waits = waits.since(waited);
                        Some(LinkWindow {
                            link,
                            dir,
                            from_s,
                            to_s,
                            delivered_bytes: bytes.saturating_sub(*was),
                            queue_wait_mean_ms: waits.mean().map(ms),
                            queue_wait_p95_ms: waits.quantile(0.95).map(ms),
                        })
                    })
                    .collect();
            }
            let last_end = ends.max().unwrap_or(0);
            let end = t0 + Duration::from_millis(last_end) + Duration::from_secs(20);
            let mut runs = Vec::new();
            let mut cpu = 0.0;
            for (i, start_ms, mut agent, rx) in clients {
                let f = &multi.flows[i];
                let mut run = FairFlowRun {
                    flow: i as u32,
                    client: f.client.clone(),
                    server: f.server.clone(),
                    start_ms,
                    duration_ms: f.duration_ms,
                    rtt_ms: f.rtt_ms,
                    bottlenecks: f.bottlenecks.clone(),
                    dir: f.dir.into(),
                    protocol: f.proto.map(|p| p.name().to_string()),
                    ..FairFlowRun::default()
                };
                let line = rx.recv_timeout(end.saturating_duration_since(Instant::now()));
                agent.kill();
                match line
                    .ok()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| serde_json::from_str::<ClientReport>(l.trim()))
                {
                    Some(Ok(report)) => {
                        run.transfer = report.transfer;
                        run.error = report.error;
                        cpu += report.cpu_s;
                    }
                    Some(Err(e)) => run.error = Some(format!("{proto} client report: {e}")),
                    None => {
                        run.error = Some(format!(
                            "{proto} client gave no report: {}",
                            agent.log_tail()
                        ))
                    }
                }
                runs.push(run);
            }
            let server_cpu: f64 = servers
                .iter()
                .filter_map(|(a, _, _)| proc_cpu_seconds(a.child.id()))
                .sum();
            for (mut a, _, _) in servers {
                a.kill();
            }
            case.cpu = Some(CpuUse {
                client_s: cpu,
                server_s: Some(server_cpu),
            });
            let errors: Vec<String> = runs
                .iter()
                .filter_map(|r| r.error.as_ref().map(|e| format!("flow {}: {e}", r.flow)))
                .collect();
            if !errors.is_empty() {
                case.error = Some(errors.join("; "));
            }
            case.fair_flows = runs;
            Ok(())
        })();
        if let Err(e) = r {
            case.error = Some(format!("{e:#}"));
        }
        case.links = self.link_stats();
        case.wall_s = started.elapsed().as_secs_f64();
        case
    }

    /// Makes one network change; returns what it did and whether it worked. A move also gives
    /// MPTCP's path manager the new address as a subflow endpoint (that is how the in-kernel
    /// path manager learns of a new interface address).
    fn apply_event(
        &self,
        e: &NetEvent,
        proto: Proto,
        undo: &mut Vec<Undo>,
    ) -> (String, anyhow::Result<()>) {
        let Some(t) = &self.topo else {
            return (
                "(no topology)".into(),
                Err(anyhow!("loopback has no network to change")),
            );
        };
        match e {
            NetEvent::Move {
                node,
                from,
                to,
                dev,
                ..
            } => {
                let what = format!("move {node} {from} -> {to}");
                let r = t
                    .change_address(node, *from, *to)
                    .map_err(|e| anyhow!("{e}"));
                if r.is_ok() {
                    undo.push(Undo::Move {
                        node: node.clone(),
                        from: *from,
                        to: *to,
                    });
                }
                if r.is_ok() && proto == Proto::Mptcp {
                    let ns = match t.ns(node) {
                        Ok(ns) => ns,
                        Err(e) => return (what, Err(anyhow!("{e}"))),
                    };
                    undo.push(Undo::MptcpEndpoints { ns: ns.clone() });
                    let out = Command::new("ip")
                        .args(["-n", &ns, "mptcp", "endpoint", "add"])
                        .arg(to.to_string())
                        .args(["dev", dev, "subflow"])
                        .output();
                    let r = match out {
                        Ok(o) if o.status.success() => Ok(()),
                        Ok(o) => Err(anyhow!(
                            "ip mptcp endpoint add: {}",
                            String::from_utf8_lossy(&o.stderr).trim()
                        )),
                        Err(e) => Err(anyhow!("ip: {e}")),
                    };
                    return (format!("{what} (+ MPTCP subflow endpoint)"), r);
                }
                (what, r)
            }
            NetEvent::LinkDown { link, .. } => {
                let what = format!("down {link}");
                let Some(emu) = t.emulator() else {
                    return (what, Err(anyhow!("no emulator running")));
                };
                let r = [Direction::Up, Direction::Down]
                    .into_iter()
                    .try_for_each(|d| emu.set_up(link, d, false))
                    .map_err(|e| anyhow!("{e}"));
                (what, r)
            }
        }
    }

    /// Undoes a case's events, last first.
    fn undo(&self, undo: Vec<Undo>) -> anyhow::Result<()> {
        let Some(t) = &self.topo else { return Ok(()) };
        for u in undo.into_iter().rev() {
            match u {
                Undo::Move { node, from, to } => t
                    .change_address(&node, to, from)
                    .map_err(|e| anyhow!("{e}"))?,
                Undo::MptcpEndpoints { ns } => {
                    run_quiet(Command::new("ip").args(["-n", &ns, "mptcp", "endpoint", "flush"]));
                }
            }
        }
        Ok(())
    }

    /// The kernel's UDP error counters ([`sysinfo::udp_counters`]: `/proc/net/snmp` `Udp:
    /// RcvbufErrors`, `SndbufErrors`, `InErrors` plus their `/proc/net/snmp6` `Udp6…`
    /// counterparts) per network namespace the agents run in: the
    /// client's (`c`, the data's receiver in flow scenarios) and the server's (`s`) on an
    /// emulated topology, the collector's own (`host`) on loopback, where both agents run.
    /// `None` if a counter cannot be read.
    fn udp_counters(&self) -> Option<BTreeMap<String, sysinfo::UdpCounters>> {
        match &self.topo {
            None => {
                let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
                let snmp6 = std::fs::read_to_string("/proc/net/snmp6").unwrap_or_default();
                let n = sysinfo::udp_counters(&snmp, &snmp6)?;
                Some(BTreeMap::from([("host".to_string(), n)]))
            }
            Some(t) => {
                // /proc/net is the reading process's namespace: read it from inside.
                let read = |node: &str, file: &str| -> Option<String> {
                    let out = t.command(node, "cat").ok()?.arg(file).output().ok()?;
                    out.status
                        .success()
                        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
                };
                ["c", "s"]
                    .into_iter()
                    .map(|node| {
                        let snmp = read(node, "/proc/net/snmp")?;
                        let snmp6 = read(node, "/proc/net/snmp6").unwrap_or_default();
                        Some((node.to_string(), sysinfo::udp_counters(&snmp, &snmp6)?))
                    })
                    .collect()
            }
        }
    }

    /// One bulk TCP (CUBIC) download per path, from the server to the client, until killed.
    fn start_background(&mut self, deadline_s: f64) -> anyhow::Result<Vec<Agent>> {
        let (server, ready) = self.start_server(Proto::Tcp, 0, deadline_s, "flows", None)?;
        let mut agents = vec![server];
        let paths = if self.kind == NetKind::Dual { 2 } else { 1 };
        for p in 0..paths {
            let spec = AgentSpec {
                proto: Proto::Tcp,
                role: Role::Client,
                addr: SocketAddr::new(self.server_ip(p), ready.addr.port()),
                bind: self.client_ip(p),
                credential: None,
                work: Some(Work::Flows(FlowPlan {
                    sizes: vec![vec![u64::MAX]],
                    flow_timeout_ms: (deadline_s * 1e3) as u64,
                })),
                deadline_s,
                tern_mode: "flows".into(),
                local_ips: vec![],
                advertise: vec![],
                workers: None,
            };
            agents.push(self.start_client(&spec, "background")?.0);
        }
        // Let the background flows leave slow start.
        std::thread::sleep(Duration::from_secs(2));
        Ok(agents)
    }

    fn start_hog(&mut self, load: f64, seconds: f64) -> anyhow::Result<Agent> {
        self.runs += 1;
        let log = self.logs.join(format!("{:04}-hog.log", self.runs));
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let child = Command::new(&self.exe)
            .args([
                "agent-hog",
                "--load",
                &load.to_string(),
                "--threads",
                &cpus.to_string(),
            ])
            .args(["--seconds", &seconds.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()?;
        std::thread::sleep(Duration::from_millis(200));
        Ok(Agent { child, log })
    }

    /// Every emulated link direction's delivered bytes and queue-wait histogram so far, to
    /// take a window of a case as the difference of two readings. Delivered bytes are those
    /// the forwarder wrote out (on leaving the link), not the link's count, which takes a
    /// packet in when it enters the queue: a queue fuller at the window's end than at its
    /// start would read as more than the link carried, over 100 % (found by an outside read).
    fn link_counters(&self) -> Vec<(String, String, u64, DelayHistogram)> {
        let Some(emu) = self.topo.as_ref().and_then(|t| t.emulator()) else {
            return Vec::new();
        };
        emu.directions()
            .into_iter()
            .filter_map(|(link, dir)| {
                let s = emu.stats(&link, dir).ok()?;
                let dir = if dir == Direction::Up { "up" } else { "down" };
                Some((link, dir.to_string(), s.written_bytes, s.queue_wait))
            })
            .collect()
    }

    fn link_stats(&self) -> Vec<LinkStat> {
        let Some(t) = &self.topo else {
            return Vec::new();
        };
        let Some(emu) = t.emulator() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (link, dir) in emu.directions() {
            if let Ok(s) = emu.stats(&link, dir) {
                out.push(LinkStat {
                    link: link.clone(),
                    dir: if dir == Direction::Up { "up" } else { "down" }.into(),
                    offered: s.offered,
                    delivered_bytes: s.delivered_bytes,
                    dropped_queue: s.dropped_queue,
                    dropped_loss: s.dropped_loss,
                    dropped_outage: s.dropped_outage,
                    queue_max_bytes: s.max_queue_bytes,
                    queue_delay_mean_ms: s.queue_delay.mean().map(ms),
                    queue_delay_p95_ms: s.queue_delay.quantile(0.95).map(ms),
                    queue_wait_mean_ms: s.queue_wait.mean().map(ms),
                    queue_wait_p95_ms: s.queue_wait.quantile(0.95).map(ms),
                });
            }
        }
        out
    }
}

/// A duration in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What to undo after a case.
enum Undo {
    /// Move a node back.
    Move {
        node: String,
        from: Ipv4Addr,
        to: Ipv4Addr,
    },
    /// Remove the MPTCP endpoints added in a namespace.
    MptcpEndpoints { ns: String },
}

fn run_quiet(cmd: &mut Command) {
    let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// A case with only its results-row name set: the protocol's, or for tern the mode's label
/// (`tern-msg`, `tern-bbr`, …).
fn empty_case(proto: Proto, tern_mode: &str) -> Case {
    let protocol = match proto {
        Proto::Tern => {
            crate::proto::ternp::label_for(tern_mode).unwrap_or_else(|_| proto.name().into())
        }
        _ => proto.name().into(),
    };
    Case {
        protocol,
        ..Case::default()
    }
}
