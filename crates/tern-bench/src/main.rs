//! `tern-bench`: runs benchmark scenarios for every protocol over tern-netem links, writes
//! `results/<scenario>-<profile>.json` and SVG figures, and renders an HTML report.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tern_bench::scenario::{RunOpts, SCENARIOS};
use tern_bench::spec::{AgentSpec, Proto};
use tern_bench::{agent, profile, report};

#[derive(Parser)]
#[command(
    name = "tern-bench",
    version,
    about = "Benchmarks tern against kernel TCP/MPTCP, quinn, UDP, RTP, UDT and SRT over emulated links"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
enum Cmd {
    /// Run a scenario for every protocol (in the same run, over the same emulated link).
    Run {
        /// mar, short-flows, long-flow, bulk, startup, echo-sizes, multipath, handover, robustness, … (`list`).
        scenario: String,
        /// Link profile: 5g, lte, wifi, viscous, path50, startup, multipath, handover, loopback
        /// (default: the scenario's).
        #[arg(long, short)]
        profile: Option<String>,
        /// Random loss in percent on every link and direction (`1` or `1%`). mar runs 0 and 1 %
        /// when not given.
        #[arg(long)]
        loss: Option<String>,
        /// A mahimahi trace replacing the profile's rates (`X.up` + `X.down` pairs are used per
        /// direction). multipath: the trace of path 2 in an extra Wi-Fi + trace case.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// A short version (a few minutes).
        #[arg(long)]
        quick: bool,
        /// Comma-separated protocols (default: the scenario's): tern, tcp, tcp-bbr, tcp-tls,
        /// mptcp, quic, udp, rtp, udt, srt.
        #[arg(long, value_delimiter = ',')]
        protocols: Option<Vec<Proto>>,
        /// Comma-separated RTTs in ms (short-flows; first value for long-flow and startup).
        #[arg(long, value_delimiter = ',')]
        rtt: Option<Vec<f64>>,
        /// Comma-separated thread counts (short-flows; scale: the server's tokio worker
        /// threads; bulk: tern's and quinn's worker threads at each end, default 1,2).
        #[arg(long, value_delimiter = ',')]
        threads: Option<Vec<u32>>,
        /// Comma-separated tern drivers, tern runs once per mode: `flows` (one two-way flow
        /// per request, results row "tern"), `messages` (one message per request and a
        /// reply matched to it, "tern-msg"), `messages:MS` (the same with a per-request
        /// deadline of MS ms, "tern-msg-MSms"), `adaptive:MS` (mar: the client is an encoder
        /// that sizes each 30 Hz frame from tern's target rate, deadline MS ms,
        /// "tern-adaptive-MSms"). Default: messages for mar and echo-sizes, flows elsewhere.
        #[arg(long, value_delimiter = ',')]
        tern_mode: Option<Vec<String>>,
        /// Comma-separated tern congestion controllers (newreno, cubic, and the others
        /// `tern --help` lists): tern runs once per controller and mode, one results row each
        /// ("tern-bbr"). Default: tern's default controller.
        #[arg(long, value_delimiter = ',')]
        tern_cc: Option<Vec<String>>,
        /// Write a qlog file per tern connection (both ends, JSON-SEQ, for qvis) under
        /// DIR/<results file stem>/<agent run>/.
        #[arg(long)]
        qlog: Option<PathBuf>,
        /// Seed of flow sizes and emulator losses.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Requests per size (mar, echo-sizes), flows per thread (short-flows) or idle
        /// connections (scale).
        #[arg(long)]
        count: Option<u32>,
        /// Extra tern-netem settings for every link direction, e.g. "queue=50ms".
        #[arg(long)]
        link: Option<String>,
        /// MAR deadline in ms (mar, cc): a request answered within it is on time; the
        /// on-time fraction counts every request sent (unanswered ones are late).
        #[arg(long, value_name = "MS", default_value_t = tern_bench::scenario::DEFAULT_DEADLINE_MS)]
        deadline: f64,
        /// fairness: the flows' loads, each case once per load: `video` (a 30 fps encoder
        /// following its transport's rate hint; frames that miss a 150 ms playout counted)
        /// and `bulk` (backlogged). Default: video.
        #[arg(long, value_delimiter = ',')]
        load: Option<Vec<String>>,
        /// Output directory.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// Render results/index.html from every results file (and redraw the figures).
    Report {
        /// Results directory.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// Also print Markdown tables (for docs/BENCHMARKS.md).
        #[arg(long)]
        markdown: bool,
    },
    /// List scenarios, profiles and protocols.
    List,
    /// Internal: run one agent (server or client) from a JSON spec.
    #[command(hide = true)]
    Agent {
        #[arg(long)]
        spec: String,
    },
    /// Internal: the tern server of `robustness` (see `tern_bench::robust`).
    #[command(hide = true, name = "agent-robust")]
    AgentRobust {
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Internal: the server of `scale` (see `tern_bench::scale`).
    #[command(hide = true, name = "agent-scale-server")]
    AgentScaleServer {
        #[arg(long)]
        proto: Proto,
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Internal: the client of `scale`.
    #[command(hide = true, name = "agent-scale-client")]
    AgentScaleClient {
        #[arg(long)]
        spec: String,
    },
    /// Internal: burn CPU.
    #[command(hide = true, name = "agent-hog")]
    AgentHog {
        #[arg(long)]
        load: f64,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
    },
}

fn parse_loss(s: &str) -> anyhow::Result<f64> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .context("--loss takes a percentage")?;
    anyhow::ensure!((0.0..=100.0).contains(&v), "--loss must be within 0..100");
    Ok(v)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run {
            scenario,
            profile,
            loss,
            trace,
            quick,
            protocols,
            rtt,
            threads,
            tern_mode,
            tern_cc,
            qlog,
            seed,
            link,
            count,
            deadline,
            load,
            out,
        } => {
            anyhow::ensure!(
                deadline.is_finite() && deadline > 0.0,
                "--deadline takes a positive number of ms"
            );
            let opts = RunOpts {
                scenario,
                profile,
                loss: loss.as_deref().map(parse_loss).transpose()?,
                trace,
                quick,
                protocols,
                rtts: rtt,
                threads,
                tern_mode,
                tern_cc,
                qlog,
                seed,
                link_extra: link,
                count,
                deadline_ms: deadline,
                loads: load,
            };
            tern_bench::run(&opts, &out)?;
        }
        Cmd::Report { out, markdown } => {
            let (path, runs) = tern_bench::report_dir(&out)?;
            eprintln!("wrote {} ({} results file(s))", path.display(), runs.len());
            if markdown {
                for r in &runs {
                    println!("{}", report::markdown(r));
                }
            }
        }
        Cmd::List => {
            println!("Scenarios:");
            for (n, d) in SCENARIOS {
                println!("  {n:12} {d}");
            }
            println!("Profiles:");
            for p in profile::PROFILES {
                println!("  {:12} {}", p.name, p.description);
            }
            println!("Protocols:");
            for p in Proto::ALL {
                match p.unavailable() {
                    Some(why) => println!("  {:12} unavailable: {why}", p.name()),
                    None => println!("  {:12} available", p.name()),
                }
            }
        }
        Cmd::Agent { spec } => {
            let spec: AgentSpec = serde_json::from_str(&spec).context("agent spec")?;
            if let Err(e) = agent::run(&spec) {
                eprintln!("agent failed: {e:#}");
                // A client that fails still reports, so the collector records why.
                if spec.role == tern_bench::spec::Role::Client {
                    println!(
                        "{}",
                        serde_json::json!({"cpu_s": agent::cpu_seconds(), "error": format!("{e:#}")})
                    );
                }
                std::process::exit(1);
            }
        }
        Cmd::AgentRobust { seed } => tern_bench::robust::server_agent(seed)?,
        Cmd::AgentScaleServer { proto, threads } => {
            tern_bench::scale::server_agent(proto, threads)?
        }
        Cmd::AgentScaleClient { spec } => tern_bench::scale::client_agent(&spec)?,
        Cmd::AgentHog {
            load,
            threads,
            seconds,
        } => agent::hog(load, threads, seconds),
    }
    Ok(())
}
