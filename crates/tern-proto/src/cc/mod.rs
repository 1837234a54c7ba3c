//! Pluggable congestion control (DESIGN.md F10) and pacing (F11: "All sending is paced").
//!
//! # Contract
//!
//! A connection owns one [`Controller`] per path (F15: per-channel congestion control), built by
//! the connection's [`ControllerFactory`] from that path's [`PathInfo`]. Controllers are pure
//! state machines: they never read a clock, never touch I/O and never draw random numbers on
//! their own; every callback receives the current time as `now`, and loss recovery's
//! [`RttEstimator`] where it matters.
//!
//! The connection drives a controller like this (all callbacks have empty default bodies, so a
//! custom controller implements only what it uses):
//!
//! 1. Before sending, it checks `bytes_in_flight + size <= window()` and asks the [`Pacer`]
//!    when the packet may leave, passing [`Controller::pacing_rate`].
//! 2. [`Controller::on_sent`] for every congestion-controlled packet sent.
//! 3. For each ACK frame: the RTT sample goes into the path's [`RttEstimator`] first, then
//!    [`Controller::on_ack`] once per newly acknowledged packet, then
//!    [`Controller::on_end_acks`] once.
//! 4. [`Controller::on_congestion_event`] once per batch of packets declared lost, with the send
//!    time of the newest one; the controller decides whether this is a congestion signal.
//! 5. [`Controller::on_spurious_congestion_event`] when the packets whose loss caused the most
//!    recent reduction turn out to have been delivered.
//! 6. [`Controller::on_ecn_ce`] when the peer reports CE marks on a path whose ECN works.
//! 7. [`Controller::on_mtu_update`] when the path's maximum datagram size changes.
//! 8. [`Controller::on_feedback_rate`] for each RateEcho the peer sends about the path (only
//!    when [`Controller::wants_rate_area`] made the connection send the explicit-rate area,
//!    F12), and [`Controller::on_expected_rate`] when the application sets its expected rate.
//!
//! # What is here
//!
//! - [`Controller`], [`ControllerFactory`], [`PathInfo`], [`Metrics`]: the interface. It is
//!   shaped for rate-based and model-based controllers too (BBR, UDT DAIMD, explicit-rate,
//!   F12): they report [`Controller::pacing_rate`] and return a window that only caps the data
//!   in flight.
//! - [`Classic`]: the shared loss-based shell (slow start, recovery period, persistent
//!   congestion, app-limited handling, random-loss tolerance), written once and parameterised
//!   by a [`WindowAdjustment`] (the shape of neqo's `ClassicCongestionControl`).
//! - [`NewReno`] (RFC 9002 §7.3) and [`Cubic`] (RFC 9438) window adjustments, with their
//!   factories [`NewRenoConfig`] and [`CubicConfig`], and [`Algorithm`] to pick one by name.
//! - [`Bbr`] (BBR with v3 semantics, [`BbrConfig`]), [`Udt`] (UDT's DAIMD rate control,
//!   [`UdtConfig`]) and [`Copa`] (delay-based, for cellular links, [`CopaConfig`]).
//! - [`Explicit`] ([`ExplicitConfig`]): the explicit-rate controller (F12, PROTOCOL.md §13):
//!   paces at the rate a tern router stamps, within a bound of its own, and falls back to an
//!   end-to-end controller (CUBIC by default) where no router stamps.
//! - [`Algorithm`]: every built-in controller by name (`tern --cc NAME`, tern-bench
//!   `--tern-cc`), for sweeps ([`Algorithm::ALL`]).
//! - [`Pacer`]: a token bucket that spreads a window's worth of packets over a round trip.
//! - `testing` (with `cfg(test)` or the `testing` feature): `Unlimited` and `Mock` controllers.
//!
//! Packet-pair fast start (F11) measures a path's bottleneck rate outside the controller
//! (`path/probe.rs`) and hands it over through [`Controller::on_rate_estimate`]; [`Classic`]
//! opens its window to the bandwidth-delay product and ends slow start there, [`Bbr`] seeds
//! its bandwidth filter with it, [`Udt`] takes it as the link capacity, [`Copa`] as its window.
//!
//! Not here yet: HyStart++.
//!
//! [`RttEstimator`]: crate::recovery::rtt::RttEstimator

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod bbr;
pub mod classic;
pub mod copa;
pub mod cubic;
pub mod explicit;
pub mod new_reno;
pub mod pacer;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod udt;
mod windowed;

/// The RTT estimate a controller is handed on every ACK (re-exported so that a controller can
/// be written against this module alone).
pub use crate::recovery::rtt::RttEstimator;
pub use bbr::{Bbr, BbrConfig};
pub use classic::{Classic, ClassicConfig, WindowAdjustment};
pub use copa::{Copa, CopaConfig};
pub use cubic::{Cubic, CubicConfig};
pub use explicit::{Explicit, ExplicitConfig};
pub use new_reno::{NewReno, NewRenoConfig};
pub use pacer::Pacer;
pub use udt::{Udt, UdtConfig};

/// The initial window, in datagrams, of tern's own NewReno and CUBIC (what
/// [`Algorithm::factory`] and the connection default build; [`ClassicConfig::default`] keeps
/// RFC 9002's 10). tern-bench's `initwin` (PaUDT's experiment, with tern's fast start on)
/// found 16 to 64 faster than 8 on every profile and lost no packet (LTE, 100 kB flows: 8
/// packets 158 ms, 16 135 ms, 32 132 ms, 64 127 ms; docs/BENCHMARKS.md); 32 was within 1–4 %
/// of 64 at half the first flight. Every packet is paced, so the window leaves spread over
/// the first round trip, not as a line-rate burst.
pub const DEFAULT_INITIAL_WINDOW_PACKETS: u32 = 32;

/// Datagram size assumed when nothing better is known: the smallest maximum datagram size every
/// QUIC-style path must support (RFC 9000 §14: 1200 bytes).
pub const DEFAULT_MAX_DATAGRAM_SIZE: u16 = 1200;

/// RTT assumed before the first sample (RFC 9002 §6.2.2 `kInitialRtt`, 333 ms).
pub const DEFAULT_INITIAL_RTT: Duration = Duration::from_millis(333);

/// What a [`ControllerFactory`] knows about the path it builds a controller for.
///
/// `#[non_exhaustive]` so that fields can be added (local/remote interface type, an
/// explicit-rate router's presence, a packet-pair estimate) without breaking custom factories;
/// build it with [`PathInfo::new`] or [`Default`] and then set fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathInfo {
    /// Largest UDP payload the path currently carries, in bytes.
    pub max_datagram_size: u16,
    /// RTT to assume before the first sample (configured, cached from an earlier connection,
    /// or measured by the path's validation exchange).
    pub initial_rtt: Duration,
    /// Identifies the path within its connection, for logs and multipath-aware controllers.
    pub path_id: u32,
}

impl PathInfo {
    /// Describes a path.
    pub fn new(max_datagram_size: u16, initial_rtt: Duration, path_id: u32) -> Self {
        Self {
            max_datagram_size,
            initial_rtt,
            path_id,
        }
    }
}

impl Default for PathInfo {
    /// Path 0 with the protocol minimum datagram size and the RFC 9002 initial RTT.
    fn default() -> Self {
        Self::new(DEFAULT_MAX_DATAGRAM_SIZE, DEFAULT_INITIAL_RTT, 0)
    }
}

/// A congestion controller for one path.
///
/// Implementations must never panic on any sequence of calls or argument values (times may
/// repeat or even go backwards relative to earlier callbacks if the caller's packets were sent
/// out of order, sizes may be zero). Window and rates are in bytes and bytes per second.
pub trait Controller: Send + fmt::Debug {
    /// A congestion-controlled packet of `bytes` bytes was sent; `bytes_in_flight` includes it.
    fn on_sent(&mut self, now: Instant, bytes: u64, bytes_in_flight: u64) {
        let _ = (now, bytes, bytes_in_flight);
    }

    /// One acknowledged packet, sent at `sent`, of `bytes` bytes. `app_limited` = the sender had
    /// nothing to send when it was sent (so this ACK says nothing about a larger window).
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        let _ = (now, sent, bytes, app_limited, rtt);
    }

    /// Called once after a batch of acks from one ACK frame was processed.
    ///
    /// `app_limited` = the sender is application-limited right now (it has no data waiting and
    /// the window is not full); `largest_acked_sent` is the send time of the newest packet the
    /// frame newly acknowledged, if any.
    fn on_end_acks(
        &mut self,
        now: Instant,
        bytes_in_flight: u64,
        app_limited: bool,
        largest_acked_sent: Option<Instant>,
    ) {
        let _ = (now, bytes_in_flight, app_limited, largest_acked_sent);
    }

    /// Packets declared lost. `largest_lost_sent` is the send time of the newest lost packet (to
    /// tell one loss event per round trip). `persistent_congestion` per RFC 9002 §7.6.
    fn on_congestion_event(
        &mut self,
        now: Instant,
        largest_lost_sent: Instant,
        lost_bytes: u64,
        persistent_congestion: bool,
        rtt: &RttEstimator,
    ) {
        let _ = (
            now,
            largest_lost_sent,
            lost_bytes,
            persistent_congestion,
            rtt,
        );
    }

    /// A packet counted lost earlier was later acknowledged (spurious loss): controllers may undo
    /// the reduction it caused.
    fn on_spurious_congestion_event(&mut self) {}

    /// The peer reported `newly_ce` more of our packets CE-marked (ECN, on a path whose marks
    /// were validated): explicit congestion, never random loss and never spurious.
    /// `largest_acked_sent` is the send time of the newest packet the reporting ACK
    /// acknowledged (one response per round trip, as for loss). By default it is treated as
    /// a loss of nothing.
    fn on_ecn_ce(
        &mut self,
        now: Instant,
        largest_acked_sent: Instant,
        newly_ce: u64,
        rtt: &RttEstimator,
    ) {
        let _ = newly_ce;
        self.on_congestion_event(now, largest_acked_sent, 0, false, rtt);
    }

    /// The path's maximum datagram size changed.
    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        let _ = max_datagram_size;
    }

    /// A measurement of the path's bottleneck rate, in bytes per second, taken outside the
    /// controller: packet-pair fast start (F11) from the dispersion of a probe train, or the
    /// rate a controller hands over when it changes hands ([`Explicit`] seeds its fallback
    /// with the rate it was sending at). A controller may start from it (seed its bandwidth
    /// model, open its window to rate × RTT) instead of probing from scratch; by default it is
    /// ignored.
    fn on_rate_estimate(&mut self, now: Instant, bytes_per_second: u64, rtt: &RttEstimator) {
        let _ = (now, bytes_per_second, rtt);
    }

    /// Whether the connection should put the explicit-rate area (PROTOCOL.md §4.8: expected
    /// rate, feedback rate) on every short-header packet of this path, so that tern routers
    /// can stamp their rate into it (F12). Costs 8 bytes per packet; `false` by default.
    fn wants_rate_area(&self) -> bool {
        false
    }

    /// The peer echoed (RateEcho, PROTOCOL.md §9.27) the lowest feedback rate routers left in
    /// this path's packets since its previous echo: `Some(bytes per second)`, or `None` when
    /// no router lowered it (`0xFFFFFFFF` on the wire: no router on the path). The value is
    /// unauthenticated on the path (§13.2): a controller must bound what it does with it by
    /// its own loss and delay signals. Called only on paths whose controller
    /// [`wants_rate_area`](Self::wants_rate_area); ignored by default.
    fn on_feedback_rate(
        &mut self,
        now: Instant,
        bytes_per_second: Option<u64>,
        rtt: &RttEstimator,
    ) {
        let _ = (now, bytes_per_second, rtt);
    }

    /// The application's expected rate for the connection, in bytes per second (`None`:
    /// unset), as declared in the rate area. A controller that honours it never paces above
    /// it; ignored by default.
    fn on_expected_rate(&mut self, bytes_per_second: Option<u64>) {
        let _ = bytes_per_second;
    }

    /// Congestion window in bytes (rate-based controllers return a cap, e.g. 2×rate×rtt).
    fn window(&self) -> u64;

    /// Pacing rate in bytes/s; `None` = the pacer derives it from window / smoothed RTT.
    fn pacing_rate(&self, rtt: &RttEstimator) -> Option<u64> {
        let _ = rtt;
        None
    }

    /// The window the controller started with, in bytes.
    fn initial_window(&self) -> u64;

    /// A snapshot of the controller's state for stats, qlog and tests.
    fn metrics(&self) -> Metrics;

    /// Short lowercase name, e.g. `"cubic"`, for logs and benchmark reports.
    fn name(&self) -> &'static str;
}

/// Builds one [`Controller`] per path.
///
/// A connection configuration holds an `Arc<dyn ControllerFactory>`, so applications can plug in
/// their own controllers (UDT's CCC idea, F10) as easily as the built-in ones.
pub trait ControllerFactory: Send + Sync + fmt::Debug {
    /// A fresh controller for the path described by `info`, created at `now`.
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller>;
}

/// State of a controller, as reported by [`Controller::metrics`].
///
/// `#[non_exhaustive]`: custom controllers build it with [`Metrics::new`] and assign the fields
/// they know.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// Congestion window in bytes.
    pub window: u64,
    /// Slow-start threshold in bytes, `None` while unset (infinite) or meaningless.
    pub ssthresh: Option<u64>,
    /// Pacing rate in bytes/s, if the controller sets one.
    pub pacing_rate: Option<u64>,
    /// Whether the controller is in slow start (or another start-up phase).
    pub in_slow_start: bool,
    /// Losses that were treated as congestion and reduced the window (at most one per round
    /// trip), including persistent congestion.
    pub congestion_events: u64,
    /// Loss events judged not to be congestion (random-loss tolerance) and so ignored.
    pub non_congestive_losses: u64,
    /// Persistent-congestion collapses to the minimum window.
    pub persistent_congestion_events: u64,
    /// Reductions undone because their loss turned out to be spurious.
    pub undone_congestion_events: u64,
}

impl Metrics {
    /// Metrics with the given window and everything else zero or unset.
    pub fn new(window: u64) -> Self {
        Self {
            window,
            ssthresh: None,
            pacing_rate: None,
            in_slow_start: false,
            congestion_events: 0,
            non_congestive_losses: 0,
            persistent_congestion_events: 0,
            undone_congestion_events: 0,
        }
    }
}

/// The built-in controllers, by name, with their default configuration.
///
/// Convenient for CLIs and benchmark matrices; for tuned settings use [`NewRenoConfig`] or
/// [`CubicConfig`] directly as the factory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// NewReno, RFC 9002 §7.3.
    NewReno,
    /// CUBIC, RFC 9438 (the default, as in Linux).
    #[default]
    Cubic,
    /// UDT's native rate-based DAIMD control (udt4's CUDTCC), initial window 16 (PaUDT).
    Udt,
    /// Copa (NSDI 2018), delay-based, for cellular links, as [`CopaConfig::tern`] tunes it:
    /// δ = [`copa::TERN_DELTA`] (the paper's 0.5 keeps tern's ACK bursts from filling the
    /// link), and the median RTT with a 2 ms noise floor so that radio jitter is not read as
    /// a queue (see [`copa`]).
    Copa,
    /// BBR with v3 semantics (draft-ietf-ccwg-bbr), model-based.
    Bbr,
    /// Explicit rate (F12): paces at a tern router's stamped rate, CUBIC where no router
    /// stamps. Not in [`Algorithm::ALL`]: without a router it is CUBIC plus 8 bytes of header
    /// per packet, and the sweeps that use `ALL` (tern-sim's controller suite, tern-bench's
    /// `cc` scenario) have no router yet.
    Explicit,
}

impl Algorithm {
    /// Every built-in algorithm, for benchmark sweeps.
    pub const ALL: &'static [Algorithm] = &[
        Algorithm::NewReno,
        Algorithm::Cubic,
        Algorithm::Udt,
        Algorithm::Copa,
        Algorithm::Bbr,
    ];

    /// The name used by [`FromStr`] and [`Controller::name`].
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::NewReno => "newreno",
            Algorithm::Cubic => "cubic",
            Algorithm::Udt => "udt",
            Algorithm::Copa => "copa",
            Algorithm::Bbr => "bbr",
            Algorithm::Explicit => "explicit",
        }
    }

    /// The same factory with an initial window of `packets` datagrams (PaUDT's experiment:
    /// tern-bench's `initwin` scenario sweeps 8 to 64).
    pub fn factory_with_initial_window(self, packets: u32) -> Arc<dyn ControllerFactory> {
        match self {
            Algorithm::NewReno => {
                Arc::new(NewRenoConfig::default().initial_window_packets(packets))
            }
            Algorithm::Cubic => Arc::new(CubicConfig::default().initial_window_packets(packets)),
            Algorithm::Udt => Arc::new(UdtConfig::default().initial_window_packets(packets)),
            Algorithm::Copa => Arc::new(CopaConfig::tern().initial_window_packets(packets)),
            Algorithm::Bbr => Arc::new(BbrConfig::default().initial_window_packets(packets)),
            Algorithm::Explicit => Arc::new(ExplicitConfig::default().fallback(Arc::new(
                CubicConfig::default().initial_window_packets(packets),
            ))),
        }
    }

    /// The factory with an initial window of `packets` datagrams and the random-loss
    /// tolerance on or off (`tolerance`), for the controllers that have one (CUBIC and
    /// NewReno, [`ClassicConfig::random_loss_tolerance`]); `None` for the others.
    pub fn factory_with_loss_tolerance(
        self,
        packets: u32,
        tolerance: bool,
    ) -> Option<Arc<dyn ControllerFactory>> {
        match self {
            Algorithm::NewReno => Some(Arc::new(
                NewRenoConfig::default()
                    .initial_window_packets(packets)
                    .random_loss_tolerance(tolerance),
            )),
            Algorithm::Cubic => Some(Arc::new(
                CubicConfig::default()
                    .initial_window_packets(packets)
                    .random_loss_tolerance(tolerance),
            )),
            _ => None,
        }
    }

    /// A shareable factory with the algorithm's default configuration.
    pub fn factory(self) -> Arc<dyn ControllerFactory> {
        match self {
            Algorithm::NewReno => Arc::new(
                NewRenoConfig::default().initial_window_packets(DEFAULT_INITIAL_WINDOW_PACKETS),
            ),
            Algorithm::Cubic => Arc::new(
                CubicConfig::default().initial_window_packets(DEFAULT_INITIAL_WINDOW_PACKETS),
            ),
            Algorithm::Udt => Arc::new(UdtConfig::default()),
            Algorithm::Copa => Arc::new(CopaConfig::tern()),
            Algorithm::Bbr => Arc::new(BbrConfig::default()),
            Algorithm::Explicit => Arc::new(ExplicitConfig::default()),
        }
    }
}

impl ControllerFactory for Algorithm {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        self.factory().build(now, info)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// Case-insensitive; accepts `newreno` (or `new_reno`, `new-reno`, `reno`), `cubic`,
    /// `udt` (or `daimd`), `copa`, `bbr` (or `bbr3`, `bbrv3`) and `explicit` (or
    /// `explicit-rate`, `explicit_rate`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "newreno" | "new_reno" | "new-reno" | "reno" => Ok(Algorithm::NewReno),
            "cubic" => Ok(Algorithm::Cubic),
            "udt" | "daimd" => Ok(Algorithm::Udt),
            "copa" => Ok(Algorithm::Copa),
            "bbr" | "bbr3" | "bbrv3" => Ok(Algorithm::Bbr),
            "explicit" | "explicit-rate" | "explicit_rate" => Ok(Algorithm::Explicit),
            _ => Err(UnknownAlgorithm(s.to_owned())),
        }
    }
}

/// A congestion control algorithm name that [`Algorithm::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown congestion control algorithm {:?} (known: ",
            self.0
        )?;
        for (i, a) in Algorithm::ALL
            .iter()
            .chain([&Algorithm::Explicit])
            .enumerate()
        {
            f.write_str(if i == 0 { "" } else { ", " })?;
            f.write_str(a.name())?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownAlgorithm {}
