//! Harnesses behind the endpoint fuzz targets, shared with the corpus generator
//! (`examples/make_corpus.rs`) so that seeds and targets agree on the input formats.
//!
//! Everything is deterministic: fixed keys and seeds, and one epoch `Instant` taken once per
//! process, from which all times are offsets. The same input always does the same thing.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tern_proto::{Endpoint, EndpointConfig, StaticKeypair, Transmit};

pub mod recv;
pub mod script;

/// The client's address as the server sees it.
pub const CLIENT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5000));
/// The client's address after a NAT rebinding.
pub const CLIENT_REBOUND: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 5001));
/// The server's address.
pub const SERVER: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4433));
/// The server's second address, which it advertises (multipath).
pub const SERVER_B: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 5), 4433));
/// The client's second interface, which it opens paths from (multipath).
pub const CLIENT_B: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 5000));

/// The Unix time both ends' wall clocks read at [`epoch`] (first-flight timestamps, §7.6).
pub const WALL_CLOCK: Duration = Duration::from_secs(1_790_000_000);

/// The one epoch of this process; every time in a run is an offset from it, so runs do not
/// depend on when they happen.
#[allow(clippy::disallowed_methods)] // The harness owns the clock: read once, then offsets.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The server's configuration (fixed key and seed; key generation is done once). It
/// advertises [`SERVER_B`], reads [`WALL_CLOCK`] and trusts first-flight timestamps from the
/// start.
pub fn server_config() -> EndpointConfig {
    static CONFIG: OnceLock<EndpointConfig> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut c = EndpointConfig::new(StaticKeypair::generate([2; 32]), [0x57; 32]).server();
            c.connection.advertise = vec![SERVER_B];
            c.wall_clock = Some(WALL_CLOCK);
            // No earlier instance of this key: fresh first flights are recorded at once.
            c.first_flight.trust_start = true;
            c
        })
        .clone()
}

/// The client's configuration (fixed key and seed). It opens paths from [`CLIENT_B`] too and
/// timestamps its first flight with [`WALL_CLOCK`].
pub fn client_config() -> EndpointConfig {
    static CONFIG: OnceLock<EndpointConfig> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut c = EndpointConfig::new(StaticKeypair::generate([1; 32]), [0x54; 32]);
            c.connection.local_ips = vec![CLIENT_B.ip()];
            c.wall_clock = Some(WALL_CLOCK);
            c
        })
        .clone()
}

/// Most datagrams one `poll_transmit` loop may produce at one instant before the harness
/// calls it a runaway sender.
pub const MAX_BURST: usize = 10_000;

/// Calls `poll_transmit` until it returns `None`; calls `sink` with each datagram and where
/// it goes (and comes from). Panics if the endpoint never stops sending.
pub fn drain_transmits(
    ep: &mut Endpoint,
    now: Instant,
    mut sink: impl FnMut(&Transmit, &[u8]),
) -> usize {
    let mut buf = Vec::new();
    let mut total = 0;
    for _ in 0..MAX_BURST {
        buf.clear();
        let Some(t) = ep.poll_transmit(now, &mut buf) else {
            return total;
        };
        assert_eq!(t.size, buf.len(), "Transmit::size is what was written");
        total += t.size;
        sink(&t, &buf);
    }
    panic!("endpoint still sending after {MAX_BURST} datagrams at one instant");
}
