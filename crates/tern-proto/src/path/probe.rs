//! Packet-pair fast start (DESIGN.md F11, SLTP's ECHO_1/ECHO_2 generalised to a short train;
//! PROTOCOL.md §9.26, §9.31, §11.10).
//!
//! A sender that starts (or restarts after an idle spell) sends a few full-size packets back
//! to back, bypassing its pacer, each marked with a `Probe` frame. Whatever their queueing
//! before the bottleneck, they leave the bottleneck link spaced by its serialisation time, so
//! the receiver reads the bottleneck rate from the spacing of their arrivals (the *dispersion*)
//! and reports it in a `ProbeReport` frame. The sender hands the rate to its congestion
//! controller ([`Controller::on_rate_estimate`](crate::cc::Controller::on_rate_estimate)),
//! which opens its window to about one bandwidth-delay product instead of doubling towards it
//! round trip after round trip.
//!
//! This module holds both halves of a path's probing state and the estimator; the connection
//! (`connection/send.rs`, `connection/recv.rs`) decides when to probe and carries the frames.
//!
//! # The estimator ([`estimate_rate`])
//!
//! Arrival time is the `now` the core is given when it handles the datagram; size is the
//! datagram's size. The first packet only starts the clock: the train's dispersion is
//! measured from the end of its arrival to the end of the last one's, so it covers the bytes
//! of packets 2..n. The rate is the slope of a line fitted through the points (arrival time,
//! bytes arrived since the first packet).
//!
//! - **Batches.** A driver that reads several datagrams at once (GRO, `recvmmsg`, a busy
//!   event loop) hands them in with the same `now`. A gap of zero says nothing, and a batch
//!   shows the spacing only across its ends: its datagrams arrived somewhere between the
//!   previous timestamp and its own, and only the last one about when it was read. So each
//!   batch (arrivals with equal timestamps) is one point, at its time, with every byte of the
//!   batch counted; packets batched with the first one are counted from the next point on.
//! - **Robust statistic: weighted Theil–Sen.** The rate is the median, over every two
//!   points, of `bytes between them / time between them`, each pair weighted by the bytes
//!   between them. A median resists outliers (a packet handled late by a scheduling hiccup
//!   moves the pairs that include it, not the result), and, unlike the median of
//!   consecutive gaps, the weighted pairs are dominated by long spans, whose timing noise
//!   (jitter, timer granularity, reads in batches) is small next to their duration: with
//!   arrival jitter of ±40 % of a gap (unit test below), the median of consecutive gaps is
//!   13 % off, this estimate under 5 %; with reads on a grid as coarse as the gap, the
//!   unweighted pairwise median snaps to the grid (16 % off), the weighted one stays within
//!   6 %. Batches need no special case: a batch read late makes its point late, which long
//!   pairs barely notice. A packet of cross traffic queued between two of ours delays every
//!   later one; the estimate then reads up to about 15 % low (the link did carry less of
//!   ours), the safe direction.
//! - **Too little evidence.** Fewer than [`MIN_ARRIVALS`] distinct arrival times (so a train
//!   handed in as one or two batches): no estimate (the report then says rate 0 and the
//!   sender keeps slow start).
//! - **Held and released together.** More than [`MAX_BATCH`] packets handled at one instant, or
//!   fewer distinct arrival times than half the packets: no estimate either. A radio link that
//!   delivers in order (and tern-netem's `jitter`) holds a packet for up to several
//!   milliseconds and releases the ones queued behind it with it, so a train that lasts less
//!   than the jitter arrives as a few clumps whose spacing is the jitter's, not the
//!   bottleneck's. On the `5g` profile (300 Mbit/s, 4 ms of jitter each way) such trains read
//!   0.1–0.25 of the link rate, and CUBIC, which ends slow start at the estimate, then took
//!   most of a 10 s run to grow to the real window (68 % of the link); in a model of in-order
//!   jitter (unit test below) every such train arrives in clumps of four or more, or in fewer
//!   than half as many instants as packets. A receiver's batch or a scheduling hiccup puts two
//!   or three together; a wrong refusal costs only the fast start (slow start runs as without a
//!   train).
//!
//! Errors go in the safe direction: cross traffic interleaved with the train, or losses
//! inside it, widen gaps and lower the estimate. What can make it too high is a bottleneck
//! that the train crossed faster than the flow will later be able to (a shared link whose
//! other flows were idle during the train, a burst-tolerant policer); the controller treats
//! its window as an ordinary overshoot then (see `cc/classic.rs`).

use std::time::{Duration, Instant};

use crate::wire::MAX_PROBE_TRAIN;

/// Packets in a train by default: ten give 45 pairs for the median while fitting in the
/// initial window (10 datagrams, 8 of 1452 bytes), which the train is sent within.
pub const DEFAULT_TRAIN_LEN: u8 = 10;

/// Fewest packets a train is sent with: with less congestion-window room, no train leaves.
pub const MIN_TRAIN_LEN: u8 = 4;

/// Fewest arrivals, and distinct arrival times, the receiver makes an estimate from.
pub const MIN_ARRIVALS: usize = 3;

/// Most packets of a train handled at one instant for an estimate to be made: more arrived
/// together than a receive batch or a short scheduling hiccup explains, so something held
/// them and let them go at once (see "Held and released together" in the module doc).
pub const MAX_BATCH: usize = 3;

/// A sender waits at most this many smoothed RTTs (at least [`MIN_REPORT_WAIT`]) for a train's
/// report before it gives up on it (it may probe again after its next idle period).
pub const REPORT_WAIT_RTTS: u32 = 3;

/// Floor of the report wait.
pub const MIN_REPORT_WAIT: Duration = Duration::from_millis(50);

/// The bottleneck rate, in bytes per second, shown by a train's arrivals `(time, datagram
/// size)` in the order they were handled; `None` without enough evidence. See the module
/// documentation for the method.
pub fn estimate_rate(arrivals: &[(Instant, u32)]) -> Option<u64> {
    if arrivals.len() < MIN_ARRIVALS {
        return None;
    }
    // Batch ends: (time, bytes counted up to and including the batch). Equal (or,
    // defensively, earlier) times merge into one batch; the first packet's bytes do not
    // count (the clock starts when it is handled).
    let mut ends: Vec<(Instant, u64)> = Vec::with_capacity(arrivals.len());
    let mut bytes = 0u64;
    let (mut batch, mut largest_batch) = (0usize, 0usize);
    for (k, &(t, size)) in arrivals.iter().enumerate() {
        if k > 0 {
            bytes = bytes.saturating_add(u64::from(size));
        }
        match ends.last_mut() {
            Some(last) if t <= last.0 => {
                last.1 = bytes;
                batch += 1;
            }
            _ => {
                ends.push((t, bytes));
                batch = 1;
            }
        }
        largest_batch = largest_batch.max(batch);
    }
    // Clumps: more than MAX_BATCH packets at one instant, or fewer distinct instants than
    // half the packets.
    if ends.len() < MIN_ARRIVALS || largest_batch > MAX_BATCH || 2 * ends.len() < arrivals.len() {
        return None;
    }
    // Weighted Theil–Sen: the median of the rates between every two batch ends, each pair
    // weighted by the bytes between them.
    let mut rates: Vec<(u64, u64)> = Vec::with_capacity(ends.len() * (ends.len() - 1) / 2);
    for (i, a) in ends.iter().enumerate() {
        for b in &ends[i + 1..] {
            let bytes = b.1 - a.1;
            if let Some(r) = rate(bytes, b.0.saturating_duration_since(a.0)) {
                rates.push((r, bytes));
            }
        }
    }
    let total: u128 = rates.iter().map(|r| u128::from(r.1)).sum();
    if total == 0 {
        return None;
    }
    rates.sort_unstable();
    let mut seen = 0u128;
    for (r, w) in rates {
        seen += u128::from(w);
        if 2 * seen >= total {
            return Some(r);
        }
    }
    None
}

fn rate(bytes: u64, over: Duration) -> Option<u64> {
    let nanos = over.as_nanos();
    if nanos == 0 || bytes == 0 {
        return None;
    }
    let r = u128::from(bytes) * 1_000_000_000 / nanos;
    Some(u64::try_from(r).unwrap_or(u64::MAX).max(1))
}

/// What a receiver reports about one train.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeReport {
    pub(crate) train: u64,
    pub(crate) received: u8,
    /// Bytes per second; 0 = no estimate.
    pub(crate) rate: u64,
}

/// A train being recorded: its number, its packet count and the arrivals so far.
type TrainRecord = (u64, u8, Vec<(Instant, u32)>);

/// The receiving half: the train being recorded on this path and the report owed for it.
#[derive(Debug, Default)]
pub(crate) struct ProbeReceiver {
    /// The train being recorded.
    current: Option<TrainRecord>,
    /// Highest train number finished (its packets, late or repeated, are ignored).
    finished: u64,
    /// The report to send (new, or its packet was lost).
    pub(crate) pending: Option<ProbeReport>,
    /// The latest report, to resend if lost.
    pub(crate) latest: Option<ProbeReport>,
}

impl ProbeReceiver {
    /// A packet of train `train` (`index` of `count`), `size` bytes, was handled at `now`.
    pub(crate) fn on_probe(&mut self, now: Instant, train: u64, index: u8, count: u8, size: u32) {
        if train <= self.finished {
            return;
        }
        if self.current.as_ref().is_some_and(|c| c.0 != train) {
            if self.current.as_ref().is_some_and(|c| c.0 > train) {
                return;
            }
            self.finish();
        }
        let count = count.min(MAX_PROBE_TRAIN);
        let (_, _, arrivals) = self
            .current
            .get_or_insert_with(|| (train, count, Vec::with_capacity(usize::from(count))));
        if arrivals.len() < usize::from(count) {
            arrivals.push((now, size));
        }
        if index >= count || arrivals.len() >= usize::from(count) {
            self.finish();
        }
    }

    /// A packet that belongs to no train arrived on the path: the train (sent back to back,
    /// before anything else) is over, whatever of it was lost.
    pub(crate) fn on_other_packet(&mut self) {
        if self.current.is_some() {
            self.finish();
        }
    }

    fn finish(&mut self) {
        let Some((train, _, arrivals)) = self.current.take() else {
            return;
        };
        self.finished = train;
        let report = ProbeReport {
            train,
            received: arrivals.len().min(usize::from(MAX_PROBE_TRAIN)) as u8,
            rate: estimate_rate(&arrivals).unwrap_or(0),
        };
        self.pending = Some(report);
        self.latest = Some(report);
    }

    /// The report with this train number was lost: send it again if it is still the latest.
    pub(crate) fn on_report_lost(&mut self, train: u64) {
        if self.latest.is_some_and(|r| r.train == train) && self.pending.is_none() {
            self.pending = self.latest;
        }
    }
}

/// A train being sent: its number, the index of the next packet, its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TrainProgress {
    pub(crate) train: u64,
    pub(crate) next: u8,
    pub(crate) count: u8,
}

/// The sending half: trains sent on this path and the estimate they gave.
#[derive(Debug, Default)]
pub(crate) struct ProbeSender {
    /// Number of the latest train started (0: none yet).
    pub(crate) last_train: u64,
    /// A train was started on this network path (reset when the path moves).
    pub(crate) probed: bool,
    /// The train whose packets are leaving now.
    pub(crate) sending: Option<TrainProgress>,
    /// The train sent last, waiting for its report, and when its last packet left. No new
    /// train starts while it waits (at most [`REPORT_WAIT_RTTS`] smoothed RTTs).
    pub(crate) awaiting: Option<(u64, Instant)>,
    /// The latest train's report was applied, or may no longer be (the path moved): a report
    /// for it, even late (lost and resent), is taken only while this is false.
    pub(crate) reported: bool,
    /// The latest estimate applied, bytes per second, and when.
    pub(crate) estimate: Option<(u64, Instant)>,
    /// The latest train went out right behind the handshake's response (a server's, within
    /// the anti-amplification limit). If it gives no estimate, it does not count as the
    /// path's first train: the path may send that with its first data.
    pub(crate) during_handshake: bool,
}

impl ProbeSender {
    /// Starts train number `last_train + 1` of `count` packets.
    pub(crate) fn start(&mut self, count: u8) -> u64 {
        self.last_train += 1;
        self.probed = true;
        self.reported = false;
        self.during_handshake = false;
        self.sending = Some(TrainProgress {
            train: self.last_train,
            next: 1,
            count,
        });
        self.awaiting = None;
        self.last_train
    }

    /// Starts the path's first train with the handshake's response (see
    /// [`during_handshake`](Self::during_handshake)).
    pub(crate) fn start_during_handshake(&mut self, count: u8) -> u64 {
        let train = self.start(count);
        self.during_handshake = true;
        train
    }

    /// The latest train gave no estimate (its report says rate 0, or none came): a train
    /// sent during the handshake then leaves the path free to send its first train.
    pub(crate) fn no_estimate(&mut self) {
        if std::mem::take(&mut self.during_handshake) {
            self.probed = false;
        }
    }

    /// The `Probe` frame fields for the next packet of the train, and advances it; the train
    /// ends (and waits for its report) after its last packet.
    pub(crate) fn next_packet(&mut self, now: Instant) -> Option<(u64, u8, u8)> {
        let p = self.sending.as_mut()?;
        let fields = (p.train, p.next, p.count);
        if p.next >= p.count {
            self.awaiting = Some((p.train, now));
            self.sending = None;
        } else {
            p.next += 1;
        }
        Some(fields)
    }

    /// The train cannot go on (no room): it ends short; the receiver measures what arrived.
    pub(crate) fn abort(&mut self, now: Instant) {
        if let Some(p) = self.sending.take() {
            self.awaiting = Some((p.train, now));
        }
    }

    /// Whether a report for `train` is to be applied: it is for the latest train, whose
    /// report has not been applied yet (a report resent after the wait expired still counts:
    /// nothing newer was measured). Stops the waiting.
    pub(crate) fn take_report(&mut self, train: u64) -> bool {
        if train != self.last_train || self.reported || self.sending.is_some() {
            return false;
        }
        self.reported = true;
        self.awaiting = None;
        true
    }

    /// Stops waiting for a report that is overdue (lost train tail, a report lost more than
    /// once, or a peer that does not measure), so that a later idle period may probe again.
    pub(crate) fn expire(&mut self, now: Instant, smoothed_rtt: Duration) {
        let wait = (smoothed_rtt * REPORT_WAIT_RTTS).max(MIN_REPORT_WAIT);
        if self
            .awaiting
            .is_some_and(|(_, at)| now.saturating_duration_since(at) > wait)
        {
            self.awaiting = None;
            self.no_estimate();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u32 = 1452;

    fn t0() -> Instant {
        crate::cc::testing::epoch()
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// `n` packets spaced `gap` apart.
    fn even(n: usize, gap: Duration) -> Vec<(Instant, u32)> {
        (0..n).map(|i| (t0() + gap * i as u32, SIZE)).collect()
    }

    fn within(got: u64, want: f64, tolerance: f64) -> bool {
        (got as f64 - want).abs() <= want * tolerance
    }

    #[test]
    fn evenly_spaced_train_gives_the_link_rate() {
        // 1452 bytes every 116.16 µs: 100 Mbit/s = 12.5 MB/s.
        let got = estimate_rate(&even(10, Duration::from_nanos(116_160))).unwrap();
        assert!(within(got, 12.5e6, 0.001), "{got}");
        // 1 Gbit/s.
        let got = estimate_rate(&even(16, Duration::from_nanos(11_616))).unwrap();
        assert!(within(got, 125e6, 0.001), "{got}");
    }

    #[test]
    fn a_packet_handled_late_is_ignored() {
        // Packet 4 is handled 220 µs late (a scheduling hiccup), together with packet 5.
        let times = [0u64, 100, 200, 300, 520, 520, 600, 700, 800, 900];
        let arrivals: Vec<_> = times.iter().map(|&t| (t0() + us(t), SIZE)).collect();
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / 100e-6;
        assert!(within(got, want, 0.001), "{got} vs {want}");
    }

    #[test]
    fn cross_traffic_between_train_packets_lowers_the_estimate_a_little() {
        // A packet of cross traffic queued between packets 4 and 5 delays 5..9 by one gap.
        let times: Vec<u64> = (0..10)
            .map(|i| if i < 5 { i * 100 } else { (i + 1) * 100 })
            .collect();
        let arrivals: Vec<_> = times.iter().map(|&t| (t0() + us(t), SIZE)).collect();
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / 100e-6;
        assert!(
            got as f64 <= want && got as f64 >= 0.85 * want,
            "{got} vs {want}"
        );
    }

    #[test]
    fn jitter_moves_the_estimate_little() {
        // Arrivals every 100 µs, each moved by up to ±40 µs (kept in order).
        let jitter = [
            0i64, 40, -30, 20, -40, 35, -10, 5, -25, 30, -35, 15, -5, 25, -20, 10,
        ];
        let arrivals: Vec<_> = jitter
            .iter()
            .enumerate()
            .map(|(i, j)| (t0() + us((1000 + i as i64 * 100 + j) as u64), SIZE))
            .collect();
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / 100e-6;
        assert!(within(got, want, 0.05), "{got} vs {want}");
    }

    #[test]
    fn pairs_weigh_by_their_span() {
        // 4 points → 6 pairs, in MB/s (weight in kB): (0,1) 10 (1), (0,2) 10 (2),
        // (0,3) 7.5 (3), (1,2) 10 (1), (1,3) 6.67 (2), (2,3) 5 (1). Sorted by rate, the
        // weights 1, 2, 3, ... reach half of 10 at 7.5 MB/s (an unweighted median: 8.75).
        let times = [0u64, 100, 200, 400];
        let arrivals: Vec<_> = times.iter().map(|&t| (t0() + us(t), 1000)).collect();
        assert_eq!(estimate_rate(&arrivals), Some(7_500_000));
    }

    #[test]
    fn reads_on_a_coarse_grid() {
        // Arrivals every 116 µs read on a 100 µs grid: most neighbours look 100 µs apart
        // (16 % fast), some 200 (42 % slow); long spans are right within a tick.
        let arrivals: Vec<_> = (0..10u64)
            .map(|i| (t0() + us((i * 116 + 30).div_ceil(100) * 100), SIZE))
            .collect();
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / 116e-6;
        assert!(within(got, want, 0.06), "{got} vs {want}");
    }

    #[test]
    fn batches_show_the_spacing_across_their_ends() {
        let gap = 100u64;
        // Datagrams arrive every 100 µs but are read in pairs (GRO-like), each pair at the
        // arrival of its second datagram; the first pair's first datagram starts the clock.
        let mut arrivals = Vec::new();
        for i in 0..10u64 {
            let read_at = (i | 1) * gap;
            arrivals.push((t0() + us(read_at), SIZE));
        }
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / (gap as f64 * 1e-6);
        // 8 packets after the first batch, over 8 gaps.
        assert!(within(got, want, 0.001), "{got} vs {want}");
    }

    #[test]
    fn irregular_batches() {
        // True arrivals every 10 µs: the reader takes the first at once, is busy until 35 µs
        // (three waiting), then takes the last at 40. Consecutive steps would say 3/35 and 1/5
        // packets per µs (14 % low and 100 % high); the pairs of points give 3/35, 4/40 and
        // 1/5, whose median is exact.
        let times = [0u64, 35, 35, 35, 40];
        let arrivals: Vec<_> = times.iter().map(|&t| (t0() + us(t), SIZE)).collect();
        let got = estimate_rate(&arrivals).unwrap();
        let want = f64::from(SIZE) / 10e-6;
        assert!(within(got, want, 0.001), "{got} vs {want}");
    }

    /// `n` packets leaving a bottleneck `gap` apart, each then held up to `jitter` without
    /// reordering (a packet waits for the one before it), as tern-netem's `jitter` does.
    fn in_order_jitter(
        n: usize,
        gap: Duration,
        jitter: Duration,
        seed: u64,
    ) -> Vec<(Instant, u32)> {
        let mut x = seed | 1;
        let mut last = t0();
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let held = Duration::from_nanos(x % (jitter.as_nanos() as u64 + 1));
                let t = (t0() + gap * i as u32 + held).max(last);
                last = t;
                (t, SIZE)
            })
            .collect()
    }

    #[test]
    fn a_train_shorter_than_in_order_jitter_gives_no_estimate() {
        // 300 Mbit/s (a 1452-byte packet every 38.72 µs) with up to 4 ms of in-order jitter:
        // the train lasts 0.35 ms and arrives in clumps. Without the clump rule six of these
        // twelve trains gave estimates of 11–25 % of the link.
        let gap = Duration::from_nanos(38_720);
        let want = f64::from(SIZE) / gap.as_secs_f64();
        for seed in 1..=12u64 {
            let arrivals = in_order_jitter(10, gap, Duration::from_millis(4), seed * 7919);
            if let Some(got) = estimate_rate(&arrivals) {
                panic!("seed {seed}: {:.2} of the link", got as f64 / want);
            }
        }
        // A train that lasts several times the jitter still measures: 30 Mbit/s with 2 ms
        // (the `lte` profile) and 100 Mbit/s with 0.5 ms (`wifi`).
        for (gap_ns, jitter) in [
            (387_200, Duration::from_millis(2)),
            (116_160, Duration::from_micros(500)),
        ] {
            let gap = Duration::from_nanos(gap_ns);
            let want = f64::from(SIZE) / gap.as_secs_f64();
            let good = (1..=12u64)
                .filter_map(|seed| estimate_rate(&in_order_jitter(10, gap, jitter, seed * 7919)))
                .filter(|&got| within(got, want, 0.35))
                .count();
            assert!(
                good >= 10,
                "{gap_ns} ns ± {jitter:?}: {good} of 12 within 35 %"
            );
        }
    }

    #[test]
    fn zero_gaps_alone_give_no_estimate() {
        // A whole train in one receive batch: no spacing to read.
        let arrivals = vec![(t0(), SIZE); 10];
        assert_eq!(estimate_rate(&arrivals), None);
        // Everything but the last in the first batch: two points are not enough.
        let mut arrivals = vec![(t0(), SIZE); 9];
        arrivals.push((t0() + us(100), SIZE));
        assert_eq!(estimate_rate(&arrivals), None);
    }

    #[test]
    fn too_few_packets_give_no_estimate() {
        assert_eq!(estimate_rate(&[]), None);
        assert_eq!(estimate_rate(&even(1, us(100))), None);
        assert_eq!(estimate_rate(&even(2, us(100))), None);
        assert!(estimate_rate(&even(3, us(100))).is_some());
    }

    #[test]
    fn time_stepping_back_is_merged_not_negative() {
        let times = [0i64, 100, 90, 300, 400];
        let arrivals: Vec<_> = times.iter().map(|&t| (t0() + us(t as u64), SIZE)).collect();
        let got = estimate_rate(&arrivals).unwrap();
        assert!(got > 0);
    }

    #[test]
    fn receiver_reports_once_per_train() {
        let mut rx = ProbeReceiver::default();
        for (i, (t, size)) in even(10, us(100)).into_iter().enumerate() {
            rx.on_probe(t, 1, i as u8 + 1, 10, size);
        }
        let r = rx.pending.take().expect("report after the last packet");
        assert_eq!((r.train, r.received), (1, 10));
        assert!(within(r.rate, f64::from(SIZE) / 100e-6, 0.001));
        // A duplicate of a finished train changes nothing.
        rx.on_probe(t0(), 1, 3, 10, SIZE);
        assert_eq!(rx.pending, None);
        // Lost report: resent while it is the latest.
        rx.on_report_lost(1);
        assert_eq!(rx.pending, Some(r));
    }

    #[test]
    fn receiver_ends_a_train_cut_short() {
        let mut rx = ProbeReceiver::default();
        // Train 2 of 10 packets: the last 4 are lost; a data packet follows.
        for (i, (t, size)) in even(6, us(100)).into_iter().enumerate() {
            rx.on_probe(t, 2, i as u8 + 1, 10, size);
        }
        assert_eq!(rx.pending, None);
        rx.on_other_packet();
        let r = rx.pending.take().unwrap();
        assert_eq!((r.train, r.received), (2, 6));
        assert!(r.rate > 0);
        // A newer train ends an older one too; too short a remnant reports rate 0.
        rx.on_probe(t0(), 3, 1, 10, SIZE);
        rx.on_probe(t0() + us(50), 4, 1, 10, SIZE);
        let r = rx.pending.take().unwrap();
        assert_eq!((r.train, r.received, r.rate), (3, 1, 0));
        // An older train's straggler is ignored.
        rx.on_probe(t0(), 3, 2, 10, SIZE);
        rx.on_other_packet();
        assert_eq!(rx.pending.take().unwrap().train, 4);
    }

    #[test]
    fn a_handshake_train_without_an_estimate_leaves_the_first_train_to_come() {
        let t = t0();
        let mut tx = ProbeSender::default();
        tx.start_during_handshake(3);
        for _ in 0..3 {
            tx.next_packet(t);
        }
        assert!(tx.probed && tx.during_handshake);
        assert!(tx.take_report(1));
        tx.no_estimate();
        assert!(!tx.probed, "the path may still send its first train");
        // Nor does a report that never comes count.
        let mut late = ProbeSender::default();
        late.start_during_handshake(3);
        late.abort(t);
        late.expire(t + Duration::from_millis(400), Duration::from_millis(100));
        assert!(!late.probed && late.awaiting.is_none());
        // An ordinary train is the path's first whatever it gives.
        let mut usual = ProbeSender::default();
        usual.start(10);
        usual.abort(t);
        assert!(usual.take_report(1));
        usual.no_estimate();
        assert!(usual.probed);
    }

    #[test]
    fn sender_numbers_and_ends_trains() {
        let mut tx = ProbeSender::default();
        let t = t0();
        assert_eq!(tx.start(3), 1);
        assert_eq!(tx.next_packet(t), Some((1, 1, 3)));
        assert_eq!(tx.next_packet(t), Some((1, 2, 3)));
        assert_eq!(tx.next_packet(t), Some((1, 3, 3)));
        assert_eq!(tx.next_packet(t), None);
        assert_eq!(tx.awaiting, Some((1, t)));
        assert!(!tx.take_report(7));
        assert!(tx.take_report(1));
        assert!(!tx.take_report(1), "applied once");
        tx.start(4);
        tx.next_packet(t);
        assert!(!tx.take_report(2), "not before the train is over");
        tx.abort(t);
        assert_eq!(tx.awaiting, Some((2, t)));
        tx.expire(t + Duration::from_millis(40), Duration::from_millis(10));
        assert!(tx.awaiting.is_some());
        tx.expire(t + Duration::from_millis(51), Duration::from_millis(10));
        assert!(tx.awaiting.is_none());
        // A late report (resent after a loss) for the latest train is still taken.
        assert!(!tx.take_report(1));
        assert!(tx.take_report(2));
    }
}
