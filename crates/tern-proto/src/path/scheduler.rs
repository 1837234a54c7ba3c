//! Path schedulers (DESIGN.md F16): which path the next data packet takes. A scheduler sees
//! only the paths that could send a full packet now (validated, not dead, window and pacer
//! open) and picks one; the connection then builds the packet on it. Standby paths are offered
//! only when no active path is usable (the backup rule is the connection's, not a scheduler's).

use std::time::Duration;

/// What a scheduler knows of a path that could send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Index of the path in the connection (stable for the connection's life).
    pub index: usize,
    /// Smoothed RTT (the initial RTT before the first sample).
    pub rtt: Duration,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes in flight.
    pub in_flight: u64,
}

/// Which built-in scheduler a connection uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SchedulerKind {
    /// The lowest-RTT path with room (the default): each packet goes where it arrives first,
    /// and slower paths take what the fast one's window cannot.
    #[default]
    MinRtt,
    /// Paths in turn, one packet each (spreads load evenly regardless of RTT).
    RoundRobin,
}

impl SchedulerKind {
    pub(crate) fn build(self) -> Box<dyn Scheduler> {
        match self {
            SchedulerKind::MinRtt => Box::new(MinRtt),
            SchedulerKind::RoundRobin => Box::new(RoundRobin::default()),
        }
    }
}

/// Picks the path for the next data packet.
pub trait Scheduler: Send + std::fmt::Debug {
    /// `candidates` is not empty; returns one of their `index`es.
    fn pick(&mut self, candidates: &[Candidate]) -> usize;
}

/// The lowest smoothed RTT wins; ties go to the lower index.
#[derive(Debug, Default)]
pub struct MinRtt;

impl Scheduler for MinRtt {
    fn pick(&mut self, candidates: &[Candidate]) -> usize {
        candidates
            .iter()
            .min_by_key(|c| (c.rtt, c.index))
            .map_or(0, |c| c.index)
    }
}

/// The first candidate after the path used last.
#[derive(Debug, Default)]
pub struct RoundRobin {
    last: Option<usize>,
}

impl Scheduler for RoundRobin {
    fn pick(&mut self, candidates: &[Candidate]) -> usize {
        let next = candidates
            .iter()
            .map(|c| c.index)
            .filter(|i| self.last.is_none_or(|l| *i > l))
            .min()
            .or_else(|| candidates.iter().map(|c| c.index).min())
            .unwrap_or(0);
        self.last = Some(next);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: usize, rtt_ms: u64) -> Candidate {
        Candidate {
            index,
            rtt: Duration::from_millis(rtt_ms),
            cwnd: 10_000,
            in_flight: 0,
        }
    }

    #[test]
    fn min_rtt_takes_the_fastest_path() {
        assert_eq!(MinRtt.pick(&[c(0, 50), c(1, 10), c(2, 30)]), 1);
        assert_eq!(MinRtt.pick(&[c(3, 10), c(1, 10)]), 1, "ties: lower index");
    }

    #[test]
    fn round_robin_cycles_through_what_is_offered() {
        let mut rr = RoundRobin::default();
        let all = [c(0, 1), c(1, 1), c(2, 1)];
        let picks: Vec<usize> = (0..5).map(|_| rr.pick(&all)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1]);
        assert_eq!(rr.pick(&[c(0, 1), c(1, 1)]), 0, "2 not offered: wraps");
    }
}
