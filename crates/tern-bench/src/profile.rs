//! Link profiles (DESIGN.md §3) turned into tern-netem settings.
//!
//! Each direction of a link is `delay + U(0, jitter)` (order-preserving), a drop-tail queue
//! (tern-netem's default: 100 ms at the rate), a rate or a mahimahi trace, and optional
//! random loss. `delay` is chosen so that the *mean* round trip is the profile's RTT.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Serialize;
use tern_netem::{DirectionConfig, DuplexConfig, EmulationConfig};

/// Which topology a profile runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetKind {
    /// 127.0.0.1, no emulator.
    Loopback,
    /// `c — r — s`.
    Single,
    /// Two disjoint paths `c — r1 — s`, `c — r2 — s`.
    Dual,
    /// `c — r — s`, where `c` can move to another address (tern-netem's `mobile`).
    Mobile,
    /// tern-netem's parking lot: two emulated bottlenecks `b1`, `b2` in a row, a long flow
    /// `src0 → dst0` across both and one short flow per bottleneck (`fairness`).
    ParkingLot,
    /// Three senders `s1`–`s3`, each behind its own delay-only emulated access link
    /// `a1`–`a3`, joining router `j`, then the shared emulated bottleneck `r` to the receiver
    /// `c` (`fairness`, case `rtts`; [`rtts_topology`]).
    Rtts,
}

/// The `rtts` topology, built here rather than as a tern-netem preset (it is the fairness
/// scenario's alone): `c` 10.77.1.1 — `r` — `j` — `a1`/`a2`/`a3` — `s1` 10.77.4.1, `s2`
/// 10.77.6.1, `s3` 10.77.8.1. Every emulated link's A side faces the receiver, so `up` is
/// receiver → sender and `down` the data's way, as in `single`.
pub fn rtts_topology() -> tern_netem::TopologySpec {
    use std::net::Ipv4Addr;
    use tern_netem::topology::Role;
    let net = |subnet: u8, host: u8| Ipv4Addr::new(10, 77, subnet, host);
    tern_netem::TopologySpec::new("rtts")
        .node("c", Role::Host)
        .node("r", Role::Emulator)
        .node("j", Role::Router)
        .node("a1", Role::Emulator)
        .node("a2", Role::Emulator)
        .node("a3", Role::Emulator)
        .node("s1", Role::Host)
        .node("s2", Role::Host)
        .node("s3", Role::Host)
        .wire("c", net(1, 1), "r", net(1, 2))
        .wire("r", net(2, 2), "j", net(2, 1))
        .wire("j", net(3, 1), "a1", net(3, 2))
        .wire("a1", net(4, 2), "s1", net(4, 1))
        .wire("j", net(5, 1), "a2", net(5, 2))
        .wire("a2", net(6, 2), "s2", net(6, 1))
        .wire("j", net(7, 1), "a3", net(7, 2))
        .wire("a3", net(8, 2), "s3", net(8, 1))
}

/// A named link profile.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// Name.
    pub name: &'static str,
    /// One line for the report.
    pub description: &'static str,
    /// Topology.
    pub net: NetKind,
    /// Mean round-trip propagation time (ms), jitter included.
    pub rtt_ms: f64,
    /// Jitter bound per direction (ms): each packet gets U(0, jitter) extra delay.
    pub jitter_ms: f64,
    /// Client → server rate (Mbit/s); `None`: unlimited.
    pub up_mbps: Option<f64>,
    /// Server → client rate (Mbit/s).
    pub down_mbps: Option<f64>,
}

/// Every profile.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "5g",
        description: "5G: 15 ms RTT, 4 ms jitter per direction, 300 Mbit/s down, 100 Mbit/s up",
        net: NetKind::Single,
        rtt_ms: 15.0,
        jitter_ms: 4.0,
        up_mbps: Some(100.0),
        down_mbps: Some(300.0),
    },
    Profile {
        name: "lte",
        description: "LTE: 35 ms RTT, 2 ms jitter per direction, 30 Mbit/s both ways",
        net: NetKind::Single,
        rtt_ms: 35.0,
        jitter_ms: 2.0,
        up_mbps: Some(30.0),
        down_mbps: Some(30.0),
    },
    Profile {
        name: "wifi",
        description: "Wi-Fi: 5 ms RTT, 0.5 ms jitter per direction, 100 Mbit/s both ways",
        net: NetKind::Single,
        rtt_ms: 5.0,
        jitter_ms: 0.5,
        up_mbps: Some(100.0),
        down_mbps: Some(100.0),
    },
    Profile {
        name: "viscous",
        description: "Viscous: two disjoint 50 Mbit/s paths, RTT 16/80/320 ms (per case)",
        net: NetKind::Dual,
        rtt_ms: 80.0,
        jitter_ms: 0.0,
        up_mbps: Some(50.0),
        down_mbps: Some(50.0),
    },
    Profile {
        name: "path50",
        description: "One 50 Mbit/s path, 80 ms RTT (Viscous long flows)",
        net: NetKind::Single,
        rtt_ms: 80.0,
        jitter_ms: 0.0,
        up_mbps: Some(50.0),
        down_mbps: Some(50.0),
    },
    Profile {
        name: "startup",
        description: "SLTP start-up: 50 Mbit/s, 100 ms RTT",
        net: NetKind::Single,
        rtt_ms: 100.0,
        jitter_ms: 0.0,
        up_mbps: Some(50.0),
        down_mbps: Some(50.0),
    },
    Profile {
        name: "multipath",
        description:
            "Two disjoint 50 Mbit/s paths, 20 ms RTT each (per case: path 2 at 10 Mbit/s, 80 ms)",
        net: NetKind::Dual,
        rtt_ms: 20.0,
        jitter_ms: 0.0,
        up_mbps: Some(50.0),
        down_mbps: Some(50.0),
    },
    Profile {
        name: "handover",
        description:
            "A mobile client: 20 Mbit/s, 40 ms RTT per path; one path whose client moves, or two",
        net: NetKind::Mobile,
        rtt_ms: 40.0,
        jitter_ms: 0.0,
        up_mbps: Some(20.0),
        down_mbps: Some(20.0),
    },
    Profile {
        name: "ncvdn",
        description: "NC-TCP's testbed: a 1 Mbit/s bottleneck, 140 ms RTT",
        net: NetKind::Single,
        rtt_ms: 140.0,
        jitter_ms: 0.0,
        up_mbps: Some(1.0),
        down_mbps: Some(1.0),
    },
    Profile {
        name: "parking-lot",
        description: "Parking lot: two 660 kbit/s bottlenecks in a row, 35 ms each way each (the long flow's RTT 140 ms, the short flows' 70 ms), senders' access 1024 kbit/s",
        net: NetKind::ParkingLot,
        rtt_ms: 70.0,
        jitter_ms: 0.0,
        up_mbps: Some(0.66),
        down_mbps: Some(0.66),
    },
    Profile {
        name: "loopback",
        description: "Loopback (127.0.0.1), no emulator",
        net: NetKind::Loopback,
        rtt_ms: 0.0,
        jitter_ms: 0.0,
        up_mbps: None,
        down_mbps: None,
    },
];

/// Looks a profile up.
pub fn profile(name: &str) -> anyhow::Result<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name).with_context(|| {
        let names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
        format!("unknown profile {name:?}; known: {}", names.join(", "))
    })
}

/// How a case modifies the profile.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LinkOptions {
    /// Random loss in percent, both directions.
    pub loss_pct: f64,
    /// RTT override (ms).
    pub rtt_ms: Option<f64>,
    /// Mahimahi traces replacing the rates: (up, down).
    pub trace: Option<(PathBuf, PathBuf)>,
    /// Extra tern-netem settings for every direction (e.g. `queue=50ms`).
    pub extra: Option<String>,
    /// Settings for one link only (both directions), after everything else:
    /// `("r2", "delay=40ms rate=10mbit")`.
    pub links: Vec<(String, String)>,
    /// Mahimahi traces for one link only (up, down), replacing its rate.
    pub link_traces: Vec<(String, (PathBuf, PathBuf))>,
}

/// The real LTE and 5G traces shipped with tern-bench (`crates/tern-bench/traces`, sources
/// in its README).
pub fn shipped_traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

/// The up and down trace files for `--trace FILE`: `X.up`/`X.down` pairs are used as such,
/// any other file for both directions. A FILE that is not a path to a file is looked up among
/// the [`shipped_traces`], also as the stem of a pair (`TMobile-LTE-short`).
pub fn trace_pair(file: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let shipped = shipped_traces();
    let found = [
        file.to_path_buf(),
        shipped.join(file),
        shipped.join(format!("{}.up", file.display())),
        shipped.join(format!("{}.down", file.display())),
    ]
    .into_iter()
    .find(|f| f.is_file());
    let Some(file) = found else {
        bail!(
            "trace {} does not exist (nor among the shipped traces in {})",
            file.display(),
            shipped.display()
        );
    };
    let file = file.as_path();
    let s = file.to_string_lossy();
    for (a, b) in [(".up", ".down"), (".down", ".up")] {
        if let Some(stem) = s.strip_suffix(a) {
            let other = PathBuf::from(format!("{stem}{b}"));
            if other.exists() {
                return Ok(if a == ".up" {
                    (file.to_path_buf(), other)
                } else {
                    (other, file.to_path_buf())
                });
            }
        }
    }
    Ok((file.to_path_buf(), file.to_path_buf()))
}

/// The mean rate of a mahimahi trace (Mbit/s): one 1500-byte packet per line over the
/// period (the last timestamp).
pub fn trace_mean_mbps(file: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(file).ok()?;
    let times: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let period = *times.last()?;
    (period > 0).then(|| times.len() as f64 * 1500.0 * 8.0 / period as f64 / 1e3)
}

/// The mean rate of a mahimahi trace over its first `secs` seconds (Mbit/s): what a run of
/// that length that starts with the trace can be offered (the emulator plays a trace from its
/// start for every protocol's run).
pub fn trace_mbps_over(file: &Path, secs: f64) -> Option<f64> {
    let text = std::fs::read_to_string(file).ok()?;
    let horizon = secs * 1e3;
    let period = text
        .lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())?;
    if period <= 0.0 || secs <= 0.0 {
        return None;
    }
    // The trace loops with its period.
    let loops = (horizon / period).floor();
    let count = |until: f64| {
        text.lines()
            .filter_map(|l| l.trim().parse::<f64>().ok())
            .filter(|t| *t < until)
            .count() as f64
    };
    let opportunities = loops * count(f64::INFINITY) + count(horizon - loops * period);
    Some(opportunities * 1500.0 * 8.0 / (secs * 1e6))
}

impl Profile {
    /// The mean RTT with options applied.
    pub fn rtt(&self, o: &LinkOptions) -> f64 {
        o.rtt_ms.unwrap_or(self.rtt_ms)
    }

    /// tern-netem settings of one direction, as text.
    pub fn direction_settings(&self, up: bool, o: &LinkOptions) -> String {
        let rtt = self.rtt(o);
        let delay = (rtt / 2.0 - self.jitter_ms / 2.0).max(0.0);
        let mut s = format!("delay={delay}ms");
        if self.jitter_ms > 0.0 {
            s += &format!(" jitter={}ms", self.jitter_ms);
        }
        match (&o.trace, up) {
            (Some((u, _)), true) => s += &format!(" trace={}", u.display()),
            (Some((_, d)), false) => s += &format!(" trace={}", d.display()),
            (None, _) => {
                if let Some(r) = if up { self.up_mbps } else { self.down_mbps } {
                    s += &format!(" rate={r}mbit");
                }
            }
        }
        if o.loss_pct > 0.0 {
            s += &format!(" loss={}%", o.loss_pct);
        }
        if let Some(x) = &o.extra {
            s += " ";
            s += x;
        }
        s
    }

    /// The emulator configuration (every link alike), or `None` on loopback.
    pub fn emulation(&self, o: &LinkOptions) -> anyhow::Result<Option<EmulationConfig>> {
        if self.net == NetKind::Loopback {
            return Ok(None);
        }
        let mut up = DirectionConfig::default();
        up.apply(&self.direction_settings(true, o))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut down = DirectionConfig::default();
        down.apply(&self.direction_settings(false, o))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut cfg = EmulationConfig::uniform(DuplexConfig {
            up: up.clone(),
            down: down.clone(),
        });
        let mut names: Vec<&String> = o.links.iter().map(|l| &l.0).collect();
        names.extend(o.link_traces.iter().map(|l| &l.0));
        names.sort();
        names.dedup();
        for name in names {
            let (mut u, mut d) = (up.clone(), down.clone());
            for (dir, c) in [(true, &mut u), (false, &mut d)] {
                for (_, (tu, td)) in o.link_traces.iter().filter(|l| &l.0 == name) {
                    let file = if dir { tu } else { td };
                    c.apply(&format!("trace={}", file.display()))
                        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                }
                for (_, x) in o.links.iter().filter(|l| &l.0 == name) {
                    c.apply(x).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                }
            }
            cfg = cfg.with_link(name, DuplexConfig { up: u, down: d });
        }
        Ok(Some(cfg))
    }

    /// Ideal request/response time: mean propagation RTT plus serialisation of the request
    /// upstream and the reply downstream at the nominal rates (IP/transport headers and
    /// handshakes not counted).
    pub fn ideal_rpc_ms(&self, o: &LinkOptions, request: u32, reply: u32) -> Option<f64> {
        if o.trace.is_some() || self.net == NetKind::Loopback {
            return None;
        }
        let ser = |bytes: u32, mbps: Option<f64>| {
            mbps.map_or(0.0, |r| f64::from(bytes) * 8.0 / (r * 1e3))
        };
        Some(self.rtt(o) + ser(request, self.up_mbps) + ser(reply, self.down_mbps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        for p in PROFILES {
            let o = LinkOptions {
                loss_pct: 1.0,
                ..Default::default()
            };
            let e = p.emulation(&o).unwrap();
            assert_eq!(e.is_none(), p.net == NetKind::Loopback, "{}", p.name);
        }
        let lte = profile("lte").unwrap();
        let s = lte.direction_settings(true, &LinkOptions::default());
        assert_eq!(s, "delay=16.5ms jitter=2ms rate=30mbit");
        // 35 ms + 4500 B at 30 Mbit/s (1.2 ms) + 100 B (0.027 ms).
        let i = lte
            .ideal_rpc_ms(&LinkOptions::default(), 4500, 100)
            .unwrap();
        assert!((i - 36.2267).abs() < 1e-3, "{i}");
    }

    #[test]
    fn shipped_traces_are_found_by_name() {
        let (up, down) = trace_pair(Path::new("TMobile-LTE-short")).unwrap();
        assert!(
            up.ends_with("traces/TMobile-LTE-short.up"),
            "{}",
            up.display()
        );
        assert!(
            down.ends_with("traces/TMobile-LTE-short.down"),
            "{}",
            down.display()
        );
        let (up, down) = trace_pair(Path::new("Verizon-LTE-short.down")).unwrap();
        assert!(up.ends_with("Verizon-LTE-short.up") && down.ends_with("Verizon-LTE-short.down"));
        // A one-direction trace serves both directions.
        let five_g = "5G-UCC-driving-20200116_095656-s260-98s.down";
        let (up, down) = trace_pair(Path::new(five_g)).unwrap();
        assert_eq!(up, down);
        // Every shipped trace is a valid mahimahi trace with the mean its README states.
        let mean = trace_mean_mbps(&shipped_traces().join("TMobile-LTE-short.down")).unwrap();
        assert!((mean - 16.70).abs() < 0.05, "{mean}");
        let err = trace_pair(Path::new("no-such-trace"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-such-trace") && err.contains("shipped"),
            "{err}"
        );
    }
}
