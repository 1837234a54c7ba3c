//! Recording what happened: named time series and the end-of-run summary.
//!
//! [`Recorder`] is a cheaply cloneable handle to a set of named series of `(time since epoch,
//! value)` points. A test keeps one clone and gives others to its nodes, which append to it
//! (bytes delivered per flow, congestion window, queueing delay); afterwards the test reads the
//! series back or asks for a windowed mean or rate. It is single-threaded (`Rc`), like the
//! simulation itself.
//!
//! [`Summary`] is what [`crate::Simulation::summary`] returns: counters of every link and of the
//! simulation, plus "simulated X in Y wall", printable with `{}`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

use crate::link::LinkStats;
use crate::sim::{LinkId, SimStats};

/// One series: `(time since epoch, value)` points in time order.
pub type Series = Vec<(Duration, f64)>;

/// Named time series shared between a test and its nodes. Clones share the same data.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    series: Rc<RefCell<BTreeMap<String, Series>>>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `(at, value)` to the series `name`, creating it if needed. Points are expected
    /// in time order (virtual time never goes backwards); the windowed helpers rely on it.
    pub fn record(&self, name: &str, at: Duration, value: f64) {
        let mut series = self.series.borrow_mut();
        match series.get_mut(name) {
            Some(points) => points.push((at, value)),
            None => {
                series.insert(name.to_owned(), vec![(at, value)]);
            }
        }
    }

    /// A copy of the series `name` (empty if it was never recorded).
    pub fn series(&self, name: &str) -> Series {
        self.series.borrow().get(name).cloned().unwrap_or_default()
    }

    /// Names of all series, sorted.
    pub fn names(&self) -> Vec<String> {
        self.series.borrow().keys().cloned().collect()
    }

    /// Applies `f` to the points of `name` whose time lies in `window`.
    fn fold_window<T>(
        &self,
        name: &str,
        window: &Range<Duration>,
        init: T,
        f: impl FnMut(T, f64) -> T,
    ) -> T {
        let series = self.series.borrow();
        let points = series.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let start = points.partition_point(|&(t, _)| t < window.start);
        points[start..]
            .iter()
            .take_while(|&&(t, _)| t < window.end)
            .map(|&(_, v)| v)
            .fold(init, f)
    }

    /// Sum of the values recorded in `window` (start inclusive, end exclusive).
    pub fn sum(&self, name: &str, window: Range<Duration>) -> f64 {
        self.fold_window(name, &window, 0.0, |acc, v| acc + v)
    }

    /// Mean of the values recorded in `window`, or `None` if there are none. For sampled
    /// quantities (queue length, RTT) recorded at regular intervals.
    pub fn mean(&self, name: &str, window: Range<Duration>) -> Option<f64> {
        let (n, total) = self.fold_window(name, &window, (0u64, 0.0), |(n, s), v| (n + 1, s + v));
        (n > 0).then(|| total / n as f64)
    }

    /// Mean goodput in bits per second over `window`, for a series whose values are byte
    /// counts delivered at each point (e.g. one point per datagram or per read). `None` for an
    /// empty window.
    pub fn goodput_bps(&self, name: &str, window: Range<Duration>) -> Option<f64> {
        let secs = window.end.checked_sub(window.start)?.as_secs_f64();
        (secs > 0.0).then(|| self.sum(name, window) * 8.0 / secs)
    }
}

/// One link's line in a [`Summary`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkSummary {
    /// Which link.
    pub id: LinkId,
    /// Source IP it carries now.
    pub from: IpAddr,
    /// Destination IP it carries now.
    pub to: IpAddr,
    /// Its counters.
    pub stats: LinkStats,
}

/// End-of-run report: per-link counters, simulation counters, virtual and wall time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The simulation's seed (printed so a failure can be replayed).
    pub seed: u64,
    /// Virtual time elapsed since the epoch.
    pub simulated: Duration,
    /// Wall time spent inside the run methods.
    pub wall: Duration,
    /// Simulation-wide counters.
    pub stats: SimStats,
    /// One entry per link, in the order they were added.
    pub links: Vec<LinkSummary>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let speedup = if self.wall.is_zero() {
            f64::INFINITY
        } else {
            self.simulated.as_secs_f64() / self.wall.as_secs_f64()
        };
        writeln!(
            f,
            "simulated {:.3?} in {:.3?} wall ({speedup:.0}x), seed {}",
            self.simulated, self.wall, self.seed
        )?;
        let s = &self.stats;
        writeln!(
            f,
            "  events {} (timers {}, actions {}); datagrams sent {} delivered {} unroutable {} undeliverable {}",
            s.events, s.timers, s.actions, s.sent, s.delivered, s.unroutable, s.undeliverable
        )?;
        for l in &self.links {
            writeln!(f, "  {} {} -> {}: {}", l.id, l.from, l.to, l.stats)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_windows_and_goodput() {
        let r = Recorder::new();
        let clone = r.clone();
        for ms in 0..1000u64 {
            clone.record("flow", Duration::from_millis(ms), 1250.0);
            r.record("queue", Duration::from_millis(ms), (ms % 10) as f64);
        }
        assert_eq!(r.names(), vec!["flow".to_owned(), "queue".to_owned()]);
        assert_eq!(r.series("flow").len(), 1000);
        assert!(r.series("missing").is_empty());
        // 1250 B per ms = 10 Mbit/s, in any window.
        let g = r
            .goodput_bps(
                "flow",
                Duration::from_millis(100)..Duration::from_millis(600),
            )
            .unwrap();
        assert!((g - 10_000_000.0).abs() < 1e-6, "{g}");
        let m = r
            .mean("queue", Duration::ZERO..Duration::from_secs(1))
            .unwrap();
        assert!((m - 4.5).abs() < 1e-9);
        assert_eq!(
            r.mean("queue", Duration::from_secs(5)..Duration::from_secs(6)),
            None
        );
        assert_eq!(
            r.goodput_bps("flow", Duration::from_secs(1)..Duration::from_secs(1)),
            None
        );
    }
}
