//! The F12 router: NC-TCP's explicit-rate computation for one direction of a link, as a pure
//! element that `tern-sim` and `tern-netem` both drive (DESIGN.md F12, PROTOCOL.md §4.8, §13).
//!
//! # Contract
//!
//! Sans-I/O like the rest of the crate: the router never reads a clock (`now` is an argument),
//! never draws random numbers and never allocates per datagram (only when a new flow is first
//! seen). It never panics on any input, and it never *raises* a Feedback Rate: it only ever
//! lowers one through [`wire::lower_feedback_rate`]'s rule (§4.8: "A router on the path MAY
//! lower Feedback Rate, never raise it").
//!
//! The driver (a link model) calls, for every UDP payload entering the link's queue:
//!
//! 1. [`Router::tick`]`(now, queue_bytes)` with the bytes queued ahead of the datagram (it may
//!    also call it on a timer; it is cheap). The control law runs from here once per
//!    [`RouterConfig::interval`];
//! 2. [`Router::on_datagram`]`(now, &mut payload)`, which counts the bytes as load and, for a
//!    tern short-header packet with a rate area, lowers its Feedback Rate to the flow's allowed
//!    rate. Bytes that are not UDP payloads (other IP traffic) go to [`Router::on_other`].
//!
//! When the link's capacity changes (a trace-driven link), the driver calls
//! [`Router::set_capacity`].
//!
//! # The control law
//!
//! The router keeps one number, `R`: the rate, in bit/s, it allows a flow of weight 1. A flow
//! `i` whose packets carry Expected Rate `e_i` has weight `w_i = e_i / U`, where `U` is
//! [`RouterConfig::weight_unit_bps`] (1 Mbit/s); a flow whose Expected Rate is unset
//! (`0xFFFFFFFF`) weighs 1. Each of its packets is stamped with
//!
//! ```text
//! r_i = min(w_i · R, e_i, C) · (1 − min(k · wait / d, 0.1))
//!                                      (written in kbit/s, at least 1; only if lower)
//! ```
//!
//! where `wait` is how long this packet will wait before its first byte is sent, if the driver
//! says ([`Router::set_wait`]; 0 otherwise), and `k` the phase gain ("Phase spreading" below).
//!
//! and every [`RouterConfig::interval`] `T` (measured: `Δ` since the last update) `R` follows
//! an RCP-style proportional–integral law on the spare capacity and the queue:
//!
//! ```text
//! y   = 8 · (bytes that arrived during Δ) / Δ                 all traffic, tern or not
//! q   = mean of the queue samples given to tick() during Δ     bytes
//! y*  = max(α·C − β · 8q / d,  α·C / 4)                        the arrival rate wanted
//! R  ← R · exp(a · min(Δ/d, 1) · clamp((y* − y) / (α·C), −3, 1))
//! R  ← min(R, max(R_old, H · max_i u_i))    only when R rose; u_i: flow i's rate / w_i
//! R  ← clamp(R, 1 kbit/s, C / w_min)
//! ```
//!
//! with `C` the capacity, `α` the target utilisation, `d` the control round-trip time, `a` the
//! rate gain, `β` the queue gain, and `w_min` the smallest weight (at most 1) of the tracked
//! flows (so that a lone flow of any weight can be given the whole link). And when a flow of
//! weight `w` is first seen while tracked flows weigh `W` in all (each counted up to 1),
//! `R ← R · W / (W + min(w, 1))` at once (NC-TCP's `/N`, applied ahead of the loop; a
//! newcomer counts as at most one flow, so that one packet declaring a huge weight cannot cut
//! every flow's rate).
//!
//! Why this shape (NC-TCP's `r = α(C − q)/N` made robust):
//! - *Dividing by `N` is done by the loop, not by counting flows.* At equilibrium `S = 0`, so
//!   `Σ r_i = α·C − (queue term)`: `N` equal backlogged flows get `α·C/N` each, weighted flows
//!   `α·C·w_i/Σw`. A flow that sends less than `w_i·R` (limited by its expected rate, by its
//!   application or by a tighter router elsewhere — the parking lot) adds less to `y`, so `R`
//!   rises until the others take the spare: max–min fairness with weights, and the tightest
//!   bottleneck wins because each router only lowers the field. The effective count of flows
//!   limited here is `N̂ = y_rated / R` ([`RouterStats::effective_flows`]).
//! - *`y` counts every byte*, so non-tern traffic (or tern without a rate area) reduces the rate
//!   given to rated flows instead of building a queue.
//! - *The queue term is the P part on the delay*: a standing queue of `q` bytes lowers the
//!   target by `β·8q/d`, i.e. asks the flows to drain it in about `d/β`; the integral of `S`
//!   also integrates the queue, which removes a steady-state error.
//! - *Multiplicative update*: every flow's rate moves by the same fraction, so weights are
//!   kept during transients, and `R` never becomes negative. For small errors `exp(x) ≈ 1 + x`
//!   is RCP's `R·(1 + (T/d)(α(C − y) − βq/d)/C)`; the exponential makes a step and its
//!   opposite cancel exactly, so the quantisation of `y` on a slow link (0, 1 or 2 packets per
//!   10 ms at 1 Mbit/s) has no bias: `Σ Δ·(y* − y)` telescopes to bytes counted exactly.
//!   (`1 + x` loses `x²/2` per pair of steps: 3 % of utilisation in the model tests.)
//! - *Anti-windup*: stamps are written when packets enter the queue, so a big queue delays the
//!   feedback by its own length. `y* ≥ α·C/4` and the error clamp at −3 stop `R` from falling
//!   to the floor while the flows have not yet had the chance to react.
//! - *Joins scale `R` at once*: with `R = α·C` and N flows starting together, each would be
//!   told the whole link for a round trip (N-fold overload, a queue of seconds, then the
//!   collapse above). `W / (W + w)` gives the newcomer its share and the others theirs
//!   immediately; flows limited elsewhere make it too low for a moment, and the loop then
//!   raises `R` by up to `e^(a·Δ/d)` per interval (×1.5 per `d`). Leaves need no such step:
//!   the spare term sees them within one interval.
//!
//! # Phase spreading
//!
//! On a slow link a packet takes long to send (1 481 bytes are 11.8 ms at 1 Mbit/s). Flows
//! paced at their right rates still collide: a packet that arrives while another is on the
//! wire waits for the rest of it, on average `ρ·S/2` (about 5.7 ms at 96 % load) when the
//! flows' phases are independent, and NC-TCP's ≤ 2 ms mean wait is then out of reach
//! whatever `R` is. Only phases held apart avoid it, and a router that stamps the same rate
//! into every flow's packets has no hold on phases: they drift as `R` moves, since each
//! flow follows a change at its own moment.
//!
//! So a packet that will wait `wait` is stamped `k · wait / d` less (`k` =
//! [`DEFAULT_PHASE_GAIN`] = 0.25, at most [`MAX_PHASE_CUT`] = 10 % less). Its sender slows for
//! about a round trip and its later packets arrive later, by about `k · wait · RTT / d`: the
//! flow that arrived into another's packet slides behind it, the other keeps its phase, and
//! when no packet waits every flow is stamped its share again. A cut only ever lowers a
//! stamp (§4.8), and over time each flow waits as often as the next, so shares are kept.
//! `tern-sim/tests/router.rs` (tern senders, 1 Mbit/s), mean wait without → with: three flows
//! started together 3.7 ms → 0, unequal RTTs 2.7 ms → 0, three staggered 2.7 → 0.1 ms, ten
//! flows on 10 Mbit/s 0.74 → 0.02 ms, the parking lot 3.8 / 2.3 → 3.8 / 2.4 ms; weighted
//! flows (155 / 310 / 465 kbit/s) 3.0 → 5.7 ms, because flows of different rates have
//! different periods and cannot keep apart. `k` = 0.5 gave the same for equal flows, 1.0
//! oscillated (three flows together 4.1 ms).
//!
//! # Constants and why
//!
//! - `α` = [`DEFAULT_TARGET_UTILISATION`] = 0.98: DESIGN.md §4 asks for ≥ 95 % utilisation with
//!   ≤ 2 ms mean queueing delay. The queue term takes a little more off in practice (paced
//!   packets from several flows still collide), so aiming at 98 % lands above 95 %; the 2 %
//!   headroom is what keeps the queue near empty between collisions.
//! - `T` = [`DEFAULT_INTERVAL`] = 10 ms: short against the 80–140 ms RTTs of the fairness
//!   scenario, so the loop acts several times per RTT and a joining flow is absorbed quickly.
//!   On a 1 Mbit/s link that is about one packet per interval, which does not make `R` noisy:
//!   `y·Δ` counts bytes exactly, so the per-interval quantisation telescopes in the integral.
//! - `d` = [`DEFAULT_CONTROL_RTT`] = 100 ms: the router cannot see flows' RTTs (tern is
//!   encrypted), so the gains are scaled for a nominal RTT, the middle of 80–140 ms. RCP's
//!   stability analysis (Balakrishnan et al., 2007) holds for RTTs up to about three times `d`
//!   with these gains; shorter RTTs only make the loop better damped.
//! - `a` = [`DEFAULT_RATE_GAIN`] = 0.4 and `β` = [`DEFAULT_QUEUE_GAIN`] = 0.226: the RCP pair
//!   shown stable for any number of flows; the model tests below find it settles within
//!   0.1–1.6 s (10 flows) and holds every flow within ±3 % of its share afterwards.
//! - `H` = [`DEMAND_HEADROOM`] (1.25): spare capacity raises `R` only up to `H` × the most
//!   demanding flow's use per unit weight, smoothed over `d`. Real senders climb to a stamp
//!   over several round trips (their own loss/delay bound); without `H` the loop ran `R` up
//!   to `C` meanwhile and every flow overshot together once it caught up (closed loop in
//!   `tern-sim/tests/router.rs`: 71–85 % utilisation and 25–39 ms of queue; with it, 97 %
//!   and about 1.4 ms).
//! - Error clamp [−3, 1] and `y* ≥ α·C/4`: anti-windup (above). At most ×e^(a) = ×1.5 up and
//!   ÷e^(3a) = ÷3.3 down per `d`: an idle link or one burst cannot swing `R` further.
//! - `U` = 1 Mbit/s: only the ratio of weights matters between rated flows; `U` sets how a flow
//!   with an unset Expected Rate compares with rated ones (as if it expected 1 Mbit/s), and
//!   where the expected-rate cap starts to bind (`R > U`).
//! - Weights are clamped to [[`DEFAULT_MIN_WEIGHT`], [`DEFAULT_MAX_WEIGHT`]] = [1/1000, 1000]:
//!   §13.2 lets routers cap a greedy sender's declared weight by policy; 0 would starve a flow.
//! - Flow timeout [`DEFAULT_FLOW_TIMEOUT`] = 2 s: a flow not seen for that long leaves the table
//!   at the next sweep (every 1 s, so 2–3 s after its last packet; its weight no longer counts
//!   in `w_min`, nor in [`RouterStats::flows`]; an empty table puts `R` back to `α·C`); a
//!   paced flow sends
//!   far more often, so only finished flows time out. The rate itself needs no per-flow state:
//!   every packet carries its weight.
//! - At most [`DEFAULT_MAX_FLOWS`] = 65 536 tracked flows: a flood of random connection IDs
//!   cannot grow memory without bound; untracked flows are still stamped correctly.
//!
//! # Not implemented
//!
//! IPv6 extension-header parsing is the drivers' business; the router sees UDP payloads. Flow
//! keys use the connection-ID length of [`RouterConfig::cid_len`] (every tern endpoint of a
//! deployment uses the same one, 8 by default), so a deployment with other lengths must say so.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use crate::wire::{self, Header, Packet, ShortHeader, DEFAULT_CID_LEN, MAX_CID_LEN, NO_RATE_LIMIT};

/// Default [`RouterConfig::target_utilisation`] (α).
pub const DEFAULT_TARGET_UTILISATION: f64 = 0.98;
/// Default [`RouterConfig::interval`] (T).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(10);
/// Default [`RouterConfig::control_rtt`] (d).
pub const DEFAULT_CONTROL_RTT: Duration = Duration::from_millis(100);
/// Default [`RouterConfig::rate_gain`] (a).
pub const DEFAULT_RATE_GAIN: f64 = 0.4;
/// Default [`RouterConfig::queue_gain`] (β).
pub const DEFAULT_QUEUE_GAIN: f64 = 0.226;
/// Default [`RouterConfig::weight_unit_bps`] (U).
pub const DEFAULT_WEIGHT_UNIT_BPS: u64 = 1_000_000;
/// Default [`RouterConfig::min_weight`].
pub const DEFAULT_MIN_WEIGHT: f64 = 1.0 / 1000.0;
/// Default [`RouterConfig::max_weight`].
pub const DEFAULT_MAX_WEIGHT: f64 = 1000.0;
/// Default [`RouterConfig::phase_gain`] (k).
pub const DEFAULT_PHASE_GAIN: f64 = 0.25;
/// The phase term lowers a stamp by at most this share.
pub const MAX_PHASE_CUT: f64 = 0.1;
/// Default [`RouterConfig::flow_timeout`].
pub const DEFAULT_FLOW_TIMEOUT: Duration = Duration::from_secs(2);
/// Default [`RouterConfig::max_flows`].
pub const DEFAULT_MAX_FLOWS: usize = 65_536;
/// Lowest rate the router ever stamps, bit/s: the field's resolution (1 kbit/s). Zero would
/// stop a flow for good (it could never learn that the link freed up).
pub const MIN_RATE_BPS: f64 = 1_000.0;
/// Lower bound of the normalised error `(y* − y)/(α·C)` (see the module docs): a burst, or
/// every flow starting at once at the full rate, lowers `R` by at most `e^(−3a·Δ/d)` per
/// update (÷3.3 per `d` with the defaults), so one interval's measurement cannot drive `R` far
/// below what the flows can show within a round trip.
const MAX_OVERLOAD: f64 = 3.0;
/// The wanted arrival rate `y*` never falls below this fraction of `α·C` (anti-windup).
const MIN_WANTED: f64 = 0.25;

/// How one [`Router`] computes rates. See the module docs for the law and why each default.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RouterConfig {
    /// Capacity `C` of the link direction, bit/s (of the bytes the driver counts: UDP payloads
    /// and [`Router::on_other`] bytes, or whole IP packets, as long as it is consistent).
    pub capacity_bps: u64,
    /// Control interval `T`: how often `R` is recomputed.
    pub interval: Duration,
    /// Target utilisation `α` (0 < α ≤ 1): the share of `C` rated flows are given in all.
    pub target_utilisation: f64,
    /// Rate gain `a` of the spare-capacity term.
    pub rate_gain: f64,
    /// Queue gain `β`: a queue of `q` bytes takes `β·8q/d` bit/s off the target.
    pub queue_gain: f64,
    /// Nominal round-trip time `d` the gains are scaled for.
    pub control_rtt: Duration,
    /// Expected Rate that counts as weight 1 (`U`); unset Expected Rates weigh 1.
    pub weight_unit_bps: u64,
    /// Smallest weight a flow is given (policy floor).
    pub min_weight: f64,
    /// Largest weight a flow is given (policy cap on declared expected rates, §13.2).
    pub max_weight: f64,
    /// A flow not seen for this long is forgotten.
    pub flow_timeout: Duration,
    /// Most flows tracked at once (for statistics and `w_min`; rates need no table).
    pub max_flows: usize,
    /// Connection-ID length used to parse short headers (§4.7): the deployment's, 8 by default.
    pub cid_len: usize,
    /// Phase gain `k`: a datagram that will wait `w` before its first byte is sent (told by
    /// [`Router::set_wait`]) is stamped `1 − min(k·w/d, `[`MAX_PHASE_CUT`]`)` of its flow's
    /// rate, so that the flows whose packets collide drift apart (module docs).
    pub phase_gain: f64,
}

impl Default for RouterConfig {
    /// A 1 Mbit/s link (the `ncvdn` bottleneck) with every constant at its documented default.
    fn default() -> Self {
        Self::new(1_000_000)
    }
}

impl RouterConfig {
    /// Defaults for a link of `capacity_bps`.
    pub fn new(capacity_bps: u64) -> Self {
        Self {
            capacity_bps,
            interval: DEFAULT_INTERVAL,
            target_utilisation: DEFAULT_TARGET_UTILISATION,
            rate_gain: DEFAULT_RATE_GAIN,
            queue_gain: DEFAULT_QUEUE_GAIN,
            control_rtt: DEFAULT_CONTROL_RTT,
            weight_unit_bps: DEFAULT_WEIGHT_UNIT_BPS,
            min_weight: DEFAULT_MIN_WEIGHT,
            max_weight: DEFAULT_MAX_WEIGHT,
            flow_timeout: DEFAULT_FLOW_TIMEOUT,
            max_flows: DEFAULT_MAX_FLOWS,
            cid_len: DEFAULT_CID_LEN,
            phase_gain: DEFAULT_PHASE_GAIN,
        }
    }

    /// Sets the phase gain (0: every flow of a weight is stamped the same rate).
    #[must_use]
    pub fn with_phase_gain(mut self, gain: f64) -> Self {
        self.phase_gain = gain;
        self
    }

    /// Sets the capacity.
    #[must_use]
    pub fn with_capacity(mut self, bps: u64) -> Self {
        self.capacity_bps = bps;
        self
    }

    /// Sets the target utilisation α.
    #[must_use]
    pub fn with_target_utilisation(mut self, alpha: f64) -> Self {
        self.target_utilisation = alpha;
        self
    }

    /// Sets the control interval T.
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets the nominal round-trip time d.
    #[must_use]
    pub fn with_control_rtt(mut self, rtt: Duration) -> Self {
        self.control_rtt = rtt;
        self
    }

    /// Sets the connection-ID length used to parse short headers.
    #[must_use]
    pub fn with_cid_len(mut self, len: usize) -> Self {
        self.cid_len = len;
        self
    }

    /// α clamped to (0, 1]; NaN reads as the default.
    fn alpha(&self) -> f64 {
        sane(self.target_utilisation, DEFAULT_TARGET_UTILISATION).clamp(0.01, 1.0)
    }

    /// d in seconds, at least 1 ms.
    fn d(&self) -> f64 {
        self.control_rtt.as_secs_f64().max(0.001)
    }

    /// The weight of a flow declaring `expected_kbps`.
    fn weight(&self, expected_kbps: u32) -> f64 {
        if expected_kbps == NO_RATE_LIMIT {
            return 1.0;
        }
        let unit = self.weight_unit_bps.max(1) as f64;
        let lo = sane(self.min_weight, DEFAULT_MIN_WEIGHT).max(f64::MIN_POSITIVE);
        let hi = sane(self.max_weight, DEFAULT_MAX_WEIGHT).max(lo);
        (f64::from(expected_kbps) * 1000.0 / unit).clamp(lo, hi)
    }
}

/// `v` if it is a finite number, else `default` (a config field set to NaN must not poison `R`).
fn sane(v: f64, default: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        default
    }
}

/// Identifies a flow at a router: the destination connection ID and the path ID of its short
/// headers (§4.7). Both ends of a connection are different flows (different DCIDs), and so are
/// the paths of one connection (each may cross different bottlenecks).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowKey {
    cid: [u8; MAX_CID_LEN],
    cid_len: u8,
    path_id: u8,
}

impl FlowKey {
    /// The key of DCID `dcid` (at most 20 bytes; longer is cut) and path `path_id`.
    pub fn new(dcid: &[u8], path_id: u8) -> Self {
        let len = dcid.len().min(MAX_CID_LEN);
        let mut cid = [0; MAX_CID_LEN];
        cid[..len].copy_from_slice(&dcid[..len]);
        Self {
            cid,
            cid_len: len as u8,
            path_id,
        }
    }

    /// The destination connection ID.
    pub fn dcid(&self) -> &[u8] {
        &self.cid[..usize::from(self.cid_len)]
    }

    /// The path ID.
    pub fn path_id(&self) -> u8 {
        self.path_id
    }
}

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.dcid() {
            write!(f, "{b:02x}")?;
        }
        write!(f, "/{}", self.path_id)
    }
}

/// What [`Router::on_datagram`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stamp {
    /// Not a tern short-header packet with a rate area: counted as load, left untouched.
    Unrated,
    /// Rated, but its Feedback Rate was already at or below this router's rate (a tighter
    /// router upstream); left untouched.
    Kept {
        /// The flow the packet belongs to.
        flow: FlowKey,
        /// The Feedback Rate it carries, kbit/s.
        feedback_kbps: u32,
    },
    /// Its Feedback Rate was lowered.
    Lowered {
        /// The flow the packet belongs to.
        flow: FlowKey,
        /// The value before, kbit/s.
        from_kbps: u32,
        /// The value written, kbit/s.
        to_kbps: u32,
    },
}

/// What the router knows about one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct FlowInfo {
    /// The Expected Rate of its last packet, kbit/s (`0xFFFFFFFF`: unset).
    pub expected_kbps: u32,
    /// Its weight (`e / U`, or 1 when unset; clamped).
    pub weight: f64,
    /// The rate the router allows it now, bit/s: `min(w·R, e, C)`.
    pub rate_bps: f64,
    /// Bytes seen from it in all.
    pub bytes: u64,
    /// When it was last seen.
    pub last_seen: Instant,
}

/// Counters and the controller's state, for tests, logs and link statistics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct RouterStats {
    /// `R`: the rate a flow of weight 1 is allowed, bit/s.
    pub rate_per_weight_bps: f64,
    /// The capacity `C` in force, bit/s.
    pub capacity_bps: u64,
    /// Arrival rate `y` measured over the last interval, bit/s (all traffic).
    pub arrival_bps: f64,
    /// Queue `q` used by the last update, bytes.
    pub queue_bytes: f64,
    /// Flows in the table (seen within the flow timeout).
    pub flows: usize,
    /// `N̂ = y_rated / R`, averaged over about `d`: the weighted number of flows that take their
    /// full share here (flows limited elsewhere count fractionally).
    pub effective_flows: f64,
    /// Datagrams seen (UDP payloads).
    pub datagrams: u64,
    /// Bytes seen, [`Router::on_other`] bytes included.
    pub bytes: u64,
    /// Datagrams with a rate area.
    pub rated: u64,
    /// Datagrams whose Feedback Rate was lowered.
    pub stamped: u64,
    /// Control updates run.
    pub updates: u64,
    /// Rated datagrams of flows the full table could not track (stamped all the same).
    pub untracked: u64,
}

impl fmt::Display for RouterStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "R {:.0} kbit/s flows {} (N̂ {:.2}) y {:.0} kbit/s of C {} kbit/s q {:.0} B rated {} stamped {}",
            self.rate_per_weight_bps / 1000.0,
            self.flows,
            self.effective_flows,
            self.arrival_bps / 1000.0,
            self.capacity_bps / 1000,
            self.queue_bytes,
            self.rated,
            self.stamped
        )
    }
}

/// How far above the most demanding flow's use (per unit weight) spare capacity may raise `R`
/// (1.25: a quarter above what a flow uses; see "Constants and why").
pub const DEMAND_HEADROOM: f64 = 1.25;

#[derive(Debug, Clone, Copy)]
struct Flow {
    expected_kbps: u32,
    weight: f64,
    bytes: u64,
    last_seen: Instant,
    /// Bytes since the last update.
    interval_bytes: u64,
    /// Its arrival rate per unit weight, bit/s, smoothed over about `d`.
    usage: f64,
}

/// The explicit-rate controller of one link direction. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Router {
    config: RouterConfig,
    /// `R`, bit/s per unit weight.
    rate: f64,
    last_update: Instant,
    last_sweep: Instant,
    /// Bytes (all traffic) and rated bytes since the last update.
    interval_bytes: u64,
    interval_rated_bytes: u64,
    /// Smallest weight of the tracked flows (at most 1): `w_min`, recomputed at each sweep.
    min_weight: f64,
    /// Queue samples since the last update, and the latest one.
    queue_sum: f64,
    queue_samples: u64,
    last_queue: usize,
    /// What the driver said the next datagram will wait ([`Router::set_wait`]).
    pending_wait: Option<Duration>,
    flows: BTreeMap<FlowKey, Flow>,
    /// Σ weights of the tracked flows, each counted up to 1 (see `track`).
    total_weight: f64,
    stats: RouterStats,
}

impl Router {
    /// A router whose first interval starts at `now`. `R` starts at `α·C`: a first flow may
    /// take the whole target at once; later flows make the loop share it.
    pub fn new(config: RouterConfig, now: Instant) -> Self {
        let rate = (config.alpha() * config.capacity_bps as f64).max(MIN_RATE_BPS);
        let stats = RouterStats {
            rate_per_weight_bps: rate,
            capacity_bps: config.capacity_bps,
            ..RouterStats::default()
        };
        Self {
            config,
            rate,
            last_update: now,
            last_sweep: now,
            interval_bytes: 0,
            interval_rated_bytes: 0,
            min_weight: 1.0,
            queue_sum: 0.0,
            queue_samples: 0,
            last_queue: 0,
            pending_wait: None,
            flows: BTreeMap::new(),
            total_weight: 0.0,
            stats,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Changes the capacity from now on (a trace-driven link; the caller smooths the trace
    /// over about one interval). `R` is not rescaled: the spare term `α·C − y` sees the change
    /// at the next update and moves `R` within a few intervals, which is also right when the
    /// flows are limited elsewhere and the change does not concern them.
    pub fn set_capacity(&mut self, bps: u64, now: Instant) {
        self.update(now);
        self.config.capacity_bps = bps;
        self.stats.capacity_bps = bps;
    }

    /// Records the queue (`queue_bytes` ahead of the next datagram, or the occupancy on a
    /// timer) and runs the control law if an interval has passed since the last update.
    pub fn tick(&mut self, now: Instant, queue_bytes: usize) {
        self.queue_sum += queue_bytes as f64;
        self.queue_samples += 1;
        self.last_queue = queue_bytes;
        self.update(now);
    }

    /// Tells the router how long the datagram about to be offered to
    /// [`on_datagram`](Self::on_datagram) will wait before its first byte is sent (the
    /// remaining transmission of the packet on the wire and of those queued ahead). Optional:
    /// without it, every flow of a weight is stamped the same rate.
    pub fn set_wait(&mut self, wait: Duration) {
        self.pending_wait = Some(wait);
    }

    /// Counts `bytes` of traffic that is not a UDP payload (other IP packets) as load.
    pub fn on_other(&mut self, now: Instant, bytes: usize) {
        self.update(now);
        self.interval_bytes = self.interval_bytes.saturating_add(bytes as u64);
        self.stats.bytes = self.stats.bytes.saturating_add(bytes as u64);
    }

    /// A UDP payload entering the link at `now`: counted as load; if it is a tern short-header
    /// packet with a rate area, its flow is tracked and its Feedback Rate lowered to the flow's
    /// allowed rate (never raised). Anything else is left untouched. Never panics.
    pub fn on_datagram(&mut self, now: Instant, datagram: &mut [u8]) -> Stamp {
        self.update(now);
        let wait = self.pending_wait.take();
        let len = datagram.len() as u64;
        self.interval_bytes = self.interval_bytes.saturating_add(len);
        self.stats.bytes = self.stats.bytes.saturating_add(len);
        self.stats.datagrams += 1;
        let Some((start, header)) = rated_short_header(datagram, self.config.cid_len) else {
            return Stamp::Unrated;
        };
        let (Some(area), Some(offset)) = (header.rate, header.feedback_rate_offset()) else {
            return Stamp::Unrated;
        };
        let Some(field) = datagram.get_mut(start + offset..start + offset + 4) else {
            return Stamp::Unrated;
        };
        self.stats.rated += 1;
        self.interval_rated_bytes = self.interval_rated_bytes.saturating_add(len);
        let flow = FlowKey::new(header.dcid.as_bytes(), header.path_id);
        let weight = self.config.weight(area.expected_kbps);
        self.min_weight = self.min_weight.min(weight);
        self.track(flow, area.expected_kbps, weight, len, now);
        let rate = self.allowed(area.expected_kbps, weight) * self.phase_factor(wait);
        let to_kbps = kbps(rate);
        let from_kbps = u32::from_be_bytes([field[0], field[1], field[2], field[3]]);
        if to_kbps < from_kbps {
            field.copy_from_slice(&to_kbps.to_be_bytes());
            self.stats.stamped += 1;
            Stamp::Lowered {
                flow,
                from_kbps,
                to_kbps,
            }
        } else {
            Stamp::Kept {
                flow,
                feedback_kbps: from_kbps,
            }
        }
    }

    /// Counters and controller state.
    pub fn stats(&self) -> RouterStats {
        RouterStats {
            flows: self.flows.len(),
            ..self.stats
        }
    }

    /// `R`, bit/s per unit weight.
    pub fn rate_per_weight_bps(&self) -> f64 {
        self.rate
    }

    /// The rate allowed now to a flow declaring `expected_kbps` (`0xFFFFFFFF`: unset), bit/s.
    pub fn rate_for(&self, expected_kbps: u32) -> f64 {
        self.allowed(expected_kbps, self.config.weight(expected_kbps))
    }

    /// What the router knows about the flow of DCID `dcid` on path `path_id`, if it is tracked.
    pub fn flow(&self, dcid: &[u8], path_id: u8) -> Option<FlowInfo> {
        self.flows
            .get(&FlowKey::new(dcid, path_id))
            .map(|f| FlowInfo {
                expected_kbps: f.expected_kbps,
                weight: f.weight,
                rate_bps: self.allowed(f.expected_kbps, f.weight),
                bytes: f.bytes,
                last_seen: f.last_seen,
            })
    }

    /// Every tracked flow, in key order.
    pub fn flows(&self) -> impl Iterator<Item = (FlowKey, FlowInfo)> + '_ {
        self.flows.iter().map(|(k, f)| {
            let info = FlowInfo {
                expected_kbps: f.expected_kbps,
                weight: f.weight,
                rate_bps: self.allowed(f.expected_kbps, f.weight),
                bytes: f.bytes,
                last_seen: f.last_seen,
            };
            (*k, info)
        })
    }

    /// The share of its rate a flow whose datagram waits `wait` is stamped: `1 − min(k·w/d,`
    /// [`MAX_PHASE_CUT`]`)`.
    fn phase_factor(&self, wait: Option<Duration>) -> f64 {
        let k = sane(self.config.phase_gain, DEFAULT_PHASE_GAIN).max(0.0);
        let w = wait.map_or(0.0, |w| w.as_secs_f64());
        1.0 - (k * w / self.config.d()).min(MAX_PHASE_CUT)
    }

    /// `min(w·R, e, C)`, at least [`MIN_RATE_BPS`].
    fn allowed(&self, expected_kbps: u32, weight: f64) -> f64 {
        let mut r = (weight * self.rate).min(self.config.capacity_bps as f64);
        if expected_kbps != NO_RATE_LIMIT {
            r = r.min(f64::from(expected_kbps) * 1000.0);
        }
        r.max(MIN_RATE_BPS)
    }

    fn track(&mut self, key: FlowKey, expected_kbps: u32, weight: f64, len: u64, now: Instant) {
        if let Some(f) = self.flows.get_mut(&key) {
            // Its weight changed: W follows (each flow counts in W up to weight 1).
            if weight != f.weight {
                self.total_weight += weight.min(1.0) - f.weight.min(1.0);
            }
            f.expected_kbps = expected_kbps;
            f.weight = weight;
            f.bytes = f.bytes.saturating_add(len);
            f.interval_bytes = f.interval_bytes.saturating_add(len);
            f.last_seen = now;
        } else if self.flows.len() < self.config.max_flows {
            // NC-TCP's `/N`, ahead of the loop: a new flow of weight `w` joining flows of total
            // weight `W` would, at the current R, add `w·R` to a link the others already fill.
            // Sharing the same total among `W + w` needs R·W/(W + w) at once; waiting for the
            // loop would cost a round trip of overload and its queue (with every flow starting
            // together, N new flows at R = α·C each). Flows limited elsewhere make this too low
            // for a moment; the loop then raises R within a few round trips.
            //
            // A newcomer counts here as at most one unit flow (W and the cut alike): one packet
            // with a fresh CID and a huge Expected Rate must not cut every flow's rate (found
            // by an outside read: ÷334 from one 40-byte packet); k such packets weigh as k
            // flows joining. A heavier newcomer is brought to its share by the loop, which
            // measures load.
            let w = weight.min(1.0);
            if self.total_weight > 0.0 {
                let scaled = self.rate * self.total_weight / (self.total_weight + w);
                self.rate = scaled.max(MIN_RATE_BPS);
            }
            self.total_weight += w;
            self.flows.insert(
                key,
                Flow {
                    expected_kbps,
                    weight,
                    bytes: len,
                    last_seen: now,
                    interval_bytes: len,
                    usage: 0.0,
                },
            );
        } else {
            self.stats.untracked += 1;
        }
    }

    /// The control law (module docs), if an interval has passed.
    fn update(&mut self, now: Instant) {
        let Some(elapsed) = now.checked_duration_since(self.last_update) else {
            return;
        };
        if elapsed < self.config.interval.max(Duration::from_micros(100)) {
            return;
        }
        let dt = elapsed.as_secs_f64();
        let c = self.config.capacity_bps as f64;
        let alpha = self.config.alpha();
        let target = (alpha * c).max(MIN_RATE_BPS);
        let d = self.config.d();
        let y = self.interval_bytes as f64 * 8.0 / dt;
        let q = if self.queue_samples > 0 {
            self.queue_sum / self.queue_samples as f64
        } else {
            self.last_queue as f64
        };
        let gain = sane(self.config.rate_gain, DEFAULT_RATE_GAIN).max(0.0);
        let beta = sane(self.config.queue_gain, DEFAULT_QUEUE_GAIN).max(0.0);
        // The arrival rate wanted: the target less the queue's drain term, but never less than
        // a quarter of the target (anti-windup: a huge queue must not drive R to the floor).
        let wanted = (target - beta * 8.0 * q / d).max(target * MIN_WANTED);
        let error = ((wanted - y) / target).clamp(-MAX_OVERLOAD, 1.0);
        let step = sane((gain * (dt / d).min(1.0) * error).exp(), 1.0);
        let max_rate = (c / self.min_weight.min(1.0)).max(MIN_RATE_BPS);
        let rated_y = self.interval_rated_bytes as f64 * 8.0 / dt;
        // Each flow's use of its share, per unit weight, smoothed over about d.
        let smooth = (dt / d).min(1.0);
        let mut usage_max: f64 = 0.0;
        for f in self.flows.values_mut() {
            let sample = f.interval_bytes as f64 * 8.0 / dt / f.weight.max(f64::MIN_POSITIVE);
            f.usage += smooth * (sample - f.usage);
            f.interval_bytes = 0;
            usage_max = usage_max.max(f.usage);
        }
        let mut next = self.rate * step;
        if step > 1.0 && !self.flows.is_empty() {
            // Spare capacity raises R only up to DEMAND_HEADROOM × what the most demanding
            // flow uses: flows held back by their own bounds, a tighter router or their
            // application would otherwise let R run up to C, and every flow would get that
            // stamp at once when they catch up (overload, a queue, a deep cut: oscillation).
            next = next.min(self.rate.max(DEMAND_HEADROOM * usage_max));
        }
        self.rate = sane(next, target).clamp(MIN_RATE_BPS, max_rate);

        self.stats.rate_per_weight_bps = self.rate;
        self.stats.arrival_bps = y;
        self.stats.queue_bytes = q;
        // Smoothed over about d: one interval holds a packet or two on a slow link.
        let w = (dt / d).min(1.0);
        self.stats.effective_flows += w * (rated_y / self.rate - self.stats.effective_flows);
        self.stats.updates += 1;
        self.last_update = now;
        self.interval_bytes = 0;
        self.interval_rated_bytes = 0;
        self.queue_sum = 0.0;
        self.queue_samples = 0;

        if now.saturating_duration_since(self.last_sweep) >= self.config.flow_timeout / 2 {
            let timeout = self.config.flow_timeout;
            self.flows
                .retain(|_, f| now.saturating_duration_since(f.last_seen) < timeout);
            // Recomputed rather than decremented, so rounding never accumulates.
            self.total_weight = self.flows.values().map(|f| f.weight.min(1.0)).sum();
            self.min_weight = self.flows.values().map(|f| f.weight).fold(1.0, f64::min);
            if self.flows.is_empty() {
                // Every flow left: the next one may take the whole target at once, as the
                // first did (the loop, updated only by arriving packets, would take seconds).
                self.rate = target;
            }
            self.last_sweep = now;
        }
    }
}

/// `bps` as a Feedback Rate in kbit/s: rounded down (never more than allowed), at least 1, and
/// never the "no limit" value.
fn kbps(bps: f64) -> u32 {
    let k = (bps / 1000.0).floor();
    if k.is_nan() || k < 1.0 {
        1
    } else if k >= f64::from(NO_RATE_LIMIT - 1) {
        NO_RATE_LIMIT - 1
    } else {
        k as u32
    }
}

/// The short-header packet of `datagram` that carries a rate area and a whole AEAD tag, with
/// its offset in the datagram: the same packet [`wire::feedback_rate_offset`] finds (coalesced
/// Initial and Handshake packets are skipped), decoded with the wire's own decoders.
fn rated_short_header(datagram: &[u8], cid_len: usize) -> Option<(usize, ShortHeader)> {
    // The wire helper holds the rules (which packets to skip, the tag length); it answers
    // `None` for exactly the datagrams without a rewritable field.
    let field = wire::feedback_rate_offset(datagram, cid_len)?;
    let mut start = 0;
    loop {
        let rest = datagram.get(start..)?;
        match Packet::decode(rest, cid_len).ok()? {
            (
                Packet {
                    header: Header::Short(h),
                    ..
                },
                _,
            ) => {
                let offset = h.feedback_rate_offset()?;
                return (start + offset == field).then_some((start, h));
            }
            (_, after) => start = datagram.len().checked_sub(after.len())?,
        }
        if start == 0 {
            return None;
        }
    }
}

/// Fuzz entry point (`fuzz/fuzz_targets/router.rs`): `data` is offered as one datagram to
/// routers parsing 8-, 0- and 20-byte connection IDs, several times as time passes. Panics only
/// if a property breaks: a Feedback Rate raised, bytes other than the field changed, or a
/// stamp that disagrees with [`wire::read_feedback_rate`].
pub fn fuzz(data: &[u8], epoch: Instant) {
    for cid_len in [DEFAULT_CID_LEN, 0, MAX_CID_LEN] {
        let mut router = Router::new(RouterConfig::new(1_000_000).with_cid_len(cid_len), epoch);
        for i in 0..4u32 {
            let now = epoch + Duration::from_millis(7) * i;
            router.tick(now, data.len() * i as usize);
            let before = wire::read_feedback_rate(data, cid_len);
            let mut copy = data.to_vec();
            let stamp = router.on_datagram(now, &mut copy);
            let after = wire::read_feedback_rate(&copy, cid_len);
            match stamp {
                Stamp::Unrated => {
                    assert_eq!(copy, data, "unrated datagram changed");
                }
                Stamp::Kept { feedback_kbps, .. } => {
                    assert_eq!(copy, data, "kept datagram changed");
                    assert_eq!(before, Some(feedback_kbps));
                }
                Stamp::Lowered {
                    from_kbps, to_kbps, ..
                } => {
                    assert_eq!(before, Some(from_kbps));
                    assert_eq!(after, Some(to_kbps));
                    assert!(to_kbps < from_kbps, "feedback rate raised");
                    let o = wire::feedback_rate_offset(data, cid_len).expect("offset");
                    assert_eq!(copy[..o], data[..o]);
                    assert_eq!(copy[o + 4..], data[o + 4..]);
                }
            }
        }
        let s = router.stats();
        assert!(s.rate_per_weight_bps.is_finite() && s.rate_per_weight_bps >= MIN_RATE_BPS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{read_feedback_rate, ConnectionId, RateArea};
    use proptest::prelude::*;
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};

    /// An arbitrary time origin; only differences are used.
    #[allow(clippy::disallowed_methods)]
    fn origin() -> Instant {
        Instant::now()
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A short-header datagram of `size` bytes for DCID `cid`, path 0, with a rate area.
    fn packet(
        cid: &[u8],
        path_id: u8,
        expected_kbps: u32,
        feedback_kbps: u32,
        size: usize,
    ) -> Vec<u8> {
        let header = ShortHeader::new(
            ConnectionId::new(cid).expect("cid"),
            path_id,
            false,
            1,
            None,
            Some(RateArea {
                expected_kbps,
                feedback_kbps,
            }),
        );
        let mut buf = Vec::with_capacity(size);
        header.encode(&mut buf);
        buf.resize(size.max(buf.len() + 16), 0xa5);
        buf
    }

    // -----------------------------------------------------------------------------------------
    // A packet-level model: paced senders, FIFO links served at C with a router each, and a
    // receiver that echoes every packet's Feedback Rate back to its sender.

    const PKT: usize = 1200;

    #[derive(Clone)]
    struct FlowSpec {
        /// Indices of the links crossed, in order.
        route: Vec<usize>,
        /// Round-trip propagation time; split: 1/4 to the first link, 1/4 across the route,
        /// the rest to the receiver and back.
        rtt: Duration,
        expected_kbps: u32,
        start: Duration,
        stop: Option<Duration>,
    }

    impl FlowSpec {
        fn new(route: &[usize], rtt_ms: u64) -> Self {
            Self {
                route: route.to_vec(),
                rtt: ms(rtt_ms),
                expected_kbps: NO_RATE_LIMIT,
                start: Duration::ZERO,
                stop: None,
            }
        }
        fn expecting(mut self, kbps: u32) -> Self {
            self.expected_kbps = kbps;
            self
        }
        fn starting(mut self, at: Duration) -> Self {
            self.start = at;
            self
        }
        fn stopping(mut self, at: Duration) -> Self {
            self.stop = Some(at);
            self
        }
    }

    struct Sender {
        spec: FlowSpec,
        cid: [u8; 8],
        rate: f64,
        generation: u64,
        last_send: Duration,
    }

    struct Hop {
        router: Router,
        capacity: f64,
        busy_until: Duration,
        backlog: VecDeque<(Duration, usize)>,
        backlog_bytes: usize,
    }

    enum Ev {
        Send {
            flow: usize,
            generation: u64,
        },
        Arrive {
            flow: usize,
            hop: usize,
            data: Vec<u8>,
        },
        Echo {
            flow: usize,
            kbps: u32,
        },
    }

    /// What happened during the measurement window.
    #[derive(Debug)]
    struct Outcome {
        /// Per flow: goodput at its last link over the window, bit/s.
        throughput: Vec<f64>,
        /// Per link: departed bits / (C · window).
        utilisation: Vec<f64>,
        /// Per link: mean time packets waited before serialization, seconds.
        mean_wait: Vec<f64>,
        /// Per link: the largest wait.
        max_wait: Vec<f64>,
        /// Per flow: sampled pacing rates every 10 ms, (time, bit/s).
        rates: Vec<Vec<(Duration, f64)>>,
        routers: Vec<RouterStats>,
        tracked_flows_at_end: Vec<usize>,
    }

    struct Model {
        epoch: Instant,
        hops: Vec<Hop>,
        senders: Vec<Sender>,
        events: BinaryHeap<Reverse<(Duration, u64, usize)>>,
        payloads: Vec<Option<Ev>>,
        seq: u64,
        lcg: u64,
    }

    impl Model {
        fn new(capacities: &[u64], flows: &[FlowSpec], seed: u64) -> Self {
            let epoch = origin();
            let hops = capacities
                .iter()
                .map(|&c| Hop {
                    router: Router::new(RouterConfig::new(c), epoch),
                    capacity: c as f64,
                    busy_until: Duration::ZERO,
                    backlog: VecDeque::new(),
                    backlog_bytes: 0,
                })
                .collect();
            let senders = flows
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let start_rate = if spec.expected_kbps == NO_RATE_LIMIT {
                        200_000.0
                    } else {
                        f64::from(spec.expected_kbps) * 1000.0
                    };
                    Sender {
                        spec: spec.clone(),
                        cid: [i as u8 + 1; 8],
                        rate: start_rate,
                        generation: 0,
                        last_send: Duration::ZERO,
                    }
                })
                .collect();
            let mut m = Self {
                epoch,
                hops,
                senders,
                events: BinaryHeap::new(),
                payloads: Vec::new(),
                seq: 0,
                lcg: seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407),
            };
            for (i, flow) in flows.iter().enumerate() {
                let phase = Duration::from_micros(m.random() % 20_000);
                m.push(
                    flow.start + phase,
                    Ev::Send {
                        flow: i,
                        generation: 0,
                    },
                );
            }
            m
        }

        fn random(&mut self) -> u64 {
            self.lcg = self
                .lcg
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.lcg >> 33
        }

        fn push(&mut self, at: Duration, ev: Ev) {
            self.payloads.push(Some(ev));
            self.events
                .push(Reverse((at, self.seq, self.payloads.len() - 1)));
            self.seq += 1;
        }

        fn gap(&mut self, rate: f64) -> Duration {
            let base = PKT as f64 * 8.0 / rate.max(1.0);
            // Pacing timers are not exact: up to 5 % late.
            let jitter = (self.random() % 1000) as f64 / 1000.0 * 0.05;
            Duration::from_secs_f64(base * (1.0 + jitter))
        }

        /// Runs until `end`; measures over `[from, end)`.
        fn run(&mut self, from: Duration, end: Duration) -> Outcome {
            let n = self.senders.len();
            let links = self.hops.len();
            let mut bytes = vec![0u64; n];
            let mut departed = vec![0f64; links];
            let mut waits = vec![(0f64, 0u64, 0f64); links];
            let mut rates = vec![Vec::new(); n];
            let mut next_sample = Duration::ZERO;
            while let Some(Reverse((t, _, idx))) = self.events.pop() {
                if t >= end {
                    break;
                }
                while next_sample <= t {
                    for (i, s) in self.senders.iter().enumerate() {
                        let active = s.spec.start <= next_sample
                            && s.spec.stop.is_none_or(|stop| next_sample < stop);
                        if active {
                            rates[i].push((next_sample, s.rate));
                        }
                    }
                    next_sample += ms(10);
                }
                let Some(ev) = self.payloads[idx].take() else {
                    continue;
                };
                match ev {
                    Ev::Send { flow, generation } => {
                        let s = &self.senders[flow];
                        if generation != s.generation || s.spec.stop.is_some_and(|stop| t >= stop) {
                            continue;
                        }
                        let data = packet(&s.cid, 0, s.spec.expected_kbps, NO_RATE_LIMIT, PKT);
                        let first = s.spec.rtt / 4;
                        let rate = s.rate;
                        self.senders[flow].last_send = t;
                        self.push(t + first, Ev::Arrive { flow, hop: 0, data });
                        let next = t + self.gap(rate);
                        self.push(next, Ev::Send { flow, generation });
                    }
                    Ev::Arrive {
                        flow,
                        hop,
                        mut data,
                    } => {
                        let link = self.senders[flow].spec.route[hop];
                        let now = self.epoch + t;
                        let h = &mut self.hops[link];
                        while let Some(&(dep, size)) = h.backlog.front() {
                            if dep > t {
                                break;
                            }
                            h.backlog.pop_front();
                            h.backlog_bytes -= size;
                        }
                        h.router.tick(now, h.backlog_bytes);
                        h.router.set_wait(h.busy_until.saturating_sub(t));
                        h.router.on_datagram(now, &mut data);
                        let start = t.max(h.busy_until);
                        let dep =
                            start + Duration::from_secs_f64(data.len() as f64 * 8.0 / h.capacity);
                        h.busy_until = dep;
                        h.backlog.push_back((dep, data.len()));
                        h.backlog_bytes += data.len();
                        if t >= from {
                            let w = (start - t).as_secs_f64();
                            waits[link].0 += w;
                            waits[link].1 += 1;
                            waits[link].2 = waits[link].2.max(w);
                        }
                        if dep >= from && dep < end {
                            departed[link] += data.len() as f64 * 8.0;
                        }
                        let spec = &self.senders[flow].spec;
                        let hops = spec.route.len();
                        let across = spec.rtt / 4 / hops as u32;
                        if hop + 1 < hops {
                            self.push(
                                dep + across,
                                Ev::Arrive {
                                    flow,
                                    hop: hop + 1,
                                    data,
                                },
                            );
                        } else {
                            if dep >= from && dep < end {
                                bytes[flow] += data.len() as u64;
                            }
                            let back = spec.rtt - spec.rtt / 4 - across * hops as u32;
                            let kbps = read_feedback_rate(&data, DEFAULT_CID_LEN).expect("rated");
                            self.push(dep + back, Ev::Echo { flow, kbps });
                        }
                    }
                    Ev::Echo { flow, kbps } => {
                        if kbps == NO_RATE_LIMIT {
                            continue;
                        }
                        let s = &mut self.senders[flow];
                        let mut rate = f64::from(kbps) * 1000.0;
                        if s.spec.expected_kbps != NO_RATE_LIMIT {
                            rate = rate.min(f64::from(s.spec.expected_kbps) * 1000.0);
                        }
                        if rate != s.rate {
                            // Re-pace from the last send at the new rate.
                            s.rate = rate;
                            s.generation += 1;
                            let generation = s.generation;
                            let last = s.last_send;
                            let next = (last + self.gap(rate)).max(t);
                            self.push(next, Ev::Send { flow, generation });
                        }
                    }
                }
            }
            let window = (end - from).as_secs_f64();
            let now = self.epoch + end;
            for h in &mut self.hops {
                h.router.tick(now, 0);
            }
            Outcome {
                throughput: bytes.iter().map(|&b| b as f64 * 8.0 / window).collect(),
                utilisation: departed
                    .iter()
                    .zip(&self.hops)
                    .map(|(&b, h)| b / (h.capacity * window))
                    .collect(),
                mean_wait: waits.iter().map(|w| w.0 / w.1.max(1) as f64).collect(),
                max_wait: waits.iter().map(|w| w.2).collect(),
                rates,
                routers: self.hops.iter().map(|h| h.router.stats()).collect(),
                tracked_flows_at_end: self.hops.iter().map(|h| h.router.stats().flows).collect(),
            }
        }
    }

    fn jain(x: &[f64]) -> f64 {
        let sum: f64 = x.iter().sum();
        let sq: f64 = x.iter().map(|v| v * v).sum();
        sum * sum / (x.len() as f64 * sq)
    }

    /// The last time (from `after`) any flow's sampled rate was outside ±`tol` of its target.
    fn settled_at(o: &Outcome, targets: &[f64], tol: f64, after: Duration) -> Duration {
        let mut last = after;
        for (samples, &target) in o.rates.iter().zip(targets) {
            for &(t, r) in samples {
                if t >= after && (r / target - 1.0).abs() > tol {
                    last = last.max(t);
                }
            }
        }
        last - after
    }

    /// Smallest and largest sampled rate of any flow from `after` on.
    fn rate_range(o: &Outcome, after: Duration) -> (f64, f64) {
        o.rates
            .iter()
            .flatten()
            .filter(|(t, _)| *t >= after)
            .fold((f64::MAX, 0.0f64), |(lo, hi), &(_, r)| {
                (lo.min(r), hi.max(r))
            })
    }

    fn rtts(n: usize) -> impl Iterator<Item = u64> {
        [80, 100, 120, 140].into_iter().cycle().take(n)
    }

    /// `max_wait_ms`: the mean queueing delay allowed. DESIGN.md §4 asks ≤ 2 ms for the three
    /// flows of `fairness`; ten flows paced at 98 kbit/s with 1200-byte packets collide more
    /// often on a 1 Mbit/s link, where one packet takes 9.6 ms to send.
    fn equal_flows(n: usize, capacity: u64, max_wait_ms: f64) {
        let flows: Vec<_> = rtts(n).map(|rtt| FlowSpec::new(&[0], rtt)).collect();
        let mut m = Model::new(&[capacity], &flows, n as u64);
        let o = m.run(Duration::from_secs(20), Duration::from_secs(40));
        let share = DEFAULT_TARGET_UTILISATION * capacity as f64 / n as f64;
        let settle = settled_at(&o, &vec![share; n], 0.1, Duration::ZERO);
        let (lo, hi) = rate_range(&o, Duration::from_secs(20));
        eprintln!(
            "N={n} C={capacity}: throughput {:?} (share {share:.0}) util {:.3} wait mean {:.2} ms max {:.1} ms, within 10 % after {settle:?}, rates {lo:.0}..{hi:.0} after 20 s; {}",
            o.throughput.iter().map(|t| t.round()).collect::<Vec<_>>(),
            o.utilisation[0],
            o.mean_wait[0] * 1e3,
            o.max_wait[0] * 1e3,
            o.routers[0]
        );
        for &t in &o.throughput {
            assert!((t / share - 1.0).abs() < 0.05, "{t} vs share {share}");
        }
        assert!(jain(&o.throughput) > 0.99);
        assert!(o.utilisation[0] >= 0.95, "utilisation {}", o.utilisation[0]);
        assert!(
            o.mean_wait[0] * 1e3 <= max_wait_ms,
            "mean queueing delay {}",
            o.mean_wait[0]
        );
        assert!(settle < Duration::from_secs(5), "settled after {settle:?}");
        assert_eq!(o.tracked_flows_at_end[0], n);
    }

    #[test]
    fn one_flow_gets_the_target() {
        equal_flows(1, 1_000_000, 2.0);
    }

    #[test]
    fn three_equal_flows_share_one_mbit() {
        equal_flows(3, 1_000_000, 2.0);
    }

    #[test]
    fn ten_equal_flows_share_one_mbit() {
        equal_flows(10, 1_000_000, 4.0);
    }

    #[test]
    fn three_equal_flows_share_ten_mbit() {
        equal_flows(3, 10_000_000, 2.0);
    }

    #[test]
    fn expected_rates_weight_the_shares() {
        // Weights 0.2, 0.4 and 1 (unset): α·C split 1 : 2 : 5.
        let flows = [
            FlowSpec::new(&[0], 80).expecting(200),
            FlowSpec::new(&[0], 100).expecting(400),
            FlowSpec::new(&[0], 120),
        ];
        let mut m = Model::new(&[1_000_000], &flows, 7);
        let o = m.run(Duration::from_secs(20), Duration::from_secs(40));
        let total = DEFAULT_TARGET_UTILISATION * 1e6;
        let shares = [total * 0.2 / 1.6, total * 0.4 / 1.6, total / 1.6];
        let settle = settled_at(&o, &shares, 0.1, Duration::ZERO);
        eprintln!(
            "weighted: {:?} for shares {shares:?}, util {:.3}, wait {:.2} ms, settled {settle:?}",
            o.throughput,
            o.utilisation[0],
            o.mean_wait[0] * 1e3
        );
        for (t, s) in o.throughput.iter().zip(shares) {
            assert!((t / s - 1.0).abs() < 0.06, "{t} vs {s}");
        }
        assert!(o.utilisation[0] >= 0.95);
        // The 612 kbit/s flow's packets (one per 15.7 ms) often meet a smaller flow's packet
        // in service (9.6 ms at 1 Mbit/s): more collisions than three equal flows have.
        assert!(o.mean_wait[0] <= 0.005);
    }

    #[test]
    fn a_flow_never_gets_more_than_it_expects_and_the_others_take_the_spare() {
        // 10 Mbit/s: an even split (3.27 Mbit/s) is above the first flow's 1 Mbit/s, so it is
        // capped there and the two others share the rest.
        let flows = [
            FlowSpec::new(&[0], 100).expecting(1000),
            FlowSpec::new(&[0], 80),
            FlowSpec::new(&[0], 140),
        ];
        let mut m = Model::new(&[10_000_000], &flows, 8);
        let o = m.run(Duration::from_secs(20), Duration::from_secs(40));
        let rest = (DEFAULT_TARGET_UTILISATION * 10e6 - 1e6) / 2.0;
        eprintln!(
            "capped: {:?}, rest {rest:.0} each, util {:.3}",
            o.throughput, o.utilisation[0]
        );
        assert!(o.throughput[0] <= 1e6 && o.throughput[0] > 0.95e6);
        for t in &o.throughput[1..] {
            assert!((t / rest - 1.0).abs() < 0.05, "{t} vs {rest}");
        }
        assert!(o.utilisation[0] >= 0.95);
        for (t, r) in o.rates[0].iter() {
            assert!(*r <= 1e6, "flow 0 given {r} at {t:?}");
        }
    }

    #[test]
    fn a_late_flow_converges_and_a_leaving_one_frees_its_share() {
        // Two flows; a third joins at 10 s and leaves at 25 s (the fairness scenario's 15 s
        // apart, shortened). Rates settle within a few round trips of each change.
        let flows = [
            FlowSpec::new(&[0], 80),
            FlowSpec::new(&[0], 120),
            FlowSpec::new(&[0], 100)
                .starting(Duration::from_secs(10))
                .stopping(Duration::from_secs(25)),
        ];
        let mut m = Model::new(&[1_000_000], &flows, 9);
        let o = m.run(Duration::from_secs(15), Duration::from_secs(40));
        let c = DEFAULT_TARGET_UTILISATION * 1e6;
        let third = [c / 3.0; 3];
        let joined = settled_at(
            &Outcome {
                rates: o
                    .rates
                    .iter()
                    .map(|r| {
                        r.iter()
                            .copied()
                            .filter(|(t, _)| t.as_secs() < 25)
                            .collect()
                    })
                    .collect(),
                ..clone_outcome(&o)
            },
            &third,
            0.1,
            Duration::from_secs(10),
        );
        let left = settled_at(&o, &[c / 2.0; 2], 0.1, Duration::from_secs(25));
        let (lo, hi) = rate_range(&o, Duration::from_secs(30));
        eprintln!(
            "join: within 10 % of C/3 {joined:?} after the join, of C/2 {left:?} after the leave; rates {lo:.0}..{hi:.0} from 30 s; util {:.3} wait {:.2} ms max {:.1} ms",
            o.utilisation[0],
            o.mean_wait[0] * 1e3,
            o.max_wait[0] * 1e3
        );
        assert!(joined < Duration::from_secs(2), "{joined:?}");
        assert!(left < Duration::from_secs(3), "{left:?}");
        // No oscillation left: within ±5 % of C/2 from 30 s on.
        assert!(lo > 0.95 * c / 2.0 && hi < 1.05 * c / 2.0, "{lo}..{hi}");
        assert!(o.utilisation[0] >= 0.95);
        // The third flow timed out of the table (2 s after its last packet).
        assert_eq!(o.tracked_flows_at_end[0], 2);
    }

    fn clone_outcome(o: &Outcome) -> Outcome {
        Outcome {
            throughput: o.throughput.clone(),
            utilisation: o.utilisation.clone(),
            mean_wait: o.mean_wait.clone(),
            max_wait: o.max_wait.clone(),
            rates: o.rates.clone(),
            routers: o.routers.clone(),
            tracked_flows_at_end: o.tracked_flows_at_end.clone(),
        }
    }

    #[test]
    fn parking_lot_gives_the_tight_share_and_the_rest_to_the_local_flow() {
        // Link 0: 1 Mbit/s, link 1: 600 kbit/s (tighter). A crosses both, B only link 0,
        // C only link 1. Max–min: A = C = α·600k/2 = 294k; B = α·1M − 294k = 686k.
        let flows = [
            FlowSpec::new(&[0, 1], 140),
            FlowSpec::new(&[0], 100),
            FlowSpec::new(&[1], 80),
        ];
        let mut m = Model::new(&[1_000_000, 600_000], &flows, 10);
        let o = m.run(Duration::from_secs(20), Duration::from_secs(40));
        let a = DEFAULT_TARGET_UTILISATION * 600e3 / 2.0;
        let b = DEFAULT_TARGET_UTILISATION * 1e6 - a;
        eprintln!(
            "parking lot: A {:.0} B {:.0} C {:.0} (want {a:.0}, {b:.0}, {a:.0}); util {:?} wait {:?}; {} | {}",
            o.throughput[0],
            o.throughput[1],
            o.throughput[2],
            o.utilisation,
            o.mean_wait,
            o.routers[0],
            o.routers[1]
        );
        assert!((o.throughput[0] / a - 1.0).abs() < 0.05);
        assert!((o.throughput[2] / a - 1.0).abs() < 0.05);
        assert!((o.throughput[1] / b - 1.0).abs() < 0.05);
        assert!(
            o.utilisation.iter().all(|&u| u >= 0.95),
            "{:?}",
            o.utilisation
        );
        // At link 0, A counts as a fraction of a flow: N̂ between 1 and 2.
        let n = o.routers[0].effective_flows;
        assert!((1.2..1.6).contains(&n), "{n}");
    }

    #[test]
    fn a_datagram_that_waits_is_stamped_a_little_less() {
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(1_000_000), t0);
        let stamp = |r: &mut Router, wait: Option<Duration>| {
            if let Some(w) = wait {
                r.set_wait(w);
            }
            let mut p = packet(&[1; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 100);
            r.on_datagram(t0, &mut p);
            read_feedback_rate(&p, 8).expect("stamped")
        };
        // α·C = 980 kbit/s with no wait, told or not.
        assert_eq!(stamp(&mut r, None), 980);
        assert_eq!(stamp(&mut r, Some(Duration::ZERO)), 980);
        // 10 ms behind the packet on the wire: 1 − 0.25 · 10 / 100 = 97.5 %.
        assert_eq!(stamp(&mut r, Some(Duration::from_millis(10))), 955);
        // The wait is the next datagram's only.
        assert_eq!(stamp(&mut r, None), 980);
        // At most 10 % off, whatever the wait.
        assert_eq!(stamp(&mut r, Some(Duration::from_secs(5))), 882);
        // Gain 0: every flow of a weight gets the same stamp.
        let mut r = Router::new(RouterConfig::new(1_000_000).with_phase_gain(0.0), t0);
        assert_eq!(stamp(&mut r, Some(Duration::from_millis(10))), 980);
    }

    #[test]
    fn one_packet_declaring_a_huge_weight_cuts_as_one_flow() {
        // Found by an outside read: the first packet of a new flow key cut R by W/(W + w) with
        // w its own declared weight (up to 1000), so one 40-byte packet with a fresh CID cut
        // three flows' rates ÷334.
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(1_000_000), t0);
        for cid in 1..=3u8 {
            r.on_datagram(
                t0,
                &mut packet(&[cid; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 100),
            );
        }
        let before = r.rate_per_weight_bps();
        let huge = u32::MAX - 1;
        r.on_datagram(t0, &mut packet(&[9; 8], 0, huge, NO_RATE_LIMIT, 40));
        let after = r.rate_per_weight_bps();
        assert!(
            after >= before * 0.75 - 1.0,
            "as one flow joining: {before} -> {after}"
        );
        // Ten of them weigh as ten flows, not ten thousand.
        for cid in 10..19u8 {
            r.on_datagram(t0, &mut packet(&[cid; 8], 0, huge, NO_RATE_LIMIT, 40));
        }
        let ten = r.rate_per_weight_bps();
        assert!(ten >= before * 3.0 / 13.0 - 1.0, "{before} -> {ten}");
    }

    #[test]
    fn flows_gone_put_the_rate_back_and_their_weight_out_of_w_min() {
        // Found by an outside read: once every flow had left, R stayed where they had left it
        // (the loop runs only on arriving packets); and w_min came from the last interval, so
        // a light flow sending less than once per interval was clamped to w·C.
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(1_000_000), t0);
        // A lone flow of weight 0.5 on a 1 Mbit/s link, 1 500 bytes every 20 ms (600 kbit/s):
        // R may rise above C for it (up to 2 Mbit/s per unit weight: the whole link), and is
        // not clamped at C in every interval without one of its packets.
        let mut t = t0;
        for _ in 0..200 {
            r.on_datagram(t, &mut packet(&[1; 8], 0, 500, NO_RATE_LIMIT, 1500));
            t += Duration::from_millis(20);
        }
        assert!(
            r.rate_per_weight_bps() > 1_100_000.0,
            "{}",
            r.rate_per_weight_bps()
        );
        // Three flows, then silence: the table empties and R is α·C again.
        for cid in 2..=4u8 {
            r.on_datagram(
                t,
                &mut packet(&[cid; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 100),
            );
        }
        assert!(r.rate_per_weight_bps() < 980_000.0);
        t += Duration::from_secs(4);
        r.on_other(t, 40);
        assert_eq!(r.stats().flows, 0);
        assert_eq!(r.rate_per_weight_bps(), 980_000.0);
    }

    #[test]
    fn stamps_lower_never_raise_and_leave_other_traffic_alone() {
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(1_000_000), t0);
        // Unset expected rate: stamped with α·C.
        let mut p = packet(&[1; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 100);
        let orig = p.clone();
        let s = r.on_datagram(t0, &mut p);
        assert!(
            matches!(
                s,
                Stamp::Lowered {
                    from_kbps: NO_RATE_LIMIT,
                    to_kbps: 980,
                    ..
                }
            ),
            "{s:?}"
        );
        assert_eq!(p.len(), orig.len());
        assert_eq!(read_feedback_rate(&p, 8), Some(980));
        // A tighter router upstream already wrote 500: kept.
        let mut p = packet(&[1; 8], 0, NO_RATE_LIMIT, 500, 100);
        let before = p.clone();
        assert!(matches!(
            r.on_datagram(t0, &mut p),
            Stamp::Kept {
                feedback_kbps: 500,
                ..
            }
        ));
        assert_eq!(p, before);
        // A new flow expecting 300 kbit/s (weight 0.3) joins: R becomes α·C/1.3 at once and
        // the newcomer gets 0.3 of it.
        let mut p = packet(&[2; 8], 0, 300, NO_RATE_LIMIT, 100);
        r.on_datagram(t0, &mut p);
        assert_eq!(read_feedback_rate(&p, 8), Some(226));
        // No rate area, garbage, long headers: untouched, counted as load.
        let mut plain = {
            let h = ShortHeader::new(ConnectionId::new(&[3; 8]).unwrap(), 0, false, 1, None, None);
            let mut b = Vec::new();
            h.encode(&mut b);
            b.resize(60, 0);
            b
        };
        let copy = plain.clone();
        assert_eq!(r.on_datagram(t0, &mut plain), Stamp::Unrated);
        assert_eq!(plain, copy);
        let mut junk = vec![0xff; 40];
        assert_eq!(r.on_datagram(t0, &mut junk), Stamp::Unrated);
        assert_eq!(junk, vec![0xff; 40]);
        r.on_other(t0, 1500);
        let s = r.stats();
        assert_eq!((s.datagrams, s.rated, s.stamped, s.flows), (5, 3, 2, 2));
        assert_eq!(s.bytes, 5 * 100 - 200 + 60 + 40 + 1500);
        // Two flows of weight 1 and 0.3 joined: R scaled by 1/1.3 at the second.
        assert!((r.rate_per_weight_bps() - 980_000.0 / 1.3).abs() < 1.0);
        let info = r.flow(&[2; 8], 0).expect("tracked");
        assert_eq!(info.expected_kbps, 300);
        assert!((info.weight - 0.3).abs() < 1e-9);
        assert_eq!(r.flows().count(), 2);
    }

    #[test]
    fn non_tern_load_lowers_the_rate_and_idle_flows_time_out() {
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(1_000_000), t0);
        // 500 kbit/s of opaque traffic and one slow rated flow (400 kbit/s) for 5 s.
        let mut p = packet(&[1; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 1200);
        for i in 0..5000u64 {
            let now = t0 + Duration::from_millis(i);
            r.tick(now, 0);
            if i % 12 == 0 {
                r.on_other(now, 750);
            }
            if i % 24 == 0 {
                let mut q = p.clone();
                r.on_datagram(now, &mut q);
                p = q;
            }
        }
        assert_eq!(r.stats().flows, 1);
        r.tick(t0 + Duration::from_secs(10), 0);
        assert_eq!(r.stats().flows, 0, "flow timed out");
    }

    #[test]
    fn capacity_changes_move_the_rate() {
        // One backlogged flow that always sends at its stamped rate (fluid, one RTT late).
        let t0 = origin();
        let mut r = Router::new(RouterConfig::new(2_000_000), t0);
        let mut rate = 100_000.0f64;
        let mut pending: VecDeque<(Duration, f64)> = VecDeque::new();
        let mut credit = 0.0;
        for i in 0..20_000u64 {
            let t = Duration::from_millis(i);
            if i == 10_000 {
                r.set_capacity(500_000, t0 + t);
            }
            while pending.front().is_some_and(|(at, _)| *at <= t) {
                rate = pending.pop_front().map_or(rate, |(_, r)| r);
            }
            credit += rate / 1000.0 / 8.0;
            while credit >= 1200.0 {
                credit -= 1200.0;
                let mut p = packet(&[1; 8], 0, NO_RATE_LIMIT, NO_RATE_LIMIT, 1200);
                r.tick(t0 + t, 0);
                r.on_datagram(t0 + t, &mut p);
                let k = read_feedback_rate(&p, 8).expect("rated");
                pending.push_back((t + ms(100), f64::from(k) * 1000.0));
            }
            if i == 9_999 {
                assert!((rate / 1.96e6 - 1.0).abs() < 0.05, "{rate}");
            }
        }
        assert!((rate / 0.49e6 - 1.0).abs() < 0.05, "{rate}");
        assert_eq!(r.stats().capacity_bps, 500_000);
    }

    proptest! {
        #[test]
        fn arbitrary_datagrams_never_panic_nor_raise(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            fuzz(&data, origin());
        }

        #[test]
        fn rated_packets_are_stamped_at_the_wire_offset(
            cid in proptest::collection::vec(any::<u8>(), 8),
            path_id in any::<u8>(),
            expected in any::<u32>(),
            feedback in any::<u32>(),
            size in 0usize..64,
        ) {
            let mut p = packet(&cid, path_id, expected, feedback, size);
            fuzz(&p, origin());
            let t0 = origin();
            let mut r = Router::new(RouterConfig::default(), t0);
            let s = r.on_datagram(t0, &mut p);
            prop_assert!(!matches!(s, Stamp::Unrated));
            let now = read_feedback_rate(&p, 8).expect("rated");
            prop_assert!(now <= feedback);
            prop_assert!(r.flow(&cid, path_id).is_some());
        }
    }
}
