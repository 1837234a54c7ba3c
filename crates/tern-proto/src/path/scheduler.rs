//! Path schedulers (DESIGN.md F16): which path the next data packet takes.
//!
//! The connection offers every path that may carry data now (validated, in the wanted state;
//! standby paths only while no active path works: that rule is the connection's) as a
//! [`Candidate`], with whether its window and pacer have room for a packet at this instant.
//! A scheduler picks one that has room, or none: waiting for a better path is a decision too
//! (the deadline scheduler waits for a fast path rather than put an urgent message on a
//! slow one). Separately, [`Scheduler::duplicates`] says whether each data packet is also
//! copied onto every other path (the redundant scheduler).
//!
//! When each wins (figures in docs/BENCHMARKS.md, "Schedulers"):
//! - min-RTT: bulk and mixed traffic; the fast path fills first, slower ones take the rest.
//! - ACK-clocked (Viscous): like min-RTT in throughput, but the path that just got an ACK
//!   sends next, so each path keeps its own ACK clock and a slow path's window is refilled
//!   as soon as it opens, not only when the fast path is full.
//! - round-robin: equal paths, or to spread load evenly regardless of RTT (testing).
//! - redundant: small urgent messages on lossy paths: every packet on every path, the first
//!   copy to arrive wins; costs the capacity of all but one path.
//! - deadline: messages with deadlines on unequal paths: each packet goes on the path whose
//!   estimated delivery (queue included) is earliest, waiting for the fast path rather than
//!   arrive later on the slow one (ECF); frames keep the fast path's latency.
//! - backup: one path at a time (the first that works); the others only when it fails
//!   (metered links, MPTCP's backup mode).

use std::time::{Duration, Instant};

/// What a scheduler knows of a path that may carry data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Index of the path in the connection (stable for the connection's life).
    pub index: usize,
    /// Whether its congestion window, pacer and flow-control share have room for a packet now.
    pub ready: bool,
    /// Smoothed RTT (the initial RTT before the first sample).
    pub rtt: Duration,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes in flight.
    pub in_flight: u64,
    /// When an acknowledgement last arrived on the path (`None`: never).
    pub last_ack: Option<Instant>,
}

impl Candidate {
    /// Estimated time until a packet of `size` bytes sent on this path now would arrive: half
    /// the RTT, plus the time the window needs to carry what is queued ahead of it (the bytes
    /// in flight and the packet, at cwnd per RTT).
    pub fn delivery_estimate(&self, size: u64) -> Duration {
        let queued = self.in_flight + size;
        let transmit = self.rtt.mul_f64(queued as f64 / self.cwnd.max(1) as f64);
        self.rtt / 2 + transmit
    }
}

/// What the connection knows of the data waiting to go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Time left before the deadline of the most urgent message waiting (`None`: no
    /// message with a deadline waits).
    pub deadline: Option<Duration>,
    /// Size of the packet to be sent (the path MTU).
    pub packet_size: u64,
}

/// Which built-in scheduler a connection uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SchedulerKind {
    /// The lowest-RTT path with room (the default): each packet goes where it arrives first,
    /// and slower paths take what the fast one's window cannot.
    #[default]
    MinRtt,
    /// Viscous's ACK-clocked scheduler: the path whose acknowledgement arrived last (its
    /// window just opened) sends next.
    AckClocked,
    /// Paths in turn, one packet each (spreads load evenly regardless of RTT).
    RoundRobin,
    /// Every data packet on every path (first copy wins): lowest latency under loss.
    Redundant,
    /// The path with the earliest estimated delivery (queue included) while messages with
    /// deadlines wait, even if that means waiting for it; min-RTT otherwise.
    Deadline,
    /// One path at a time, the first that works; the others only when it fails.
    Backup,
}

impl SchedulerKind {
    /// Every built-in scheduler, in the order above.
    pub const ALL: [SchedulerKind; 6] = [
        SchedulerKind::MinRtt,
        SchedulerKind::AckClocked,
        SchedulerKind::RoundRobin,
        SchedulerKind::Redundant,
        SchedulerKind::Deadline,
        SchedulerKind::Backup,
    ];

    /// A new scheduler of this kind.
    pub fn build(self) -> Box<dyn Scheduler> {
        match self {
            SchedulerKind::MinRtt => Box::new(MinRtt),
            SchedulerKind::AckClocked => Box::new(AckClocked),
            SchedulerKind::RoundRobin => Box::new(RoundRobin::default()),
            SchedulerKind::Redundant => Box::new(Redundant),
            SchedulerKind::Deadline => Box::new(Deadline),
            SchedulerKind::Backup => Box::new(Backup),
        }
    }

    /// Its name on the command line and in results (`min-rtt`, `ack-clocked`, …).
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::MinRtt => "min-rtt",
            SchedulerKind::AckClocked => "ack-clocked",
            SchedulerKind::RoundRobin => "round-robin",
            SchedulerKind::Redundant => "redundant",
            SchedulerKind::Deadline => "deadline",
            SchedulerKind::Backup => "backup",
        }
    }
}

impl std::str::FromStr for SchedulerKind {
    type Err = UnknownScheduler;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SchedulerKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownScheduler(s.to_string()))
    }
}

impl std::fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A scheduler name that is not one of [`SchedulerKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduler {0:?} (known: min-rtt, ack-clocked, round-robin, redundant, deadline, backup)")]
pub struct UnknownScheduler(pub String);

/// Picks the path for the next data packet.
pub trait Scheduler: Send + std::fmt::Debug {
    /// `paths` is not empty and lists every path that may carry data, in index order;
    /// returns the `index` of a `ready` one, or `None` to send no data now.
    fn pick(&mut self, paths: &[Candidate], ctx: &Context) -> Option<usize>;

    /// Whether each data packet is also sent on every other path that may carry data.
    fn duplicates(&self) -> bool {
        false
    }
}

fn min_rtt(paths: &[Candidate]) -> Option<usize> {
    paths
        .iter()
        .filter(|c| c.ready)
        .min_by_key(|c| (c.rtt, c.index))
        .map(|c| c.index)
}

/// The lowest smoothed RTT among the paths with room wins; ties go to the lower index.
#[derive(Debug, Default)]
pub struct MinRtt;

impl Scheduler for MinRtt {
    fn pick(&mut self, paths: &[Candidate], _: &Context) -> Option<usize> {
        min_rtt(paths)
    }
}

/// The path with room whose acknowledgement arrived last; paths never acknowledged come
/// after, by RTT.
#[derive(Debug, Default)]
pub struct AckClocked;

impl Scheduler for AckClocked {
    fn pick(&mut self, paths: &[Candidate], _: &Context) -> Option<usize> {
        paths
            .iter()
            .filter(|c| c.ready)
            .max_by_key(|c| (c.last_ack, std::cmp::Reverse((c.rtt, c.index))))
            .map(|c| c.index)
    }
}

/// The first path with room after the path used last.
#[derive(Debug, Default)]
pub struct RoundRobin {
    last: Option<usize>,
}

impl Scheduler for RoundRobin {
    fn pick(&mut self, paths: &[Candidate], _: &Context) -> Option<usize> {
        let ready = || paths.iter().filter(|c| c.ready).map(|c| c.index);
        let next = ready()
            .filter(|i| self.last.is_none_or(|l| *i > l))
            .min()
            .or_else(|| ready().min())?;
        self.last = Some(next);
        Some(next)
    }
}

/// Min-RTT for the original; every other path gets a copy.
#[derive(Debug, Default)]
pub struct Redundant;

impl Scheduler for Redundant {
    fn pick(&mut self, paths: &[Candidate], _: &Context) -> Option<usize> {
        min_rtt(paths)
    }

    fn duplicates(&self) -> bool {
        true
    }
}

/// With a deadline waiting: the path with the earliest estimated delivery among all paths
/// (its queue included), and if it has no room this instant, nothing: the packet waits for it
/// rather than take a path on which it would arrive later (ECF's rule). A slower path is used
/// once the fast one's queue makes it the later one. With no deadline waiting: min-RTT.
#[derive(Debug, Default)]
pub struct Deadline;

impl Scheduler for Deadline {
    fn pick(&mut self, paths: &[Candidate], ctx: &Context) -> Option<usize> {
        if ctx.deadline.is_none() {
            return min_rtt(paths);
        }
        let best = paths
            .iter()
            .min_by_key(|c| (c.delivery_estimate(ctx.packet_size), c.index))?;
        best.ready.then_some(best.index)
    }
}

/// Only the first path (lowest index) that may carry data; the others wait until it fails.
#[derive(Debug, Default)]
pub struct Backup;

impl Scheduler for Backup {
    fn pick(&mut self, paths: &[Candidate], _: &Context) -> Option<usize> {
        paths.first().filter(|c| c.ready).map(|c| c.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: usize, rtt_ms: u64) -> Candidate {
        Candidate {
            index,
            ready: true,
            rtt: Duration::from_millis(rtt_ms),
            cwnd: 10_000,
            in_flight: 0,
            last_ack: None,
        }
    }

    fn none() -> Context {
        Context::default()
    }

    #[test]
    fn min_rtt_takes_the_fastest_path_with_room() {
        assert_eq!(
            MinRtt.pick(&[c(0, 50), c(1, 10), c(2, 30)], &none()),
            Some(1)
        );
        assert_eq!(
            MinRtt.pick(&[c(1, 10), c(3, 10)], &none()),
            Some(1),
            "ties: lower index"
        );
        let full = Candidate {
            ready: false,
            ..c(1, 10)
        };
        assert_eq!(MinRtt.pick(&[c(0, 50), full], &none()), Some(0));
        assert_eq!(MinRtt.pick(&[full], &none()), None);
    }

    #[test]
    fn round_robin_cycles_through_the_paths_with_room() {
        let mut rr = RoundRobin::default();
        let all = [c(0, 1), c(1, 1), c(2, 1)];
        let picks: Vec<_> = (0..5).map(|_| rr.pick(&all, &none()).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1]);
        assert_eq!(
            rr.pick(&[c(0, 1), c(1, 1)], &none()),
            Some(0),
            "2 not offered: wraps"
        );
    }

    #[test]
    fn ack_clocked_sends_on_the_path_whose_ack_came_last() {
        let t0 = crate::cc::testing::epoch();
        let acked = |i, rtt, ms| Candidate {
            last_ack: Some(t0 + Duration::from_millis(ms)),
            ..c(i, rtt)
        };
        // The slow path's ACK is the newest: it sends next, though its RTT is higher.
        assert_eq!(
            AckClocked.pick(&[acked(0, 10, 5), acked(1, 80, 7)], &none()),
            Some(1)
        );
        assert_eq!(
            AckClocked.pick(&[acked(0, 10, 9), acked(1, 80, 7)], &none()),
            Some(0)
        );
        // A path never acknowledged comes last.
        assert_eq!(
            AckClocked.pick(&[c(0, 10), acked(1, 80, 1)], &none()),
            Some(1)
        );
        assert_eq!(
            AckClocked.pick(&[c(0, 10), c(1, 5)], &none()),
            Some(1),
            "then by RTT"
        );
    }

    #[test]
    fn redundant_duplicates_and_others_do_not() {
        for kind in SchedulerKind::ALL {
            assert_eq!(
                kind.build().duplicates(),
                kind == SchedulerKind::Redundant,
                "{kind}"
            );
        }
    }

    #[test]
    fn deadline_takes_the_earliest_delivery_even_if_it_must_wait() {
        let ctx = |ms| Context {
            deadline: Some(Duration::from_millis(ms)),
            packet_size: 1_000,
        };
        // Path 0: 10 ms RTT but 30 packets queued (≈ 40 ms until a new one arrives);
        // path 1: 40 ms RTT, empty (≈ 24 ms). The queue-aware estimate prefers path 1.
        let busy = Candidate {
            in_flight: 30_000,
            cwnd: 10_000,
            ..c(0, 10)
        };
        assert_eq!(Deadline.pick(&[busy, c(1, 40)], &ctx(100)), Some(1));
        assert_eq!(MinRtt.pick(&[busy, c(1, 40)], &none()), Some(0));
        // The fast path is full for a moment but still delivers first: wait for it.
        let full = Candidate {
            ready: false,
            ..c(0, 10)
        };
        assert_eq!(Deadline.pick(&[full, c(1, 100)], &ctx(30)), None);
        // Once its queue makes it the later one, the slow path goes.
        let queued = Candidate {
            in_flight: 200_000,
            ..full
        };
        assert_eq!(Deadline.pick(&[queued, c(1, 100)], &ctx(200)), Some(1));
        // No deadline waiting: min-RTT.
        assert_eq!(Deadline.pick(&[full, c(1, 100)], &none()), Some(1));
    }

    #[test]
    fn backup_uses_only_the_first_path() {
        assert_eq!(Backup.pick(&[c(0, 50), c(1, 10)], &none()), Some(0));
        let full = Candidate {
            ready: false,
            ..c(0, 50)
        };
        assert_eq!(
            Backup.pick(&[full, c(1, 10)], &none()),
            None,
            "waits for it"
        );
        assert_eq!(Backup.pick(&[c(1, 10)], &none()), Some(1), "path 0 failed");
    }

    #[test]
    fn names_parse_back() {
        for kind in SchedulerKind::ALL {
            assert_eq!(kind.name().parse::<SchedulerKind>(), Ok(kind));
        }
        assert!("fastest".parse::<SchedulerKind>().is_err());
    }
}
