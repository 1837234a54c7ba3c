//! The shared shell of loss-based controllers (STYLE example 6, neqo's
//! `ClassicCongestionControl<T: WindowAdjustment>`).
//!
//! [`Classic`] implements everything NewReno and CUBIC have in common, once: slow start, the
//! slow-start threshold, the recovery period (one reduction per round trip), persistent
//! congestion, app-limited handling, spurious-loss undo, pacing gains and tern's random-loss
//! tolerance. A [`WindowAdjustment`] supplies only the two rules that differ: how the window
//! grows in congestion avoidance and how it shrinks on a congestion event. Applications can
//! write their own loss-based controller by implementing [`WindowAdjustment`] and wrapping it in
//! [`Classic`].
//!
//! # Random-loss tolerance (a tern design decision)
//!
//! **Why.** On the links tern is built for (DESIGN.md: vehicles, phones on 5G/LTE/Wi-Fi, IoT
//! radios) packets are lost to radio errors and handovers, not only to queue overflow. A
//! classic controller reads every loss as congestion, so its window follows the loss rate, not
//! the link: at 1 % random loss on a 50 Mbit/s, 40 ms path (a bandwidth-delay product of about
//! 170 datagrams) Reno averages about 1.22/√p ≈ 12 datagrams, and CUBIC, which sits in its
//! Reno-friendly region at that loss rate (RFC 9438 §5.1, table 1), does no better: under a
//! tenth of the link. TCP Veno (Fu & Liew, 2003) and Westwood showed the way out: use the RTT to
//! tell the two kinds of loss apart.
//!
//! **Rule.** A loss is a congestion signal (the window is reduced and slow start ends) only if
//! at least one of these holds:
//! 1. **a queue is standing**: the queueing delay estimate `smoothed_rtt - min_rtt -
//!    allowance` is at least `max(min_rtt / 8, 2 ms)`, where the jitter allowance is the larger
//!    of `2 × rttvar` and the RTT spread (highest less lowest sample) over the last
//!    [`SPREAD_ROUNDS`] rounds spent wholly in congestion avoidance (the spread counting for at
//!    most `min_rtt / 2`). If the bottleneck queue holds more than an eighth of the base RTT,
//!    backing off mostly drains that queue and costs little utilisation, and the queue is the
//!    evidence that we (or a competitor) overfilled the link;
//! 2. **losses are frequent**: the recent loss ratio (an EWMA over datagrams of lost / (acked +
//!    lost), see [`LOSS_RATIO_GAIN`]) exceeds [`ClassicConfig::loss_ratio_threshold`] (10 % by
//!    default). Random loss on a usable radio link is rarer than that (messages with deadlines
//!    must keep their rate at 5 % random loss); overflow of a shallow buffer or
//!    a policer is not;
//! 3. **persistent congestion** (RFC 9002 §7.6): nothing got through for several PTOs;
//! 4. **no RTT sample yet**: without a minimum RTT there is no queue estimate, so be classic.
//!
//! Otherwise the loss is counted in [`Metrics::non_congestive_losses`] and the window is left
//! alone (the lost data is still retransmitted; loss recovery is not affected).
//!
//! **Why the smoothed RTT, not the latest sample.** The rule asks whether a queue is
//! *standing*, i.e. has persisted for a while. The smoothed RTT filters the jitter of radio
//! links (3–5 ms on the `5g` profile, a third of its 15 ms RTT), which would otherwise make
//! many random losses look congestive, and it has ACK delay removed. Its lag (an EWMA
//! with gain 1/8 per ACK, so a handful of ACKs, a fraction of a round trip at any useful rate)
//! does not matter for a drop-tail queue, which fills over many round trips before it
//! overflows.
//!
//! **Why minus 2 × rttvar.** Jitter also raises the *average* RTT above the minimum (the
//! minimum catches the luckiest sample), by about half the jitter, and more when a radio link
//! delivers in order so that one delayed packet holds up the next. That excess is not a queue
//! we built, and backing off does not remove it. It comes with a large RTT variation, while a
//! drop-tail queue grows over many round trips and barely moves `rttvar`. In the link
//! simulation in `cc/tests.rs` (CUBIC, 50 Mbit/s, 1 % random loss, in-order jitter), the
//! allowance lifts utilisation from 65 % to 88 % of the link at 15 ms RTT with 2 ms of jitter
//! and from 59 % to 84 % at 40 ms with 5 ms, and leaves every drop-tail result (no random loss)
//! identical to classic CUBIC's. Set [`JITTER_ALLOWANCE`] to 0 for the plain estimate.
//!
//! **Why the spread.** When the acknowledgements are delayed in order too (tern-netem's
//! `jitter` applies to both directions, and a radio uplink schedules ACKs as it does data),
//! the delay swings smoothly: each packet waits behind the one before, consecutive samples
//! differ little, and `rttvar` stays small while the smoothed RTT sits milliseconds above the
//! minimum. Over a few round trips, though, the samples range over the jitter. So the
//! allowance is also the spread (highest less lowest RTT sample, ACK delay removed) of the
//! last [`SPREAD_ROUNDS`] rounds taken together. Not each round's own spread, which it was
//! until 2026-11-28: on tern-netem's `5g` profile the delay's level wanders over several
//! round trips (samples of 13–27 ms within 300 ms), so one round's spread missed part of the
//! swing, and CUBIC cut its window about once per 3 s at 1 % random loss and stayed near
//! 0.8 × the link (docs/BENCHMARKS.md). Rounds with slow start, a window reduction or a
//! fast-start jump in them are left out (the queue grows or drains by itself then), rounds are
//! forgotten at persistent congestion, and the spread counts for at most half the minimum RTT, so a queue
//! of `min_rtt / 2 + max(min_rtt / 8, 2 ms)` is always a congestion signal. A drop-tail queue
//! filled in congestion avoidance grows by a datagram or so per round, which hardly widens a
//! round's spread. In the same
//! simulation with the jitter on both ways, utilisation went from 15 % to 84 % (15 ms, 4 ms
//! each way), 38 % to 92 % (15 ms, 2 ms) and 17 % to 92 % (40 ms, 5 ms); the drop-tail results
//! stayed within the test's bound of classic CUBIC's loss. Taking the rounds together instead
//! of each alone raised these to 90 %, 94 % and 93 % (mean queue 1.0 → 1.2 ms, 1.2 → 1.5 ms,
//! 1.9 → 2.2 ms), with the drop-tail results unchanged.
//!
//! **Risks, and what covers them.**
//! - A shallow-buffer bottleneck or a token-bucket policer never builds a queue of
//!   `min_rtt / 8`, so rule 1 never fires there. Rule 2 bounds the damage: a window that
//!   outgrows the bottleneck by much (a slow-start overshoot) loses a large share of a flight,
//!   and the loss ratio crosses 10 % within a few dozen losses. Below that, tern keeps pushing:
//!   it may impose a loss rate of up to ~10 % on such a bottleneck, more than Reno would, a
//!   deliberate trade for lossy radio links. In the simulation (50 Mbit/s, 40 ms, a buffer of
//!   4 datagrams) tern CUBIC loses 0.9 % of its packets there against 0.06 % for classic CUBIC,
//!   for 88 % against 84 % of the link.
//! - Competing with loss-based flows in a shared drop-tail queue: that queue stands, so rule 1
//!   makes tern exactly as polite as the classic algorithm.
//! - A route change that raises the base RTT makes every loss look congestive (min_rtt is
//!   stale): tern then behaves classically, the safe direction. A lower base RTT is tracked at
//!   once.
//! - Jitter larger than half the minimum RTT still defeats rule 1 in part (the spread's cap),
//!   in the safe direction.
//! - Switch it off with [`ClassicConfig::random_loss_tolerance`]`(false)` for RFC-conformant
//!   behaviour, e.g. when comparing with kernel TCP.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use tracing::{debug, trace};

use super::{Controller, Metrics, PathInfo};
use crate::recovery::rtt::RttEstimator;

/// Largest window any classic controller will report, in bytes (2^48 = 256 TiB).
///
/// Far beyond any real bandwidth-delay product, and small enough that window arithmetic in `f64`
/// (CUBIC) stays exact and products with rates and nanoseconds fit in `u128`.
pub const MAX_WINDOW: u64 = 1 << 48;

/// Weight of one datagram in the loss-ratio EWMA.
///
/// 1/256 acts like a prior of ~256 loss-free datagrams: at 1 % random loss the estimate stays
/// near 1 % and crossing the default 10 % threshold needs about 25 losses bunched within a few
/// hundred datagrams (a Poisson tail far below 10⁻⁹), while a sustained 20 % loss rate crosses
/// it after about 180 datagrams and a 50 % overflow burst after about 60.
pub const LOSS_RATIO_GAIN: f64 = 1.0 / 256.0;

/// The loss-ratio EWMA after `bytes` more were acknowledged (`lost` false) or lost, from
/// `ratio`: `bytes` counts as `bytes / mss` datagrams, and applying the per-datagram gain that
/// many times at once is `1 - (1 - g)^n`. Shared with Copa's loss backstop.
pub(crate) fn next_loss_ratio(ratio: f64, bytes: u64, mss: u64, lost: bool) -> f64 {
    if bytes == 0 {
        return ratio;
    }
    let datagrams = bytes as f64 / mss.max(1) as f64;
    let gain = 1.0 - (1.0 - LOSS_RATIO_GAIN).powf(datagrams);
    let target = if lost { 1.0 } else { 0.0 };
    let next = ratio + gain * (target - ratio);
    if next.is_finite() {
        next.clamp(0.0, 1.0)
    } else {
        target
    }
}

/// Floor of the queueing delay that counts as a standing queue (rule 1 in the module doc):
/// below a couple of milliseconds, delay differences are timer and scheduling noise.
pub const MIN_STANDING_QUEUE: Duration = Duration::from_millis(2);

/// The standing-queue threshold is `min_rtt / STANDING_QUEUE_DIVISOR` (above the floor).
pub const STANDING_QUEUE_DIVISOR: u32 = 8;

/// Multiples of the RTT variation (`rttvar`) taken off the queueing-delay estimate, so that
/// jitter is not mistaken for a standing queue (see "Why minus 2 × rttvar" in the module doc).
/// 0 gives the plain `smoothed_rtt - min_rtt` estimate.
pub const JITTER_ALLOWANCE: u32 = 2;

/// Congestion-avoidance rounds whose RTT spread (highest less lowest sample over all of them)
/// makes the other part of the jitter allowance (see "Why the spread" in the module doc).
pub const SPREAD_ROUNDS: usize = 10;

/// The RTT spread (highest less lowest sample) of recent rounds: how much a path's delay
/// swings without a queue of ours, the jitter allowance of the standing-queue tests here and
/// in [`Bbr`](super::Bbr) ("Why the spread" in the module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct RoundSpreads {
    /// Lowest and highest ACK-delay-adjusted sample of the current round.
    round: Option<(Duration, Duration)>,
    /// Something happened in this round that moves the delay by itself (slow start, a
    /// reduction, a BBR phase other than cruising): its spread is not kept.
    tainted: bool,
    /// The estimator's sample count at the last sample taken, so that an ACK frame without a
    /// new RTT sample does not count the previous one again.
    samples_seen: u64,
    /// Lowest and highest samples of the last [`SPREAD_ROUNDS`] kept rounds, newest last.
    kept: VecDeque<(Duration, Duration)>,
}

impl RoundSpreads {
    /// Takes the estimator's newest sample into the current round, if it is new.
    pub(crate) fn sample(&mut self, rtt: &RttEstimator) {
        let count = rtt.sample_count();
        if count == self.samples_seen {
            return;
        }
        self.samples_seen = count;
        let sample = rtt.latest_adjusted();
        self.round = Some(self.round.map_or((sample, sample), |(lo, hi)| {
            (lo.min(sample), hi.max(sample))
        }));
    }

    /// The current round's spread will not be kept.
    pub(crate) fn taint(&mut self) {
        self.tainted = true;
    }

    /// The round ended: keeps its spread unless it was tainted.
    pub(crate) fn end_round(&mut self) {
        let round = self.round.take();
        let tainted = std::mem::replace(&mut self.tainted, false);
        if let Some((lo, hi)) = round.filter(|_| !tainted) {
            if self.kept.len() == SPREAD_ROUNDS {
                self.kept.pop_front();
            }
            self.kept.push_back((lo, hi));
        }
    }

    /// Forgets every kept round (persistent congestion: the path may have changed).
    pub(crate) fn clear(&mut self) {
        self.round = None;
        self.kept.clear();
    }

    /// The jitter allowance: the larger of [`JITTER_ALLOWANCE`] × `rtt_var` and the spread of
    /// the kept rounds together (their highest sample less their lowest), the spread counting
    /// for at most `min_rtt / 2`.
    pub(crate) fn allowance(&self, rtt_var: Duration, min_rtt: Duration) -> Duration {
        let spread = self
            .kept
            .iter()
            .copied()
            .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
            .map_or(Duration::ZERO, |(lo, hi)| hi.saturating_sub(lo));
        rtt_var
            .saturating_mul(JITTER_ALLOWANCE)
            .max(spread.min(min_rtt / 2))
    }
}

/// Pacing gain in slow start: the window doubles every round trip, so packets must be allowed
/// to leave at twice the rate the window alone implies (Linux's `tcp_pacing_ss_ratio`, 200 %).
const SLOW_START_PACING_GAIN: (u128, u128) = (2, 1);

/// Pacing gain in congestion avoidance: a little above window / RTT, so that pacing never
/// becomes the bottleneck (1.25, as in quinn; Linux uses 1.2).
const AVOIDANCE_PACING_GAIN: (u128, u128) = (5, 4);

/// Share of a packet-pair estimate's bandwidth-delay product the window opens to (F11):
/// `window = max(window, margin × rate × min_rtt)`.
///
/// 1: a window of less than one bandwidth-delay product leaves the bottleneck idle for
/// `(1 − margin) × RTT` in every round trip until congestion avoidance has grown it back,
/// which is most of what fast start gains on a short transfer (in `tern-sim`, 1 MB at
/// 50 Mbit/s and 100 ms: 1.29× the ideal time with 1, 1.32× with 0.9). The safety is
/// elsewhere: the estimate is bounded by the connection (at most 4× the delivery rate once
/// the path left its first slow start), the slow-start threshold is set to this window, so
/// a too-high estimate is an ordinary one-time overshoot that the first losses with a queue
/// correct, and pacing at 1.25 × window / RTT spreads the first window over the round trip.
pub const FAST_START_MARGIN: (u128, u128) = (1, 1);

/// The growth and reduction rules of one loss-based algorithm, plugged into [`Classic`].
///
/// All sizes are in bytes. Implementations keep their own state (CUBIC's `W_max`, epoch) and
/// must be cheap to clone: [`Classic`] snapshots them before each reduction so that a spurious
/// congestion event can be undone (RFC 9438 §4.9).
pub trait WindowAdjustment: Clone + Send + fmt::Debug + 'static {
    /// Short lowercase name, reported by [`Controller::name`].
    fn name(&self) -> &'static str;

    /// Congestion avoidance: `bytes_acked` more bytes were acknowledged while the window was
    /// `window` and full (not app-limited, not in recovery). Returns the new window.
    fn on_avoidance_ack(
        &mut self,
        now: Instant,
        window: u64,
        bytes_acked: u64,
        max_datagram_size: u64,
        rtt: &RttEstimator,
    ) -> u64;

    /// A congestion event at window `window`. Returns the new slow-start threshold (and window),
    /// before [`Classic`] raises it to the minimum window.
    fn on_congestion(&mut self, now: Instant, window: u64, max_datagram_size: u64) -> u64;

    /// Persistent congestion collapsed the window to its minimum: forget growth state that
    /// assumed the old window.
    fn on_persistent_congestion(&mut self) {}

    /// The sender is application-limited or was idle: time-based growth must not count this
    /// period (RFC 9438 §5.8).
    fn on_app_limited(&mut self, now: Instant) {
        let _ = now;
    }
}

/// Settings shared by every [`Classic`] controller.
///
/// The defaults follow RFC 9002 §7.2 (initial window 10 datagrams, minimum 2) and turn tern's
/// random-loss tolerance on.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassicConfig {
    initial_window_packets: u32,
    minimum_window_packets: u32,
    random_loss_tolerance: bool,
    loss_ratio_threshold: f64,
}

impl Default for ClassicConfig {
    fn default() -> Self {
        Self {
            initial_window_packets: 10,
            minimum_window_packets: 2,
            random_loss_tolerance: true,
            loss_ratio_threshold: 0.10,
        }
    }
}

impl ClassicConfig {
    /// Initial window in datagrams (default 10, RFC 9002 §7.2; PaUDT found 16 better on some
    /// links, see the `initwin` benchmark). Raised to the minimum window if smaller.
    pub fn initial_window_packets(mut self, packets: u32) -> Self {
        self.initial_window_packets = packets;
        self
    }

    /// Minimum window in datagrams (default 2, RFC 9002 §7.2 `kMinimumWindow`); at least 1.
    pub fn minimum_window_packets(mut self, packets: u32) -> Self {
        self.minimum_window_packets = packets.max(1);
        self
    }

    /// Whether losses without a standing queue and at a low loss ratio are ignored (default
    /// on). See the module documentation for the rule, the reasoning and the risks.
    pub fn random_loss_tolerance(mut self, enabled: bool) -> Self {
        self.random_loss_tolerance = enabled;
        self
    }

    /// Loss ratio (0.0–1.0) above which every loss counts as congestion even without a standing
    /// queue (default 0.10). Out-of-range values are clamped; NaN keeps the current value.
    pub fn loss_ratio_threshold(mut self, ratio: f64) -> Self {
        if !ratio.is_nan() {
            self.loss_ratio_threshold = ratio.clamp(0.0, 1.0);
        }
        self
    }

    /// Initial window in datagrams.
    pub fn get_initial_window_packets(&self) -> u32 {
        self.initial_window_packets
    }

    /// Minimum window in datagrams.
    pub fn get_minimum_window_packets(&self) -> u32 {
        self.minimum_window_packets
    }

    /// Whether random-loss tolerance is on.
    pub fn get_random_loss_tolerance(&self) -> bool {
        self.random_loss_tolerance
    }

    /// The loss-ratio threshold.
    pub fn get_loss_ratio_threshold(&self) -> f64 {
        self.loss_ratio_threshold
    }
}

/// Forwards the [`ClassicConfig`] builder methods from an algorithm's config that holds one in
/// a `classic` field, so `CubicConfig::default().initial_window_packets(16)` reads naturally.
macro_rules! classic_config_builders {
    () => {
        /// Replaces the shared loss-based settings.
        pub fn classic(mut self, classic: $crate::cc::ClassicConfig) -> Self {
            self.classic = classic;
            self
        }

        /// The shared loss-based settings.
        pub fn classic_config(&self) -> &$crate::cc::ClassicConfig {
            &self.classic
        }

        /// See [`ClassicConfig::initial_window_packets`](crate::cc::ClassicConfig::initial_window_packets).
        pub fn initial_window_packets(mut self, packets: u32) -> Self {
            self.classic = self.classic.initial_window_packets(packets);
            self
        }

        /// See [`ClassicConfig::minimum_window_packets`](crate::cc::ClassicConfig::minimum_window_packets).
        pub fn minimum_window_packets(mut self, packets: u32) -> Self {
            self.classic = self.classic.minimum_window_packets(packets);
            self
        }

        /// See [`ClassicConfig::random_loss_tolerance`](crate::cc::ClassicConfig::random_loss_tolerance).
        pub fn random_loss_tolerance(mut self, enabled: bool) -> Self {
            self.classic = self.classic.random_loss_tolerance(enabled);
            self
        }

        /// See [`ClassicConfig::loss_ratio_threshold`](crate::cc::ClassicConfig::loss_ratio_threshold).
        pub fn loss_ratio_threshold(mut self, ratio: f64) -> Self {
            self.classic = self.classic.loss_ratio_threshold(ratio);
            self
        }
    };
}
pub(crate) use classic_config_builders;

/// Why a loss was taken as a congestion signal (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// Random-loss tolerance is off: every loss counts.
    Classic,
    /// No RTT sample yet, so no queue estimate.
    NoRttSample,
    /// `smoothed_rtt - min_rtt` is at or above the standing-queue threshold.
    StandingQueue,
    /// The loss-ratio EWMA is above the threshold.
    LossRatio,
    /// RFC 9002 §7.6 persistent congestion.
    Persistent,
    /// The peer reported CE marks (ECN).
    Ecn,
}

/// State saved before a reduction, restored if it turns out spurious (RFC 9438 §4.9).
#[derive(Debug, Clone)]
struct Undo<A> {
    window: u64,
    ssthresh: u64,
    recovery_start: Option<Instant>,
    adjustment: A,
}

/// A loss-based controller: the shared shell around one [`WindowAdjustment`].
///
/// See the [module documentation](self) for what the shell does and for tern's random-loss
/// tolerance.
#[derive(Debug, Clone)]
pub struct Classic<A> {
    adjustment: A,
    config: ClassicConfig,
    path_id: u32,
    /// Current maximum datagram size, at least 1.
    mss: u64,
    window: u64,
    /// `u64::MAX` while unset (RFC 9002 §7.3.1: "initially set to infinity").
    ssthresh: u64,
    initial_window: u64,
    /// Start of the current recovery period (RFC 9002 §7.3.2 `congestion_recovery_start_time`).
    recovery_start: Option<Instant>,
    /// EWMA of lost / (acked + lost), weighted by datagrams.
    loss_ratio: f64,
    /// Smoothed RTT at the last ACK, for [`Metrics::pacing_rate`].
    last_smoothed_rtt: Option<Duration>,
    undo: Option<Undo<A>>,
    /// The most bytes in flight at a send during this round: whether the sender used its
    /// window (see [`Classic::window_used`]).
    peak_in_flight: u64,
    /// The peak of the round before this one; `u64::MAX` until a round has ended (the first
    /// round grows the window as it always has).
    last_peak_in_flight: u64,
    /// When this round's first packet was sent; the round ends when a packet sent at or after
    /// it is acknowledged.
    round_start: Option<Instant>,
    /// RTT spreads of the last rounds spent wholly in congestion avoidance.
    spreads: RoundSpreads,
    congestion_events: u64,
    non_congestive_losses: u64,
    persistent_congestion_events: u64,
    undone_congestion_events: u64,
}

impl<A: WindowAdjustment> Classic<A> {
    /// A controller for the path `info`, starting in slow start with the initial window.
    pub fn new(adjustment: A, config: &ClassicConfig, now: Instant, info: &PathInfo) -> Self {
        let _ = now;
        let mss = u64::from(info.max_datagram_size).max(1);
        let mut this = Self {
            adjustment,
            config: config.clone(),
            path_id: info.path_id,
            mss,
            window: 0,
            ssthresh: u64::MAX,
            initial_window: 0,
            recovery_start: None,
            loss_ratio: 0.0,
            last_smoothed_rtt: None,
            undo: None,
            peak_in_flight: 0,
            last_peak_in_flight: u64::MAX,
            round_start: None,
            spreads: RoundSpreads::default(),
            congestion_events: 0,
            non_congestive_losses: 0,
            persistent_congestion_events: 0,
            undone_congestion_events: 0,
        };
        this.initial_window = this.compute_initial_window();
        this.window = this.initial_window;
        this
    }

    /// The window adjustment, e.g. to inspect CUBIC's `W_max` in tests.
    pub fn adjustment(&self) -> &A {
        &self.adjustment
    }

    /// The settings this controller was built with.
    pub fn config(&self) -> &ClassicConfig {
        &self.config
    }

    /// Slow-start threshold in bytes, `None` while unset (infinite).
    pub fn ssthresh(&self) -> Option<u64> {
        (self.ssthresh != u64::MAX).then_some(self.ssthresh)
    }

    /// Whether the controller is in slow start (RFC 9002 §7.3.1: window below ssthresh).
    pub fn in_slow_start(&self) -> bool {
        self.window < self.ssthresh
    }

    /// Whether a packet sent at `sent` was sent during the current recovery period, so its loss
    /// or acknowledgement belongs to a congestion event already reacted to (RFC 9002 §7.3.2).
    pub fn in_recovery(&self, sent: Instant) -> bool {
        self.recovery_start.is_some_and(|start| sent <= start)
    }

    /// Recent loss ratio estimate (0.0–1.0), as used by random-loss tolerance.
    pub fn loss_ratio(&self) -> f64 {
        self.loss_ratio
    }

    /// Minimum window in bytes (RFC 9002 §7.2 `kMinimumWindow`, 2 datagrams by default).
    pub fn minimum_window(&self) -> u64 {
        u64::from(self.config.minimum_window_packets.max(1))
            .saturating_mul(self.mss)
            .min(MAX_WINDOW)
    }

    /// Current maximum datagram size in bytes.
    pub fn max_datagram_size(&self) -> u64 {
        self.mss
    }

    fn compute_initial_window(&self) -> u64 {
        u64::from(self.config.initial_window_packets)
            .saturating_mul(self.mss)
            .clamp(self.minimum_window(), MAX_WINDOW)
    }

    /// Folds `bytes` of delivered (`lost == false`) or lost data into the loss-ratio EWMA.
    fn observe(&mut self, bytes: u64, lost: bool) {
        self.loss_ratio = next_loss_ratio(self.loss_ratio, bytes, self.mss, lost);
    }

    /// Decides whether a loss is a congestion signal; `None` = random loss, ignore it.
    fn classify(&self, persistent: bool, rtt: &RttEstimator) -> Option<Signal> {
        if persistent {
            return Some(Signal::Persistent);
        }
        if !self.config.random_loss_tolerance {
            return Some(Signal::Classic);
        }
        let Some(min_rtt) = rtt.min() else {
            return Some(Signal::NoRttSample);
        };
        let allowance = self.spreads.allowance(rtt.var(), min_rtt);
        let queue_delay = rtt
            .smoothed()
            .saturating_sub(min_rtt)
            .saturating_sub(allowance);
        let standing = (min_rtt / STANDING_QUEUE_DIVISOR).max(MIN_STANDING_QUEUE);
        if queue_delay >= standing {
            return Some(Signal::StandingQueue);
        }
        if self.loss_ratio > self.config.loss_ratio_threshold {
            return Some(Signal::LossRatio);
        }
        None
    }

    /// Multiplicative decrease and the start of a recovery period.
    fn reduce(&mut self, now: Instant, signal: Signal) {
        self.undo = Some(Undo {
            window: self.window,
            ssthresh: self.ssthresh,
            recovery_start: self.recovery_start,
            adjustment: self.adjustment.clone(),
        });
        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.2
        //# On entering a recovery period, a sender MUST set the slow start
        //# threshold to half the value of the congestion window when loss is
        //# detected.  The congestion window MUST be set to the reduced value of
        //# the slow start threshold before exiting the recovery period.
        // (The factor is the adjustment's: 0.5 for NewReno, β = 0.7 for CUBIC.)
        self.recovery_start = Some(now);
        // The queue drains after a cut: that round's spread is no jitter.
        self.spreads.taint();
        let reduced = self
            .adjustment
            .on_congestion(now, self.window, self.mss)
            .clamp(self.minimum_window(), MAX_WINDOW);
        debug!(
            path = self.path_id,
            algorithm = self.adjustment.name(),
            ?signal,
            from = self.window,
            to = reduced,
            loss_ratio = self.loss_ratio,
            "congestion event"
        );
        self.ssthresh = reduced;
        self.window = reduced;
        self.congestion_events = self.congestion_events.saturating_add(1);
    }

    fn pacing_rate_for(&self, smoothed_rtt: Duration) -> Option<u64> {
        let nanos = smoothed_rtt.as_nanos();
        if nanos == 0 {
            return None;
        }
        let (num, den) = if self.in_slow_start() {
            SLOW_START_PACING_GAIN
        } else {
            AVOIDANCE_PACING_GAIN
        };
        let rate = u128::from(self.window) * num * 1_000_000_000 / (den * nanos);
        Some(u64::try_from(rate).unwrap_or(u64::MAX).max(1))
    }
}

impl<A: WindowAdjustment> Classic<A> {
    /// Whether the sender filled at least half its window in this round or the last.
    ///
    /// RFC 9002 §7.8: a window the sender does not use must not grow. Packets sent when
    /// nothing was left to send are marked app-limited, but a sender can also fall short of
    /// its window with data waiting: a CPU slower than the path, a peer's flow-control
    /// window, an application that paces itself. On loopback tern's window grew to 2 GB with
    /// 0.6–1.7 MB in flight, a burst waiting for the first path that is not loopback. Like
    /// Linux's `tcp_is_cwnd_limited`, half the window in flight counts as using it (paced slow
    /// start keeps about that much in flight).
    fn window_used(&self) -> bool {
        let peak = self.peak_in_flight.max(self.last_peak_in_flight);
        peak.saturating_mul(2) >= self.window
    }
}

impl<A: WindowAdjustment> Controller for Classic<A> {
    fn on_sent(&mut self, now: Instant, bytes: u64, bytes_in_flight: u64) {
        // Nothing else in flight: the sender was idle (or app-limited) until now. CUBIC's epoch
        // must not count the idle time, or the window would jump (RFC 9438 §5.8).
        if bytes_in_flight <= bytes {
            self.adjustment.on_app_limited(now);
        }
        self.peak_in_flight = self.peak_in_flight.max(bytes_in_flight);
        self.round_start.get_or_insert(now);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.observe(bytes, false);
        if rtt.has_sample() {
            self.last_smoothed_rtt = Some(rtt.smoothed());
            self.spreads.sample(rtt);
        }
        // Slow start's queue grows by up to a window per round, which is no jitter.
        if self.window < self.ssthresh {
            self.spreads.taint();
        }

        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.2
        //# A recovery period ends and the sender enters congestion avoidance
        //# when a packet sent during the recovery period is acknowledged.
        // Until then, acknowledgements of packets sent before the reduction do not grow the
        // window (RFC 9002 Appendix B.5 `OnPacketAcked`: "Do not increase congestion window in
        // recovery period").
        if self.in_recovery(sent) {
            return;
        }

        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.8
        //# When bytes in flight is smaller than the congestion window and
        //# sending is not pacing limited, the congestion window is
        //# underutilized. [...] the congestion window SHOULD NOT be increased
        //# in either slow start or congestion avoidance.
        if app_limited || !self.window_used() {
            return;
        }

        let mut remaining = bytes;
        if self.window < self.ssthresh {
            //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.1
            //# While a sender is in slow start, the congestion window increases by
            //# the number of bytes acknowledged when each acknowledgment is
            //# processed.
            // Bytes beyond ssthresh are counted as congestion avoidance below.
            let slow_start = remaining.min(self.ssthresh - self.window);
            self.window = self.window.saturating_add(slow_start).min(MAX_WINDOW);
            remaining -= slow_start;
            if self.window >= self.ssthresh {
                trace!(path = self.path_id, window = self.window, "slow start ends");
            }
        }
        if remaining > 0 && self.window >= self.ssthresh {
            self.window = self
                .adjustment
                .on_avoidance_ack(now, self.window, remaining, self.mss, rtt)
                .clamp(self.minimum_window(), MAX_WINDOW);
        }
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        bytes_in_flight: u64,
        app_limited: bool,
        largest_acked_sent: Option<Instant>,
    ) {
        if app_limited {
            self.adjustment.on_app_limited(now);
        }
        // The round ends when a packet sent in it is acknowledged; the next one starts with
        // what is in flight now.
        if let (Some(start), Some(acked)) = (self.round_start, largest_acked_sent) {
            if acked >= start {
                self.last_peak_in_flight = self.peak_in_flight;
                self.peak_in_flight = bytes_in_flight;
                self.round_start = None;
                self.spreads.end_round();
            }
        }
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        largest_lost_sent: Instant,
        lost_bytes: u64,
        persistent_congestion: bool,
        rtt: &RttEstimator,
    ) {
        self.observe(lost_bytes, true);

        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.3.2
        //# The recovery period aims to limit congestion window reduction to
        //# once per round trip.  Therefore, during a recovery period, the
        //# congestion window does not change in response to new losses or
        //# increases in the ECN-CE count.
        if !self.in_recovery(largest_lost_sent) {
            match self.classify(persistent_congestion, rtt) {
                Some(signal) => self.reduce(now, signal),
                None => {
                    self.non_congestive_losses = self.non_congestive_losses.saturating_add(1);
                    trace!(
                        path = self.path_id,
                        lost_bytes,
                        loss_ratio = self.loss_ratio,
                        queue_delay = ?rtt.min().map(|min| rtt.smoothed().saturating_sub(min)),
                        "loss judged non-congestive"
                    );
                }
            }
        }

        if persistent_congestion {
            //= https://www.rfc-editor.org/rfc/rfc9002#section-7.6.2
            //# When persistent congestion is declared, the sender's congestion
            //# window MUST be reduced to the minimum congestion window
            //# (kMinimumWindow), similar to a TCP sender's response on an RTO
            // Appendix B.8 also resets `congestion_recovery_start_time`, so the next loss is a
            // new event.
            debug!(path = self.path_id, "persistent congestion");
            self.window = self.minimum_window();
            self.recovery_start = None;
            self.undo = None;
            self.spreads.clear();
            self.adjustment.on_persistent_congestion();
            self.persistent_congestion_events = self.persistent_congestion_events.saturating_add(1);
        }
    }

    //= https://www.rfc-editor.org/rfc/rfc9002#section-7.1
    //# If a path has been validated to support Explicit Congestion
    //# Notification (ECN) [RFC3168] [RFC8311], QUIC treats a Congestion
    //# Experienced (CE) codepoint in the IP header as a signal of
    //# congestion.
    // Unlike a loss, a CE mark is never random and never spurious: the tolerance does not
    // apply and the reduction cannot be undone.
    fn on_ecn_ce(
        &mut self,
        now: Instant,
        largest_acked_sent: Instant,
        newly_ce: u64,
        rtt: &RttEstimator,
    ) {
        let _ = (newly_ce, rtt);
        if !self.in_recovery(largest_acked_sent) {
            self.reduce(now, Signal::Ecn);
            self.undo = None;
        }
    }

    /// Undoes the most recent reduction, once, if the window is still below what it was
    /// (RFC 9438 §4.9: "restore the original values [...] if the current cwnd is lower than
    /// prior_cwnd"). The caller should signal this when the packets whose loss caused the most
    /// recent congestion event were all delivered after all. Reductions by persistent
    /// congestion are never undone.
    fn on_spurious_congestion_event(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        if self.window < undo.window {
            debug!(
                path = self.path_id,
                from = self.window,
                to = undo.window,
                "spurious congestion event undone"
            );
            // The saved values may predate an MTU change that raised the minimum.
            let minimum = self.minimum_window();
            self.window = undo.window.max(minimum);
            self.ssthresh = undo.ssthresh.max(minimum);
            self.recovery_start = undo.recovery_start;
            self.adjustment = undo.adjustment;
            self.undone_congestion_events = self.undone_congestion_events.saturating_add(1);
        }
    }

    /// Packet-pair fast start (F11): if [`FAST_START_MARGIN`] × rate × min RTT is more than
    /// the window, the window opens to it and the slow-start threshold is set to it, so slow
    /// start ends there and congestion avoidance (and pacing at 1.25 × window / RTT, about
    /// the estimate) takes over. A too-high estimate is then an ordinary overshoot: the first
    /// losses with a standing queue reduce the window as usual (the reduction can be undone
    /// if spurious). An estimate at or below the window changes nothing (it never shrinks
    /// the window nor cuts a slow start short: a bounded or pessimistic estimate must not
    /// make the controller slower than it would be on its own). Without an RTT sample the
    /// estimate is ignored (no bandwidth-delay product to compute).
    fn on_rate_estimate(&mut self, now: Instant, bytes_per_second: u64, rtt: &RttEstimator) {
        let Some(min_rtt) = rtt.min().filter(|r| !r.is_zero()) else {
            return;
        };
        let (num, den) = FAST_START_MARGIN;
        let bdp = u128::from(bytes_per_second) * min_rtt.as_nanos() * num / (den * 1_000_000_000);
        let target = u64::try_from(bdp)
            .unwrap_or(MAX_WINDOW)
            .clamp(self.minimum_window(), MAX_WINDOW);
        if target <= self.window {
            return;
        }
        debug!(
            path = self.path_id,
            algorithm = self.adjustment.name(),
            bytes_per_second,
            ?min_rtt,
            from = self.window,
            to = target,
            "fast start from a rate estimate"
        );
        self.window = target;
        self.ssthresh = target;
        // A jump (possibly in congestion avoidance, after an idle spell) moves the delay.
        self.spreads.taint();
        self.last_smoothed_rtt = Some(rtt.smoothed());
        // Growth in congestion avoidance starts from here, not from an earlier epoch.
        self.adjustment.on_app_limited(now);
    }

    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        self.mss = u64::from(max_datagram_size).max(1);
        //= https://www.rfc-editor.org/rfc/rfc9002#section-7.2
        //# If the maximum datagram size changes during the connection, the
        //# initial congestion window SHOULD be recalculated with the new size.
        self.initial_window = self.compute_initial_window();
        // The window is kept in bytes; only the minimum (in datagrams) may lift it, and
        // ssthresh with it, so that it stays a window the controller could reduce to.
        let minimum = self.minimum_window();
        self.window = self.window.clamp(minimum, MAX_WINDOW);
        if self.ssthresh != u64::MAX {
            self.ssthresh = self.ssthresh.max(minimum);
        }
    }

    fn window(&self) -> u64 {
        self.window
    }

    /// `2 × window / srtt` in slow start, `1.25 × window / srtt` afterwards; `None` before the
    /// first RTT sample (the pacer then uses its own default from the initial RTT).
    fn pacing_rate(&self, rtt: &RttEstimator) -> Option<u64> {
        if !rtt.has_sample() {
            return None;
        }
        self.pacing_rate_for(rtt.smoothed())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn metrics(&self) -> Metrics {
        let mut metrics = Metrics::new(self.window);
        metrics.ssthresh = self.ssthresh();
        metrics.pacing_rate = self
            .last_smoothed_rtt
            .and_then(|srtt| self.pacing_rate_for(srtt));
        metrics.in_slow_start = self.in_slow_start();
        metrics.congestion_events = self.congestion_events;
        metrics.non_congestive_losses = self.non_congestive_losses;
        metrics.persistent_congestion_events = self.persistent_congestion_events;
        metrics.undone_congestion_events = self.undone_congestion_events;
        metrics
    }

    fn name(&self) -> &'static str {
        self.adjustment.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::{epoch, rtt_with};
    use crate::cc::NewReno;

    const MSS: u64 = 1200;
    const MS: Duration = Duration::from_millis(1);

    fn reno(config: ClassicConfig) -> Classic<NewReno> {
        Classic::new(NewReno::default(), &config, epoch(), &PathInfo::default())
    }

    /// RTT estimates for a path with a 40 ms base RTT and no queue.
    fn no_queue() -> RttEstimator {
        rtt_with(40 * MS, 40 * MS)
    }

    /// RTT estimates for a path with a 40 ms base RTT and a 20 ms standing queue.
    fn standing_queue() -> RttEstimator {
        rtt_with(40 * MS, 60 * MS)
    }

    #[test]
    fn starts_in_slow_start_with_initial_window() {
        let cc = reno(ClassicConfig::default());
        assert_eq!(cc.window(), 10 * MSS);
        assert_eq!(cc.initial_window(), 10 * MSS);
        assert_eq!(cc.minimum_window(), 2 * MSS);
        assert!(cc.in_slow_start());
        assert_eq!(cc.ssthresh(), None);
        assert_eq!(cc.name(), "newreno");
        let m = cc.metrics();
        assert_eq!(m.window, 10 * MSS);
        assert!(m.in_slow_start);
        assert_eq!(m.pacing_rate, None);
    }

    #[test]
    fn initial_and_minimum_window_are_configurable() {
        let cc = reno(
            ClassicConfig::default()
                .initial_window_packets(16)
                .minimum_window_packets(4),
        );
        assert_eq!(cc.window(), 16 * MSS);
        assert_eq!(cc.minimum_window(), 4 * MSS);
        // An initial window below the minimum is raised to it.
        let cc = reno(
            ClassicConfig::default()
                .initial_window_packets(0)
                .minimum_window_packets(0),
        );
        assert_eq!(cc.minimum_window(), MSS);
        assert_eq!(cc.window(), MSS);
    }

    #[test]
    fn app_limited_acks_do_not_grow_the_window() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default());
        cc.on_ack(t + 50 * MS, t, 5 * MSS, true, &rtt);
        assert_eq!(cc.window(), 10 * MSS);
        cc.on_ack(t + 50 * MS, t, 5 * MSS, false, &rtt);
        assert_eq!(cc.window(), 15 * MSS);
    }

    #[test]
    fn a_window_the_sender_does_not_fill_does_not_grow() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default());
        // Data waits (the acks are not app-limited), but the sender keeps only 2 datagrams in
        // flight: a slow CPU, a small flow-control window.
        for round in 0..20u32 {
            let sent = t + round * 50 * MS;
            cc.on_sent(sent, MSS, MSS);
            cc.on_sent(sent, MSS, 2 * MSS);
            let acked = sent + 40 * MS;
            cc.on_ack(acked, sent, MSS, false, &rtt);
            cc.on_ack(acked, sent, MSS, false, &rtt);
            cc.on_end_acks(acked, 0, false, Some(sent));
        }
        // Only the first round, before any had ended, grew it.
        assert_eq!(cc.window(), 12 * MSS);
        // Half the window in flight uses it: it grows again.
        let sent = t + 2_000 * MS;
        cc.on_sent(sent, 6 * MSS, 6 * MSS);
        cc.on_ack(sent + 40 * MS, sent, MSS, false, &rtt);
        assert_eq!(cc.window(), 13 * MSS);
    }

    #[test]
    fn one_reduction_per_round_trip() {
        let t = epoch();
        let rtt = standing_queue();
        let mut cc = reno(ClassicConfig::default());
        cc.on_congestion_event(t + 100 * MS, t + 50 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS);
        assert!(!cc.in_slow_start());
        // Losses of packets sent before the reduction belong to the same event.
        cc.on_congestion_event(t + 110 * MS, t + 99 * MS, MSS, false, &rtt);
        cc.on_congestion_event(t + 120 * MS, t + 100 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS);
        // ... and their acknowledgements do not grow the window.
        cc.on_ack(t + 120 * MS, t + 90 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS);
        // A packet sent after the recovery start is a new event.
        cc.on_congestion_event(t + 200 * MS, t + 101 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS / 2);
        assert_eq!(cc.metrics().congestion_events, 2);
    }

    #[test]
    fn window_never_drops_below_minimum() {
        let t = epoch();
        let rtt = standing_queue();
        let mut cc = reno(ClassicConfig::default());
        for i in 1..20u32 {
            cc.on_congestion_event(t + i * 100 * MS, t + i * 100 * MS - MS, MSS, false, &rtt);
        }
        assert_eq!(cc.window(), 2 * MSS);
        assert_eq!(cc.ssthresh(), Some(2 * MSS));
    }

    #[test]
    fn persistent_congestion_collapses_to_minimum_window() {
        let t = epoch();
        // Persistent congestion counts even where a plain loss would be tolerated.
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default());
        cc.on_ack(t + 40 * MS, t, 30 * MSS, false, &rtt);
        assert_eq!(cc.window(), 40 * MSS);
        cc.on_congestion_event(t + 2000 * MS, t + 100 * MS, 20 * MSS, true, &rtt);
        assert_eq!(cc.window(), 2 * MSS);
        // ssthresh keeps the multiplicative decrease, so slow start resumes up to it.
        assert_eq!(cc.ssthresh(), Some(20 * MSS));
        assert!(cc.in_slow_start());
        let m = cc.metrics();
        assert_eq!(m.persistent_congestion_events, 1);
        assert_eq!(m.congestion_events, 1);
        // The recovery period is reset: the next loss is a new event.
        assert!(!cc.in_recovery(t + 100 * MS));
        // And persistent congestion is not undone.
        cc.on_spurious_congestion_event();
        assert_eq!(cc.window(), 2 * MSS);
    }

    #[test]
    fn random_loss_without_queue_is_tolerated() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default());
        for _ in 0..100 {
            cc.on_ack(t + 40 * MS, t, MSS, false, &rtt);
        }
        let before = cc.window();
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), before);
        // Slow start is not left on a random loss.
        assert!(cc.in_slow_start());
        let m = cc.metrics();
        assert_eq!(m.congestion_events, 0);
        assert_eq!(m.non_congestive_losses, 1);
    }

    #[test]
    fn loss_with_standing_queue_is_congestion() {
        let t = epoch();
        let rtt = standing_queue();
        let mut cc = reno(ClassicConfig::default());
        for _ in 0..100 {
            cc.on_ack(t + 40 * MS, t, MSS, false, &rtt);
        }
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 55 * MSS);
        assert_eq!(cc.metrics().non_congestive_losses, 0);
    }

    #[test]
    fn only_congestion_avoidance_rounds_make_the_jitter_allowance() {
        let t = epoch();
        let mut cc = reno(ClassicConfig::default());
        let mut rtt = RttEstimator::with_max_ack_delay(40 * MS, Duration::ZERO);
        // One round of ACKs at `base` + 0..`swing`, sent at `at`.
        let round =
            |cc: &mut Classic<NewReno>, rtt: &mut RttEstimator, at: Instant, swing: Duration| {
                cc.on_sent(at, MSS, MSS);
                for k in 0..5u32 {
                    let sample = 40 * MS + swing * k / 4;
                    rtt.update(Duration::ZERO, sample);
                    cc.on_ack(at + sample, at, MSS, false, rtt);
                }
                cc.on_end_acks(at + 60 * MS, 0, false, Some(at));
            };
        // Slow start fills a queue: 40 → 70 ms within each round. Not jitter.
        for r in 0..4u32 {
            round(&mut cc, &mut rtt, t + r * 100 * MS, 30 * MS);
        }
        assert!(cc.in_slow_start());
        assert_eq!(
            cc.spreads.allowance(Duration::ZERO, 40 * MS),
            Duration::ZERO
        );
        // Nor is the round in which a fast-start estimate ends slow start, though it ends in
        // congestion avoidance.
        let at = t + 400 * MS;
        cc.on_sent(at, MSS, MSS);
        for k in 0..5u32 {
            rtt.update(Duration::ZERO, 40 * MS + 30 * MS * k / 4);
            cc.on_ack(at + 50 * MS, at, MSS, false, &rtt);
        }
        cc.on_rate_estimate(at + 50 * MS, 10_000_000, &rtt);
        assert!(!cc.in_slow_start());
        cc.on_end_acks(at + 60 * MS, 0, false, Some(at));
        assert_eq!(
            cc.spreads.allowance(Duration::ZERO, 40 * MS),
            Duration::ZERO
        );
        // Congestion avoidance with 8 ms of swing in every round: that is the allowance.
        for r in 5..9u32 {
            round(&mut cc, &mut rtt, t + r * 100 * MS, 8 * MS);
        }
        assert_eq!(cc.spreads.allowance(Duration::ZERO, 40 * MS), 8 * MS);
        // Capped at half the minimum RTT; forgotten at persistent congestion.
        assert_eq!(cc.spreads.allowance(Duration::ZERO, 10 * MS), 5 * MS);
        cc.on_congestion_event(t + 1_000 * MS, t + 950 * MS, MSS, true, &rtt);
        assert_eq!(
            cc.spreads.allowance(Duration::ZERO, 40 * MS),
            Duration::ZERO
        );
    }

    /// In-order jitter on a radio link moves the delay's level over several round trips: each
    /// round's own spread can be small while the swing between rounds is not, and that swing
    /// is no queue of ours either.
    #[test]
    fn a_delay_level_that_wanders_between_rounds_is_jitter() {
        let t = epoch();
        let mut cc = reno(ClassicConfig::default());
        let mut rtt = RttEstimator::with_max_ack_delay(40 * MS, Duration::ZERO);
        // A fast-start estimate ends slow start (that round is not kept).
        cc.on_sent(t, MSS, MSS);
        rtt.update(Duration::ZERO, 40 * MS);
        cc.on_ack(t + 40 * MS, t, MSS, false, &rtt);
        cc.on_rate_estimate(t + 40 * MS, 10_000_000, &rtt);
        cc.on_end_acks(t + 50 * MS, 0, false, Some(t));
        assert!(!cc.in_slow_start());
        // Rounds whose samples span 2 ms each, at levels 0, 3, 6, 3, 0 ms above 40 ms.
        for (r, level) in [0u32, 3, 6, 3, 0].into_iter().enumerate() {
            let at = t + (r as u32 + 1) * 100 * MS;
            cc.on_sent(at, MSS, MSS);
            for k in 0..5u32 {
                rtt.update(Duration::ZERO, 40 * MS + level * MS + 2 * MS * k / 4);
                cc.on_ack(at + 50 * MS, at, MSS, false, &rtt);
            }
            cc.on_end_acks(at + 60 * MS, 0, false, Some(at));
        }
        // 40 ms at the lowest, 48 ms at the highest: 8 ms, not the 2 ms of any one round.
        assert_eq!(cc.spreads.allowance(Duration::ZERO, 40 * MS), 8 * MS);
    }

    #[test]
    fn standing_queue_threshold_has_a_floor() {
        // min_rtt 8 ms: min_rtt / 8 = 1 ms, so the 2 ms floor applies.
        let t = epoch();
        let mut cc = reno(ClassicConfig::default());
        let rtt = rtt_with(8 * MS, Duration::from_micros(9_600));
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 10 * MSS, "1.6 ms of queue is noise");
        let rtt = rtt_with(8 * MS, 11 * MS);
        cc.on_congestion_event(t + 60 * MS, t + 20 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS, "3 ms of queue is a standing queue");
    }

    #[test]
    fn jitter_is_not_a_standing_queue() {
        let t = epoch();
        // Samples alternating between 40 and 56 ms: smoothed ≈ 48, rttvar ≈ 8, min 40.
        let mut jittery = RttEstimator::new(40 * MS);
        for i in 0..200 {
            jittery.update(Duration::ZERO, if i % 2 == 0 { 40 * MS } else { 56 * MS });
        }
        assert!(jittery.smoothed() > 45 * MS && jittery.var() > 6 * MS);
        let mut cc = reno(ClassicConfig::default());
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &jittery);
        assert_eq!(cc.window(), 10 * MSS, "8 ms of jitter is not a queue");
        // The same 8 ms above the minimum without the variation is a standing queue.
        let steady = rtt_with(40 * MS, 48 * MS);
        cc.on_congestion_event(t + 60 * MS, t + 20 * MS, MSS, false, &steady);
        assert_eq!(cc.window(), 5 * MSS);
    }

    #[test]
    fn loss_without_rtt_sample_is_congestion() {
        let t = epoch();
        let rtt = RttEstimator::new(40 * MS);
        let mut cc = reno(ClassicConfig::default());
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS);
    }

    #[test]
    fn frequent_loss_is_congestion_even_without_queue() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default().initial_window_packets(1000));
        // 1 loss every 5 datagrams (20 %), each in its own "round trip" so the recovery period
        // does not hide them.
        let mut reduced_after = None;
        for i in 0..200u32 {
            let sent = t + i * 10 * MS;
            for _ in 0..4 {
                cc.on_ack(sent + MS, sent, MSS, true, &rtt);
            }
            let before = cc.window();
            cc.on_congestion_event(sent + 2 * MS, sent + MS, MSS, false, &rtt);
            if cc.window() < before {
                reduced_after = Some(i);
                break;
            }
        }
        let i = reduced_after.expect("a 20 % loss rate must eventually count as congestion");
        assert!(cc.loss_ratio() > 0.10);
        // The EWMA approaches 20 % as 0.2 × (1 - (1 - 1/256)^datagrams): it passes 10 % after
        // about 177 datagrams, i.e. 35 losses.
        assert!((25..45).contains(&i), "reduced after {i} losses");
        assert_eq!(cc.metrics().non_congestive_losses, u64::from(i));
    }

    #[test]
    fn one_percent_random_loss_stays_below_the_ratio_threshold() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default());
        for i in 0..10_000u32 {
            let sent = t + i * MS;
            if i % 100 == 50 {
                cc.on_congestion_event(sent + 40 * MS, sent, MSS, false, &rtt);
            } else {
                cc.on_ack(sent + 40 * MS, sent, MSS, false, &rtt);
            }
        }
        assert!(cc.loss_ratio() < 0.02, "{}", cc.loss_ratio());
        let m = cc.metrics();
        assert_eq!(m.congestion_events, 0);
        assert_eq!(m.non_congestive_losses, 100);
    }

    #[test]
    fn tolerance_off_treats_every_loss_as_congestion() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default().random_loss_tolerance(false));
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 5 * MSS);
        assert_eq!(cc.metrics().non_congestive_losses, 0);
    }

    #[test]
    fn loss_ratio_threshold_is_configurable() {
        let t = epoch();
        let rtt = no_queue();
        let mut cc = reno(ClassicConfig::default().loss_ratio_threshold(0.0));
        for _ in 0..100 {
            cc.on_ack(t + 40 * MS, t, MSS, false, &rtt);
        }
        // Any loss pushes the ratio above 0.
        cc.on_congestion_event(t + 50 * MS, t + 10 * MS, MSS, false, &rtt);
        assert!(cc.window() < 110 * MSS);
        let config = ClassicConfig::default()
            .loss_ratio_threshold(f64::NAN)
            .loss_ratio_threshold(7.0);
        assert_eq!(config.get_loss_ratio_threshold(), 1.0);
    }

    #[test]
    fn spurious_congestion_event_is_undone_once() {
        let t = epoch();
        let rtt = standing_queue();
        let mut cc = reno(ClassicConfig::default());
        cc.on_ack(t + 40 * MS, t, 10 * MSS, false, &rtt);
        cc.on_congestion_event(t + 100 * MS, t + 50 * MS, MSS, false, &rtt);
        assert_eq!(cc.window(), 10 * MSS);
        cc.on_spurious_congestion_event();
        assert_eq!(cc.window(), 20 * MSS);
        assert_eq!(cc.ssthresh(), None);
        assert!(cc.in_slow_start());
        assert!(!cc.in_recovery(t + 50 * MS));
        assert_eq!(cc.metrics().undone_congestion_events, 1);
        // A second signal has nothing left to undo.
        cc.on_congestion_event(t + 200 * MS, t + 150 * MS, MSS, false, &rtt);
        cc.on_spurious_congestion_event();
        cc.on_spurious_congestion_event();
        assert_eq!(cc.metrics().undone_congestion_events, 2);
        cc.on_spurious_congestion_event();
        assert_eq!(cc.metrics().undone_congestion_events, 2);
    }

    #[test]
    fn mtu_update_rescales_minimum_and_initial_window() {
        let mut cc = reno(ClassicConfig::default());
        cc.on_mtu_update(1452);
        assert_eq!(cc.max_datagram_size(), 1452);
        assert_eq!(cc.initial_window(), 14520);
        assert_eq!(cc.minimum_window(), 2904);
        assert_eq!(cc.window(), 10 * MSS);
        cc.on_mtu_update(0);
        assert_eq!(cc.max_datagram_size(), 1);
        assert!(cc.window() >= cc.minimum_window());
    }

    #[test]
    fn rate_estimate_opens_the_window_and_ends_slow_start() {
        let t = epoch();
        let rtt = rtt_with(100 * MS, 100 * MS);
        let mut cc = reno(ClassicConfig::default());
        // 50 Mbit/s = 6.25 MB/s over 100 ms: a BDP of 625 kB.
        cc.on_rate_estimate(t, 6_250_000, &rtt);
        assert_eq!(cc.window(), 625_000);
        assert_eq!(cc.ssthresh(), Some(625_000));
        assert!(!cc.in_slow_start());
        // Paced at 1.25 × window / RTT.
        assert_eq!(cc.pacing_rate(&rtt), Some(7_812_500));
        // A lower estimate never shrinks the window.
        cc.on_rate_estimate(t, 1_000_000, &rtt);
        assert_eq!(cc.window(), 625_000);
        assert_eq!(cc.ssthresh(), Some(625_000));
        // A too-high estimate is corrected like any overshoot: by the first loss with a queue.
        let queue = rtt_with(100 * MS, 150 * MS);
        cc.on_congestion_event(t + 200 * MS, t + 150 * MS, MSS, false, &queue);
        assert_eq!(cc.window(), 312_500);
    }

    #[test]
    fn rate_estimate_without_rtt_sample_or_rate_is_ignored() {
        let t = epoch();
        let mut cc = reno(ClassicConfig::default());
        cc.on_rate_estimate(t, 6_250_000, &RttEstimator::new(100 * MS));
        cc.on_rate_estimate(t, 0, &rtt_with(100 * MS, 100 * MS));
        assert_eq!(cc.window(), 10 * MSS);
        assert!(cc.in_slow_start());
        // An estimate below the window changes nothing: slow start goes on.
        cc.on_rate_estimate(t, 1, &rtt_with(100 * MS, 100 * MS));
        cc.on_rate_estimate(t, 100_000, &rtt_with(100 * MS, 100 * MS));
        assert_eq!(cc.window(), 10 * MSS);
        assert!(cc.in_slow_start());
        // Huge rates saturate at the largest window.
        let mut cc = reno(ClassicConfig::default());
        cc.on_rate_estimate(t, u64::MAX, &rtt_with(100 * MS, 100 * MS));
        assert_eq!(cc.window(), MAX_WINDOW);
    }

    #[test]
    fn cubic_grows_from_a_rate_estimate() {
        use crate::cc::Cubic;
        let t = epoch();
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = Classic::new(
            Cubic::default(),
            &ClassicConfig::default(),
            t,
            &PathInfo::default(),
        );
        cc.on_rate_estimate(t, 12_500_000, &rtt);
        let w = cc.window();
        assert_eq!(w, 500_000);
        for i in 1..=100u32 {
            cc.on_ack(t + i * MS, t, MSS, false, &rtt);
        }
        assert!(cc.window() >= w, "{} < {w}", cc.window());
    }

    #[test]
    fn pacing_rate_uses_slow_start_and_avoidance_gains() {
        let t = epoch();
        let mut cc = reno(ClassicConfig::default());
        assert_eq!(cc.pacing_rate(&RttEstimator::new(100 * MS)), None);
        let rtt = rtt_with(100 * MS, 100 * MS);
        // 12 000 bytes per 100 ms, doubled in slow start.
        assert_eq!(cc.pacing_rate(&rtt), Some(240_000));
        cc.on_ack(t + 100 * MS, t, MSS, true, &rtt);
        assert_eq!(cc.metrics().pacing_rate, Some(240_000));
        let queue = rtt_with(100 * MS, 150 * MS);
        cc.on_congestion_event(t + 200 * MS, t + 150 * MS, MSS, false, &queue);
        // 6 000 bytes per 100 ms × 1.25
        assert_eq!(cc.pacing_rate(&rtt), Some(75_000));
        assert_eq!(
            cc.pacing_rate(&rtt_with(Duration::ZERO, Duration::ZERO)),
            None
        );
    }
}
