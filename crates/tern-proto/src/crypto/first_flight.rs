//! Anti-replay for the client's first flight (docs/PROTOCOL.md §7.6): a freshness window on the
//! timestamp the client puts inside its encrypted IK message 1, and a bounded register of the
//! first flights seen within that window (TLS 1.3's "ClientHello recording", RFC 8446 §8.2).
//!
//! A first flight is identified by its ephemeral public key, the first 32 bytes of Noise
//! message 1: fresh for every handshake, and bound into the handshake hash, so a copy that
//! authenticates is the same flight. Only flights that authenticated are recorded, so no one
//! can fill the register with a victim's key.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Bytes of the ephemeral key the register keeps: 128 bits make a collision between honest
/// flights negligible and one chosen by an attacker infeasible.
const ID_LEN: usize = 16;

/// What the server may do with the early data of an authenticated first flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Timestamp inside the window and never seen: deliver the early data now.
    Fresh,
    /// Seen before within the window: a replay (or a copy after the connection was freed).
    /// Keep no state and send nothing.
    Replayed,
    /// Cannot be proven fresh (no or stale timestamp, the server's window overlaps its own
    /// start, the register is full): hold the early data until the client proves it is live.
    Unproven(Unproven),
}

/// Why a first flight could not be proven fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unproven {
    /// The client sent no timestamp (it has no wall clock).
    NoTimestamp,
    /// The timestamp is further than the window from the server's clock.
    Stale,
    /// This server started less than a window ago: a previous instance may have seen it.
    Starting,
    /// The register holds its capacity of flights, or did within a window of the flight's
    /// timestamp: a flight judged while it was full was not recorded, so its copies cannot be
    /// told from it until their timestamps are out of the window.
    Full,
    /// The server has no wall clock.
    NoClock,
}

/// Remembers the first flights of the last two windows (see the module documentation).
#[derive(Debug)]
pub struct FirstFlightRegister {
    window: Duration,
    capacity: usize,
    seen: HashSet<[u8; ID_LEN]>,
    /// Entries in insertion order, with when they may be forgotten.
    expiry: VecDeque<(Instant, [u8; ID_LEN])>,
    /// Server clock a window after the register was last full: flights with timestamps up
    /// to it may be copies of flights that were not recorded (as after a restart).
    unrecorded_until: Option<Duration>,
}

impl FirstFlightRegister {
    /// A register for timestamps within `window` of the server's clock, holding at most
    /// `capacity` flights (about 60 bytes each).
    pub fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity,
            seen: HashSet::new(),
            expiry: VecDeque::new(),
            unrecorded_until: None,
        }
    }

    /// Flights remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no flight is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Judges (and, when fresh, records) an authenticated first flight.
    ///
    /// - `ephemeral`: the flight's ephemeral public key;
    /// - `timestamp`: the client's clock when it wrote the flight (since the UNIX epoch);
    /// - `clock`: the server's clock now, and when this server started (same epoch), if it
    ///   has one; `trust_start` waives the start-up rule (no previous instance can exist).
    ///
    /// A timestamp accepted at server time t is within the window of t, so a copy of it can
    /// pass the freshness test only until t + 2 × window: that is how long it is kept.
    pub fn check(
        &mut self,
        now: Instant,
        ephemeral: &[u8],
        timestamp: Option<Duration>,
        clock: Option<(Duration, Duration)>,
        trust_start: bool,
    ) -> Freshness {
        self.forget(now);
        let Some(id) = ephemeral
            .get(..ID_LEN)
            .and_then(|b| <[u8; ID_LEN]>::try_from(b).ok())
        else {
            return Freshness::Replayed;
        };
        if self.seen.contains(&id) {
            return Freshness::Replayed;
        }
        let Some((server_now, started)) = clock else {
            return Freshness::Unproven(Unproven::NoClock);
        };
        let Some(ts) = timestamp else {
            return Freshness::Unproven(Unproven::NoTimestamp);
        };
        if ts.abs_diff(server_now) > self.window {
            return Freshness::Unproven(Unproven::Stale);
        }
        // RFC 8446 §8.2: a freshly started server does not know what its previous instance
        // saw. A flight written at least a window after this start cannot have reached it
        // (for a client whose clock is within the window of ours).
        if !trust_start && ts < started + self.window {
            return Freshness::Unproven(Unproven::Starting);
        }
        if self.seen.len() >= self.capacity {
            // Not recorded: until a copy's timestamp would be stale, no flight written before
            // now + window can be told from one judged now (the start-up rule's reasoning).
            let until = server_now + self.window;
            self.unrecorded_until = Some(self.unrecorded_until.map_or(until, |u| u.max(until)));
            return Freshness::Unproven(Unproven::Full);
        }
        if self.unrecorded_until.is_some_and(|u| ts <= u) {
            return Freshness::Unproven(Unproven::Full);
        }
        self.seen.insert(id);
        self.expiry.push_back((now + 2 * self.window, id));
        Freshness::Fresh
    }

    /// Drops the entries that no copy could pass the freshness test with any more.
    fn forget(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.expiry.front() {
            if at > now {
                break;
            }
            self.expiry.pop_front();
            self.seen.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(10);

    #[allow(clippy::disallowed_methods)] // An arbitrary epoch; only offsets matter.
    fn epoch() -> Instant {
        Instant::now()
    }

    fn clock(at: u64) -> Option<(Duration, Duration)> {
        Some((Duration::from_secs(at), Duration::from_secs(1000)))
    }

    #[test]
    fn a_flight_is_fresh_once() {
        let t0 = epoch();
        let mut r = FirstFlightRegister::new(W, 100);
        let ts = Some(Duration::from_secs(2000));
        assert_eq!(
            r.check(t0, &[7; 32], ts, clock(2001), false),
            Freshness::Fresh
        );
        assert_eq!(
            r.check(t0 + W, &[7; 32], ts, clock(2011), false),
            Freshness::Replayed
        );
        assert_eq!(
            r.check(t0, &[8; 32], ts, clock(2001), false),
            Freshness::Fresh
        );
    }

    #[test]
    fn a_flight_judged_while_full_is_not_fresh_later() {
        // Found by an outside read: a flight judged while the register was full was not
        // recorded, and a copy of it was judged fresh once room came back.
        let t0 = epoch();
        let mut r = FirstFlightRegister::new(W, 1);
        let ts = Some(Duration::from_secs(2000));
        assert_eq!(
            r.check(t0, &[1; 32], ts, clock(2000), false),
            Freshness::Fresh
        );
        assert_eq!(
            r.check(t0, &[2; 32], ts, clock(2000), false),
            Freshness::Unproven(Unproven::Full)
        );
        // The first entry is forgotten (2 windows later); the copy's timestamp is still
        // within the window of the server's clock.
        let later = t0 + 2 * W;
        assert_eq!(
            r.check(later, &[2; 32], ts, clock(2009), false),
            Freshness::Unproven(Unproven::Full)
        );
        // A flight written after the register was full plus a window is fresh again.
        let new_ts = Some(Duration::from_secs(2011));
        assert_eq!(
            r.check(later, &[3; 32], new_ts, clock(2011), false),
            Freshness::Fresh
        );
    }

    #[test]
    fn a_copy_outside_the_window_is_unproven_not_fresh() {
        let t0 = epoch();
        let mut r = FirstFlightRegister::new(W, 100);
        let ts = Some(Duration::from_secs(2000));
        assert_eq!(
            r.check(t0, &[7; 32], ts, clock(2000), false),
            Freshness::Fresh
        );
        // Forgotten after two windows, but by then its timestamp is stale.
        let later = t0 + 2 * W;
        assert_eq!(
            r.check(later, &[7; 32], ts, clock(2020), false),
            Freshness::Unproven(Unproven::Stale)
        );
        assert!(r.is_empty());
    }

    #[test]
    fn start_up_no_clock_no_timestamp_and_full() {
        let t0 = epoch();
        let mut r = FirstFlightRegister::new(W, 1);
        // Written 5 s after this server started: a previous instance may have seen it.
        let early = Some(Duration::from_secs(1005));
        assert_eq!(
            r.check(t0, &[1; 32], early, clock(1005), false),
            Freshness::Unproven(Unproven::Starting)
        );
        assert_eq!(
            r.check(t0, &[1; 32], early, clock(1005), true),
            Freshness::Fresh
        );
        let ts = Some(Duration::from_secs(2000));
        assert_eq!(
            r.check(t0, &[2; 32], ts, clock(2000), false),
            Freshness::Unproven(Unproven::Full)
        );
        assert_eq!(
            r.check(t0, &[3; 32], None, clock(2000), false),
            Freshness::Unproven(Unproven::NoTimestamp)
        );
        assert_eq!(
            r.check(t0, &[3; 32], ts, None, false),
            Freshness::Unproven(Unproven::NoClock)
        );
        assert_eq!(
            r.check(t0, &[3; 3], ts, clock(2000), false),
            Freshness::Replayed
        );
    }
}
