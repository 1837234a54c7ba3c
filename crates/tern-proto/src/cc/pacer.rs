//! Token-bucket pacing (DESIGN.md F11: "All sending is paced").
//!
//! Without pacing, a window's worth of packets leaves in one burst whenever ACKs open the
//! window, which fills bottleneck queues (latency and jitter for the AR and video flows tern is
//! built for) and causes losses on shallow buffers. The pacer spreads packets over the round
//! trip at the controller's [`pacing_rate`](super::Controller::pacing_rate), or at
//! [`DEFAULT_GAIN`] × window / smoothed RTT when the controller leaves it to the pacer.
//!
//! The bucket holds up to a small burst (about [`BURST_INTERVAL`] of sending, between
//! [`DEFAULT_MIN_BURST`] and [`DEFAULT_MAX_BURST`] datagrams), so that a driver whose timers fire
//! late can still catch up a little, and so that GSO can batch a few datagrams.
//!
//! **Throughput ceiling.** A driver that sleeps until [`Pacer::delay`]'s instant can send at most
//! one burst per timer tick, so the pacer caps throughput near `max_burst × max_datagram_size /
//! timer granularity`: 10 × 1452 bytes per 1 ms is about 116 Mbit/s. Drivers with coarse timers
//! or large GSO batches (the `bulk` benchmark) should raise the maximum burst with
//! [`Pacer::with_burst_limits`], e.g. to the GSO batch size.
//!
//! The pacer is pure arithmetic on the `now` it is given: it never reads a clock, it tolerates
//! time standing still or stepping backwards, a zero RTT, and rates up to `u64::MAX`.

use std::time::{Duration, Instant};

/// The burst the bucket may hold, as time at the pacing rate (the "2 ms" of quinn's pacer).
pub const BURST_INTERVAL: Duration = Duration::from_millis(2);

/// Smallest burst capacity, in datagrams: an initial window (quinn's minimum burst too). A
/// small message, or the first packets after an idle spell, then leave at once instead of
/// being spread over a round trip: at a 36 ms RTT and a 12 kB window, a 10 kB request would
/// otherwise take 20 ms longer than over kernel TCP. Pairs for ACK-clocked receivers and
/// packet-pair probing (F11) fit in it.
pub const DEFAULT_MIN_BURST: u64 = 10;

/// Largest burst capacity, in datagrams: small bursts keep bottleneck queues, and so latency and
/// jitter, low. See the module doc for the throughput ceiling this implies.
pub const DEFAULT_MAX_BURST: u64 = 10;

/// Default pacing gain over window / smoothed RTT when the controller gives no rate: slightly
/// above 1 so that pacing never becomes the bottleneck (quinn's 1.25).
pub const DEFAULT_GAIN: (u64, u64) = (5, 4);

/// Longest delay the pacer returns. Slower rates (a controller reporting a near-zero rate) are
/// still honoured: the caller wakes up, asks again and is told to wait again. Capping keeps
/// instants far from overflow and lets a rate increase take effect within a second even if the
/// caller only re-polls when its timer fires.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A token bucket deciding when the next packet may leave.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Bytes that may leave back to back right now.
    tokens: u64,
    /// Token refill not yet worth a whole byte, in byte·nanoseconds per second (< 10⁹), so
    /// that frequent calls with tiny time steps do not lose the fractions.
    fraction: u64,
    /// Size of the bucket in bytes.
    capacity: u64,
    /// Time up to which tokens have been credited.
    prev: Instant,
    min_burst: u64,
    max_burst: u64,
    /// Datagram size of the latest call, to re-clamp the bucket when the limits change.
    max_datagram_size: u16,
}

impl Pacer {
    /// A pacer with a full bucket sized for `window` (clamped to the burst limits), so the first
    /// flight may leave at once.
    pub fn new(now: Instant, window: u64, max_datagram_size: u16) -> Self {
        let mut pacer = Self {
            tokens: 0,
            fraction: 0,
            capacity: 0,
            prev: now,
            min_burst: DEFAULT_MIN_BURST,
            max_burst: DEFAULT_MAX_BURST,
            max_datagram_size,
        };
        pacer.capacity = pacer.clamp_burst(window, max_datagram_size);
        pacer.tokens = pacer.capacity;
        pacer
    }

    /// Sets the burst limits in datagrams (defaults [`DEFAULT_MIN_BURST`] and
    /// [`DEFAULT_MAX_BURST`]). `min` is at least 1 and `max` at least `min`.
    pub fn with_burst_limits(mut self, min_datagrams: u64, max_datagrams: u64) -> Self {
        self.min_burst = min_datagrams.max(1);
        self.max_burst = max_datagrams.max(self.min_burst);
        self.capacity = self.clamp_burst(self.capacity, self.max_datagram_size);
        self.tokens = self.tokens.min(self.capacity);
        self
    }

    /// Current bucket size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes that may currently leave back to back (as of the last [`delay`](Self::delay)).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The rate used when the controller gives none: [`DEFAULT_GAIN`] × window / smoothed RTT,
    /// in bytes per second. A zero RTT counts as 1 ns (so the rate is merely huge).
    pub fn default_rate(window: u64, smoothed_rtt: Duration) -> u64 {
        let nanos = smoothed_rtt.as_nanos().max(1);
        let (num, den) = DEFAULT_GAIN;
        let rate = u128::from(window) * u128::from(num) * NANOS_PER_SEC / (u128::from(den) * nanos);
        u64::try_from(rate).unwrap_or(u64::MAX)
    }

    /// When a packet of `bytes` bytes may leave: `None` = now, `Some(t)` = not before `t` (always
    /// later than `now`). Call [`on_sent`](Self::on_sent) when it does leave.
    ///
    /// `pacing_rate` is the controller's rate in bytes/s, or `None` for the default derived from
    /// `window` and `smoothed_rtt`. A packet larger than the bucket waits for a full bucket.
    pub fn delay(
        &mut self,
        now: Instant,
        bytes: u64,
        window: u64,
        pacing_rate: Option<u64>,
        smoothed_rtt: Duration,
        max_datagram_size: u16,
    ) -> Option<Instant> {
        let rate = pacing_rate
            .unwrap_or_else(|| Self::default_rate(window, smoothed_rtt))
            .max(1);

        // The bucket holds BURST_INTERVAL of sending at the current rate, within the limits.
        self.max_datagram_size = max_datagram_size;
        let burst = u128::from(rate) * BURST_INTERVAL.as_nanos() / NANOS_PER_SEC;
        self.capacity =
            self.clamp_burst(u64::try_from(burst).unwrap_or(u64::MAX), max_datagram_size);

        // Credit the time elapsed since the last call. Time that stands still or steps back
        // credits nothing, and `prev` never moves backwards.
        let elapsed = now.saturating_duration_since(self.prev);
        if now > self.prev {
            self.prev = now;
        }
        let credit = elapsed.as_nanos() * u128::from(rate) + u128::from(self.fraction);
        let whole = credit / NANOS_PER_SEC;
        self.fraction = u64::try_from(credit % NANOS_PER_SEC).unwrap_or(0);
        self.tokens = u64::try_from(whole)
            .unwrap_or(u64::MAX)
            .saturating_add(self.tokens);
        if self.tokens >= self.capacity {
            // A full bucket overflows: the excess is not kept, nor is its fraction.
            self.tokens = self.capacity;
            self.fraction = 0;
        }

        let needed = bytes.min(self.capacity);
        if self.tokens >= needed {
            return None;
        }
        // Time until the missing bytes have been credited, rounded up so the caller wakes up
        // to enough tokens (and never at `now` itself).
        let missing = u128::from(needed - self.tokens) * NANOS_PER_SEC - u128::from(self.fraction);
        let nanos = missing.div_ceil(u128::from(rate)).max(1);
        let delay = u64::try_from(nanos)
            .map(Duration::from_nanos)
            .unwrap_or(MAX_DELAY)
            .min(MAX_DELAY);
        // Adding at most a second to an `Instant` cannot realistically overflow; if it did, the
        // packet may as well leave now.
        now.checked_add(delay)
    }

    /// A packet of `bytes` bytes was sent: take its tokens.
    pub fn on_sent(&mut self, bytes: u64) {
        self.tokens = self.tokens.saturating_sub(bytes);
    }

    fn clamp_burst(&self, bytes: u64, max_datagram_size: u16) -> u64 {
        let mds = u64::from(max_datagram_size).max(1);
        bytes.clamp(
            self.min_burst.saturating_mul(mds),
            self.max_burst.saturating_mul(mds),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::epoch;

    const MDS: u16 = 1200;
    const MS: Duration = Duration::from_millis(1);

    /// Sends `size`-byte packets as fast as the pacer allows for `duration`, jumping to each
    /// instant the pacer returns. Returns (bytes sent, send log).
    fn run(
        pacer: &mut Pacer,
        start: Instant,
        duration: Duration,
        size: u64,
        window: u64,
        rate: Option<u64>,
        srtt: Duration,
    ) -> (u64, Vec<(Instant, u64)>) {
        let mut now = start;
        let mut sent = 0;
        let mut log = Vec::new();
        while now < start + duration {
            match pacer.delay(now, size, window, rate, srtt, MDS) {
                None => {
                    pacer.on_sent(size);
                    sent += size;
                    log.push((now, size));
                }
                Some(next) => {
                    assert!(next > now, "delay must be in the future");
                    now = next;
                }
            }
        }
        (sent, log)
    }

    #[test]
    fn long_run_averages_the_default_rate() {
        // 120 kB per 50 ms × 1.25 = 3 MB/s.
        let window = 120_000;
        let srtt = 50 * MS;
        let expected = Pacer::default_rate(window, srtt);
        assert_eq!(expected, 3_000_000);
        let start = epoch();
        let mut pacer = Pacer::new(start, window, MDS);
        let (sent, _) = run(&mut pacer, start, 10 * 1000 * MS, 1200, window, None, srtt);
        let rate = sent as f64 / 10.0;
        let error = (rate - expected as f64).abs() / expected as f64;
        assert!(error < 0.05, "paced at {rate} B/s, expected {expected}");
    }

    #[test]
    fn long_run_averages_an_explicit_rate() {
        for rate in [10_000u64, 1_000_000, 125_000_000] {
            let start = epoch();
            let mut pacer = Pacer::new(start, 12_000, MDS);
            let (sent, _) = run(
                &mut pacer,
                start,
                10 * 1000 * MS,
                1000,
                12_000,
                Some(rate),
                100 * MS,
            );
            // The first bucket (ten datagrams) comes on top of the rate.
            let actual = (sent - pacer.capacity().min(sent)) as f64 / 10.0;
            let error = (actual - rate as f64).abs() / rate as f64;
            assert!(error < 0.05, "paced at {actual} B/s, expected {rate}");
        }
    }

    #[test]
    fn bursts_never_exceed_capacity() {
        let start = epoch();
        let window = 1_000_000;
        let srtt = 10 * MS;
        let mut pacer = Pacer::new(start, window, MDS);
        // Idle for a long time: the bucket refills only up to its capacity.
        let (_, log) = run(
            &mut pacer,
            start + 5000 * MS,
            100 * MS,
            1200,
            window,
            None,
            srtt,
        );
        let capacity = pacer.capacity();
        assert_eq!(capacity, DEFAULT_MAX_BURST * 1200);
        let rate = Pacer::default_rate(window, srtt) as f64;
        // Within any interval, at most one bucket plus what the rate credits in it.
        for (i, &(first, _)) in log.iter().enumerate() {
            let mut bytes = 0;
            for &(at, size) in &log[i..] {
                let span = (at - first).as_secs_f64();
                if span > 0.005 {
                    break;
                }
                bytes += size;
                assert!(
                    bytes as f64 <= capacity as f64 + rate * span + 1.0,
                    "{bytes} bytes in {span} s"
                );
            }
        }
    }

    #[test]
    fn capacity_is_clamped_between_burst_limits() {
        let now = epoch();
        let mut pacer = Pacer::new(now, 1_000_000_000, MDS);
        assert_eq!(pacer.capacity(), 10 * 1200);
        // 2 ms at 1 MB/s is 2000 bytes: below the ten-datagram minimum.
        pacer.delay(now, 1200, 0, Some(1_000_000), 100 * MS, MDS);
        assert_eq!(pacer.capacity(), 10 * 1200);
        let mut pacer = Pacer::new(now, 0, MDS).with_burst_limits(2, 64);
        // 2 ms at 1 MB/s is 2000 bytes: below two datagrams.
        pacer.delay(now, 1200, 0, Some(1_000_000), 100 * MS, MDS);
        assert_eq!(pacer.capacity(), 2 * 1200);
        // 2 ms at 4.8 MB/s is 9600 bytes: eight datagrams.
        pacer.delay(now, 1200, 0, Some(4_800_000), 100 * MS, MDS);
        assert_eq!(pacer.capacity(), 9600);
        let mut pacer = Pacer::new(now, 0, MDS).with_burst_limits(4, 45);
        pacer.delay(now, 1200, 0, Some(u64::MAX), 100 * MS, MDS);
        assert_eq!(pacer.capacity(), 45 * 1200);
        let pacer = Pacer::new(now, 0, MDS).with_burst_limits(0, 0);
        assert_eq!(pacer.capacity(), 1200);
    }

    #[test]
    fn time_standing_still_earns_no_tokens() {
        let now = epoch() + 1000 * MS;
        let mut pacer = Pacer::new(now, 12_000, MDS);
        let mut sent = 0;
        for _ in 0..1000 {
            if pacer
                .delay(now, 1200, 12_000, None, 100 * MS, MDS)
                .is_none()
            {
                pacer.on_sent(1200);
                sent += 1;
            }
        }
        // The initial bucket (2 ms at 150 kB/s is less than the ten-datagram minimum).
        assert_eq!(sent, 10);
        let next = pacer.delay(now, 1200, 12_000, None, 100 * MS, MDS);
        // 1200 bytes at 150 kB/s.
        assert_eq!(next, Some(now + 8 * MS));
        // Time stepping backwards neither panics nor credits tokens.
        assert!(pacer
            .delay(now - 5 * MS, 1200, 12_000, None, 100 * MS, MDS)
            .is_some());
        assert_eq!(
            pacer.delay(now + 8 * MS, 1200, 12_000, None, 100 * MS, MDS),
            None
        );
    }

    #[test]
    fn tiny_time_steps_accumulate() {
        // 1 MB/s polled every 100 ns: each step credits a tenth of a byte.
        let start = epoch();
        let mut pacer = Pacer::new(start, 0, MDS);
        let mut now = start;
        let mut sent = 0u64;
        for _ in 0..3_000_000 {
            now += Duration::from_nanos(100);
            if pacer
                .delay(now, 1000, 0, Some(1_000_000), MS, MDS)
                .is_none()
            {
                pacer.on_sent(1000);
                sent += 1000;
            }
        }
        // 0.3 s: 300 kB plus the initial bucket.
        assert!((300_000..=300_000 + 12_000).contains(&sent), "{sent}");
    }

    #[test]
    fn zero_rtt_huge_and_zero_rates_do_not_panic() {
        let now = epoch();
        let mut pacer = Pacer::new(now, u64::MAX, u16::MAX);
        assert_eq!(pacer.capacity(), 10 * u64::from(u16::MAX));
        // Zero RTT: the default rate is huge, so packets flow.
        for i in 0..100u32 {
            let t = now + Duration::from_nanos(u64::from(i));
            if pacer
                .delay(t, 1200, u64::MAX, None, Duration::ZERO, MDS)
                .is_none()
            {
                pacer.on_sent(1200);
            }
        }
        assert_eq!(Pacer::default_rate(u64::MAX, Duration::ZERO), u64::MAX);
        assert!(pacer
            .delay(now, u64::MAX, u64::MAX, Some(u64::MAX), Duration::MAX, 0)
            .is_none());
        pacer.on_sent(u64::MAX);
        // A zero rate counts as 1 byte/s; the delay is capped at MAX_DELAY.
        let later = now + MS;
        let next = pacer.delay(later, 1200, 0, Some(0), Duration::ZERO, MDS);
        assert_eq!(next, Some(later + MAX_DELAY));
        let next = pacer.delay(later, 1200, 0, None, Duration::MAX, MDS);
        assert_eq!(next, Some(later + MAX_DELAY));
    }
}
