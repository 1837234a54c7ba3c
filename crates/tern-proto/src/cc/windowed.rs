//! A windowed minimum or maximum of RTT samples (Copa's `RTTstanding`, `RTTmin` and `RTTmax`;
//! the explicit-rate controller's standing RTT), kept as a monotonic deque so that pushing and
//! reading are amortised O(1).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most samples a windowed filter keeps.
const MAX_SAMPLES: usize = 4096;

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
        while self.samples.len() > 1
            && self
                .samples
                .front()
                .is_some_and(|&(t, _)| now.saturating_duration_since(t) > window)
        {
            self.samples.pop_front();
        }
        self.samples.front().map(|&(_, s)| s)
    }

    /// The extreme as of the latest trim (without trimming: for `&self` callers).
    pub(crate) fn front(&self) -> Option<Duration> {
        self.samples.front().map(|&(_, s)| s)
    }

    pub(crate) fn clear(&mut self) {
        self.samples.clear();
    }
}
