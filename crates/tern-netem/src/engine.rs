//! One direction of an emulated link as a pure element: [`Shaper`] (queue and rate or trace)
//! followed by the simulator's [`tern_sim::Link`] (loss, duplication, corruption, delay,
//! jitter, reordering). No clock is read here; the forwarder passes the real time in.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use tern_sim::{Datagram, Link, Verdict};

use crate::config::DirectionConfig;
use crate::shaper::{QueueSample, Shaper};

/// Counters and queue state of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectionStats {
    /// Packets read from the kernel (offered to the link).
    pub offered: u64,
    /// Bytes offered (IP packets).
    pub offered_bytes: u64,
    /// Dropped by the drop-tail queue.
    pub dropped_queue: u64,
    /// Lost by the loss model or a fade.
    pub dropped_loss: u64,
    /// Dropped because the direction was set down.
    pub dropped_down: u64,
    /// Dropped because a scheduled outage darkened the direction (on arrival or on leaving the
    /// queue).
    pub dropped_outage: u64,
    /// Dropped for exceeding the direction's `mtu`.
    pub dropped_mtu: u64,
    /// Packets scheduled for delivery (duplicates included).
    pub delivered: u64,
    /// Bytes scheduled for delivery.
    pub delivered_bytes: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets with a flipped bit.
    pub corrupted: u64,
    /// Packets written back to the kernel (filled in by the forwarder).
    pub written: u64,
    /// Bytes written back.
    pub written_bytes: u64,
    /// Writes the kernel refused.
    pub write_errors: u64,
    /// Packets in the delay line (past the queue, not yet written).
    pub in_flight: usize,
    /// Bytes in the drop-tail queue now.
    pub queue_bytes: usize,
    /// Packets in the drop-tail queue now.
    pub queue_packets: usize,
    /// Largest queue seen, bytes.
    pub max_queue_bytes: usize,
    /// Largest queue seen, packets.
    pub max_queue_packets: usize,
    /// Packets marked CE by the ECN rule.
    pub ce_marked: u64,
    /// Time each accepted packet spent in the drop-tail queue (mean, percentiles).
    pub queue_delay: crate::shaper::DelayHistogram,
}

/// Shaper + link model for one direction.
#[derive(Debug)]
pub struct DirectionEngine {
    config: DirectionConfig,
    shaper: Shaper,
    link: Link,
    dropped_down: u64,
    dropped_down_bytes: u64,
    /// Dropped by an outage before the queue (the link counts those dropped after it).
    dropped_outage: u64,
    dropped_outage_bytes: u64,
    /// Dropped for exceeding the configured MTU.
    dropped_mtu: u64,
    dropped_mtu_bytes: u64,
    ce_marked: u64,
}

/// Placeholder addresses: the link model only carries them along.
fn dummy() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
}

impl DirectionEngine {
    /// An engine whose trace replay and queue trace start at `epoch`.
    pub fn new(config: DirectionConfig, seed: u64, epoch: Instant) -> Self {
        let shaper = Shaper::new(config.rate.clone(), config.queue_limit(), epoch);
        let link = Link::new(config.link_config(), seed, epoch);
        Self {
            config,
            shaper,
            link,
            dropped_down: 0,
            dropped_down_bytes: 0,
            dropped_outage: 0,
            dropped_outage_bytes: 0,
            dropped_mtu: 0,
            dropped_mtu_bytes: 0,
            ce_marked: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DirectionConfig {
        &self.config
    }

    /// Changes the configuration from now on; packets already accepted keep their times.
    pub fn reconfigure(&mut self, config: DirectionConfig) {
        self.shaper
            .reconfigure(config.rate.clone(), config.queue_limit());
        self.link.set_config(config.link_config());
        self.config = config;
    }

    /// Starts or stops the queue-length trace.
    pub fn set_queue_trace(&mut self, enabled: bool) {
        self.shaper.set_queue_trace(enabled);
    }

    /// The queue-length trace up to `now`.
    pub fn queue_trace(&mut self, now: Instant) -> Vec<QueueSample> {
        self.shaper.queue(now);
        self.shaper.queue_trace().to_vec()
    }

    /// Takes the queue-length samples recorded up to `now`.
    pub fn take_queue_trace(&mut self, now: Instant) -> Vec<QueueSample> {
        self.shaper.queue(now);
        self.shaper.take_queue_trace()
    }

    /// Offers an IP packet at `now`; `out` gets each copy to deliver with its delivery time.
    /// Returns how many copies were scheduled (0, 1 or 2).
    pub fn offer(
        &mut self,
        mut packet: Vec<u8>,
        now: Instant,
        mut out: impl FnMut(Instant, Vec<u8>),
    ) -> usize {
        if !self.config.up {
            self.dropped_down += 1;
            self.dropped_down_bytes += packet.len() as u64;
            return 0;
        }
        if self.config.mtu.is_some_and(|mtu| packet.len() > mtu) {
            self.dropped_mtu += 1;
            self.dropped_mtu_bytes += packet.len() as u64;
            return 0;
        }
        // Dark on arrival: dropped before the queue (no capacity used). A packet that leaves
        // the queue while dark is dropped by the link model, which sees the departure time.
        if self.link.in_outage(now) {
            self.dropped_outage += 1;
            self.dropped_outage_bytes += packet.len() as u64;
            return 0;
        }
        if self.config.ecn != crate::ecn::EcnRule::Pass {
            let queued = self.shaper.queue(now);
            let limit = self.config.ecn_mark_limit();
            if crate::ecn::apply(self.config.ecn, limit, queued, &mut packet) {
                self.ce_marked += 1;
            }
        }
        let Some(departure) = self.shaper.offer(packet.len(), now) else {
            return 0;
        };
        let dgram = Datagram::new(dummy(), dummy(), packet);
        match self.link.process(dgram, departure, |at, d| out(at, d.data)) {
            Verdict::Delivered => 1,
            Verdict::Duplicated => 2,
            _ => 0,
        }
    }

    /// Counters at `now` (the forwarder's write counters are left at zero).
    pub fn stats(&mut self, now: Instant) -> DirectionStats {
        let (queue_bytes, queue_packets) = self.shaper.queue(now);
        let s = self.shaper.stats();
        let l = self.link.stats();
        DirectionStats {
            offered: s.offered + self.dropped_down + self.dropped_outage + self.dropped_mtu,
            offered_bytes: s.offered_bytes
                + self.dropped_down_bytes
                + self.dropped_outage_bytes
                + self.dropped_mtu_bytes,
            dropped_queue: s.dropped,
            dropped_loss: l.dropped_loss,
            dropped_down: self.dropped_down,
            dropped_mtu: self.dropped_mtu,
            dropped_outage: self.dropped_outage + l.dropped_outage,
            delivered: l.delivered,
            delivered_bytes: l.bytes,
            duplicated: l.duplicated,
            corrupted: l.corrupted,
            queue_bytes,
            queue_packets,
            max_queue_bytes: s.max_bytes,
            max_queue_packets: s.max_packets,
            ce_marked: self.ce_marked,
            queue_delay: s.queue_delay,
            ..DirectionStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[allow(clippy::disallowed_methods)] // an arbitrary origin; only differences are used
    fn origin() -> Instant {
        Instant::now()
    }

    fn config(spec: &str) -> DirectionConfig {
        let mut c = DirectionConfig::default();
        c.apply(spec).unwrap();
        c
    }

    #[test]
    fn delay_is_added_after_serialization() {
        let t0 = origin();
        let mut e = DirectionEngine::new(config("delay=20ms,rate=12mbit"), 1, t0);
        let mut got = Vec::new();
        e.offer(vec![0; 1500], t0, |at, _| got.push(at - t0));
        e.offer(vec![0; 1500], t0, |at, _| got.push(at - t0));
        assert_eq!(
            got,
            vec![Duration::from_millis(21), Duration::from_millis(22)]
        );
    }

    #[test]
    fn loss_rate_matches_over_many_packets() {
        let t0 = origin();
        let mut e = DirectionEngine::new(config("loss=1%"), 7, t0);
        let mut delivered = 0u64;
        for i in 0..100_000u32 {
            delivered += e.offer(
                vec![0; 100],
                t0 + Duration::from_micros(u64::from(i)),
                |_, _| {},
            ) as u64;
        }
        let loss = 1.0 - delivered as f64 / 100_000.0;
        assert!((0.008..0.012).contains(&loss), "{loss}");
        let s = e.stats(t0);
        assert_eq!(s.dropped_loss + s.delivered, 100_000);
    }

    #[test]
    fn jitter_never_reorders() {
        let t0 = origin();
        let mut e = DirectionEngine::new(config("delay=10ms,jitter=5ms"), 3, t0);
        let mut last = t0;
        for i in 0..10_000u32 {
            e.offer(
                vec![0; 100],
                t0 + Duration::from_micros(u64::from(i) * 100),
                |at, _| {
                    assert!(at >= last);
                    last = at;
                },
            );
        }
    }

    #[test]
    fn down_drops_everything() {
        let t0 = origin();
        let mut e = DirectionEngine::new(config("up=false"), 3, t0);
        assert_eq!(e.offer(vec![0; 100], t0, |_, _| panic!()), 0);
        let s = e.stats(t0);
        assert_eq!((s.offered, s.dropped_down), (1, 1));
        e.reconfigure(config("up=true"));
        assert_eq!(e.offer(vec![0; 100], t0, |_, _| {}), 1);
    }

    #[test]
    fn outage_drops_on_arrival_and_on_leaving_the_queue() {
        let t0 = origin();
        let ms = Duration::from_millis;
        // 12 Mbit/s: a 1500-byte packet takes 1 ms. Dark during [10 ms, 20 ms).
        let mut e = DirectionEngine::new(
            config("rate=12mbit,queue=unlimited,outage=10ms+10ms"),
            1,
            t0,
        );
        let mut got = Vec::new();
        // Twelve at 0 ms leave the queue at 1..=12 ms: the last three while dark.
        for _ in 0..12 {
            e.offer(vec![0; 1500], t0, |at, _| got.push(at - t0));
        }
        assert_eq!(got, (1..=9).map(ms).collect::<Vec<_>>());
        // Arriving while dark: dropped before the queue.
        assert_eq!(e.offer(vec![0; 1500], t0 + ms(15), |_, _| panic!()), 0);
        let s = e.stats(t0 + ms(15));
        assert_eq!((s.offered, s.dropped_outage, s.delivered), (13, 4, 9));
        assert_eq!(s.queue_packets, 0, "the dark arrival was never queued");
        assert_eq!(e.offer(vec![0; 1500], t0 + ms(20), |_, _| {}), 1);
        // A fade with total loss in a bad state that never ends drops everything after the
        // first good sojourn; `off` restores the link.
        e.reconfigure(config("fade=1ms,1000s"));
        let lost = (0..1000u32)
            .filter(|i| e.offer(vec![0; 100], t0 + ms(100) + ms(1) * *i, |_, _| {}) == 0)
            .count();
        assert!(lost > 900, "{lost}");
        e.reconfigure(config("fade=off"));
        assert_eq!(e.offer(vec![0; 100], t0 + ms(2000), |_, _| {}), 1);
    }
}
