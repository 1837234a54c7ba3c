//! Round-trip time estimation (RFC 9002 §5).
//!
//! One [`RttEstimator`] per path: it turns RTT samples (the time from sending an ack-eliciting
//! packet to receiving the ACK that newly acknowledges it, RFC 9002 §5.1) into the minimum,
//! latest, smoothed RTT and its mean deviation, and derives the two timer bases loss recovery
//! needs: the probe timeout base and the time threshold for declaring a packet lost.
//!
//! The estimator never reads a clock: the caller measures the sample with the `now` it was given.
//! All arithmetic saturates, so absurd samples (hours, `Duration::MAX`) cannot panic.

use std::time::Duration;

/// Timer granularity assumed by loss recovery (RFC 9002 §6.1.2 `kGranularity`, "1 millisecond").
///
/// Used as the floor of the RTT variance term in the probe timeout and of the loss delay, so
/// that a path with a perfectly stable RTT does not get timers tighter than an OS timer can hold.
pub const GRANULARITY: Duration = Duration::from_millis(1);

/// Default `max_ack_delay` when the peer did not advertise one (RFC 9000 §18.2: "If this value
/// is absent, a default of 25 milliseconds is assumed").
pub const DEFAULT_MAX_ACK_DELAY: Duration = Duration::from_millis(25);

/// Round-trip time estimator for one path (RFC 9002 §5).
///
/// Before the first sample, [`smoothed`](Self::smoothed) is the configured initial RTT and
/// [`var`](Self::var) half of it (RFC 9002 §5.3: "smoothed_rtt = kInitialRtt; rttvar =
/// kInitialRtt / 2"), so timers computed before any ACK are still sensible.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    /// The RTT assumed before any sample; kept so a path can be reset to it.
    initial: Duration,
    /// The most recent sample, not adjusted for ACK delay (RFC 9002 §5.2 `latest_rtt`).
    latest: Duration,
    /// Exponentially weighted moving average of adjusted samples (RFC 9002 §5.3 `smoothed_rtt`).
    smoothed: Duration,
    /// Mean deviation of the adjusted samples (RFC 9002 §5.3 `rttvar`).
    var: Duration,
    /// Minimum of unadjusted samples (RFC 9002 §5.2 `min_rtt`); `None` until the first sample.
    min: Option<Duration>,
    /// Upper bound on the ACK delay the peer may report (RFC 9002 §5.3).
    max_ack_delay: Duration,
    /// The most recent sample less the ACK delay, as fed to `smoothed_rtt`.
    adjusted: Duration,
    /// Samples taken so far (tells a caller whether a new one arrived).
    count: u64,
}

impl RttEstimator {
    /// An estimator that assumes `initial_rtt` until the first sample, with the default
    /// `max_ack_delay` of 25 ms ([`DEFAULT_MAX_ACK_DELAY`]).
    pub fn new(initial_rtt: Duration) -> Self {
        Self::with_max_ack_delay(initial_rtt, DEFAULT_MAX_ACK_DELAY)
    }

    /// An estimator that caps reported ACK delays at `max_ack_delay` (the peer's transport
    /// parameter).
    pub fn with_max_ack_delay(initial_rtt: Duration, max_ack_delay: Duration) -> Self {
        Self {
            initial: initial_rtt,
            latest: initial_rtt,
            smoothed: initial_rtt,
            var: initial_rtt / 2,
            min: None,
            max_ack_delay,
            adjusted: initial_rtt,
            count: 0,
        }
    }

    /// Sets the cap on reported ACK delays, e.g. once the peer's transport parameters arrive.
    pub fn set_max_ack_delay(&mut self, max_ack_delay: Duration) {
        self.max_ack_delay = max_ack_delay;
    }

    /// The cap on reported ACK delays.
    pub fn max_ack_delay(&self) -> Duration {
        self.max_ack_delay
    }

    /// Feeds one RTT sample.
    ///
    /// `rtt_sample` is the raw time between sending the largest newly acknowledged packet and
    /// receiving its ACK; `ack_delay` is the delay the peer reported in that ACK.
    pub fn update(&mut self, ack_delay: Duration, rtt_sample: Duration) {
        self.latest = rtt_sample;
        self.adjusted = rtt_sample;
        self.count = self.count.saturating_add(1);

        let Some(min) = self.min else {
            //= https://www.rfc-editor.org/rfc/rfc9002#section-5.3
            //# min_rtt = latest_rtt
            //# smoothed_rtt = latest_rtt
            //# rttvar = latest_rtt / 2
            self.min = Some(rtt_sample);
            self.smoothed = rtt_sample;
            self.var = rtt_sample / 2;
            return;
        };

        //= https://www.rfc-editor.org/rfc/rfc9002#section-5.2
        //# min_rtt MUST be set to the lesser of min_rtt and latest_rtt
        //# [...] on all other samples.
        // ACK delay is deliberately not subtracted here: "Endpoints SHOULD NOT [...] adjust
        // min_rtt" by it, since a peer could otherwise inflate it to shrink our min_rtt.
        let min = min.min(rtt_sample);
        self.min = Some(min);

        //= https://www.rfc-editor.org/rfc/rfc9002#section-5.3
        //# MUST use the lesser of the acknowledgment delay and the peer's
        //# max_ack_delay after the handshake is confirmed
        let ack_delay = ack_delay.min(self.max_ack_delay);

        //= https://www.rfc-editor.org/rfc/rfc9002#section-5.3
        //# MUST NOT subtract the acknowledgment delay from the RTT sample if
        //# the resulting value is smaller than the min_rtt.
        let adjusted = match rtt_sample.checked_sub(ack_delay) {
            Some(adjusted) if adjusted >= min => adjusted,
            _ => rtt_sample,
        };
        self.adjusted = adjusted;

        //= https://www.rfc-editor.org/rfc/rfc9002#section-5.3
        //# rttvar_sample = abs(smoothed_rtt - adjusted_rtt)
        //# rttvar = 3/4 * rttvar + 1/4 * rttvar_sample
        //# smoothed_rtt = 7/8 * smoothed_rtt + 1/8 * adjusted_rtt
        // Written as `x - x/4 + s/4` rather than `3*x/4`, so no intermediate can overflow.
        let var_sample = self.smoothed.abs_diff(adjusted);
        self.var = (self.var - self.var / 4).saturating_add(var_sample / 4);
        self.smoothed = (self.smoothed - self.smoothed / 8).saturating_add(adjusted / 8);
    }

    /// Smoothed RTT (the initial RTT before the first sample).
    pub fn smoothed(&self) -> Duration {
        self.smoothed
    }

    /// RTT mean deviation (half the initial RTT before the first sample).
    pub fn var(&self) -> Duration {
        self.var
    }

    /// Minimum RTT observed on the path, `None` before the first sample.
    ///
    /// Not defaulted to the initial RTT, because controllers that compare the current RTT with
    /// the minimum (queue-delay estimates) must know when there is no minimum yet.
    pub fn min(&self) -> Option<Duration> {
        self.min
    }

    /// Most recent raw sample (the initial RTT before the first sample).
    pub fn latest(&self) -> Duration {
        self.latest
    }

    /// Most recent sample less the peer's ACK delay (capped, and never below `min_rtt`): the
    /// time the network took, as `smoothed_rtt` counts it (the initial RTT before the first
    /// sample).
    pub fn latest_adjusted(&self) -> Duration {
        self.adjusted
    }

    /// How many samples were taken (a caller that keeps its own filter of samples compares
    /// it with the count it saw last).
    pub fn sample_count(&self) -> u64 {
        self.count
    }

    /// The RTT assumed before the first sample.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// Whether at least one sample was taken.
    pub fn has_sample(&self) -> bool {
        self.min.is_some()
    }

    /// Probe timeout base: `smoothed_rtt + max(4 * rttvar, kGranularity)`.
    ///
    /// RFC 9002 §6.2.1 adds `max_ack_delay` on top for the application data space; that term
    /// depends on the packet number space, so the caller adds it (and the exponential backoff).
    pub fn pto_base(&self) -> Duration {
        self.smoothed
            .saturating_add(self.var.saturating_mul(4).max(GRANULARITY))
    }

    /// Time threshold for loss detection: `max(9/8 * max(smoothed_rtt, latest_rtt),
    /// kGranularity)`.
    ///
    /// RFC 9002 §6.1.2: a packet sent this long before a later packet that was acknowledged is
    /// declared lost. The 9/8 (`kTimeThreshold`) leaves room for reordering and jitter.
    pub fn loss_delay(&self) -> Duration {
        let base = self.smoothed.max(self.latest);
        base.saturating_add(base / 8).max(GRANULARITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn before_any_sample_uses_initial_rtt() {
        let rtt = RttEstimator::new(333 * MS);
        assert!(!rtt.has_sample());
        assert_eq!(rtt.smoothed(), 333 * MS);
        assert_eq!(rtt.var(), Duration::from_micros(166_500));
        assert_eq!(rtt.min(), None);
        assert_eq!(rtt.latest(), 333 * MS);
        assert_eq!(rtt.initial(), 333 * MS);
        // 333 + 4 * 166.5
        assert_eq!(rtt.pto_base(), 999 * MS);
    }

    #[test]
    fn first_sample_replaces_everything_and_ignores_ack_delay() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(10 * MS, 100 * MS);
        assert!(rtt.has_sample());
        assert_eq!(rtt.min(), Some(100 * MS));
        assert_eq!(rtt.smoothed(), 100 * MS);
        assert_eq!(rtt.var(), 50 * MS);
        assert_eq!(rtt.latest(), 100 * MS);
    }

    #[test]
    fn subsequent_samples_follow_the_ewma() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(Duration::ZERO, 100 * MS);
        rtt.update(Duration::ZERO, 200 * MS);
        // var = 3/4 * 50 + 1/4 * |100 - 200| = 62.5; srtt = 7/8 * 100 + 1/8 * 200 = 112.5
        assert_eq!(rtt.var(), Duration::from_micros(62_500));
        assert_eq!(rtt.smoothed(), Duration::from_micros(112_500));
        assert_eq!(rtt.min(), Some(100 * MS));
        assert_eq!(rtt.latest(), 200 * MS);
    }

    #[test]
    fn ack_delay_is_subtracted_when_it_stays_above_min_rtt() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(Duration::ZERO, 100 * MS);
        rtt.update(20 * MS, 140 * MS);
        // adjusted = 120: srtt = 87.5 + 15 = 102.5
        assert_eq!(rtt.smoothed(), Duration::from_micros(102_500));
        // latest and min are never adjusted; the adjusted sample is kept beside them
        assert_eq!(rtt.latest(), 140 * MS);
        assert_eq!(rtt.min(), Some(100 * MS));
        assert_eq!(rtt.latest_adjusted(), 120 * MS);
        assert_eq!(rtt.sample_count(), 2);
        // below min_rtt, the sample stays unadjusted
        rtt.update(20 * MS, 110 * MS);
        assert_eq!(rtt.latest_adjusted(), 110 * MS);
        assert_eq!(rtt.sample_count(), 3);
    }

    #[test]
    fn ack_delay_is_not_subtracted_below_min_rtt() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(Duration::ZERO, 100 * MS);
        rtt.update(20 * MS, 110 * MS);
        // 110 - 20 = 90 < min 100: use 110 unadjusted; srtt = 87.5 + 13.75 = 101.25
        assert_eq!(rtt.smoothed(), Duration::from_micros(101_250));
    }

    #[test]
    fn ack_delay_is_capped_at_max_ack_delay() {
        let mut rtt = RttEstimator::with_max_ack_delay(333 * MS, 5 * MS);
        assert_eq!(rtt.max_ack_delay(), 5 * MS);
        rtt.update(Duration::ZERO, 100 * MS);
        rtt.update(100 * MS, 300 * MS);
        // delay capped to 5: adjusted = 295; srtt = 87.5 + 36.875 = 124.375
        assert_eq!(rtt.smoothed(), Duration::from_micros(124_375));
        rtt.set_max_ack_delay(25 * MS);
        assert_eq!(rtt.max_ack_delay(), 25 * MS);
    }

    #[test]
    fn min_rtt_tracks_the_smallest_unadjusted_sample() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(Duration::ZERO, 100 * MS);
        rtt.update(Duration::ZERO, 80 * MS);
        rtt.update(50 * MS, 90 * MS);
        assert_eq!(rtt.min(), Some(80 * MS));
    }

    #[test]
    fn pto_base_has_granularity_floor() {
        let mut rtt = RttEstimator::new(333 * MS);
        for _ in 0..100 {
            rtt.update(Duration::ZERO, 10 * MS);
        }
        assert!(rtt.var() < Duration::from_micros(250));
        assert_eq!(rtt.pto_base(), 11 * MS);
    }

    #[test]
    fn loss_delay_is_nine_eighths_of_the_larger_rtt() {
        let mut rtt = RttEstimator::new(333 * MS);
        rtt.update(Duration::ZERO, 80 * MS);
        assert_eq!(rtt.loss_delay(), 90 * MS);
        rtt.update(Duration::ZERO, 160 * MS);
        // smoothed = 90, latest = 160 -> 180
        assert_eq!(rtt.loss_delay(), 180 * MS);
    }

    #[test]
    fn loss_delay_has_granularity_floor() {
        let mut rtt = RttEstimator::new(Duration::ZERO);
        assert_eq!(rtt.loss_delay(), GRANULARITY);
        rtt.update(Duration::ZERO, Duration::from_micros(100));
        assert_eq!(rtt.loss_delay(), GRANULARITY);
        assert_eq!(rtt.pto_base(), Duration::from_micros(1_100));
    }

    #[test]
    fn extreme_samples_do_not_panic() {
        let mut rtt = RttEstimator::new(Duration::MAX);
        assert_eq!(rtt.pto_base(), Duration::MAX);
        assert_eq!(rtt.loss_delay(), Duration::MAX);
        rtt.update(Duration::MAX, Duration::MAX);
        rtt.update(Duration::MAX, Duration::ZERO);
        rtt.update(Duration::ZERO, Duration::MAX);
        assert_eq!(rtt.min(), Some(Duration::ZERO));
        let _ = (rtt.pto_base(), rtt.loss_delay());
    }
}
