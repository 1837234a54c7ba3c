//! A windowed minimum or maximum of RTT samples (Copa's `RTTstanding`, `RTTmin` and `RTTmax`;
//! the explicit-rate controller's standing RTT), kept as a monotonic deque so that pushing and
//! reading are amortised O(1).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most samples a windowed filter keeps.
const MAX_SAMPLES: usize = 4096;

/// Drops the samples older than `window` before `now`, but never the newest `keep` (at
/// least one).
fn trim(samples: &mut VecDeque<(Instant, Duration)>, now: Instant, window: Duration, keep: usize) {
    while samples.len() > keep.max(1)
        && samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > window)
    {
        samples.pop_front();
    }
}

/// A windowed minimum (or maximum) of RTT samples, as a monotonic deque.
#[derive(Debug, Clone, Default)]
pub(crate) struct Windowed {
    max: bool,
    /// (time, sample): times increasing, samples increasing (min) or decreasing (max), so the
    /// front is the extreme of the window.
    samples: VecDeque<(Instant, Duration)>,
}

impl Windowed {
    pub(crate) fn new(max: bool) -> Self {
        Self {
            max,
            samples: VecDeque::new(),
        }
    }

    pub(crate) fn push(&mut self, now: Instant, sample: Duration) {
        // A sample from a clock that stepped back is stamped with the latest time seen.
        let now = self.samples.back().map_or(now, |&(t, _)| t.max(now));
        while let Some(&(_, back)) = self.samples.back() {
            let dominated = if self.max {
                back <= sample
            } else {
                back >= sample
            };
            if !dominated {
                break;
            }
            self.samples.pop_back();
        }
        self.samples.push_back((now, sample));
        if self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
    }

    /// The extreme of the samples of the last `window` before `now` (the newest sample if all
    /// are older).
    pub(crate) fn get(&mut self, now: Instant, window: Duration) -> Option<Duration> {
        trim(&mut self.samples, now, window, 1);
        self.samples.front().map(|&(_, s)| s)
    }

    pub(crate) fn clear(&mut self) {
        self.samples.clear();
    }
}

/// Most samples a [`WindowedQuantile`] keeps: at high ACK rates its window is the newest this
/// many samples rather than the whole time span, which keeps a read O(this).
const MAX_QUANTILE_SAMPLES: usize = 256;

/// A low quantile of the RTT samples of a sliding time window (Copa's delay level on tern).
///
/// Unlike a windowed minimum, one lucky sample does not set it: under in-order radio jitter
/// a lone packet sees the bare path while every packet of a dense flight waits behind the one
/// before, so the minimum belongs to a path the flow never sees while it sends.
#[derive(Debug, Clone, Default)]
pub(crate) struct WindowedQuantile {
    /// (time, sample), times increasing.
    samples: VecDeque<(Instant, Duration)>,
    scratch: Vec<Duration>,
}

impl WindowedQuantile {
    pub(crate) fn push(&mut self, now: Instant, sample: Duration) {
        let now = self.samples.back().map_or(now, |&(t, _)| t.max(now));
        self.samples.push_back((now, sample));
        if self.samples.len() > MAX_QUANTILE_SAMPLES {
            self.samples.pop_front();
        }
    }

    /// The `quantile` (0 = the minimum) of the samples of the last `window` before `now`,
    /// reaching further back if need be to take in the newest `min_samples` (as many as there
    /// are, if fewer), and how many samples it was taken over.
    pub(crate) fn get(
        &mut self,
        now: Instant,
        window: Duration,
        quantile: f64,
        min_samples: usize,
    ) -> Option<(Duration, usize)> {
        trim(&mut self.samples, now, window, min_samples);
        if self.samples.is_empty() {
            return None;
        }
        self.scratch.clear();
        self.scratch.extend(self.samples.iter().map(|&(_, s)| s));
        let n = self.scratch.len();
        // Index ⌊q·n⌋, so fewer than 1/q samples give their minimum.
        let index = ((quantile.clamp(0.0, 1.0) * n as f64) as usize).min(n - 1);
        let (_, value, _) = self.scratch.select_nth_unstable(index);
        Some((*value, n))
    }

    pub(crate) fn clear(&mut self) {
        self.samples.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::epoch;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quantile_of_the_samples_in_the_window() {
        let mut q = WindowedQuantile::default();
        let t = epoch();
        assert_eq!(q.get(t, 10 * MS, 0.5, 1), None);
        // Samples 10, 9, …, 1 ms, one per ms.
        for i in 0..10u32 {
            q.push(t + i * MS, (10 - i) * MS);
        }
        let now = t + 9 * MS;
        assert_eq!(q.get(now, 20 * MS, 0.0, 1), Some((MS, 10)));
        // ⌊0.5 × 10⌋ = index 5 of 1..=10 ms.
        assert_eq!(q.get(now, 20 * MS, 0.5, 1), Some((6 * MS, 10)));
        assert_eq!(q.get(now, 20 * MS, 1.0, 1), Some((10 * MS, 10)));
        // The window keeps the samples of the last 4 ms: 5, 4, 3, 2, 1 ms.
        assert_eq!(q.get(now, 4 * MS, 0.5, 1), Some((3 * MS, 5)));
        // Fewer than 1 / q samples give their minimum.
        assert_eq!(q.get(now + 6 * MS, 2 * MS, 0.25, 1), Some((MS, 1)));
        q.clear();
        assert_eq!(q.get(now, 4 * MS, 0.5, 1), None);
    }

    #[test]
    fn a_lone_late_sample_is_not_the_level_when_samples_are_few() {
        let mut q = WindowedQuantile::default();
        let t = epoch();
        // Sparse samples, as in slow start: 36 ms every 5 ms, then one late sample of 47 ms
        // and one of 37 ms, alone in the last 10 ms.
        for i in 0..6u32 {
            q.push(t + 5 * i * MS, 36 * MS);
        }
        q.push(t + 40 * MS, 47 * MS);
        q.push(t + 48 * MS, 37 * MS);
        let now = t + 48 * MS;
        // Over the window alone the upper of the two is the median.
        assert_eq!(q.clone().get(now, 10 * MS, 0.5, 1), Some((47 * MS, 2)));
        // Taken over at least four samples, the late one is an outlier.
        assert_eq!(q.clone().get(now, 10 * MS, 0.5, 4), Some((37 * MS, 4)));
        // A window that holds enough samples is not widened: 40 ms hold six.
        assert_eq!(q.get(now, 40 * MS, 0.5, 4), Some((36 * MS, 6)));
    }

    #[test]
    fn a_lone_low_sample_sets_a_minimum_but_not_a_quantile() {
        let mut min = Windowed::new(false);
        let mut q = WindowedQuantile::default();
        let t = epoch();
        for i in 0..20u32 {
            let sample = if i == 7 {
                40 * MS
            } else {
                46 * MS + (i % 3) * MS
            };
            min.push(t + i * MS, sample);
            q.push(t + i * MS, sample);
        }
        let now = t + 19 * MS;
        assert_eq!(min.get(now, 30 * MS), Some(40 * MS));
        assert_eq!(q.get(now, 30 * MS, 0.5, 1).map(|(s, _)| s), Some(47 * MS));
    }

    #[test]
    fn the_newest_samples_are_kept_at_high_rates() {
        let mut q = WindowedQuantile::default();
        let t = epoch();
        for i in 0..(2 * MAX_QUANTILE_SAMPLES as u32) {
            q.push(t, Duration::from_micros(u64::from(i)));
        }
        let (_, n) = q.get(t, 10 * MS, 0.0, 1).expect("samples");
        assert_eq!(n, MAX_QUANTILE_SAMPLES);
        assert_eq!(
            q.get(t, 10 * MS, 0.0, 1).map(|(s, _)| s),
            Some(Duration::from_micros(MAX_QUANTILE_SAMPLES as u64))
        );
    }
}
