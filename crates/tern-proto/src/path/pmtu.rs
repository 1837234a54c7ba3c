//! Datagram packetization-layer path MTU discovery (DPLPMTUD, RFC 8899; DESIGN.md F14;
//! PROTOCOL.md §5.5) for one path: the state machine only. The connection sends the probes
//! (`connection/pmtu.rs`) and tells this module what became of them and of the path's other
//! packets.
//!
//! The search starts from the size the handshake negotiated (it only grows from there),
//! probes the ceiling first (`max`: the configured `max_pmtu`, capped by the peer's
//! `max_datagram_size`), then halves the interval between the largest size confirmed and the
//! smallest size that failed [`MAX_PROBES`] times, until less than [`SEARCH_GRANULARITY`]
//! separates them. A black hole (full-size packets keep getting lost while smaller ones get
//! through) drops the path to [`BASE_PLPMTU`] at once and starts a new search.

use std::time::{Duration, Instant};

//= RFC 8899 §5.1.2: BASE_PLPMTU; tern, like QUIC, never sends less than 1 200 bytes.
/// The size every path carries (the handshake's datagram size): the fallback after a black
/// hole.
pub(crate) const BASE_PLPMTU: u16 = 1200;

//= RFC 8899 §5.1.2: "MAX_PROBES: The MAX_PROBES is the maximum value of the PROBE_COUNT
//# counter ... The default value of MAX_PROBES is 3."
/// Probes of one size lost before the search gives that size up.
pub(crate) const MAX_PROBES: u32 = 3;

/// The search ends when the largest confirmed size is within this of the smallest failed one.
pub(crate) const SEARCH_GRANULARITY: u16 = 16;

/// Full-size packets lost in a row (no packet as large acknowledged in between), with one of
/// at most the base size sent after the first of them and acknowledged, that make a black
/// hole.
pub(crate) const BLACK_HOLE_LOSSES: u32 = 3;

/// Where the search of a path stands (RFC 8899 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PmtuState {
    /// Discovery is off for this path (configuration).
    Disabled,
    /// The path uses its start size and waits to be validated (and the handshake confirmed).
    Base,
    /// Probing for a larger size.
    Searching,
    /// Done until the re-search timer fires.
    SearchComplete,
}

/// The PMTU state of one path.
#[derive(Debug, Clone)]
pub(crate) struct Pmtud {
    pub(crate) state: PmtuState,
    /// The size the path started with (the negotiated one): restarts come back to at most it.
    pub(crate) initial: u16,
    /// The largest size searched for.
    pub(crate) max: u16,
    /// Delay before a completed search starts again.
    research: Duration,
    /// The largest size confirmed: the path's datagram size.
    pub(crate) current: u16,
    /// The smallest size that failed `MAX_PROBES` times, or `max + 1`.
    ceiling: u32,
    /// The probe in flight: its packet number and size.
    pub(crate) in_flight: Option<(u64, u16)>,
    /// Probes lost at the size being probed.
    failures: u32,
    /// Size of the last probe (its losses count against it).
    probing: u16,
    /// When a completed search starts again.
    research_at: Option<Instant>,
    /// Full-size packets lost that were sent after the last one acknowledged.
    large_losses: u32,
    /// When the last full-size packet acknowledged was sent.
    large_acked: Option<Instant>,
    /// When the earliest of those losses was sent.
    streak_start: Option<Instant>,
    /// When the latest packet acknowledged that was smaller than those (or than the base
    /// size) was sent: a black hole needs one sent after the streak began.
    small_acked: Option<Instant>,
    /// The size a black hole was found at, probed first (up to `MAX_PROBES` times) by the
    /// search that follows, and the search's ceiling before it (restored if a probe gets
    /// through).
    recheck: Option<(u16, u32)>,
}

impl Pmtud {
    /// Discovery off: the path keeps `mtu`.
    pub(crate) fn disabled(mtu: u16) -> Self {
        Self::new(false, mtu, mtu, Duration::from_secs(600))
    }

    /// A search from `initial` up to `max`, starting once the path is validated. With `max`
    /// at or below `initial` nothing is probed, but black holes are still detected (and the
    /// search after one climbs back to at most `max.max(initial)`).
    pub(crate) fn new(enabled: bool, initial: u16, max: u16, research: Duration) -> Self {
        let max = max.max(initial);
        Self {
            state: if enabled {
                PmtuState::Base
            } else {
                PmtuState::Disabled
            },
            initial,
            max,
            research,
            current: initial,
            ceiling: u32::from(max) + 1,
            recheck: None,
            in_flight: None,
            failures: 0,
            probing: 0,
            research_at: None,
            large_losses: 0,
            large_acked: None,
            streak_start: None,
            small_acked: None,
        }
    }

    /// The size of the next probe, if one is due now (the caller checks that the path may be
    /// probed at all: validated, in use, handshake confirmed).
    pub(crate) fn poll_probe(&mut self, now: Instant) -> Option<u16> {
        match self.state {
            PmtuState::Disabled => return None,
            PmtuState::Base => self.start_search(),
            PmtuState::SearchComplete => {
                if self.research_at.is_none_or(|t| now < t) {
                    return None;
                }
                self.start_search();
            }
            PmtuState::Searching => {}
        }
        if self.in_flight.is_some() {
            return None;
        }
        match self.candidate() {
            Some(size) => {
                self.probing = size;
                Some(size)
            }
            None => {
                self.state = PmtuState::SearchComplete;
                self.research_at = Some(now + self.research);
                None
            }
        }
    }

    fn start_search(&mut self) {
        self.state = PmtuState::Searching;
        self.ceiling = u32::from(self.max) + 1;
        self.failures = 0;
        self.recheck = None;
    }

    /// The next size to try: the ceiling first, then halfway between what works and what
    /// failed. `None`: the search is over.
    fn candidate(&self) -> Option<u16> {
        let current = u32::from(self.current);
        if current >= u32::from(self.max) || self.ceiling <= current + u32::from(SEARCH_GRANULARITY)
        {
            return None;
        }
        if let Some((size, _)) = self.recheck {
            return Some(size);
        }
        if self.ceiling > u32::from(self.max) {
            return Some(self.max);
        }
        Some((current + (self.ceiling - current) / 2) as u16)
    }

    /// A probe of `size` left as packet `pn`.
    pub(crate) fn on_probe_sent(&mut self, pn: u64, size: u16) {
        self.in_flight = Some((pn, size));
    }

    /// Whether packet `pn` is the probe in flight.
    pub(crate) fn is_probe(&self, pn: u64) -> bool {
        self.in_flight.is_some_and(|(p, _)| p == pn)
    }

    /// The probe `pn` of `size` was acknowledged: the new datagram size if it grows.
    pub(crate) fn on_probe_acked(&mut self, pn: u64, size: u16) -> Option<u16> {
        if self.is_probe(pn) {
            self.in_flight = None;
        }
        self.reset_streak();
        if self.state != PmtuState::Searching || size <= self.current {
            return None;
        }
        // The size that failed, or more (a probe sent before the fall-back), got through:
        // no black hole after all, and the search goes on where it was.
        if let Some((_, ceiling)) = self.recheck.filter(|r| size >= r.0) {
            self.recheck = None;
            self.ceiling = ceiling;
        }
        self.failures = 0;
        self.current = size;
        Some(size)
    }

    /// The probe `pn` of `size` was lost (never congestion: it is a question, not data).
    pub(crate) fn on_probe_lost(&mut self, pn: u64, size: u16) {
        if self.is_probe(pn) {
            self.in_flight = None;
        }
        if self.state != PmtuState::Searching || size <= self.current {
            return;
        }
        if self.recheck.is_some_and(|r| r.0 == size) {
            // Lost like any probe (the congestion that looked like a black hole may still
            // be there): asked again, up to `MAX_PROBES` times in all. Then the black hole
            // is confirmed: search below it.
            self.failures += 1;
            if self.failures >= MAX_PROBES {
                self.recheck = None;
                self.ceiling = self.ceiling.min(u32::from(size));
                self.failures = 0;
            }
            return;
        }
        if size == self.probing {
            self.failures += 1;
        }
        if self.failures >= MAX_PROBES {
            self.ceiling = self.ceiling.min(u32::from(size));
            self.failures = 0;
        }
    }

    /// Whether a packet of `size` bytes is full-sized: within a sixteenth of the datagram
    /// size (a packet is not always filled to the brim) and above the base size.
    fn full(&self, size: u16) -> bool {
        size > BASE_PLPMTU && size >= self.current - self.current / 16
    }

    /// Any other ack-eliciting packet of `size` bytes, sent at `sent`, was acknowledged. A
    /// packet of at most the base size is the small one that gets through (after the second
    /// probe timeout in a row the connection sends its probes at that size); a full-size one
    /// ends the streak of losses sent before it. Sizes in between prove nothing either way.
    pub(crate) fn on_packet_acked(&mut self, size: u16, sent: Instant) {
        if size <= BASE_PLPMTU {
            self.small_acked = self.small_acked.max(Some(sent));
        } else if self.full(size) {
            self.large_acked = self.large_acked.max(Some(sent));
            if self.streak_start.is_some_and(|t| t <= sent) {
                self.reset_streak();
            }
        }
    }

    /// Any other in-flight packet of `size` bytes, sent at `sent`, was lost. Only full-size
    /// packets sent after the last one that got through count.
    pub(crate) fn on_packet_lost(&mut self, size: u16, sent: Instant) {
        if self.full(size) && self.large_acked.is_none_or(|t| sent > t) {
            self.large_losses += 1;
            self.streak_start = Some(self.streak_start.map_or(sent, |t| t.min(sent)));
        }
    }

    fn reset_streak(&mut self) {
        self.large_losses = 0;
        self.streak_start = None;
        self.small_acked = None;
    }

    /// Whether this path watches for black holes (discovery is on and the size is above the
    /// base).
    pub(crate) fn detects_black_holes(&self) -> bool {
        self.state != PmtuState::Disabled && self.current > BASE_PLPMTU
    }

    /// Whether full-size packets keep getting lost while smaller ones get through (RFC 8899
    /// §4.3): the path no longer carries its datagram size.
    pub(crate) fn black_hole(&self) -> bool {
        self.detects_black_holes()
            && self.large_losses >= BLACK_HOLE_LOSSES
            && self
                .small_acked
                .zip(self.streak_start)
                .is_some_and(|(small, lost)| small > lost)
    }

    /// Falls back to the base size after a black hole and searches again from there: first
    /// probes at the size that failed (up to `MAX_PROBES`, as for any size); if all are
    /// lost too, below it (only the re-search timer tries larger sizes again); if one gets
    /// through, the search goes on as before the fall-back. Returns the new datagram size.
    ///
    /// Losses are indirect evidence: a failover or a burst of drop-tail overflow can lose
    /// several full-size packets in a row while a small PTO probe gets through. Probes at
    /// the old size tell the two apart: a path that still carries it is back at its size
    /// after a round trip or three, not searching below it until the re-search timer. (One
    /// probe was not enough: the overflow that looked like a black hole often took it too.)
    pub(crate) fn fall_back(&mut self) -> u16 {
        let (failed, ceiling) = (self.current, self.ceiling);
        self.current = BASE_PLPMTU;
        self.in_flight = None;
        self.reset_streak();
        self.large_acked = None;
        self.start_search();
        self.ceiling = u32::from(failed) + 1;
        self.recheck = Some((failed, ceiling));
        BASE_PLPMTU
    }

    /// The path now runs over another network path: back to at most the start size, and a
    /// new search. Returns the size to use.
    pub(crate) fn restart(&mut self) -> u16 {
        self.current = self.current.min(self.initial);
        self.in_flight = None;
        self.recheck = None;
        self.reset_streak();
        self.large_acked = None;
        if self.state != PmtuState::Disabled {
            self.state = PmtuState::Base;
        }
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(link: u16, max: u16) -> (u16, u32) {
        let now = crate::cc::testing::epoch();
        let mut p = Pmtud::new(true, 1452, max, Duration::from_secs(600));
        let mut pn = 0;
        let mut probes = 0;
        while let Some(size) = p.poll_probe(now) {
            probes += 1;
            p.on_probe_sent(pn, size);
            if size <= link {
                p.on_probe_acked(pn, size);
            } else {
                p.on_probe_lost(pn, size);
            }
            pn += 1;
            assert!(probes < 100);
        }
        assert_eq!(p.state, PmtuState::SearchComplete);
        (p.current, probes)
    }

    #[test]
    fn finds_the_ceiling_at_once() {
        assert_eq!(search(9000, 9000), (9000, 1));
    }

    #[test]
    fn binary_search_below_a_failing_ceiling() {
        let (size, probes) = search(1472, 1500);
        assert!((1472 - SEARCH_GRANULARITY..=1472).contains(&size), "{size}");
        assert!(probes <= 12, "{probes}");
        let (size, _) = search(8000, 9000);
        assert!((8000 - SEARCH_GRANULARITY..=8000).contains(&size), "{size}");
        // Nothing above the start: the start stays.
        assert_eq!(search(1300, 1500).0, 1452);
        // A ceiling at the start: no probe at all.
        assert_eq!(search(9000, 1452), (1452, 0));
    }

    #[test]
    fn research_after_the_interval() {
        let now = crate::cc::testing::epoch();
        let mut p = Pmtud::new(true, 1452, 1500, Duration::from_secs(600));
        for pn in 0..3 {
            let size = p.poll_probe(now).expect("probe");
            p.on_probe_sent(pn, size);
            p.on_probe_lost(pn, size);
        }
        while let Some(size) = p.poll_probe(now) {
            p.on_probe_sent(9, size);
            p.on_probe_lost(9, size);
        }
        assert_eq!(p.state, PmtuState::SearchComplete);
        assert_eq!(p.poll_probe(now + Duration::from_secs(599)), None);
        assert_eq!(p.poll_probe(now + Duration::from_secs(600)), Some(1500));
    }

    #[test]
    fn black_hole_needs_large_losses_and_a_small_packet_through() {
        let t0 = crate::cc::testing::epoch();
        let t = |ms| t0 + Duration::from_millis(ms);
        let mut p = Pmtud::new(true, 1452, 9000, Duration::from_secs(600));
        p.current = 9000;
        for i in 0..10 {
            p.on_packet_lost(9000, t(i));
        }
        assert!(
            !p.black_hole(),
            "nothing got through: not a black hole (yet)"
        );
        p.on_packet_acked(9000, t(11));
        p.on_packet_lost(9000, t(12));
        p.on_packet_lost(9000, t(13));
        p.on_packet_acked(1200, t(14));
        assert!(!p.black_hole(), "two losses only");
        p.on_packet_lost(9000, t(15));
        assert!(p.black_hole());
        // A smaller packet sent before the losses began proves nothing.
        let mut q = Pmtud::new(true, 1452, 9000, Duration::from_secs(600));
        q.current = 9000;
        q.on_packet_acked(1200, t(1));
        for i in 2..10 {
            q.on_packet_lost(9000, t(i));
        }
        assert!(!q.black_hole());
        // A full-size packet sent after the first loss got through: congestion, not a hole.
        q.on_packet_acked(8950, t(5));
        q.on_packet_acked(1200, t(21));
        assert!(!q.black_hole());
        for i in 22..25 {
            q.on_packet_lost(9000, t(i));
        }
        assert!(!q.black_hole(), "the small one was sent before these");
        q.on_packet_acked(1200, t(30));
        assert!(q.black_hole());
        assert_eq!(p.fall_back(), BASE_PLPMTU);
        assert!(!p.black_hole());
        // The size that failed is probed again, up to three times; all lost, the search
        // goes below it.
        let now = crate::cc::testing::epoch();
        for pn in 40..43 {
            assert_eq!(p.poll_probe(now), Some(9000));
            p.on_probe_sent(pn, 9000);
            p.on_probe_lost(pn, 9000);
        }
        assert_eq!(p.poll_probe(now), Some(5100));
    }

    #[test]
    fn a_probe_acknowledged_after_a_fall_back_ends_the_recheck() {
        let t0 = crate::cc::testing::epoch();
        let mut p = Pmtud::new(true, 1452, 9000, Duration::from_secs(600));
        p.current = 4000;
        p.state = PmtuState::Searching;
        p.on_probe_sent(3, 6500);
        for i in 0..3 {
            p.on_packet_lost(4000, t0 + Duration::from_millis(i));
        }
        p.on_packet_acked(1200, t0 + Duration::from_millis(5));
        assert!(p.black_hole());
        p.fall_back();
        // The probe of 6 500 sent before the fall-back gets through: no black hole, and the
        // search goes on upwards from there, not stuck below the 4 001 ceiling of the
        // recheck (nor probing 4 000 again).
        assert_eq!(p.on_probe_acked(3, 6500), Some(6500));
        assert_eq!(p.poll_probe(t0), Some(9000));
    }

    /// A path at 1 472 bytes that lost three full-size packets while a small one got
    /// through at `t0`: a black hole, read from what may be congestion; fallen back.
    fn fallen_from_1472(t0: Instant) -> Pmtud {
        let mut p = Pmtud::new(true, 1452, 9000, Duration::from_secs(600));
        p.current = 1472;
        for i in 0..3 {
            p.on_packet_lost(1472, t0 + Duration::from_millis(i));
        }
        p.on_packet_acked(1200, t0 + Duration::from_millis(5));
        assert!(p.black_hole());
        assert_eq!(p.fall_back(), BASE_PLPMTU);
        p
    }

    #[test]
    fn a_black_hole_read_from_congestion_is_undone_by_one_probe() {
        let t0 = crate::cc::testing::epoch();
        let mut p = fallen_from_1472(t0);
        assert_eq!(p.poll_probe(t0), Some(1472));
        p.on_probe_sent(7, 1472);
        assert_eq!(p.on_probe_acked(7, 1472), Some(1472));
        assert_eq!(p.current, 1472);
        assert_eq!(p.poll_probe(t0), Some(9000), "the search goes on upwards");
    }

    #[test]
    fn a_recheck_lost_to_congestion_is_asked_again_before_the_black_hole_is_confirmed() {
        let t0 = crate::cc::testing::epoch();
        // Lost twice, then through: back at 1 472 and searching upwards.
        let mut p = fallen_from_1472(t0);
        for pn in 1..=2 {
            assert_eq!(p.poll_probe(t0), Some(1472), "probe {pn}");
            p.on_probe_sent(pn, 1472);
            p.on_probe_lost(pn, 1472);
        }
        assert_eq!(p.poll_probe(t0), Some(1472));
        p.on_probe_sent(3, 1472);
        assert_eq!(p.on_probe_acked(3, 1472), Some(1472));
        assert_eq!(p.poll_probe(t0), Some(9000));
        // Lost three times: confirmed, the search goes below it.
        let mut p = fallen_from_1472(t0);
        for pn in 1..=3 {
            assert_eq!(p.poll_probe(t0), Some(1472), "probe {pn}");
            p.on_probe_sent(pn, 1472);
            p.on_probe_lost(pn, 1472);
        }
        let next = p.poll_probe(t0);
        assert!(next.is_some_and(|s| s < 1472), "{next:?}");
    }
}
