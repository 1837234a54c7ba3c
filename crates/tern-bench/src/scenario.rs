//! Scenario definitions, independent of any protocol (netbench's split): each scenario says
//! which network and link settings to use, which cases to run, and what workload each case
//! gives the client; the collector runs every case for every protocol; [`summarize`] turns
//! the raw samples into the rows the tables and plots show.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::bail;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use serde_json::{json, Value};

use crate::profile::{self, LinkOptions, NetKind, Profile};
use crate::results::{stats, Case, Row, RpcSample, RunFile, Skipped, TransferSample};
use crate::spec::{FlowPlan, Proto, RpcPlan, TransferPlan, VideoPlan, Work};

/// Scenario names and one-line descriptions.
pub const SCENARIOS: &[(&str, &str)] = &[
    ("mar", "MAR study: 30 Hz requests of 9 sizes (4.5–151.2 kB), 100-byte replies: RTT median/std/p99, jitter, throughput"),
    ("short-flows", "Viscous: 1/5/10/20 threads × 100 back-to-back flows (exponential sizes) on two 50 Mbit/s paths, RTT 16/80/320 ms, ± background TCP: flow completion time"),
    ("long-flow", "Viscous: one transfer of 1 MB–1 GB on one 50 Mbit/s path: completion time"),
    ("bulk", "UDT/SLTP: one transfer on loopback: goodput and CPU seconds per GB"),
    ("startup", "SLTP: 1 MB on 50 Mbit/s / 100 ms: completion vs the ideal"),
    ("echo-sizes", "SLTP: echo round trips of 64 B–1 MB, with a CPU hog at 0–100 % load"),
    ("multipath", "Viscous: 30 s bulk on one path, two equal paths (50 + 50 Mbit/s, 20 ms) and two unequal ones (+ 10 Mbit/s, 80 ms): goodput against one path and the sum"),
    ("handover", "SLTP/Viscous: a 100 MB transfer with a mobility event at 5 s (the client moves, a path goes dark, every address changes, a window-closed handover): bytes lost and the longest stall"),
    ("initwin", "PaUDT: tern's initial window of 8, 16, 32 and 64 packets: completion of 100 kB and 1 MB flows and the sender's RTT, against TCP (IW10)"),
    ("mss", "PaUDT: tern's packet size (MSS 1300, 1500, 9000 bytes): bulk goodput, CPU per byte and the round trip of small requests"),
    ("fairness", "NC-TCP: 3 flows (30 fps video sources following their transport's rate hint, or backlogged with --load bulk) on a 1 Mbit/s, 140 ms bottleneck (together, 15 s apart, RTTs 80/100/120 ms) and a 660 kbit/s parking lot: frames missing a 150 ms playout, Jain's index over time, per-flow throughput, utilisation and queueing delay per bottleneck; tern with explicit-rate routers against tern's end-host controllers and kernel TCP"),
    ("robustness", "Issue 13: a paced 100 Mbit/s transfer into a tern server on loopback under 20 000 junk datagrams/s (garbage, replayed and mutated recorded packets, an IK Initial flood from 253 addresses, forged stateless resets): goodput kept against no attack, data intact, the server's counters and CPU per junk datagram"),
    ("scale", "Issue 12: handshakes per second (one client, 100 concurrent; server on 1 and 2 threads), bytes per idle connection at each end (10 000 and 100 000 connections) and time to accept them: tern, quinn and TCP + TLS 1.3 on loopback"),
    ("coexist", "Beside kernel TCP: one flow of the row's protocol and one kernel TCP CUBIC flow, backlogged, on one bottleneck (lte: 30 Mbit/s, 35 ms) with a deep (2 BDP), a 1/2-BDP and a shallow (1/10 BDP) buffer: each flow's throughput, the row's share, Jain's index, the loss rate at the bottleneck; tern CUBIC with and without its random-loss tolerance, tern BBR and Copa, kernel TCP cubic and bbr"),
    ("cc", "Controller ranking: every tern controller, kernel TCP cubic and bbr, and quinn, on one link: 20 s bulk (throughput, utilisation, queueing delay mean and p95 at the bottleneck) and the MAR request load (p99 RTT)"),
];

/// The `fairness` video workload (NC-TCP's metric): 30 frames per second, each missing if
/// it completes more than 150 ms after it was produced.
pub const VIDEO_FPS: u32 = 30;

/// See [`VIDEO_FPS`].
pub const VIDEO_PLAYOUT_MS: f64 = 150.0;

/// When the mobility event of `handover` happens, ms after the client starts.
pub const HANDOVER_AT_MS: u64 = 5_000;

/// A change the collector makes to the network while a case runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum NetEvent {
    /// `node` moves from address `from` to `to` on interface `dev` (routes follow; sockets
    /// bound to `from` stop working).
    Move {
        /// ms after the client agent starts.
        at_ms: u64,
        /// Node.
        node: String,
        /// Old address.
        from: Ipv4Addr,
        /// New address.
        to: Ipv4Addr,
        /// The interface (for MPTCP's path manager: a subflow from the new address).
        dev: String,
    },
    /// Emulated link `link` drops everything, both ways, for the rest of the case.
    LinkDown {
        /// ms after the client agent starts.
        at_ms: u64,
        /// Link (emulating router) name.
        link: String,
    },
}

impl NetEvent {
    /// When it happens.
    pub fn at_ms(&self) -> u64 {
        match self {
            NetEvent::Move { at_ms, .. } | NetEvent::LinkDown { at_ms, .. } => *at_ms,
        }
    }
}

/// The MAR request sizes: 9 sizes from 4.5 to 151.2 kB, geometrically spaced (the study's
/// exact list is not at hand; its end points are), rounded to 100 bytes.
pub const MAR_SIZES: [u32; 9] = [
    4_500, 7_000, 10_800, 16_800, 26_100, 40_500, 62_800, 97_400, 151_200,
];

/// The frame an adaptive MAR encoder sends (`--tern-mode adaptive:MS`): the largest of
/// `sizes` (its quality levels, ascending) that `rate` (bytes per second) carries in one
/// frame interval of `interval_s`; the smallest when no rate is known yet or none fits (an
/// encoder always sends something: the lowest quality is its floor).
pub fn encoder_frame_size(rate: Option<u64>, interval_s: f64, sizes: &[u32]) -> u32 {
    let smallest = sizes.first().copied().unwrap_or(0);
    let Some(rate) = rate else {
        return smallest;
    };
    let budget = rate as f64 * interval_s;
    sizes
        .iter()
        .copied()
        .filter(|&s| f64::from(s) <= budget)
        .max()
        .unwrap_or(smallest)
}

/// The adaptive MAR encoder (`--tern-mode adaptive:MS`): each frame is the largest quality
/// level that `gain × rate` carries in one frame interval ([`encoder_frame_size`]), `rate` the
/// transport's target rate. The gain (at most 1: never above the transport's rate; 0.5 at
/// first) is cut by
/// [`MarEncoder::BACKOFF`] for every frame that finds an earlier one *late* — unanswered one
/// unloaded round trip plus one frame interval after it left, so queued somewhere — and
/// recovers by [`MarEncoder::RECOVER_PER_S`] per second otherwise.
///
/// Why not the rate alone: a controller's rate estimate trails a radio link's drops by a round
/// trip or more, and every frame sized from the old rate queues behind the one before; on a
/// drive trace half the frames then miss a 150 ms deadline. Backing off as soon as frames
/// queue, as real-time encoders do with their own pushback, keeps the queue near empty.
#[derive(Clone, Debug)]
pub struct MarEncoder {
    gain: f64,
}

impl Default for MarEncoder {
    /// Half the transport's rate at first: a fresh connection's rate is its least certain
    /// (a controller in slow start offers its fastest-growing one), as real-time encoders
    /// start below the rate they are given and climb.
    fn default() -> Self {
        Self {
            gain: Self::START_GAIN,
        }
    }
}

impl MarEncoder {
    /// Per late frame, the gain's cut.
    pub const BACKOFF: f64 = 0.8;
    /// Per second without a late frame, the gain's growth (back up to 1).
    pub const RECOVER_PER_S: f64 = 1.25;
    /// The lowest gain.
    pub const GAIN_MIN: f64 = 0.2;
    /// The first frame's gain.
    pub const START_GAIN: f64 = 0.5;

    /// The next frame's size among `sizes` (ascending) at `rate` bytes per second, one frame
    /// every `interval_s`; `late` = an earlier frame is late (see the type's doc).
    pub fn next_size(
        &mut self,
        rate: Option<u64>,
        interval_s: f64,
        sizes: &[u32],
        late: bool,
    ) -> u32 {
        self.gain = if late {
            (self.gain * Self::BACKOFF).max(Self::GAIN_MIN)
        } else {
            (self.gain * Self::RECOVER_PER_S.powf(interval_s)).min(1.0)
        };
        let rate = rate.map(|r| (r as f64 * self.gain) as u64);
        encoder_frame_size(rate, interval_s, sizes)
    }

    /// The gain now (for tests and logs).
    pub fn gain(&self) -> f64 {
        self.gain
    }
}

/// Reply size of `mar`.
pub const MAR_REPLY: u32 = 100;

/// PaUDT's initial windows, in packets (`initwin`).
pub const INITIAL_WINDOWS: [u32; 4] = [8, 16, 32, 64];

/// PaUDT's packet sizes (`mss`), IP and UDP headers included. PaUDT's 512 is not among them:
/// tern's datagrams are never below 1200 bytes (its handshake padding and amplification
/// limit rest on that), so an MSS under 1228 cannot be asked of it.
pub const MSS_SIZES: [u32; 3] = [1_300, 1_500, 9_000];

/// Echo sizes of `echo-sizes`.
pub const ECHO_SIZES: [u32; 8] = [64, 256, 1_024, 4_096, 16_384, 65_536, 262_144, 1_048_576];

/// What `tern-bench run` was asked.
#[derive(Clone, Debug)]
pub struct RunOpts {
    /// Scenario name.
    pub scenario: String,
    /// Profile name (default: the scenario's).
    pub profile: Option<String>,
    /// Loss in percent (default: the scenario's list).
    pub loss: Option<f64>,
    /// `--trace FILE`.
    pub trace: Option<PathBuf>,
    /// Short version.
    pub quick: bool,
    /// Protocols (default: the scenario's).
    pub protocols: Option<Vec<Proto>>,
    /// RTT list override (ms).
    pub rtts: Option<Vec<f64>>,
    /// Thread-count override (short-flows).
    pub threads: Option<Vec<u32>>,
    /// tern driver mode.
    /// tern driver modes (`flows`, `messages`, `messages:MS`); tern runs once per mode.
    /// `None`: the scenario's default ([`default_tern_modes`]).
    pub tern_mode: Option<Vec<String>>,
    /// tern congestion controllers (`--tern-cc`): every tern mode runs once per controller
    /// (`…:cc=NAME`, results rows `tern-NAME`). `None`: tern's default controller only.
    pub tern_cc: Option<Vec<String>>,
    /// Write tern's qlog files (one per connection and agent run) under this directory,
    /// in a folder named after the results file.
    pub qlog: Option<PathBuf>,
    /// Seed of the flow-size draws and the emulator.
    pub seed: u64,
    /// Extra tern-netem settings for every direction.
    pub link_extra: Option<String>,
    /// Requests per size (mar, echo-sizes) or flows per thread (short-flows), overriding
    /// the quick/full default.
    pub count: Option<u32>,
    /// The deadline of a MAR request (`--deadline MS`): answered within it is on time
    /// ([`on_time`]); mar and cc's MAR load.
    pub deadline_ms: f64,
    /// `fairness`' loads (`--load video,bulk`): each case once per load. `None`: video.
    pub loads: Option<Vec<String>>,
}

/// The MAR study's deadline (DESIGN.md §4): a frame answered more than 150 ms after it was
/// due is useless to an augmented-reality client.
pub const DEFAULT_DEADLINE_MS: f64 = 150.0;

/// On-time delivery of requests: the fraction of every request sent (unanswered ones count
/// as late) answered within `deadline_ms` of its scheduled send time (a reply exactly at the
/// deadline is on time), and the mean size of the requests answered on time (what an
/// adaptive encoder got through; NaN when none was). NaN fraction when nothing was sent.
///
/// The RTT statistics beside it count answered requests only; this counts the rest as
/// failures, so a protocol cannot look good by giving up on its slow requests.
pub fn on_time<'a>(
    samples: impl IntoIterator<Item = &'a RpcSample>,
    deadline_ms: f64,
) -> (f64, f64) {
    let (mut sent, mut on_time, mut bytes) = (0usize, 0usize, 0.0);
    for s in samples {
        sent += 1;
        if s.rtt_ms.is_some_and(|r| r <= deadline_ms) {
            on_time += 1;
            bytes += f64::from(s.size);
        }
    }
    if sent == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = if on_time == 0 {
        f64::NAN
    } else {
        bytes / on_time as f64
    };
    (on_time as f64 / sent as f64, mean)
}

/// The deadline a run's results are judged against (files written before `--deadline`
/// existed: the default).
fn deadline_of(run: &RunFile) -> f64 {
    run.settings
        .get("deadline_ms")
        .and_then(Value::as_f64)
        .unwrap_or(DEFAULT_DEADLINE_MS)
}

/// One case: parameters, link, workload.
#[derive(Clone, Debug)]
pub struct CaseDef {
    /// Parameters recorded with the results.
    pub params: BTreeMap<String, Value>,
    /// Link settings.
    pub link: LinkOptions,
    /// The client's work.
    pub work: Work,
    /// Which path (dual topology).
    pub path: usize,
    /// Background TCP on every path.
    pub background: bool,
    /// CPU hog load (percent).
    pub hog: Option<f64>,
    /// Bound on the client's run.
    pub timeout_s: f64,
    /// Protocols this case is not for (with why).
    pub exclude: Vec<(Proto, String)>,
    /// The network it runs on (the profile's, or another topology for some cases).
    pub net: NetKind,
    /// Changes to the network during the case.
    pub events: Vec<NetEvent>,
    /// The client binds the wildcard address (its source address follows its routes and
    /// moves with it) instead of the path's address.
    pub wildcard_client: bool,
    /// Several concurrent flows instead of one client (`fairness`): `work` is then every
    /// flow's transfer, with each flow's own duration.
    pub multi: Option<MultiFlow>,
    /// Another profile's links for this case (`fairness`' parking lot).
    pub profile: Option<&'static Profile>,
    /// The async agents' (tern's, quinn's) tokio worker threads, each end (`bulk
    /// --threads`); `None`: the agent's default, two.
    pub workers: Option<u32>,
}

/// Concurrent backlogged flows, each a client and a server agent of its own, sharing
/// emulated bottlenecks (`fairness`).
#[derive(Clone, Debug, PartialEq)]
pub struct MultiFlow {
    /// The flows.
    pub flows: Vec<FairFlow>,
    /// The emulated bottlenecks (where `router=ncr` goes for the router row).
    pub bottlenecks: Vec<String>,
}

/// One flow of a [`MultiFlow`].
#[derive(Clone, Debug, PartialEq)]
pub struct FairFlow {
    /// The receiving client's node.
    pub client: String,
    /// The sending server's node.
    pub server: String,
    /// When it starts, ms after the first.
    pub start_ms: u64,
    /// How long it runs.
    pub duration_ms: u64,
    /// Its path's round-trip propagation time (ms).
    pub rtt_ms: f64,
    /// The bottlenecks its data crosses.
    pub bottlenecks: Vec<String>,
    /// Which direction of them the data crosses.
    pub dir: &'static str,
    /// Its protocol when not the row's (`coexist`: the kernel TCP flow beside the row's).
    pub proto: Option<Proto>,
}

impl CaseDef {
    /// A case of `work` on the profile's network, path 1, nothing else going on.
    fn new(params: BTreeMap<String, Value>, link: LinkOptions, work: Work, net: NetKind) -> Self {
        Self {
            params,
            link,
            work,
            path: 0,
            background: false,
            hog: None,
            timeout_s: 60.0,
            exclude: vec![],
            net,
            events: vec![],
            wildcard_client: false,
            multi: None,
            profile: None,
            workers: None,
        }
    }
}

/// A planned run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Scenario name.
    pub scenario: &'static str,
    /// Profile.
    pub profile: &'static Profile,
    /// File name suffix.
    pub variant: String,
    /// Protocols, in order.
    pub protocols: Vec<Proto>,
    /// Cases.
    pub cases: Vec<CaseDef>,
    /// Settings for the results file.
    pub settings: Value,
    /// Protocols left out, with why.
    pub skipped: Vec<Skipped>,
    /// How tern carries requests, one run of tern per mode (see `proto::ternp::TernMode`).
    pub tern_modes: Vec<String>,
    /// tern modes that run with explicit-rate routers (`router=ncr` on every direction of
    /// the case's bottlenecks), results row [`ROUTER_ROW`] (`fairness`).
    pub routed_modes: Vec<String>,
}

/// The results row of tern with explicit-rate routers.
pub const ROUTER_ROW: &str = "tern-ncr";

/// The tern mode of the router row: the sender follows the rate the routers stamp.
pub const ROUTER_MODE: &str = "flows:cc=explicit";

/// The tern-netem setting that makes a bottleneck an explicit-rate router.
pub const ROUTER_SETTING: &str = "router=ncr";

/// Why the router row cannot run in this build (`None`: it can): the emulator or tern
/// refuses `router=ncr` or `cc=explicit` until those branches are merged.
pub fn router_unavailable() -> Option<String> {
    let mut why = Vec::new();
    if let Err(e) = tern_netem::DirectionConfig::default().apply(ROUTER_SETTING) {
        why.push(format!("tern-netem refuses {ROUTER_SETTING}: {e}"));
    }
    if let Err(e) = crate::proto::ternp::TernMode::parse(ROUTER_MODE) {
        why.push(format!("tern refuses {ROUTER_MODE}: {e}"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

impl Plan {
    /// The emulator configuration of one case (`None` on loopback): the profile with the
    /// case's link options, then `seed=SEED` and the `--link` settings on every direction of
    /// every link (later settings override the profile's).
    pub fn emulation(
        &self,
        def: &CaseDef,
        seed: u64,
    ) -> anyhow::Result<Option<tern_netem::EmulationConfig>> {
        self.emulation_routed(def, seed, false)
    }

    /// [`Plan::emulation`], with `router` the case's bottlenecks as explicit-rate routers
    /// (both directions).
    pub fn emulation_routed(
        &self,
        def: &CaseDef,
        seed: u64,
        router: bool,
    ) -> anyhow::Result<Option<tern_netem::EmulationConfig>> {
        let mut link = def.link.clone();
        let seed = format!("seed={seed}");
        link.extra = Some(match link.extra {
            Some(x) => format!("{seed} {x}"),
            None => seed,
        });
        if let (true, Some(m)) = (router, &def.multi) {
            for b in &m.bottlenecks {
                link.links.push((b.clone(), ROUTER_SETTING.into()));
            }
        }
        def.profile.unwrap_or(self.profile).emulation(&link)
    }
}

/// The MAR study's request load: 30 Hz requests of the nine sizes, `per_size` each, 100-byte
/// replies, then `drain_ms` for the last answers.
fn mar_plan(per_size: u32, drain_ms: u64) -> RpcPlan {
    RpcPlan {
        sizes: MAR_SIZES.to_vec(),
        per_size,
        interval_ms: Some(1000.0 / 30.0),
        reply: Some(MAR_REPLY),
        drain_ms,
    }
}

/// The names of every built-in tern controller.
fn tern_proto_names() -> Vec<String> {
    tern::cc::Algorithm::ALL
        .iter()
        .map(|a| a.name().to_string())
        .collect()
}

/// Every mode once per controller in `controllers` (`flows` × `bbr,copa` → `flows:cc=bbr`,
/// `flows:cc=copa`); the modes unchanged without controllers.
pub fn with_controllers(modes: Vec<String>, controllers: Option<&[String]>) -> Vec<String> {
    match controllers {
        None | Some([]) => modes,
        Some(ccs) => modes
            .iter()
            .flat_map(|m| ccs.iter().map(move |cc| format!("{m}:cc={cc}")))
            .collect(),
    }
}

/// tern's default modes: messages for the request/response workloads they were made for
/// (mar, echo-sizes), one flow per request or transfer elsewhere.
pub fn default_tern_modes(scenario: &str) -> Vec<String> {
    match scenario {
        // cc: reliable messages for its MAR load (its bulk load is one flow in any mode).
        "mar" | "echo-sizes" | "cc" => vec!["messages".into()],
        // PaUDT's sweeps: tern once per setting.
        "initwin" => INITIAL_WINDOWS
            .iter()
            .map(|iw| format!("flows:iw={iw}"))
            .collect(),
        "mss" => MSS_SIZES.iter().map(|m| format!("flows:mss={m}")).collect(),
        // tern on path 1, as the others, and tern on both paths (row `tern-mp`).
        "short-flows" => vec!["flows".into(), "flows:multipath".into()],
        // (multipath and handover say per case whether tern uses every path)
        _ => vec!["flows".into()],
    }
}

fn params(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

fn default_protocols(scenario: &str) -> Vec<Proto> {
    use Proto::*;
    match scenario {
        "mar" => vec![Tern, Tcp, Quic, Udp, Rtp, Udt, Srt],
        "short-flows" => vec![Tern, Tcp, Mptcp, Quic],
        "long-flow" => vec![Tern, Tcp, Quic, Udt, Srt],
        "bulk" => vec![Tern, Tcp, TcpTls, Quic, Udp, Udt, Srt],
        "startup" => vec![Tern, Tcp, Quic, Udt, Srt],
        "echo-sizes" => vec![Tern, Tcp, TcpTls, Quic, Udp, Udt, Srt],
        "multipath" => vec![Tern, Tcp, Mptcp],
        "handover" => vec![Tern, Mptcp, Quic, Tcp],
        "cc" => vec![Tern, Tcp, TcpBbr, Quic],
        "fairness" | "coexist" => vec![Tern, Tcp, TcpBbr],
        "initwin" => vec![Tern, Tcp, Quic],
        "mss" => vec![Tern, Tcp],
        _ => vec![],
    }
}

fn default_profile(scenario: &str) -> &'static str {
    match scenario {
        "mar" => "lte",
        "short-flows" => "viscous",
        "long-flow" => "path50",
        "bulk" | "echo-sizes" => "loopback",
        "startup" | "initwin" => "startup",
        "mss" => "loopback",
        "multipath" => "multipath",
        "handover" => "handover",
        "fairness" => "ncvdn",
        _ => "lte",
    }
}

/// Plans a run.
pub fn plan(o: &RunOpts) -> anyhow::Result<Plan> {
    let Some(&(scenario, _)) = SCENARIOS.iter().find(|(n, _)| *n == o.scenario) else {
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.0).collect();
        bail!(
            "unknown scenario {:?}; known: {}",
            o.scenario,
            names.join(", ")
        );
    };
    let profile = profile::profile(o.profile.as_deref().unwrap_or(default_profile(scenario)))?;
    match (scenario, profile.net) {
        ("short-flows" | "multipath", n) if n != NetKind::Dual => {
            bail!("{scenario} needs a two-path profile (viscous, multipath)")
        }
        ("handover", n) if n != NetKind::Mobile => {
            bail!("handover needs a mobile profile (handover)")
        }
        ("bulk", n) if n != NetKind::Loopback => {
            bail!("bulk runs on loopback only (--profile loopback)")
        }
        (s, NetKind::Dual) if s != "short-flows" && s != "multipath" => {
            bail!("{s} runs on one path; use a single-path profile")
        }
        (s, NetKind::Mobile) if s != "handover" => {
            bail!("{s} does not move the client; use a single-path profile")
        }
        ("coexist", n) if n != NetKind::Single => {
            bail!("coexist needs a single-bottleneck profile (lte, 5g, wifi, path50, ncvdn)")
        }
        ("fairness", n) if n != NetKind::Single => bail!(
            "fairness needs a single-bottleneck profile (ncvdn); its parking-lot case uses the parking-lot profile by itself"
        ),
        (s, NetKind::ParkingLot | NetKind::Rtts) => {
            bail!("{s} runs on one path between c and s; the parking lot is fairness' own")
        }
        _ => {}
    }
    let trace = match &o.trace {
        Some(t) => Some(profile::trace_pair(t)?),
        None => None,
    };
    if profile.net == NetKind::Loopback {
        // Nothing emulates loopback: these would be ignored, yet name the results file.
        for (given, what) in [
            (trace.is_some(), "--trace"),
            (o.link_extra.is_some(), "--link"),
            (o.loss.is_some(), "--loss"),
        ] {
            if given {
                bail!(
                    "{what} needs an emulated profile ({} is loopback)",
                    profile.name
                );
            }
        }
    }
    let losses: Vec<f64> = match (o.loss, scenario) {
        (Some(l), _) => vec![l],
        (None, "mar") => vec![0.0, 1.0],
        (None, _) => vec![0.0],
    };
    let mut variant = Vec::new();
    if let Some(l) = o.loss {
        variant.push(format!("loss{l}"));
    }
    if let Some(t) = &o.trace {
        let name = t
            .file_stem()
            .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
        variant.push(format!("trace-{name}"));
    }
    if let Some(extra) = &o.link_extra {
        // Runs with different link settings must not overwrite each other's results.
        variant.push(link_slug(extra));
    }
    let link = |loss: f64, rtt: Option<f64>| LinkOptions {
        loss_pct: loss,
        rtt_ms: rtt,
        trace: trace.clone(),
        extra: o.link_extra.clone(),
        links: vec![],
        link_traces: vec![],
    };
    let q = o.quick;
    let mut cases = Vec::new();
    // `cc` ranks every built-in controller unless told which.
    let every_controller: Vec<String> = tern_proto_names();
    let controllers = match (&o.tern_cc, scenario) {
        (Some(list), _) => Some(list.as_slice()),
        (None, "cc") => Some(every_controller.as_slice()),
        (None, _) => None,
    };
    let mut tern_modes = with_controllers(
        o.tern_mode
            .clone()
            .unwrap_or_else(|| default_tern_modes(scenario)),
        controllers,
    );
    let mut routed_modes = Vec::new();
    let mut skipped = Vec::new();
    if scenario == "fairness" && o.tern_mode.is_none() && o.tern_cc.is_none() {
        // The router row, then tern's end-host controllers (routers off); the quick form
        // leaves out the two that add least (UDT's and NewReno's rate laws).
        let ccs: &[&str] = if q {
            &["cubic", "bbr", "copa"]
        } else {
            &["cubic", "bbr", "copa", "udt", "newreno"]
        };
        tern_modes = ccs.iter().map(|cc| format!("flows:cc={cc}")).collect();
        match router_unavailable() {
            None => {
                tern_modes.insert(0, ROUTER_MODE.into());
                routed_modes.push(ROUTER_MODE.to_string());
            }
            Some(reason) => skipped.push(Skipped {
                protocol: ROUTER_ROW.into(),
                reason,
            }),
        }
    }
    if scenario == "coexist" && o.tern_mode.is_none() && o.tern_cc.is_none() {
        // tern's default (CUBIC with the random-loss tolerance), the same without it, and
        // the two controllers that ignore isolated losses by design.
        tern_modes = [
            "flows:cc=cubic",
            "flows:cc=cubic:tolerance=off",
            "flows:cc=bbr",
            "flows:cc=copa",
        ]
        .map(String::from)
        .to_vec();
    }
    for m in &tern_modes {
        let mode = crate::proto::ternp::TernMode::parse(m).map_err(|e| anyhow::anyhow!(e))?;
        if matches!(mode, crate::proto::ternp::TernMode::Adaptive { .. }) && scenario != "mar" {
            bail!("--tern-mode {m}: the adaptive encoder runs in mar only (its 30 Hz frames are the MAR load)");
        }
    }
    let mut settings = json!({
        "profile": profile,
        "losses_pct": losses,
        "trace": o.trace,
        "link_extra": o.link_extra,
        "seed": o.seed,
        "tern_mode": tern_modes,
        "count": o.count,
    });
    match scenario {
        "mar" => {
            let per_size = o.count.unwrap_or(if q { 30 } else { 300 });
            let plan = mar_plan(per_size, if q { 1_500 } else { 5_000 });
            let phase_s = f64::from(per_size) / 30.0 + plan.drain_ms as f64 / 1e3 + 2.0;
            settings["rpc"] = serde_json::to_value(&plan)?;
            settings["deadline_ms"] = json!(o.deadline_ms);
            for &loss in &losses {
                cases.push(CaseDef {
                    params: params(&[("loss", json!(loss))]),
                    link: link(loss, None),
                    work: Work::Rpc(plan.clone()),
                    path: 0,
                    background: false,
                    hog: None,
                    timeout_s: phase_s * MAR_SIZES.len() as f64 + 20.0,
                    exclude: vec![],
                    net: profile.net,
                    events: vec![],
                    wildcard_client: false,
                    multi: None,
                    profile: None,
                    workers: None,
                });
            }
        }
        "short-flows" => {
            let threads =
                o.threads
                    .clone()
                    .unwrap_or(if q { vec![1, 10] } else { vec![1, 5, 10, 20] });
            let rtts = o.rtts.clone().unwrap_or(if q {
                vec![80.0]
            } else {
                vec![16.0, 80.0, 320.0]
            });
            let flows = o.count.unwrap_or(if q { 20 } else { 100 });
            let mean = 100_000.0;
            settings["flows_per_thread"] = json!(flows);
            settings["size_distribution"] = json!({"kind": "exponential", "mean_bytes": mean, "min_bytes": 1000, "max_bytes": 2_000_000});
            settings["threads"] = json!(threads);
            settings["rtts_ms"] = json!(rtts);
            for &rtt in &rtts {
                for &bg in &[false, true] {
                    for &t in &threads {
                        let mut rng =
                            rand_chacha::ChaCha8Rng::seed_from_u64(o.seed ^ u64::from(t) << 8);
                        let exp = Exp::new(1.0 / mean).expect("positive rate");
                        let sizes: Vec<Vec<u64>> = (0..t)
                            .map(|_| {
                                (0..flows)
                                    .map(|_| (exp.sample(&mut rng) as u64).clamp(1_000, 2_000_000))
                                    .collect()
                            })
                            .collect();
                        let flow_timeout_ms = if q { 30_000 } else { 60_000 };
                        let expect_s =
                            f64::from(flows) * (8.0 * rtt / 1e3 + 0.5) * if bg { 3.0 } else { 1.5 };
                        cases.push(CaseDef {
                            params: params(&[
                                ("rtt_ms", json!(rtt)),
                                ("background", json!(bg)),
                                ("threads", json!(t)),
                            ]),
                            link: link(losses[0], Some(rtt)),
                            work: Work::Flows(FlowPlan {
                                sizes,
                                flow_timeout_ms,
                            }),
                            path: 0,
                            background: bg,
                            hog: None,
                            timeout_s: expect_s.max(60.0) + 30.0,
                            exclude: vec![],
                            net: profile.net,
                            events: vec![],
                            wildcard_client: false,
                            multi: None,
                            profile: None,
                            workers: None,
                        });
                    }
                }
            }
        }
        "long-flow" => {
            let sizes: Vec<u64> = if q {
                vec![1_000_000, 10_000_000]
            } else {
                vec![1_000_000, 10_000_000, 100_000_000, 1_000_000_000]
            };
            settings["sizes"] = json!(sizes);
            let rate = profile.down_mbps.unwrap_or(50.0);
            for &size in &sizes {
                let ideal_s = size as f64 * 8.0 / (rate * 1e6);
                let flow_timeout_ms = ((ideal_s * 4.0 + 30.0) * 1e3) as u64;
                cases.push(CaseDef {
                    params: params(&[("size", json!(size))]),
                    link: link(losses[0], o.rtts.as_ref().and_then(|r| r.first().copied())),
                    work: Work::Flows(FlowPlan {
                        sizes: vec![vec![size]],
                        flow_timeout_ms,
                    }),
                    path: 0,
                    background: false,
                    hog: None,
                    timeout_s: flow_timeout_ms as f64 / 1e3 + 10.0,
                    exclude: vec![],
                    net: profile.net,
                    events: vec![],
                    wildcard_client: false,
                    multi: None,
                    profile: None,
                    workers: None,
                });
            }
        }
        "bulk" => {
            let size: u64 = if q { 256 << 20 } else { 1 << 30 };
            let reps = if q { 1 } else { 3 };
            // The async agents' worker threads per end. One is the like-for-like comparison
            // with the stream transports' agents (a thread per connection) and gives each end
            // one of this machine's two cores; two shows what a second worker does when both
            // ends share them (issue 12's multi-core row).
            let threads = o.threads.clone().unwrap_or(vec![1, 2]);
            if threads.contains(&0) {
                bail!("bulk: --threads takes worker counts of at least 1");
            }
            settings["size"] = json!(size);
            settings["threads"] = json!(threads);
            for (rep, &t) in (0..reps).flat_map(|r| threads.iter().map(move |t| (r, t))) {
                cases.push(CaseDef {
                    params: params(&[
                        ("size", json!(size)),
                        ("threads", json!(t)),
                        ("rep", json!(rep)),
                    ]),
                    link: LinkOptions::default(),
                    work: Work::Flows(FlowPlan {
                        sizes: vec![vec![size]],
                        flow_timeout_ms: 120_000,
                    }),
                    path: 0,
                    background: false,
                    hog: None,
                    timeout_s: 130.0,
                    exclude: vec![],
                    net: profile.net,
                    events: vec![],
                    wildcard_client: false,
                    multi: None,
                    profile: None,
                    workers: Some(t),
                });
            }
        }
        "startup" => {
            let size: u64 = 1_000_000;
            let reps = if q { 3 } else { 10 };
            settings["size"] = json!(size);
            let rtt = o.rtts.as_ref().and_then(|r| r.first().copied());
            for rep in 0..reps {
                let mut p = params(&[("size", json!(size)), ("rep", json!(rep))]);
                if let Some(rtt) = rtt {
                    // The ideal's RTT is the link's (an `--rtt` override included).
                    p.insert("rtt_ms".into(), json!(rtt));
                }
                cases.push(CaseDef {
                    params: p,
                    link: link(losses[0], rtt),
                    work: Work::Flows(FlowPlan {
                        sizes: vec![vec![size]],
                        flow_timeout_ms: 30_000,
                    }),
                    path: 0,
                    background: false,
                    hog: None,
                    timeout_s: 40.0,
                    exclude: vec![],
                    net: profile.net,
                    events: vec![],
                    wildcard_client: false,
                    multi: None,
                    profile: None,
                    workers: None,
                });
            }
        }
        "echo-sizes" => {
            let loads: Vec<f64> = if q {
                vec![0.0, 100.0]
            } else {
                vec![0.0, 25.0, 50.0, 75.0, 100.0]
            };
            let per_size = o.count.unwrap_or(if q { 30 } else { 200 });
            let plan = RpcPlan {
                sizes: ECHO_SIZES.to_vec(),
                per_size,
                interval_ms: None,
                reply: None,
                drain_ms: 2_000,
            };
            settings["rpc"] = serde_json::to_value(&plan)?;
            settings["loads_pct"] = json!(loads);
            for &load in &loads {
                cases.push(CaseDef {
                    params: params(&[("load", json!(load))]),
                    link: link(losses[0], None),
                    work: Work::Rpc(plan.clone()),
                    path: 0,
                    background: false,
                    hog: Some(load),
                    timeout_s: 120.0 + f64::from(per_size) * 8.0 * 0.05,
                    exclude: vec![],
                    net: profile.net,
                    events: vec![],
                    wildcard_client: false,
                    multi: None,
                    profile: None,
                    workers: None,
                });
            }
        }
        "multipath" => {
            let secs: u64 = if q { 10 } else { 30 };
            settings["duration_s"] = json!(secs);
            // (name, tern on every path, per-link settings, per-link traces, nominal sum)
            type Variant = (
                &'static str,
                bool,
                Vec<(String, String)>,
                Vec<(String, (PathBuf, PathBuf))>,
                f64,
            );
            let rate = profile.down_mbps.unwrap_or(50.0);
            let mut variants: Vec<Variant> = vec![
                ("one", false, vec![], vec![], rate),
                ("equal", true, vec![], vec![], 2.0 * rate),
                (
                    "unequal",
                    true,
                    vec![("r2".into(), "delay=40ms rate=10mbit".into())],
                    vec![],
                    rate + 10.0,
                ),
            ];
            if let Some(t) = &trace {
                // Wi-Fi on path 1 (the `wifi` profile's rate and RTT), the trace on path 2
                // (5G: 15 ms RTT).
                let sum = 100.0 + crate::profile::trace_mean_mbps(&t.1).unwrap_or(0.0);
                variants.push((
                    "wifi+trace",
                    true,
                    vec![
                        ("r1".into(), "delay=2.5ms rate=100mbit".into()),
                        ("r2".into(), "delay=7.5ms".into()),
                    ],
                    vec![("r2".into(), t.clone())],
                    sum,
                ));
            }
            let single = "a single-path protocol: its row is paths=one".to_string();
            for (name, multipath, links, traces, sum) in variants {
                let mut lo = link(losses[0], None);
                lo.trace = None;
                lo.links = links;
                lo.link_traces = traces;
                let mut def = CaseDef::new(
                    params(&[
                        ("paths", json!(name)),
                        ("sum_mbps", json!((sum * 10.0).round() / 10.0)),
                        ("duration_s", json!(secs)),
                    ]),
                    lo,
                    Work::Transfer(TransferPlan {
                        size: u64::MAX,
                        duration_ms: Some(secs * 1000),
                        timeout_ms: (secs + 20) * 1000,
                        multipath,
                        window_ms: None,
                        follow_address: false,
                        resume_after_ms: None,
                        bin_ms: 100,
                        event_at_ms: None,
                        video: None,
                    }),
                    profile.net,
                );
                def.timeout_s = secs as f64 + 30.0;
                if multipath {
                    for p in [
                        Proto::Tcp,
                        Proto::TcpBbr,
                        Proto::TcpTls,
                        Proto::Quic,
                        Proto::Udt,
                        Proto::Srt,
                    ] {
                        def.exclude.push((p, single.clone()));
                    }
                } else {
                    def.exclude.push((
                        Proto::Mptcp,
                        "one path: MPTCP is measured on two (paths=equal, unequal)".into(),
                    ));
                }
                cases.push(def);
            }
        }
        "handover" => {
            let size: u64 = if q { 40_000_000 } else { 100_000_000 };
            let at = HANDOVER_AT_MS;
            settings["size"] = json!(size);
            settings["event_at_ms"] = json!(at);
            let rate = profile.down_mbps.unwrap_or(20.0);
            let rtt = profile.rtt(&link(0.0, None));
            // Time for the whole transfer on one path, with room for a stall.
            let timeout_s = size as f64 * 8.0 / (rate * 1e6) * 1.5 + 20.0;
            let ip = Ipv4Addr::new;
            let mv = |from: Ipv4Addr, to: Ipv4Addr, dev: &str| NetEvent::Move {
                at_ms: at,
                node: "c".into(),
                from,
                to,
                dev: dev.into(),
            };
            let no_window = "no application-controlled receive window".to_string();
            // (event, network, tern on every path, events, window)
            type Event = (
                &'static str,
                NetKind,
                bool,
                Vec<NetEvent>,
                Option<(u64, u64)>,
            );
            let events: Vec<Event> = vec![
                (
                    "rebind",
                    NetKind::Mobile,
                    false,
                    vec![mv(ip(10, 77, 1, 1), ip(10, 77, 5, 1), "to-r")],
                    None,
                ),
                (
                    "window",
                    NetKind::Mobile,
                    false,
                    vec![mv(ip(10, 77, 1, 1), ip(10, 77, 5, 1), "to-r")],
                    Some((at - 200, at + 300)),
                ),
                (
                    "blackhole",
                    NetKind::Dual,
                    true,
                    vec![NetEvent::LinkDown {
                        at_ms: at,
                        link: "r1".into(),
                    }],
                    None,
                ),
                (
                    "all-move",
                    NetKind::Dual,
                    true,
                    vec![
                        mv(ip(10, 77, 1, 1), ip(10, 77, 1, 77), "to-r1"),
                        mv(ip(10, 77, 3, 1), ip(10, 77, 3, 77), "to-r2"),
                    ],
                    None,
                ),
            ];
            for (name, net, multipath, evs, window) in events {
                let mut def = CaseDef::new(
                    params(&[
                        ("event", json!(name)),
                        ("size", json!(size)),
                        ("stall_target_ms", json!(rtt + 50.0)),
                    ]),
                    link(losses[0], None),
                    Work::Transfer(TransferPlan {
                        size,
                        duration_ms: None,
                        timeout_ms: (timeout_s * 1e3) as u64,
                        multipath,
                        window_ms: window,
                        follow_address: true,
                        resume_after_ms: Some(1_000),
                        bin_ms: 50,
                        event_at_ms: Some(at),
                        video: None,
                    }),
                    net,
                );
                def.events = evs;
                def.wildcard_client = true;
                def.timeout_s = timeout_s + 10.0;
                if window.is_some() {
                    for p in Proto::ALL.into_iter().filter(|p| *p != Proto::Tern) {
                        def.exclude.push((p, no_window.clone()));
                    }
                }
                cases.push(def);
            }
        }
        "initwin" => {
            let reps = if q { 3 } else { 10 };
            let sizes: [u64; 2] = [100_000, 1_000_000];
            settings["sizes"] = json!(sizes);
            settings["initial_windows"] = json!(INITIAL_WINDOWS);
            let rtt = o.rtts.as_ref().and_then(|r| r.first().copied());
            for size in sizes {
                for rep in 0..reps {
                    let mut p = params(&[("size", json!(size)), ("rep", json!(rep))]);
                    if let Some(rtt) = rtt {
                        p.insert("rtt_ms".into(), json!(rtt));
                    }
                    cases.push(CaseDef::new(
                        p,
                        link(losses[0], rtt),
                        Work::Flows(FlowPlan {
                            sizes: vec![vec![size]],
                            flow_timeout_ms: 30_000,
                        }),
                        profile.net,
                    ));
                }
            }
            for c in &mut cases {
                c.timeout_s = 40.0;
            }
        }
        "mss" => {
            // Bulk (goodput, CPU per byte) and closed-loop round trips of small and
            // medium requests, per packet size.
            let bulk: u64 = if profile.net == NetKind::Loopback {
                if q {
                    256 << 20
                } else {
                    1 << 30
                }
            } else if q {
                20_000_000
            } else {
                100_000_000
            };
            settings["bulk_size"] = json!(bulk);
            settings["mss"] = json!(MSS_SIZES);
            let mut def = CaseDef::new(
                params(&[("load", json!("bulk")), ("size", json!(bulk))]),
                link(losses[0], None),
                Work::Flows(FlowPlan {
                    sizes: vec![vec![bulk]],
                    flow_timeout_ms: 120_000,
                }),
                profile.net,
            );
            def.timeout_s = 130.0;
            cases.push(def);
            let plan = RpcPlan {
                sizes: vec![1_024, 16_384, 65_536],
                per_size: o.count.unwrap_or(if q { 30 } else { 200 }),
                interval_ms: None,
                reply: None,
                drain_ms: 2_000,
            };
            settings["rpc"] = serde_json::to_value(&plan)?;
            let mut def = CaseDef::new(
                params(&[("load", json!("echo"))]),
                link(losses[0], None),
                Work::Rpc(plan),
                profile.net,
            );
            def.timeout_s = 120.0;
            cases.push(def);
        }
        "cc" => {
            let secs: u64 = if q { 10 } else { 20 };
            let per_size = o.count.unwrap_or(if q { 30 } else { 100 });
            // What the link can carry toward the client (the bulk data's direction) while the
            // transfer runs (a trace plays from its start for every protocol).
            let capacity = match &trace {
                Some((_, down)) => crate::profile::trace_mbps_over(down, secs as f64),
                None => profile.down_mbps,
            };
            settings["duration_s"] = json!(secs);
            let mut bulk = CaseDef::new(
                params(&[
                    ("load", json!("bulk")),
                    ("loss", json!(losses[0])),
                    ("capacity_mbps", json!(capacity)),
                ]),
                link(losses[0], None),
                Work::Transfer(TransferPlan {
                    size: u64::MAX,
                    duration_ms: Some(secs * 1000),
                    timeout_ms: (secs + 20) * 1000,
                    multipath: false,
                    window_ms: None,
                    follow_address: false,
                    resume_after_ms: None,
                    bin_ms: 100,
                    event_at_ms: None,
                    video: None,
                }),
                profile.net,
            );
            bulk.timeout_s = secs as f64 + 30.0;
            cases.push(bulk);
            let plan = mar_plan(per_size, if q { 1_500 } else { 3_000 });
            let phase_s = f64::from(per_size) / 30.0 + plan.drain_ms as f64 / 1e3 + 2.0;
            settings["rpc"] = serde_json::to_value(&plan)?;
            settings["deadline_ms"] = json!(o.deadline_ms);
            let mut mar = CaseDef::new(
                params(&[("load", json!("mar")), ("loss", json!(losses[0]))]),
                link(losses[0], None),
                Work::Rpc(plan),
                profile.net,
            );
            mar.timeout_s = phase_s * MAR_SIZES.len() as f64 + 20.0;
            cases.push(mar);
        }
        "coexist" => {
            let c = coexist_cases(q, &link(losses[0], None), profile)?;
            settings["coexist"] = c.1;
            cases.extend(c.0);
        }
        "fairness" => {
            let loads = o.loads.clone().unwrap_or_else(|| vec!["video".into()]);
            let f = fairness_cases(q, &link(losses[0], None), profile, &loads)?;
            settings["fairness"] = f.1;
            cases.extend(f.0);
        }
        _ => unreachable!(),
    }
    let wanted = o
        .protocols
        .clone()
        .unwrap_or_else(|| default_protocols(scenario));
    let mut protocols = Vec::new();
    for p in wanted {
        let why = p.unavailable().or_else(|| match (p, scenario) {
            (Proto::Udp | Proto::Rtp, "short-flows" | "long-flow" | "startup") => {
                Some("unreliable: flows need retransmission".into())
            }
            (Proto::Udp | Proto::Rtp, "multipath" | "handover") => {
                Some("unreliable: a transfer needs retransmission".into())
            }
            (Proto::Udt | Proto::Srt, "multipath" | "handover" | "fairness" | "coexist") => {
                Some("the C shims have no metered transfer".into())
            }
            (Proto::Udp | Proto::Rtp, "fairness" | "coexist") => {
                Some("unreliable: a backlogged flow needs retransmission".into())
            }
            (Proto::Mptcp, "fairness" | "coexist") => {
                Some("the fairness topologies have one path".into())
            }
            (Proto::Rtp, "bulk") => Some("RTP runs request/response workloads only".into()),
            _ => None,
        });
        match why {
            Some(reason) => skipped.push(Skipped {
                protocol: p.name().into(),
                reason,
            }),
            None => protocols.push(p),
        }
    }
    Ok(Plan {
        scenario,
        profile,
        variant: variant.join("-"),
        protocols,
        cases,
        settings,
        skipped,
        tern_modes,
        routed_modes,
    })
}

/// A flow of `fairness` or `coexist`: a transfer without end (each flow's duration bounds
/// it), metered in `bin_ms` bins; a video source's if `video`.
fn backlogged(bin_ms: u64, video: Option<VideoPlan>) -> Work {
    Work::Transfer(TransferPlan {
        size: u64::MAX,
        duration_ms: None,
        timeout_ms: 0,
        multipath: false,
        window_ms: None,
        follow_address: false,
        resume_after_ms: None,
        bin_ms,
        event_at_ms: None,
        video,
    })
}

/// Bottleneck buffers of `coexist`, in bandwidth-delay products of the profile's link.
pub const COEXIST_BUFFERS_BDP: [(&str, f64); 3] = [("deep", 2.0), ("half", 0.5), ("shallow", 0.1)];

/// The `coexist` cases: on the profile's link (rate down, RTT), one backlogged flow of the
/// row's protocol and one of kernel TCP CUBIC start together, server → client, for 60 s
/// (quick: 20 s), once per bottleneck buffer of [`COEXIST_BUFFERS_BDP`]. The question is the
/// outside review's: does tern's random-loss tolerance take more than a fair share from TCP
/// where the buffer is too shallow for a queue to stand?
fn coexist_cases(
    q: bool,
    base: &LinkOptions,
    profile: &'static Profile,
) -> anyhow::Result<(Vec<CaseDef>, Value)> {
    let secs: u64 = if q { 20 } else { 60 };
    let warmup_s: u64 = if q { 5 } else { 10 };
    let Some(rate) = profile.down_mbps else {
        bail!("coexist needs a profile with a fixed rate");
    };
    let rtt = profile.rtt_ms;
    let bdp_ms = rtt;
    let mut cases = Vec::new();
    for (name, bdp) in COEXIST_BUFFERS_BDP {
        let queue_ms = bdp * bdp_ms;
        let mut lo = base.clone();
        lo.links = vec![("r".to_string(), format!("queue={queue_ms}ms"))];
        let mut def = CaseDef::new(
            params(&[
                ("case", json!(name)),
                ("buffer_bdp", json!(bdp)),
                ("capacity_mbps", json!(rate)),
                ("warmup_s", json!(warmup_s)),
            ]),
            lo,
            backlogged(100, None),
            NetKind::Single,
        );
        let flow = |proto| FairFlow {
            client: "c".into(),
            server: "s".into(),
            start_ms: 0,
            duration_ms: secs * 1000,
            rtt_ms: rtt,
            bottlenecks: vec!["r".into()],
            dir: "down",
            proto,
        };
        def.multi = Some(MultiFlow {
            flows: vec![flow(None), flow(Some(Proto::Tcp))],
            bottlenecks: vec!["r".into()],
        });
        def.timeout_s = secs as f64 + 30.0;
        cases.push(def);
    }
    let settings = json!({
        "duration_s": secs,
        "warmup_s": warmup_s,
        "buffers_bdp": COEXIST_BUFFERS_BDP.iter().map(|(n, b)| json!({"case": n, "bdp": b, "queue_ms": b * bdp_ms})).collect::<Vec<_>>(),
        "flows": "flow 0: the row's protocol; flow 1: kernel TCP CUBIC; both backlogged, server → client, started together",
    });
    Ok((cases, settings))
}

/// `coexist`'s own figures beside the fairness metrics: `share_pct`, the row's flow's part
/// of the two flows' steady goodput (50 is an even split); `queue_drop_pct`, the packets the
/// bottleneck's queue dropped on the data's way over those offered to it (whole run, both
/// flows).
fn coexist_metrics(case: &Case, m: &mut BTreeMap<String, f64>) {
    if let (Some(a), Some(b)) = (m.get("flow0_mbps"), m.get("flow1_mbps")) {
        if a + b > 0.0 {
            let share = 100.0 * a / (a + b);
            m.insert("share_pct".into(), share);
        }
    }
    if let Some(l) = case.links.iter().find(|l| l.link == "r" && l.dir == "down") {
        if l.offered > 0 {
            let pct = 100.0 * l.dropped_queue as f64 / l.offered as f64;
            m.insert("queue_drop_pct".into(), pct);
        }
    }
}

/// The `fairness` cases (NC-TCP's experiments) and the settings that describe them.
///
/// - `together`: three flows start at once on the profile's link (`ncvdn`: 1 Mbit/s,
///   140 ms);
/// - `staggered`: they start 15 s apart (quick: 4 s) and all stop together, the last one
///   after 30 s (quick: 8 s) of its own;
/// - `rtts`: RTTs of 80, 100 and 120 ms (each sender behind its own delay-only access link)
///   through one bottleneck of the profile's rate;
/// - `parking-lot`: the `parking-lot` profile (two 660 kbit/s bottlenecks): the long flow
///   across both, one short flow across each.
///
/// Every flow is a backlogged transfer (server → client) metered at its receiver in 100 ms
/// bins. Full: 60 s per case; quick: 12 s (16 s staggered).
fn fairness_cases(
    q: bool,
    base: &LinkOptions,
    profile: &'static Profile,
    loads: &[String],
) -> anyhow::Result<(Vec<CaseDef>, Value)> {
    for l in loads {
        if l != "video" && l != "bulk" {
            bail!("unknown fairness load {l:?} (video, bulk)");
        }
    }
    let secs: u64 = if q { 12 } else { 60 };
    let (gap, last): (u64, u64) = if q { (4, 8) } else { (15, 30) };
    let warmup_s: u64 = if q { 4 } else { 10 };
    let rate = profile.down_mbps.unwrap_or(1.0);
    let rtt = profile.rtt_ms;
    let transfer = |bin_ms, load: &str| {
        backlogged(
            bin_ms,
            (load == "video").then_some(VideoPlan {
                fps: VIDEO_FPS,
                playout_ms: VIDEO_PLAYOUT_MS,
            }),
        )
    };
    let flow =
        |client: &str, server: &str, start_s: u64, run_s: u64, rtt_ms: f64, links: &[&str], dir| {
            FairFlow {
                client: client.into(),
                server: server.into(),
                start_ms: start_s * 1000,
                duration_ms: run_s * 1000,
                rtt_ms,
                bottlenecks: links.iter().map(|l| l.to_string()).collect(),
                dir,
                proto: None,
            }
        };
    let mut cases = Vec::new();
    let mut add = |name: &str,
                   net: NetKind,
                   flows: Vec<FairFlow>,
                   bottlenecks: &[&str],
                   capacity: f64,
                   links: Vec<(String, String)>,
                   prof: Option<&'static Profile>| {
        let end_s = flows
            .iter()
            .map(|f| (f.start_ms + f.duration_ms) / 1000)
            .max()
            .unwrap_or(0);
        let mut lo = base.clone();
        lo.links = links;
        for load in loads {
            let mut def = CaseDef::new(
                params(&[
                    ("case", json!(name)),
                    ("load", json!(load)),
                    ("capacity_mbps", json!(capacity)),
                    ("warmup_s", json!(warmup_s)),
                ]),
                lo.clone(),
                transfer(100, load),
                net,
            );
            def.multi = Some(MultiFlow {
                flows: flows.clone(),
                bottlenecks: bottlenecks.iter().map(|b| b.to_string()).collect(),
            });
            def.profile = prof;
            def.timeout_s = end_s as f64 + 30.0;
            cases.push(def);
        }
    };
    let r = ["r"];
    add(
        "together",
        NetKind::Single,
        (0..3)
            .map(|_| flow("c", "s", 0, secs, rtt, &r, "down"))
            .collect(),
        &r,
        rate,
        vec![],
        None,
    );
    add(
        "staggered",
        NetKind::Single,
        (0..3)
            .map(|i| flow("c", "s", i * gap, (2 - i) * gap + last, rtt, &r, "down"))
            .collect(),
        &r,
        rate,
        vec![],
        None,
    );
    // The bottleneck keeps its rate and queue but no delay; each access link has the
    // flow's whole delay and no rate limit.
    let rtts = [80.0, 100.0, 120.0];
    let mut links = vec![("r".to_string(), "delay=0ms".to_string())];
    let mut flows = Vec::new();
    for (i, rt) in rtts.iter().enumerate() {
        let a = format!("a{}", i + 1);
        links.push((a, format!("delay={}ms rate=unlimited", rt / 2.0)));
        flows.push(flow("c", &format!("s{}", i + 1), 0, secs, *rt, &r, "down"));
    }
    add("rtts", NetKind::Rtts, flows, &r, rate, links, None);
    let lot = profile::profile("parking-lot")?;
    let one_way = lot.rtt_ms / 2.0;
    let b = ["b1", "b2"];
    add(
        "parking-lot",
        NetKind::ParkingLot,
        vec![
            flow("dst0", "src0", 0, secs, 4.0 * one_way, &b, "up"),
            flow("dst1", "src1", 0, secs, 2.0 * one_way, &b[..1], "up"),
            flow("dst2", "src2", 0, secs, 2.0 * one_way, &b[1..], "up"),
        ],
        &b,
        lot.up_mbps.unwrap_or(0.66),
        vec![],
        Some(lot),
    );
    let settings = json!({
        "duration_s": secs,
        "staggered_gap_s": gap,
        "staggered_last_s": last,
        "warmup_s": warmup_s,
        "rtts_ms": rtts,
        "parking_lot_access_mbps": crate::runner::PARKING_LOT_ACCESS_MBPS,
        "loads": loads,
        "video": {
            "fps": VIDEO_FPS,
            "playout_ms": VIDEO_PLAYOUT_MS,
            "send_buffer_bytes": crate::proto::video::SEND_BUFFER,
            "min_frame_bytes": crate::proto::video::MIN_FRAME,
        },
    });
    Ok((cases, settings))
}

/// Per-second delivery of each flow of a `fairness` case on one timeline (seconds since the
/// first client started; a flow's 100 ms bins are placed by its own start), and which flows
/// were scheduled to run through the whole of each second.
pub fn fair_seconds(case: &Case) -> (Vec<Vec<f64>>, Vec<Vec<bool>>) {
    let end_s = case
        .fair_flows
        .iter()
        .map(|f| ((f.start_ms + f.duration_ms as f64) / 1e3).ceil() as usize)
        .max()
        .unwrap_or(0);
    let mut bytes = vec![vec![0.0; end_s]; case.fair_flows.len()];
    let mut active = vec![vec![false; end_s]; case.fair_flows.len()];
    for (i, f) in case.fair_flows.iter().enumerate() {
        let (from, to) = (f.start_ms / 1e3, (f.start_ms + f.duration_ms as f64) / 1e3);
        for (k, a) in active[i].iter_mut().enumerate() {
            *a = k as f64 >= from && (k + 1) as f64 <= to;
        }
        let Some(t) = &f.transfer else { continue };
        let bin = t.bin_ms.max(1) as f64;
        for (j, b) in t.bins.iter().enumerate() {
            // The bin's middle, on the case's timeline.
            let at = (f.start_ms + (j as f64 + 0.5) * bin) / 1e3;
            if let Some(slot) = bytes[i].get_mut(at as usize) {
                *slot += *b as f64;
            }
        }
    }
    (bytes, active)
}

/// Jain's fairness index of `x`: (Σx)² / (n Σx²); 1 when all are equal, 1/n when one has
/// everything. NaN for no values or all zero.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || sq <= 0.0 {
        return f64::NAN;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// Jain's index per second over the flows scheduled to run through that second: `(second,
/// index)` for every second with at least two such flows.
pub fn jain_over_time(case: &Case) -> Vec<(f64, f64)> {
    let (bytes, active) = fair_seconds(case);
    let secs = bytes.first().map_or(0, Vec::len);
    (0..secs)
        .filter_map(|k| {
            let x: Vec<f64> = (0..bytes.len())
                .filter(|&i| active[i][k])
                .map(|i| bytes[i][k])
                .collect();
            (x.len() >= 2).then(|| (k as f64, jain(&x)))
        })
        .filter(|(_, j)| j.is_finite())
        .collect()
}

/// The metrics of a `fairness` case. The steady part runs from `warmup_s` after the last
/// flow started to the first flow's end.
///
/// - `jain_mean`, `jain_min`: Jain's index of the per-second throughputs over the steady
///   part (a second where every flow delivered nothing gives no index);
/// - `flow<i>_mbps`: each flow's goodput over the steady part; `throughput_mbps` their sum;
/// - `util_<link>_pct`: the goodput of the flows that cross each bottleneck over its rate
///   (`capacity_mbps`), steady part; `utilisation_pct` the mean over bottlenecks;
/// - `link_util_<link>_pct`, `link_utilisation_pct`: the bytes the link delivered on the
///   data's way over the steady part (IP bytes, headers and retransmissions included) over
///   its rate: the link's own utilisation, as NC-TCP and the simulator count it;
/// - `qdelay_<link>_mean_ms`, `qdelay_<link>_p95_ms`: the time packets spent in each
///   bottleneck's queue on the data's way (whole run), their own transmission included;
///   `queue_delay_mean_ms` and `queue_delay_p95_ms` the largest over bottlenecks;
/// - `qwait_<link>_mean_ms`, `queue_wait_mean_ms`, `queue_wait_p95_ms`: the same without the
///   packet's own transmission (the wait before its first byte left: what DESIGN.md's 2 ms
///   is about, and what the simulator measures);
/// - `qwait_<link>_steady_mean_ms`, `queue_wait_steady_mean_ms`, `queue_wait_steady_p95_ms`:
///   the wait of the packets that entered the queue on the data's way in the steady part
///   (the window of `link_util_<link>_pct`: no start-up, no joins), the largest over
///   bottlenecks;
/// - `flows_failed`: flows that gave no report or an error.
fn fairness_metrics(case: &Case) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let flows = &case.fair_flows;
    if flows.is_empty() {
        m.insert("flows_failed".into(), 1.0);
        return m;
    }
    let warm = case
        .params
        .get("warmup_s")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let from = (flows.iter().map(|f| f.start_ms).fold(0.0, f64::max) / 1e3 + warm).ceil();
    let to = flows
        .iter()
        .map(|f| (f.start_ms + f.duration_ms as f64) / 1e3)
        .fold(f64::INFINITY, f64::min)
        .floor();
    let jains: Vec<f64> = jain_over_time(case)
        .into_iter()
        .filter(|(t, _)| *t >= from && *t + 1.0 <= to)
        .map(|p| p.1)
        .collect();
    m.insert("jain_mean".into(), stats::mean(&jains));
    m.insert(
        "jain_min".into(),
        jains.iter().copied().fold(f64::NAN, f64::min),
    );
    let (bytes, _) = fair_seconds(case);
    let steady_s = (to - from).max(0.0);
    let mbps: Vec<f64> = bytes
        .iter()
        .map(|b| {
            let sum: f64 = b
                .iter()
                .enumerate()
                .filter(|(k, _)| *k as f64 >= from && (*k + 1) as f64 <= to)
                .map(|p| p.1)
                .sum();
            sum * 8.0 / steady_s / 1e6
        })
        .collect();
    for (i, v) in mbps.iter().enumerate() {
        m.insert(format!("flow{i}_mbps"), *v);
    }
    m.insert("throughput_mbps".into(), mbps.iter().sum());
    let failed = flows
        .iter()
        .filter(|f| f.transfer.is_none() || f.error.is_some())
        .count();
    m.insert("flows_failed".into(), failed as f64);
    let capacity = case
        .params
        .get("capacity_mbps")
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN);
    let mut links: Vec<&String> = flows.iter().flat_map(|f| &f.bottlenecks).collect();
    links.sort();
    links.dedup();
    let (mut utils, mut means, mut p95s) = (Vec::new(), Vec::new(), Vec::new());
    let (mut wait_means, mut wait_p95s, mut link_utils) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steady_wait_means, mut steady_wait_p95s) = (Vec::new(), Vec::new());
    for link in links {
        let through: f64 = flows
            .iter()
            .zip(&mbps)
            .filter(|(f, _)| f.bottlenecks.contains(link))
            .map(|p| p.1)
            .sum();
        let util = 100.0 * through / capacity;
        m.insert(format!("util_{link}_pct"), util);
        utils.push(util);
        let dir = flows
            .iter()
            .find(|f| f.bottlenecks.contains(link))
            .map_or("down", |f| f.dir.as_str());
        if let Some(w) = case
            .link_windows
            .iter()
            .find(|w| &w.link == link && w.dir == dir && w.to_s > w.from_s)
        {
            let wire =
                100.0 * w.delivered_bytes as f64 * 8.0 / (capacity * 1e6 * (w.to_s - w.from_s));
            m.insert(format!("link_util_{link}_pct"), wire);
            link_utils.push(wire);
            if let (Some(mean), Some(p95)) = (w.queue_wait_mean_ms, w.queue_wait_p95_ms) {
                m.insert(format!("qwait_{link}_steady_mean_ms"), mean);
                steady_wait_means.push(mean);
                steady_wait_p95s.push(p95);
            }
        }
        if let Some(l) = case.links.iter().find(|l| &l.link == link && l.dir == dir) {
            if let (Some(mean), Some(p95)) = (l.queue_delay_mean_ms, l.queue_delay_p95_ms) {
                m.insert(format!("qdelay_{link}_mean_ms"), mean);
                m.insert(format!("qdelay_{link}_p95_ms"), p95);
                means.push(mean);
                p95s.push(p95);
            }
            if let (Some(mean), Some(p95)) = (l.queue_wait_mean_ms, l.queue_wait_p95_ms) {
                m.insert(format!("qwait_{link}_mean_ms"), mean);
                wait_means.push(mean);
                wait_p95s.push(p95);
            }
        }
    }
    m.insert("utilisation_pct".into(), stats::mean(&utils));
    if !link_utils.is_empty() {
        m.insert("link_utilisation_pct".into(), stats::mean(&link_utils));
    }
    video_metrics(case, &mut m);
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    m.insert("queue_delay_mean_ms".into(), max(&means));
    m.insert("queue_delay_p95_ms".into(), max(&p95s));
    if !wait_means.is_empty() {
        m.insert("queue_wait_mean_ms".into(), max(&wait_means));
        m.insert("queue_wait_p95_ms".into(), max(&wait_p95s));
    }
    if !steady_wait_means.is_empty() {
        m.insert("queue_wait_steady_mean_ms".into(), max(&steady_wait_means));
        m.insert("queue_wait_steady_p95_ms".into(), max(&steady_wait_p95s));
    }
    m
}

/// The video figures of a `fairness` case with `load=video` (`proto::video`): every flow's
/// frames due (`frames_sent`: the sender produces each one, the rate rule only sizes them),
/// those that did not complete within the playout delay of their production, late or never
/// (`frames_missed`, `miss_pct`, and per flow `flow<i>_miss_pct`), and the mean size of the
/// frames received (`frame_size_mean_bytes`; a frame never received has no known size). A
/// flow that gave no report counts all its frames as missed.
fn video_metrics(case: &Case, m: &mut BTreeMap<String, f64>) {
    let video = case.params.get("load").and_then(Value::as_str) == Some("video");
    if !video {
        return;
    }
    let (mut due, mut missed, mut bytes, mut received) = (0u64, 0u64, 0.0, 0usize);
    for (i, f) in case.fair_flows.iter().enumerate() {
        let (d, miss) = match f.transfer.as_ref().and_then(|t| t.video.as_ref()) {
            Some(v) => {
                let (miss, _) = crate::proto::video::missed(&v.frames, v.frames_due, v.playout_ms);
                bytes += v.frames.iter().map(|f| f64::from(f.size)).sum::<f64>();
                received += v.frames.len();
                (v.frames_due, miss)
            }
            None => {
                let d = (f.duration_ms * u64::from(VIDEO_FPS) / 1000) as u32;
                (d, d)
            }
        };
        m.insert(
            format!("flow{i}_miss_pct"),
            100.0 * f64::from(miss) / f64::from(d.max(1)),
        );
        due += u64::from(d);
        missed += u64::from(miss);
    }
    m.insert("frames_sent".into(), due as f64);
    m.insert("frames_missed".into(), missed as f64);
    m.insert(
        "miss_pct".into(),
        100.0 * missed as f64 / (due.max(1)) as f64,
    );
    m.insert(
        "frame_size_mean_bytes".into(),
        if received == 0 {
            f64::NAN
        } else {
            bytes / received as f64
        },
    );
}

fn link_options_of(case: &Case) -> LinkOptions {
    LinkOptions {
        loss_pct: case
            .params
            .get("loss")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        rtt_ms: case.params.get("rtt_ms").and_then(Value::as_f64),
        trace: None,
        extra: None,
        links: vec![],
        link_traces: vec![],
    }
}

/// From the first flow's start to the last completion (NaN if none completed).
fn span_s(flows: &[crate::results::FlowSample]) -> f64 {
    if flows.iter().all(|f| f.fct_ms.is_none()) {
        return f64::NAN;
    }
    let start = flows
        .iter()
        .map(|f| f.start_ms)
        .fold(f64::INFINITY, f64::min);
    let end = flows
        .iter()
        .filter_map(|f| f.fct_ms.map(|d| f.start_ms + d))
        .fold(f64::NEG_INFINITY, f64::max);
    (end - start) / 1e3
}

/// The `size` parameter of an adaptive row (`--tern-mode adaptive:MS`): one row over every
/// frame, whatever sizes the encoder picked.
pub const ADAPTIVE_SIZE: &str = "adaptive";

/// The request samples of a request/response case, grouped as rows: per request size
/// (`Some(size)`), or all together (`None`) for an adaptive encoder's row, whose sizes
/// follow the transport's rate rather than a sweep (per-size groups would compare frames
/// sent at different moments and loads, and leave sizes it never chose out).
fn rpc_groups(case: &Case) -> Vec<(Option<u32>, Vec<&RpcSample>)> {
    if case
        .protocol
        .starts_with(crate::proto::ternp::ADAPTIVE_LABEL)
    {
        return vec![(None, case.rpc.iter().collect())];
    }
    let mut sizes: Vec<u32> = case.rpc.iter().map(|s| s.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|size| {
            let samples = case.rpc.iter().filter(|s| s.size == size).collect();
            (Some(size), samples)
        })
        .collect()
}

/// Rows of the summary, from the raw cases.
pub fn summarize(run: &RunFile) -> Vec<Row> {
    if run.scenario == "robustness" {
        return crate::robust::summarize(run);
    }
    if run.scenario == "scale" {
        return crate::scale::summarize(run);
    }
    let profile = profile::profile(&run.profile).ok();
    let traced = run.settings.get("trace").is_some_and(|t| !t.is_null());
    let deadline = deadline_of(run);
    let mut rows = Vec::new();
    for case in &run.cases {
        let mut base = case.params.clone();
        if case.error.is_some() {
            base.insert("error".into(), json!(true));
        }
        match run.scenario.as_str() {
            "mar" | "echo-sizes" | "mss" if !case.rpc.is_empty() || run.scenario != "mss" => {
                for (size, mut samples) in rpc_groups(case) {
                    samples.sort_by_key(|s| s.seq);
                    let rtts: Vec<f64> = samples.iter().filter_map(|s| s.rtt_ms).collect();
                    let n = samples.len() as f64;
                    let mut m = BTreeMap::new();
                    m.insert("n".into(), n);
                    m.insert(
                        "lost_pct".into(),
                        100.0 * (n - rtts.len() as f64) / n.max(1.0),
                    );
                    m.insert("rtt_p50_ms".into(), stats::median(&rtts));
                    m.insert("rtt_mean_ms".into(), stats::mean(&rtts));
                    m.insert("rtt_std_ms".into(), stats::std(&rtts));
                    m.insert("rtt_p99_ms".into(), stats::percentile(&rtts, 99.0));
                    m.insert("jitter_ms".into(), stats::pdv(&rtts));
                    if run.scenario == "mar" {
                        let (frac, on_time_size) = on_time(samples.iter().copied(), deadline);
                        m.insert("on_time_pct".into(), 100.0 * frac);
                        m.insert("on_time_size_mean_bytes".into(), on_time_size);
                        let sent: Vec<f64> = samples.iter().map(|s| f64::from(s.size)).collect();
                        m.insert("sent_size_mean_bytes".into(), stats::mean(&sent));
                    }
                    let first = samples.iter().map(|s| s.t_ms).fold(f64::INFINITY, f64::min);
                    let last = samples
                        .iter()
                        .filter_map(|s| s.rtt_ms.map(|r| s.t_ms + r))
                        .fold(f64::NEG_INFINITY, f64::max);
                    let bytes: f64 = samples
                        .iter()
                        .filter(|s| s.rtt_ms.is_some())
                        .map(|s| f64::from(s.size))
                        .sum();
                    m.insert(
                        "throughput_mbps".into(),
                        bytes * 8.0 / ((last - first) * 1e3),
                    );
                    if let (Some(p), false, Some(r), Some(size)) =
                        (profile, traced, samples.first(), size)
                    {
                        if let Some(ideal) = p.ideal_rpc_ms(&link_options_of(case), size, r.reply) {
                            m.insert("ideal_ms".into(), ideal);
                            m.insert("p50_over_ideal".into(), stats::median(&rtts) / ideal);
                        }
                    }
                    let mut params = base.clone();
                    params.insert(
                        "size".into(),
                        size.map_or(json!(ADAPTIVE_SIZE), |s| json!(s)),
                    );
                    rows.push(Row {
                        protocol: case.protocol.clone(),
                        params,
                        metrics: m,
                    });
                }
            }
            "short-flows" | "long-flow" | "startup" | "bulk" | "initwin" | "mss" => {
                let done: Vec<f64> = case.flows.iter().filter_map(|f| f.fct_ms).collect();
                let bytes: f64 = case.flows.iter().map(|f| f.received as f64).sum();
                let mut m = BTreeMap::new();
                m.insert("flows".into(), case.flows.len() as f64);
                m.insert("failed".into(), (case.flows.len() - done.len()) as f64);
                m.insert("fct_mean_ms".into(), stats::mean(&done));
                m.insert("fct_p50_ms".into(), stats::median(&done));
                m.insert("fct_p99_ms".into(), stats::percentile(&done, 99.0));
                let span = span_s(&case.flows);
                m.insert("goodput_mbps".into(), bytes * 8.0 / span / 1e6);
                if let Some(cpu) = case.cpu {
                    let gb = bytes / 1e9;
                    if gb > 0.0 {
                        m.insert("cpu_client_s_per_gb".into(), cpu.client_s / gb);
                        if let Some(server) = cpu.server_s {
                            m.insert("cpu_server_s_per_gb".into(), server / gb);
                            m.insert("cpu_s_per_gb".into(), (cpu.client_s + server) / gb);
                        }
                    }
                }
                // Loss recovery as the data's sender (the server) saw it: tern and quinn
                // (quinn has no spurious-loss count and reports lost bytes, not resent
                // ones), summed over the client's threads; the reordering allowance tern
                // learned, the largest of them.
                for key in [
                    "packets_lost",
                    "spurious_losses",
                    "bytes_retransmitted",
                    "bytes_lost",
                    "congestion_events",
                    "congestion_events_undone",
                    "datagrams_sent",
                    "nacks_received",
                    "ptos",
                    "tail_probes",
                    "ecn_ce_reported",
                ] {
                    if let Some(v) = side_stat(&case.extra, "server", key, Agg::Sum) {
                        m.insert(format!("sender_{key}"), v);
                    }
                }
                for key in ["reorder_threshold", "reorder_window_ms"] {
                    if let Some(v) = side_stat(&case.extra, "server", key, Agg::Max) {
                        m.insert(format!("sender_{key}"), v);
                    }
                }
                // Drops on the way in: tern's receiver's own queue, the kernel's at the
                // receiving and the sending socket, and the kernel's receive-buffer drops
                // in the namespaces. A loss the sender declared while nothing was dropped
                // anywhere is a false one.
                if let Some(v) = side_stat(&case.extra, "client", "datagrams_dropped", Agg::Sum) {
                    m.insert("receiver_datagrams_dropped".into(), v);
                }
                if let Some(d) = case.client_socket_drops {
                    m.insert("receiver_socket_drops".into(), d as f64);
                }
                if let Some(d) = case.server_socket_drops {
                    m.insert("sender_socket_drops".into(), d as f64);
                }
                if let Some(drops) = case.udp_rcvbuf_errors {
                    m.insert("rcvbuf_errors".into(), drops as f64);
                    m.insert("udp_rcvbuf_errors".into(), drops as f64);
                }
                if let Some(n) = case.udp_sndbuf_errors {
                    m.insert("udp_sndbuf_errors".into(), n as f64);
                }
                if let Some(n) = case.udp_in_errors {
                    m.insert("udp_in_errors".into(), n as f64);
                }
                // And the emulator's drops (queue, loss model and fades, outages) per
                // direction: `down` (server → client) is the data's.
                for dir in ["up", "down"] {
                    let links: Vec<_> = case.links.iter().filter(|l| l.dir == dir).collect();
                    if !links.is_empty() {
                        let drops: u64 = links
                            .iter()
                            .map(|l| l.dropped_queue + l.dropped_loss + l.dropped_outage)
                            .sum();
                        m.insert(format!("link_drops_{dir}"), drops as f64);
                    }
                }
                for key in ["rtt_ms", "min_rtt_ms"] {
                    if let Some(v) = side_stat(&case.extra, "server", key, Agg::Max) {
                        m.insert(format!("sender_{key}"), v);
                    }
                }
                if run.scenario == "startup" || run.scenario == "initwin" {
                    if let (Some(p), Some(f)) = (profile, case.flows.first()) {
                        let o = link_options_of(case);
                        // `--link` settings may change the delay or rate the ideal is
                        // made of: then no ideal is drawn.
                        let custom = run.settings.get("link_extra").is_some_and(|l| {
                            let text = l.to_string();
                            ["delay", "rate", "jitter", "trace"]
                                .iter()
                                .any(|k| text.contains(k))
                        });
                        if let (Some(rate), false, false) = (p.down_mbps, traced, custom) {
                            // Ideal: handshake (1 RTT) + request and first byte (1 RTT) + size / C.
                            let ideal = 2.0 * p.rtt(&o) + f.size as f64 * 8.0 / (rate * 1e3);
                            m.insert("ideal_ms".into(), ideal);
                            m.insert("fct_over_ideal".into(), stats::mean(&done) / ideal);
                        }
                    }
                }
                rows.push(Row {
                    protocol: case.protocol.clone(),
                    params: base,
                    metrics: m,
                });
            }
            "multipath" | "handover" => {
                rows.push(Row {
                    protocol: case.protocol.clone(),
                    params: base,
                    metrics: transfer_metrics(case),
                });
            }
            "cc" => rows.push(Row {
                protocol: case.protocol.clone(),
                params: base,
                metrics: controller_metrics(case, deadline),
            }),
            "fairness" | "coexist" => {
                base.remove("capacity_mbps");
                base.remove("warmup_s");
                let mut metrics = fairness_metrics(case);
                if run.scenario == "coexist" {
                    coexist_metrics(case, &mut metrics);
                }
                rows.push(Row {
                    protocol: case.protocol.clone(),
                    params: base,
                    metrics,
                })
            }
            _ => {}
        }
    }
    match run.scenario.as_str() {
        "multipath" => multipath_ratios(&mut rows),
        "handover" | "fairness" | "coexist" => {}
        // Issue 12's goal: goodput ≥ TCP + TLS and ≥ 2.5× quinn, CPU per byte ≤ 0.5× quinn's.
        "bulk" => {
            for base in ["tcp", "tcp-tls", "quic"] {
                add_ratio(&mut rows, base);
            }
        }
        // The goal is stated against BBR (throughput, delay) and TCP and quinn (MAR p99).
        "cc" => {
            for base in ["tcp", "tcp-bbr", "quic"] {
                add_ratio(&mut rows, base);
            }
        }
        _ => add_ratio(&mut rows, "tcp"),
    }
    // JSON has no NaN: a metric that cannot be computed (no samples) is left out.
    for r in &mut rows {
        r.metrics.retain(|_, v| v.is_finite());
    }
    rows
}

/// The metrics of a `cc` case.
///
/// - `load=bulk`: `goodput_mbps` (first byte to last), `utilisation_pct` (of the link's
///   capacity toward the client: the profile's rate or the trace's mean), and the queueing
///   delay the sender built at the bottleneck, `queue_delay_mean_ms` and
///   `queue_delay_p95_ms` (each packet's time in the emulator's queue on the data's way,
///   server → client);
/// - `load=mar`: every request of every size together: `rtt_p50_ms`, `rtt_p99_ms`,
///   `lost_pct` (not answered), `on_time_pct` and `on_time_size_mean_bytes` ([`on_time`]
///   against `deadline_ms`), and the queueing delay on the requests' way (client → server).
fn controller_metrics(case: &Case, deadline_ms: f64) -> BTreeMap<String, f64> {
    let bulk = case.params.get("load").and_then(Value::as_str) == Some("bulk");
    let mut m = if bulk {
        transfer_metrics(case)
    } else {
        let rtts: Vec<f64> = case.rpc.iter().filter_map(|s| s.rtt_ms).collect();
        let n = case.rpc.len() as f64;
        let mut m = BTreeMap::new();
        m.insert("n".into(), n);
        m.insert(
            "lost_pct".into(),
            100.0 * (n - rtts.len() as f64) / n.max(1.0),
        );
        m.insert("rtt_p50_ms".into(), stats::median(&rtts));
        m.insert("rtt_p99_ms".into(), stats::percentile(&rtts, 99.0));
        let (frac, size) = on_time(&case.rpc, deadline_ms);
        m.insert("on_time_pct".into(), 100.0 * frac);
        m.insert("on_time_size_mean_bytes".into(), size);
        m
    };
    if let (true, Some(goodput), Some(capacity)) = (
        bulk,
        m.get("goodput_mbps").copied(),
        case.params.get("capacity_mbps").and_then(Value::as_f64),
    ) {
        m.insert("utilisation_pct".into(), 100.0 * goodput / capacity);
    }
    let dir = if bulk { "down" } else { "up" };
    // The busiest queue on that way is the bottleneck's.
    if let Some(l) = case.links.iter().filter(|l| l.dir == dir).max_by(|a, b| {
        a.queue_delay_p95_ms
            .unwrap_or(0.0)
            .total_cmp(&b.queue_delay_p95_ms.unwrap_or(0.0))
    }) {
        if let (Some(mean), Some(p95)) = (l.queue_delay_mean_ms, l.queue_delay_p95_ms) {
            m.insert("queue_delay_mean_ms".into(), mean);
            m.insert("queue_delay_p95_ms".into(), p95);
        }
    }
    m
}

/// The metrics of a metered transfer (`multipath`, `handover`).
///
/// - `goodput_mbps`: bytes delivered over the time from the first byte to the last;
/// - `link_<link>_down_mb`: what each emulated link delivered toward the client (the data's
///   direction), so the split between paths is seen for every protocol; for tern also
///   `paths_used` (paths that sent more than 1 MB, from the sender's `Connection::paths()`);
/// - handover: `stall_ms` (the longest gap in delivery at the receiver) and `stall_at_ms`,
///   `completed`, `connections` (more than 1: the transport broke and the client reconnected),
///   `failed` (not completed, or not on one connection), `bytes_lost` (what the connection
///   never delivered of the size asked for; not given when the client had to reconnect),
///   `reconnect_ms`, `window_resume_ms` (window reopened → next byte), `stall_target_ms`
///   (1 RTT + 50 ms) and `stall_over_target`.
fn transfer_metrics(case: &Case) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let Some(t) = &case.transfer else {
        m.insert("failed".into(), 1.0);
        m.insert("completed".into(), 0.0);
        return m;
    };
    let span_s = match (t.first_byte_ms, t.last_byte_ms) {
        (Some(a), Some(b)) if b > a => (b - a) / 1e3,
        _ => f64::NAN,
    };
    m.insert(
        "goodput_mbps".into(),
        t.received as f64 * 8.0 / span_s / 1e6,
    );
    m.insert("received_mb".into(), t.received as f64 / 1e6);
    m.insert("completed".into(), f64::from(u8::from(t.completed)));
    for l in case.links.iter().filter(|l| l.dir == "down") {
        m.insert(
            format!("link_{}_down_mb", l.link),
            l.delivered_bytes as f64 / 1e6,
        );
    }
    let sender_paths = case
        .extra
        .as_array()
        .and_then(|a| a.first())
        .and_then(|x| x.get("server")?.get("paths")?.as_array().cloned());
    if let Some(paths) = sender_paths {
        let used = paths
            .iter()
            .filter(|p| p.get("bytes_sent").and_then(Value::as_f64).unwrap_or(0.0) > 1e6)
            .count();
        m.insert("paths_used".into(), used as f64);
        // What each of tern's paths sent (the sender's `Connection::paths()`).
        for p in &paths {
            if let (Some(id), Some(sent)) = (
                p.get("id").and_then(Value::as_u64),
                p.get("bytes_sent").and_then(Value::as_f64),
            ) {
                m.insert(format!("tern_path{id}_sent_mb"), sent / 1e6);
            }
        }
    }
    if let Some(sum) = case.params.get("sum_mbps").and_then(Value::as_f64) {
        if sum > 0.0 {
            m.insert(
                "goodput_of_sum".into(),
                t.received as f64 * 8.0 / span_s / 1e6 / sum,
            );
        }
    }
    if case.params.contains_key("event") {
        // The event's stall: the longest gap ending after the event (older results: the
        // longest gap of the run).
        let (stall, at) = match (t.event_gap_ms, t.event_gap_at_ms) {
            (Some(g), Some(a)) => (g, a),
            _ => (t.max_gap_ms, t.max_gap_at_ms),
        };
        m.insert("stall_ms".into(), stall);
        m.insert("stall_at_ms".into(), at);
        m.insert("connections".into(), f64::from(t.connections));
        let failed = !t.completed || t.connections > 1;
        m.insert("failed".into(), f64::from(u8::from(failed)));
        if t.connections == 1 && t.size != u64::MAX {
            m.insert(
                "bytes_lost".into(),
                t.size.saturating_sub(t.received) as f64,
            );
        }
        if let Some(r) = t.reconnect_ms {
            m.insert("reconnect_ms".into(), r);
        }
        if let Some(r) = t.window_resume_ms {
            m.insert("window_resume_ms".into(), r);
        }
        m.insert("rebinds".into(), f64::from(t.rebinds));
        if let Some(ms) = case.events.first().and_then(|e| recovery_ms(t, e.at_ms)) {
            m.insert("recovered_ms".into(), ms);
        }
        if let Some(target) = case.params.get("stall_target_ms").and_then(Value::as_f64) {
            m.insert("stall_target_ms".into(), target);
            m.insert("stall_over_target".into(), stall / target);
        }
    }
    m
}

/// How long after an event at `event_ms` the delivery rate is back: the first time from
/// which 500 ms deliver at least 80 % of what the second before the event delivered per
/// 500 ms (`None`: never, or no rate before the event to compare with).
fn recovery_ms(t: &TransferSample, event_ms: f64) -> Option<f64> {
    let bin = t.bin_ms.max(1) as f64;
    let at = (event_ms / bin) as usize;
    let per = (500.0 / bin).round().max(1.0) as usize;
    let before: u64 = t.bins.get(at.checked_sub(2 * per)?..at)?.iter().sum();
    let want = before as f64 / 2.0 * 0.8;
    if want <= 0.0 {
        return None;
    }
    (at..t.bins.len().saturating_sub(per))
        .find(|&i| t.bins[i..i + per].iter().sum::<u64>() as f64 >= want)
        .map(|i| (i as f64 * bin - event_ms).max(0.0))
}

/// `multipath`: each row's goodput over its protocol's `paths=one` row (MPTCP, which has
/// none, over TCP's: one MPTCP subflow is TCP), `goodput_vs_one`; over MPTCP's with the
/// same paths, `goodput_vs_mptcp`.
fn multipath_ratios(rows: &mut [Row]) {
    let goodput = |rows: &[Row], proto: &str, paths: &str| {
        rows.iter()
            .find(|r| {
                r.protocol == proto && r.params.get("paths").and_then(Value::as_str) == Some(paths)
            })
            .and_then(|r| r.metric("goodput_mbps"))
    };
    let snapshot = rows.to_vec();
    for r in rows.iter_mut() {
        let Some(g) = r.metric("goodput_mbps") else {
            continue;
        };
        let Some(paths) = r.params.get("paths").and_then(Value::as_str) else {
            continue;
        };
        if paths != "one" {
            let base =
                goodput(&snapshot, &r.protocol, "one").or_else(|| goodput(&snapshot, "tcp", "one"));
            if let Some(b) = base.filter(|b| *b > 0.0) {
                r.metrics.insert("goodput_vs_one".into(), g / b);
            }
            if let Some(b) = goodput(&snapshot, "mptcp", paths).filter(|b| *b > 0.0) {
                r.metrics.insert("goodput_vs_mptcp".into(), g / b);
            }
        } else if let Some(b) = goodput(&snapshot, "tcp", "one").filter(|b| *b > 0.0) {
            r.metrics.insert("goodput_vs_tcp".into(), g / b);
        }
    }
}

/// A file-name-safe form of `--link` settings: `reorder=2%,5ms` → `reorder-2-5ms`.
fn link_slug(settings: &str) -> String {
    let mut slug = String::new();
    for c in settings.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_owned()
}

/// How [`side_stat`] combines the threads' values.
#[derive(Clone, Copy)]
enum Agg {
    Sum,
    Max,
}

/// A numeric connection statistic of one side of the flows (`server`: the data's sender,
/// asked for after each thread's last flow; `client`: the receiver), combined over the
/// client's threads; `None` when no thread reported it (kernel TCP, UDP).
fn side_stat(extra: &Value, side: &str, key: &str, agg: Agg) -> Option<f64> {
    let threads = extra.as_array()?;
    let values: Vec<f64> = threads
        .iter()
        .filter_map(|t| t.get(side)?.get(key)?.as_f64())
        .collect();
    (!values.is_empty()).then(|| match agg {
        Agg::Sum => values.iter().sum(),
        Agg::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// The headline metric of a scenario, and whether lower is better.
pub fn headline(scenario: &str) -> Vec<(&'static str, &'static str)> {
    match scenario {
        "mar" => vec![
            ("rtt_p50_ms", "p50"),
            ("rtt_p99_ms", "p99"),
            ("jitter_ms", "jitter"),
        ],
        "echo-sizes" => vec![("rtt_p50_ms", "p50")],
        "short-flows" | "startup" | "long-flow" | "initwin" => vec![("fct_mean_ms", "fct")],
        "mss" => vec![
            ("goodput_mbps", "goodput"),
            ("cpu_s_per_gb", "cpu"),
            ("rtt_p50_ms", "p50"),
        ],
        "bulk" => vec![("goodput_mbps", "goodput"), ("cpu_s_per_gb", "cpu")],
        "multipath" => vec![("goodput_mbps", "goodput")],
        "handover" => vec![("stall_ms", "stall"), ("bytes_lost", "lost")],
        "cc" => vec![
            ("goodput_mbps", "goodput"),
            ("queue_delay_p95_ms", "qdelay95"),
            ("rtt_p99_ms", "p99"),
        ],
        "fairness" => vec![
            ("jain_mean", "jain"),
            ("utilisation_pct", "util"),
            ("queue_delay_mean_ms", "qdelay"),
        ],
        "coexist" => vec![("share_pct", "share"), ("jain_mean", "jain")],
        _ => vec![],
    }
}

/// Adds `<short>_vs_<base>` ratios: each row's headline metrics divided by those of the
/// `base` protocol's row with the same parameters (measured in the same run).
fn add_ratio(rows: &mut [Row], base: &str) {
    let keys: Vec<(BTreeMap<String, Value>, BTreeMap<String, f64>)> = rows
        .iter()
        .filter(|r| r.protocol == base)
        .map(|r| {
            let mut p = r.params.clone();
            p.remove("error");
            (p, r.metrics.clone())
        })
        .collect();
    for r in rows.iter_mut() {
        let mut p = r.params.clone();
        p.remove("error");
        let scenario_keys: Vec<&str> = [
            "rtt_p50_ms",
            "rtt_p99_ms",
            "jitter_ms",
            "fct_mean_ms",
            "goodput_mbps",
            "cpu_s_per_gb",
            "queue_delay_p95_ms",
            "on_time_pct",
        ]
        .to_vec();
        if let Some((_, bm)) = keys.iter().find(|(k, _)| *k == p) {
            for key in scenario_keys {
                if let (Some(a), Some(b)) = (r.metrics.get(key).copied(), bm.get(key).copied()) {
                    if b > 0.0 && a.is_finite() && b.is_finite() {
                        let short = key.trim_end_matches("_ms").trim_end_matches("_mbps");
                        r.metrics.insert(format!("{short}_vs_{base}"), a / b);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results file of `cases` as the summary sees it (the rest left empty).
    fn run_file(scenario: &str, profile: &str, cases: Vec<crate::results::Case>) -> RunFile {
        RunFile {
            schema: crate::results::SCHEMA,
            scenario: scenario.into(),
            profile: profile.into(),
            variant: String::new(),
            date: String::new(),
            duration_s: 0.0,
            command: vec![],
            quick: true,
            machine: Default::default(),
            versions: Default::default(),
            settings: json!({}),
            cases,
            summary: vec![],
            skipped: vec![],
        }
    }

    fn rpc(seq: u32, size: u32, rtt_ms: Option<f64>) -> RpcSample {
        RpcSample {
            seq,
            size,
            reply: 100,
            t_ms: f64::from(seq) * 33.3,
            rtt_ms,
        }
    }

    #[test]
    fn on_time_counts_every_request_sent() {
        let samples = [
            rpc(0, 1_000, Some(20.0)),
            rpc(1, 3_000, Some(150.0)), // exactly at the deadline: on time
            rpc(2, 5_000, Some(150.001)), // answered late
            rpc(3, 7_000, None),        // never answered: late
        ];
        let (frac, size) = on_time(&samples, 150.0);
        assert!((frac - 0.5).abs() < 1e-12, "{frac}");
        assert!((size - 2_000.0).abs() < 1e-9, "{size}");
        // A longer deadline takes the late answer in, never the missing one.
        let (frac, size) = on_time(&samples, 200.0);
        assert!((frac - 0.75).abs() < 1e-12);
        assert!((size - 3_000.0).abs() < 1e-9);
        let (frac, size) = on_time(&samples[3..], 150.0);
        assert_eq!(frac, 0.0);
        assert!(size.is_nan(), "nothing on time: no size");
        let (frac, _) = on_time(&[], 150.0);
        assert!(frac.is_nan(), "nothing sent");
    }

    #[test]
    fn the_encoder_sends_the_largest_size_its_rate_carries_per_frame() {
        let iv = 1.0 / 30.0;
        // No target yet: the lowest quality.
        assert_eq!(encoder_frame_size(None, iv, &MAR_SIZES), 4_500);
        // Below the smallest size's rate (4.5 kB × 30 = 135 kB/s): still the smallest.
        assert_eq!(encoder_frame_size(Some(100_000), iv, &MAR_SIZES), 4_500);
        assert_eq!(encoder_frame_size(Some(0), iv, &MAR_SIZES), 4_500);
        // Exactly a size's rate takes that size; just under it, the one below.
        assert_eq!(
            encoder_frame_size(Some(26_100 * 30), iv, &MAR_SIZES),
            26_100
        );
        assert_eq!(
            encoder_frame_size(Some(26_100 * 30 - 1), iv, &MAR_SIZES),
            16_800
        );
        // 3.75 MB/s (30 Mbit/s): 125 kB a frame, so 97.4 kB.
        assert_eq!(encoder_frame_size(Some(3_750_000), iv, &MAR_SIZES), 97_400);
        // More than the largest size needs: the largest.
        assert_eq!(encoder_frame_size(Some(u64::MAX), iv, &MAR_SIZES), 151_200);
        assert_eq!(encoder_frame_size(Some(1), iv, &[]), 0);
    }

    #[test]
    fn the_mar_encoder_backs_off_while_frames_are_late_and_recovers_after() {
        let iv = 1.0 / 30.0;
        let rate = Some(97_400 * 30);
        let mut enc = MarEncoder::default();
        // It starts at half the rate and reaches the whole of it in about 3 s (1.25^3.1 = 2).
        assert_eq!(enc.next_size(rate, iv, &MAR_SIZES, false), 40_500);
        for _ in 0..30 * 3 {
            enc.next_size(rate, iv, &MAR_SIZES, false);
        }
        assert!(enc.gain() > 0.95 && enc.gain() < 1.0, "{}", enc.gain());
        for _ in 0..30 {
            enc.next_size(rate, iv, &MAR_SIZES, false);
        }
        assert_eq!(enc.next_size(rate, iv, &MAR_SIZES, false), 97_400);
        // Each late frame cuts the gain: 0.8 (77.9 kB), 0.64 (62.3 kB), 0.51, ... down to 0.2.
        let sizes: Vec<u32> = (0..10)
            .map(|_| enc.next_size(rate, iv, &MAR_SIZES, true))
            .collect();
        assert_eq!(&sizes[..3], &[62_800, 40_500, 40_500]);
        assert!((enc.gain() - MarEncoder::GAIN_MIN).abs() < 1e-9);
        assert_eq!(sizes[9], 16_800);
        // Never above the transport's rate, however long nothing is late.
        for _ in 0..30 * 60 {
            enc.next_size(rate, iv, &MAR_SIZES, false);
        }
        assert_eq!(enc.gain(), 1.0);
        assert_eq!(enc.next_size(rate, iv, &MAR_SIZES, false), 97_400);
        // No rate yet: the smallest level, whatever the gain.
        assert_eq!(enc.next_size(None, iv, &MAR_SIZES, false), 4_500);
    }

    #[test]
    fn an_adaptive_row_is_one_row_over_every_frame_with_its_mean_sizes() {
        let case = Case {
            protocol: "tern-adaptive-150ms".into(),
            params: params(&[("loss", json!(1.0))]),
            rpc: vec![
                rpc(0, 4_500, Some(40.0)),
                rpc(1, 10_800, Some(60.0)),
                rpc(2, 10_800, Some(300.0)),
                rpc(3, 26_100, None),
            ],
            ..Case::default()
        };
        let tcp = Case {
            protocol: "tcp".into(),
            params: params(&[("loss", json!(1.0))]),
            rpc: vec![rpc(0, 4_500, Some(50.0)), rpc(0, 26_100, Some(500.0))],
            ..Case::default()
        };
        let mut run = run_file("mar", "lte", vec![case, tcp]);
        let rows = summarize(&run);
        let a: Vec<&Row> = rows
            .iter()
            .filter(|r| r.protocol.starts_with("tern-adaptive"))
            .collect();
        assert_eq!(a.len(), 1, "one row, not one per size chosen");
        assert_eq!(a[0].text("size"), ADAPTIVE_SIZE);
        let m = &a[0].metrics;
        assert_eq!(m["n"], 4.0);
        assert_eq!(m["on_time_pct"], 50.0);
        assert!((m["on_time_size_mean_bytes"] - 7_650.0).abs() < 1e-9);
        assert!((m["sent_size_mean_bytes"] - 13_050.0).abs() < 1e-9);
        assert_eq!(m["lost_pct"], 25.0);
        assert!(
            !m.contains_key("rtt_p99_vs_tcp"),
            "no TCP row to compare with"
        );
        // Cycled rows stay per size, each with its size as the mean sent.
        let t: Vec<&Row> = rows.iter().filter(|r| r.protocol == "tcp").collect();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].metrics["sent_size_mean_bytes"], 26_100.0);
        // The pivot shows the adaptive row's figures and both mean sizes.
        run.summary = rows;
        let md = crate::report::markdown(&run);
        let line = md
            .lines()
            .find(|l| l.contains("tern-adaptive-150ms"))
            .expect("an adaptive line");
        assert!(line.contains("| 50.0 | 50.0 | 13.1 | 7.7 |"), "{line}");
        let tcp_line = md.lines().find(|l| l.starts_with("| tcp |")).unwrap();
        // tcp: 4.5 and 26.1 kB sent, only the 4.5 kB one on time.
        assert!(tcp_line.contains("| 15.3 | 4.5 |"), "{tcp_line}");
        // The figures take the adaptive row as a point at its mean frame size.
        let dir = std::env::temp_dir().join(format!("tern-bench-adaptive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let figs = crate::plot::render(&run, &dir).unwrap();
        assert!(!figs.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mar_rows_carry_the_on_time_fraction_against_the_runs_deadline() {
        let case = Case {
            protocol: "tern-msg".into(),
            params: params(&[("loss", json!(0.0))]),
            rpc: vec![
                rpc(0, 4_500, Some(40.0)),
                rpc(1, 4_500, Some(120.0)),
                rpc(2, 4_500, Some(400.0)),
                rpc(3, 4_500, None),
            ],
            ..Case::default()
        };
        let mut run = run_file("mar", "lte", vec![case]);
        let rows = summarize(&run);
        let m = &rows[0].metrics;
        assert_eq!(m["on_time_pct"], 50.0, "default deadline 150 ms");
        assert_eq!(m["on_time_size_mean_bytes"], 4_500.0);
        // RTT statistics still count answered requests only.
        assert_eq!(m["lost_pct"], 25.0);
        assert_eq!(m["rtt_p50_ms"], 120.0);
        run.settings = json!({"deadline_ms": 100.0});
        assert_eq!(summarize(&run)[0].metrics["on_time_pct"], 25.0);
        let md = crate::report::markdown(&RunFile {
            summary: summarize(&run),
            ..run.clone()
        });
        assert!(md.contains("within 100 ms"), "{md}");
        assert!(md.contains("| on time % | on time (all) % |"), "{md}");
        // The plan records the deadline it was given.
        let mut o = opts("mar", None);
        o.deadline_ms = 80.0;
        assert_eq!(plan(&o).unwrap().settings["deadline_ms"], json!(80.0));
        let p = plan(&opts("cc", None)).unwrap();
        assert_eq!(p.settings["deadline_ms"], json!(150.0));
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_hog() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[3.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        assert!((jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
        assert!(jain(&[]).is_nan() && jain(&[0.0, 0.0]).is_nan());
    }

    #[test]
    fn coexist_plans_three_buffers_with_a_kernel_tcp_flow_beside_the_row() {
        let mut o = opts("coexist", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "lte");
        assert_eq!(p.protocols, [Proto::Tern, Proto::Tcp, Proto::TcpBbr]);
        assert_eq!(
            p.tern_modes,
            [
                "flows:cc=cubic",
                "flows:cc=cubic:tolerance=off",
                "flows:cc=bbr",
                "flows:cc=copa"
            ]
        );
        let names: Vec<String> = p.cases.iter().map(|c| pval_of(&c.params, "case")).collect();
        assert_eq!(names, ["deep", "half", "shallow"]);
        for c in &p.cases {
            let flows = &c.multi.as_ref().unwrap().flows;
            let protos: Vec<Option<Proto>> = flows.iter().map(|f| f.proto).collect();
            assert_eq!(protos, [None, Some(Proto::Tcp)]);
            assert!(flows.iter().all(|f| f.start_ms == 0 && f.dir == "down"));
        }
        // The shallow buffer is a tenth of lte's 35 ms at 30 Mbit/s.
        let cfg = p.emulation(&p.cases[2], 7).unwrap().unwrap();
        let queue = format!("{:?}", cfg.links["r"].down);
        assert!(queue.contains("3.5ms") || queue.contains("3500"), "{queue}");
        // Two paths are not one bottleneck.
        let mut two = opts("coexist", None);
        two.profile = Some("viscous".into());
        assert!(plan(&two).is_err());
    }

    #[test]
    fn coexist_rows_carry_the_share_and_the_queue_drops() {
        let case = Case {
            protocol: "tern-cubic".into(),
            links: vec![crate::results::LinkStat {
                offered: 1000,
                dropped_queue: 25,
                ..down("r", 0)
            }],
            ..Case::default()
        };
        let mut m = BTreeMap::new();
        m.insert("flow0_mbps".to_string(), 6.0);
        m.insert("flow1_mbps".to_string(), 2.0);
        coexist_metrics(&case, &mut m);
        assert_eq!(m["share_pct"], 75.0);
        assert_eq!(m["queue_drop_pct"], 2.5);
    }

    #[test]
    fn fairness_plans_four_cases_and_skips_the_router_row_until_it_exists() {
        let mut o = opts("fairness", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "ncvdn");
        assert_eq!(p.protocols, [Proto::Tern, Proto::Tcp, Proto::TcpBbr]);
        let names: Vec<String> = p.cases.iter().map(|c| pval_of(&c.params, "case")).collect();
        assert_eq!(names, ["together", "staggered", "rtts", "parking-lot"]);
        match router_unavailable() {
            Some(why) => {
                assert!(p.routed_modes.is_empty());
                assert!(p
                    .skipped
                    .iter()
                    .any(|s| s.protocol == ROUTER_ROW && s.reason == why));
                assert_eq!(
                    p.tern_modes,
                    ["flows:cc=cubic", "flows:cc=bbr", "flows:cc=copa"]
                );
            }
            None => {
                assert_eq!(p.routed_modes, [ROUTER_MODE]);
                assert_eq!(p.tern_modes[0], ROUTER_MODE);
            }
        }
        let flows = |i: usize| p.cases[i].multi.clone().unwrap().flows;
        // Staggered: 4 s apart (quick), all ending together.
        let st = flows(1);
        assert_eq!(
            st.iter()
                .map(|f| (f.start_ms, f.start_ms + f.duration_ms))
                .collect::<Vec<_>>(),
            [(0, 16_000), (4_000, 16_000), (8_000, 16_000)]
        );
        // rtts: the shared bottleneck without delay, each access link the flow's RTT.
        use std::time::Duration;
        use tern_netem::RateModel;
        let cfg = p.emulation(&p.cases[2], 7).unwrap().unwrap();
        assert_eq!(cfg.links["r"].down.delay, Duration::ZERO);
        assert!(matches!(
            cfg.links["r"].down.rate,
            RateModel::Constant(1_000_000)
        ));
        assert_eq!(cfg.links["a1"].down.delay, Duration::from_millis(40));
        assert_eq!(cfg.links["a3"].up.delay, Duration::from_millis(60));
        assert!(matches!(cfg.links["a2"].down.rate, RateModel::Unlimited));
        assert_eq!(
            flows(2)
                .iter()
                .map(|f| f.server.as_str())
                .collect::<Vec<_>>(),
            ["s1", "s2", "s3"]
        );
        // Parking lot: its own profile's 660 kbit/s, the long flow across both bottlenecks.
        let cfg = p.emulation(&p.cases[3], 7).unwrap().unwrap();
        assert!(matches!(cfg.default.up.rate, RateModel::Constant(660_000)));
        assert_eq!(cfg.default.up.delay, Duration::from_millis(35));
        let lot = flows(3);
        assert_eq!(lot[0].bottlenecks, ["b1", "b2"]);
        assert_eq!(lot[1].bottlenecks, ["b1"]);
        assert_eq!(lot[2].bottlenecks, ["b2"]);
        assert!(lot.iter().all(|f| f.dir == "up"));
        assert_eq!(p.cases[3].params["capacity_mbps"], json!(0.66));
        // The router row's emulation names the setting on every bottleneck direction (it
        // fails to parse until tern-netem knows it).
        let routed = p.emulation_routed(&p.cases[3], 7, true);
        assert_eq!(routed.is_err(), router_unavailable().is_some());
        // Only a single-bottleneck profile; other scenarios refuse the parking lot.
        o.profile = Some("parking-lot".into());
        assert!(plan(&o).is_err());
        let mut mar = opts("mar", None);
        mar.profile = Some("parking-lot".into());
        assert!(plan(&mar).is_err());
    }

    /// A fairness flow that delivered `rate` bytes per 100 ms bin from its start.
    fn fair_flow(
        flow: u32,
        start_ms: f64,
        duration_ms: u64,
        rate: u64,
        links: &[&str],
    ) -> crate::results::FairFlowRun {
        crate::results::FairFlowRun {
            flow,
            client: "c".into(),
            server: "s".into(),
            start_ms,
            duration_ms,
            rtt_ms: 140.0,
            bottlenecks: links.iter().map(|l| l.to_string()).collect(),
            dir: "down".into(),
            protocol: None,
            transfer: Some(TransferSample {
                bin_ms: 100,
                bins: vec![rate; (duration_ms / 100) as usize],
                ..TransferSample::default()
            }),
            error: None,
        }
    }

    /// A `fairness` case's parameters: flows started together on a 2 Mbit/s bottleneck, 2 s
    /// of warm-up.
    fn together_on_2_mbit() -> BTreeMap<String, Value> {
        params(&[
            ("case", json!("together")),
            ("capacity_mbps", json!(2.0)),
            ("warmup_s", json!(2)),
        ])
    }

    #[test]
    fn a_fairness_file_from_before_the_steady_wait_still_reads() {
        let w: crate::results::LinkWindow = serde_json::from_str(
            r#"{"link":"r","dir":"down","from_s":2.0,"to_s":10.0,"delivered_bytes":1900000}"#,
        )
        .unwrap();
        assert_eq!((w.queue_wait_mean_ms, w.queue_wait_p95_ms), (None, None));
        let case = Case {
            protocol: "tcp".into(),
            params: together_on_2_mbit(),
            fair_flows: vec![fair_flow(0, 0.0, 10_000, 10_000, &["r"])],
            link_windows: vec![w],
            ..Case::default()
        };
        let rows = summarize(&run_file("fairness", "ncvdn", vec![case]));
        let m = &rows[0].metrics;
        assert!((m["link_util_r_pct"] - 95.0).abs() < 1e-9);
        assert!(!m.contains_key("queue_wait_steady_mean_ms"));
        assert!(!m.contains_key("qwait_r_steady_mean_ms"));
    }

    #[test]
    fn fairness_rows_carry_jain_throughput_utilisation_and_queueing_delay() {
        let link = |name: &str, dir: &str, mean, p95| crate::results::LinkStat {
            link: name.into(),
            dir: dir.into(),
            offered: 0,
            delivered_bytes: 0,
            dropped_queue: 0,
            dropped_loss: 0,
            dropped_outage: 0,
            queue_max_bytes: 0,
            queue_delay_mean_ms: Some(mean),
            queue_delay_p95_ms: Some(p95),
            queue_wait_mean_ms: Some(mean / 10.0),
            queue_wait_p95_ms: Some(p95 / 10.0),
        };
        // Two flows of 10 kB/100 ms (0.8 Mbit/s) and one of 2.5 kB (0.2), 10 s, 1 Mbit/s
        // link... over capacity on purpose: the figures are what was delivered.
        let case = Case {
            protocol: "tcp".into(),
            params: together_on_2_mbit(),
            fair_flows: vec![
                fair_flow(0, 0.0, 10_000, 10_000, &["r"]),
                fair_flow(1, 0.0, 10_000, 10_000, &["r"]),
                fair_flow(2, 0.0, 10_000, 2_500, &["r"]),
            ],
            links: vec![link("r", "down", 30.0, 90.0), link("r", "up", 1.0, 2.0)],
            // 2 Mbit/s for 8 s is 2 MB; the link delivered 1.9 MB of it on the data's way.
            link_windows: vec![
                crate::results::LinkWindow {
                    link: "r".into(),
                    dir: "down".into(),
                    from_s: 2.0,
                    to_s: 10.0,
                    delivered_bytes: 1_900_000,
                    queue_wait_mean_ms: Some(1.5),
                    queue_wait_p95_ms: Some(4.0),
                },
                crate::results::LinkWindow {
                    link: "r".into(),
                    dir: "up".into(),
                    from_s: 2.0,
                    to_s: 10.0,
                    delivered_bytes: 1,
                    queue_wait_mean_ms: Some(7.0),
                    queue_wait_p95_ms: Some(8.0),
                },
            ],
            ..Case::default()
        };
        let over_time = jain_over_time(&case);
        assert_eq!(over_time.len(), 10);
        let want = jain(&[0.8, 0.8, 0.2]);
        assert!(over_time.iter().all(|(_, j)| (j - want).abs() < 1e-9));
        let rows = summarize(&run_file("fairness", "ncvdn", vec![case.clone()]));
        let m = &rows[0].metrics;
        assert!((m["jain_mean"] - want).abs() < 1e-9 && (m["jain_min"] - want).abs() < 1e-9);
        assert!((m["flow0_mbps"] - 0.8).abs() < 1e-9);
        assert!((m["flow2_mbps"] - 0.2).abs() < 1e-9);
        assert!((m["throughput_mbps"] - 1.8).abs() < 1e-9);
        assert!((m["util_r_pct"] - 90.0).abs() < 1e-9);
        assert!(
            (m["link_util_r_pct"] - 95.0).abs() < 1e-9,
            "the data's direction"
        );
        assert!((m["link_utilisation_pct"] - 95.0).abs() < 1e-9);
        assert_eq!(m["qdelay_r_p95_ms"], 90.0, "the data's direction");
        assert_eq!(m["queue_delay_mean_ms"], 30.0);
        assert_eq!(m["qwait_r_mean_ms"], 3.0, "the data's direction");
        assert_eq!(m["queue_wait_mean_ms"], 3.0);
        assert_eq!(m["queue_wait_p95_ms"], 9.0);
        assert_eq!(
            m["qwait_r_steady_mean_ms"], 1.5,
            "the data's direction, steady part"
        );
        assert_eq!(m["queue_wait_steady_mean_ms"], 1.5);
        assert_eq!(m["queue_wait_steady_p95_ms"], 4.0);
        assert_eq!(m["flows_failed"], 0.0);
        assert!(!rows[0].params.contains_key("warmup_s"));
        // Staggered: flows join at 2 s and 4 s; one alone gives no index; the steady part
        // starts 2 s (the warm-up) after the last start.
        let mut st = case.clone();
        st.fair_flows = vec![
            fair_flow(0, 0.0, 10_000, 10_000, &["r"]),
            fair_flow(1, 2_000.0, 8_000, 10_000, &["r"]),
            fair_flow(2, 4_000.0, 6_000, 5_000, &["r"]),
        ];
        let t = jain_over_time(&st);
        assert_eq!(t.first().map(|p| p.0), Some(2.0), "two flows from 2 s");
        assert!((t[0].1 - 1.0).abs() < 1e-9);
        let m = &summarize(&run_file("fairness", "ncvdn", vec![st]))[0].metrics;
        assert!((m["jain_mean"] - jain(&[2.0, 2.0, 1.0])).abs() < 1e-9);
        // A flow that never reported counts as failed and as a zero share.
        let mut lost = case;
        lost.fair_flows[2].transfer = None;
        lost.fair_flows[2].error = Some("no report".into());
        let m = &summarize(&run_file("fairness", "ncvdn", vec![lost]))[0].metrics;
        assert_eq!(m["flows_failed"], 1.0);
        assert!((m["jain_mean"] - jain(&[1.0, 1.0, 0.0])).abs() < 1e-9);
    }

    #[test]
    fn video_rows_count_frames_missed_late_or_never() {
        use crate::results::{FrameSample, VideoSample};
        let frame = |index, size, latency_ms| FrameSample {
            index,
            size,
            latency_ms,
        };
        let video = |frames: Vec<FrameSample>| {
            Some(VideoSample {
                fps: 30,
                frames_due: 4,
                playout_ms: 150.0,
                frames,
            })
        };
        let mut flows = vec![
            fair_flow(0, 0.0, 1_000, 1_000, &["r"]),
            fair_flow(1, 0.0, 1_000, 1_000, &["r"]),
            fair_flow(2, 0.0, 1_000, 1_000, &["r"]),
        ];
        // Flow 0: all 4 on time. Flow 1: one late, one never. Flow 2: no report (30 due).
        flows[0].transfer.as_mut().unwrap().video = video(
            (0..4)
                .map(|i| frame(i, 2_000, 40.0 + f64::from(i)))
                .collect(),
        );
        flows[1].transfer.as_mut().unwrap().video = video(vec![
            frame(0, 1_000, 20.0),
            frame(1, 1_000, 150.0),
            frame(2, 1_000, 151.0),
        ]);
        flows[2].transfer = None;
        let case = Case {
            protocol: "tern-cubic".into(),
            params: params(&[
                ("case", json!("together")),
                ("load", json!("video")),
                ("capacity_mbps", json!(1.0)),
                ("warmup_s", json!(0)),
            ]),
            fair_flows: flows,
            ..Case::default()
        };
        let rows = summarize(&run_file("fairness", "ncvdn", vec![case.clone()]));
        let m = &rows[0].metrics;
        assert_eq!(m["frames_sent"], 38.0, "4 + 4 + 30 due");
        assert_eq!(m["frames_missed"], 32.0, "0 + 2 + 30");
        assert!((m["miss_pct"] - 100.0 * 32.0 / 38.0).abs() < 1e-9);
        assert_eq!(m["flow0_miss_pct"], 0.0);
        assert_eq!(m["flow1_miss_pct"], 50.0);
        assert_eq!(m["flow2_miss_pct"], 100.0);
        // The mean over the 7 frames received.
        assert!((m["frame_size_mean_bytes"] - 11_000.0 / 7.0).abs() < 1e-9);
        assert_eq!(rows[0].text("load"), "video");
        // Backlogged cases carry no frame figures.
        let mut bulk = case;
        bulk.params.insert("load".into(), json!("bulk"));
        let m = &summarize(&run_file("fairness", "ncvdn", vec![bulk]))[0].metrics;
        assert!(!m.contains_key("miss_pct"));
        assert!(m.contains_key("jain_mean"));
    }

    #[test]
    fn fairness_runs_each_case_once_per_load() {
        let mut o = opts("fairness", None);
        o.quick = true;
        let p = plan(&o).unwrap();
        assert_eq!(p.cases.len(), 4);
        for c in &p.cases {
            assert_eq!(c.params["load"], json!("video"), "video by default");
            let Work::Transfer(t) = &c.work else {
                panic!("fairness runs transfers")
            };
            assert_eq!(t.video.map(|v| v.fps), Some(30));
        }
        o.loads = Some(vec!["video".into(), "bulk".into()]);
        let p = plan(&o).unwrap();
        assert_eq!(p.cases.len(), 8);
        let bulk: Vec<&CaseDef> = p
            .cases
            .iter()
            .filter(|c| c.params["load"] == json!("bulk"))
            .collect();
        assert_eq!(bulk.len(), 4);
        assert!(bulk
            .iter()
            .all(|c| matches!(&c.work, Work::Transfer(t) if t.video.is_none())));
        o.loads = Some(vec!["movies".into()]);
        assert!(plan(&o).is_err());
    }

    #[test]
    fn link_settings_make_distinct_file_names() {
        assert_eq!(link_slug("reorder=2%,5ms"), "reorder-2-5ms");
        assert_eq!(link_slug("reorder=10%,20ms"), "reorder-10-20ms");
        assert_eq!(link_slug("queue=50ms loss=0.5%"), "queue-50ms-loss-0.5");
    }

    fn opts(scenario: &str, link: Option<&str>) -> RunOpts {
        RunOpts {
            scenario: scenario.into(),
            profile: None,
            loss: None,
            trace: None,
            quick: true,
            protocols: Some(vec![Proto::Tern, Proto::Tcp, Proto::Quic]),
            rtts: None,
            threads: None,
            tern_mode: None,
            tern_cc: None,
            qlog: None,
            seed: 7,
            link_extra: link.map(Into::into),
            count: None,
            deadline_ms: DEFAULT_DEADLINE_MS,
            loads: None,
        }
    }

    #[test]
    fn link_settings_reach_every_direction_on_top_of_the_profile() {
        use std::time::Duration;
        use tern_netem::RateModel;
        let plain = plan(&opts("long-flow", None)).unwrap();
        let reordered = plan(&opts("long-flow", Some("reorder=2%,5ms"))).unwrap();
        let more = plan(&opts("long-flow", Some("reorder=10%,20ms queue=50ms"))).unwrap();
        assert_eq!(plain.variant, "");
        assert_eq!(reordered.variant, "reorder-2-5ms");
        assert_eq!(more.variant, "reorder-10-20ms-queue-50ms");
        for (p, reorder, delay) in [
            (&plain, 0.0, Duration::ZERO),
            (&reordered, 0.02, Duration::from_millis(5)),
            (&more, 0.10, Duration::from_millis(20)),
        ] {
            for def in &p.cases {
                let cfg = p.emulation(def, 7).unwrap().expect("path50 is emulated");
                assert!(cfg.links.is_empty(), "every link alike");
                for d in [&cfg.default.up, &cfg.default.down] {
                    assert_eq!(d.reorder, reorder);
                    assert_eq!(d.reorder_delay, delay);
                    // The profile's settings are kept.
                    assert_eq!(d.delay, Duration::from_millis(40));
                    assert!(matches!(d.rate, RateModel::Constant(50_000_000)));
                    assert_eq!(d.seed, Some(7));
                }
            }
        }
        let q = more.emulation(&more.cases[0], 7).unwrap().unwrap();
        assert_eq!(
            q.default.up.queue,
            tern_netem::units::parse_queue("50ms").unwrap()
        );
        // Nothing emulates loopback: --link, --loss there are refused, not ignored.
        assert!(plan(&opts("bulk", None))
            .unwrap()
            .emulation(&plan(&opts("bulk", None)).unwrap().cases[0], 7)
            .unwrap()
            .is_none());
        assert!(plan(&opts("bulk", Some("reorder=2%,5ms"))).is_err());
        let mut lossy = opts("bulk", None);
        lossy.loss = Some(1.0);
        assert!(plan(&lossy).is_err());
        // A bad setting fails before anything runs.
        assert!(plain
            .profile
            .emulation(&LinkOptions {
                extra: Some("reorder=2%".into()),
                ..Default::default()
            })
            .is_err());
    }

    #[test]
    fn bulk_rows_carry_the_loss_and_drop_figures() {
        let tern = Case {
            protocol: "tern".into(),
            params: params(&[("size", json!(1000)), ("rep", json!(0))]),
            flows: vec![crate::results::FlowSample {
                thread: 0,
                index: 0,
                size: 1000,
                start_ms: 0.0,
                fct_ms: Some(10.0),
                received: 1000,
            }],
            extra: json!([{
                "client": {"packets_lost": 0, "datagrams_dropped": 2},
                "server": {"packets_lost": 4, "spurious_losses": 1, "bytes_retransmitted": 5000,
                           "congestion_events": 1, "congestion_events_undone": 1,
                           "reorder_threshold": 9, "reorder_window_ms": 1.5, "ecn": "capable"}
            }]),
            udp_rcvbuf_errors: Some(3),
            udp_sndbuf_errors: Some(1),
            udp_in_errors: Some(4),
            cpu: Some(crate::results::CpuUse {
                client_s: 1.0,
                server_s: Some(1.0),
            }),
            client_socket_drops: Some(2),
            server_socket_drops: Some(0),
            ..Case::default()
        };
        let mut quinn = tern.clone();
        quinn.protocol = "quic".into();
        quinn.extra = json!([{"client": {}, "server": {"packets_lost": 7, "bytes_lost": 9000, "congestion_events": 2}}]);
        let run = run_file("bulk", "loopback", vec![tern, quinn]);
        let rows = summarize(&run);
        let t = &rows[0].metrics;
        assert_eq!(t["sender_packets_lost"], 4.0);
        assert_eq!(t["sender_spurious_losses"], 1.0);
        assert_eq!(t["sender_bytes_retransmitted"], 5000.0);
        assert_eq!(t["sender_congestion_events_undone"], 1.0);
        assert_eq!(t["sender_reorder_threshold"], 9.0);
        assert_eq!(t["receiver_datagrams_dropped"], 2.0);
        assert_eq!(t["receiver_socket_drops"], 2.0);
        assert_eq!(t["sender_socket_drops"], 0.0);
        assert_eq!(t["rcvbuf_errors"], 3.0);
        assert_eq!(t["udp_rcvbuf_errors"], 3.0);
        assert_eq!(t["udp_sndbuf_errors"], 1.0);
        assert_eq!(t["udp_in_errors"], 4.0);
        // Issue 12's ratios, from the same run.
        assert_eq!(t["goodput_vs_quic"], 1.0);
        assert_eq!(t["cpu_s_per_gb_vs_quic"], 1.0);
        let q = &rows[1].metrics;
        assert_eq!(q["sender_packets_lost"], 7.0);
        assert_eq!(q["sender_bytes_lost"], 9000.0);
        assert_eq!(q["sender_congestion_events"], 2.0);
        assert!(!q.contains_key("sender_spurious_losses"));
        assert!(
            !t.contains_key("link_drops_down"),
            "loopback has no emulator"
        );
        let md = crate::report::markdown(&RunFile {
            summary: rows,
            ..run
        });
        assert!(md.contains("| lost pkts | spurious |"), "{md}");
        assert!(
            md.contains("| UDP rcvbuf errs | UDP sndbuf errs | UDP in errs |"),
            "{md}"
        );
    }

    #[test]
    fn long_flow_rows_carry_the_link_drops_and_no_goodput_when_nothing_completed() {
        let link = |dir: &str, queue, loss| crate::results::LinkStat {
            link: "r".into(),
            dir: dir.into(),
            offered: 100,
            delivered_bytes: 0,
            dropped_queue: queue,
            dropped_loss: loss,
            dropped_outage: 0,
            queue_max_bytes: 0,
            queue_delay_mean_ms: None,
            queue_delay_p95_ms: None,
            queue_wait_mean_ms: None,
            queue_wait_p95_ms: None,
        };
        let flow = |fct_ms| crate::results::FlowSample {
            thread: 0,
            index: 0,
            size: 1000,
            start_ms: 0.0,
            fct_ms,
            received: 900,
        };
        let done = Case {
            protocol: "tern".into(),
            params: params(&[("size", json!(1000))]),
            flows: vec![flow(Some(8.0))],
            links: vec![link("up", 0, 1), link("down", 5, 2)],
            ..Case::default()
        };
        let failed = Case {
            protocol: "quic".into(),
            flows: vec![flow(None)],
            ..done.clone()
        };
        let run = run_file("long-flow", "path50", vec![done, failed]);
        let rows = summarize(&run);
        assert_eq!(rows[0].metrics["link_drops_down"], 7.0);
        assert_eq!(rows[0].metrics["link_drops_up"], 1.0);
        assert!((rows[0].metrics["goodput_mbps"] - 0.9).abs() < 1e-9);
        assert_eq!(rows[1].metrics["failed"], 1.0);
        assert!(!rows[1].metrics.contains_key("goodput_mbps"));
    }

    fn transfer(size: u64, received: u64, gap: f64, connections: u32) -> TransferSample {
        TransferSample {
            size,
            received,
            completed: received >= size || size == u64::MAX,
            start_ms: 0.0,
            first_byte_ms: Some(100.0),
            last_byte_ms: Some(10_100.0),
            max_gap_ms: gap,
            max_gap_at_ms: 5_000.0,
            event_gap_ms: None,
            event_gap_at_ms: None,
            bin_ms: 100,
            bins: vec![],
            connections,
            first_connection_bytes: received,
            reconnect_ms: (connections > 1).then_some(250.0),
            window_resume_ms: None,
            rebinds: 0,
            video: None,
        }
    }

    fn down(link: &str, bytes: u64) -> crate::results::LinkStat {
        crate::results::LinkStat {
            link: link.into(),
            dir: "down".into(),
            offered: 0,
            delivered_bytes: bytes,
            dropped_queue: 0,
            dropped_loss: 0,
            dropped_outage: 0,
            queue_max_bytes: 0,
            queue_delay_mean_ms: None,
            queue_delay_p95_ms: None,
            queue_wait_mean_ms: None,
            queue_wait_p95_ms: None,
        }
    }

    /// One flow of 1 MB, received whole in `fct_ms`.
    fn megabyte_flow(fct_ms: f64) -> crate::results::FlowSample {
        crate::results::FlowSample {
            thread: 0,
            index: 0,
            size: 1_000_000,
            start_ms: 0.0,
            fct_ms: Some(fct_ms),
            received: 1_000_000,
        }
    }

    #[test]
    fn bulk_runs_the_async_agents_on_one_and_two_workers_and_compares_within_each() {
        let quick = plan(&opts("bulk", None)).unwrap();
        let workers: Vec<Option<u32>> = quick.cases.iter().map(|c| c.workers).collect();
        assert_eq!(workers, [Some(1), Some(2)]);
        assert_eq!(quick.cases[0].params["threads"], json!(1));
        assert_eq!(quick.cases[1].params["threads"], json!(2));
        let mut o = opts("bulk", None);
        o.threads = Some(vec![3]);
        o.quick = false;
        let p = plan(&o).unwrap();
        assert_eq!(p.cases.len(), 3, "three repetitions of the one count");
        assert!(p.cases.iter().all(|c| c.workers == Some(3)));

        let mut o = opts("bulk", None);
        o.threads = Some(vec![1, 0]);
        assert!(plan(&o).is_err(), "no runtime has zero workers");

        // Ratios pair rows of the same thread count only: rows with the plan's own
        // parameters (cases 0 and 1 of the quick plan: one and two workers).
        let row = |proto: &str, threads: u32, fct_ms: f64| Case {
            protocol: proto.into(),
            params: quick.cases[threads as usize - 1].params.clone(),
            flows: vec![megabyte_flow(fct_ms)],
            ..Case::default()
        };
        let run = run_file(
            "bulk",
            "loopback",
            vec![
                row("tern", 1, 10.0),
                row("quic", 1, 30.0),
                row("tern", 2, 20.0),
                row("quic", 2, 20.0),
            ],
        );
        let rows = summarize(&run);
        let ratio = |threads: u32| {
            rows.iter()
                .find(|r| r.protocol == "tern" && r.params["threads"] == json!(threads))
                .map(|r| r.metrics["goodput_vs_quic"])
                .unwrap()
        };
        assert!((ratio(1) - 3.0).abs() < 1e-9);
        assert!((ratio(2) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn bulk_figures_draw_a_series_per_worker_count_and_read_older_files() {
        let case = |proto: &str, params: BTreeMap<String, Value>| Case {
            protocol: proto.into(),
            params,
            flows: vec![megabyte_flow(10.0)],
            ..Case::default()
        };
        let quick = plan(&opts("bulk", None)).unwrap();
        let dir = std::env::temp_dir().join(format!("tern-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let goodput_svg = |cases: Vec<Case>| {
            let mut run = run_file("bulk", "loopback", cases);
            run.summary = summarize(&run);
            let figures = crate::plot::render(&run, &dir).unwrap();
            let (_, path) = figures
                .iter()
                .find(|(_, p)| p.to_string_lossy().ends_with("-goodput.svg"))
                .expect("a goodput figure");
            std::fs::read_to_string(path).unwrap()
        };
        let now = goodput_svg(vec![
            case("tern", quick.cases[0].params.clone()),
            case("tern", quick.cases[1].params.clone()),
        ]);
        assert!(now.contains("1 worker") && now.contains("2 workers"));
        let old = goodput_svg(vec![case(
            "tern",
            params(&[("size", json!(1_000_000)), ("rep", json!(0))]),
        )]);
        assert!(old.contains("goodput") && !old.contains("worker"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn multipath_plans_one_path_and_two_equal_and_unequal_ones() {
        let mut o = opts("multipath", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "multipath");
        assert_eq!(p.protocols, vec![Proto::Tern, Proto::Tcp, Proto::Mptcp]);
        let names: Vec<&str> = p
            .cases
            .iter()
            .map(|c| c.params["paths"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["one", "equal", "unequal"]);
        for c in &p.cases {
            let Work::Transfer(t) = &c.work else {
                panic!("a transfer")
            };
            let one = c.params["paths"] == "one";
            assert_eq!(t.multipath, !one);
            assert_eq!(t.size, u64::MAX, "time-bounded bulk");
            assert_eq!(t.duration_ms, Some(10_000), "--quick: 10 s");
            assert_eq!(c.net, NetKind::Dual);
            assert!(c.events.is_empty());
            let excluded: Vec<Proto> = c.exclude.iter().map(|e| e.0).collect();
            assert_eq!(excluded.contains(&Proto::Mptcp), one);
            assert_eq!(excluded.contains(&Proto::Tcp), !one);
            assert!(!excluded.contains(&Proto::Tern));
        }
        assert_eq!(p.cases[1].params["sum_mbps"], json!(100.0));
        assert_eq!(p.cases[2].params["sum_mbps"], json!(60.0));
        // Unequal: path 2 is 10 Mbit/s with 80 ms RTT, path 1 the profile's.
        use std::time::Duration;
        use tern_netem::RateModel;
        let cfg = p.emulation(&p.cases[2], 7).unwrap().unwrap();
        for d in [&cfg.links["r2"].up, &cfg.links["r2"].down] {
            assert!(matches!(d.rate, RateModel::Constant(10_000_000)));
            assert_eq!(d.delay, Duration::from_millis(40));
        }
        assert!(matches!(
            cfg.default.down.rate,
            RateModel::Constant(50_000_000)
        ));
        assert_eq!(cfg.default.down.delay, Duration::from_millis(10));
        let cfg = p.emulation(&p.cases[1], 7).unwrap().unwrap();
        assert!(cfg.links.is_empty(), "equal paths");
        // A trace adds a Wi-Fi + trace pair, the trace on path 2 only.
        let dir = std::env::temp_dir().join(format!("tern-bench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x.down");
        std::fs::write(&file, "1\n2\n3\n4\n").unwrap();
        o.trace = Some(file.clone());
        let p = plan(&o).unwrap();
        let last = p.cases.last().unwrap();
        assert_eq!(last.params["paths"], "wifi+trace");
        let cfg = p.emulation(last, 7).unwrap().unwrap();
        assert!(matches!(cfg.links["r2"].down.rate, RateModel::Trace(_)));
        assert!(matches!(
            cfg.links["r1"].down.rate,
            RateModel::Constant(100_000_000)
        ));
        assert!(matches!(
            cfg.default.down.rate,
            RateModel::Constant(50_000_000)
        ));
        // 4 packets of 1500 B in 4 ms: 12 Mbit/s, plus Wi-Fi's 100.
        assert_eq!(last.params["sum_mbps"], json!(112.0));
        let _ = std::fs::remove_dir_all(&dir);
        // Two paths are needed.
        o.trace = None;
        o.profile = Some("path50".into());
        assert!(plan(&o).is_err());
    }

    #[test]
    fn handover_plans_each_event_on_its_network() {
        let mut o = opts("handover", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "handover");
        assert_eq!(
            p.protocols,
            vec![Proto::Tern, Proto::Mptcp, Proto::Quic, Proto::Tcp]
        );
        let events: Vec<&str> = p
            .cases
            .iter()
            .map(|c| c.params["event"].as_str().unwrap())
            .collect();
        // Cases on the same network are adjacent (one topology at a time).
        assert_eq!(events, ["rebind", "window", "blackhole", "all-move"]);
        let nets: Vec<NetKind> = p.cases.iter().map(|c| c.net).collect();
        assert_eq!(
            nets,
            [
                NetKind::Mobile,
                NetKind::Mobile,
                NetKind::Dual,
                NetKind::Dual
            ]
        );
        for c in &p.cases {
            let Work::Transfer(t) = &c.work else {
                panic!("a transfer")
            };
            assert_eq!(t.size, 40_000_000, "--quick");
            assert_eq!(t.duration_ms, None, "a fixed size: bytes lost are counted");
            assert!(t.follow_address);
            assert_eq!(
                t.event_at_ms,
                Some(HANDOVER_AT_MS),
                "the stall is the event's"
            );
            assert_eq!(t.resume_after_ms, Some(1_000));
            assert!(c.wildcard_client, "the client's source follows its moves");
            assert_eq!(c.params["stall_target_ms"], json!(90.0), "40 ms + 50 ms");
            assert!(c.events.iter().all(|e| e.at_ms() == HANDOVER_AT_MS));
            assert_eq!(t.multipath, c.net == NetKind::Dual);
            let window = c.params["event"] == "window";
            assert_eq!(t.window_ms.is_some(), window);
            if let Some((close, open)) = t.window_ms {
                assert!(close < HANDOVER_AT_MS && open > HANDOVER_AT_MS);
                // Only tern has a receive window to close.
                for proto in [Proto::Mptcp, Proto::Quic, Proto::Tcp] {
                    assert!(c.exclude.iter().any(|e| e.0 == proto));
                }
            } else {
                assert!(c.exclude.is_empty());
            }
        }
        assert!(matches!(
            &p.cases[0].events[..],
            [NetEvent::Move { from, to, .. }] if *from == Ipv4Addr::new(10, 77, 1, 1)
                && *to == Ipv4Addr::new(10, 77, 5, 1)
        ));
        assert!(matches!(
            &p.cases[2].events[..],
            [NetEvent::LinkDown { link, .. }] if link == "r1"
        ));
        assert_eq!(p.cases[3].events.len(), 2, "every client address moves");
        let mut full = o.clone();
        full.quick = false;
        let Work::Transfer(t) = &plan(&full).unwrap().cases[0].work else {
            panic!()
        };
        assert_eq!(t.size, 100_000_000);
        // UDP cannot carry a transfer; a mobile profile is needed.
        o.protocols = Some(vec![Proto::Tern, Proto::Udp]);
        assert_eq!(plan(&o).unwrap().skipped[0].protocol, "udp");
        o.profile = Some("lte".into());
        assert!(plan(&o).is_err());
        let mut mar = opts("mar", None);
        mar.profile = Some("handover".into());
        assert!(plan(&mar).is_err(), "only handover moves the client");
    }

    #[test]
    fn short_flows_runs_tern_on_one_path_and_on_both() {
        let p = plan(&opts("short-flows", None)).unwrap();
        assert_eq!(p.tern_modes, ["flows", "flows:multipath"]);
        let labels: Vec<String> = p
            .tern_modes
            .iter()
            .map(|m| crate::proto::ternp::label_for(m).unwrap())
            .collect();
        assert_eq!(labels, ["tern", "tern-mp"]);
        assert!(p
            .cases
            .iter()
            .all(|c| !c.wildcard_client && c.net == NetKind::Dual));
    }

    #[test]
    fn multipath_rows_compare_with_one_path_mptcp_and_the_sum() {
        let case = |proto: &str, paths: &str, sum: f64, mbit: f64, r1: u64, r2: u64| Case {
            protocol: proto.into(),
            params: params(&[
                ("paths", json!(paths)),
                ("sum_mbps", json!(sum)),
                ("duration_s", json!(10)),
            ]),
            // 10 s from first to last byte.
            transfer: Some(transfer(u64::MAX, (mbit * 1e6 / 8.0 * 10.0) as u64, 5.0, 1)),
            links: vec![down("r1", r1), down("r2", r2)],
            ..Case::default()
        };
        let mut tern_equal = case("tern", "equal", 100.0, 95.0, 60_000_000, 59_000_000);
        tern_equal.extra = json!([{"client": {}, "server": {"paths": [
            {"id": 0, "bytes_sent": 30_000_000}, {"id": 1, "bytes_sent": 29_000_000},
            {"id": 2, "bytes_sent": 500}
        ]}}]);
        let run = run_file(
            "multipath",
            "multipath",
            vec![
                case("tern", "one", 50.0, 47.5, 60_000_000, 0),
                case("tcp", "one", 50.0, 47.0, 60_000_000, 0),
                tern_equal,
                case("mptcp", "equal", 100.0, 90.0, 58_000_000, 57_000_000),
                case("tern", "unequal", 60.0, 57.0, 60_000_000, 12_000_000),
                case("mptcp", "unequal", 60.0, 45.0, 50_000_000, 9_000_000),
            ],
        );
        let rows = summarize(&run);
        let row = |proto: &str, paths: &str| {
            rows.iter()
                .find(|r| r.protocol == proto && r.params["paths"] == paths)
                .unwrap()
                .metrics
                .clone()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let t = row("tern", "equal");
        assert!(close(t["goodput_mbps"], 95.0), "{t:?}");
        assert!(close(t["goodput_vs_one"], 2.0));
        assert!(close(t["goodput_vs_mptcp"], 95.0 / 90.0));
        assert!(close(t["goodput_of_sum"], 0.95));
        assert_eq!(t["link_r2_down_mb"], 59.0);
        assert_eq!(t["paths_used"], 2.0, "paths that sent more than 1 MB");
        assert_eq!(t["tern_path1_sent_mb"], 29.0);
        assert_eq!(t["tern_path2_sent_mb"], 0.0005);
        // MPTCP has no one-path row of its own: TCP's is its one path.
        let m = row("mptcp", "unequal");
        assert!(close(m["goodput_vs_one"], 45.0 / 47.0));
        assert!(!m.contains_key("goodput_vs_mptcp") || close(m["goodput_vs_mptcp"], 1.0));
        let one = row("tern", "one");
        assert!(close(one["goodput_vs_tcp"], 47.5 / 47.0));
        assert!(!one.contains_key("goodput_vs_one"));
        assert!(!one.contains_key("stall_ms"), "no event in multipath");
        let md = crate::report::markdown(&RunFile {
            summary: rows,
            ..run
        });
        assert!(
            md.contains("| goodput Mbit/s | of sum | / one path | / MPTCP |"),
            "{md}"
        );
    }

    #[test]
    fn handover_rows_report_loss_stall_and_reconnects() {
        let case = |proto: &str, t: Option<TransferSample>| Case {
            protocol: proto.into(),
            params: params(&[
                ("event", json!("rebind")),
                ("size", json!(1000)),
                ("stall_target_ms", json!(90.0)),
            ]),
            transfer: t,
            ..Case::default()
        };
        let mut window = transfer(1000, 1000, 480.0, 1);
        window.window_resume_ms = Some(45.0);
        let run = run_file(
            "handover",
            "handover",
            vec![
                case("tern", Some(transfer(1000, 1000, 70.0, 1))),
                case("tcp", Some(transfer(1000, 1000, 1300.0, 2))),
                case("quic", Some(transfer(1000, 600, 9000.0, 1))),
                case("mptcp", None),
                case("tern-window", Some(window)),
            ],
        );
        let rows = summarize(&run);
        let t = &rows[0].metrics;
        assert_eq!(t["bytes_lost"], 0.0);
        assert_eq!(t["stall_ms"], 70.0);
        assert_eq!(t["stall_at_ms"], 5000.0);
        assert_eq!(t["failed"], 0.0);
        assert_eq!(t["completed"], 1.0);
        assert!((t["stall_over_target"] - 70.0 / 90.0).abs() < 1e-9);
        // TCP broke: the client reconnected; what the broken connection lost is not a
        // transport's loss figure.
        let tcp = &rows[1].metrics;
        assert_eq!(tcp["failed"], 1.0);
        assert_eq!(tcp["connections"], 2.0);
        assert_eq!(tcp["reconnect_ms"], 250.0);
        assert!(!tcp.contains_key("bytes_lost"));
        let q = &rows[2].metrics;
        assert_eq!(q["bytes_lost"], 400.0);
        assert_eq!(q["failed"], 1.0);
        assert_eq!(rows[3].metrics["failed"], 1.0, "no report: failed");
        assert_eq!(rows[4].metrics["window_resume_ms"], 45.0);
        // The gap after the event, not a longer one at the start, is the stall.
        let mut late = transfer(1000, 1000, 700.0, 1);
        late.event_gap_ms = Some(120.0);
        late.event_gap_at_ms = Some(5_010.0);
        let m = transfer_metrics(&case("tern", Some(late)));
        assert_eq!(m["stall_ms"], 120.0);
        assert_eq!(m["stall_at_ms"], 5_010.0);
        // Back to 80 % of the rate before the event: 100 B per 100 ms bin before an event at
        // 1 s, nothing for 200 ms, then 50 B per bin, then the full rate from 1.6 s: from
        // 1.4 s on, 500 ms carry 400 B.
        let mut t = transfer(u64::MAX, 0, 200.0, 1);
        t.bin_ms = 100;
        t.bins = [vec![100; 10], vec![0, 0], vec![50; 4], vec![100; 10]].concat();
        assert_eq!(recovery_ms(&t, 1000.0), Some(400.0));
        assert_eq!(recovery_ms(&t, 100.0), None, "no second before the event");
        t.bins.truncate(15);
        assert_eq!(recovery_ms(&t, 1000.0), None, "never back");
        assert!(
            !rows[0].metrics.contains_key("goodput_vs_tcp"),
            "no TCP ratio in handover"
        );
    }

    #[test]
    fn sender_statistics_are_summed_over_threads() {
        let extra = json!([
            {"client": {"packets_lost": 9}, "server": {"packets_lost": 2, "spurious_losses": 1}},
            {"client": {}, "server": {"packets_lost": 3}},
            null
        ]);
        let sender = |x: &Value, key| side_stat(x, "server", key, Agg::Sum);
        assert_eq!(sender(&extra, "packets_lost"), Some(5.0));
        assert_eq!(sender(&extra, "spurious_losses"), Some(1.0));
        assert_eq!(sender(&extra, "ecn_ce_reported"), None);
        assert_eq!(sender(&json!("cubic"), "packets_lost"), None);
        assert_eq!(
            side_stat(&extra, "server", "packets_lost", Agg::Max),
            Some(3.0)
        );
        assert_eq!(
            side_stat(&extra, "client", "packets_lost", Agg::Sum),
            Some(9.0)
        );
    }

    #[test]
    fn every_tern_mode_runs_once_per_controller() {
        let modes = vec!["flows".to_string(), "flows:multipath".to_string()];
        assert_eq!(with_controllers(modes.clone(), None), modes);
        assert_eq!(with_controllers(modes.clone(), Some(&[])), modes);
        let ccs = ["newreno".to_string(), "cubic".to_string()];
        assert_eq!(
            with_controllers(modes, Some(&ccs)),
            [
                "flows:cc=newreno",
                "flows:cc=cubic",
                "flows:multipath:cc=newreno",
                "flows:multipath:cc=cubic"
            ]
        );
    }

    #[test]
    fn cc_ranks_every_controller_on_bulk_and_mar() {
        let mut defaults = opts("cc", None);
        defaults.protocols = None;
        let p = plan(&defaults).unwrap();
        assert_eq!(p.profile.name, "lte");
        assert_eq!(
            p.protocols,
            [Proto::Tern, Proto::Tcp, Proto::TcpBbr, Proto::Quic]
        );
        // Every built-in controller, with reliable messages for the MAR load.
        let want: Vec<String> = tern::cc::Algorithm::ALL
            .iter()
            .map(|a| format!("messages:cc={a}"))
            .collect();
        assert_eq!(p.tern_modes, want);
        let loads: Vec<String> = p.cases.iter().map(|c| pval_of(&c.params, "load")).collect();
        assert_eq!(loads, ["bulk", "mar"]);
        // Utilisation is against the profile's rate (lte: 30 Mbit/s) or the trace's mean.
        assert_eq!(p.cases[0].params["capacity_mbps"], json!(30.0));
        let mut traced = opts("cc", None);
        traced.trace = Some("TMobile-LTE-short".into());
        let p = plan(&traced).unwrap();
        let cap = p.cases[0].params["capacity_mbps"].as_f64().unwrap();
        let first_10s = crate::profile::trace_mbps_over(
            &crate::profile::shipped_traces().join("TMobile-LTE-short.down"),
            10.0,
        )
        .unwrap();
        assert!((cap - first_10s).abs() < 1e-9, "{cap}");
        // --tern-cc narrows the list.
        let mut some = opts("cc", None);
        some.tern_cc = Some(vec!["newreno".into()]);
        assert_eq!(plan(&some).unwrap().tern_modes, ["messages:cc=newreno"]);
        some.tern_cc = Some(vec!["nonesuch".into()]);
        assert!(plan(&some).is_err());
    }

    fn pval_of(params: &BTreeMap<String, Value>, key: &str) -> String {
        params[key].as_str().unwrap_or_default().to_string()
    }

    #[test]
    fn cc_rows_carry_utilisation_queueing_delay_and_ratios() {
        let link = |dir: &str, mean, p95| crate::results::LinkStat {
            link: "r".into(),
            dir: dir.into(),
            offered: 0,
            delivered_bytes: 0,
            dropped_queue: 0,
            dropped_loss: 0,
            dropped_outage: 0,
            queue_max_bytes: 0,
            queue_delay_mean_ms: Some(mean),
            queue_delay_p95_ms: Some(p95),
            queue_wait_mean_ms: None,
            queue_wait_p95_ms: None,
        };
        let bulk = |proto: &str, mb: u64, p95: f64| Case {
            protocol: proto.into(),
            params: params(&[
                ("load", json!("bulk")),
                ("loss", json!(0.0)),
                ("capacity_mbps", json!(30.0)),
            ]),
            transfer: Some(TransferSample {
                size: u64::MAX,
                received: mb * 1_000_000,
                completed: true,
                first_byte_ms: Some(0.0),
                last_byte_ms: Some(10_000.0),
                ..TransferSample::default()
            }),
            links: vec![link("down", p95 / 2.0, p95), link("up", 0.1, 0.2)],
            ..Case::default()
        };
        let mar = |proto: &str, rtt: f64| Case {
            protocol: proto.into(),
            params: params(&[("load", json!("mar")), ("loss", json!(0.0))]),
            rpc: (0..100)
                .map(|i| crate::results::RpcSample {
                    seq: i,
                    size: 4500,
                    reply: 100,
                    t_ms: f64::from(i) * 33.3,
                    rtt_ms: (i != 99).then_some(rtt + f64::from(i)),
                })
                .collect(),
            links: vec![link("up", 3.0, 6.0)],
            ..Case::default()
        };
        let run = run_file(
            "cc",
            "lte",
            vec![
                bulk("tern-msg-cubic", 36, 10.0),
                bulk("tcp-bbr", 30, 40.0),
                mar("tern-msg-cubic", 40.0),
                mar("tcp", 300.0),
            ],
        );
        let rows = summarize(&run);
        let t = &rows[0].metrics;
        assert!((t["goodput_mbps"] - 28.8).abs() < 1e-9);
        assert!((t["utilisation_pct"] - 96.0).abs() < 1e-9);
        // The data's direction: server → client.
        assert_eq!(t["queue_delay_p95_ms"], 10.0);
        assert_eq!(t["queue_delay_mean_ms"], 5.0);
        assert!((t["goodput_vs_tcp-bbr"] - 1.2).abs() < 1e-9);
        assert!((t["queue_delay_p95_vs_tcp-bbr"] - 0.25).abs() < 1e-9);
        let m = &rows[2].metrics;
        assert_eq!(m["lost_pct"], 1.0);
        // RTTs 40..138 ms, one unanswered: 99 of 100 on time at 150 ms.
        assert!((m["on_time_pct"] - 99.0).abs() < 1e-9);
        assert!(
            rows[3].metrics["on_time_pct"] == 0.0,
            "TCP: 300 ms and more"
        );
        assert!(m["rtt_p99_ms"] > 130.0 && m["rtt_p99_ms"] < 139.0);
        assert_eq!(m["queue_delay_p95_ms"], 6.0);
        assert!(m["rtt_p99_vs_tcp"] < 0.5);
    }

    #[test]
    fn initwin_and_mss_sweep_tern_settings() {
        let mut o = opts("initwin", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "startup");
        assert_eq!(
            p.tern_modes,
            ["flows:iw=8", "flows:iw=16", "flows:iw=32", "flows:iw=64"]
        );
        assert_eq!(p.protocols, [Proto::Tern, Proto::Tcp, Proto::Quic]);
        // Two sizes, three quick repetitions each.
        assert_eq!(p.cases.len(), 6);
        let mut o = opts("mss", None);
        o.protocols = None;
        let p = plan(&o).unwrap();
        assert_eq!(p.profile.name, "loopback");
        assert_eq!(
            p.tern_modes,
            ["flows:mss=1300", "flows:mss=1500", "flows:mss=9000"]
        );
        let loads: Vec<String> = p.cases.iter().map(|c| pval_of(&c.params, "load")).collect();
        assert_eq!(loads, ["bulk", "echo"]);
        // Every mode is one the agents accept, and rows are told apart.
        let labels: Vec<String> = p
            .tern_modes
            .iter()
            .map(|m| crate::proto::ternp::label_for(m).unwrap())
            .collect();
        assert_eq!(labels, ["tern-mss1300", "tern-mss1500", "tern-mss9000"]);
    }
}
