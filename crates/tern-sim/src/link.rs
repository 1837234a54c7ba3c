//! One direction of a network link: rate limiter, drop-tail queue, propagation delay, jitter,
//! reordering, loss (random or Gilbert–Elliott bursts), duplication and corruption, and two
//! time-based impairments: scheduled outages ([`Outage`]) and fades ([`Fade`]).
//!
//! A [`Link`] is a pure element with the shape shared by every simulator element (STYLE.md
//! example 9): [`Link::process`] takes a datagram and the current time and hands the copies that
//! will come out of the far end, each with its arrival time, to a sink the caller owns. Nothing in
//! here reads a clock, so the same model runs in virtual time ([`crate::Simulation`]) or against a
//! real clock (an emulator that sleeps until each arrival time).
//!
//! The arrival time is computed when the datagram is offered, not when it leaves the queue: a
//! FIFO rate limiter's departure times are fully determined by what entered before, so one event
//! per datagram is enough and the simulator never has to poll the link. The queue is still
//! tracked (packets that have not finished serialization) for drop-tail decisions, the
//! [`Link::queued_bytes`] accessor and the optional queue-length trace.
//!
//! Knobs are small and orthogonal (STYLE.md example 11): each probability is independent of the
//! others and of the rate and delay, and every random draw comes from the link's own seeded
//! [`ChaCha8Rng`], so adding a link to a topology never changes the draws of the links already
//! there.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use tern_proto::router::{Router, RouterConfig, RouterStats};

use crate::sim::Datagram;

/// How a link loses datagrams on the wire (after the queue: a lost datagram still used its share
/// of the link's capacity, as on a radio link).
#[derive(Clone, Debug, PartialEq, Default)]
#[non_exhaustive]
pub enum LossModel {
    /// No loss.
    #[default]
    None,
    /// Each datagram is lost independently with this probability (`0.0..=1.0`).
    Random(f64),
    /// Two-state Markov chain (Gilbert–Elliott): bursty loss as seen on wireless links.
    ///
    /// Before each datagram the chain moves (good → bad with `p_good_to_bad`, bad → good with
    /// `p_bad_to_good`), then the datagram is lost with the probability of the new state. The
    /// long-run loss rate is [`LossModel::mean_loss`].
    GilbertElliott {
        /// Probability, per datagram, of moving from the good state to the bad one.
        p_good_to_bad: f64,
        /// Probability, per datagram, of moving from the bad state back to the good one.
        /// The mean burst (bad-state sojourn) length is `1 / p_bad_to_good` datagrams.
        p_bad_to_good: f64,
        /// Loss probability while in the good state (often 0).
        loss_in_good: f64,
        /// Loss probability while in the bad state (often 1).
        loss_in_bad: f64,
    },
}

impl LossModel {
    /// A Gilbert–Elliott model with the given long-run loss rate whose losses come in bursts of
    /// `mean_burst` datagrams on average (no loss in the good state, total loss in the bad one).
    ///
    /// This is the usual way to say "2 % loss, bursty" without solving the chain by hand.
    /// `mean_burst` below 1 is treated as 1; `mean_loss` is clamped to `0.0..1.0`.
    pub fn bursty(mean_loss: f64, mean_burst: f64) -> Self {
        let m = mean_loss.clamp(0.0, 0.999_999);
        let p_bad_to_good = 1.0 / mean_burst.max(1.0);
        // Stationary P(bad) = p_gb / (p_gb + p_bg) = m  =>  p_gb = p_bg * m / (1 - m).
        let p_good_to_bad = (p_bad_to_good * m / (1.0 - m)).min(1.0);
        LossModel::GilbertElliott {
            p_good_to_bad,
            p_bad_to_good,
            loss_in_good: 0.0,
            loss_in_bad: 1.0,
        }
    }

    /// The long-run (stationary) fraction of datagrams this model loses.
    ///
    /// For Gilbert–Elliott: `π_bad = p_gb / (p_gb + p_bg)` and the mean is
    /// `(1 − π_bad)·loss_in_good + π_bad·loss_in_bad`. A chain that never moves (both transition
    /// probabilities 0) stays in the good state, where it starts.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Random(p) => p.clamp(0.0, 1.0),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_in_good,
                loss_in_bad,
            } => {
                let total = p_good_to_bad + p_bad_to_good;
                let pi_bad = if total > 0.0 {
                    p_good_to_bad / total
                } else {
                    0.0
                };
                (1.0 - pi_bad) * loss_in_good.clamp(0.0, 1.0) + pi_bad * loss_in_bad.clamp(0.0, 1.0)
            }
        }
    }
}

/// A scheduled outage: the link is dark during `[at, at + duration)` and, when `every` is set,
/// again during `[at + k·every, at + k·every + duration)` for every `k ≥ 1`. Times count from
/// the link's epoch (the simulation's start, or the emulator's).
///
/// While dark the link is a blackhole, like a radio path that has gone away: a datagram offered
/// while dark is dropped before the queue (it uses no capacity), and a datagram that finishes
/// serialization while dark is dropped on the wire (it did use its capacity). Both count as
/// [`DropReason::Outage`]. A datagram that left the transmitter before the outage still
/// arrives. Unlike [`Link::set_up`], an outage is part of the configuration, so the same
/// settings darken the same windows in the simulator and in the emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Outage {
    /// Start of the first dark window, from the link's epoch.
    pub at: Duration,
    /// Length of each dark window.
    pub duration: Duration,
    /// Period of the dark windows, from one start to the next; `None` (or zero): once.
    /// A period not longer than `duration` leaves the link dark from `at` on.
    pub every: Option<Duration>,
}

impl Outage {
    /// One dark window `[at, at + duration)`.
    pub fn once(at: Duration, duration: Duration) -> Self {
        Self {
            at,
            duration,
            every: None,
        }
    }

    /// Dark windows of `duration` starting at `at`, `at + every`, `at + 2·every`, …
    pub fn periodic(at: Duration, duration: Duration, every: Duration) -> Self {
        Self {
            at,
            duration,
            every: Some(every),
        }
    }

    /// Whether the link is dark at `since_epoch`.
    pub fn is_dark(&self, since_epoch: Duration) -> bool {
        let Some(into) = since_epoch.checked_sub(self.at) else {
            return false;
        };
        match self.every {
            Some(every) if !every.is_zero() => {
                let phase = into.as_nanos() % every.as_nanos();
                phase < self.duration.as_nanos()
            }
            _ => into < self.duration,
        }
    }
}

/// A fade: a two-state (good/bad) model in *time*. The link stays good for an exponentially
/// distributed time of mean `mean_good`, then bad for an exponential time of mean `mean_bad`,
/// and so on; a datagram that goes onto the wire in the bad state is lost with probability
/// `loss_in_bad` (counted as [`DropReason::Loss`]). It composes with the [`LossModel`], which
/// still applies in both states.
///
/// Unlike the per-datagram [`LossModel::GilbertElliott`] chain, the state changes with time
/// whether or not datagrams flow: a sparse flow's datagrams (a handshake's retransmissions,
/// spaced by timeouts) do not all fall into one burst when the bad periods are shorter than
/// their spacing. The timeline starts good at the link's epoch and is drawn from a generator of
/// its own, derived from the link's seed, so it depends on the seed and the clock only, not on
/// the traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Fade {
    /// Mean sojourn in the good state. Zero: always bad.
    pub mean_good: Duration,
    /// Mean sojourn in the bad state. Zero: never bad (no fades).
    pub mean_bad: Duration,
    /// Loss probability in the bad state (`0.0..=1.0`).
    pub loss_in_bad: f64,
}

impl Fade {
    /// Fades of mean length `mean_bad` every `mean_good + mean_bad` on average, losing every
    /// datagram while they last.
    pub fn new(mean_good: Duration, mean_bad: Duration) -> Self {
        Self {
            mean_good,
            mean_bad,
            loss_in_bad: 1.0,
        }
    }

    /// Sets the loss probability in the bad state.
    #[must_use]
    pub fn with_loss_in_bad(mut self, probability: f64) -> Self {
        self.loss_in_bad = probability;
        self
    }

    /// The long-run fraction of time spent in the bad state: `mean_bad / (mean_good + mean_bad)`.
    pub fn bad_fraction(&self) -> f64 {
        let (good, bad) = (self.mean_good.as_secs_f64(), self.mean_bad.as_secs_f64());
        if bad <= 0.0 {
            0.0
        } else {
            bad / (good + bad)
        }
    }

    /// The long-run fraction of datagrams lost to fades (whatever their spacing).
    pub fn mean_loss(&self) -> f64 {
        self.bad_fraction() * self.loss_in_bad.clamp(0.0, 1.0)
    }
}

/// Everything that shapes one direction of a link. Fields are public so a test can change one
/// knob mid-run through [`Link::config_mut`]; presets and `with_*` methods cover the usual cases.
///
/// Probabilities are in `0.0..=1.0`; values outside behave as the nearest bound (never panic).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LinkConfig {
    /// Serialization rate in bits per second; `None` is infinitely fast (no queue ever forms).
    /// `Some(0)` carries nothing: every datagram is dropped as a queue overflow.
    pub rate_bps: Option<u64>,
    /// One-way propagation delay added after serialization.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per datagram. It never reorders: a datagram
    /// is held back until the one before it has arrived (unless that one was picked for
    /// reordering), which slightly raises the mean delay under heavy jitter, as on real links
    /// whose variable delay comes from queues, not from overtaking.
    pub jitter: Duration,
    /// Probability that a datagram gets `reorder_delay` extra and is exempt from the in-order
    /// rule, so later datagrams may overtake it.
    pub reorder: f64,
    /// Extra delay for datagrams picked by `reorder`.
    pub reorder_delay: Duration,
    /// How datagrams are lost on the wire.
    pub loss: LossModel,
    /// Probability that a datagram is delivered twice (the copy arrives right after the original
    /// and is never corrupted; it does not use link capacity).
    pub duplicate: f64,
    /// Probability that one random bit of one random byte of the datagram is flipped.
    pub corrupt: f64,
    /// Drop-tail limit, in bytes, on datagrams that have entered the link but not finished
    /// serialization (including the one being sent). So the queueing delay never exceeds
    /// `queue_limit_bytes * 8 / rate_bps`. A datagram that would push the backlog past the
    /// limit is dropped; the limit should therefore be at least one MTU. Ignored when
    /// `rate_bps` is `None`.
    pub queue_limit_bytes: usize,
    /// Largest datagram payload (UDP payload bytes) the link carries; larger ones are dropped
    /// and counted, which is how the protocol's path-MTU discovery is exercised.
    pub mtu: usize,
    /// ECN marking (a step AQM, DCTCP's `K`): an ECN-capable datagram that finds at least
    /// this many bytes queued is marked CE instead of waiting for the queue to overflow.
    /// `None`: the link never marks. Ignored when `rate_bps` is `None`.
    pub ecn_mark_bytes: Option<usize>,
    /// A middlebox that rewrites every datagram's ECN bits to this value: `0` bleaches them
    /// (Not-ECT), `0b01` turns ECT(0) into ECT(1). Applied before marking.
    pub ecn_rewrite: Option<u8>,
    /// Scheduled dark windows (see [`Outage`]); `None`: never dark.
    pub outage: Option<Outage>,
    /// Time-based good/bad loss (see [`Fade`]); `None`: no fades.
    pub fade: Option<Fade>,
    /// An F12 router at the entrance of the queue (DESIGN.md F12, PROTOCOL.md §13): every
    /// datagram that reaches the queue is offered to [`tern_proto::router::Router`], which
    /// counts it as load and lowers the Feedback Rate of tern packets that carry one. The
    /// router's capacity is the link's `rate_bps` (its `capacity_bps` is ignored), kept in
    /// step when the rate changes. `None`, or a link without a rate limit: no router.
    pub router: Option<RouterConfig>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self::ideal()
    }
}

/// Queue depth used by the presets, expressed as time at the link rate.
fn queue_for(rate_bps: u64, time: Duration) -> usize {
    let bytes = u128::from(rate_bps) * time.as_nanos() / 8 / 1_000_000_000;
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .max(DEFAULT_MTU)
}

/// The MTU of the presets: a UDP payload that fits a 1500-byte Ethernet frame over IPv4.
pub const DEFAULT_MTU: usize = 1472;

impl LinkConfig {
    /// No rate limit, no delay, no impairment, any datagram size up to 64 KiB.
    pub fn ideal() -> Self {
        Self {
            rate_bps: None,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            loss: LossModel::None,
            duplicate: 0.0,
            corrupt: 0.0,
            queue_limit_bytes: usize::MAX,
            mtu: 65_535,
            ecn_mark_bytes: None,
            ecn_rewrite: None,
            outage: None,
            fade: None,
            router: None,
        }
    }

    /// A clean link of the given rate and one-way delay with a queue of one bandwidth-delay
    /// product of the round trip (`rate × 2·delay`, at least one MTU), the classic rule for
    /// sizing a bottleneck buffer, and an Ethernet-sized MTU ([`DEFAULT_MTU`]).
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        Self {
            rate_bps: Some(rate_bps),
            delay,
            queue_limit_bytes: queue_for(rate_bps, delay * 2),
            mtu: DEFAULT_MTU,
            ..Self::ideal()
        }
    }

    /// DESIGN.md §3 `5g`: 15 ms RTT, 3–5 ms jitter, ~300 Mbit/s (downlink figures; use it for
    /// both directions unless the test cares about asymmetry).
    ///
    /// Per direction: jitter up to 2 ms (so a round trip varies by up to 4 ms) and a base delay
    /// of 6.5 ms, so the *mean* RTT is 15 ms. Queue: 50 ms at the link rate.
    pub fn fiveg() -> Self {
        Self::profile(300_000_000, 15, 2_000, 50)
    }

    /// DESIGN.md §3 `lte`: 35 ms RTT, 1–2.5 ms jitter, ~30 Mbit/s.
    ///
    /// Per direction: jitter up to 1 ms, base delay 17 ms (mean RTT 35 ms). Queue: 100 ms at
    /// the link rate (cellular buffers are deep).
    pub fn lte() -> Self {
        Self::profile(30_000_000, 35, 1_000, 100)
    }

    /// DESIGN.md §3 `wifi`: 5 ms RTT, 0.3–0.8 ms jitter. DESIGN.md gives no rate; 100 Mbit/s
    /// is assumed here.
    ///
    /// Per direction: jitter up to 0.4 ms, base delay 2.3 ms (mean RTT 5 ms). Queue: 20 ms.
    pub fn wifi() -> Self {
        Self::profile(100_000_000, 5, 400, 20)
    }

    /// DESIGN.md §3 `viscous`: 50 Mbit/s with the given round-trip time (16–320 ms in the
    /// Viscous experiments), no jitter, one-BDP queue.
    pub fn viscous(rtt: Duration) -> Self {
        Self::new(50_000_000, rtt / 2)
    }

    /// DESIGN.md §3 `ncvdn`: the 1 Mbit/s bottleneck with 140 ms RTT of the NC-TCP fairness
    /// experiments, one-BDP queue.
    pub fn ncvdn() -> Self {
        Self::new(1_000_000, Duration::from_millis(70))
    }

    /// Shared body of the jittery presets: the base delay is chosen so that the mean round trip
    /// over two such directions (each adding `jitter/2` on average) equals `rtt_ms`.
    fn profile(rate_bps: u64, rtt_ms: u64, jitter_us: u64, queue_ms: u64) -> Self {
        let jitter = Duration::from_micros(jitter_us);
        let delay = Duration::from_millis(rtt_ms) / 2 - jitter / 2;
        Self {
            rate_bps: Some(rate_bps),
            delay,
            jitter,
            queue_limit_bytes: queue_for(rate_bps, Duration::from_millis(queue_ms)),
            mtu: DEFAULT_MTU,
            ..Self::ideal()
        }
    }

    /// Sets the rate (`None` = unlimited).
    #[must_use]
    pub fn with_rate(mut self, rate_bps: Option<u64>) -> Self {
        self.rate_bps = rate_bps;
        self
    }

    /// Sets the one-way propagation delay.
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the order-preserving jitter.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the reordering probability and the extra delay of reordered datagrams.
    #[must_use]
    pub fn with_reorder(mut self, probability: f64, extra_delay: Duration) -> Self {
        self.reorder = probability;
        self.reorder_delay = extra_delay;
        self
    }

    /// Sets the loss model.
    #[must_use]
    pub fn with_loss(mut self, loss: LossModel) -> Self {
        self.loss = loss;
        self
    }

    /// Sets the duplication probability.
    #[must_use]
    pub fn with_duplicate(mut self, probability: f64) -> Self {
        self.duplicate = probability;
        self
    }

    /// Sets the corruption probability.
    #[must_use]
    pub fn with_corrupt(mut self, probability: f64) -> Self {
        self.corrupt = probability;
        self
    }

    /// Sets the drop-tail limit in bytes.
    #[must_use]
    pub fn with_queue_limit(mut self, bytes: usize) -> Self {
        self.queue_limit_bytes = bytes;
        self
    }

    /// Sets the drop-tail limit to `time` worth of bytes at the link rate (at least one MTU).
    /// Has no effect on an unlimited-rate link.
    #[must_use]
    pub fn with_queue_time(mut self, time: Duration) -> Self {
        if let Some(rate) = self.rate_bps {
            self.queue_limit_bytes = queue_for(rate, time);
        }
        self
    }

    /// Marks ECN-capable datagrams CE once `threshold_bytes` are queued (see
    /// [`LinkConfig::ecn_mark_bytes`]).
    #[must_use]
    pub fn with_ecn_marking(mut self, threshold_bytes: usize) -> Self {
        self.ecn_mark_bytes = Some(threshold_bytes);
        self
    }

    /// Rewrites every datagram's ECN bits to `bits` (see [`LinkConfig::ecn_rewrite`]).
    #[must_use]
    pub fn with_ecn_rewrite(mut self, bits: u8) -> Self {
        self.ecn_rewrite = Some(bits & 0b11);
        self
    }

    /// Sets the MTU (largest datagram payload carried).
    #[must_use]
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu;
        self
    }

    /// Darkens the link on a schedule (see [`Outage`]).
    #[must_use]
    pub fn with_outage(mut self, outage: Outage) -> Self {
        self.outage = Some(outage);
        self
    }

    /// Adds time-based fades (see [`Fade`]).
    #[must_use]
    pub fn with_fade(mut self, fade: Fade) -> Self {
        self.fade = Some(fade);
        self
    }

    /// Runs an F12 router on the link (see [`LinkConfig::router`]).
    #[must_use]
    pub fn with_router(mut self, router: RouterConfig) -> Self {
        self.router = Some(router);
        self
    }
}

/// Why a link dropped a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Larger than [`LinkConfig::mtu`].
    Mtu,
    /// The drop-tail queue was full.
    Queue,
    /// Lost on the wire by the [`LossModel`].
    Loss,
    /// The link was down ([`Link::set_up`]).
    Down,
    /// The link was dark: a scheduled [`Outage`].
    Outage,
}

/// What [`Link::process`] did with a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// One copy was handed to the sink.
    Delivered,
    /// Two copies were handed to the sink.
    Duplicated,
    /// Nothing was handed to the sink.
    Dropped(DropReason),
}

/// Per-link counters, printed in the simulation summary.
///
/// Invariant: `sent == delivered − duplicated + dropped_mtu + dropped_queue + dropped_loss +
/// dropped_down + dropped_outage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkStats {
    /// Datagrams offered to the link.
    pub sent: u64,
    /// Datagrams handed on for delivery, duplicates included.
    pub delivered: u64,
    /// Dropped because the drop-tail queue was full.
    pub dropped_queue: u64,
    /// Lost on the wire (the loss model and fades).
    pub dropped_loss: u64,
    /// Dropped for exceeding the MTU.
    pub dropped_mtu: u64,
    /// Dropped because the link was down.
    pub dropped_down: u64,
    /// Dropped because the link was dark (a scheduled [`Outage`]).
    pub dropped_outage: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
    /// Payload bytes handed on for delivery, duplicates included.
    pub bytes: u64,
    /// Datagrams marked CE by the link's AQM.
    pub ce_marked: u64,
    /// Datagrams whose Feedback Rate the link's router lowered (see [`Link::router_stats`]).
    pub rate_stamped: u64,
    /// Datagrams accepted into the queue of a rate-limited link.
    pub queued: u64,
    /// Their total queueing delay, nanoseconds: for each, the time from its arrival until its
    /// serialization started (what it waited behind others, not its own serialization).
    pub queue_wait_nanos: u64,
    /// The longest of those waits, nanoseconds.
    pub max_queue_wait_nanos: u64,
}

impl LinkStats {
    /// Mean queueing delay of the datagrams accepted between `earlier` (a snapshot of these
    /// counters) and now; zero when none were.
    pub fn mean_queue_wait_since(&self, earlier: &LinkStats) -> Duration {
        let n = self.queued.saturating_sub(earlier.queued);
        let total = self
            .queue_wait_nanos
            .saturating_sub(earlier.queue_wait_nanos);
        Duration::from_nanos(total.checked_div(n).unwrap_or(0))
    }

    /// All drops, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue
            + self.dropped_loss
            + self.dropped_mtu
            + self.dropped_down
            + self.dropped_outage
    }
}

impl fmt::Display for LinkStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {} delivered {} ({} B) dropped queue/loss/mtu/down/outage {}/{}/{}/{}/{} dup {} corrupt {} ce {} rate-stamped {}",
            self.sent,
            self.delivered,
            self.bytes,
            self.dropped_queue,
            self.dropped_loss,
            self.dropped_mtu,
            self.dropped_down,
            self.dropped_outage,
            self.duplicated,
            self.corrupted,
            self.ce_marked,
            self.rate_stamped
        )
    }
}

/// `true` with probability `p`. A draw is taken only when `p > 0`, so switching a knob off
/// costs nothing; `p >= 1` is always true because `random::<f64>()` is in `[0, 1)`.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    p > 0.0 && rng.random::<f64>() < p
}

/// An exponentially distributed duration of mean `mean_secs` (> 0).
fn exponential(rng: &mut ChaCha8Rng, mean_secs: f64) -> Duration {
    // 1 − u is in (0, 1], so the logarithm is finite and ≤ 0.
    let u: f64 = rng.random();
    Duration::try_from_secs_f64(-mean_secs * (1.0 - u).ln()).unwrap_or(Duration::MAX)
}

/// The fade timeline catches up with the clock one sojourn at a time; after this many in one
/// call (a long idle gap, or tiny means) it jumps instead (see [`Link::fade_is_bad`]).
const MAX_FADE_STEPS: u32 = 10_000;

/// Mixed into the link's key to derive the fade timeline's generator, so that the timeline
/// neither consumes nor shares the link's own draws.
const FADE_KEY: &[u8; 32] = b"tern-sim link fade timeline v1.0";

/// One direction of a link. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Link {
    config: LinkConfig,
    rng: ChaCha8Rng,
    /// Origin of the queue trace's time axis.
    epoch: Instant,
    up: bool,
    /// When the transmitter finishes the last accepted datagram.
    busy_until: Option<Instant>,
    /// Sub-nanosecond remainder of serialization times, in units of `1/rate` ns, so that a long
    /// busy period loses no time to rounding (rate accuracy is tested to well under 1 %).
    carry: u128,
    /// Datagrams accepted but not finished serializing: (departure, size), in departure order.
    backlog: VecDeque<(Instant, usize)>,
    backlog_bytes: usize,
    /// Arrival time of the last datagram bound by the in-order rule.
    last_arrival: Option<Instant>,
    /// Gilbert–Elliott state.
    in_bad_state: bool,
    /// The fade timeline's own generator (derived from the link's seed).
    fade_rng: ChaCha8Rng,
    /// Fade state, valid until `fade_until` (time since epoch); `None`: the timeline has not
    /// started.
    fade_bad: bool,
    fade_until: Option<Duration>,
    stats: LinkStats,
    queue_trace: Option<Vec<(Duration, usize)>>,
    /// The F12 router, built from [`LinkConfig::router`] when the first datagram reaches the
    /// queue (so that its first interval starts then).
    router: Option<Router>,
}

impl Link {
    /// A link whose random draws come from `ChaCha8Rng::seed_from_u64(seed)`.
    ///
    /// `epoch` is the origin of the queue trace's time axis (the simulation's epoch, or the
    /// emulator's start time).
    pub fn new(config: LinkConfig, seed: u64, epoch: Instant) -> Self {
        Self::with_rng(config, ChaCha8Rng::seed_from_u64(seed), epoch)
    }

    /// A link drawing from the given generator (the simulator passes one stream per link).
    pub fn with_rng(config: LinkConfig, rng: ChaCha8Rng, epoch: Instant) -> Self {
        let mut key = rng.get_seed();
        for (k, m) in key.iter_mut().zip(FADE_KEY) {
            *k ^= m;
        }
        let mut fade_rng = ChaCha8Rng::from_seed(key);
        fade_rng.set_stream(rng.get_stream());
        Self {
            config,
            rng,
            epoch,
            up: true,
            busy_until: None,
            carry: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            last_arrival: None,
            in_bad_state: false,
            fade_rng,
            fade_bad: false,
            fade_until: None,
            stats: LinkStats::default(),
            queue_trace: None,
            router: None,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Changes the configuration from now on. Datagrams already accepted keep the arrival time
    /// they were given (a rate change does not re-time the queue).
    pub fn config_mut(&mut self) -> &mut LinkConfig {
        &mut self.config
    }

    /// Replaces the configuration; see [`Link::config_mut`].
    pub fn set_config(&mut self, config: LinkConfig) {
        self.config = config;
    }

    /// Takes the link down (every datagram offered is dropped and counted as `dropped_down`) or
    /// brings it back up. Datagrams already accepted still arrive, as if they were past the
    /// point of failure.
    pub fn set_up(&mut self, up: bool) {
        self.up = up;
    }

    /// Whether the link carries traffic.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Whether a scheduled [`Outage`] darkens the link at `now`.
    pub fn in_outage(&self, now: Instant) -> bool {
        self.config
            .outage
            .is_some_and(|o| o.is_dark(now.saturating_duration_since(self.epoch)))
    }

    /// Whether the [`Fade`] timeline is in its bad state at `now` (`false` without a fade).
    ///
    /// The timeline is drawn lazily as time is asked about, so ask in time order: a time before
    /// the last one asked about gets the state of the current sojourn.
    pub fn fade_is_bad(&mut self, now: Instant) -> bool {
        let Some(fade) = self.config.fade else {
            return false;
        };
        let (good, bad) = (fade.mean_good.as_secs_f64(), fade.mean_bad.as_secs_f64());
        if bad <= 0.0 {
            return false;
        }
        if good <= 0.0 {
            return true;
        }
        let t = now.saturating_duration_since(self.epoch);
        let mut until = match self.fade_until {
            Some(until) => until,
            None => {
                self.fade_bad = false;
                exponential(&mut self.fade_rng, good)
            }
        };
        let mut steps = 0;
        while until <= t {
            if steps == MAX_FADE_STEPS {
                // Far behind: draw the state at `t` from the chain's transition probability over
                // the gap, then a fresh sojourn (exact in distribution: sojourns are memoryless).
                // At `until` the state flips to `!fade_bad`, a fresh sojourn starting there.
                let gap = (t - until).as_secs_f64();
                let pi_bad = fade.bad_fraction();
                let from_bad = if self.fade_bad { 0.0 } else { 1.0 };
                let decay = (-(1.0 / good + 1.0 / bad) * gap).exp();
                let p_bad = pi_bad + (from_bad - pi_bad) * decay;
                self.fade_bad = self.fade_rng.random::<f64>() < p_bad;
                let mean = if self.fade_bad { bad } else { good };
                until = t.saturating_add(exponential(&mut self.fade_rng, mean));
                break;
            }
            self.fade_bad = !self.fade_bad;
            let mean = if self.fade_bad { bad } else { good };
            until = until.saturating_add(exponential(&mut self.fade_rng, mean));
            steps += 1;
        }
        self.fade_until = Some(until);
        self.fade_bad
    }

    /// Counters so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// The F12 router's state and counters, if the link runs one and it has seen a datagram.
    pub fn router_stats(&self) -> Option<RouterStats> {
        self.router.as_ref().map(Router::stats)
    }

    /// The F12 router itself (per-flow rates, for tests), under the same conditions.
    pub fn router(&self) -> Option<&Router> {
        self.router.as_ref()
    }

    /// Offers `data` to the router, if the configuration asks for one, at `now` with the
    /// current backlog: built on first use, dropped when the configuration removes it, and its
    /// capacity kept equal to the link's rate.
    fn route(&mut self, now: Instant, rate: u64, data: &mut [u8]) {
        let Some(config) = &self.config.router else {
            self.router = None;
            return;
        };
        let router = self
            .router
            .get_or_insert_with(|| Router::new(config.clone().with_capacity(rate), now));
        if router.config().capacity_bps != rate {
            router.set_capacity(rate, now);
        }
        router.tick(now, self.backlog_bytes);
        router.set_wait(
            self.busy_until
                .map_or(Duration::ZERO, |busy| busy.saturating_duration_since(now)),
        );
        if matches!(
            router.on_datagram(now, data),
            tern_proto::router::Stamp::Lowered { .. }
        ) {
            self.stats.rate_stamped += 1;
        }
    }

    /// Starts (or stops and discards) recording the queue length on every enqueue and dequeue.
    pub fn set_queue_trace(&mut self, enabled: bool) {
        self.queue_trace = enabled.then(Vec::new);
    }

    /// Recorded `(time since epoch, bytes not yet departed)` points, in time order. Dequeues
    /// are recorded lazily (on the next call that passes their time), so call
    /// [`Link::queued_bytes`] with the current time first to bring the trace up to date; the
    /// simulator does this at the end of every run.
    pub fn queue_trace(&self) -> &[(Duration, usize)] {
        self.queue_trace.as_deref().unwrap_or(&[])
    }

    /// Bytes accepted but not finished serializing at `now` (the drop-tail backlog).
    pub fn queued_bytes(&mut self, now: Instant) -> usize {
        self.drain_backlog(now);
        self.backlog_bytes
    }

    /// Forgets datagrams that have finished serializing by `now`.
    fn drain_backlog(&mut self, now: Instant) {
        while let Some(&(departure, size)) = self.backlog.front() {
            if departure > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= size;
            if let Some(trace) = &mut self.queue_trace {
                trace.push((
                    departure.saturating_duration_since(self.epoch),
                    self.backlog_bytes,
                ));
            }
        }
    }

    /// Serialization time of `size` bytes at `rate` bps, carrying the sub-ns remainder.
    fn serialization(&mut self, size: usize, rate: u64, continuing: bool) -> Duration {
        if !continuing {
            self.carry = 0;
        }
        let numerator = size as u128 * 8 * 1_000_000_000 + self.carry;
        let rate = u128::from(rate);
        self.carry = numerator % rate;
        Duration::from_nanos(u64::try_from(numerator / rate).unwrap_or(u64::MAX))
    }

    /// Whether the loss model drops the next datagram.
    fn lose(&mut self) -> bool {
        match self.config.loss {
            LossModel::None => false,
            LossModel::Random(p) => chance(&mut self.rng, p),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_in_good,
                loss_in_bad,
            } => {
                let flip = if self.in_bad_state {
                    p_bad_to_good
                } else {
                    p_good_to_bad
                };
                if chance(&mut self.rng, flip) {
                    self.in_bad_state = !self.in_bad_state;
                }
                let p = if self.in_bad_state {
                    loss_in_bad
                } else {
                    loss_in_good
                };
                chance(&mut self.rng, p)
            }
        }
    }

    /// Offers `dgram` to the link at `now` and passes each copy that will reach the far end to
    /// `deliver` with its arrival time (zero, one or two calls). Arrival times are never before
    /// `now`.
    ///
    /// Order of the stages: MTU check, outage (dark at `now`: dropped before the queue),
    /// drop-tail queue and serialization, outage again (dark when serialization ends: dropped
    /// on the wire), loss model, fade (in the bad state when serialization ends), duplication,
    /// corruption, propagation delay plus jitter (in order) or plus reorder delay.
    pub fn process(
        &mut self,
        mut dgram: Datagram,
        now: Instant,
        mut deliver: impl FnMut(Instant, Datagram),
    ) -> Verdict {
        self.stats.sent += 1;
        self.drain_backlog(now);
        let size = dgram.data.len();
        if !self.up {
            return self.drop(DropReason::Down);
        }
        if size > self.config.mtu {
            return self.drop(DropReason::Mtu);
        }
        if self.in_outage(now) {
            return self.drop(DropReason::Outage);
        }
        if let Some(bits) = self.config.ecn_rewrite {
            dgram.ecn = bits;
        }
        let departure = match self.config.rate_bps {
            None => now,
            Some(0) => return self.drop(DropReason::Queue),
            Some(rate) => {
                // The router sees every datagram that reaches the queue, including the ones
                // the queue then drops: they are offered load all the same.
                self.route(now, rate, &mut dgram.data);
                if self.backlog_bytes.saturating_add(size) > self.config.queue_limit_bytes {
                    return self.drop(DropReason::Queue);
                }
                let ect = dgram.ecn == 0b10 || dgram.ecn == 0b01;
                if ect
                    && self
                        .config
                        .ecn_mark_bytes
                        .is_some_and(|k| self.backlog_bytes >= k)
                {
                    dgram.ecn = 0b11;
                    self.stats.ce_marked += 1;
                }
                let (start, continuing) = match self.busy_until {
                    Some(busy) if busy >= now => (busy, true),
                    _ => (now, false),
                };
                let departure = start + self.serialization(size, rate, continuing);
                let wait = u64::try_from(start.saturating_duration_since(now).as_nanos())
                    .unwrap_or(u64::MAX);
                self.stats.queued += 1;
                self.stats.queue_wait_nanos = self.stats.queue_wait_nanos.saturating_add(wait);
                self.stats.max_queue_wait_nanos = self.stats.max_queue_wait_nanos.max(wait);
                self.busy_until = Some(departure);
                self.backlog.push_back((departure, size));
                self.backlog_bytes += size;
                if let Some(trace) = &mut self.queue_trace {
                    trace.push((
                        now.saturating_duration_since(self.epoch),
                        self.backlog_bytes,
                    ));
                }
                departure
            }
        };
        if departure != now && self.in_outage(departure) {
            return self.drop(DropReason::Outage);
        }
        if self.lose() {
            return self.drop(DropReason::Loss);
        }
        if let Some(fade) = self.config.fade {
            if self.fade_is_bad(departure) && chance(&mut self.rng, fade.loss_in_bad) {
                return self.drop(DropReason::Loss);
            }
        }
        // The copy is taken before corruption: a duplicate is the sender's datagram seen twice.
        let copy = chance(&mut self.rng, self.config.duplicate).then(|| dgram.clone());
        if !dgram.data.is_empty() && chance(&mut self.rng, self.config.corrupt) {
            let byte = self.rng.random_range(0..dgram.data.len());
            let bit = self.rng.random_range(0..8u32);
            dgram.data[byte] ^= 1 << bit;
            self.stats.corrupted += 1;
        }
        let mut arrival = departure + self.config.delay;
        if !self.config.jitter.is_zero() {
            let max = u64::try_from(self.config.jitter.as_nanos()).unwrap_or(u64::MAX);
            arrival += Duration::from_nanos(self.rng.random_range(0..=max));
        }
        if chance(&mut self.rng, self.config.reorder) {
            arrival += self.config.reorder_delay;
        } else {
            if let Some(last) = self.last_arrival {
                arrival = arrival.max(last);
            }
            self.last_arrival = Some(arrival);
        }
        self.stats.delivered += 1;
        self.stats.bytes += size as u64;
        deliver(arrival, dgram);
        match copy {
            Some(copy) => {
                self.stats.delivered += 1;
                self.stats.duplicated += 1;
                self.stats.bytes += size as u64;
                deliver(arrival, copy);
                Verdict::Duplicated
            }
            None => Verdict::Delivered,
        }
    }

    fn drop(&mut self, reason: DropReason) -> Verdict {
        let counter = match reason {
            DropReason::Mtu => &mut self.stats.dropped_mtu,
            DropReason::Queue => &mut self.stats.dropped_queue,
            DropReason::Loss => &mut self.stats.dropped_loss,
            DropReason::Down => &mut self.stats.dropped_down,
            DropReason::Outage => &mut self.stats.dropped_outage,
        };
        *counter += 1;
        Verdict::Dropped(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};

    /// An arbitrary time origin: links only ever use differences from it.
    #[allow(clippy::disallowed_methods)]
    fn origin() -> Instant {
        Instant::now()
    }

    fn dgram(seq: u64, size: usize) -> Datagram {
        let mut data = vec![0u8; size.max(8)];
        data[..8].copy_from_slice(&seq.to_be_bytes());
        data.truncate(size.max(8));
        Datagram {
            src: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 1)),
            dst: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 2), 2)),
            data,
            ecn: 0,
        }
    }

    #[test]
    fn ecn_capable_datagrams_are_marked_once_the_queue_passes_the_threshold() {
        let epoch = origin();
        // 8 Mbit/s: a 1000-byte datagram takes 1 ms; mark from 2500 queued bytes.
        let cfg = LinkConfig::new(8_000_000, Duration::from_millis(5))
            .with_queue_limit(100_000)
            .with_ecn_marking(2_500);
        let mut link = Link::new(cfg, 1, epoch);
        let mut got = Vec::new();
        for seq in 0..6 {
            let ecn = if seq == 4 { 0 } else { 0b10 };
            link.process(dgram(seq, 1000).with_ecn(ecn), epoch, |_, d| {
                got.push(d.ecn)
            });
        }
        // Queued before each: 0, 1000, 2000, 3000, 4000 (not ECT: never marked), 5000.
        assert_eq!(got, vec![0b10, 0b10, 0b10, 0b11, 0, 0b11]);
        assert_eq!(link.stats().ce_marked, 2);
        assert_eq!(
            link.stats().dropped(),
            0,
            "marking replaces dropping, not adds to it"
        );
    }

    #[test]
    fn an_ecn_rewriting_middlebox_bleaches_or_mangles_every_datagram() {
        let epoch = origin();
        for (bits, want) in [(0u8, 0u8), (0b01, 0b01)] {
            let mut link = Link::new(LinkConfig::ideal().with_ecn_rewrite(bits), 1, epoch);
            let mut got = None;
            link.process(dgram(0, 100).with_ecn(0b10), epoch, |_, d| {
                got = Some(d.ecn)
            });
            assert_eq!(got, Some(want));
        }
    }

    fn seq_of(d: &Datagram) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.data[..8]);
        u64::from_be_bytes(b)
    }

    /// Offers `n` datagrams of `size` bytes, one every `gap`, and returns what came out.
    fn run(
        link: &mut Link,
        epoch: Instant,
        n: u64,
        size: usize,
        gap: Duration,
    ) -> Vec<(Instant, Datagram)> {
        let mut out = Vec::new();
        for i in 0..n {
            let now = epoch + gap * u32::try_from(i).unwrap();
            link.process(dgram(i, size), now, |at, d| out.push((at, d)));
        }
        out
    }

    /// The verdict of one `size`-byte datagram offered at each `epoch + i·gap`.
    fn verdicts(link: &mut Link, epoch: Instant, n: u64, gap: Duration) -> Vec<Verdict> {
        (0..n)
            .map(|i| {
                let now = epoch + gap * u32::try_from(i).unwrap();
                link.process(dgram(i, 100), now, |_, _| {})
            })
            .collect()
    }

    #[test]
    fn outage_drops_exactly_the_datagrams_inside_its_window() {
        let epoch = origin();
        let outage = Outage::once(Duration::from_secs(3), Duration::from_secs(2));
        let mut link = Link::new(
            LinkConfig::ideal()
                .with_delay(Duration::from_millis(20))
                .with_outage(outage),
            1,
            epoch,
        );
        // One datagram every millisecond for 10 s: 3000..5000 fall in [3 s, 5 s).
        let v = verdicts(&mut link, epoch, 10_000, Duration::from_millis(1));
        for (i, verdict) in v.iter().enumerate() {
            let expect = if (3_000..5_000).contains(&i) {
                Verdict::Dropped(DropReason::Outage)
            } else {
                Verdict::Delivered
            };
            assert_eq!(*verdict, expect, "datagram {i} at {i} ms");
        }
        let s = *link.stats();
        assert_eq!(
            (s.dropped_outage, s.delivered, s.dropped()),
            (2_000, 8_000, 2_000)
        );
        assert!(!link.in_outage(epoch + Duration::from_nanos(2_999_999_999)));
        assert!(link.in_outage(epoch + Duration::from_secs(3)));
        assert!(link.in_outage(epoch + Duration::from_nanos(4_999_999_999)));
        assert!(!link.in_outage(epoch + Duration::from_secs(5)));
        assert!(s
            .to_string()
            .contains("queue/loss/mtu/down/outage 0/0/0/0/2000"));
    }

    #[test]
    fn periodic_outage_recurs() {
        let epoch = origin();
        let outage = Outage::periodic(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(1),
        );
        let mut link = Link::new(LinkConfig::ideal().with_outage(outage), 1, epoch);
        // Every 10 ms for 10.5 s: windows [k, k + 0.2 s) for k = 1..=10, 20 datagrams each.
        let v = verdicts(&mut link, epoch, 1_050, Duration::from_millis(10));
        for (i, verdict) in v.iter().enumerate() {
            let ms = i * 10;
            let dark = ms >= 1_000 && ms % 1_000 < 200;
            assert_eq!(
                *verdict == Verdict::Dropped(DropReason::Outage),
                dark,
                "datagram at {ms} ms"
            );
        }
        assert_eq!(link.stats().dropped_outage, 10 * 20);
        // A period not longer than the window: dark from `at` on.
        let solid = Outage::periodic(
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert!(!solid.is_dark(Duration::from_millis(999)));
        assert!((1..100).all(|k| solid.is_dark(Duration::from_millis(997 * k + 3))));
        // A zero period means once.
        let once = Outage::periodic(Duration::ZERO, Duration::from_secs(1), Duration::ZERO);
        assert!(once.is_dark(Duration::ZERO) && !once.is_dark(Duration::from_secs(2)));
    }

    #[test]
    fn outage_drops_before_the_queue_and_on_the_wire() {
        let epoch = origin();
        let ms = Duration::from_millis;
        // 1 Mbit/s: 1250 B take 10 ms. Dark during [25 ms, 125 ms).
        let cfg = LinkConfig::new(1_000_000, ms(5))
            .with_queue_limit(usize::MAX)
            .with_outage(Outage::once(ms(25), ms(100)));
        let mut link = Link::new(cfg, 1, epoch);
        let mut arrivals = Vec::new();
        let mut offer = |link: &mut Link, seq: u64, at: Duration| {
            link.process(dgram(seq, 1250), epoch + at, |t, _| {
                arrivals.push((seq, t - epoch))
            })
        };
        // Five at once finish serializing at 10, 20, 30, 40, 50 ms: the last three on a dark
        // wire, after using their capacity.
        let v: Vec<Verdict> = (0..5)
            .map(|i| offer(&mut link, i, Duration::ZERO))
            .collect();
        let wire = Verdict::Dropped(DropReason::Outage);
        assert_eq!(
            v,
            [Verdict::Delivered, Verdict::Delivered, wire, wire, wire]
        );
        assert_eq!(link.queued_bytes(epoch + ms(45)), 1250);
        // Offered while dark: dropped before the queue, so it takes no capacity.
        assert_eq!(offer(&mut link, 5, ms(60)), wire);
        assert_eq!(link.queued_bytes(epoch + ms(60)), 0);
        // After the outage the transmitter is idle: 10 ms of serialization, 5 ms of delay.
        assert_eq!(offer(&mut link, 6, ms(125)), Verdict::Delivered);
        assert_eq!(arrivals, [(0, ms(15)), (1, ms(25)), (6, ms(140))]);
        assert_eq!(link.stats().dropped_outage, 4);
    }

    #[test]
    fn fade_time_in_bad_state_and_loss_rate_match_the_means() {
        let epoch = origin();
        let ms = Duration::from_millis;
        let fade = Fade::new(ms(200), ms(20)).with_loss_in_bad(0.5);
        assert!((fade.bad_fraction() - 20.0 / 220.0).abs() < 1e-12);
        assert!((fade.mean_loss() - 10.0 / 220.0).abs() < 1e-12);
        let mut link = Link::new(
            LinkConfig::ideal().with_fade(fade),
            crate::seed_from_env(21),
            epoch,
        );
        // The timeline, sampled every millisecond for 2000 s (about 9000 fades).
        let n = 2_000_000u32;
        let states: Vec<bool> = (0..n)
            .map(|i| link.fade_is_bad(epoch + ms(1) * i))
            .collect();
        let bad = states.iter().filter(|&&b| b).count() as f64 / f64::from(n);
        assert!(
            (bad - fade.bad_fraction()).abs() < 0.1 * fade.bad_fraction(),
            "bad {bad}, configured {}",
            fade.bad_fraction()
        );
        // Mean sojourns, from the runs of equal samples (1 ms resolution).
        let mut runs = [Vec::new(), Vec::new()];
        let mut len = 0u32;
        for w in states.windows(2) {
            len += 1;
            if w[0] != w[1] {
                runs[usize::from(w[0])].push(len);
                len = 0;
            }
        }
        let mean = |r: &Vec<u32>| f64::from(r.iter().sum::<u32>()) / r.len() as f64;
        let (good_ms, bad_ms) = (mean(&runs[0]), mean(&runs[1]));
        assert!(runs[1].len() > 8_000, "{} fades", runs[1].len());
        assert!((good_ms - 200.0).abs() < 20.0, "mean good {good_ms} ms");
        assert!((bad_ms - 20.0).abs() < 2.0, "mean bad {bad_ms} ms");

        // Loss: a datagram every 5 ms on a link with the same seed and fade.
        let mut link = Link::new(
            LinkConfig::ideal().with_fade(fade),
            crate::seed_from_env(21),
            epoch,
        );
        let count = 400_000u64;
        verdicts(&mut link, epoch, count, ms(5));
        let s = *link.stats();
        let rate = s.dropped_loss as f64 / count as f64;
        assert_eq!(s.delivered + s.dropped_loss, count);
        assert!(
            (rate - fade.mean_loss()).abs() < 0.1 * fade.mean_loss(),
            "loss {rate}, configured {}",
            fade.mean_loss()
        );
    }

    #[test]
    fn fade_losses_of_a_sparse_train_are_not_clustered() {
        let epoch = origin();
        let ms = Duration::from_millis;
        // A datagram every 100 ms; fades of 10 ms on average, 5 % of the time.
        let fade = Fade::new(ms(190), ms(10));
        let lost = |loss: LossModel, fade: Option<Fade>| -> Vec<bool> {
            let mut cfg = LinkConfig::ideal().with_loss(loss);
            cfg.fade = fade;
            let mut link = Link::new(cfg, crate::seed_from_env(23), epoch);
            verdicts(&mut link, epoch, 200_000, ms(100))
                .into_iter()
                .map(|v| v == Verdict::Dropped(DropReason::Loss))
                .collect()
        };
        let stats = |lost: &[bool]| {
            let rate = lost.iter().filter(|&&l| l).count() as f64 / lost.len() as f64;
            let after = lost.windows(2).filter(|w| w[0]).count() as f64;
            let both = lost.windows(2).filter(|w| w[0] && w[1]).count() as f64;
            (rate, both / after)
        };
        let (rate, conditional) = stats(&lost(LossModel::None, Some(fade)));
        assert!((rate - 0.05).abs() < 0.005, "fade loss {rate}");
        // With fades much shorter than the spacing, a loss says (almost) nothing about the next
        // datagram: P(loss | loss) ≈ P(loss) = π_bad.
        assert!(
            (conditional - rate).abs() < 0.015,
            "fade: P(loss|loss) {conditional}, P(loss) {rate}"
        );
        // The per-datagram chain with the same mean loss puts them in bursts.
        let (ge_rate, ge_conditional) = stats(&lost(LossModel::bursty(0.05, 3.0), None));
        assert!((ge_rate - 0.05).abs() < 0.005, "GE loss {ge_rate}");
        assert!(
            ge_conditional > 10.0 * ge_rate,
            "GE: P(loss|loss) {ge_conditional}, P(loss) {ge_rate}"
        );
    }

    #[test]
    fn fade_timeline_depends_on_seed_and_time_not_traffic() {
        let epoch = origin();
        let ms = Duration::from_millis;
        let cfg = LinkConfig::ideal().with_fade(Fade::new(ms(50), ms(20)));
        let mut dense = Link::new(cfg.clone(), 5, epoch);
        let mut sparse = Link::new(cfg.clone(), 5, epoch);
        let mut other = Link::new(cfg, 6, epoch);
        let mut differ = 0;
        for i in 0..100_000u32 {
            let dense_bad = dense.fade_is_bad(epoch + ms(1) * i);
            if i % 97 == 0 {
                let t = epoch + ms(1) * i;
                assert_eq!(sparse.fade_is_bad(t), dense_bad, "at {i} ms");
                differ += usize::from(other.fade_is_bad(t) != dense_bad);
            }
        }
        assert!(
            differ > 100,
            "another seed draws another timeline ({differ})"
        );
        // Tiny means and a long gap: the timeline jumps instead of walking every sojourn, and
        // still spends the right share of time in the bad state.
        let us = Duration::from_micros;
        let mut link = Link::new(
            LinkConfig::ideal().with_fade(Fade::new(us(3), us(1))),
            7,
            epoch,
        );
        let n = 4_000u32;
        let bad = (0..n)
            .filter(|&i| link.fade_is_bad(epoch + Duration::from_secs(1) * i))
            .count() as f64
            / f64::from(n);
        assert!((bad - 0.25).abs() < 0.03, "bad {bad}");
        // Degenerate means: zero bad time never fades, zero good time always does.
        let mut never = Link::new(
            LinkConfig::ideal().with_fade(Fade::new(ms(1), ms(0))),
            1,
            epoch,
        );
        let mut always = Link::new(
            LinkConfig::ideal().with_fade(Fade::new(ms(0), ms(1))),
            1,
            epoch,
        );
        assert!(!never.fade_is_bad(epoch + ms(5)));
        assert!(always.fade_is_bad(epoch + ms(5)));
    }

    #[test]
    fn serialization_spaces_departures_exactly() {
        let epoch = origin();
        // 10 Mbit/s, 1250 B = 10_000 bits = 1 ms each.
        let mut link = Link::new(
            LinkConfig::new(10_000_000, Duration::from_millis(5)),
            1,
            epoch,
        );
        let out = run(&mut link, epoch, 10, 1250, Duration::ZERO);
        for (i, (at, d)) in out.iter().enumerate() {
            assert_eq!(seq_of(d), i as u64);
            let expect = Duration::from_millis(5) + Duration::from_millis(i as u64 + 1);
            assert_eq!(*at - epoch, expect);
        }
    }

    #[test]
    fn serialization_carries_sub_nanosecond_remainders() {
        let epoch = origin();
        // 3 bits per 1 ns is not an integer: 1000 B = 8000 bits = 2666.67 ns each.
        let mut link = Link::new(LinkConfig::ideal().with_rate(Some(3_000_000_000)), 1, epoch);
        let out = run(&mut link, epoch, 3000, 1000, Duration::ZERO);
        // 3000 * 8000 bits / 3e9 bps = exactly 8 ms.
        assert_eq!(out.last().unwrap().0 - epoch, Duration::from_millis(8));
    }

    #[test]
    fn idle_link_adds_only_delay() {
        let epoch = origin();
        let mut link = Link::new(
            LinkConfig::ideal().with_delay(Duration::from_millis(7)),
            1,
            epoch,
        );
        let out = run(&mut link, epoch, 5, 100, Duration::from_millis(1));
        for (i, (at, _)) in out.iter().enumerate() {
            assert_eq!(*at - epoch, Duration::from_millis(7 + i as u64));
        }
    }

    #[test]
    fn random_loss_matches_probability() {
        let epoch = origin();
        let p = 0.05;
        let mut link = Link::new(
            LinkConfig::ideal().with_loss(LossModel::Random(p)),
            crate::seed_from_env(7),
            epoch,
        );
        let n = 100_000;
        let out = run(&mut link, epoch, n, 100, Duration::from_micros(1));
        let lost = link.stats().dropped_loss;
        assert_eq!(out.len() as u64 + lost, n);
        let rate = lost as f64 / n as f64;
        // Binomial standard deviation is 0.0007; 0.004 is more than five of them.
        assert!((rate - p).abs() < 0.004, "loss rate {rate}, configured {p}");
    }

    #[test]
    fn gilbert_elliott_matches_stationary_mean_and_is_bursty() {
        let epoch = origin();
        let model = LossModel::GilbertElliott {
            p_good_to_bad: 0.01,
            p_bad_to_good: 0.2,
            loss_in_good: 0.001,
            loss_in_bad: 0.8,
        };
        let expect = model.mean_loss();
        assert!((expect - (0.2 / 0.21 * 0.001 + 0.01 / 0.21 * 0.8)).abs() < 1e-12);
        let mut link = Link::new(
            LinkConfig::ideal().with_loss(model),
            crate::seed_from_env(11),
            epoch,
        );
        let n: u64 = 400_000;
        let mut lost = Vec::with_capacity(n as usize);
        for i in 0..n {
            let v = link.process(dgram(i, 16), epoch, |_, _| {});
            lost.push(v == Verdict::Dropped(DropReason::Loss));
        }
        let rate = lost.iter().filter(|&&l| l).count() as f64 / n as f64;
        assert!(
            (rate - expect).abs() < 0.1 * expect,
            "GE loss {rate}, stationary {expect}"
        );
        // Bursty: a loss is much more likely right after a loss than on average.
        let pairs = lost.windows(2).filter(|w| w[0]).count() as f64;
        let both = lost.windows(2).filter(|w| w[0] && w[1]).count() as f64;
        let conditional = both / pairs;
        assert!(
            conditional > 5.0 * rate,
            "P(loss|loss) {conditional} vs mean {rate}"
        );
    }

    #[test]
    fn bursty_helper_hits_requested_mean() {
        let m = LossModel::bursty(0.02, 4.0);
        assert!((m.mean_loss() - 0.02).abs() < 1e-12);
        assert_eq!(LossModel::None.mean_loss(), 0.0);
        assert_eq!(LossModel::Random(1.5).mean_loss(), 1.0);
    }

    #[test]
    fn jitter_without_reorder_preserves_order() {
        let epoch = origin();
        let cfg = LinkConfig::new(50_000_000, Duration::from_millis(10))
            .with_jitter(Duration::from_millis(5))
            .with_queue_limit(usize::MAX);
        let mut link = Link::new(cfg, crate::seed_from_env(3), epoch);
        let out = run(&mut link, epoch, 20_000, 1200, Duration::from_micros(300));
        assert_eq!(out.len(), 20_000);
        for (i, w) in out.windows(2).enumerate() {
            assert!(w[0].0 <= w[1].0, "arrival times go backwards at {i}");
            assert_eq!(seq_of(&w[0].1) + 1, seq_of(&w[1].1));
        }
        // The jitter is really there: one-way delays spread over most of the 5 ms (not all of
        // it: the in-order rule lifts a low draw that follows a high one).
        let delays: Vec<Duration> = out
            .iter()
            .map(|(at, d)| *at - (epoch + Duration::from_micros(300) * seq_of(d) as u32))
            .collect();
        let min = delays.iter().min().unwrap();
        let max = delays.iter().max().unwrap();
        assert!(
            *max - *min > Duration::from_millis(3),
            "spread {:?}",
            *max - *min
        );
    }

    #[test]
    fn reorder_option_reorders() {
        let epoch = origin();
        let cfg = LinkConfig::ideal()
            .with_delay(Duration::from_millis(10))
            .with_reorder(0.1, Duration::from_millis(3));
        let mut link = Link::new(cfg, crate::seed_from_env(5), epoch);
        let mut out = run(&mut link, epoch, 10_000, 100, Duration::from_micros(100));
        // The simulator delivers by (arrival, insertion order); a stable sort does the same.
        out.sort_by_key(|(at, _)| *at);
        let inversions = out
            .windows(2)
            .filter(|w| seq_of(&w[0].1) > seq_of(&w[1].1))
            .count();
        // Each reordered datagram is overtaken by the ~30 sent during its extra 3 ms, which
        // shows up as one inversion where it finally lands.
        assert!((800..1200).contains(&inversions), "{inversions} inversions");
    }

    #[test]
    fn duplicate_and_corrupt_are_counted_and_shaped() {
        let epoch = origin();
        let cfg = LinkConfig::ideal().with_duplicate(0.1).with_corrupt(0.2);
        let mut link = Link::new(cfg, crate::seed_from_env(9), epoch);
        let n = 50_000u64;
        let mut out = Vec::new();
        let mut flipped_seen = 0;
        for i in 0..n {
            let original = dgram(i, 64);
            let v = link.process(original.clone(), epoch, |_, d| out.push(d));
            let got = &out[out.len() - if v == Verdict::Duplicated { 2 } else { 1 }..];
            for d in got {
                let flipped: u32 = d
                    .data
                    .iter()
                    .zip(&original.data)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                assert!(flipped <= 1, "more than one bit flipped");
                flipped_seen += u64::from(flipped);
            }
            if v == Verdict::Duplicated {
                // The duplicate is the pristine datagram.
                assert_eq!(got[1], original);
            }
        }
        let s = *link.stats();
        assert_eq!(s.delivered, n + s.duplicated);
        let dup = s.duplicated as f64 / n as f64;
        let cor = s.corrupted as f64 / n as f64;
        assert!((dup - 0.1).abs() < 0.01, "dup {dup}");
        assert!((cor - 0.2).abs() < 0.01, "corrupt {cor}");
        // Every datagram counted as corrupted arrived with exactly one bit flipped.
        assert_eq!(flipped_seen, s.corrupted);
    }

    #[test]
    fn drop_tail_respects_limit() {
        let epoch = origin();
        let cfg = LinkConfig::new(10_000_000, Duration::from_millis(1)).with_queue_limit(10_000);
        let mut link = Link::new(cfg, 1, epoch);
        link.set_queue_trace(true);
        // A burst of 100 × 1000 B at once: exactly 10 fit.
        let out = run(&mut link, epoch, 100, 1000, Duration::ZERO);
        assert_eq!(out.len(), 10);
        assert_eq!(link.stats().dropped_queue, 90);
        assert_eq!(link.queued_bytes(epoch), 10_000);
        // After 0.8 ms one datagram (0.8 ms each at 10 Mbit/s) has left: room for one more.
        let t = epoch + Duration::from_micros(800);
        assert_eq!(
            link.process(dgram(100, 1000), t, |_, _| {}),
            Verdict::Delivered
        );
        assert_eq!(
            link.process(dgram(101, 1000), t, |_, _| {}),
            Verdict::Dropped(DropReason::Queue)
        );
        assert_eq!(link.queued_bytes(epoch + Duration::from_secs(1)), 0);
        let trace = link.queue_trace();
        assert!(trace.iter().all(|&(_, b)| b <= 10_000));
        assert!(
            trace.windows(2).all(|w| w[0].0 <= w[1].0),
            "trace out of time order"
        );
        assert_eq!(trace.last().unwrap().1, 0);
    }

    #[test]
    fn mtu_and_down_drop_and_count() {
        let epoch = origin();
        let mut link = Link::new(LinkConfig::ideal().with_mtu(1200), 1, epoch);
        assert_eq!(
            link.process(dgram(0, 1201), epoch, |_, _| {}),
            Verdict::Dropped(DropReason::Mtu)
        );
        assert_eq!(
            link.process(dgram(1, 1200), epoch, |_, _| {}),
            Verdict::Delivered
        );
        link.set_up(false);
        assert_eq!(
            link.process(dgram(2, 10), epoch, |_, _| {}),
            Verdict::Dropped(DropReason::Down)
        );
        let s = link.stats();
        assert_eq!(
            (s.sent, s.delivered, s.dropped_mtu, s.dropped_down),
            (3, 1, 1, 1)
        );
    }

    #[test]
    fn zero_rate_carries_nothing() {
        let epoch = origin();
        let mut link = Link::new(LinkConfig::ideal().with_rate(Some(0)), 1, epoch);
        assert_eq!(
            link.process(dgram(0, 10), epoch, |_, _| {}),
            Verdict::Dropped(DropReason::Queue)
        );
    }

    #[test]
    fn presets_follow_design_profiles() {
        let rtt = |c: &LinkConfig| c.delay * 2 + c.jitter;
        assert_eq!(rtt(&LinkConfig::fiveg()), Duration::from_millis(15));
        assert_eq!(rtt(&LinkConfig::lte()), Duration::from_millis(35));
        assert_eq!(rtt(&LinkConfig::wifi()), Duration::from_millis(5));
        assert_eq!(LinkConfig::lte().rate_bps, Some(30_000_000));
        assert_eq!(LinkConfig::fiveg().rate_bps, Some(300_000_000));
        // 30 Mbit/s × 100 ms = 375 kB.
        assert_eq!(LinkConfig::lte().queue_limit_bytes, 375_000);
        // One BDP of the round trip: 1 Mbit/s × 140 ms = 17.5 kB.
        assert_eq!(LinkConfig::ncvdn().queue_limit_bytes, 17_500);
        assert_eq!(
            LinkConfig::viscous(Duration::from_millis(16)).delay,
            Duration::from_millis(8)
        );
        assert_eq!(LinkConfig::default(), LinkConfig::ideal());
    }

    #[test]
    fn separate_seeds_draw_independently() {
        let epoch = origin();
        let cfg = LinkConfig::ideal().with_loss(LossModel::Random(0.5));
        let mut a = Link::new(cfg.clone(), 1, epoch);
        let mut b = Link::new(cfg.clone(), 2, epoch);
        let mut a2 = Link::new(cfg, 1, epoch);
        let va: Vec<Verdict> = (0..256)
            .map(|i| a.process(dgram(i, 10), epoch, |_, _| {}))
            .collect();
        let vb: Vec<Verdict> = (0..256)
            .map(|i| b.process(dgram(i, 10), epoch, |_, _| {}))
            .collect();
        let va2: Vec<Verdict> = (0..256)
            .map(|i| a2.process(dgram(i, 10), epoch, |_, _| {}))
            .collect();
        assert_eq!(va, va2);
        assert_ne!(va, vb);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            /// Whatever the knobs: counters add up, arrivals are never before the offer time,
            /// order holds without reordering, and the backlog never exceeds the limit.
            #[test]
            fn invariants_hold(
                seed: u64,
                rate in prop::option::of(100_000u64..1_000_000_000),
                delay_us in 0u64..50_000,
                jitter_us in 0u64..20_000,
                reorder in prop::sample::select(vec![0.0, 0.0, 0.2]),
                loss in 0.0f64..0.5,
                burst in prop::bool::ANY,
                duplicate in 0.0f64..0.3,
                corrupt in 0.0f64..0.3,
                limit in 1_500usize..200_000,
                dark in prop::bool::ANY,
                fading in prop::bool::ANY,
                packets in prop::collection::vec((0u64..2_000, 1usize..1_600), 1..400),
            ) {
                let epoch = origin();
                let cfg = LinkConfig {
                    rate_bps: rate,
                    delay: Duration::from_micros(delay_us),
                    jitter: Duration::from_micros(jitter_us),
                    reorder,
                    reorder_delay: Duration::from_millis(2),
                    loss: if burst { LossModel::bursty(loss, 3.0) } else { LossModel::Random(loss) },
                    duplicate,
                    corrupt,
                    queue_limit_bytes: limit,
                    mtu: 1_500,
                    ecn_mark_bytes: None,
                    ecn_rewrite: None,
                    outage: dark.then(|| Outage::periodic(
                        Duration::from_millis(20),
                        Duration::from_millis(10),
                        Duration::from_millis(50),
                    )),
                    fade: fading.then(|| Fade::new(Duration::from_millis(30), Duration::from_millis(5))),
                    router: None,
                };
                let mut link = Link::new(cfg, seed, epoch);
                link.set_queue_trace(true);
                let mut now = epoch;
                let mut last_in_order: Option<Instant> = None;
                for (i, (gap_us, size)) in packets.iter().enumerate() {
                    now += Duration::from_micros(*gap_us);
                    let mut arrivals = Vec::new();
                    link.process(dgram(i as u64, *size), now, |at, d| arrivals.push((at, d)));
                    for (at, _) in &arrivals {
                        prop_assert!(*at >= now);
                    }
                    if reorder == 0.0 {
                        if let Some((at, _)) = arrivals.first() {
                            if let Some(last) = last_in_order {
                                prop_assert!(*at >= last);
                            }
                            last_in_order = Some(*at);
                        }
                    }
                }
                let s = *link.stats();
                prop_assert_eq!(s.sent, s.delivered - s.duplicated + s.dropped());
                prop_assert_eq!(s.sent, packets.len() as u64);
                link.queued_bytes(now + Duration::from_secs(3600));
                for &(_, b) in link.queue_trace() {
                    prop_assert!(b <= limit);
                }
            }
        }
    }

    /// A tern short-header datagram of `size` bytes for DCID `cid` with a rate area.
    fn rated(cid: u8, expected_kbps: u32, size: usize) -> Vec<u8> {
        use tern_proto::wire::{ConnectionId, RateArea, ShortHeader, NO_RATE_LIMIT};
        let header = ShortHeader::new(
            ConnectionId::new(&[cid; 8]).unwrap(),
            0,
            false,
            7,
            None,
            Some(RateArea {
                expected_kbps,
                feedback_kbps: NO_RATE_LIMIT,
            }),
        );
        let mut data = Vec::new();
        header.encode(&mut data);
        data.resize(size, 0x5a);
        data
    }

    #[test]
    fn a_routed_link_tells_the_router_the_wait() {
        use tern_proto::router::RouterConfig;
        use tern_proto::wire::read_feedback_rate;
        let epoch = origin();
        let cfg = LinkConfig::new(1_000_000, Duration::from_millis(10))
            .with_queue_limit(1_000_000)
            .with_router(RouterConfig::new(1_000_000));
        let mut link = Link::new(cfg, 1, epoch);
        let mut out = Vec::new();
        for _ in 0..2 {
            let d = Datagram {
                data: rated(1, u32::MAX, 1200),
                ..dgram(0, 8)
            };
            link.process(d, epoch, |_, d| out.push(d.data));
        }
        // The first finds the wire free: α·C. The second waits the first's 9.6 ms:
        // 980 · (1 − 0.25 · 9.6 / 100), rounded down.
        let rates: Vec<_> = out
            .iter()
            .map(|d| read_feedback_rate(d, 8).unwrap())
            .collect();
        assert_eq!(rates, vec![980, 956]);
    }

    #[test]
    fn a_routed_link_lowers_feedback_rates_and_leaves_other_datagrams_alone() {
        use tern_proto::router::RouterConfig;
        use tern_proto::wire::read_feedback_rate;
        let epoch = origin();
        // 1 Mbit/s; the router's own capacity setting is replaced by the link's rate. The
        // datagrams below are offered back to back, so each waits behind the one before:
        // the phase term is off to read the plain shares (`a_routed_link_tells_the_router_the_wait`).
        let cfg = LinkConfig::new(1_000_000, Duration::from_millis(10))
            .with_queue_limit(1_000_000)
            .with_router(RouterConfig::new(123).with_phase_gain(0.0));
        let mut link = Link::new(cfg, 1, epoch);
        assert!(link.router_stats().is_none(), "built on first use");
        let mut out = Vec::new();
        fn offer(link: &mut Link, data: Vec<u8>, at: Instant, out: &mut Vec<Vec<u8>>) {
            let d = Datagram {
                data,
                ..dgram(0, 8)
            };
            link.process(d, at, |_, d| out.push(d.data));
        }
        // Two flows, one expecting 200 kbit/s (weight 0.2), one unset (weight 1), then plain
        // bytes that only count as load.
        offer(&mut link, rated(1, u32::MAX, 1200), epoch, &mut out);
        offer(&mut link, rated(2, 200, 1200), epoch, &mut out);
        let plain = vec![0x80; 1200];
        offer(&mut link, plain.clone(), epoch, &mut out);
        let first = read_feedback_rate(&out[0], 8).unwrap();
        let second = read_feedback_rate(&out[1], 8).unwrap();
        assert_eq!(first, 980, "α·C for the first flow");
        assert_eq!(second, 163, "0.2 · α·C / 1.2 for the second");
        assert_eq!(out[2], plain, "non-tern payload untouched");
        let s = link.router_stats().unwrap();
        assert_eq!(
            (s.capacity_bps, s.datagrams, s.rated, s.stamped, s.flows),
            (1_000_000, 3, 2, 2, 2)
        );
        assert_eq!(link.stats().rate_stamped, 2);
        assert!(link.stats().to_string().contains("rate-stamped 2"));
        // A rate change reaches the router.
        link.config_mut().rate_bps = Some(500_000);
        offer(
            &mut link,
            rated(1, u32::MAX, 1200),
            epoch + Duration::from_millis(5),
            &mut out,
        );
        assert_eq!(link.router_stats().unwrap().capacity_bps, 500_000);
        // An unrouted link leaves the field alone.
        let mut bare = Link::new(LinkConfig::new(1_000_000, Duration::ZERO), 1, epoch);
        let mut got = Vec::new();
        bare.process(
            Datagram {
                data: rated(1, u32::MAX, 1200),
                ..dgram(0, 8)
            },
            epoch,
            |_, d| got.push(d.data),
        );
        assert_eq!(read_feedback_rate(&got[0], 8), Some(u32::MAX));
        assert!(bare.router_stats().is_none());
    }

    #[test]
    fn routed_link_converges_paced_flows_to_equal_shares() {
        // Three senders pacing at the rate stamped on their packets one RTT (100 ms) earlier,
        // through a 1 Mbit/s routed link: each ends near α·C/3.
        use tern_proto::router::RouterConfig;
        use tern_proto::wire::read_feedback_rate;
        let epoch = origin();
        let cfg = LinkConfig::new(1_000_000, Duration::from_millis(20))
            .with_queue_limit(100_000)
            .with_router(RouterConfig::default());
        let mut link = Link::new(cfg, 3, epoch);
        let mut rate = [200_000.0f64; 3];
        let mut next = [
            Duration::ZERO,
            Duration::from_millis(3),
            Duration::from_millis(7),
        ];
        let mut echoes: VecDeque<(Duration, usize, u32)> = VecDeque::new();
        let mut bytes = [0u64; 3];
        let end = Duration::from_secs(20);
        loop {
            let (i, t) = next
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|&(_, t)| t)
                .unwrap();
            if t >= end {
                break;
            }
            while echoes.front().is_some_and(|e| e.0 <= t) {
                let (_, f, k) = echoes.pop_front().unwrap();
                rate[f] = f64::from(k) * 1000.0;
            }
            let d = Datagram {
                data: rated(i as u8 + 1, u32::MAX, 1200),
                ..dgram(0, 8)
            };
            link.process(d, epoch + t, |at, d| {
                let k = read_feedback_rate(&d.data, 8).unwrap();
                echoes.push_back((at - epoch + Duration::from_millis(80), i, k));
                if t >= Duration::from_secs(10) {
                    bytes[i] += d.data.len() as u64;
                }
            });
            next[i] = t + Duration::from_secs_f64(9600.0 / rate[i]);
        }
        for b in bytes {
            let bps = b as f64 * 8.0 / 10.0;
            assert!((bps / 326_667.0 - 1.0).abs() < 0.05, "{bps}");
        }
        let s = link.router_stats().unwrap();
        assert!(
            (s.rate_per_weight_bps / 326_667.0 - 1.0).abs() < 0.05,
            "{s}"
        );
        assert_eq!(link.stats().dropped_queue, 0);
    }
}
