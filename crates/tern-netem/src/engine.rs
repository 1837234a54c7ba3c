//! One direction of an emulated link as a pure element: [`Shaper`] (queue and rate or trace)
//! followed by the simulator's [`tern_sim::Link`] (loss, duplication, corruption, delay,
//! jitter, reordering). No clock is read here; the forwarder passes the real time in.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use std::time::Duration;

use tern_proto::router::{Router, RouterStats, Stamp};
use tern_sim::{Datagram, Link, Verdict};

use crate::config::DirectionConfig;
use crate::shaper::{QueueSample, RateModel, Shaper};

/// A trace's capacity for the router is its rate over this much of the past: long enough to
/// hold many delivery opportunities (mahimahi traces have one per 1 ms slot at most), short
/// against the router's control round trip.
const TRACE_RATE_WINDOW: Duration = Duration::from_millis(100);

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
    /// Time each accepted packet waited before its first byte left (`queue_delay` less its
    /// own transmission).
    pub queue_wait: crate::shaper::DelayHistogram,
    /// Packets whose Feedback Rate the `router=ncr` router lowered.
    pub rate_stamped: u64,
    /// The router's rate for a flow of weight 1 (`R`), bit/s; `None` without a router.
    pub router_rate_bps: Option<u64>,
    /// Flows the router tracks.
    pub router_flows: usize,
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
    /// The `router=ncr` router, built when the first packet reaches the queue.
    router: Option<Router>,
    /// The flows it may stamp: those it saw a tern handshake on.
    tern_flows: crate::ncr::TernFlows,
    rate_stamped: u64,
    /// The last non-zero capacity a trace gave the router (see `capacity`).
    trace_capacity: Option<u64>,
    epoch: Instant,
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
            router: None,
            tern_flows: crate::ncr::TernFlows::default(),
            rate_stamped: 0,
            trace_capacity: None,
            epoch,
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
        // A new tuning starts a new router; the same one keeps its state (capacity aside,
        // which follows the rate on every packet).
        let same = |r: &Router, c: &tern_proto::router::RouterConfig| {
            r.config().clone().with_capacity(0) == c.clone().with_capacity(0)
        };
        match (&self.router, &config.router) {
            (Some(r), Some(c)) if same(r, c) => {}
            _ => self.router = None,
        }
        self.config = config;
    }

    /// The router's state, if `router=ncr` is on and a packet has reached the queue.
    pub fn router_stats(&self) -> Option<RouterStats> {
        self.router.as_ref().map(Router::stats)
    }

    /// The capacity the router is given at `now`: the rate, or the trace's rate over the last
    /// [`TRACE_RATE_WINDOW`]; `None` when unlimited (no router: no bottleneck to share).
    ///
    /// A window of a trace without delivery opportunities (traces have gaps of a second and
    /// more) keeps the last capacity seen: a capacity of 0 would stamp every flow the
    /// router's floor and clamp its rate there, from which it climbs back for seconds after
    /// the gap (found by an outside read). The queue that builds in the gap lowers the rate
    /// through the control law instead. Before the trace's first opportunity: no router.
    fn capacity(
        shaper: &Shaper,
        epoch: Instant,
        last: &mut Option<u64>,
        now: Instant,
    ) -> Option<u64> {
        match shaper.rate() {
            RateModel::Unlimited => None,
            RateModel::Constant(bps) => Some(*bps),
            RateModel::Trace(trace) => {
                let to = now.saturating_duration_since(epoch);
                let from = to.saturating_sub(TRACE_RATE_WINDOW);
                let window = (to - from).max(Duration::from_millis(1));
                let bytes = trace.capacity_bytes_between(from, to);
                let bps = u128::from(bytes) * 8 * 1_000_000_000 / window.as_nanos();
                let bps = u64::try_from(bps).unwrap_or(u64::MAX);
                if bps > 0 {
                    *last = Some(bps);
                }
                *last
            }
        }
    }

    /// Runs the router on a packet entering the queue at `now`.
    fn route(&mut self, now: Instant, packet: &mut [u8]) {
        let Some(config) = &self.config.router else {
            return;
        };
        let Some(capacity) =
            Self::capacity(&self.shaper, self.epoch, &mut self.trace_capacity, now)
        else {
            return;
        };
        let queued = self.shaper.queue(now).0;
        let router = self
            .router
            .get_or_insert_with(|| Router::new(config.clone().with_capacity(capacity), now));
        if router.config().capacity_bps != capacity {
            router.set_capacity(capacity, now);
        }
        router.tick(now, queued);
        if let Some(wait) = self.shaper.wait(now) {
            router.set_wait(wait);
        }
        if matches!(
            crate::ncr::offer(router, &mut self.tern_flows, now, packet),
            Stamp::Lowered { .. }
        ) {
            self.rate_stamped += 1;
        }
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
        let mut marked = false;
        if self.config.ecn != crate::ecn::EcnRule::Pass {
            let queued = self.shaper.queue(now);
            let limit = self.config.ecn_mark_limit();
            marked = crate::ecn::apply(self.config.ecn, limit, queued, &mut packet);
        }
        self.route(now, &mut packet);
        let Some(departure) = self.shaper.offer(packet.len(), now) else {
            return 0;
        };
        // Counted once the queue took it: a packet dropped at a full queue was over the
        // marking threshold too, but no CE mark reached anyone.
        self.ce_marked += u64::from(marked);
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
            queue_wait: s.queue_wait,
            rate_stamped: self.rate_stamped,
            router_rate_bps: self
                .router
                .as_ref()
                .map(|r| r.rate_per_weight_bps().round() as u64),
            router_flows: self.router.as_ref().map_or(0, |r| r.stats().flows),
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

    /// The delays the engine schedules at 1 000 packets/s with 20 ms + 0..5 ms jitter (the
    /// setting of the TUN test in tests/accuracy.rs, which adds the host's timer slack): never
    /// below 20 ms nor above 25 ms, mean a little above 22.5 ms (the in-order rule only
    /// lengthens).
    #[test]
    fn jitter_delays_stay_in_the_configured_range() {
        let t0 = origin();
        let mut e = DirectionEngine::new(config("delay=20ms,jitter=5ms"), 7, t0);
        let mut delays = Vec::new();
        for i in 0..2_000u32 {
            let sent = t0 + Duration::from_millis(u64::from(i));
            e.offer(vec![0; 200], sent, |at, _| delays.push(at - sent));
        }
        assert_eq!(delays.len(), 2_000);
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        assert!(delays.iter().all(|d| (20.0..=25.0).contains(&ms(d))));
        let mean = delays.iter().map(ms).sum::<f64>() / delays.len() as f64;
        assert!((22.5..=23.5).contains(&mean), "mean {mean} ms");
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

    /// The Internet checksum of `data` (RFC 1071), folded, not complemented.
    fn sum16(data: &[u8], mut sum: u32) -> u32 {
        for w in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum
    }

    /// Whether the UDP checksum of an IPv4 packet (20-byte header) verifies.
    fn udp4_checksum_ok(p: &[u8]) -> bool {
        let udp = &p[20..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&p[12..20]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
        sum16(udp, sum16(&pseudo, 0)) == 0xffff
    }

    /// An IPv4/UDP packet carrying `payload`, with valid header and UDP checksums (or a zero
    /// UDP checksum when `checksum` is false).
    fn udp4(payload: &[u8], checksum: bool) -> Vec<u8> {
        let total = (20 + 8 + payload.len()) as u16;
        let mut p = vec![
            0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        let h = !(sum16(&p, 0) as u16);
        p[10..12].copy_from_slice(&h.to_be_bytes());
        p.extend_from_slice(&4433u16.to_be_bytes());
        p.extend_from_slice(&5000u16.to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        if checksum {
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&p[12..20]);
            pseudo.extend_from_slice(&[0, 17]);
            pseudo.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            let mut c = !(sum16(&p[20..], sum16(&pseudo, 0)) as u16);
            if c == 0 {
                c = 0xffff;
            }
            p[26..28].copy_from_slice(&c.to_be_bytes());
        }
        p
    }

    /// A tern short-header payload with a rate area; `cid_len` moves the field's alignment.
    fn tern(cid_len: usize, expected_kbps: u32) -> Vec<u8> {
        use tern_proto::wire::{ConnectionId, RateArea, ShortHeader, NO_RATE_LIMIT};
        let h = ShortHeader::new(
            ConnectionId::new(&vec![0x3c; cid_len]).unwrap(),
            0,
            false,
            0x1234,
            None,
            Some(RateArea {
                expected_kbps,
                feedback_kbps: NO_RATE_LIMIT,
            }),
        );
        let mut b = Vec::new();
        h.encode(&mut b);
        b.resize(b.len() + 40, 0xe7);
        b
    }

    /// The start of a tern Initial: what makes the router learn the flow.
    fn tern_initial() -> Vec<u8> {
        let mut b = vec![0xc0];
        b.extend_from_slice(&tern_proto::wire::VERSION_1.to_be_bytes());
        b.resize(60, 0);
        b
    }

    /// Offers a tern handshake packet on `udp4`'s flow, so the router stamps that flow.
    fn learn(e: &mut DirectionEngine, at: Instant) {
        e.offer(udp4(&tern_initial(), true), at, |_, _| {});
    }

    // These tests offer packets back to back, so each waits behind the one before; the phase
    // term (`ncr_phase`, its own test below) is off to read the plain share.
    #[test]
    fn ncr_stamps_only_flows_it_saw_a_tern_handshake_on() {
        use tern_proto::wire::read_feedback_rate;
        let t0 = origin();
        let mut e = DirectionEngine::new(config("rate=10mbit,router=ncr,ncr_phase=0"), 1, t0);
        // A QUIC 1-RTT packet whose spin bit is set and whose protected reserved bits
        // happen to be zero has a tern short header's shape: untouched on an unknown flow.
        let quic_like = udp4(&tern(8, u32::MAX), true);
        let mut out = Vec::new();
        e.offer(quic_like.clone(), t0, |_, d| out.push(d));
        assert_eq!(
            out[0], quic_like,
            "a flow without a tern handshake is not stamped"
        );
        // A tern handshake on the flow: from then on its short headers are stamped.
        learn(&mut e, t0);
        e.offer(quic_like.clone(), t0, |_, d| out.push(d));
        assert_eq!(read_feedback_rate(&out[1][28..], 8), Some(9800));
        // The same packet from another port is another flow: untouched.
        let mut other = quic_like.clone();
        other[20..22].copy_from_slice(&4434u16.to_be_bytes());
        e.offer(other.clone(), t0, |_, d| out.push(d));
        assert_eq!(out[2], other);
        // A learned flow silent for longer than the idle time is forgotten.
        let later = t0 + crate::ncr::TERN_FLOW_IDLE + Duration::from_secs(1);
        e.offer(quic_like.clone(), later, |_, d| out.push(d));
        assert_eq!(out[3], quic_like);
        assert_eq!(e.stats(later).rate_stamped, 1);
    }

    #[test]
    fn ncr_lowers_the_feedback_rate_and_keeps_the_udp_checksum_valid() {
        use tern_proto::wire::read_feedback_rate;
        let t0 = origin();
        let mut e = DirectionEngine::new(config("rate=1mbit,router=ncr,ncr_phase=0"), 1, t0);
        learn(&mut e, t0);
        let mut got = Vec::new();
        // 8- and 7-byte CIDs: the field at an even and at an odd offset.
        for (cid_len, expected) in [(8, u32::MAX), (8, 300), (7, u32::MAX)] {
            let mut c = config("rate=1mbit,router=ncr,ncr_phase=0");
            if cid_len != 8 {
                c.apply(&format!("ncr_cid={cid_len}")).unwrap();
                e = DirectionEngine::new(c, 1, t0);
                learn(&mut e, t0);
            }
            let p = udp4(&tern(cid_len, expected), true);
            assert!(udp4_checksum_ok(&p));
            e.offer(p, t0, |_, d| got.push((cid_len, d)));
        }
        let rates: Vec<_> = got
            .iter()
            .map(|(l, d)| read_feedback_rate(&d[28..], *l).unwrap())
            .collect();
        // α·C; the same flow now declaring 300 kbit/s (weight 0.3: 0.3·α·C); a fresh router
        // for the 7-byte CID.
        assert_eq!(rates, vec![980, 294, 980]);
        for (_, d) in &got {
            assert!(udp4_checksum_ok(d), "checksum after the rewrite");
            assert_eq!(crate::ecn::get(d), Some(0));
        }
        let s = e.stats(t0);
        assert_eq!((s.rate_stamped, s.router_flows), (1, 1));
        assert_eq!(s.router_rate_bps, Some(980_000));
    }

    #[test]
    fn ncr_keeps_a_traces_capacity_through_a_gap() {
        use tern_proto::wire::read_feedback_rate;
        // Found by an outside read: a gap of 100 ms or more without delivery opportunities
        // (the shipped traces have gaps of up to 1.4 s) gave the router a capacity of 0, which
        // stamped every flow 1 kbit/s and clamped its rate there.
        let opportunities: Vec<u64> = (0..500).chain(1500..2000).collect();
        let trace = crate::trace::Trace::from_opportunities(opportunities).unwrap();
        let mut c = config("router=ncr,ncr_phase=0");
        c.rate = RateModel::Trace(std::sync::Arc::new(trace));
        let t0 = origin();
        let mut e = DirectionEngine::new(c, 1, t0);
        learn(&mut e, t0 + Duration::from_millis(200));
        let mut got = Vec::new();
        for ms in [300, 1000, 1400] {
            let at = t0 + Duration::from_millis(ms);
            e.offer(udp4(&tern(8, u32::MAX), true), at, |_, d| got.push(d));
        }
        let rates: Vec<u32> = got
            .iter()
            .map(|d| read_feedback_rate(&d[28..], 8).unwrap())
            .collect();
        // 1 500 bytes per ms: 12 Mbit/s.
        assert!(rates[0] >= 11_000, "{rates:?}");
        assert!(
            rates[1..].iter().all(|r| *r > rates[0] / 2),
            "stamped in the gap: {rates:?}"
        );
    }

    #[test]
    fn ncr_stamps_a_packet_that_waits_a_little_less() {
        use tern_proto::wire::read_feedback_rate;
        let t0 = origin();
        // 1 Mbit/s: the 88-byte handshake packet is on the wire for 704 µs.
        let mut e = DirectionEngine::new(config("rate=1mbit,router=ncr"), 1, t0);
        learn(&mut e, t0);
        let mut got = Vec::new();
        // Behind it: 0.704 ms of wait, 1 − 0.25 · 0.704 / 100 of α·C, rounded down.
        e.offer(udp4(&tern(8, u32::MAX), true), t0, |_, d| got.push(d));
        // Once the wire is free: α·C.
        let later = t0 + Duration::from_millis(50);
        e.offer(udp4(&tern(8, u32::MAX), true), later, |_, d| got.push(d));
        let rates: Vec<_> = got
            .iter()
            .map(|d| read_feedback_rate(&d[28..], 8).unwrap())
            .collect();
        assert_eq!(rates, vec![978, 980]);
    }

    #[test]
    fn ncr_leaves_zero_checksums_other_udp_and_garbage_alone() {
        use tern_proto::wire::read_feedback_rate;
        let t0 = origin();
        let mut e = DirectionEngine::new(config("rate=10mbit,router=ncr,ncr_phase=0"), 1, t0);
        learn(&mut e, t0);
        let mut got = Vec::new();
        // No UDP checksum: the field is lowered, the checksum stays zero.
        e.offer(udp4(&tern(8, u32::MAX), false), t0, |_, d| got.push(d));
        assert_eq!(read_feedback_rate(&got[0][28..], 8), Some(9800));
        assert_eq!(&got[0][26..28], &[0, 0]);
        // Non-tern UDP (a DNS-like payload), TCP, a fragment: untouched.
        let dns = udp4(&[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0], true);
        let mut tcp = udp4(&tern(8, u32::MAX), true);
        tcp[9] = 6;
        let mut fragment = udp4(&tern(8, u32::MAX), true);
        fragment[6] = 0x20; // more fragments
        for p in [dns, tcp, fragment] {
            let mut out = None;
            e.offer(p.clone(), t0, |_, d| out = Some(d));
            assert_eq!(out.as_ref(), Some(&p));
        }
        // Garbage of every short length and random bytes: no panic; what comes out is what
        // went in unless it parsed as IPv4/UDP carrying a rated tern packet.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for n in 0..3000usize {
            let len = n % 200;
            let mut p: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if n % 3 == 0 && len > 0 {
                p[0] = 0x45;
            }
            if n % 3 == 1 && len > 0 {
                p[0] = 0x60;
            }
            e.offer(p, t0 + Duration::from_micros(n as u64), |_, _| {});
        }
        let s = e.stats(t0 + Duration::from_millis(10));
        assert_eq!(s.rate_stamped, 1);
    }

    #[test]
    fn ncr_settings_parse() {
        let c = config("router=ncr");
        assert_eq!(c.router, Some(tern_proto::router::RouterConfig::default()));
        let c = config("ncr_alpha=95%,ncr_interval=20ms,ncr_rtt=150ms,ncr_phase=0.5,ncr_cid=4");
        let r = c.router.expect("tuning turns it on");
        assert_eq!(r.phase_gain, 0.5);
        assert_eq!(r.target_utilisation, 0.95);
        assert_eq!(r.interval, Duration::from_millis(20));
        assert_eq!(r.control_rtt, Duration::from_millis(150));
        assert_eq!(r.cid_len, 4);
        assert!(config("ncr_alpha=95%,router=off").router.is_none());
        let mut c = DirectionConfig::default();
        assert!(c.apply("router=magic").is_err());
        assert!(c.apply("ncr_cid=21").is_err());
        assert!(c.apply("ncr_alpha=0").is_err());
        assert!(c.apply("ncr_phase=-1").is_err());
        assert!(c.apply("ncr_phase=nan").is_err());
        // An unlimited direction has no capacity to share: no router runs.
        let t0 = origin();
        let mut e = DirectionEngine::new(config("router=ncr"), 1, t0);
        e.offer(udp4(&tern(8, u32::MAX), true), t0, |_, _| {});
        assert!(e.router_stats().is_none());
    }
}
