//! `tern-netem`: build a namespace topology, emulate its links, run a command, clean up.

// The command line owns a real clock (run time, stats intervals, scheduled moves).
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::BufWriter;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tern_netem::probe::{self, Report};
use tern_netem::units::{format_rate, parse_duration};
use tern_netem::{
    Direction, DirectionConfig, DuplexConfig, EmulationConfig, Emulator, Topology, TopologySpec,
};

#[derive(Parser)]
#[command(
    name = "tern-netem",
    version,
    about = "Link emulator for real processes: network-namespace topologies plus a user-space \
             forwarder (delay, jitter, loss, rate or mahimahi trace, drop-tail queue)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a topology, start the emulator, run COMMAND (or wait for Ctrl-C), clean up.
    ///
    /// Topologies (emulated links in brackets; up = left to right):
    ///   single:      c 10.77.1.1 — [r] — s 10.77.2.1
    ///   dual:        c 10.77.1.1 — [r1] — s 10.77.2.1 and c 10.77.3.1 — [r2] — s 10.77.4.1
    ///   parking-lot: src0 10.77.1.1, src1 10.77.2.1 — j1 — [b1] — j2 (dst1 10.77.5.1,
    ///                src2 10.77.6.1) — [b2] — j3 — dst0 10.77.9.1, dst2 10.77.10.1
    ///   mobile:      like single; c can move to 10.77.5.1 (--move-at)
    ///
    /// COMMAND runs in the current namespace with TN_NS_<NODE>, TN_ADDR_<NODE> and
    /// TN_ADDRS_<NODE> set (e.g. `ip netns exec $TN_NS_S iperf3 -s`), or inside a node with
    /// --in NODE.
    #[command(verbatim_doc_comment)]
    Up(Box<UpArgs>),
    /// Run a command inside a namespace created by a running tern-netem.
    Exec {
        /// Namespace name, as printed by `up` (e.g. tn1234-0-c).
        ns: String,
        /// The command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Remove namespaces left behind by tern-netem runs that were killed.
    Cleanup,
    /// Measurement tools, meant to run inside the namespaces.
    #[command(subcommand)]
    Probe(ProbeCmd),
}

#[derive(Args)]
struct UpArgs {
    /// single, dual, parking-lot or mobile.
    #[arg(long, short = 't', default_value = "single")]
    topology: String,
    /// One-way propagation delay, every link and direction (e.g. 20ms).
    #[arg(long)]
    delay: Option<String>,
    /// Uniform extra delay 0..=JITTER per packet, never reordering.
    #[arg(long)]
    jitter: Option<String>,
    /// Constant rate (e.g. 10mbit, 660kbit, 1gbit).
    #[arg(long, conflicts_with = "trace")]
    rate: Option<String>,
    /// mahimahi trace file (same file both ways; use --up/--down trace=… for two files).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Random loss (e.g. 1% or 0.01).
    #[arg(long, conflicts_with_all = ["ge", "bursty"])]
    loss: Option<String>,
    /// Gilbert–Elliott loss: P_GOOD_TO_BAD,P_BAD_TO_GOOD[,LOSS_IN_GOOD,LOSS_IN_BAD].
    #[arg(long, conflicts_with = "bursty")]
    ge: Option<String>,
    /// Bursty loss as MEAN_LOSS,MEAN_BURST_PACKETS (Gilbert–Elliott, e.g. 2%,5).
    #[arg(long)]
    bursty: Option<String>,
    /// Outage: dark from AT for FOR, once (AT+FOR, e.g. 5s+2s) or then every EVERY
    /// (AT+FOR/EVERY, e.g. 1s+500ms/10s); times from the emulator's start. Packets arriving or
    /// leaving the queue while dark are dropped.
    #[arg(long, value_name = "AT+FOR[/EVERY]")]
    outage: Option<String>,
    /// Fades: good for an exponential time of mean MEAN_GOOD, then bad for one of mean
    /// MEAN_BAD, and so on; packets are lost with probability LOSS_BAD (default 100%) while
    /// bad (e.g. 2s,50ms). On top of --loss/--ge/--bursty.
    #[arg(long, value_name = "MEAN_GOOD,MEAN_BAD[,LOSS_BAD]")]
    fade: Option<String>,
    /// Drop-tail limit: bytes (100kB, 64KiB), packets (64pkt) or time at the rate (50ms).
    /// Default: 100 ms at the (mean) rate, at least 15 kB.
    #[arg(long)]
    queue: Option<String>,
    /// Reordering: PROBABILITY,EXTRA_DELAY (e.g. 1%,5ms).
    #[arg(long)]
    reorder: Option<String>,
    /// ECN: mark ECN-capable packets CE once the queue holds this much (30kB, 20pkt, 5ms), or
    /// `bleach` / `ect1` to rewrite every packet's ECN bits.
    #[arg(long)]
    ecn: Option<String>,
    /// F12 explicit-rate router on every direction: `ncr` (NC-TCP's rate computation,
    /// tern_proto::router; tuned by ncr_alpha=, ncr_interval=, ncr_rtt=, ncr_cid= in
    /// --up/--down/--set) or `off`.
    #[arg(long)]
    router: Option<String>,
    /// Duplication probability.
    #[arg(long)]
    duplicate: Option<String>,
    /// Corruption probability (one flipped bit).
    #[arg(long)]
    corrupt: Option<String>,
    /// Seed of the random draws (default: derived from link name and direction).
    #[arg(long)]
    seed: Option<u64>,
    /// Extra settings for the up direction of every link, e.g. "trace=x.up,loss=1%".
    #[arg(long = "up", value_name = "SETTINGS")]
    up: Vec<String>,
    /// Extra settings for the down direction of every link.
    #[arg(long = "down", value_name = "SETTINGS")]
    down: Vec<String>,
    /// Settings for one link or direction: LINK:SETTINGS, LINK.up:SETTINGS, LINK.down:…
    /// (e.g. --set r2:delay=40ms,rate=10mbit).
    #[arg(long = "set", value_name = "SCOPE:SETTINGS")]
    set: Vec<String>,
    /// Write the queue length over time to PREFIX-<link>-<dir>.csv (time_ms,bytes,packets).
    #[arg(long, value_name = "PREFIX")]
    queue_log: Option<PathBuf>,
    /// Print per-direction counters at this interval.
    #[arg(long)]
    stats_every: Option<String>,
    /// Stop after this long (the command is killed if still running).
    #[arg(long)]
    duration: Option<String>,
    /// mobile topology: times (since start) at which the client moves between 10.77.1.1 and
    /// 10.77.5.1, e.g. 5s,10s.
    #[arg(long, value_name = "TIMES")]
    move_at: Option<String>,
    /// Keep the forwarder threads in the normal scheduling class (by default they are
    /// real-time, so that other busy processes do not delay packets).
    #[arg(long)]
    no_realtime: bool,
    /// Run COMMAND inside this node instead of the current namespace.
    #[arg(long = "in", value_name = "NODE")]
    in_node: Option<String>,
    /// The command to run while the emulator runs.
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Subcommand)]
enum ProbeCmd {
    /// Echo UDP datagrams back.
    UdpEcho {
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long, default_value = "60s")]
        max: String,
    },
    /// Round-trip times against udp-echo.
    UdpPing {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value_t = 100)]
        count: u64,
        #[arg(long, default_value = "10ms")]
        interval: String,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value = "1s")]
        timeout: String,
    },
    /// Paced UDP sender (sequence number and send time in each datagram).
    UdpSend {
        #[arg(long)]
        to: SocketAddr,
        /// Source address (e.g. 10.77.3.1:0 to use the second path of `dual`).
        #[arg(long)]
        bind: Option<SocketAddr>,
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// UDP payload bytes (1472 makes 1500-byte IP packets).
        #[arg(long, default_value_t = 1472)]
        size: usize,
        /// Packets per second (0 = unpaced).
        #[arg(long, default_value_t = 1000.0)]
        pps: f64,
    },
    /// Counting UDP receiver: loss, one-way delay, delivered bytes.
    UdpRecv {
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long, default_value = "60s")]
        max: String,
        #[arg(long, default_value = "1s")]
        idle: String,
    },
    /// TCP receiver measuring goodput.
    TcpSink {
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long, default_value = "60s")]
        max: String,
        #[arg(long, default_value = "2s")]
        warmup: String,
    },
    /// TCP bulk sender.
    TcpSend {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, default_value = "10s")]
        secs: String,
        /// Congestion control (cubic, bbr, reno).
        #[arg(long)]
        cc: Option<String>,
    },
}

fn dur(s: &str) -> Result<Duration> {
    Ok(parse_duration(s)?)
}

/// Builds the emulation config from the flags.
fn emulation_config(a: &UpArgs, links: &[String]) -> Result<EmulationConfig> {
    let mut base = DirectionConfig::default();
    let flags: [(&str, Option<String>); 15] = [
        ("delay", a.delay.clone()),
        ("jitter", a.jitter.clone()),
        ("rate", a.rate.clone()),
        ("trace", a.trace.as_ref().map(|p| p.display().to_string())),
        ("loss", a.loss.clone()),
        ("ge", a.ge.clone()),
        ("bursty", a.bursty.clone()),
        ("outage", a.outage.clone()),
        ("fade", a.fade.clone()),
        ("queue", a.queue.clone()),
        ("reorder", a.reorder.clone()),
        ("ecn", a.ecn.clone()),
        ("router", a.router.clone()),
        ("duplicate", a.duplicate.clone()),
        ("corrupt", a.corrupt.clone()),
    ];
    for (key, value) in flags {
        if let Some(v) = value {
            base.set(key, &v).with_context(|| format!("--{key} {v}"))?;
        }
    }
    base.seed = a.seed;
    let mut default = DuplexConfig::symmetric(base);
    for s in &a.up {
        default.up.apply(s).with_context(|| format!("--up {s}"))?;
    }
    for s in &a.down {
        default
            .down
            .apply(s)
            .with_context(|| format!("--down {s}"))?;
    }
    let mut cfg = EmulationConfig::uniform(default);
    for s in &a.set {
        let (scope, settings) = s
            .split_once(':')
            .with_context(|| format!("--set {s}: want SCOPE:SETTINGS"))?;
        let (link, dirs) = match scope.split_once('.') {
            Some((l, "up")) => (l, vec![Direction::Up]),
            Some((l, "down")) => (l, vec![Direction::Down]),
            Some((_, d)) => bail!("--set {s}: direction {d:?} is not up or down"),
            None if scope == "up" || scope == "down" => {
                bail!("--set {s}: use --{scope} SETTINGS for every link's {scope} direction")
            }
            None => (scope, Direction::BOTH.to_vec()),
        };
        if !links.iter().any(|l| l == link) {
            bail!(
                "--set {s}: no emulated link {link:?} (links: {})",
                links.join(", ")
            );
        }
        let entry = cfg
            .links
            .entry(link.to_owned())
            .or_insert_with(|| cfg.default.clone());
        for d in dirs {
            entry
                .get_mut(d)
                .apply(settings)
                .with_context(|| format!("--set {s}"))?;
        }
    }
    cfg.queue_trace = a.queue_log.is_some();
    cfg.realtime = !a.no_realtime;
    Ok(cfg)
}

fn print_stats(emu: &Emulator, elapsed: Duration) {
    for (link, dir) in emu.directions() {
        match emu.stats(&link, dir) {
            Ok(s) => {
                let secs = elapsed.as_secs_f64().max(1e-9);
                eprintln!(
                    "tern-netem: {link} {dir:<4}: offered {} pkt, delivered {} ({}), dropped \
                     queue {} loss {} down {} outage {} mtu {}, CE-marked {}, queue now {} B/{} pkt, \
                     max {} B/{} pkt{}",
                    s.offered,
                    s.written,
                    format_rate(s.written_bytes as f64 * 8.0 / secs),
                    s.dropped_queue,
                    s.dropped_loss,
                    s.dropped_down,
                    s.dropped_outage,
                    s.dropped_mtu,
                    s.ce_marked,
                    s.queue_bytes,
                    s.queue_packets,
                    s.max_queue_bytes,
                    s.max_queue_packets,
                    match s.router_rate_bps {
                        Some(r) => format!(
                            ", router: {} per unit weight, {} flows, {} stamped",
                            format_rate(r as f64),
                            s.router_flows,
                            s.rate_stamped
                        ),
                        None => String::new(),
                    }
                );
            }
            Err(e) => eprintln!("tern-netem: {link} {dir}: {e}"),
        }
    }
}

fn write_queue_logs(emu: &Emulator, prefix: &std::path::Path) -> Result<()> {
    for (link, dir) in emu.directions() {
        let samples = emu.queue_trace(&link, dir)?;
        let path = PathBuf::from(format!("{}-{link}-{dir}.csv", prefix.display()));
        let mut out = BufWriter::new(
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?,
        );
        tern_netem::write_queue_csv(&mut out, &samples)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "tern-netem: wrote {} ({} samples)",
            path.display(),
            samples.len()
        );
    }
    Ok(())
}

/// The command run by `up`; killed if `up` leaves early (an error) while it still runs.
struct ChildGuard(Option<std::process::Child>);

impl ChildGuard {
    /// `Some(exit code)` once the command has exited.
    fn exited(&mut self) -> Result<Option<u8>> {
        match &mut self.0 {
            Some(c) => Ok(c
                .try_wait()?
                .map(|status| status.code().map_or(1, |c| c.clamp(0, 255) as u8))),
            None => Ok(None),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Signals received: the first asks the main loop to stop, the second forces cleanup.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

fn up(a: UpArgs) -> Result<u8> {
    let spec = TopologySpec::preset(&a.topology)?;
    let links = spec.links();
    let cfg = emulation_config(&a, &links)?;
    let duration = a.duration.as_deref().map(dur).transpose()?;
    let stats_every = a.stats_every.as_deref().map(dur).transpose()?;
    let mut moves: Vec<Duration> = match &a.move_at {
        Some(list) => list.split(',').map(dur).collect::<Result<_>>()?,
        None => Vec::new(),
    };
    moves.sort();
    if !moves.is_empty() && spec.kind != "mobile" {
        bail!("--move-at needs --topology mobile");
    }
    ctrlc::set_handler(|| {
        if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
            eprintln!("tern-netem: second signal, removing namespaces now");
            tern_netem::teardown_all();
            std::process::exit(130);
        }
    })
    .context("installing the signal handler")?;

    let topo = Topology::build(&spec)?;
    eprint!("tern-netem: {}", topo.describe());
    for link in &links {
        for dir in Direction::BOTH {
            eprintln!("tern-netem: link {link} {dir:<4}: {}", cfg.get(link, dir));
        }
    }
    let emu = topo.start(&cfg)?;
    let start = Instant::now();

    let mut child = ChildGuard(if a.command.is_empty() {
        eprintln!("tern-netem: running; Ctrl-C to stop and remove everything");
        None
    } else {
        let mut c = match &a.in_node {
            Some(node) => {
                let mut c = topo.command(node, &a.command[0])?;
                c.args(&a.command[1..]);
                c
            }
            None => {
                let mut c = Command::new(&a.command[0]);
                c.args(&a.command[1..]);
                c
            }
        };
        c.envs(topo.env());
        Some(
            c.spawn()
                .with_context(|| format!("cannot start {:?}", a.command))?,
        )
    });

    let (home, away) = (Ipv4Addr::new(10, 77, 1, 1), Ipv4Addr::new(10, 77, 5, 1));
    let mut at_home = true;
    let mut next_stats = stats_every.map(|d| start + d);
    let mut exit = 0u8;
    loop {
        if SIGNALS.load(Ordering::SeqCst) > 0 {
            exit = 130;
            break;
        }
        if let Some(code) = child.exited()? {
            exit = code;
            break;
        }
        let now = Instant::now();
        if duration.is_some_and(|d| now - start >= d) {
            break;
        }
        while moves.first().is_some_and(|&t| now - start >= t) {
            moves.remove(0);
            let (from, to) = if at_home { (home, away) } else { (away, home) };
            topo.change_address("c", from, to)?;
            at_home = !at_home;
            eprintln!(
                "tern-netem: {:.3} s: c moved {from} -> {to}",
                (now - start).as_secs_f64()
            );
        }
        if let (Some(t), Some(every)) = (next_stats, stats_every) {
            if now >= t {
                print_stats(&emu, now - start);
                next_stats = Some(t + every);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(child);
    print_stats(&emu, start.elapsed());
    if let Some(prefix) = &a.queue_log {
        write_queue_logs(&emu, prefix)?;
    }
    topo.teardown()?;
    eprintln!("tern-netem: removed all namespaces");
    Ok(exit)
}

/// Whether `ns` was created by a tern-netem process that is still running.
fn registered(ns: &str) -> bool {
    let Ok(dir) = std::fs::read_dir(tern_netem::cleanup::REGISTRY_DIR) else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read_to_string(e.path())
            .map(|t| t.lines().any(|l| l.strip_prefix("ns ") == Some(ns)))
            .unwrap_or(false)
    })
}

fn probe(cmd: ProbeCmd) -> Result<Report> {
    Ok(match cmd {
        ProbeCmd::UdpEcho { bind, max } => probe::udp_echo(bind, dur(&max)?)?,
        ProbeCmd::UdpPing {
            to,
            count,
            interval,
            size,
            timeout,
        } => probe::udp_ping(to, count, dur(&interval)?, size, dur(&timeout)?)?,
        ProbeCmd::UdpSend {
            to,
            bind,
            count,
            size,
            pps,
        } => probe::udp_send(to, bind, count, size, pps)?,
        ProbeCmd::UdpRecv { bind, max, idle } => probe::udp_recv(bind, dur(&max)?, dur(&idle)?)?,
        ProbeCmd::TcpSink { bind, max, warmup } => {
            probe::tcp_sink(bind, dur(&max)?, dur(&warmup)?)?
        }
        ProbeCmd::TcpSend { to, secs, cc } => probe::tcp_send(to, dur(&secs)?, cc.as_deref())?,
    })
}

fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Cmd::Up(a) => up(*a),
        Cmd::Exec { ns, command } => {
            if !registered(&ns) {
                bail!("{ns} is not a namespace of a running tern-netem (see `up`'s output)");
            }
            let err = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(&command)
                .exec();
            bail!("cannot run ip netns exec: {err}")
        }
        Cmd::Cleanup => {
            let removed = tern_netem::cleanup_stale()?;
            if removed.is_empty() {
                eprintln!("tern-netem: nothing to remove");
            } else {
                eprintln!("tern-netem: removed {}", removed.join(" "));
            }
            Ok(0)
        }
        Cmd::Probe(p) => {
            let report = probe(p)?;
            println!("{}", report.line());
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("tern-netem: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
