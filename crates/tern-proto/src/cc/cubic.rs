//! CUBIC (RFC 9438), the Linux default and tern's baseline controller.
//!
//! Only CUBIC's own rules live here: the cubic window function with its epoch, `W_max` and `K`,
//! the Reno-friendly region, multiplicative decrease by β = 0.7 and fast convergence. Slow start,
//! recovery, persistent congestion, undo and random-loss tolerance come from [`Classic`].
//!
//! Windows are kept in bytes; RFC 9438 counts in segments, so `C` (segments/s³) is multiplied by
//! the maximum datagram size wherever a window is computed.

use std::time::Instant;

use super::classic::{classic_config_builders, Classic, ClassicConfig, WindowAdjustment};
use super::{Controller, ControllerFactory, PathInfo};
use crate::recovery::rtt::RttEstimator;

//= https://www.rfc-editor.org/rfc/rfc9438#section-4.1.1
//# C: Constant that determines the aggressiveness of CUBIC in competing
//# with other congestion control algorithms in high-BDP networks.
// RFC 9438 §5 (Discussion) settles on C = 0.4.
/// CUBIC's scaling constant `C`, in segments per second³.
pub const C: f64 = 0.4;

//= https://www.rfc-editor.org/rfc/rfc9438#section-4.6
//# Parameter β_cubic SHOULD be set to 0.7
/// CUBIC's multiplicative decrease factor `β_cubic`.
pub const BETA: f64 = 0.7;

//= https://www.rfc-editor.org/rfc/rfc9438#section-4.3
//# α_cubic = 3 * (1 - β_cubic) / (1 + β_cubic)
/// Additive increase (segments per RTT) of the Reno estimate `W_est` until it reaches
/// `cwnd_prior`: with β = 0.7 it gives the same average window as Reno's AIMD(1, 0.5).
pub const ALPHA_RENO_FRIENDLY: f64 = 3.0 * (1.0 - BETA) / (1.0 + BETA);

/// CUBIC's growth and reduction rules. Use it as `Classic<Cubic>`, usually built by
/// [`CubicConfig`].
#[derive(Debug, Clone)]
pub struct Cubic {
    fast_convergence: bool,
    /// `W_max` in bytes: the window just before the last reduction (as adjusted by fast
    /// convergence); 0 until the first congestion event.
    w_max: f64,
    /// `cwnd_prior` in bytes: the window at the most recent reduction, which `W_est` must reach
    /// before it grows at Reno's full rate (RFC 9438 §4.3).
    cwnd_prior: f64,
    /// `K` in seconds: time from the epoch start until `W_cubic` reaches `W_max` again.
    k: f64,
    /// Start of the current congestion avoidance stage, `None` = start one on the next ACK.
    epoch_start: Option<Instant>,
    /// `W_est` in bytes: what an AIMD(α_cubic, β_cubic) flow would have (Reno-friendly region).
    w_est: f64,
    /// Fraction of a byte of growth not yet added to the (integer) window.
    carry: f64,
}

impl Cubic {
    /// CUBIC with or without fast convergence (RFC 9438 §4.7).
    pub fn new(fast_convergence: bool) -> Self {
        Self {
            fast_convergence,
            w_max: 0.0,
            cwnd_prior: 0.0,
            k: 0.0,
            epoch_start: None,
            w_est: 0.0,
            carry: 0.0,
        }
    }

    /// `W_max` in bytes (0 before the first congestion event).
    pub fn w_max(&self) -> f64 {
        self.w_max
    }

    /// `K` in seconds, for the current epoch.
    pub fn k(&self) -> f64 {
        self.k
    }

    /// Start of the current congestion avoidance epoch, if one is running.
    pub fn epoch_start(&self) -> Option<Instant> {
        self.epoch_start
    }

    /// `W_cubic(t)` in bytes, `t` seconds after the epoch start.
    pub fn w_cubic(&self, t: f64, max_datagram_size: f64) -> f64 {
        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.2
        //# W_cubic(t) = C * (t - K)^3 + W_max
        let d = t - self.k;
        C * max_datagram_size * d * d * d + self.w_max
    }

    /// Starts a congestion avoidance epoch at `now` with window `cwnd` (bytes).
    fn start_epoch(&mut self, now: Instant, cwnd: f64, mss: f64) -> Instant {
        self.epoch_start = Some(now);
        self.carry = 0.0;
        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.3
        //# W_est is set equal to cwnd_epoch at the start of the congestion
        //# avoidance stage.
        self.w_est = cwnd;
        if self.w_max <= cwnd {
            //= https://www.rfc-editor.org/rfc/rfc9438#section-4.2
            //# In special cases, if cwnd_epoch is greater than W_max, K is set to 0.
            // W_max is raised to the current window too (as after a timeout, §4.8, or a slow
            // start that ended without loss, §4.10): with the old, smaller W_max the curve would
            // start below the window and CUBIC would stall until it caught up.
            self.w_max = cwnd;
            self.k = 0.0;
        } else {
            //= https://www.rfc-editor.org/rfc/rfc9438#section-4.2
            //# K = cubic_root((W_max - cwnd_epoch) / C)
            self.k = ((self.w_max - cwnd) / (C * mss)).cbrt();
        }
        now
    }
}

impl Default for Cubic {
    /// CUBIC with fast convergence, as RFC 9438 §4.7 recommends.
    fn default() -> Self {
        Self::new(true)
    }
}

impl WindowAdjustment for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }

    fn on_avoidance_ack(
        &mut self,
        now: Instant,
        window: u64,
        bytes_acked: u64,
        max_datagram_size: u64,
        rtt: &RttEstimator,
    ) -> u64 {
        let cwnd = window as f64;
        let mss = max_datagram_size as f64;
        let acked = bytes_acked as f64;
        if cwnd <= 0.0 || mss <= 0.0 {
            return window;
        }
        let epoch_start = match self.epoch_start {
            Some(start) => start,
            None => self.start_epoch(now, cwnd, mss),
        };
        let t = now.saturating_duration_since(epoch_start).as_secs_f64();
        let srtt = rtt.smoothed().as_secs_f64();

        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.3
        //# W_est = W_est + α_cubic * segments_acked / cwnd
        //# [...] once W_est has grown to reach the cwnd at the time of most
        //# recently setting ssthresh -- that is, W_est >= cwnd_prior -- the
        //# sender SHOULD set α_cubic to 1
        let alpha = if self.w_est >= self.cwnd_prior {
            1.0
        } else {
            ALPHA_RENO_FRIENDLY
        };
        // In bytes: α × (acked / mss) / (cwnd / mss) segments × mss.
        self.w_est += alpha * mss * acked / cwnd;

        let next = if self.w_cubic(t, mss) < self.w_est {
            //= https://www.rfc-editor.org/rfc/rfc9438#section-4.3
            //# When receiving a new ACK in congestion avoidance (where cwnd could be
            //# greater than or less than W_max), CUBIC checks whether W_cubic(t) is
            //# less than W_est. If so, CUBIC is in the Reno-friendly region and
            //# cwnd SHOULD be set to W_est at each reception of a new ACK.
            self.w_est.max(cwnd)
        } else {
            //= https://www.rfc-editor.org/rfc/rfc9438#section-4.2
            //# target = cwnd               if W_cubic(t + RTT) < cwnd
            //#          1.5 * cwnd         if W_cubic(t + RTT) > 1.5 * cwnd
            //#          W_cubic(t + RTT)   otherwise
            let target = self.w_cubic(t + srtt, mss).clamp(cwnd, 1.5 * cwnd);
            //= https://www.rfc-editor.org/rfc/rfc9438#section-4.4
            //# cwnd MUST be incremented by (target - cwnd) / cwnd for each received new ACK
            // (§4.5, the convex region, uses the same increment.) Per acknowledged byte rather
            // than per ACK, so ACK frequency does not change the growth rate.
            cwnd + (target - cwnd) * acked / cwnd
        };

        let growth = (next - cwnd).max(0.0) + self.carry;
        if !growth.is_finite() {
            self.carry = 0.0;
            return window;
        }
        let whole = growth.floor();
        self.carry = growth - whole;
        // Float-to-integer `as` saturates; Classic clamps the result to its maximum window.
        window.saturating_add(whole as u64)
    }

    fn on_congestion(&mut self, now: Instant, window: u64, max_datagram_size: u64) -> u64 {
        let _ = (now, max_datagram_size);
        let cwnd = window as f64;
        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.7
        //# W_max = cwnd * (1 + β_cubic) / 2   if cwnd < W_max and fast convergence is enabled,
        //#                                    further reduce W_max
        //# W_max = cwnd                       otherwise, remember cwnd before reduction
        self.w_max = if self.fast_convergence && cwnd < self.w_max {
            cwnd * (1.0 + BETA) / 2.0
        } else {
            cwnd
        };
        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.6
        //# ssthresh = flight_size * β_cubic
        //# cwnd_prior = cwnd
        // tern reduces from the window, as RFC 9002 §7.3.2 does, not from the flight size: the
        // controller is not told the flight size at loss time, and app-limited periods do not
        // grow the window (RFC 9002 §7.8), so the two are close when it matters.
        self.cwnd_prior = cwnd;
        self.epoch_start = None;
        self.carry = 0.0;
        (cwnd * BETA).round() as u64
    }

    fn on_persistent_congestion(&mut self) {
        //= https://www.rfc-editor.org/rfc/rfc9438#section-4.8
        //# During the first congestion avoidance stage after a timeout, CUBIC
        //# increases its congestion window size using Figure 1, where t is the
        //# elapsed time since the beginning of the current congestion avoidance
        //# stage, K is set to 0, and W_max is set to the congestion window size
        //# at the beginning of the current congestion avoidance stage.
        // A zero W_max makes `start_epoch` do exactly that.
        self.w_max = 0.0;
        self.k = 0.0;
        self.epoch_start = None;
        self.carry = 0.0;
    }

    fn on_app_limited(&mut self, now: Instant) {
        let _ = now;
        //= https://www.rfc-editor.org/rfc/rfc9438#section-5.8
        //# it is required that t in Figure 1 not include periods during which
        //# cwnd has not been updated due to application-limited behavior, such
        //# as a lack of data to send.
        // Restarting the epoch at the next full-window ACK recomputes K from the window at that
        // time, so the curve resumes from the current window instead of jumping ahead by the
        // idle time (the Linux fix of 2015, "tcp_cubic: better follow cubic curve after idle").
        self.epoch_start = None;
    }
}

/// Configuration and factory of CUBIC controllers.
///
/// A connection configuration holds it as an `Arc<dyn ControllerFactory>`, e.g.
/// `Arc::new(CubicConfig::default().fast_convergence(false))`.
#[derive(Debug, Clone, PartialEq)]
pub struct CubicConfig {
    classic: ClassicConfig,
    fast_convergence: bool,
}

impl Default for CubicConfig {
    fn default() -> Self {
        Self {
            classic: ClassicConfig::default(),
            fast_convergence: true,
        }
    }
}

impl CubicConfig {
    classic_config_builders!();

    /// Whether to release bandwidth faster when `W_max` shrinks (RFC 9438 §4.7; default on).
    /// The RFC suggests turning it off where a single CUBIC flow runs alone.
    pub fn fast_convergence(mut self, enabled: bool) -> Self {
        self.fast_convergence = enabled;
        self
    }

    /// Whether fast convergence is on.
    pub fn get_fast_convergence(&self) -> bool {
        self.fast_convergence
    }
}

impl ControllerFactory for CubicConfig {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Classic::new(
            Cubic::new(self.fast_convergence),
            &self.classic,
            now,
            info,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cc::testing::{ack_round_trip, epoch, rtt_with};

    const MSS: u64 = 1200;
    const MS: Duration = Duration::from_millis(1);

    fn cubic(config: &CubicConfig) -> Classic<Cubic> {
        Classic::new(
            Cubic::new(config.get_fast_convergence()),
            config.classic_config(),
            epoch(),
            &PathInfo::new(1200, 100 * MS, 0),
        )
    }

    /// Drives one round trip of a full window with ACKs spread evenly over the round trip (one
    /// per datagram), as an ACK clock would. Returns the time at the end of the round.
    fn clocked_round(cc: &mut Classic<Cubic>, start: Instant, rtt: &RttEstimator) -> Instant {
        let round = rtt.smoothed();
        let packets = (cc.window() / MSS).max(1);
        for i in 1..=packets {
            let at = start + round.mul_f64(i as f64 / packets as f64);
            cc.on_ack(at, at - round, MSS, false, rtt);
        }
        start + round
    }

    /// A controller in slow start, grown to `packets` datagrams, whose next loss is congestive.
    fn grown_to(
        config: &CubicConfig,
        packets: u64,
        rtt: &RttEstimator,
    ) -> (Classic<Cubic>, Instant) {
        let mut cc = cubic(config);
        let t = epoch();
        cc.on_ack(t, t, (packets - 10) * MSS, false, rtt);
        assert_eq!(cc.window(), packets * MSS);
        (cc, t + MS)
    }

    #[test]
    fn slow_start_doubles_every_round_trip() {
        let rtt = rtt_with(100 * MS, 100 * MS);
        let mut cc = cubic(&CubicConfig::default());
        let mut now = epoch();
        for expected in [20, 40, 80, 160] {
            now = ack_round_trip(&mut cc, now, &rtt, MSS);
            assert_eq!(cc.window(), expected * MSS);
        }
    }

    #[test]
    fn congestion_avoidance_does_not_grow_a_window_the_sender_leaves_half_empty() {
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, mut now) = grown_to(&CubicConfig::default(), 100, &queue);
        cc.on_congestion_event(now, now, MSS, false, &queue);
        assert_eq!(cc.window(), 70 * MSS);
        let rtt = rtt_with(100 * MS, 100 * MS);
        // Round after round, data waits but only 20 of the 70 datagrams are ever in flight.
        // The first round may still grow the window (no round has ended to say otherwise).
        let mut after_first = 0;
        for round in 0..30 {
            let sent = now + MS;
            for k in 1..=20 {
                cc.on_sent(sent, MSS, k * MSS);
            }
            now = sent + 100 * MS;
            for _ in 0..20 {
                cc.on_ack(now, sent, MSS, false, &rtt);
            }
            cc.on_end_acks(now, 0, false, Some(sent));
            if round == 0 {
                after_first = cc.window();
            }
        }
        assert_eq!(
            cc.window(),
            after_first,
            "CUBIC's curve grew an unused window"
        );
        // Filling half of it lets the curve go on.
        let sent = now + MS;
        cc.on_sent(sent, 40 * MSS, 40 * MSS);
        now = sent + 100 * MS;
        cc.on_ack(now, sent, 40 * MSS, false, &rtt);
        assert!(cc.window() > after_first);
    }

    #[test]
    fn congestion_reduces_by_beta_and_remembers_w_max() {
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 100, &queue);
        cc.on_congestion_event(now, now, MSS, false, &queue);
        assert_eq!(cc.window(), 70 * MSS);
        assert_eq!(cc.ssthresh(), Some(70 * MSS));
        assert_eq!(cc.adjustment().w_max(), (100 * MSS) as f64);
    }

    #[test]
    fn fast_convergence_lowers_w_max_when_the_window_shrinks() {
        let queue = rtt_with(100 * MS, 150 * MS);
        for (fast, expected_w_max) in [(true, 0.85 * 70.0), (false, 70.0)] {
            let config = CubicConfig::default().fast_convergence(fast);
            let (mut cc, now) = grown_to(&config, 100, &queue);
            cc.on_congestion_event(now, now, MSS, false, &queue);
            // Second loss, a round trip later, before the window got back to W_max.
            let later = now + 200 * MS;
            cc.on_congestion_event(later, later - MS, MSS, false, &queue);
            assert_eq!(cc.window(), 49 * MSS);
            let w_max = cc.adjustment().w_max() / MSS as f64;
            assert!((w_max - expected_w_max).abs() < 1e-9, "{fast}: {w_max}");
        }
    }

    #[test]
    fn growth_follows_the_cubic_curve() {
        // Large window, long RTT: far from the Reno-friendly region.
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 1000, &queue);
        cc.on_congestion_event(now, now, MSS, false, &queue);
        assert_eq!(cc.window(), 700 * MSS);
        // The first round acknowledges packets sent before the reduction (recovery); the epoch
        // starts with the first ACK of a packet sent after it.
        let mut t = clocked_round(&mut cc, now, &queue);
        assert_eq!(cc.window(), 700 * MSS);
        assert_eq!(cc.adjustment().epoch_start(), None);
        t = clocked_round(&mut cc, t, &queue);
        let epoch_start = cc.adjustment().epoch_start().expect("epoch started");
        let k = (300.0f64 / C).cbrt();
        let mut checked = 0;
        while t < epoch_start + Duration::from_secs(20) {
            t = clocked_round(&mut cc, t, &queue);
            let elapsed = (t - epoch_start).as_secs_f64();
            let expected = C * (elapsed - k).powi(3) + 1000.0;
            let actual = cc.window() as f64 / MSS as f64;
            // cwnd chases W_cubic(t + RTT) within each round and lags it by a fraction of the
            // per-round growth, so compare with W(t) within 2 % (and the 1.5× per-round cap
            // never binds here).
            let error = (actual - expected).abs() / expected;
            assert!(
                error < 0.02,
                "t = {elapsed:.2}s: cwnd {actual:.1}, W(t) {expected:.1}"
            );
            checked += 1;
        }
        assert!(checked > 100);
        assert!((cc.adjustment().k() - k).abs() < 1e-6);
        // The window plateaued around W_max near t = K and is in the convex region by 20 s.
        assert!(cc.window() > 1400 * MSS);
    }

    #[test]
    fn reno_friendly_region_on_small_windows() {
        // Small window, short RTT: W_cubic barely moves within a second, Reno's estimate does.
        let queue = rtt_with(10 * MS, 15 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 20, &queue);
        cc.on_congestion_event(now, now, MSS, false, &queue);
        assert_eq!(cc.window(), 14 * MSS);
        let mut t = now;
        let mut rounds = 0u32;
        // One round of recovery, then α_cubic = 0.53 datagrams per round until W_est reaches
        // cwnd_prior (20), then 1.
        while cc.window() < 20 * MSS {
            t = clocked_round(&mut cc, t, &queue);
            rounds += 1;
            assert!(rounds < 100);
        }
        let epoch_start = cc.adjustment().epoch_start().expect("epoch started");
        let expected_rounds = 1.0 + 6.0 / ALPHA_RENO_FRIENDLY;
        assert!(
            (f64::from(rounds) - expected_rounds).abs() <= 2.0,
            "{rounds} rounds, expected about {expected_rounds:.1}"
        );
        let elapsed = (t - epoch_start).as_secs_f64();
        assert!(cc.adjustment().w_cubic(elapsed, MSS as f64) < cc.window() as f64);
        // Past cwnd_prior, W_est grows by one datagram per round trip, like Reno.
        let before = cc.window();
        for _ in 0..10 {
            t = clocked_round(&mut cc, t, &queue);
        }
        let per_round = (cc.window() - before) as f64 / 10.0 / MSS as f64;
        assert!(
            (0.9..1.1).contains(&per_round),
            "{per_round} datagrams per round"
        );
    }

    #[test]
    fn idle_period_does_not_make_the_window_jump() {
        let queue = rtt_with(100 * MS, 150 * MS);
        for idle_reset in [true, false] {
            let (mut cc, now) = grown_to(&CubicConfig::default(), 1000, &queue);
            cc.on_congestion_event(now, now, MSS, false, &queue);
            let mut t = now + MS;
            for _ in 0..10 {
                t = clocked_round(&mut cc, t, &queue);
            }
            let before = cc.window();
            t = clocked_round(&mut cc, t, &queue);
            let normal_growth = cc.window() - before;
            // Thirty seconds with nothing to send.
            if idle_reset {
                cc.on_end_acks(t, 0, true, Some(t));
            }
            t += Duration::from_secs(30);
            let before = cc.window();
            clocked_round(&mut cc, t, &queue);
            let growth = cc.window() - before;
            if idle_reset {
                // Back on the curve where it left off.
                assert!(
                    growth <= normal_growth * 3 / 2 + 2 * MSS,
                    "grew {growth} bytes after idle, {normal_growth} before"
                );
            } else {
                // Without the reset, t includes the idle time and the window leaps.
                assert!(
                    growth > normal_growth * 5,
                    "grew {growth} bytes after idle, {normal_growth} before"
                );
            }
        }
    }

    #[test]
    fn sending_after_idle_restarts_the_epoch() {
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 1000, &queue);
        cc.on_congestion_event(now, now, MSS, false, &queue);
        let t = clocked_round(&mut cc, now + MS, &queue);
        assert!(cc.adjustment().epoch_start().is_some());
        // The first packet after everything was acknowledged.
        cc.on_sent(t + Duration::from_secs(5), MSS, MSS);
        assert_eq!(cc.adjustment().epoch_start(), None);
    }

    #[test]
    fn persistent_congestion_restarts_with_k_zero() {
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 100, &queue);
        cc.on_congestion_event(now, now, MSS, true, &queue);
        assert_eq!(cc.window(), 2 * MSS);
        assert_eq!(cc.ssthresh(), Some(70 * MSS));
        // Slow start back to ssthresh, then congestion avoidance from W_max = cwnd, K = 0.
        let mut t = now + MS;
        while cc.in_slow_start() {
            t = ack_round_trip(&mut cc, t, &queue, MSS);
        }
        clocked_round(&mut cc, t, &queue);
        assert_eq!(cc.adjustment().k(), 0.0);
        assert!(cc.adjustment().w_max() <= 70.0 * MSS as f64 + 1.0);
    }

    #[test]
    fn spurious_loss_restores_cubic_state() {
        let queue = rtt_with(100 * MS, 150 * MS);
        let (mut cc, now) = grown_to(&CubicConfig::default(), 100, &queue);
        let t = clocked_round(&mut cc, now, &queue);
        let w_max = cc.adjustment().w_max();
        cc.on_congestion_event(t, t, MSS, false, &queue);
        assert_eq!(cc.window(), 140 * MSS);
        cc.on_spurious_congestion_event();
        assert_eq!(cc.window(), 200 * MSS);
        assert_eq!(cc.adjustment().w_max(), w_max);
        assert_eq!(cc.ssthresh(), None);
    }

    #[test]
    fn factory_and_name() {
        let cc = CubicConfig::default()
            .initial_window_packets(32)
            .build(epoch(), &PathInfo::default());
        assert_eq!(cc.name(), "cubic");
        assert_eq!(cc.window(), 32 * 1200);
    }
}
