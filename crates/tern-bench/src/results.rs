//! The collector's data model: one [`RunFile`] per `tern-bench run`, written as
//! `results/<scenario>-<profile>[-<variant>].json`. It keeps every sample (so figures can be
//! recomputed), the derived summary rows, the settings, the versions of every peer, the
//! kernel and the date.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of this file format.
pub const SCHEMA: u32 = 1;

/// Everything one run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunFile {
    /// File format version ([`SCHEMA`]).
    pub schema: u32,
    /// Scenario name (`mar`, `short-flows`, …).
    pub scenario: String,
    /// Link profile name (`lte`, `viscous`, `loopback`, …).
    pub profile: String,
    /// Extra part of the file name (`loss1`, a trace name), empty if none.
    #[serde(default)]
    pub variant: String,
    /// Start of the run, UTC, RFC 3339.
    pub date: String,
    /// Wall time of the whole run.
    pub duration_s: f64,
    /// The command line.
    pub command: Vec<String>,
    /// `--quick` was given.
    pub quick: bool,
    /// Where it ran.
    pub machine: Machine,
    /// Versions: tern-bench, tern (git), quinn, rustls, kernel, libudt, libsrt, …
    pub versions: BTreeMap<String, String>,
    /// Scenario and link settings, as given.
    pub settings: Value,
    /// Raw measurements, one per agent run (protocol × case).
    pub cases: Vec<Case>,
    /// Derived rows (what the tables and plots show), computed from `cases`.
    pub summary: Vec<Row>,
    /// Protocols that were asked for (or are part of the scenario) but did not run, with why.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

/// The machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// Host name.
    pub hostname: String,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Memory in GiB.
    pub mem_gib: f64,
    /// PRETTY_NAME from /etc/os-release.
    pub os: String,
    /// 1-minute load average at the start of the run.
    pub load_avg_start: f64,
    /// The CPU flags that decide AES-GCM's speed (which of aes, pclmulqdq, avx2, vaes,
    /// vpclmulqdq, avx512f/dq/bw/vl /proc/cpuinfo lists): two hosts of one model name can
    /// differ.
    #[serde(default)]
    pub cpu_flags: Vec<String>,
}

/// A protocol that did not run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Skipped {
    /// Protocol name.
    pub protocol: String,
    /// Why.
    pub reason: String,
}

/// One agent run: a protocol on one case of the scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Case {
    /// Protocol name.
    pub protocol: String,
    /// Case parameters (loss, threads, rtt_ms, background, load, …).
    pub params: BTreeMap<String, Value>,
    /// Request/response samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<RpcSample>,
    /// Flow samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flows: Vec<FlowSample>,
    /// The metered transfer (`multipath`, `handover`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferSample>,
    /// The concurrent flows of a `fairness` case, one per client agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fair_flows: Vec<FairFlowRun>,
    /// Network events the collector caused during the case (address changes, a path going
    /// dark), ms after the client agent started, with what happened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventRecord>,
    /// CPU seconds (user + system) of the client and server agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuUse>,
    /// Per emulated link and direction: what the emulator saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkStat>,
    /// Per emulated link and direction: the bytes it delivered and its packets' queue wait
    /// over the case's steady part (`fairness`), for its utilisation on the wire and the
    /// steady wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_windows: Vec<LinkWindow>,
    /// Wall time of the agent run.
    pub wall_s: f64,
    /// Protocol-specific extras reported by the client agent (e.g. connection statistics).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub extra: Value,
    /// UDP datagrams the kernel dropped for a full receive buffer during the case, in the
    /// client's and server's namespaces together (`/proc/net/snmp` `Udp: RcvbufErrors` +
    /// `/proc/net/snmp6` `Udp6RcvbufErrors`, after − before). Namespace-wide: on loopback it
    /// also counts other programs' sockets on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_rcvbuf_errors: Option<u64>,
    /// `/proc/net/snmp` `Udp: SndbufErrors` (+ `Udp6SndbufErrors`) over the case, summed over
    /// the same namespaces: sends that failed for a full socket buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_sndbuf_errors: Option<u64>,
    /// `Udp: InErrors` (+ `Udp6InErrors`) over the case, the same namespaces: every received
    /// datagram the kernel dropped (it counts the `RcvbufErrors` too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_in_errors: Option<u64>,
    /// `udp_rcvbuf_errors` per namespace: `c` (client) and `s` (server) on an emulated
    /// topology, `host` on loopback.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub udp_rcvbuf_errors_by_ns: BTreeMap<String, u64>,
    /// Datagrams the kernel dropped at the client agent's own UDP socket (`/proc/net/udp`
    /// `drops`, read by the client at the end of its work; tern and quinn only). The client
    /// is the data's receiver in the flow scenarios.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_socket_drops: Option<u64>,
    /// The same for the server agent's socket, read by the collector before it kills the
    /// server (UDP-based protocols).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_socket_drops: Option<u64>,
    /// Set if the run failed; samples may then be partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One request and its reply.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcSample {
    /// Request number within its size (0-based).
    pub seq: u32,
    /// Request bytes (application payload).
    pub size: u32,
    /// Reply bytes.
    pub reply: u32,
    /// Scheduled send time, ms since the client started.
    pub t_ms: f64,
    /// Scheduled send → whole reply received; `None` if the reply never came.
    pub rtt_ms: Option<f64>,
}

/// One metered transfer (server → client), as the receiving client saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransferSample {
    /// Bytes asked for (`u64::MAX`: time-bounded).
    pub size: u64,
    /// Bytes that arrived (over every connection, if the client had to reconnect).
    pub received: u64,
    /// Every byte asked for arrived (time-bounded: the time was used up without error).
    pub completed: bool,
    /// Connect start, ms since the client started.
    pub start_ms: f64,
    /// First and last byte, ms since the client started.
    #[serde(default)]
    pub first_byte_ms: Option<f64>,
    /// Last byte.
    #[serde(default)]
    pub last_byte_ms: Option<f64>,
    /// The longest gap between two deliveries (reads that returned data) after the first
    /// byte; an unfinished transfer's time since its last byte counts as a gap too.
    pub max_gap_ms: f64,
    /// When that gap began, ms since the client started.
    pub max_gap_at_ms: f64,
    /// The longest gap that ends after the case's network event (or is still open at the
    /// end), if the plan named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_gap_ms: Option<f64>,
    /// When that gap began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_gap_at_ms: Option<f64>,
    /// Bytes delivered per bin of `bin_ms`, from the client's start.
    pub bin_ms: u64,
    /// The timeline.
    pub bins: Vec<u64>,
    /// Connections used (more than 1: the transport broke and the client reconnected).
    pub connections: u32,
    /// Bytes delivered on the first connection.
    pub first_connection_bytes: u64,
    /// Reconnecting: from giving the silent connection up to the first byte on the new one.
    #[serde(default)]
    pub reconnect_ms: Option<f64>,
    /// Receive window (tern): from reopening it to the next delivery.
    #[serde(default)]
    pub window_resume_ms: Option<f64>,
    /// Times the client told the transport its address changed (quinn: rebind).
    #[serde(default)]
    pub rebinds: u32,
    /// The video workload's frames (`fairness`, `load=video`), when the transfer was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoSample>,
}

/// What the receiver of a video flow saw (`proto::video`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VideoSample {
    /// Frames per second the sender produced at.
    pub fps: u32,
    /// Frames it was asked to produce (every one of them not on time is missed).
    pub frames_due: u32,
    /// The playout delay: a frame completing later than this after its production misses.
    pub playout_ms: f64,
    /// Every frame that arrived whole, in order of completion.
    pub frames: Vec<FrameSample>,
}

/// One video frame that arrived whole.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameSample {
    /// Frame number (0-based).
    pub index: u32,
    /// Bytes, header included.
    pub size: u32,
    /// From its production at the sender to its last byte read at the receiver (the two
    /// share the host's CLOCK_MONOTONIC).
    pub latency_ms: f64,
}

/// One of the concurrent backlogged flows of a `fairness` case: where it ran, when it
/// started, and what its receiver metered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FairFlowRun {
    /// Flow number (0-based).
    pub flow: u32,
    /// The receiving client's node.
    pub client: String,
    /// The sending server's node.
    pub server: String,
    /// When its client was started, ms after the case's first client.
    pub start_ms: f64,
    /// How long it was asked to run.
    pub duration_ms: u64,
    /// Its path's round-trip propagation time (ms).
    pub rtt_ms: f64,
    /// The emulated bottlenecks its data crosses.
    pub bottlenecks: Vec<String>,
    /// Which direction of them the data crosses (`up` or `down`).
    pub dir: String,
    /// Its protocol when not the row's (`coexist`'s kernel TCP flow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// What the receiver metered (`None`: it gave no report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferSample>,
    /// Set if this flow failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A network event the collector caused.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// ms after the client agent was started.
    pub at_ms: f64,
    /// What (`move c 10.77.1.1 -> 10.77.5.1`, `down r1`).
    pub what: String,
    /// Set if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One flow (a transfer from server to client on a fresh connection).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowSample {
    /// Client thread (0-based).
    pub thread: u32,
    /// Flow number within the thread.
    pub index: u32,
    /// Bytes asked for.
    pub size: u64,
    /// Connect start, ms since the client started.
    pub start_ms: f64,
    /// Connect start → last byte received; `None` if it did not complete.
    pub fct_ms: Option<f64>,
    /// Bytes received (less than `size` only for unreliable protocols or failures).
    pub received: u64,
}

/// CPU time of the agents (user + system, seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// The client agent.
    pub client_s: f64,
    /// The server agent (`None` if /proc could not be read before it was killed).
    #[serde(default)]
    pub server_s: Option<f64>,
}

/// The bytes one direction of an emulated link delivered over a window of a case, and the
/// queue wait of the packets that entered its queue then, read from tern-netem's counters at
/// the window's two ends (IP bytes: the unit of the link's rate).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkWindow {
    /// Link (router) name.
    pub link: String,
    /// `up` (client → server) or `down`.
    pub dir: String,
    /// Window start, seconds after the first flow's scheduled start.
    pub from_s: f64,
    /// Window end, the same clock.
    pub to_s: f64,
    /// Bytes delivered between the two.
    pub delivered_bytes: u64,
    /// Mean time the packets that entered the queue in the window waited before their first
    /// byte left (as [`LinkStat::queue_wait_mean_ms`], over the window only: no start-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait_mean_ms: Option<f64>,
    /// 95th percentile of the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait_p95_ms: Option<f64>,
}

/// Emulator counters of one direction of one link over one case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkStat {
    /// Link (router) name.
    pub link: String,
    /// `up` (client → server) or `down`.
    pub dir: String,
    /// Packets offered.
    pub offered: u64,
    /// Bytes delivered.
    pub delivered_bytes: u64,
    /// Drops by the queue.
    pub dropped_queue: u64,
    /// Drops by the loss model (and fades).
    pub dropped_loss: u64,
    /// Drops while a scheduled outage darkened the direction (`outage=`; 0 in results files
    /// written before it existed).
    #[serde(default)]
    pub dropped_outage: u64,
    /// Largest queue seen, bytes.
    pub queue_max_bytes: usize,
    /// Mean time a packet spent in the emulator's queue, ms (the queueing delay the
    /// protocols built; `None` when no packet was queued, and in older results files).
    #[serde(default)]
    pub queue_delay_mean_ms: Option<f64>,
    /// 95th percentile of that time, ms (within about 5 %: a log-scale histogram).
    #[serde(default)]
    pub queue_delay_p95_ms: Option<f64>,
    /// Mean time a packet waited before its first byte left, ms: the queueing delay less
    /// the packet's own transmission (`None` in results files written before it existed).
    #[serde(default)]
    pub queue_wait_mean_ms: Option<f64>,
    /// 95th percentile of that wait, ms.
    #[serde(default)]
    pub queue_wait_p95_ms: Option<f64>,
}

/// A derived row: one protocol at one point of the scenario.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Protocol name.
    pub protocol: String,
    /// Where: case parameters plus the group (e.g. `size`).
    pub params: BTreeMap<String, Value>,
    /// What: named metrics.
    pub metrics: BTreeMap<String, f64>,
}

impl Row {
    /// A numeric parameter.
    pub fn num(&self, key: &str) -> Option<f64> {
        self.params.get(key).and_then(Value::as_f64)
    }

    /// A parameter as text (numbers without a trailing `.0`).
    pub fn text(&self, key: &str) -> String {
        match self.params.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        }
    }

    /// A metric.
    pub fn metric(&self, key: &str) -> Option<f64> {
        self.metrics.get(key).copied().filter(|v| v.is_finite())
    }
}

impl RunFile {
    /// A run starting now on this machine, with no cases yet (command line, machine and
    /// versions filled in).
    pub fn new(
        scenario: &str,
        profile: &str,
        variant: String,
        quick: bool,
        settings: Value,
        skipped: Vec<Skipped>,
    ) -> Self {
        Self {
            schema: SCHEMA,
            scenario: scenario.into(),
            profile: profile.into(),
            variant,
            date: crate::sysinfo::now_rfc3339(),
            duration_s: 0.0,
            command: std::env::args().collect(),
            quick,
            machine: crate::sysinfo::machine(),
            versions: crate::sysinfo::versions(),
            settings,
            cases: Vec::new(),
            summary: Vec::new(),
            skipped,
        }
    }

    /// The file name this run is written to (without directory).
    pub fn file_stem(&self) -> String {
        if self.variant.is_empty() {
            format!("{}-{}", self.scenario, self.profile)
        } else {
            format!("{}-{}-{}", self.scenario, self.profile, self.variant)
        }
    }

    /// Writes `<dir>/<stem>.json`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.json", self.file_stem()));
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// Reads a results file.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Protocols in the order they first appear in the summary.
    pub fn protocols(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.summary {
            if !out.contains(&r.protocol) {
                out.push(r.protocol.clone());
            }
        }
        out
    }
}

/// Summary statistics of a set of values.
pub mod stats {
    /// Arithmetic mean (NaN if empty).
    pub fn mean(v: &[f64]) -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v.iter().sum::<f64>() / v.len() as f64
    }

    /// Sample standard deviation (NaN with fewer than two values).
    pub fn std(v: &[f64]) -> f64 {
        if v.len() < 2 {
            return f64::NAN;
        }
        let m = mean(v);
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    }

    /// Percentile `p` in 0..=100 with linear interpolation between closest ranks.
    pub fn percentile(v: &[f64], p: f64) -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = (p / 100.0).clamp(0.0, 1.0) * (s.len() - 1) as f64;
        let lo = rank.floor() as usize;
        let hi = rank.ceil() as usize;
        s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
    }

    /// Median.
    pub fn median(v: &[f64]) -> f64 {
        percentile(v, 50.0)
    }

    /// Packet-delay variation as the mean absolute difference of consecutive delays
    /// (RFC 3550's interarrival jitter without its 1/16 smoothing; RFC 5481's IPDV averaged
    /// in absolute value). NaN with fewer than two values.
    pub fn pdv(ordered: &[f64]) -> f64 {
        if ordered.len() < 2 {
            return f64::NAN;
        }
        let d: Vec<f64> = ordered.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
        mean(&d)
    }

    /// Empirical CDF points `(value, fraction ≤ value)`.
    pub fn cdf(v: &[f64]) -> Vec<(f64, f64)> {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len() as f64;
        s.iter()
            .enumerate()
            .map(|(i, x)| (*x, (i + 1) as f64 / n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::stats::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((median(&v) - 50.5).abs() < 1e-9);
        assert!((percentile(&v, 99.0) - 99.01).abs() < 1e-9);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert!((pdv(&[10.0, 12.0, 11.0, 11.0]) - 1.0).abs() < 1e-9);
        assert!((std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) - 2.138).abs() < 1e-3);
    }
}
