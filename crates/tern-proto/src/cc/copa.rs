//! Copa (Arun & Balakrishnan, "Copa: Practical Delay-Based Congestion Control for the
//! Internet", NSDI 2018): a delay-based controller for cellular links.
//!
//! # Why Copa
//!
//! tern is built for phones and vehicles on LTE/5G links whose rate swings by several times
//! within seconds and whose base stations hold deep per-user buffers. A loss-based controller
//! fills those buffers before it sees a loss, so every interactive flow behind it waits
//! seconds. Copa steers by the queueing delay instead: it targets the rate
//! `λt = 1 / (δ · d_q)` packets per second, where `d_q = RTTstanding − RTTmin` is the queueing
//! delay it measures, and moves its window towards that target on every ACK. The queue it keeps
//! is about `1/δ` packets (two at δ = 0.5) per flow, whatever the link rate, so when the link
//! slows the delay rises, the target falls and the window follows within a few round trips.
//! On the paper's cellular traces (§5, the Pantheon LTE emulations and real cellular paths)
//! Copa stays near the throughput of CUBIC and BBR with a small fraction of their queueing
//! delay. Unlike Sprout or Verus, which need a stochastic model trained for the link or
//! per-link parameters, Copa has one knob (δ) with a sensible default; unlike other
//! delay-based schemes (Vegas, LEDBAT) it has a competitive mode that keeps it from starving
//! next to a buffer-filling loss-based flow.
//!
//! # The algorithm (paper §2), as implemented
//!
//! On every ACK frame (the paper's per-packet steps, applied to the bytes the frame newly
//! acknowledges):
//! 1. `RTTstanding` = the smallest RTT sample of the last `srtt / 2` (filters ACK compression
//!    and jitter while following the queue within a round trip); `RTTmin` = the smallest of the
//!    last 10 s; `d_q = RTTstanding − RTTmin`. (tern's Copa takes medians and a noise floor
//!    instead: "The delay level under in-order jitter" below.)
//! 2. `λt = 1 / (δ · d_q)` (infinite with no queue); the current rate is
//!    `λ = cwnd / RTTstanding`.
//! 3. If `λ ≤ λt` the window grows by `v / (δ · cwnd)` packets, otherwise it shrinks by as much
//!    (per acknowledged packet, so about `v / δ` packets per round trip).
//! 4. Velocity `v`: once per RTT the window is compared with its value one RTT earlier; after
//!    the direction (up / down) has stayed the same for three RTTs, `v` doubles every RTT; a
//!    change of direction resets it to 1. As mvfst does, `v` also resets to 1 at once when the
//!    per-ACK decision goes against the recorded direction, so a large `v` built up going one
//!    way never slams the window the other way.
//! 5. Slow start: the window doubles per RTT (grows by the acknowledged bytes) until `λ`
//!    exceeds `λt` for the first time.
//! 6. Competitive mode (the constants are the paper's §2.2 as read by this module's author;
//!    the text could not be re-checked while writing it): the queue is "nearly empty" when
//!    `d_q < 0.1 × (RTTmax − RTTmin)`, with `RTTmax` the largest RTT of the last four RTTs. A lone Copa flow's window oscillates
//!    around its target and empties the queue about every five RTTs; if the queue was not
//!    nearly empty at least once in the last five RTTs, a buffer-filling flow is present and
//!    Copa switches to competitive mode, where `1/δ` follows AIMD: +1 per RTT, halved on a loss
//!    (once per RTT), never below `1/δ_default`. Back in default mode δ returns to its default.
//!
//! Pacing is at `2 × cwnd / RTTstanding`, as in the paper (twice the window's rate: pacing
//! spreads the packets without ever limiting the window), and [`Controller::window`] is
//! `cwnd`.
//!
//! # Loss, and what differs from the paper
//!
//! - **Loss is not a signal** in default mode (it is counted in
//!   [`Metrics::non_congestive_losses`]): this is what makes Copa robust to radio loss. Only
//!   **persistent congestion** (RFC 9002 §7.6: nothing delivered for several PTOs) collapses
//!   the window to its minimum (2 datagrams), resets `v` and re-enters slow start: the delay
//!   signal is gone when nothing gets through, so the window must not stay large.
//! - **A loss backstop** ([`CopaConfig::loss_backstop`], on in tern's Copa, not the paper's):
//!   a bottleneck that drops without queueing (a policer, a buffer shallower than the noise
//!   floor) never raises `d_q`, so the paper's Copa keeps pushing against it, its velocity
//!   doubling: beside kernel TCP CUBIC at a buffer of a tenth of the BDP (`tern-bench run
//!   coexist`, `lte`) the bottleneck dropped 88 % of what was offered to it and TCP kept 0.5 %
//!   of the link. So when the loss ratio (an EWMA over datagrams, as [`Classic`]'s) is above
//!   [`TERN_LOSS_BACKSTOP`] (10 %), a loss cuts the window to the delivery rate × `RTTmin`
//!   (at most once per round trip, outside competitive mode, which has its own AIMD). Random
//!   radio loss below 10 % stays no signal.
//! - One RTT sample per ACK frame, `now − sent` of the newest packet it acknowledges (RFC 9002
//!   §5.1's sample). The older packets of a frame waited for the peer's delayed ACK (tern's
//!   peer ACKs every 10 packets at high rates), and with their samples the ACK wait looks like
//!   a queue of that many packets (in `tern-sim`, δ = 0.5, 65.8 % of the link instead of
//!   68.1 %).
//! - The velocity comparison runs once per smoothed RTT of wall time rather than once per
//!   window of packets.
//! - App-limited ACKs never grow the window.
//! - [`Controller::on_rate_estimate`]: with an RTT sample, the window becomes `rate × RTTmin`
//!   (the measured bandwidth-delay product) if that is larger (an estimate never shrinks
//!   it, as with Classic), and slow start ends, since its job is done.
//!
//!
//! # δ on tern's links: the burst floor
//!
//! The default δ = 0.5 (the paper's, and [`CopaConfig::default`]'s) aims at a queue of
//! 1/δ = 2 packets per flow: 0.46 ms at 50 Mbit/s. At such rates tern's peer acknowledges
//! every 10 packets, so the window opens 10 packets at a time and the
//! [`Pacer`](super::Pacer)'s 10-datagram bucket lets them leave back to back: the packet that
//! triggers the next ACK (the one whose RTT is sampled) has queued behind the nine before it,
//! about 2 ms, even while the link idles between bursts. `RTTstanding` then never comes down
//! to `RTTmin` plus the target, and Copa settles at about 0.75 of the bandwidth-delay product.
//! In `tern-sim` (50 Mbit/s, 40 ms, one BDP of drop-tail buffer, `tests/cc_copa.rs`):
//!
//! | controller | goodput after 1 s | mean / max queue | at 1 % random loss (seeds 1–3) |
//! |------------|-------------------|------------------|--------------------------------|
//! | Copa δ = 0.5 | 68.1 % | 0.9 / 2.5 ms | 81, 79, 93 % |
//! | Copa δ = 0.1 | 96.9 % | 3.4 / 12.0 ms | 98, 97, 96 % |
//! | CUBIC        | 97.4 % | 23.9 / 28.5 ms | |
//!
//! The link simulation in `cc/tests.rs`, which ACKs every packet, confirms that the limit is
//! the burst, not Copa: there δ = 0.5 reaches 98.9 % with a 0.7 ms mean queue (96.7 % at 1 %
//! loss). So on tern, 1/δ should be at least the burst size: δ = 0.1 fills the link with a
//! seventh of CUBIC's queue (mvfst and TQUIC default to δ = 0.05 and 0.04). So tern's
//! [`Algorithm::Copa`](super::Algorithm::Copa) (what `tern --cc copa` runs) uses
//! [`TERN_DELTA`] = 0.1; [`CopaConfig::default`] keeps the paper's 0.5 for comparisons.
//!
//! # The delay level under in-order jitter
//!
//! A radio link delivers in order: a packet held back by the scheduler (or a HARQ
//! retransmission) holds back every packet behind it. tern-netem's `jitter` models this (each
//! packet gets up to `jitter` of extra delay, never overtaking the one before), and so do the
//! `5g` (4 ms each way), `lte` (2 ms) and `wifi` (0.5 ms) profiles. A dense flight's packets
//! then all wait about the whole jitter, while a lone packet after a pause (the handshake, the
//! first of a burst) sees the bare path. The paper's `RTTmin`, the lowest sample of 10 s, is
//! such a lone packet's, and its `RTTstanding`, the lowest of the last `srtt / 2`, is also set
//! by a lucky sample; `d_q` then reads the jitter as a queue of several milliseconds. At 300
//! Mbit/s that is ten times the queue of 1/δ packets Copa aims for, so Copa held the rate at
//! 1 / (δ · jitter): 31–34 Mbit/s of 300 on `5g` at 1 % loss (0.11 × kernel BBR's throughput),
//! and its competitive mode switched on because the "queue" never emptied.
//!
//! tern's Copa ([`CopaConfig::tern`]) measures the delay level the flight itself sees:
//! - `RTTstanding` is the **median** of the samples of the last `srtt / 2`
//!   ([`CopaConfig::standing_quantile`]), and `RTTmin` the lowest such median over 10 s among
//!   windows of at least [`LEVEL_MIN_SAMPLES`] samples (the samples' minimum until one is
//!   full). One lucky sample sets neither. In slow start, where ACKs are sparse and one
//!   reading above the target ends it, a window of fewer than [`STANDING_MIN_SAMPLES`]
//!   samples reaches back to the newest four, so that one late sample does not end it
//!   either: the median of two samples is the larger, and on the 5G drive trace such a
//!   pair ended slow start at 16 Mbit/s of a 150 Mbit/s cell in about half the runs.
//! - `d_q` is less a **noise floor** of 2 ms ([`CopaConfig::noise_floor`], the floor of the
//!   classic controllers' standing-queue test), at most `RTTmin / 4`. A median still wanders
//!   by a millisecond or so from window to window under jitter; at 300 Mbit/s Copa's own
//!   target queue is 0.4 ms, so without the floor the wander alone capped the rate (77 of 300
//!   Mbit/s on `5g` at 1 %). The quarter-RTT cap keeps the queue the floor lets stand small
//!   on short paths (`wifi`: about 1.2 ms).
//! - Under the floor the target is unbounded, so the window rises until the queue reaches
//!   it; in a round where the queue was under the floor (but not zero) the velocity is capped
//!   so that the window grows by at most an eighth per round trip
//!   ([`NOISE_BAND_GROWTH_DIVISOR`]). Without a cap, three rounds of rising inside the band
//!   doubled `v` up to 16 on a clean 300 Mbit/s link, and the window swung between 0.5 and
//!   1.6 BDP (85 % of the link in the link simulation of `cc/tests.rs`). A first rule held
//!   `v` at 1 there (97 %), but then the window grew by only `1/δ` = 10 datagrams per round
//!   trip wherever jitter keeps the queue inside the band: on the 5G drive trace Copa took
//!   1.8 s to reach 122 Mbit/s of a 140–190 Mbit/s cell that kernel BBR filled in 0.4 s. With
//!   the cap the same link simulation gives 97.9 %, and the trace 0.83 × kernel BBR's
//!   throughput instead of 0.73–0.74.
//!
//! The price is a standing queue of about the floor where the paper's Copa would keep 1/δ
//! packets: about 2 ms more queueing delay on fast clean links. In the link simulation
//! (`copa_keeps_the_link_under_in_order_jitter`, 15 ms, 1 % loss, jitter on data and ACKs),
//! the paper's filters and tern's filled 52.9 % and 98.3 % of 50 Mbit/s at 4 ms of jitter,
//! 22.7 % and 97.0 % of 300 Mbit/s at 2 ms, and 98.1 % and 97.3 % of 300 Mbit/s without
//! jitter (mean queue 0.5 and 3.3 ms). [`CopaConfig::default`] keeps the paper's filters.
//!
//! # After a capacity collapse
//!
//! A cell's rate can fall forty-fold in a moment (the 5G drive trace in `../shared/traces`:
//! 140 Mbit/s, then about 3 for seconds). Everything in flight then queues behind the slower
//! link and the round trip becomes the queue's, seconds long. The paper's steps take `v / δ`
//! packets off the window per round trip, so with rounds that long the window stays many
//! times the new bandwidth-delay product for many seconds, and its competitive mode reads a
//! queue that has not emptied for five round trips as a buffer-filling competitor and keeps
//! it full. tern's Copa ([`CopaConfig::queue_bound`]) cuts the window once the queue is
//! longer than [`QUEUE_BOUND_RTTS`] × `RTTmin`: to [`QUEUE_BOUND_GAIN`] × the delivery rate
//! (bytes acknowledged per second over the last `srtt`, which behind a standing queue is the
//! bottleneck's rate) × `RTTmin`, so that at most one `RTTmin` of queue is left for the
//! normal steps to take down. A queue that long is not one Copa keeps itself (its target is
//! `1/δ` packets), so the cut is off in competitive mode, where another flow's queue is
//! expected. The threshold is four `RTTmin` because an LTE link's ordinary swings leave
//! queues of one or two: with the cut at one `RTTmin` the T-Mobile trace lost 14 % of its
//! throughput (one run each way, `tern-bench run cc --quick --trace TMobile-LTE-short`).
//!
//! In the link simulation (`copa_drains_the_queue_a_capacity_collapse_leaves`, a tenfold to
//! fortyfold fall after 5 s, two bandwidth-delay products of buffer), the p95 queueing delay
//! of the packets sent from a second after the fall goes from 1.70 s to 319 ms (140 → 3
//! Mbit/s, 36 ms), from 1.46 s to 358 ms (50 → 2, 60 ms) and from 678 to 338 ms (20 → 2, 80
//! ms), with the same throughput. What stands then is competitive mode's: at 2–3 Mbit/s
//! Copa's own 1/δ = 10 datagrams are 30–50 ms, more than a tenth of the RTT spread, so the
//! queue never looks nearly empty (a known limit, docs/BENCHMARKS.md). On the 5G drive
//! trace the p95 went from 1.8–2.0 to 0.10–0.15 × kernel BBR's.
//!
//! [`Classic`]: super::Classic

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::classic::next_loss_ratio;
use super::windowed::{Windowed, WindowedQuantile};
use super::{Controller, ControllerFactory, Metrics, PathInfo};
use crate::recovery::rtt::RttEstimator;

/// The paper's default δ: a queue of about 1/δ = 2 packets per flow.
pub const DEFAULT_DELTA: f64 = 0.5;

/// δ of tern's built-in Copa ([`Algorithm::Copa`](super::Algorithm::Copa)): a target queue
/// of 1/δ = 10 packets, the size of the bursts tern's ACK frequency lets leave together
/// (see "δ on tern's links" above).
pub const TERN_DELTA: f64 = 0.1;

/// Window of the `RTTmin` filter (paper: "RTTmin [...] over the past 10 seconds").
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);

/// The quantile of the standing window's RTT samples that tern's Copa takes as its delay level
/// ([`CopaConfig::standing_quantile`]; "The delay level under in-order jitter" above).
pub const TERN_STANDING_QUANTILE: f64 = 0.5;

/// tern's Copa takes delay differences below this as noise, not a queue
/// ([`CopaConfig::noise_floor`]; "The delay level under in-order jitter" above): the floor of
/// tern's classic controllers' standing-queue test.
pub const TERN_NOISE_FLOOR: Duration = super::classic::MIN_STANDING_QUEUE;

/// The loss ratio above which tern's Copa takes a loss as congestion
/// ([`CopaConfig::loss_backstop`]): the classic controllers' default threshold, so that random
/// radio loss below it stays no signal while a policer or a buffer too shallow for a queue to
/// form cannot be overrun without limit (`tern-bench run coexist`: 88 % of the packets
/// offered to a buffer of a tenth of the BDP were dropped without it).
pub const TERN_LOSS_BACKSTOP: f64 = 0.10;

/// The noise floor is at most `RTTmin` over this, so that on a short path the queue it lets
/// stand adds at most a quarter to the round trip.
pub const NOISE_FLOOR_RTT_DIVISOR: u32 = 4;

/// Samples a standing window needs before its level can set `RTTmin`: a sparser window's
/// quantile is its minimum, the lone-packet delay the quantile is there to avoid.
pub const LEVEL_MIN_SAMPLES: usize = 8;

/// The fewest RTT samples tern's `RTTstanding` (a quantile) is taken over in slow start: when
/// the last `srtt / 2` holds fewer, it reaches back to the newest this many. ACKs are sparse
/// in slow start (a window of 60 datagrams, one ACK per 8), the median of two samples is the
/// larger, and slow start ends at the first reading above the target: on the 5G drive trace
/// one late sample (47.5 ms against 36–37) ended it at 16 Mbit/s of a 150 Mbit/s cell. After
/// slow start the window alone is used: taken over four samples there too, Copa kept less
/// of `5g` at 1 % loss (0.71–0.93 × kernel BBR's throughput against 0.95–0.98, four pairs).
pub const STANDING_MIN_SAMPLES: usize = 4;

/// With [`CopaConfig::queue_bound`], a queue longer than [`QUEUE_BOUND_RTTS`] × `RTTmin` cuts
/// the window to this many times the delivery rate × `RTTmin` ("After a capacity collapse"
/// above): what is left queued after the cut is at most one `RTTmin`.
pub const QUEUE_BOUND_GAIN: f64 = 2.0;

/// The queue bound acts on a queue longer than this many `RTTmin`s: a cell whose capacity
/// collapsed, not the swings a radio link's rate makes all the time.
pub const QUEUE_BOUND_RTTS: u32 = 4;

/// Most ACK frames the delivery-rate window keeps (a bound on memory at any ACK rate).
const MAX_ACK_RECORDS: usize = 4096;

/// In a round whose queue stayed under the noise floor, the velocity is capped so that the
/// window grows by at most `cwnd` over this per round trip.
pub const NOISE_BAND_GROWTH_DIVISOR: f64 = 8.0;

/// Round trips of the same direction before the velocity starts doubling.
pub const VELOCITY_THRESHOLD: u32 = 3;

/// The queue is "nearly empty" below this share of `RTTmax − RTTmin`.
pub const NEARLY_EMPTY: f64 = 0.1;

/// `RTTmax` is the largest RTT of this many RTTs.
pub const RTT_MAX_ROUNDS: u32 = 4;

/// Competitive mode starts when the queue was not nearly empty for this many RTTs.
pub const COMPETITIVE_ROUNDS: u32 = 5;

/// Initial and minimum windows, in datagrams.
const INITIAL_WINDOW_PACKETS: u32 = 10;
const MIN_WINDOW_PACKETS: f64 = 2.0;

/// Largest window in bytes (as [`super::classic::MAX_WINDOW`]).
const MAX_WINDOW: f64 = (1u64 << 48) as f64;

/// Largest velocity (2^20): reached only after twenty RTTs of doubling.
const MAX_VELOCITY: f64 = (1u64 << 20) as f64;

/// Direction of the window over the last RTT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The window grew.
    Up,
    /// The window shrank (or stayed).
    Down,
}

/// The rate at which ACK frames acknowledge bytes over the last stretch of time: the
/// bottleneck's delivery rate while a queue stands in front of it.
#[derive(Debug, Clone, Default)]
struct AckRate {
    /// (time of the ACK frame, bytes it newly acknowledged), times increasing.
    frames: VecDeque<(Instant, u64)>,
    /// Bytes of every frame but the oldest (the oldest only marks where the span starts).
    bytes: u64,
}

impl AckRate {
    /// Records an ACK frame and forgets the frames that fell out of the last `window`, so
    /// that the deque holds one window's frames rather than [`MAX_ACK_RECORDS`] of them.
    fn push(&mut self, now: Instant, bytes: u64, window: Duration) {
        let now = self.frames.back().map_or(now, |&(t, _)| t.max(now));
        if !self.frames.is_empty() {
            self.bytes = self.bytes.saturating_add(bytes);
        }
        self.frames.push_back((now, bytes));
        if self.frames.len() > MAX_ACK_RECORDS {
            self.pop_oldest();
        }
        self.trim(now, window);
    }

    /// Drops the oldest frames while the next one is at least `window` old: the oldest kept
    /// marks where the span starts.
    fn trim(&mut self, now: Instant, window: Duration) {
        while self.frames.len() > 2
            && self
                .frames
                .get(1)
                .is_some_and(|&(t, _)| now.saturating_duration_since(t) >= window)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        self.frames.pop_front();
        if let Some(&(_, next)) = self.frames.front() {
            self.bytes = self.bytes.saturating_sub(next);
        }
    }

    /// Bytes per second acknowledged over the last `window` before `now`, if the frames kept
    /// span at least half of it (a shorter span is one burst of ACKs, not a rate).
    fn get(&mut self, now: Instant, window: Duration) -> Option<f64> {
        self.trim(now, window);
        let (&(first, _), &(last, _)) = (self.frames.front()?, self.frames.back()?);
        let span = last.saturating_duration_since(first);
        (!span.is_zero() && span >= window / 2).then(|| self.bytes as f64 / span.as_secs_f64())
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
    }
}

/// Copa. Build it with [`CopaConfig`].
#[derive(Debug, Clone)]
pub struct Copa {
    config: CopaConfig,
    /// Current maximum datagram size, at least 1.
    mss: u64,
    /// Window in bytes.
    cwnd: f64,
    initial_window: u64,
    slow_start: bool,
    /// Current δ (the default, or the competitive-mode value).
    delta: f64,
    competitive: bool,
    velocity: f64,
    direction: Direction,
    same_direction_rounds: u32,
    /// An ACK of this round saw a queue, but one under the noise floor.
    in_noise_band: bool,
    /// Window and time at the last velocity check.
    round_cwnd: f64,
    round_start: Option<Instant>,
    /// A loss was seen in the current round (competitive mode's AIMD).
    loss_in_round: bool,
    /// Send time of the newest packet sent when competitive mode last halved 1/δ.
    last_loss_reaction: Option<Instant>,
    last_sent: Option<Instant>,
    /// Bytes acknowledged by the ACK frame being processed.
    batch_bytes: u64,
    /// Every packet of the frame was sent while app-limited.
    batch_app_limited: bool,
    /// Send time of the newest packet of the frame.
    batch_newest: Option<Instant>,
    /// Time the queue was last nearly empty (or the controller started).
    last_nearly_empty: Instant,
    srtt: Duration,
    /// Samples of the standing window (`srtt / 2`); `RTTstanding` is their configured quantile.
    standing: WindowedQuantile,
    /// `RTTstanding` as of the latest RTT sample (pacing reads it), with the time it was
    /// taken at, so that the same ACK frame's window update reuses it.
    last_standing: Option<(Instant, Duration)>,
    /// Windowed minimum of the standing levels of windows with at least [`LEVEL_MIN_SAMPLES`]
    /// samples: `RTTmin` when the quantile is above 0.
    level_min: Windowed,
    /// Windowed minimum of the samples: `RTTmin` with the quantile at 0 (the paper's), or until
    /// a window is full.
    min: Windowed,
    max: Windowed,
    /// Delivery rate over the last `srtt`, for the queue bound and the loss backstop.
    ack_rate: AckRate,
    /// EWMA of the loss ratio over datagrams, as [`Classic`]'s
    /// ([`LOSS_RATIO_GAIN`](super::classic::LOSS_RATIO_GAIN) per datagram).
    loss_ratio: f64,
    non_congestive_losses: u64,
    congestion_events: u64,
    persistent_congestion_events: u64,
}

impl Copa {
    /// A controller in slow start for the path `info`.
    pub fn new(config: &CopaConfig, now: Instant, info: &PathInfo) -> Self {
        let mss = u64::from(info.max_datagram_size).max(1);
        let initial_window = u64::from(config.initial_window_packets) * mss;
        let config = config.clone();
        let delta = config.delta;
        Self {
            config,
            mss,
            cwnd: initial_window as f64,
            initial_window,
            slow_start: true,
            delta,
            competitive: false,
            velocity: 1.0,
            direction: Direction::Up,
            same_direction_rounds: 0,
            in_noise_band: false,
            round_cwnd: initial_window as f64,
            round_start: None,
            loss_in_round: false,
            last_loss_reaction: None,
            last_sent: None,
            batch_bytes: 0,
            batch_app_limited: true,
            batch_newest: None,
            last_nearly_empty: now,
            srtt: info.initial_rtt,
            standing: WindowedQuantile::default(),
            last_standing: None,
            level_min: Windowed::new(false),
            min: Windowed::new(false),
            max: Windowed::new(true),
            ack_rate: AckRate::default(),
            loss_ratio: 0.0,
            non_congestive_losses: 0,
            congestion_events: 0,
            persistent_congestion_events: 0,
        }
    }

    /// Whether the controller is in slow start.
    pub fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    /// The δ in use now.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// Whether competitive mode is on.
    pub fn is_competitive(&self) -> bool {
        self.competitive
    }

    /// The velocity `v`.
    pub fn velocity(&self) -> f64 {
        self.velocity
    }

    /// The direction recorded at the last velocity check.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// `RTTstanding` and `RTTmin` as of `now`, if there are samples.
    pub fn rtts(&mut self, now: Instant) -> Option<(Duration, Duration)> {
        // The level the frame's RTT sample just computed, if it is of this instant: the
        // quantile is a selection over the window, not worth doing twice per ACK frame.
        let standing = match self.last_standing {
            Some((at, level)) if at == now => level,
            _ => self.standing_level(now)?.0,
        };
        let min = match self.level_min.get(now, MIN_RTT_WINDOW) {
            Some(level) if self.config.standing_quantile > 0.0 => level,
            _ => self.min.get(now, MIN_RTT_WINDOW)?,
        };
        Some((standing, min.min(standing)))
    }

    /// Takes an RTT sample into the filters.
    fn on_rtt_sample(&mut self, now: Instant, sample: Duration) {
        self.standing.push(now, sample);
        self.min.push(now, sample);
        self.max.push(now, sample);
        if let Some((level, samples)) = self.standing_level(now) {
            self.last_standing = Some((now, level));
            if samples >= LEVEL_MIN_SAMPLES {
                self.level_min.push(now, level);
            }
        }
    }

    /// The configured quantile of the standing window (the last `srtt / 2`, widened to
    /// [`Copa::standing_min_samples`]) and how many samples it was taken over.
    fn standing_level(&mut self, now: Instant) -> Option<(Duration, usize)> {
        let min_samples = self.standing_min_samples();
        self.standing.get(
            now,
            self.srtt / 2,
            self.config.standing_quantile,
            min_samples,
        )
    }

    /// How many samples `RTTstanding` is taken over at least: [`STANDING_MIN_SAMPLES`] for a
    /// quantile in slow start, whose exit is decided once; otherwise one (the window alone).
    fn standing_min_samples(&self) -> usize {
        if self.slow_start && self.config.standing_quantile > 0.0 {
            STANDING_MIN_SAMPLES
        } else {
            1
        }
    }

    /// Target rate `λt = 1 / (δ · d_q)` in bytes per second for a queueing delay `queue`
    /// (`None` = no queue, no limit).
    pub fn target_rate(&self, queue: Duration) -> Option<f64> {
        let dq = queue.as_secs_f64();
        (dq > 0.0).then(|| self.mss as f64 / (self.delta * dq))
    }

    fn min_window(&self) -> f64 {
        MIN_WINDOW_PACKETS * self.mss as f64
    }

    fn set_cwnd(&mut self, cwnd: f64) {
        let min = self.min_window();
        self.cwnd = if cwnd.is_finite() {
            cwnd.clamp(min, MAX_WINDOW)
        } else {
            min
        };
    }

    /// Once per RTT: velocity (paper §2.1, "velocity parameter") and competitive-mode AIMD.
    fn on_round(&mut self, now: Instant) {
        let Some(start) = self.round_start else {
            self.round_start = Some(now);
            self.round_cwnd = self.cwnd;
            return;
        };
        if now < start {
            self.round_start = Some(now);
            return;
        }
        if now - start < self.srtt {
            return;
        }
        self.round_start = Some(now);
        if !self.slow_start {
            let direction = if self.cwnd > self.round_cwnd {
                Direction::Up
            } else {
                Direction::Down
            };
            if direction == self.direction {
                self.same_direction_rounds = self.same_direction_rounds.saturating_add(1);
                if self.same_direction_rounds >= VELOCITY_THRESHOLD {
                    self.velocity = (self.velocity * 2.0).min(MAX_VELOCITY);
                }
            } else {
                self.direction = direction;
                self.same_direction_rounds = 0;
                self.velocity = 1.0;
            }
            if std::mem::take(&mut self.in_noise_band) {
                // A queue under the noise floor: how near the target is unknown, so the window
                // grows by at most an eighth per round trip (no velocity built up to overshoot
                // the band with).
                let packets = self.cwnd / self.mss as f64;
                let cap = (self.delta * packets / NOISE_BAND_GROWTH_DIVISOR).max(1.0);
                self.velocity = self.velocity.min(cap);
            }
        }
        self.round_cwnd = self.cwnd;
        if self.competitive && !std::mem::take(&mut self.loss_in_round) {
            // 1/δ += 1 per RTT without loss.
            self.delta = 1.0 / (1.0 / self.delta + 1.0);
        }
        self.loss_in_round = false;
    }

    /// `d_q`: `RTTstanding − RTTmin`, less the noise floor (the configured one, at most
    /// `RTTmin / NOISE_FLOOR_RTT_DIVISOR`).
    fn queue_delay(&self, standing: Duration, min: Duration) -> Duration {
        let floor = self.config.noise_floor.min(min / NOISE_FLOOR_RTT_DIVISOR);
        standing.saturating_sub(min).saturating_sub(floor)
    }

    /// Default or competitive mode, from whether the queue was nearly empty recently.
    fn update_mode(&mut self, now: Instant, standing: Duration, min: Duration) {
        let rtt_max = self
            .max
            .get(now, self.srtt * RTT_MAX_ROUNDS)
            .unwrap_or(standing)
            .max(standing);
        let dq = self.queue_delay(standing, min).as_secs_f64();
        let spread = rtt_max.saturating_sub(min).as_secs_f64();
        if dq <= NEARLY_EMPTY * spread {
            self.last_nearly_empty = now;
        }
        let competitive =
            now.saturating_duration_since(self.last_nearly_empty) > self.srtt * COMPETITIVE_ROUNDS;
        if competitive != self.competitive {
            self.competitive = competitive;
            self.delta = self.config.delta;
            self.loss_in_round = false;
        }
    }

    /// The per-ACK window update (paper §2.1 steps 1–3, and slow start).
    fn update_window(&mut self, now: Instant, bytes: u64, app_limited: bool) {
        let Some((standing, min)) = self.rtts(now) else {
            return;
        };
        self.update_mode(now, standing, min);
        let queue = self.queue_delay(standing, min);
        if queue.is_zero() && standing > min {
            self.in_noise_band = true;
        }
        if queue > min * QUEUE_BOUND_RTTS && self.bound_queue(now, min) {
            return;
        }
        let rate = self.cwnd / standing.as_secs_f64().max(1e-9);
        let increase = self.target_rate(queue).is_none_or(|target| rate <= target);
        let acked = bytes as f64;
        if self.slow_start {
            if increase {
                if !app_limited {
                    self.set_cwnd(self.cwnd + acked);
                }
                return;
            }
            self.slow_start = false;
            self.direction = Direction::Down;
            self.same_direction_rounds = 0;
            self.velocity = 1.0;
        }
        // A velocity built up in one direction does not carry over to the other (mvfst).
        let against = match self.direction {
            Direction::Up => !increase,
            Direction::Down => increase,
        };
        if against && self.velocity > 1.0 {
            self.velocity = 1.0;
            self.same_direction_rounds = 0;
            self.direction = if increase {
                Direction::Up
            } else {
                Direction::Down
            };
        }
        // v / (δ · cwnd) packets per acknowledged packet, in bytes.
        let change = self.velocity * self.mss as f64 * acked / (self.delta * self.cwnd);
        if increase {
            if !app_limited {
                self.set_cwnd(self.cwnd + change);
            }
        } else {
            self.set_cwnd(self.cwnd - change);
        }
    }

    /// Moves the loss-ratio EWMA by `bytes` acknowledged or lost (as [`Classic`]'s).
    fn observe_loss_ratio(&mut self, bytes: u64, lost: bool) {
        self.loss_ratio = next_loss_ratio(self.loss_ratio, bytes, self.mss, lost);
    }

    /// The loss backstop ([`CopaConfig::loss_backstop`]): with the loss ratio above it, cuts
    /// the window to the delivery rate × `RTTmin` (what the path delivered, no queue) and
    /// ends slow start. Returns whether it cut.
    fn loss_backstop_cut(&mut self, now: Instant, rtt: &RttEstimator) -> bool {
        let Some(ratio) = self.config.loss_backstop else {
            return false;
        };
        if self.loss_ratio <= ratio {
            return false;
        }
        let Some(min) = rtt.min() else {
            return false;
        };
        let delivered = self
            .ack_rate
            .get(now, self.srtt)
            .map_or(self.cwnd, |rate| rate * min.as_secs_f64());
        self.cut_window(self.cwnd.min(delivered));
        true
    }

    /// Sets the window to `bound` as a reduction: slow start ends and the velocity starts
    /// again from 1, going down.
    fn cut_window(&mut self, bound: f64) {
        self.set_cwnd(bound);
        self.slow_start = false;
        self.direction = Direction::Down;
        self.same_direction_rounds = 0;
        self.velocity = 1.0;
    }

    /// The queue bound ([`CopaConfig::queue_bound`]), called while the queue is longer than
    /// [`QUEUE_BOUND_RTTS`] × `min`: cuts the window to [`QUEUE_BOUND_GAIN`] × the delivery
    /// rate × `min` if it is above that. Returns whether it cut.
    fn bound_queue(&mut self, now: Instant, min: Duration) -> bool {
        if !self.config.queue_bound || self.competitive {
            return false;
        }
        let Some(delivered) = self.ack_rate.get(now, self.srtt) else {
            return false;
        };
        let bound = QUEUE_BOUND_GAIN * delivered * min.as_secs_f64();
        if self.cwnd <= bound {
            return false;
        }
        self.cut_window(bound);
        true
    }
}

impl Controller for Copa {
    fn on_sent(&mut self, now: Instant, bytes: u64, bytes_in_flight: u64) {
        let _ = (bytes, bytes_in_flight);
        self.last_sent = Some(self.last_sent.map_or(now, |t| t.max(now)));
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        let _ = now;
        self.srtt = rtt.smoothed();
        if self.batch_bytes == 0 {
            self.batch_app_limited = true;
        }
        self.batch_bytes = self.batch_bytes.saturating_add(bytes);
        self.batch_app_limited &= app_limited;
        self.batch_newest = Some(self.batch_newest.map_or(sent, |t| t.max(sent)));
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        bytes_in_flight: u64,
        app_limited: bool,
        largest_acked_sent: Option<Instant>,
    ) {
        let _ = (bytes_in_flight, app_limited);
        // One RTT sample per ACK frame, from the newest packet it acknowledges (as RFC 9002
        // §5.1 takes it): older packets of the frame waited for the peer's delayed ACK.
        if let Some(sent) = largest_acked_sent.or(self.batch_newest) {
            let sample = now.saturating_duration_since(sent);
            if !sample.is_zero() {
                self.on_rtt_sample(now, sample);
            }
        }
        let bytes = std::mem::take(&mut self.batch_bytes);
        let limited = std::mem::replace(&mut self.batch_app_limited, true);
        self.batch_newest = None;
        if bytes > 0 {
            self.ack_rate.push(now, bytes, self.srtt);
            self.observe_loss_ratio(bytes, false);
        }
        self.on_round(now);
        if bytes > 0 {
            self.update_window(now, bytes, limited);
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
        self.srtt = rtt.smoothed();
        self.observe_loss_ratio(lost_bytes, true);
        if persistent_congestion {
            self.persistent_congestion_events += 1;
            self.congestion_events += 1;
            self.set_cwnd(self.min_window());
            self.velocity = 1.0;
            self.same_direction_rounds = 0;
            self.direction = Direction::Up;
            self.slow_start = true;
            // The path may have changed: measure the RTTs afresh.
            self.standing.clear();
            self.last_standing = None;
            self.max.clear();
            self.ack_rate.clear();
            self.round_start = None;
            return;
        }
        let new_round = self
            .last_loss_reaction
            .is_none_or(|t| largest_lost_sent > t);
        if !self.competitive && new_round && self.loss_backstop_cut(now, rtt) {
            self.last_loss_reaction = Some(
                self.last_sent
                    .map_or(largest_lost_sent, |t| t.max(largest_lost_sent)),
            );
            self.congestion_events += 1;
        } else if self.competitive && new_round {
            //  Competitive mode: 1/δ halves on a loss, at most once per RTT, never below the
            //  default 1/δ.
            self.loss_in_round = true;
            let inv = (0.5 / self.delta).max(1.0 / self.config.delta);
            self.delta = 1.0 / inv;
            self.last_loss_reaction = Some(
                self.last_sent
                    .map_or(largest_lost_sent, |t| t.max(largest_lost_sent)),
            );
            self.congestion_events += 1;
        } else {
            self.non_congestive_losses += 1;
        }
    }

    fn on_rate_estimate(&mut self, now: Instant, bytes_per_second: u64, rtt: &RttEstimator) {
        let _ = now;
        if bytes_per_second == 0 {
            return;
        }
        let Some(min) = rtt.min() else {
            return;
        };
        // Never shrinks the window (as Classic): a train read low by cross traffic, or one
        // after an idle spell, must not cut a window the ACKs have been driving.
        self.set_cwnd(self.cwnd.max(bytes_per_second as f64 * min.as_secs_f64()));
        self.slow_start = false;
    }

    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        self.mss = u64::from(max_datagram_size).max(1);
        self.set_cwnd(self.cwnd);
    }

    fn window(&self) -> u64 {
        // `as` saturates; the window is clamped to [2 × mss, 2^48] already.
        self.cwnd as u64
    }

    fn pacing_rate(&self, rtt: &RttEstimator) -> Option<u64> {
        // RTTstanding as of the latest ACK (the filter is only trimmed on ACKs).
        let standing = self
            .last_standing
            .map_or_else(|| rtt.smoothed(), |(_, level)| level);
        let secs = standing.as_secs_f64().max(1e-6);
        Some(((2.0 * self.cwnd / secs) as u64).max(1))
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn metrics(&self) -> Metrics {
        let mut metrics = Metrics::new(self.window());
        metrics.pacing_rate = self.pacing_rate(&RttEstimator::new(self.srtt));
        metrics.in_slow_start = self.slow_start;
        metrics.congestion_events = self.congestion_events;
        metrics.non_congestive_losses = self.non_congestive_losses;
        metrics.persistent_congestion_events = self.persistent_congestion_events;
        metrics
    }

    fn name(&self) -> &'static str {
        "copa"
    }
}

/// Configuration and factory of [`Copa`] controllers.
#[derive(Debug, Clone, PartialEq)]
pub struct CopaConfig {
    delta: f64,
    initial_window_packets: u32,
    standing_quantile: f64,
    noise_floor: Duration,
    queue_bound: bool,
    loss_backstop: Option<f64>,
}

impl Default for CopaConfig {
    /// δ = 0.5, the paper's default.
    fn default() -> Self {
        Self {
            delta: DEFAULT_DELTA,
            initial_window_packets: INITIAL_WINDOW_PACKETS,
            standing_quantile: 0.0,
            noise_floor: Duration::ZERO,
            queue_bound: false,
            loss_backstop: None,
        }
    }
}

impl CopaConfig {
    /// δ in default mode: larger = lower delay, lower throughput against other flows. Values
    /// outside (0, 1] (or not finite) are replaced by the default.
    pub fn delta(mut self, delta: f64) -> Self {
        self.delta = if delta.is_finite() && delta > 0.0 && delta <= 1.0 {
            delta
        } else {
            DEFAULT_DELTA
        };
        self
    }

    /// The configured δ.
    pub fn get_delta(&self) -> f64 {
        self.delta
    }

    /// The window at the start, in datagrams (10 by default; at least 2).
    pub fn initial_window_packets(mut self, packets: u32) -> Self {
        self.initial_window_packets = packets.max(2);
        self
    }

    /// The configured initial window, in datagrams.
    pub fn get_initial_window_packets(&self) -> u32 {
        self.initial_window_packets
    }

    /// `RTTstanding` is this quantile of the samples of the last `srtt / 2`, and `RTTmin` the
    /// lowest such level over 10 s (of windows with at least [`LEVEL_MIN_SAMPLES`] samples). 0,
    /// the default, is the paper's: the smallest sample, and the smallest over 10 s. tern's
    /// Copa uses [`TERN_STANDING_QUANTILE`]. Clamped to [0, 0.5]; not finite gives 0.
    pub fn standing_quantile(mut self, quantile: f64) -> Self {
        self.standing_quantile = if quantile.is_finite() {
            quantile.clamp(0.0, 0.5)
        } else {
            0.0
        };
        self
    }

    /// The configured standing quantile.
    pub fn get_standing_quantile(&self) -> f64 {
        self.standing_quantile
    }

    /// `d_q` is `RTTstanding − RTTmin` less this (at most `RTTmin /`
    /// [`NOISE_FLOOR_RTT_DIVISOR`]): a smaller delay difference is not taken for a queue. Zero,
    /// the default, is the paper's; tern's Copa uses [`TERN_NOISE_FLOOR`].
    pub fn noise_floor(mut self, floor: Duration) -> Self {
        self.noise_floor = floor;
        self
    }

    /// The configured noise floor.
    pub fn get_noise_floor(&self) -> Duration {
        self.noise_floor
    }

    /// Whether a queue longer than [`QUEUE_BOUND_RTTS`] × `RTTmin` (after the noise floor) cuts
    /// the window at once to [`QUEUE_BOUND_GAIN`] × the delivery rate × `RTTmin`, outside
    /// competitive mode ("After a capacity collapse" in the module doc). Off, the default, is
    /// the paper's; on in tern's Copa.
    pub fn queue_bound(mut self, on: bool) -> Self {
        self.queue_bound = on;
        self
    }

    /// Whether the queue bound is on.
    pub fn get_queue_bound(&self) -> bool {
        self.queue_bound
    }

    /// The loss backstop ("Loss, and what differs from the paper" in the module doc): when
    /// the loss ratio (an EWMA over datagrams, as [`Classic`](super::Classic)'s) exceeds `ratio`, a loss cuts
    /// the window to the delivery rate × `RTTmin`, at most once per round trip, outside
    /// competitive mode. `None`, the default, is the paper's (loss is no signal); tern's Copa
    /// uses [`TERN_LOSS_BACKSTOP`]. Values outside (0, 1] turn it off.
    pub fn loss_backstop(mut self, ratio: Option<f64>) -> Self {
        self.loss_backstop = ratio.filter(|r| r.is_finite() && *r > 0.0 && *r <= 1.0);
        self
    }

    /// The loss backstop's ratio, if on.
    pub fn get_loss_backstop(&self) -> Option<f64> {
        self.loss_backstop
    }

    /// tern's Copa ([`Algorithm::Copa`](super::Algorithm::Copa), `--cc copa`): δ =
    /// [`TERN_DELTA`], the median as the standing RTT ([`TERN_STANDING_QUANTILE`]), a
    /// [`TERN_NOISE_FLOOR`] of 2 ms, the queue bound ([`CopaConfig::queue_bound`]) and the
    /// loss backstop at [`TERN_LOSS_BACKSTOP`]. [`CopaConfig::default`] is the paper's.
    pub fn tern() -> Self {
        Self::default()
            .delta(TERN_DELTA)
            .standing_quantile(TERN_STANDING_QUANTILE)
            .noise_floor(TERN_NOISE_FLOOR)
            .queue_bound(true)
            .loss_backstop(Some(TERN_LOSS_BACKSTOP))
    }
}

impl ControllerFactory for CopaConfig {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Copa::new(self, now, info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::{epoch, rtt_with};

    const MSS: u64 = 1200;
    const MS: Duration = Duration::from_millis(1);

    fn copa() -> Copa {
        Copa::new(
            &CopaConfig::default(),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        )
    }

    /// Acknowledges one packet at `now` whose RTT was `sample`, in an ACK frame of its own.
    fn ack(cc: &mut Copa, now: Instant, sample: Duration, rtt: &RttEstimator) {
        cc.on_ack(now, now - sample, MSS, false, rtt);
        cc.on_end_acks(now, 0, false, Some(now - sample));
    }

    #[test]
    fn target_rate_from_queueing_delay() {
        let cc = copa();
        // δ = 0.5, d_q = 10 ms: 1 / (0.5 × 0.01) = 200 packets/s.
        let target = cc.target_rate(10 * MS).expect("a queue");
        assert!((target - 200.0 * MSS as f64).abs() < 1e-6);
        assert_eq!(cc.target_rate(Duration::ZERO), None);
        let cc = Copa::new(
            &CopaConfig::default().delta(0.1),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        );
        let target = cc.target_rate(10 * MS).expect("a queue");
        assert!((target - 1000.0 * MSS as f64).abs() < 1e-6);
        assert_eq!(CopaConfig::default().delta(f64::NAN).get_delta(), 0.5);
        assert_eq!(CopaConfig::default().delta(0.0).get_delta(), 0.5);
    }

    #[test]
    fn standing_and_min_rtt_filters() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        let t = epoch() + Duration::from_secs(1);
        ack(&mut cc, t, 40 * MS, &rtt);
        ack(&mut cc, t + 5 * MS, 60 * MS, &rtt);
        // Within srtt / 2 = 20 ms, the standing RTT is the smallest sample.
        assert_eq!(cc.rtts(t + 10 * MS), Some((40 * MS, 40 * MS)));
        // 30 ms later the 40 ms sample left the standing window, not the min window.
        assert_eq!(cc.rtts(t + 30 * MS), Some((60 * MS, 40 * MS)));
        // After 10 s the minimum follows too.
        ack(&mut cc, t + Duration::from_secs(11), 50 * MS, &rtt);
        assert_eq!(
            cc.rtts(t + Duration::from_secs(11)),
            Some((50 * MS, 50 * MS))
        );
    }

    #[test]
    fn slow_start_doubles_until_the_rate_exceeds_the_target() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        let t = epoch() + Duration::from_secs(1);
        // No queue: every ACK adds its bytes.
        for i in 0..10 {
            ack(&mut cc, t + i * MS, 40 * MS, &rtt);
        }
        assert!(cc.in_slow_start());
        assert_eq!(cc.window(), 20 * MSS);
        // 90 ms later the 40 ms samples have left the standing window (srtt / 2 = 20 ms): a
        // 60 ms sample means a 20 ms queue, target 1 / (0.5 × 0.02) = 100 packets/s.
        let later = t + 100 * MS;
        ack(&mut cc, later, 60 * MS, &rtt);
        // Rate 20 packets / 60 ms = 333 packets/s > 100: slow start ends and the window shrinks
        // by v / (δ · cwnd) = 1 / (0.5 × 20) = 0.1 packet.
        assert!(!cc.in_slow_start());
        let expected = 20.0 * MSS as f64 - 0.1 * MSS as f64;
        assert!((cc.cwnd - expected).abs() < 1e-6, "{}", cc.cwnd);
        assert_eq!(cc.direction(), Direction::Down);
    }

    #[test]
    fn one_late_sample_among_sparse_acks_does_not_end_slow_start() {
        let rtt = rtt_with(36 * MS, 36 * MS);
        // Slow start with sparse ACKs of 8 datagrams each, as on the 5G drive trace: one every
        // 6 ms at 36 ms, then samples 12 ms apart, so that the last srtt / 2 holds two.
        let sparse = |late: &[Duration]| {
            let mut cc = Copa::new(
                &CopaConfig::tern(),
                epoch(),
                &PathInfo::new(MSS as u16, 36 * MS, 0),
            );
            let mut t = epoch() + Duration::from_secs(1);
            let frame = |cc: &mut Copa, t: Instant, sample: Duration| {
                cc.on_ack(t, t - sample, 8 * MSS, false, &rtt);
                cc.on_end_acks(t, 0, false, Some(t - sample));
            };
            for _ in 0..12 {
                frame(&mut cc, t, 36 * MS);
                t += 6 * MS;
            }
            t += 6 * MS;
            for &sample in late {
                t += 12 * MS;
                frame(&mut cc, t, sample);
            }
            cc
        };
        let late = Duration::from_micros(47_500);
        // A lone late sample (47.5 ms) and a normal one: over the two alone the median is the
        // late one, a 9.5 ms queue whose target (1.3 MB/s) is below the window's rate (2.7
        // MB/s); over the newest four it is 37 ms, inside the noise floor.
        let cc = sparse(&[late, 37 * MS]);
        assert!(cc.in_slow_start(), "one late sample ended slow start");
        assert!(cc.window() > 100 * MSS);
        // A queue that every sample shows still ends it.
        let queued = sparse(&[late, late, late, late]);
        assert!(
            !queued.in_slow_start(),
            "a real queue did not end slow start"
        );
    }

    #[test]
    fn window_moves_by_v_over_delta_cwnd_towards_the_target() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        cc.slow_start = false;
        cc.cwnd = 100.0 * MSS as f64;
        let t = epoch() + Duration::from_secs(1);
        // No queue: increase by 1 / (0.5 × 100) = 0.02 packet per ACK.
        ack(&mut cc, t, 40 * MS, &rtt);
        assert!((cc.cwnd - 100.02 * MSS as f64).abs() < 1e-6, "{}", cc.cwnd);
        // With v = 4 the step is four times as large.
        cc.velocity = 4.0;
        cc.direction = Direction::Up;
        let before = cc.cwnd;
        ack(&mut cc, t + MS, 40 * MS, &rtt);
        let step = 4.0 * MSS as f64 * MSS as f64 / (0.5 * before);
        assert!((cc.cwnd - before - step).abs() < 1e-6);
        // A queue pushes the rate above target: the decision flips, v resets to 1 at once.
        let later = t + 100 * MS;
        ack(&mut cc, later, 80 * MS, &rtt);
        assert_eq!(cc.velocity(), 1.0);
        assert_eq!(cc.direction(), Direction::Down);
        assert!(cc.cwnd < before + step);
    }

    #[test]
    fn velocity_doubles_after_three_rounds_in_one_direction_and_resets_on_change() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        cc.slow_start = false;
        cc.cwnd = 50.0 * MSS as f64;
        let mut t = epoch() + Duration::from_secs(1);
        // No queue at all: the window grows every ACK; one ACK per ms, rounds of 40 ms.
        let mut velocities = Vec::new();
        for _ in 0..8 {
            for _ in 0..40 {
                ack(&mut cc, t, 40 * MS, &rtt);
                t += MS;
            }
            velocities.push(cc.velocity());
        }
        // Round 1 starts the clock; rounds 2–3 count 1 and 2 same-direction rounds, round 4
        // the third: doubling from there on.
        assert_eq!(velocities, [1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]);
        assert_eq!(cc.direction(), Direction::Up);
        // A standing queue makes the rate exceed the target: the first decreasing ACK resets v.
        t += 100 * MS;
        ack(&mut cc, t, 200 * MS, &rtt);
        assert_eq!(cc.velocity(), 1.0);
        assert_eq!(cc.direction(), Direction::Down);
    }

    #[test]
    fn competitive_mode_when_the_queue_never_empties() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        cc.slow_start = false;
        let mut t = epoch() + Duration::from_secs(1);
        ack(&mut cc, t, 40 * MS, &rtt);
        // A queue that oscillates and empties: default mode.
        for i in 0..400u32 {
            t += MS;
            let queue = if i % 100 < 50 {
                30 * MS
            } else {
                Duration::ZERO
            };
            ack(&mut cc, t, 40 * MS + queue, &rtt);
        }
        assert!(!cc.is_competitive());
        assert_eq!(cc.delta(), 0.5);
        // A buffer filler keeps 30–40 ms of queue for well over five RTTs: competitive mode.
        for i in 0..400u32 {
            t += MS;
            let queue = if i % 20 < 10 { 30 * MS } else { 40 * MS };
            ack(&mut cc, t, 40 * MS + queue, &rtt);
        }
        assert!(cc.is_competitive());
        // 1/δ grew by one per RTT without loss.
        assert!(cc.delta() < 0.5, "{}", cc.delta());
        let before = 1.0 / cc.delta();
        // A loss halves 1/δ (at most once per round, never below 2).
        cc.on_sent(t, MSS, MSS);
        cc.on_congestion_event(t, t - MS, MSS, false, &rtt);
        assert!((1.0 / cc.delta() - (before / 2.0).max(2.0)).abs() < 1e-9);
        let after = cc.delta();
        cc.on_congestion_event(t, t - MS, MSS, false, &rtt);
        assert_eq!(cc.delta(), after);
        assert_eq!(cc.metrics().congestion_events, 1);
        assert_eq!(cc.metrics().non_congestive_losses, 1);
        // The queue empties again: back to default mode and δ.
        for _ in 0..100u32 {
            t += MS;
            ack(&mut cc, t, 40 * MS, &rtt);
        }
        assert!(!cc.is_competitive());
        assert_eq!(cc.delta(), 0.5);
    }

    /// Copa with `config` fed ACKs of one packet per ms for `secs` seconds, the RTT sample of
    /// the i-th ACK `sample(i)`: the sum of its window steps over the last second (positive:
    /// it grows). The window is put back to 500 packets, out of slow start, after every step,
    /// so that only the direction of each step counts.
    fn direction_after(config: &CopaConfig, secs: u32, sample: impl Fn(u32) -> Duration) -> f64 {
        let rtt = rtt_with(40 * MS, 45 * MS);
        let mut cc = Copa::new(config, epoch(), &PathInfo::new(MSS as u16, 40 * MS, 0));
        cc.slow_start = false;
        let start = 500.0 * MSS as f64;
        let mut drift = 0.0;
        let t = epoch() + Duration::from_secs(1);
        for i in 0..secs * 1000 {
            cc.cwnd = start;
            ack(&mut cc, t + i * MS, sample(i), &rtt);
            if i >= (secs - 1) * 1000 {
                drift += cc.cwnd - start;
            }
        }
        drift
    }

    /// In-order radio jitter: a dense flight's packets wait behind one another, 44–46 ms here,
    /// while a lone packet after a pause (one in 50) sees the bare 40 ms path.
    fn in_order_jitter(i: u32) -> Duration {
        if i % 50 == 0 {
            40 * MS
        } else {
            44 * MS + (i % 3) * MS
        }
    }

    #[test]
    fn a_delay_level_every_dense_flight_sees_is_not_a_queue() {
        // The paper's filters take the lone packets' 40 ms for the path and the 44 ms of the
        // flight for a queue of 4 ms: at 500 packets / 44 ms the rate is above the target
        // 1 / (0.1 × 4 ms), and the window shrinks on every ACK.
        let paper = CopaConfig::default().delta(TERN_DELTA);
        assert!(direction_after(&paper, 3, in_order_jitter) < 0.0);
        // tern's: the flight's median (45 ms) is the standing RTT, and the lowest such level
        // over 10 s is RTTmin, so there is no queue and the window grows.
        assert!(direction_after(&CopaConfig::tern(), 3, in_order_jitter) > 0.0);
        // The floor alone does not hide a 4 ms level; the median alone does here (this level
        // is steadier than a real one, whose noise the floor is for).
        let floor_only = paper.clone().noise_floor(TERN_NOISE_FLOOR);
        assert!(direction_after(&floor_only, 3, in_order_jitter) < 0.0);
        let median_only = paper.standing_quantile(TERN_STANDING_QUANTILE);
        assert!(direction_after(&median_only, 3, in_order_jitter) > 0.0);
    }

    #[test]
    fn a_queue_above_the_noise_floor_still_slows_tern_copa() {
        // Two seconds of jitter alone, then a queue of `extra` on top of it.
        let queued = |extra: Duration| {
            move |i: u32| {
                let base = in_order_jitter(i);
                if i < 2000 {
                    base
                } else {
                    base + extra
                }
            }
        };
        let tern = CopaConfig::tern();
        // 10 ms of queue: target 1 / (0.1 × 8 ms) = 1 250 packets/s, below 500 / 55 ms.
        assert!(direction_after(&tern, 3, queued(10 * MS)) < 0.0);
        // 1 ms stays under the 2 ms floor: no queue.
        assert!(direction_after(&tern, 3, queued(MS)) > 0.0);
        // On a 4 ms path the floor is at most a quarter of it (1 ms): 2 ms of queue counts.
        let short = |i: u32| {
            let jitter = Duration::from_micros(u64::from(i % 3) * 100);
            let queue = if i < 2000 { Duration::ZERO } else { 2 * MS };
            4 * MS + jitter + queue
        };
        assert!(direction_after(&tern, 3, short) < 0.0);
        assert!(direction_after(&tern.noise_floor(Duration::ZERO), 3, short) < 0.0);
    }

    #[test]
    fn loss_is_ignored_but_persistent_congestion_collapses() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        cc.slow_start = false;
        cc.cwnd = 100.0 * MSS as f64;
        let t = epoch() + Duration::from_secs(1);
        cc.on_congestion_event(t, t, 10 * MSS, false, &rtt);
        assert_eq!(cc.window(), 100 * MSS);
        assert_eq!(cc.metrics().non_congestive_losses, 1);
        cc.on_congestion_event(t, t, 10 * MSS, true, &rtt);
        assert_eq!(cc.window(), 2 * MSS);
        assert!(cc.in_slow_start());
        assert_eq!(cc.metrics().persistent_congestion_events, 1);
    }

    #[test]
    fn tern_copa_takes_losses_above_the_backstop_ratio_as_congestion() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = Copa::new(
            &CopaConfig::tern(),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        );
        cc.slow_start = false;
        cc.cwnd = 400.0 * MSS as f64;
        // 100 packets a 40 ms round delivered: 3 000 per second, 120 per RTTmin.
        let mut t = epoch() + Duration::from_secs(1);
        for _ in 0..400 {
            t += Duration::from_micros(333);
            cc.on_ack(t, t - 40 * MS, MSS, false, &rtt);
            cc.on_end_acks(t, 0, false, Some(t - 40 * MS));
        }
        let before = cc.window();
        // A loss now and then (1 %): no signal.
        cc.on_congestion_event(t, t, 4 * MSS, false, &rtt);
        assert_eq!(cc.metrics().non_congestive_losses, 1);
        assert_eq!(cc.metrics().congestion_events, 0);
        // A fifth of what is sent lost (8 of every 38), the rest delivered at the same rate:
        // the ratio crosses 10 % and the window falls to what the path delivered in an
        // `RTTmin`, about 120 datagrams.
        let mut cut_at = None;
        for i in 0..40 {
            cc.on_congestion_event(t, t - 40 * MS, 8 * MSS, false, &rtt);
            if cut_at.is_none() && cc.metrics().congestion_events > 0 {
                cut_at = Some(i);
            }
            for _ in 0..30 {
                t += Duration::from_micros(333);
                cc.on_ack(t, t - 40 * MS, MSS, false, &rtt);
                cc.on_end_acks(t, 0, false, Some(t - 40 * MS));
            }
        }
        assert!(cut_at.is_some(), "never cut: {:?}", cc.metrics());
        assert!(cc.window() < before, "{} !< {before}", cc.window());
        let window = cc.window() / MSS;
        assert!((100..=140).contains(&window), "{window} datagrams");
        // The paper's Copa has no backstop.
        let mut paper = copa();
        paper.slow_start = false;
        paper.cwnd = 400.0 * MSS as f64;
        for _ in 0..40 {
            paper.on_congestion_event(t, t, 10 * MSS, false, &rtt);
        }
        assert_eq!(paper.window(), 400 * MSS);
        assert_eq!(paper.metrics().congestion_events, 0);
    }

    #[test]
    fn rate_estimate_opens_the_window_to_the_bdp() {
        let mut cc = copa();
        let t = epoch();
        // No RTT sample yet: ignored.
        cc.on_rate_estimate(t, 6_250_000, &RttEstimator::new(40 * MS));
        assert_eq!(cc.window(), 10 * MSS);
        // 50 Mbit/s × 40 ms = 250 kB.
        cc.on_rate_estimate(t, 6_250_000, &rtt_with(40 * MS, 45 * MS));
        assert_eq!(cc.window(), 250_000);
        assert!(!cc.in_slow_start());
        // A later, lower estimate (a train after idle, read low by cross traffic) does not
        // cut the window; a higher one opens it.
        cc.on_rate_estimate(t, 1_250_000, &rtt_with(40 * MS, 45 * MS));
        assert_eq!(cc.window(), 250_000);
        cc.on_rate_estimate(t, 12_500_000, &rtt_with(40 * MS, 45 * MS));
        assert_eq!(cc.window(), 500_000);
    }

    #[test]
    fn pacing_is_twice_cwnd_over_standing_rtt() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = copa();
        ack(&mut cc, epoch() + Duration::from_secs(1), 40 * MS, &rtt);
        // 11 packets (slow start added one) over 40 ms, doubled.
        assert_eq!(cc.pacing_rate(&rtt), Some(2 * 11 * MSS * 25));
    }

    #[test]
    fn odd_call_sequences_do_not_panic() {
        let rtt = RttEstimator::new(Duration::ZERO);
        let mut cc = copa();
        let t = epoch() + Duration::from_secs(100);
        cc.on_ack(t, t, 0, false, &rtt);
        cc.on_end_acks(t, 0, false, Some(t));
        cc.on_ack(t - Duration::from_secs(50), t, 0, false, &rtt);
        cc.on_end_acks(t - Duration::from_secs(50), 0, false, Some(t));
        cc.on_ack(t, t - Duration::from_secs(50), u64::MAX, false, &rtt);
        cc.on_end_acks(t, 0, false, None);
        cc.on_end_acks(t, 0, true, None);
        cc.on_ack(
            t - Duration::from_secs(60),
            t - Duration::from_secs(61),
            0,
            true,
            &rtt,
        );
        cc.on_congestion_event(t, t + Duration::from_secs(5), 0, false, &rtt);
        cc.on_congestion_event(t - Duration::from_secs(90), t, 0, true, &rtt);
        cc.on_mtu_update(0);
        cc.on_rate_estimate(t, u64::MAX, &rtt_with(MS, MS));
        cc.on_ack(t + Duration::from_secs(7200), t, 1200, false, &rtt);
        cc.on_end_acks(t + Duration::from_secs(7200), 0, false, Some(t));
        cc.on_mtu_update(u16::MAX);
        assert!(cc.window() >= 2);
        assert!(cc.pacing_rate(&rtt).is_some_and(|r| r > 0));
        let _ = cc.metrics();
    }

    #[test]
    fn under_the_noise_floor_the_window_grows_by_at_most_an_eighth_per_round() {
        let mut cc = Copa::new(
            &CopaConfig::tern(),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        );
        cc.slow_start = false;
        cc.srtt = 40 * MS;
        let mut t = epoch();
        cc.on_round(t);
        // (window in packets, queue under the floor, the velocity after the round): inside the
        // band v / δ is at most an eighth of the window (and v at least 1); outside it v
        // doubles as in the paper.
        for (packets, in_band, velocity) in [
            (1_000.0, true, 12.5),
            (40.0, true, 1.0),
            (1_000.0, false, 128.0),
        ] {
            cc.velocity = 64.0;
            cc.direction = Direction::Up;
            cc.same_direction_rounds = VELOCITY_THRESHOLD;
            cc.cwnd = packets * MSS as f64;
            cc.round_cwnd = cc.cwnd - 1.0;
            cc.in_noise_band = in_band;
            t += 41 * MS;
            cc.on_round(t);
            assert_eq!(
                cc.velocity(),
                velocity,
                "{packets} packets, in band: {in_band}"
            );
        }
    }

    #[test]
    fn ack_rate_is_bytes_over_the_span_of_the_window() {
        let t0 = epoch();
        let mut rate = AckRate::default();
        assert_eq!(rate.get(t0, 100 * MS), None);
        // 12 000 bytes every 10 ms: 1.2 MB/s.
        for i in 0..=30u32 {
            rate.push(t0 + i * 10 * MS, 12_000, 100 * MS);
        }
        let now = t0 + 300 * MS;
        let got = rate.get(now, 100 * MS).expect("a rate");
        assert!((got - 1.2e6).abs() < 1.0, "{got}");
        // The rate falls tenfold: after one window the old frames no longer count.
        for i in 1..=20u32 {
            rate.push(now + i * 10 * MS, 1_200, 100 * MS);
        }
        let got = rate.get(now + 200 * MS, 100 * MS).expect("a rate");
        assert!((got - 1.2e5).abs() < 1.0, "{got}");
        // One burst of frames within a moment is no rate.
        let mut burst = AckRate::default();
        burst.push(t0, 1_200, 100 * MS);
        burst.push(t0 + MS, 1_200, 100 * MS);
        assert_eq!(burst.get(t0 + MS, 100 * MS), None);
    }

    #[test]
    fn factory_and_name() {
        let cc = CopaConfig::default().build(epoch(), &PathInfo::default());
        assert_eq!(cc.name(), "copa");
        assert_eq!(cc.window(), 10 * 1200);
        assert_eq!(cc.initial_window(), 10 * 1200);
    }
}
