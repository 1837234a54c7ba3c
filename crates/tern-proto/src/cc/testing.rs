//! Test doubles for congestion control (STYLE example 7, after s2n-quic's
//! `congestion_controller::testing`), available to other crates with the `testing` feature.
//!
//! - [`Unlimited`]: a huge window and no pacing, for tests about everything but congestion
//!   control (flow control, reassembly, handshakes).
//! - [`Mock`]: counts every callback and reports whatever window and pacing rate it is told to.
//!   Clones share their state, so a test keeps one clone and hands the other (or the factory) to
//!   the connection.
//! - Helpers for driving controllers in tests: [`epoch`], [`rtt_with`], [`ack_round_trip`].

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::{Controller, ControllerFactory, Metrics, PathInfo};
use crate::recovery::rtt::RttEstimator;

/// A fixed base instant for virtual time in tests.
///
/// `Instant` has no constructor, so the clock is read once per process; tests only ever add
/// durations to it, so its value never matters.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    #[allow(clippy::disallowed_methods)]
    *EPOCH.get_or_init(Instant::now)
}

/// An RTT estimator whose minimum is `min` and whose smoothed and latest RTT are (very nearly)
/// `current`: one sample of `min`, then enough samples of `current` for the average to settle.
pub fn rtt_with(min: Duration, current: Duration) -> RttEstimator {
    let mut rtt = RttEstimator::new(current);
    rtt.update(Duration::ZERO, min);
    for _ in 0..100 {
        rtt.update(Duration::ZERO, current);
    }
    rtt
}

/// Sends a full window in datagrams of `mss` bytes at `now` and acknowledges all of them one
/// smoothed RTT later (not app-limited). Returns the time of the acknowledgements.
pub fn ack_round_trip(
    cc: &mut dyn Controller,
    now: Instant,
    rtt: &RttEstimator,
    mss: u64,
) -> Instant {
    let mss = mss.max(1);
    let window = cc.window();
    let mut in_flight = 0u64;
    let mut remaining = window;
    while remaining > 0 {
        let size = remaining.min(mss);
        in_flight += size;
        cc.on_sent(now, size, in_flight);
        remaining -= size;
    }
    let acked_at = now + rtt.smoothed();
    let mut remaining = window;
    while remaining > 0 {
        let size = remaining.min(mss);
        in_flight -= size;
        cc.on_ack(acked_at, now, size, false, rtt);
        remaining -= size;
    }
    cc.on_end_acks(acked_at, in_flight, false, Some(now));
    acked_at
}

/// Window reported by [`Unlimited`]: huge, yet far enough from `u64::MAX` that a caller adding a
/// packet size to it cannot overflow.
pub const UNLIMITED_WINDOW: u64 = u64::MAX / 2;

/// A controller that never limits anything (and is its own factory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unlimited;

impl Controller for Unlimited {
    fn window(&self) -> u64 {
        UNLIMITED_WINDOW
    }

    fn initial_window(&self) -> u64 {
        UNLIMITED_WINDOW
    }

    fn metrics(&self) -> Metrics {
        Metrics::new(UNLIMITED_WINDOW)
    }

    fn name(&self) -> &'static str {
        "unlimited"
    }
}

impl ControllerFactory for Unlimited {
    fn build(&self, _now: Instant, _info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Unlimited)
    }
}

/// What a [`Mock`] has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MockCounts {
    /// Controllers built by the mock used as a factory.
    pub built: u64,
    /// Calls to `on_sent`.
    pub on_sent: u64,
    /// Calls to `on_ack`.
    pub on_ack: u64,
    /// Calls to `on_ack` with `app_limited` set.
    pub app_limited_acks: u64,
    /// Calls to `on_end_acks`.
    pub on_end_acks: u64,
    /// Calls to `on_congestion_event`.
    pub on_congestion_event: u64,
    /// Calls to `on_congestion_event` with `persistent_congestion` set.
    pub persistent_congestion: u64,
    /// Calls to `on_spurious_congestion_event`.
    pub on_spurious_congestion_event: u64,
    /// Calls to `on_mtu_update`.
    pub on_mtu_update: u64,
    /// Sum of `bytes` over `on_sent`.
    pub bytes_sent: u64,
    /// Sum of `bytes` over `on_ack`.
    pub bytes_acked: u64,
    /// Sum of `lost_bytes` over `on_congestion_event`.
    pub bytes_lost: u64,
    /// `bytes_in_flight` of the latest `on_sent` or `on_end_acks`.
    pub last_bytes_in_flight: u64,
    /// Latest `on_mtu_update` argument.
    pub max_datagram_size: Option<u16>,
}

#[derive(Debug)]
struct MockState {
    counts: MockCounts,
    window: u64,
    pacing_rate: Option<u64>,
}

/// A controller that counts every callback and reports the window it is told to.
///
/// Clones share state: keep one to inspect [`Mock::counts`] and steer [`Mock::set_window`] while
/// the connection owns another (or uses the mock as its [`ControllerFactory`]; every controller
/// it builds shares the same state).
#[derive(Debug, Clone)]
pub struct Mock {
    shared: Arc<Mutex<MockState>>,
}

impl Mock {
    /// A mock reporting `window` bytes and no pacing rate.
    pub fn new(window: u64) -> Self {
        Self {
            shared: Arc::new(Mutex::new(MockState {
                counts: MockCounts::default(),
                window,
                pacing_rate: None,
            })),
        }
    }

    /// Makes the mock report `window` from now on.
    pub fn set_window(&self, window: u64) {
        self.with(|s| s.window = window);
    }

    /// Makes the mock report `rate` (bytes/s) as its pacing rate.
    pub fn set_pacing_rate(&self, rate: Option<u64>) {
        self.with(|s| s.pacing_rate = rate);
    }

    /// The callbacks seen so far by this mock and all its clones.
    pub fn counts(&self) -> MockCounts {
        self.with(|s| s.counts.clone())
    }

    fn with<R>(&self, f: impl FnOnce(&mut MockState) -> R) -> R {
        // A panicking test thread must not hide the counts from the others.
        let mut state = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }
}

impl Default for Mock {
    /// A mock with a window of 10 minimum-size datagrams.
    fn default() -> Self {
        Self::new(10 * u64::from(super::DEFAULT_MAX_DATAGRAM_SIZE))
    }
}

impl Controller for Mock {
    fn on_sent(&mut self, _now: Instant, bytes: u64, bytes_in_flight: u64) {
        self.with(|s| {
            s.counts.on_sent += 1;
            s.counts.bytes_sent = s.counts.bytes_sent.saturating_add(bytes);
            s.counts.last_bytes_in_flight = bytes_in_flight;
        });
    }

    fn on_ack(
        &mut self,
        _now: Instant,
        _sent: Instant,
        bytes: u64,
        app_limited: bool,
        _rtt: &RttEstimator,
    ) {
        self.with(|s| {
            s.counts.on_ack += 1;
            s.counts.app_limited_acks += u64::from(app_limited);
            s.counts.bytes_acked = s.counts.bytes_acked.saturating_add(bytes);
        });
    }

    fn on_end_acks(
        &mut self,
        _now: Instant,
        bytes_in_flight: u64,
        _app_limited: bool,
        _largest_acked_sent: Option<Instant>,
    ) {
        self.with(|s| {
            s.counts.on_end_acks += 1;
            s.counts.last_bytes_in_flight = bytes_in_flight;
        });
    }

    fn on_congestion_event(
        &mut self,
        _now: Instant,
        _largest_lost_sent: Instant,
        lost_bytes: u64,
        persistent_congestion: bool,
        _rtt: &RttEstimator,
    ) {
        self.with(|s| {
            s.counts.on_congestion_event += 1;
            s.counts.persistent_congestion += u64::from(persistent_congestion);
            s.counts.bytes_lost = s.counts.bytes_lost.saturating_add(lost_bytes);
        });
    }

    fn on_spurious_congestion_event(&mut self) {
        self.with(|s| s.counts.on_spurious_congestion_event += 1);
    }

    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        self.with(|s| {
            s.counts.on_mtu_update += 1;
            s.counts.max_datagram_size = Some(max_datagram_size);
        });
    }

    fn window(&self) -> u64 {
        self.with(|s| s.window)
    }

    fn pacing_rate(&self, _rtt: &RttEstimator) -> Option<u64> {
        self.with(|s| s.pacing_rate)
    }

    fn initial_window(&self) -> u64 {
        self.with(|s| s.window)
    }

    fn metrics(&self) -> Metrics {
        self.with(|s| {
            let mut metrics = Metrics::new(s.window);
            metrics.pacing_rate = s.pacing_rate;
            metrics.congestion_events = s.counts.on_congestion_event;
            metrics.persistent_congestion_events = s.counts.persistent_congestion;
            metrics
        })
    }

    fn name(&self) -> &'static str {
        "mock"
    }
}

impl ControllerFactory for Mock {
    fn build(&self, _now: Instant, _info: &PathInfo) -> Box<dyn Controller> {
        self.with(|s| s.counts.built += 1);
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_counts_every_callback_across_clones() {
        let mock = Mock::new(5000);
        let mut cc = mock.build(epoch(), &PathInfo::default());
        let t = epoch();
        let rtt = RttEstimator::new(Duration::from_millis(10));
        cc.on_sent(t, 100, 100);
        cc.on_sent(t, 200, 300);
        cc.on_ack(t, t, 100, true, &rtt);
        cc.on_end_acks(t, 200, false, Some(t));
        cc.on_congestion_event(t, t, 200, true, &rtt);
        cc.on_spurious_congestion_event();
        cc.on_mtu_update(1452);
        mock.set_window(7000);
        mock.set_pacing_rate(Some(1_000_000));
        assert_eq!(cc.window(), 7000);
        assert_eq!(cc.pacing_rate(&rtt), Some(1_000_000));
        let counts = mock.counts();
        assert_eq!(
            counts,
            MockCounts {
                built: 1,
                on_sent: 2,
                on_ack: 1,
                app_limited_acks: 1,
                on_end_acks: 1,
                on_congestion_event: 1,
                persistent_congestion: 1,
                on_spurious_congestion_event: 1,
                on_mtu_update: 1,
                bytes_sent: 300,
                bytes_acked: 100,
                bytes_lost: 200,
                last_bytes_in_flight: 200,
                max_datagram_size: Some(1452),
            }
        );
        let metrics = cc.metrics();
        assert_eq!(metrics.congestion_events, 1);
        assert_eq!(metrics.window, 7000);
        assert_eq!(cc.name(), "mock");
    }

    #[test]
    fn unlimited_is_unlimited() {
        let mut cc = Unlimited.build(epoch(), &PathInfo::default());
        let rtt = RttEstimator::new(Duration::from_millis(10));
        cc.on_congestion_event(epoch(), epoch(), 1_000_000, true, &rtt);
        assert_eq!(cc.window(), UNLIMITED_WINDOW);
        assert!(cc.window().checked_add(u64::from(u16::MAX)).is_some());
        assert_eq!(cc.pacing_rate(&rtt), None);
        assert_eq!(cc.name(), "unlimited");
    }
}
