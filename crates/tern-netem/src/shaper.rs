//! The rate stage of one link direction: a FIFO drop-tail queue drained either at a constant
//! rate or by the delivery opportunities of a mahimahi trace.
//!
//! This replaces the rate stage of [`tern_sim::Link`] (which has no trace mode and no
//! packet-count limit); everything after the queue (loss, duplication, corruption, delay,
//! jitter, reordering) is the simulator's own link model, so the emulator and the simulator
//! share one model. Like that model, the shaper is a pure element: it never reads a clock, and
//! computes each packet's departure time when the packet is offered (a FIFO's departures are
//! fixed by what entered before), so it is tested here in virtual time.
//!
//! Trace replay follows mahimahi's `LinkQueue`: at each opportunity up to 1500 bytes leave;
//! a packet larger than what is left of an opportunity is sent partly and finishes at a later
//! one; bytes of an opportunity that nothing in the queue can use are lost; an opportunity at
//! exactly the instant a packet arrives is not usable by it; the trace loops with its last
//! timestamp as the period, starting at the shaper's epoch.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::trace::{Trace, OPPORTUNITY_BYTES};
use crate::units::QueueSpec;

/// How fast the queue drains.
#[derive(Clone, Debug, Default)]
pub enum RateModel {
    /// Infinitely fast: no queue ever forms.
    #[default]
    Unlimited,
    /// A constant rate in bit/s (IP packet bytes, headers included).
    Constant(u64),
    /// Delivery opportunities from a mahimahi trace.
    Trace(Arc<Trace>),
}

impl RateModel {
    /// The rate, or the trace's mean rate, in bit/s; `None` if unlimited.
    pub fn mean_bps(&self) -> Option<f64> {
        match self {
            RateModel::Unlimited => None,
            RateModel::Constant(bps) => Some(*bps as f64),
            RateModel::Trace(t) => Some(t.mean_rate_bps()),
        }
    }
}

/// A resolved drop-tail limit: a packet is dropped if, with it, the backlog would exceed either
/// bound. The backlog counts every packet accepted but not yet fully departed (including the
/// one being transmitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimit {
    /// Byte bound.
    pub bytes: Option<usize>,
    /// Packet bound.
    pub packets: Option<usize>,
}

impl QueueLimit {
    /// No bound.
    pub const UNLIMITED: Self = Self {
        bytes: None,
        packets: None,
    };

    /// Resolves a user's [`QueueSpec`] for a link draining at `mean_bps`
    /// (see [`QueueSpec::Default`]).
    pub fn resolve(spec: QueueSpec, mean_bps: Option<f64>) -> Self {
        let time_bytes = |t: Duration| {
            mean_bps.map(|bps| ((bps * t.as_secs_f64() / 8.0) as usize).max(10 * OPPORTUNITY_BYTES))
        };
        match spec {
            QueueSpec::Unlimited => Self::UNLIMITED,
            QueueSpec::Default => Self {
                bytes: time_bytes(Duration::from_millis(100)),
                packets: None,
            },
            QueueSpec::Time(t) => Self {
                bytes: time_bytes(t),
                packets: None,
            },
            QueueSpec::Bytes(b) => Self {
                bytes: Some(b),
                packets: None,
            },
            QueueSpec::Packets(p) => Self {
                bytes: None,
                packets: Some(p),
            },
        }
    }
}

/// One point of the queue-length trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSample {
    /// Time since the shaper's epoch.
    pub at: Duration,
    /// Bytes in the queue (accepted, not fully departed).
    pub bytes: usize,
    /// Packets in the queue.
    pub packets: usize,
}

/// Bins of [`DelayHistogram`] per doubling of the delay (a bin spans 2^(1/8), about 9 %).
const BINS_PER_OCTAVE: usize = 8;
/// Octaves [`DelayHistogram`] covers above 1 µs: up to 2^24 µs, about 16.8 s.
const OCTAVES: usize = 24;
const BINS: usize = BINS_PER_OCTAVE * OCTAVES + 1;

/// The time each accepted packet spends in the queue (from its arrival until its last byte
/// leaves: waiting plus its own transmission), as a log-scale histogram: fixed size, one
/// addition per packet, percentiles within about 5 %. This is the queueing delay a
/// congestion controller builds at the bottleneck (tern-bench's `cc` scenario ranks by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayHistogram {
    counts: [u64; BINS],
    count: u64,
    sum_ns: u128,
}

impl Default for DelayHistogram {
    fn default() -> Self {
        Self {
            counts: [0; BINS],
            count: 0,
            sum_ns: 0,
        }
    }
}

impl DelayHistogram {
    /// Counts one packet that spent `delay` in the queue.
    pub fn record(&mut self, delay: Duration) {
        let us = delay.as_secs_f64() * 1e6;
        let bin = if us <= 1.0 {
            0
        } else {
            ((us.log2() * BINS_PER_OCTAVE as f64).floor() as usize + 1).min(BINS - 1)
        };
        self.counts[bin] += 1;
        self.count += 1;
        self.sum_ns += delay.as_nanos();
    }

    /// Packets counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The packets counted since `earlier`, a copy of this histogram taken before: what a
    /// window of a run saw (tern-bench's steady part of a `fairness` case). Counts only grow,
    /// so the difference is exact; an `earlier` that is not a past copy saturates at zero.
    pub fn since(&self, earlier: &DelayHistogram) -> DelayHistogram {
        let mut counts = [0; BINS];
        for (c, (now, was)) in counts
            .iter_mut()
            .zip(self.counts.iter().zip(&earlier.counts))
        {
            *c = now.saturating_sub(*was);
        }
        DelayHistogram {
            counts,
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// The mean delay (exact), `None` before the first packet.
    pub fn mean(&self) -> Option<Duration> {
        let n = u128::from(self.count);
        (n > 0).then(|| Duration::from_nanos(u64::try_from(self.sum_ns / n).unwrap_or(u64::MAX)))
    }

    /// The delay below which a fraction `q` (0–1) of the packets stayed: the geometric middle
    /// of the bin that holds that packet. `None` before the first packet.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let bin = self
            .counts
            .iter()
            .position(|&c| {
                seen += c;
                seen >= rank
            })
            .unwrap_or(BINS - 1);
        if bin == 0 {
            return Some(Duration::from_micros(1));
        }
        let low = ((bin - 1) as f64 / BINS_PER_OCTAVE as f64).exp2();
        let high = (bin as f64 / BINS_PER_OCTAVE as f64).exp2();
        Some(Duration::from_secs_f64((low * high).sqrt() / 1e6))
    }
}

/// Shaper counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShaperStats {
    /// Packets offered.
    pub offered: u64,
    /// Bytes offered.
    pub offered_bytes: u64,
    /// Packets dropped by the drop-tail limit.
    pub dropped: u64,
    /// Largest backlog seen, in bytes.
    pub max_bytes: usize,
    /// Largest backlog seen, in packets.
    pub max_packets: usize,
    /// Time the accepted packets spent in the queue.
    pub queue_delay: DelayHistogram,
    /// Time the accepted packets waited before their first byte left: `queue_delay` without
    /// their own transmission (at 1 Mbit/s a 1.5 kB packet takes 12 ms to send, with no queue
    /// at all; this is the queue the senders built, as DESIGN.md's 2 ms asks).
    pub queue_wait: DelayHistogram,
}

/// Where trace replay stands: the last opportunity used and the bytes left in it.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    index: u64,
    left: usize,
}

/// See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Shaper {
    rate: RateModel,
    limit: QueueLimit,
    epoch: Instant,
    busy_until: Option<Instant>,
    /// Sub-nanosecond remainder of serialization times (units of 1/rate ns).
    carry: u128,
    cursor: Option<Cursor>,
    /// After a change of rate model: when the packets queued under the old one are all gone.
    /// The new model serves nothing before it (one link, one queue).
    resume_after: Option<Instant>,
    backlog: VecDeque<(Instant, usize)>,
    backlog_bytes: usize,
    stats: ShaperStats,
    trace: Option<Vec<QueueSample>>,
}

impl Shaper {
    /// A shaper whose trace (and queue-length trace) time starts at `epoch`.
    pub fn new(rate: RateModel, limit: QueueLimit, epoch: Instant) -> Self {
        Self {
            rate,
            limit,
            epoch,
            busy_until: None,
            carry: 0,
            cursor: None,
            resume_after: None,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            stats: ShaperStats::default(),
            trace: None,
        }
    }

    /// Changes rate and limit from now on; packets already accepted keep their departure
    /// times. A new trace keeps the shaper's epoch: it plays from where the clock says it is
    /// (time since the epoch, modulo its period).
    pub fn reconfigure(&mut self, rate: RateModel, limit: QueueLimit) {
        let trace_changed = match (&self.rate, &rate) {
            (RateModel::Trace(a), RateModel::Trace(b)) => !Arc::ptr_eq(a, b),
            (RateModel::Trace(_), _) | (_, RateModel::Trace(_)) => true,
            _ => false,
        };
        if trace_changed {
            self.cursor = None;
        }
        // What is queued keeps its departure times; the new model takes over behind it, or
        // the link would serve two queues at once for a while (found by an outside read).
        if let Some(&(last, _)) = self.backlog.back() {
            self.resume_after = Some(last);
            if matches!(rate, RateModel::Constant(_)) {
                self.busy_until = Some(self.busy_until.map_or(last, |b| b.max(last)));
            }
        }
        self.rate = rate;
        self.limit = limit;
    }

    /// The rate model.
    pub fn rate(&self) -> &RateModel {
        &self.rate
    }

    /// The drop-tail limit.
    pub fn limit(&self) -> QueueLimit {
        self.limit
    }

    /// Counters so far.
    pub fn stats(&self) -> ShaperStats {
        self.stats
    }

    /// Starts (or stops and discards) the queue-length trace.
    pub fn set_queue_trace(&mut self, enabled: bool) {
        self.trace = enabled.then(Vec::new);
    }

    /// Samples recorded so far (one per enqueue and per departure); call [`Shaper::queue`]
    /// with the current time first to record departures up to now.
    pub fn queue_trace(&self) -> &[QueueSample] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Takes the recorded samples, leaving the trace enabled and empty.
    pub fn take_queue_trace(&mut self) -> Vec<QueueSample> {
        match &mut self.trace {
            Some(t) => std::mem::take(t),
            None => Vec::new(),
        }
    }

    /// How long a packet offered at `now` would wait before its first byte is sent, on a
    /// constant-rate link (`None` on a trace, whose next opportunity is not a wait of the
    /// queue's).
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        match self.rate {
            RateModel::Unlimited => Some(Duration::ZERO),
            RateModel::Constant(_) => Some(
                self.busy_until
                    .map_or(Duration::ZERO, |busy| busy.saturating_duration_since(now)),
            ),
            RateModel::Trace(_) => None,
        }
    }

    /// `(bytes, packets)` in the queue at `now`.
    pub fn queue(&mut self, now: Instant) -> (usize, usize) {
        self.drain(now);
        (self.backlog_bytes, self.backlog.len())
    }

    fn record(&mut self, at: Instant) {
        if let Some(trace) = &mut self.trace {
            trace.push(QueueSample {
                at: at.saturating_duration_since(self.epoch),
                bytes: self.backlog_bytes,
                packets: self.backlog.len(),
            });
        }
    }

    fn drain(&mut self, now: Instant) {
        while let Some(&(departure, size)) = self.backlog.front() {
            if departure > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= size;
            self.record(departure);
        }
    }

    /// Offers a packet of `size` bytes at `now`. Returns when its last byte leaves the queue,
    /// or `None` if the drop-tail limit drops it.
    pub fn offer(&mut self, size: usize, now: Instant) -> Option<Instant> {
        self.stats.offered += 1;
        self.stats.offered_bytes += size as u64;
        self.drain(now);
        if matches!(self.rate, RateModel::Unlimited) {
            // Behind what a rate model before it still has queued, if any.
            return Some(self.resume_after.map_or(now, |r| r.max(now)));
        }
        let over_bytes = self
            .limit
            .bytes
            .is_some_and(|b| self.backlog_bytes + size > b);
        let over_packets = self
            .limit
            .packets
            .is_some_and(|p| self.backlog.len() + 1 > p);
        if over_bytes || over_packets {
            self.stats.dropped += 1;
            return None;
        }
        let (start, departure) = match &self.rate {
            RateModel::Unlimited => (now, now),
            RateModel::Constant(0) => {
                self.stats.dropped += 1;
                return None;
            }
            &RateModel::Constant(bps) => self.constant(size, bps, now),
            RateModel::Trace(trace) => {
                let trace = Arc::clone(trace);
                self.replay(&trace, size, now)
            }
        };
        self.stats
            .queue_delay
            .record(departure.saturating_duration_since(now));
        self.stats
            .queue_wait
            .record(start.saturating_duration_since(now));
        self.backlog.push_back((departure, size));
        self.backlog_bytes += size;
        self.stats.max_bytes = self.stats.max_bytes.max(self.backlog_bytes);
        self.stats.max_packets = self.stats.max_packets.max(self.backlog.len());
        self.record(now);
        Some(departure)
    }

    /// When the packet's transmission starts and when its last byte leaves.
    fn constant(&mut self, size: usize, bps: u64, now: Instant) -> (Instant, Instant) {
        let (start, continuing) = match self.busy_until {
            Some(busy) if busy >= now => (busy, true),
            _ => (now, false),
        };
        if !continuing {
            self.carry = 0;
        }
        let numerator = size as u128 * 8 * 1_000_000_000 + self.carry;
        let rate = u128::from(bps);
        self.carry = numerator % rate;
        let departure =
            start + Duration::from_nanos(u64::try_from(numerator / rate).unwrap_or(u64::MAX));
        self.busy_until = Some(departure);
        (start, departure)
    }

    /// The delivery opportunity that carries the packet's first byte and the one that carries
    /// its last.
    fn replay(&mut self, trace: &Trace, size: usize, now: Instant) -> (Instant, Instant) {
        let at = |index: u64| self.epoch + trace.time_of(index);
        // The first opportunity strictly after the arrival (and after what an earlier model
        // still has queued).
        let from = self.resume_after.map_or(now, |r| r.max(now));
        let first_usable = trace.first_after(from.saturating_duration_since(self.epoch));
        let (mut index, mut left) = match self.cursor {
            // Bytes left in an opportunity that has not happened yet carry this packet's first
            // bytes (the packet before it is still queued then).
            Some(c) if c.left > 0 && at(c.index) > now => (c.index, c.left),
            Some(c) => ((c.index + 1).max(first_usable), OPPORTUNITY_BYTES),
            None => (first_usable, OPPORTUNITY_BYTES),
        };
        let first = at(index);
        let mut remaining = size;
        loop {
            let take = remaining.min(left);
            remaining -= take;
            left -= take;
            if remaining == 0 {
                break;
            }
            index += 1;
            left = OPPORTUNITY_BYTES;
        }
        self.cursor = Some(Cursor { index, left });
        (first, at(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // an arbitrary origin; only differences are used
    fn origin() -> Instant {
        Instant::now()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_new_rate_model_serves_behind_what_the_old_one_queued() {
        let t0 = origin();
        // 1 500 B at 12 Mbit/s: 1 ms each; five queued until t0 + 5 ms.
        let mut s = Shaper::new(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED, t0);
        for _ in 0..5 {
            s.offer(1500, t0);
        }
        // A trace with an opportunity every millisecond takes over at t0 + 1 ms: its first
        // packet leaves after the old queue, not at the trace's next opportunity.
        let trace = Trace::from_opportunities((0..1000).collect()).unwrap();
        s.reconfigure(RateModel::Trace(Arc::new(trace)), QueueLimit::UNLIMITED);
        let d = s.offer(1500, t0 + ms(1)).unwrap();
        assert!(d > t0 + ms(5), "{:?}", d - t0);
        // And back to a constant rate: behind the trace's packet.
        s.reconfigure(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED);
        let e = s.offer(1500, t0 + ms(2)).unwrap();
        assert_eq!(e, d + ms(1));
        assert_eq!(s.queue(t0 + ms(2)).1, 5);
    }

    #[test]
    fn constant_rate_serializes_back_to_back() {
        let t0 = origin();
        let mut s = Shaper::new(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED, t0);
        // 1500 B at 12 Mbit/s = 1 ms each.
        assert_eq!(s.offer(1500, t0), Some(t0 + ms(1)));
        assert_eq!(s.offer(1500, t0), Some(t0 + ms(2)));
        assert_eq!(s.queue(t0 + ms(1)), (1500, 1));
        // Idle gap, then a fresh start.
        assert_eq!(s.offer(1500, t0 + ms(10)), Some(t0 + ms(11)));
    }

    #[test]
    fn wait_is_the_time_until_the_wire_frees() {
        let t0 = origin();
        let mut s = Shaper::new(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED, t0);
        assert_eq!(s.wait(t0), Some(Duration::ZERO));
        s.offer(1500, t0);
        s.offer(1500, t0);
        // Two packets of 1 ms: one arriving 0.5 ms in waits the rest of both.
        assert_eq!(
            s.wait(t0 + Duration::from_micros(500)),
            Some(Duration::from_micros(1500))
        );
        assert_eq!(s.wait(t0 + ms(3)), Some(Duration::ZERO));
        // Unlimited: never a wait.
        let u = Shaper::new(RateModel::Unlimited, QueueLimit::UNLIMITED, t0);
        assert_eq!(u.wait(t0), Some(Duration::ZERO));
    }

    #[test]
    fn drop_tail_in_bytes_and_packets() {
        let t0 = origin();
        let limit = QueueLimit {
            bytes: Some(3000),
            packets: None,
        };
        let mut s = Shaper::new(RateModel::Constant(1_000_000), limit, t0);
        assert!(s.offer(1500, t0).is_some());
        assert!(s.offer(1500, t0).is_some());
        assert!(s.offer(1, t0).is_none());
        let limit = QueueLimit {
            bytes: None,
            packets: Some(2),
        };
        let mut s = Shaper::new(RateModel::Constant(1_000_000), limit, t0);
        assert!(s.offer(100, t0).is_some());
        assert!(s.offer(100, t0).is_some());
        assert!(s.offer(100, t0).is_none());
        assert_eq!(s.stats().dropped, 1);
        // 100 B at 1 Mbit/s = 0.8 ms; after 0.8 ms one has left.
        assert!(s.offer(100, t0 + Duration::from_micros(800)).is_some());
    }

    #[test]
    fn constant_rate_is_exact_over_a_long_run() {
        let t0 = origin();
        let mut s = Shaper::new(RateModel::Constant(10_000_000), QueueLimit::UNLIMITED, t0);
        let mut last = t0;
        for _ in 0..100_000 {
            last = s.offer(1234, t0).unwrap();
        }
        let secs = (last - t0).as_secs_f64();
        let rate = 100_000.0 * 1234.0 * 8.0 / secs;
        assert!((rate - 10e6).abs() < 1.0, "{rate}");
    }

    #[test]
    fn trace_opportunities_carry_whole_and_partial_packets() {
        let t0 = origin();
        // Opportunities at 1, 1, 3, 10 (period 10).
        let trace = Arc::new(Trace::parse("1\n1\n3\n10\n").unwrap());
        let mut s = Shaper::new(RateModel::Trace(trace), QueueLimit::UNLIMITED, t0);
        // Two full packets at t=0 take the two opportunities at 1 ms.
        assert_eq!(s.offer(1500, t0), Some(t0 + ms(1)));
        assert_eq!(s.offer(1500, t0), Some(t0 + ms(1)));
        // 500 + 1000 bytes share the opportunity at 3 ms.
        assert_eq!(s.offer(500, t0), Some(t0 + ms(3)));
        assert_eq!(s.offer(1000, t0), Some(t0 + ms(3)));
        // Next: 10 ms; then the second loop: 11, 11, 13, 20.
        assert_eq!(s.offer(100, t0), Some(t0 + ms(10)));
        // The 1400 bytes left at 10 ms carry the first 1400 of this 2000-byte packet, the
        // rest goes at 11 ms.
        assert_eq!(s.offer(2000, t0), Some(t0 + ms(11)));
        // An arrival after 11 ms: the leftover of the 11 ms opportunity is gone; next is 13.
        assert_eq!(s.offer(10, t0 + ms(12)), Some(t0 + ms(13)));
        // Idle until 15 ms: the leftover at 13 is wasted, the next opportunity is 20.
        assert_eq!(s.offer(10, t0 + ms(15)), Some(t0 + ms(20)));
    }

    #[test]
    fn opportunity_at_arrival_instant_is_not_usable() {
        let t0 = origin();
        let trace = Arc::new(Trace::parse("0\n5\n10\n").unwrap());
        let mut s = Shaper::new(RateModel::Trace(trace), QueueLimit::UNLIMITED, t0);
        assert_eq!(s.offer(1500, t0), Some(t0 + ms(5)));
        assert_eq!(s.offer(1500, t0 + ms(10)), Some(t0 + ms(15)));
    }

    #[test]
    fn saturated_trace_replays_at_its_mean_rate() {
        let t0 = origin();
        let text: String = [3u64, 3, 3, 7, 8, 8, 8, 8, 20, 33, 50]
            .iter()
            .map(|t| format!("{t}\n"))
            .collect();
        let trace = Arc::new(Trace::parse(&text).unwrap());
        let mean = trace.mean_rate_bps();
        let mut s = Shaper::new(RateModel::Trace(trace), QueueLimit::UNLIMITED, t0);
        // Keep the queue non-empty for 100 periods with 1500-byte packets.
        let n = 11 * 100;
        let mut last = t0;
        for _ in 0..n {
            last = s.offer(1500, t0).unwrap();
        }
        let rate = n as f64 * 12_000.0 / (last - t0).as_secs_f64();
        assert!((rate / mean - 1.0).abs() < 0.01, "{rate} vs {mean}");
    }

    #[test]
    fn queue_trace_records_enqueues_and_departures() {
        let t0 = origin();
        let mut s = Shaper::new(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED, t0);
        s.set_queue_trace(true);
        s.offer(1500, t0);
        s.offer(1500, t0);
        s.queue(t0 + ms(5));
        let samples: Vec<(u64, usize, usize)> = s
            .queue_trace()
            .iter()
            .map(|q| (q.at.as_millis() as u64, q.bytes, q.packets))
            .collect();
        assert_eq!(
            samples,
            vec![(0, 1500, 1), (0, 3000, 2), (1, 1500, 1), (2, 0, 0)]
        );
    }

    #[test]
    fn each_packet_s_time_in_the_queue_is_counted() {
        let t0 = origin();
        // 1500 bytes at 12 Mbit/s take 1 ms: a burst of ten leaves after 1, 2, … 10 ms.
        let mut s = Shaper::new(RateModel::Constant(12_000_000), QueueLimit::UNLIMITED, t0);
        for _ in 0..10 {
            s.offer(1500, t0);
        }
        // A packet arriving to an empty queue later waits only for itself.
        s.offer(1500, t0 + ms(100));
        let h = s.stats().queue_delay;
        assert_eq!(h.count(), 11);
        assert_eq!(h.mean(), Some(Duration::from_nanos(56_000_000 / 11)));
        let near = |d: Option<Duration>, want_ms: f64| {
            let got = d.unwrap().as_secs_f64() * 1e3;
            assert!(
                (got / want_ms - 1.0).abs() < 0.05,
                "{got} ms, want {want_ms}"
            );
        };
        near(h.quantile(0.5), 5.0);
        near(h.quantile(0.95), 10.0);
        near(h.quantile(0.0), 1.0);
        near(h.quantile(1.0), 10.0);
        // The wait before the first byte leaves: 0, 1, … 9 ms for the burst, 0 for the
        // late packet.
        let w = s.stats().queue_wait;
        assert_eq!(w.count(), 11);
        assert_eq!(w.mean(), Some(Duration::from_nanos(45_000_000 / 11)));
        near(w.quantile(1.0), 9.0);
    }

    #[test]
    fn on_a_trace_the_wait_ends_at_the_opportunity_that_carries_the_first_byte() {
        let t0 = origin();
        // Opportunities at 1, 1, 3, 10 (period 10), 1 500 bytes each.
        let trace = Arc::new(Trace::parse("1\n1\n3\n10\n").unwrap());
        let mut s = Shaper::new(RateModel::Trace(trace), QueueLimit::UNLIMITED, t0);
        // 2 000 bytes at 0: first byte at 1 ms, last at 1 ms (the second opportunity).
        s.offer(2000, t0);
        // 2 000 more: the 1 000 left at 1 ms, then 3 ms.
        assert_eq!(s.offer(2000, t0), Some(t0 + ms(3)));
        let w = s.stats().queue_wait;
        assert_eq!(w.count(), 2);
        assert_eq!(w.mean(), Some(ms(1)));
        let d = s.stats().queue_delay;
        assert_eq!(d.mean(), Some(ms(2)));
    }

    #[test]
    fn the_delay_histogram_takes_any_delay() {
        let mut h = DelayHistogram::default();
        assert_eq!(h.mean(), None);
        assert_eq!(h.quantile(0.95), None);
        h.record(Duration::ZERO);
        h.record(Duration::from_secs(3600));
        assert_eq!(h.count(), 2);
        assert_eq!(h.quantile(0.5), Some(Duration::from_micros(1)));
        // Beyond the last bin: counted there (about 16.8 s), not lost.
        assert!(h.quantile(1.0).unwrap() > Duration::from_secs(15));
    }

    #[test]
    fn a_window_of_the_histogram_holds_only_its_own_packets() {
        let mut h = DelayHistogram::default();
        h.record(ms(40));
        h.record(ms(40));
        let before = h;
        h.record(ms(1));
        h.record(ms(3));
        let w = h.since(&before);
        assert_eq!(w.count(), 2);
        assert_eq!(w.mean(), Some(ms(2)));
        assert!(w.quantile(1.0).unwrap() < ms(4));
        let none = before.since(&h);
        assert_eq!(none.count(), 0);
        assert_eq!((none.mean(), none.quantile(0.95)), (None, None));
        assert_eq!(h.since(&DelayHistogram::default()), h);
    }

    #[test]
    fn default_queue_is_100ms_at_the_rate() {
        let q = QueueLimit::resolve(QueueSpec::Default, Some(10e6));
        assert_eq!(q.bytes, Some(125_000));
        let q = QueueLimit::resolve(QueueSpec::Default, Some(100e3));
        assert_eq!(q.bytes, Some(15_000));
        assert_eq!(
            QueueLimit::resolve(QueueSpec::Default, None),
            QueueLimit::UNLIMITED
        );
    }
}
