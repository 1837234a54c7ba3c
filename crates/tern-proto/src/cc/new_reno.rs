//! NewReno (RFC 9002 §7.3), the window adjustment of Viscous's channels.
//!
//! Only the two rules specific to NewReno live here; slow start, recovery, persistent congestion
//! and random-loss tolerance come from [`Classic`].

use std::time::Instant;

use super::classic::{classic_config_builders, Classic, ClassicConfig, WindowAdjustment};
use super::{Controller, ControllerFactory, PathInfo};
use crate::recovery::rtt::RttEstimator;

/// NewReno's growth and reduction rules. Use it as `Classic<NewReno>`, usually built by
/// [`NewRenoConfig`].
#[derive(Debug, Clone, Default)]
pub struct NewReno {
    /// Bytes acknowledged in congestion avoidance since the window last grew.
    ///
    /// Counting bytes and adding one datagram per window's worth is exact, where adding
    /// `mss * acked / window` per ACK would lose the fraction on every ACK.
    bytes_acked: u64,
}

impl WindowAdjustment for NewReno {
    fn name(&self) -> &'static str {
        "newreno"
    }

    fn on_avoidance_ack(
        &mut self,
        now: Instant,
        window: u64,
        bytes_acked: u64,
        max_datagram_size: u64,
        rtt: &RttEstimator,
    ) -> u64 {
        let _ = (now, rtt);
        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.3
        //# Congestion avoidance [...] uses an additive increase multiplicative
        //# decrease (AIMD) approach that MUST limit the increase to the
        //# congestion window to at most one maximum datagram size for each
        //# congestion window that is acknowledged.
        self.bytes_acked = self.bytes_acked.saturating_add(bytes_acked);
        if window == 0 || self.bytes_acked < window {
            return window;
        }
        let windows = self.bytes_acked / window;
        self.bytes_acked %= window;
        window.saturating_add(windows.saturating_mul(max_datagram_size))
    }

    fn on_congestion(&mut self, now: Instant, window: u64, max_datagram_size: u64) -> u64 {
        let _ = (now, max_datagram_size);
        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.2
        //# The RECOMMENDED value [of kLossReductionFactor] is 0.5.
        self.bytes_acked = 0;
        window / 2
    }

    fn on_persistent_congestion(&mut self) {
        self.bytes_acked = 0;
    }
}

/// Configuration and factory of NewReno controllers.
///
/// A connection configuration holds it as an `Arc<dyn ControllerFactory>`, e.g.
/// `Arc::new(NewRenoConfig::default().initial_window_packets(16))`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewRenoConfig {
    classic: ClassicConfig,
}

impl NewRenoConfig {
    classic_config_builders!();
}

impl ControllerFactory for NewRenoConfig {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Classic::new(NewReno::default(), &self.classic, now, info))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cc::testing::{ack_round_trip, epoch, rtt_with};

    const MSS: u64 = 1200;
    const RTT: Duration = Duration::from_millis(100);

    fn build(config: NewRenoConfig) -> Box<dyn Controller> {
        config.build(epoch(), &PathInfo::new(1200, RTT, 0))
    }

    #[test]
    fn slow_start_doubles_every_round_trip() {
        let rtt = rtt_with(RTT, RTT);
        let mut cc = build(NewRenoConfig::default());
        let mut now = epoch();
        for expected in [20, 40, 80, 160, 320] {
            now = ack_round_trip(cc.as_mut(), now, &rtt, MSS);
            assert_eq!(cc.window(), expected * MSS);
        }
        assert!(cc.metrics().in_slow_start);
    }

    #[test]
    fn congestion_halves_the_window_then_grows_one_datagram_per_round_trip() {
        // A standing queue (20 ms over a 100 ms base) makes the loss count as congestion.
        let queue = rtt_with(RTT, RTT + Duration::from_millis(20));
        let mut cc = build(NewRenoConfig::default());
        let mut now = ack_round_trip(cc.as_mut(), epoch(), &queue, MSS);
        assert_eq!(cc.window(), 20 * MSS);
        cc.on_congestion_event(now, now - Duration::from_millis(1), MSS, false, &queue);
        // Packets sent at the instant of the reduction still belong to the recovery period.
        now += Duration::from_millis(1);
        assert_eq!(cc.window(), 10 * MSS);
        let m = cc.metrics();
        assert_eq!(m.ssthresh, Some(10 * MSS));
        assert!(!m.in_slow_start);
        for round in 1..=10 {
            now = ack_round_trip(cc.as_mut(), now, &queue, MSS);
            assert_eq!(cc.window(), (10 + round) * MSS, "round {round}");
        }
    }

    #[test]
    fn factory_and_name() {
        let cc = build(NewRenoConfig::default().initial_window_packets(4));
        assert_eq!(cc.name(), "newreno");
        assert_eq!(cc.window(), 4 * MSS);
        assert_eq!(cc.initial_window(), 4 * MSS);
        let config = NewRenoConfig::default().random_loss_tolerance(false);
        assert!(!config.classic_config().get_random_loss_tolerance());
    }

    #[test]
    fn large_acks_grow_one_datagram_per_window() {
        let mut reno = NewReno::default();
        let rtt = rtt_with(RTT, RTT);
        let now = epoch();
        assert_eq!(
            reno.on_avoidance_ack(now, 10_000, 9_999, 1000, &rtt),
            10_000
        );
        assert_eq!(reno.on_avoidance_ack(now, 10_000, 1, 1000, &rtt), 11_000);
        assert_eq!(
            reno.on_avoidance_ack(now, 10_000, 35_000, 1000, &rtt),
            13_000
        );
        assert_eq!(reno.on_avoidance_ack(now, 0, 35_000, 1000, &rtt), 0);
        assert_eq!(
            reno.on_avoidance_ack(now, u64::MAX, u64::MAX, u64::MAX, &rtt),
            u64::MAX
        );
    }
}
