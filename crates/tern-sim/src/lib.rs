//! Deterministic discrete-event network simulator for tern.
//!
//! # Contract
//!
//! - **Deterministic.** A run is a pure function of its seed, its topology and its nodes: same
//!   seed, same arrival times to the nanosecond, same counters. Every random draw comes from a
//!   [`rand_chacha::ChaCha8Rng`] derived from the seed — each link on its own stream (its index),
//!   so adding a link does not change the draws of the others — and ties between events at the
//!   same instant are broken by insertion order, never by addresses or hashing.
//! - **Virtual time.** Time is a [`std::time::Instant`]: an epoch read once from the OS when the
//!   simulation is made, plus a virtual offset. Only differences are ever used, so results do
//!   not depend on the epoch, and a 60 s scenario takes a fraction of a second of wall time.
//!   Time jumps to the next event only when nothing is left to do at the current instant, and a
//!   livelock at one instant panics ("simulation stalled at t=…") instead of hanging.
//! - **Protocol-agnostic.** Nodes implement the sans-I/O [`Node`] trait (`handle`,
//!   `poll_transmit`, `poll_timeout`, `handle_timeout`), the shape of `tern-proto`'s driving API;
//!   this crate does not depend on the protocol.
//!
//! # Pieces
//!
//! - [`Link`] / [`LinkConfig`] — one direction: rate, drop-tail queue, delay, order-preserving
//!   jitter, reordering, random or Gilbert–Elliott loss, duplication, corruption, MTU, and an
//!   optional F12 router at the queue ([`LinkConfig::with_router`], `tern_proto::router`). Presets
//!   [`LinkConfig::lte`], [`LinkConfig::fiveg`], [`LinkConfig::wifi`] follow DESIGN.md §3.
//! - [`Simulation`] — hosts (a node plus the IPs it owns), links keyed by `(src IP, dst IP)`,
//!   scripted actions ([`Simulation::schedule`]), address changes, and the run methods.
//! - [`Recorder`] and [`Summary`] — time series for tests and the end-of-run report
//!   ("simulated X in Y wall" plus per-link counters).
//!
//! Not implemented yet: trace-driven (mahimahi) link rates, multi-hop forwarding (a datagram crosses exactly one link; build multi-path topologies from
//! several addresses per host instead).
//!
//! # Replaying a failure
//!
//! Tests take their seed from [`seed_from_env`], which prints `TERN_SEED=<n>` to stderr. When a
//! test fails, its captured output shows the seed; run it again with that value:
//!
//! ```text
//! TERN_SEED=1234 cargo test -p tern-sim --release the_failing_test
//! ```
//!
//! # Example
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr, SocketAddr};
//! use std::time::{Duration, Instant};
//! use tern_sim::{Datagram, LinkConfig, Node, Simulation};
//!
//! /// Sends one datagram, then waits for it to come back.
//! struct Ping { me: SocketAddr, peer: SocketAddr, sent: bool, rtt: Option<Duration>, start: Option<Instant> }
//! /// Echoes whatever it receives.
//! struct Echo { out: Option<Datagram> }
//! enum Host { Ping(Ping), Echo(Echo) }
//!
//! impl Node for Host {
//!     fn handle(&mut self, now: Instant, d: Datagram) {
//!         match self {
//!             Host::Ping(p) => p.rtt = p.start.map(|s| now - s),
//!             Host::Echo(e) => e.out = Some(Datagram::new(d.dst, d.src, d.data)),
//!         }
//!     }
//!     fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
//!         match self {
//!             Host::Ping(p) if !p.sent => {
//!                 p.sent = true;
//!                 p.start = Some(now);
//!                 Some(Datagram::new(p.me, p.peer, vec![0; 1000]))
//!             }
//!             Host::Ping(_) => None,
//!             Host::Echo(e) => e.out.take(),
//!         }
//!     }
//!     fn poll_timeout(&mut self) -> Option<Instant> { None }
//!     fn handle_timeout(&mut self, _now: Instant) {}
//!     fn is_done(&self) -> bool {
//!         match self { Host::Ping(p) => p.rtt.is_some(), Host::Echo(_) => true }
//!     }
//! }
//!
//! let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
//! let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
//! let mut sim = Simulation::new(tern_sim::seed_from_env(1));
//! let ping = Ping { me: (a, 1000).into(), peer: (b, 2000).into(), sent: false, rtt: None, start: None };
//! sim.add_host(Host::Ping(ping), &[a]);
//! sim.add_host(Host::Echo(Echo { out: None }), &[b]);
//! // 8 Mbit/s: 1000 bytes take 1 ms to serialize; 10 ms each way.
//! sim.add_duplex(a, b, LinkConfig::new(8_000_000, Duration::from_millis(10)));
//! let took = sim.run_until_done(sim.epoch() + Duration::from_secs(1)).unwrap();
//! assert_eq!(took, Duration::from_millis(22));
//! println!("{}", sim.summary());
//! ```

pub mod link;
pub mod sim;
pub mod tern;
pub mod trace;

pub use link::{
    DropReason, Fade, Link, LinkConfig, LinkStats, LossModel, Outage, Verdict, DEFAULT_MTU,
};
pub use sim::{
    Datagram, HostId, LinkId, Node, RunOutcome, SimError, SimStats, Simulation, DEFAULT_STALL_LIMIT,
};
pub use trace::{LinkSummary, Recorder, Series, Summary};

/// Name of the environment variable that overrides test seeds.
pub const SEED_ENV: &str = "TERN_SEED";

/// Parses a seed: decimal, or hexadecimal with a `0x` prefix.
fn parse_seed(value: &str) -> Result<u64, SimError> {
    let v = value.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    parsed.map_err(|_| SimError::BadSeed {
        value: value.to_owned(),
    })
}

/// The seed from `TERN_SEED` if set, else `default`; `Err` if it is set but not a number.
/// Prints nothing; see [`seed_from_env`].
pub fn try_seed_from_env(default: u64) -> Result<u64, SimError> {
    match std::env::var(SEED_ENV) {
        Ok(value) => parse_seed(&value),
        Err(_) => Ok(default),
    }
}

/// The seed for a test: `TERN_SEED` if set, else `default`. Prints `TERN_SEED=<n>` to stderr,
/// so a failing test's output carries the one command needed to replay it.
///
/// # Panics
/// If `TERN_SEED` is set but is not an unsigned integer: silently running another seed than the
/// one asked for would defeat the replay.
pub fn seed_from_env(default: u64) -> u64 {
    let seed = match try_seed_from_env(default) {
        Ok(seed) => seed,
        Err(e) => panic!("{e}"),
    };
    eprintln!("{SEED_ENV}={seed}");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Ok(42));
        assert_eq!(parse_seed(" 0x2a\n"), Ok(42));
        assert_eq!(parse_seed("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            parse_seed("forty-two"),
            Err(SimError::BadSeed { .. })
        ));
        assert!(matches!(parse_seed("-1"), Err(SimError::BadSeed { .. })));
    }
}
