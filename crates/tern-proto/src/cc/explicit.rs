//! The explicit-rate controller (DESIGN.md F12, docs/PROTOCOL.md §13): paces at the rate a
//! tern router on the path stamps into the packets' feedback field, and falls back to an
//! end-to-end controller (CUBIC by default) where no router stamps.
//!
//! # Why
//!
//! An end-to-end controller has to find the bottleneck rate by probing: it fills a queue
//! (loss-based) or infers one (delay-based), and on radio links whose rate swings within
//! seconds it is always behind. A router at the bottleneck knows its capacity and queue, and
//! tells each flow its share (`r_i = α(C − q)·w_i/Σw`, F12). A sender that paces at that share
//! needs no probing and keeps the queue near empty.
//!
//! # Rules, as implemented
//!
//! The connection asks this controller for the explicit-rate area ([`Controller::wants_rate_area`]
//! is `true`), so every short-header packet of the path carries the application's expected rate
//! and a feedback rate of "no limit"; routers lower the feedback; the receiver echoes the
//! minimum in RateEcho frames; the connection hands each echo to
//! [`Controller::on_feedback_rate`].
//!
//! 1. **Modes.** The controller starts in *fallback* mode: the end-to-end controller (built by
//!    [`ExplicitConfig::fallback`]'s factory) decides window and pacing. The first echo that a
//!    router lowered (not `0xFFFFFFFF`) switches to *explicit* mode. An echo of `0xFFFFFFFF`
//!    (no router on the path), or no echo for [`STAMP_TIMEOUT_PTOS`] probe timeouts while ACKs
//!    arrive, switches back; stamps that return switch to explicit mode again.
//! 2. **Rate in explicit mode** = `min(stamped rate, expected rate, own bound)`, never below
//!    [`MIN_RATE_PACKETS`] datagrams per smoothed RTT (so a path never stalls outright).
//! 3. **Own bound** (PROTOCOL.md §13.2: why a forged feedback value cannot push the sender into
//!    congestion): the smaller of
//!    - [`DELIVERY_ALLOWANCE`] × the largest delivery rate measured over the last
//!      [`DELIVERY_FILTER_ROUNDS`] round trips (acknowledged bytes per interval of at least one
//!      smoothed RTT): a forged rate far above the path's capacity lets the sender at most
//!      double what the path delivered; an honest rise is followed by doubling per round trip;
//!    - a congestion limit, set on a congestion signal to a fraction of the current rate, at
//!      most once per round trip (signals about packets sent before the last cut are the same
//!      congestion). Signals: a loss that the end-to-end controller (fed every callback as a
//!      shadow) judges congestive — for CUBIC, [`Classic`](super::Classic)'s random-loss
//!      tolerance — or persistent congestion, or more than [`LOSS_RATIO`] of a round trip's
//!      bytes lost, or an ECN CE mark: cut to [`BETA`] (0.7); a standing queue — the least
//!      RTT sample (less the peer's ACK delay) of the last half smoothed RTT at least
//!      `max(base / 4, 5 ms, 3 datagrams at the current rate)` above the base RTT, the least
//!      sample of the last [`BASE_RTT_WINDOW`] (10 s; not the connection's minimum, so that a
//!      path that became longer is not a queue for good)
//!      ([`QUEUE_DELAY_DIVISOR`], [`MIN_QUEUE_DELAY`], [`QUEUE_PACKETS`]): cut to
//!      [`DELAY_BETA`] (0.85). A windowed minimum, not the smoothed RTT: a radio link's
//!      scheduling swings the delay by tens of milliseconds with no queue at all, and a paced
//!      flow's own ACKs wait for the peer's ACK threshold (on the TMobile drive trace, under a
//!      router's 3 Mbit/s, the smoothed RTT cut the MAR uplink 40 times to 1 Mbit/s and made
//!      it miss two thirds of its frames). Each round trip without a signal
//!      the limit grows by [`LIMIT_GROWTH`] (1/32), up to the delivery allowance; it is kept
//!      from then on (dropping it would let the rate jump to twice the delivery rate, an
//!      overshoot). A spurious loss undoes its cut.
//!
//!    In the link simulation of `cc/tests.rs` (10 Mbit/s, 40 ms, one-BDP buffer, every echo
//!    forged to 10 Gbit/s) this holds the sender under 2× the link rate in every 100 ms, at
//!    86 % of the link with a 5.3 ms mean queue and 0.3 % loss (CUBIC: 99 %, 29 ms, 0.6 %). A
//!    faster limit growth (1/8) or dropping the limit lost 1.25 % there.
//! 4. **Window in explicit mode** = [`WINDOW_GAIN`] × rate × smoothed RTT (at least two
//!    datagrams): pacing, not the window, sets the rate; the window only caps what is in
//!    flight if ACKs stop.
//! 5. **Fallback seeding.** On the switch back to fallback mode a fresh end-to-end controller
//!    is built and handed the current rate through [`Controller::on_rate_estimate`] (CUBIC
//!    opens its window to rate × min RTT and starts in congestion avoidance there), so it does
//!    not restart from its initial window. On the switch to explicit mode, the delivery filter
//!    is seeded with the fallback's window / smoothed RTT (what it was delivering).
//! 6. **Expected rate** ([`Controller::on_expected_rate`]) caps the pacing rate in both modes.
//!
//! The end-to-end controller also keeps a probe-train estimate (F11): in explicit mode it is a
//! delivery-rate sample for the bound.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use super::windowed::Windowed;
use super::{Controller, ControllerFactory, Metrics, PathInfo, RttEstimator};

/// Share of the largest recent delivery rate the explicit rate may reach (2: the rate can
/// follow a rising honest stamp by doubling per round trip, like slow start, while a forged
/// stamp far above the path's capacity gives at most twice what the path delivered).
pub const DELIVERY_ALLOWANCE: u64 = 2;

/// Round trips a delivery-rate sample stays in the max filter (BBR keeps 10 for its
/// bandwidth filter: long enough to ride out an app-limited spell or ACK aggregation).
pub const DELIVERY_FILTER_ROUNDS: u32 = 10;

/// Multiplicative cut of the rate on a congestion signal, as a fraction (7/10: CUBIC's β).
pub const BETA: (u64, u64) = (7, 10);

/// Multiplicative cut on a queueing-delay signal (17/20 = 0.85): gentler than on loss, since a
/// queue is seen before anything is lost and draining it needs only the excess off.
pub const DELAY_BETA: (u64, u64) = (17, 20);

/// Loss ratio over one delivery interval (a smoothed RTT) that counts as congestion in
/// explicit mode, as a fraction (1/20), with at least two datagrams lost. A router's rate
/// should lose nothing, so frequent loss means the stamp is more than the path carries; 1 %
/// random radio loss stays well below it (the shadow controller's own rules, which tolerate
/// up to about 10 % at a bottleneck that never queues, apply as well).
pub const LOSS_RATIO: (u64, u64) = (1, 20);

/// Growth of the congestion limit per round trip without a signal, as a fraction (1/32: back
/// to the rate before a 0.7 cut in about 12 round trips; 1/8 doubled the loss under a forged
/// or stale stamp at a shallow buffer, `cc/tests.rs`).
pub const LIMIT_GROWTH: (u64, u64) = (1, 32);

/// Queueing delay that counts as congestion: at least `min_rtt / QUEUE_DELAY_DIVISOR`. A
/// router's PI controller keeps its queue near empty, so a queue of a quarter of the base RTT
/// means the stamped rate is more than the path carries (a forged or stale stamp, or a
/// bottleneck without a router).
pub const QUEUE_DELAY_DIVISOR: u32 = 4;

/// Floor of the queueing delay that counts as congestion (radio jitter and timer noise stay
/// below it).
pub const MIN_QUEUE_DELAY: Duration = Duration::from_millis(5);

/// Floor of the queueing delay that counts as congestion, in datagrams at the current rate: a
/// paced flow near a slow link's rate waits a datagram or two behind its own previous ones
/// (and, on a radio link, for the next transmission opportunity) with no queue built up.
pub const QUEUE_PACKETS: u64 = 3;

/// Span of the base-RTT filter the queueing delay is measured against (BBR's and Copa's
/// 10 s): long enough to hold a sample from a moment the queue was empty, short enough to
/// follow a path that became longer.
pub const BASE_RTT_WINDOW: Duration = Duration::from_secs(10);

/// Probe timeouts (`smoothed_rtt + 4 × rttvar`) plus one maximum ACK delay without a RateEcho,
/// while ACKs arrive, after which the path counts as without a router.
pub const STAMP_TIMEOUT_PTOS: u32 = 3;

/// Window in explicit mode, as a multiple of rate × smoothed RTT (2: the window must not
/// bind while pacing sets the rate, yet caps what is in flight when ACKs stop).
pub const WINDOW_GAIN: u64 = 2;

/// The explicit rate never goes below this many datagrams per smoothed RTT.
pub const MIN_RATE_PACKETS: u64 = 2;

/// Samples kept in the delivery filter at most (one per round trip at least, so
/// [`DELIVERY_FILTER_ROUNDS`] suffice; the bound only guards against a burst of tiny RTTs).
const MAX_SAMPLES: usize = 32;

/// Which controller sets the rate now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The end-to-end controller (no router stamps on the path).
    Fallback,
    /// The router's stamped rate, within the sender's own bound.
    Explicit,
}

/// Configuration and factory of explicit-rate controllers.
#[derive(Debug, Clone)]
pub struct ExplicitConfig {
    fallback: Arc<dyn ControllerFactory>,
}

impl Default for ExplicitConfig {
    /// CUBIC with tern's initial window ([`super::DEFAULT_INITIAL_WINDOW_PACKETS`]) as the
    /// fallback.
    fn default() -> Self {
        Self {
            fallback: super::Algorithm::Cubic.factory(),
        }
    }
}

impl ExplicitConfig {
    /// The end-to-end controller used where no router stamps (and, as a shadow, to judge
    /// losses in explicit mode).
    pub fn fallback(mut self, factory: Arc<dyn ControllerFactory>) -> Self {
        self.fallback = factory;
        self
    }

    /// The fallback's factory.
    pub fn get_fallback(&self) -> &Arc<dyn ControllerFactory> {
        &self.fallback
    }
}

impl ControllerFactory for ExplicitConfig {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Explicit::new(self.fallback.clone(), now, info))
    }
}

/// The explicit-rate controller of one path (see the module documentation).
#[derive(Debug)]
pub struct Explicit {
    factory: Arc<dyn ControllerFactory>,
    info: PathInfo,
    /// The end-to-end controller: in charge in fallback mode, a shadow in explicit mode.
    fallback: Box<dyn Controller>,
    mode: Mode,
    /// The latest stamped rate echoed, bytes per second.
    stamped: Option<u64>,
    /// When the latest echo (stamped or not) arrived.
    last_echo: Option<Instant>,
    /// The application's expected rate, bytes per second.
    expected: Option<u64>,
    /// Delivery-rate samples (time, bytes per second), oldest first.
    samples: VecDeque<(Instant, u64)>,
    /// The delivery-rate interval under way: start and bytes acknowledged since.
    interval_start: Option<Instant>,
    interval_bytes: u64,
    /// Bytes declared lost during that interval.
    interval_lost: u64,
    /// The congestion limit, bytes per second (`None`: not binding).
    limit: Option<u64>,
    /// The limit before the latest loss-triggered cut (to undo a spurious one).
    undo_limit: Option<Option<u64>>,
    /// When the latest cut happened: signals about packets sent before it are the same
    /// congestion (one cut per round trip), and the limit grows a round trip after it.
    cut_at: Option<Instant>,
    grown_at: Option<Instant>,
    /// The latest RTT estimate seen (for callbacks that get none).
    rtt: Option<RttEstimator>,
    /// The least RTT sample (less ACK delay) of the last half smoothed RTT: the queue every
    /// packet waits in.
    standing: Windowed,
    /// The path's base RTT: the least sample (less ACK delay) of the last
    /// [`BASE_RTT_WINDOW`]. Not the connection's minimum, which never forgets: after a
    /// handover to a longer path every packet would show a "queue" of the difference, and
    /// cut after cut would pin the rate near `3 datagrams / difference` for good.
    base: Windowed,
    /// [`RttEstimator::sample_count`] when `standing` last took a sample.
    standing_count: u64,
    mss: u64,
    /// Congestion cuts in explicit mode.
    explicit_events: u64,
    /// Congestion events of fallback controllers retired, and of the shadow when explicit
    /// mode began (those are fallback-mode events; later ones are counted as cuts).
    retired_events: u64,
    shadow_base: u64,
    retired_non_congestive: u64,
    retired_persistent: u64,
    switches: u64,
}

impl Explicit {
    /// A controller for the path `info`, falling back to what `fallback` builds.
    pub fn new(fallback: Arc<dyn ControllerFactory>, now: Instant, info: &PathInfo) -> Self {
        let cc = fallback.build(now, info);
        Self {
            factory: fallback,
            info: info.clone(),
            fallback: cc,
            mode: Mode::Fallback,
            stamped: None,
            last_echo: None,
            expected: None,
            samples: VecDeque::new(),
            interval_start: None,
            interval_bytes: 0,
            interval_lost: 0,
            limit: None,
            undo_limit: None,
            cut_at: None,
            grown_at: None,
            rtt: None,
            standing: Windowed::new(false),
            base: Windowed::new(false),
            standing_count: 0,
            mss: u64::from(info.max_datagram_size).max(1),
            explicit_events: 0,
            retired_events: 0,
            shadow_base: 0,
            retired_non_congestive: 0,
            retired_persistent: 0,
            switches: 0,
        }
    }

    /// Which controller sets the rate now.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The end-to-end controller (in charge in fallback mode, a shadow in explicit mode).
    pub fn fallback_controller(&self) -> &dyn Controller {
        self.fallback.as_ref()
    }

    /// The latest router rate echoed, bytes per second (`None`: none, or "no limit").
    pub fn stamped_rate(&self) -> Option<u64> {
        self.stamped
    }

    /// The sender's own bound on the explicit rate (delivery allowance and congestion limit),
    /// bytes per second; `None` before any delivery was measured.
    pub fn own_bound(&self) -> Option<u64> {
        let delivery = self.delivery_max()?.saturating_mul(DELIVERY_ALLOWANCE);
        Some(self.limit.map_or(delivery, |l| l.min(delivery)))
    }

    /// Switches between fallback and explicit mode so far.
    pub fn mode_switches(&self) -> u64 {
        self.switches
    }

    fn smoothed(&self) -> Duration {
        self.rtt
            .as_ref()
            .map_or(self.info.initial_rtt, RttEstimator::smoothed)
            .max(Duration::from_micros(1))
    }

    /// `bytes` per `d`, in bytes per second.
    fn per(bytes: u64, d: Duration) -> u64 {
        let nanos = d.as_nanos().max(1);
        u64::try_from(u128::from(bytes) * 1_000_000_000 / nanos).unwrap_or(u64::MAX)
    }

    /// Bytes sent at `rate` over `d`.
    fn over(rate: u64, d: Duration) -> u64 {
        u64::try_from(u128::from(rate) * d.as_nanos() / 1_000_000_000).unwrap_or(u64::MAX)
    }

    fn floor_rate(&self) -> u64 {
        Self::per(MIN_RATE_PACKETS * self.mss, self.smoothed()).max(1)
    }

    fn delivery_max(&self) -> Option<u64> {
        self.samples.iter().map(|&(_, r)| r).max()
    }

    /// The rate explicit mode sends at (rule 2).
    fn explicit_pace(&self) -> u64 {
        let floor = self.floor_rate();
        let own = self.own_bound().unwrap_or(u64::MAX).max(floor);
        self.stamped
            .unwrap_or(u64::MAX)
            .min(self.expected.unwrap_or(u64::MAX))
            .min(own)
            .max(floor)
    }

    /// The rate the path sends at now, whichever mode (bytes per second).
    pub fn current_rate(&self) -> u64 {
        match self.mode {
            Mode::Explicit => self.explicit_pace(),
            Mode::Fallback => {
                let srtt = self.smoothed();
                Self::per(self.fallback.window(), srtt)
            }
        }
    }

    fn push_sample(&mut self, now: Instant, rate: u64) {
        let keep = self.smoothed().saturating_mul(DELIVERY_FILTER_ROUNDS);
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > keep)
            || self.samples.len() >= MAX_SAMPLES
        {
            self.samples.pop_front();
        }
        self.samples.push_back((now, rate));
    }

    fn enter_explicit(&mut self, now: Instant) {
        let seed = Self::per(self.fallback.window(), self.smoothed());
        debug!(
            path = self.info.path_id,
            seed,
            stamped = self.stamped,
            "explicit rate: a router stamps, explicit mode"
        );
        self.mode = Mode::Explicit;
        self.switches += 1;
        self.samples.clear();
        self.push_sample(now, seed);
        self.interval_start = Some(now);
        self.interval_bytes = 0;
        self.interval_lost = 0;
        self.limit = None;
        self.undo_limit = None;
        self.cut_at = None;
        self.grown_at = Some(now);
        let m = self.fallback.metrics();
        self.shadow_base = m.congestion_events;
    }

    fn enter_fallback(&mut self, now: Instant, why: &'static str) {
        // What the path delivered, not the bound's allowance (twice that): seeded with the
        // allowance, a fresh controller would open to it, and a forged stamp flipping the
        // mode every few round trips would double the rate each cycle with nothing
        // delivered behind it (the next explicit period seeds its filter from this window).
        let rate = self
            .delivery_max()
            .map_or_else(|| self.explicit_pace(), |d| d.min(self.explicit_pace()));
        debug!(
            path = self.info.path_id,
            rate, why, "explicit rate: fallback mode"
        );
        let m = self.fallback.metrics();
        self.retired_events += self.shadow_base;
        self.retired_non_congestive += m.non_congestive_losses;
        self.retired_persistent += m.persistent_congestion_events;
        self.shadow_base = 0;
        self.fallback = self.factory.build(now, &self.info);
        if let Some(rtt) = &self.rtt {
            self.fallback.on_rate_estimate(now, rate, rtt);
        }
        self.mode = Mode::Fallback;
        self.switches += 1;
        self.limit = None;
        self.undo_limit = None;
    }

    /// A congestion signal in explicit mode about a packet sent at `sent`: cut, at most once
    /// per round trip. `undoable`: a loss (a spurious one may undo it).
    fn cut(
        &mut self,
        now: Instant,
        sent: Option<Instant>,
        (num, den): (u64, u64),
        undoable: bool,
        why: &'static str,
    ) {
        if self.mode != Mode::Explicit {
            return;
        }
        if let (Some(sent), Some(at)) = (sent, self.cut_at) {
            if sent <= at {
                return;
            }
        }
        let rate = self.explicit_pace();
        let cut = (u128::from(rate) * u128::from(num) / u128::from(den)) as u64;
        let cut = cut.max(self.floor_rate());
        debug!(
            path = self.info.path_id,
            rate, cut, why, "explicit rate: congestion"
        );
        self.undo_limit = undoable.then_some(self.limit);
        self.limit = Some(cut);
        self.cut_at = Some(now);
        self.grown_at = Some(now);
        self.explicit_events += 1;
    }

    /// Once per round trip without a cut: the limit grows (rule 3).
    fn grow_limit(&mut self, now: Instant) {
        let srtt = self.smoothed();
        if self
            .grown_at
            .is_some_and(|t| now.saturating_duration_since(t) < srtt)
        {
            return;
        }
        self.grown_at = Some(now);
        if let Some(limit) = self.limit {
            let (num, den) = LIMIT_GROWTH;
            let grown = limit.saturating_add((limit / den).saturating_mul(num).max(self.mss));
            // Kept (not dropped) once above the delivery allowance: dropping it would let the
            // rate jump to twice the delivery rate at once, an overshoot of the path.
            let delivery = self
                .delivery_max()
                .unwrap_or(0)
                .saturating_mul(DELIVERY_ALLOWANCE);
            self.limit = Some(grown.min(delivery.max(limit)));
        }
    }

    /// Whether a standing queue of at least `max(min_rtt / 4, 5 ms, 3 datagrams at the current
    /// rate)` shows: the least RTT sample of the last half smoothed RTT exceeds the path's
    /// minimum by that much. Not the smoothed RTT: on a radio link the delay swings by tens of
    /// milliseconds from one scheduling gap to the next while the queue stays empty, and only
    /// a queue that every packet waits in is the sender's doing.
    fn queue_too_long(&mut self, now: Instant) -> bool {
        let Some(min) = self.base.get(now, BASE_RTT_WINDOW) else {
            return false;
        };
        let Some(standing) = self.standing.get(now, self.smoothed() / 2) else {
            return false;
        };
        let queue = standing.saturating_sub(min);
        let packets = Duration::from_nanos(
            u64::try_from(
                u128::from(QUEUE_PACKETS * self.mss) * 1_000_000_000
                    / u128::from(self.explicit_pace().max(1)),
            )
            .unwrap_or(u64::MAX),
        );
        queue
            >= (min / QUEUE_DELAY_DIVISOR)
                .max(MIN_QUEUE_DELAY)
                .max(packets)
    }

    fn stamp_timeout(&self) -> Duration {
        let Some(rtt) = &self.rtt else {
            return self.info.initial_rtt.saturating_mul(STAMP_TIMEOUT_PTOS);
        };
        rtt.pto_base()
            .saturating_mul(STAMP_TIMEOUT_PTOS)
            .saturating_add(rtt.max_ack_delay())
    }
}

impl Controller for Explicit {
    fn on_sent(&mut self, now: Instant, bytes: u64, bytes_in_flight: u64) {
        self.fallback.on_sent(now, bytes, bytes_in_flight);
        if bytes_in_flight <= bytes && self.mode == Mode::Explicit {
            // Idle until now: the interval starts afresh, so idle time is not counted as a
            // slow delivery.
            self.interval_start = Some(now);
            self.interval_bytes = 0;
            self.interval_lost = 0;
        }
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.fallback.on_ack(now, sent, bytes, app_limited, rtt);
        self.rtt = Some(rtt.clone());
        self.interval_bytes = self.interval_bytes.saturating_add(bytes);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        bytes_in_flight: u64,
        app_limited: bool,
        largest_acked_sent: Option<Instant>,
    ) {
        self.fallback
            .on_end_acks(now, bytes_in_flight, app_limited, largest_acked_sent);
        // Each new RTT sample, less the peer's ACK delay: a sender paced slower than the
        // peer's ACK threshold fills would otherwise read the delayed ACKs as a queue.
        if let Some(rtt) = self
            .rtt
            .as_ref()
            .filter(|r| r.sample_count() != self.standing_count)
        {
            self.standing_count = rtt.sample_count();
            self.standing.push(now, rtt.latest_adjusted());
            self.base.push(now, rtt.latest_adjusted());
        }
        if self.mode != Mode::Explicit {
            return;
        }
        if self
            .last_echo
            .is_none_or(|t| now.saturating_duration_since(t) > self.stamp_timeout())
        {
            self.enter_fallback(now, "no RateEcho for a few round trips");
            return;
        }
        // A delivery-rate sample per interval of at least one smoothed RTT.
        let start = *self.interval_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= self.smoothed() {
            let rate = Self::per(self.interval_bytes, elapsed);
            let (num, den) = LOSS_RATIO;
            let lost = self.interval_lost;
            let frequent = lost >= 2 * self.mss
                && u128::from(lost) * u128::from(den)
                    > u128::from(lost + self.interval_bytes) * u128::from(num);
            if frequent {
                self.cut(now, largest_acked_sent, BETA, false, "frequent loss");
            }
            self.push_sample(now, rate);
            self.interval_start = Some(now);
            self.interval_bytes = 0;
            self.interval_lost = 0;
        }
        if self.queue_too_long(now) {
            self.cut(now, largest_acked_sent, DELAY_BETA, false, "queueing delay");
        } else {
            self.grow_limit(now);
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
        let before = self.fallback.metrics().congestion_events;
        self.fallback.on_congestion_event(
            now,
            largest_lost_sent,
            lost_bytes,
            persistent_congestion,
            rtt,
        );
        self.rtt = Some(rtt.clone());
        self.interval_lost = self.interval_lost.saturating_add(lost_bytes);
        let congestive = self.fallback.metrics().congestion_events != before;
        if congestive || persistent_congestion {
            self.cut(
                now,
                Some(largest_lost_sent),
                BETA,
                !persistent_congestion,
                "loss",
            );
        }
    }

    fn on_spurious_congestion_event(&mut self) {
        self.fallback.on_spurious_congestion_event();
        if let Some(limit) = self.undo_limit.take() {
            self.limit = limit;
        }
    }

    fn on_ecn_ce(
        &mut self,
        now: Instant,
        largest_acked_sent: Instant,
        newly_ce: u64,
        rtt: &RttEstimator,
    ) {
        self.fallback
            .on_ecn_ce(now, largest_acked_sent, newly_ce, rtt);
        self.rtt = Some(rtt.clone());
        self.cut(now, Some(largest_acked_sent), BETA, false, "ECN CE");
    }

    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        self.fallback.on_mtu_update(max_datagram_size);
        self.info.max_datagram_size = max_datagram_size;
        self.mss = u64::from(max_datagram_size).max(1);
    }

    fn on_rate_estimate(&mut self, now: Instant, bytes_per_second: u64, rtt: &RttEstimator) {
        self.fallback.on_rate_estimate(now, bytes_per_second, rtt);
        self.rtt = Some(rtt.clone());
        if self.mode == Mode::Explicit {
            self.push_sample(now, bytes_per_second);
        }
    }

    /// Always: the area is how routers learn of the flow, in fallback mode too (so that
    /// stamps can return).
    fn wants_rate_area(&self) -> bool {
        true
    }

    fn on_feedback_rate(
        &mut self,
        now: Instant,
        bytes_per_second: Option<u64>,
        rtt: &RttEstimator,
    ) {
        self.rtt = Some(rtt.clone());
        self.last_echo = Some(now);
        self.stamped = bytes_per_second;
        match (self.mode, bytes_per_second) {
            (Mode::Fallback, Some(_)) => self.enter_explicit(now),
            (Mode::Explicit, None) => self.enter_fallback(now, "no router lowered the rate"),
            _ => {}
        }
    }

    fn on_expected_rate(&mut self, bytes_per_second: Option<u64>) {
        self.expected = bytes_per_second;
    }

    fn window(&self) -> u64 {
        match self.mode {
            Mode::Fallback => self.fallback.window(),
            Mode::Explicit => Self::over(self.explicit_pace(), self.smoothed())
                .saturating_mul(WINDOW_GAIN)
                .max(2 * self.mss),
        }
    }

    fn pacing_rate(&self, rtt: &RttEstimator) -> Option<u64> {
        let rate = match self.mode {
            Mode::Explicit => return Some(self.explicit_pace()),
            Mode::Fallback => self.fallback.pacing_rate(rtt),
        };
        match self.expected {
            None => rate,
            Some(cap) => {
                let own = rate.unwrap_or_else(|| {
                    super::Pacer::default_rate(self.fallback.window(), rtt.smoothed())
                });
                Some(own.min(cap).max(1))
            }
        }
    }

    fn initial_window(&self) -> u64 {
        self.fallback.initial_window()
    }

    fn metrics(&self) -> Metrics {
        let mut m = self.fallback.metrics();
        m.non_congestive_losses += self.retired_non_congestive;
        m.persistent_congestion_events += self.retired_persistent;
        match self.mode {
            Mode::Fallback => {
                m.congestion_events += self.retired_events + self.explicit_events;
                if self.expected.is_some() {
                    m.pacing_rate = self.pacing_rate(
                        &self
                            .rtt
                            .clone()
                            .unwrap_or_else(|| RttEstimator::new(self.info.initial_rtt)),
                    );
                }
            }
            Mode::Explicit => {
                m.congestion_events = self.retired_events + self.shadow_base + self.explicit_events;
                m.window = self.window();
                m.pacing_rate = Some(self.explicit_pace());
                m.in_slow_start = false;
                m.ssthresh = Some(m.window);
            }
        }
        m
    }

    fn name(&self) -> &'static str {
        "explicit"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::{ack_round_trip, epoch, rtt_with};

    const MS: Duration = Duration::from_millis(1);
    const MSS: u64 = 1200;

    fn explicit() -> Explicit {
        Explicit::new(
            ExplicitConfig::default().get_fallback().clone(),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        )
    }

    /// Round trips of a full window, each followed by an echo of `stamp`.
    fn rounds(
        cc: &mut Explicit,
        mut now: Instant,
        rtt: &RttEstimator,
        n: u32,
        stamp: Option<u64>,
    ) -> Instant {
        for _ in 0..n {
            now = ack_round_trip(cc, now, rtt, MSS);
            cc.on_feedback_rate(now, stamp, rtt);
        }
        now
    }

    #[test]
    fn it_asks_for_the_rate_area_and_starts_with_its_fallback() {
        let cc = explicit();
        assert!(cc.wants_rate_area());
        assert_eq!(cc.mode(), Mode::Fallback);
        assert_eq!(cc.name(), "explicit");
        assert_eq!(cc.window(), cc.fallback_controller().window());
    }

    #[test]
    fn an_unlowered_echo_means_no_router_and_a_stamp_brings_explicit_mode() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = explicit();
        let now = rounds(&mut cc, epoch(), &rtt, 2, None);
        assert_eq!(cc.mode(), Mode::Fallback, "0xFFFFFFFF: no router");
        let now = rounds(&mut cc, now, &rtt, 1, Some(500_000));
        assert_eq!(cc.mode(), Mode::Explicit);
        assert_eq!(cc.pacing_rate(&rtt), Some(500_000));
        // The window lets pacing set the rate: 2 × rate × RTT.
        assert_eq!(cc.window(), 2 * 500_000 * 40 / 1000);
        rounds(&mut cc, now, &rtt, 1, None);
        assert_eq!(cc.mode(), Mode::Fallback);
        assert_eq!(cc.mode_switches(), 2);
    }

    #[test]
    fn a_path_that_became_longer_is_not_read_as_a_queue_for_good() {
        // A handover to a longer path (same addresses): every RTT sample from then on is 60
        // ms above the connection's minimum. Measured against that minimum it was a queue at
        // every round trip, and the rate stayed pinned near 3 datagrams / 60 ms, whatever the
        // router stamped (found by an outside read); against a 10 s window it is the new base.
        let stamp = 1_250_000; // 10 Mbit/s
        let mut cc = explicit();
        let mut rtt = rtt_with(40 * MS, 40 * MS);
        // Round trips with one new RTT sample of `sample` each.
        let run = |cc: &mut Explicit, rtt: &mut RttEstimator, mut now, n, sample| {
            for _ in 0..n {
                rtt.update(Duration::ZERO, sample);
                now = rounds(cc, now, rtt, 1, Some(stamp));
            }
            now
        };
        let now = run(&mut cc, &mut rtt, epoch(), 20, 40 * MS);
        assert_eq!(cc.pacing_rate(&rtt), Some(stamp));
        let now = run(&mut cc, &mut rtt, now, 300, 100 * MS);
        assert_eq!(rtt.min(), Some(40 * MS), "the connection's minimum stays");
        let rate = cc.pacing_rate(&rtt).expect("paced");
        assert!(rate >= stamp * 9 / 10, "{rate} of {stamp}");
        // A queue on the new path is still one.
        run(&mut cc, &mut rtt, now, 5, 160 * MS);
        assert!(cc.pacing_rate(&rtt).expect("paced") < stamp * 9 / 10);
    }

    #[test]
    fn the_fallback_starts_from_the_explicit_rate_not_the_initial_window() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = explicit();
        let rate = 12_500_000; // 100 Mbit/s: 500 kB per 40 ms, far above 32 datagrams
        let now = rounds(&mut cc, epoch(), &rtt, 8, Some(rate));
        assert_eq!(cc.pacing_rate(&rtt), Some(rate));
        // Echoes stop while ACKs keep coming.
        let mut now = now;
        for _ in 0..6 {
            now = ack_round_trip(&mut cc, now, &rtt, MSS);
        }
        assert_eq!(cc.mode(), Mode::Fallback);
        let bdp = rate * 40 / 1000;
        assert!(cc.window() >= bdp, "window {} < {bdp}", cc.window());
        assert!(!cc.metrics().in_slow_start, "seeded: congestion avoidance");
    }

    #[test]
    fn the_expected_rate_caps_both_modes() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = explicit();
        cc.on_expected_rate(Some(100_000));
        assert_eq!(cc.pacing_rate(&rtt), Some(100_000), "fallback mode");
        rounds(&mut cc, epoch(), &rtt, 2, Some(1_000_000));
        assert_eq!(cc.pacing_rate(&rtt), Some(100_000), "explicit mode");
        assert_eq!(cc.metrics().pacing_rate, Some(100_000));
    }

    #[test]
    fn loss_and_queueing_delay_cut_the_rate_below_the_stamp() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = explicit();
        let stamp = 1_000_000;
        let now = rounds(&mut cc, epoch(), &rtt, 4, Some(stamp));
        assert_eq!(cc.pacing_rate(&rtt), Some(stamp));
        // Persistent congestion: whatever the shadow says, a cut by β.
        cc.on_congestion_event(now, now, 10 * MSS, true, &rtt);
        let cut = cc.pacing_rate(&rtt).expect("paced");
        assert_eq!(cut, stamp * 7 / 10);
        assert_eq!(cc.metrics().congestion_events, 1);
        // A second signal about a packet sent before the cut is the same congestion.
        cc.on_congestion_event(now, now - MS, 10 * MSS, true, &rtt);
        assert_eq!(cc.pacing_rate(&rtt), Some(cut));
        // A standing queue (60 ms over a 40 ms base) cuts again, a round trip later.
        let queued = rtt_with(40 * MS, 100 * MS);
        let later = now + 100 * MS;
        cc.on_ack(later, now + MS, MSS, false, &queued);
        cc.on_end_acks(later, 0, false, Some(now + MS));
        cc.on_feedback_rate(later, Some(stamp), &queued);
        let again = cc.pacing_rate(&queued).expect("paced");
        assert!(again < cut, "{again} >= {cut}");
    }

    #[test]
    fn a_spurious_loss_undoes_its_cut() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = explicit();
        let stamp = 1_000_000;
        let now = rounds(&mut cc, epoch(), &rtt, 4, Some(stamp));
        // A burst the shadow CUBIC judges congestive (its loss ratio crosses 10 %).
        cc.on_congestion_event(now, now, 40 * MSS, false, &rtt);
        assert_eq!(cc.pacing_rate(&rtt), Some(stamp * 7 / 10));
        cc.on_spurious_congestion_event();
        assert_eq!(cc.pacing_rate(&rtt), Some(stamp));
    }
}
