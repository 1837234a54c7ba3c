//! Path MTU discovery (DESIGN.md F14, PROTOCOL.md §5.5) over simulated links whose MTU drops
//! larger datagrams: jumbo and Ethernet links, a black hole that opens mid-transfer, and
//! probe losses that must not count as congestion.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tern_proto::{ConnectionHandle, ConnectionStats, EndpointConfig};
use tern_sim::tern::{PairAccess, PairHost, Transfer};
use tern_sim::{LinkConfig, Simulation};

const RATE: u64 = 100_000_000;
const ONE_WAY: Duration = Duration::from_millis(10);

/// Changes of the client's datagram size over time: (since start, size).
type Trace = Rc<RefCell<Vec<(Duration, u16)>>>;

fn jumbo(c: &mut EndpointConfig) {
    c.connection.max_recv_datagram_size = 9000;
    c.connection.max_pmtu = 9000;
}

fn no_pmtu(c: &mut EndpointConfig) {
    c.connection.pmtu_discovery = false;
}

/// Searches up to 1 500, above the Ethernet link's 1 472 (the simulator's endpoints keep
/// the start size, 1 452, unless a test raises `max_pmtu`).
fn above_ethernet(c: &mut EndpointConfig) {
    c.connection.max_pmtu = 1500;
}

fn client_stats(sim: &Simulation<PairHost>) -> Option<ConnectionStats> {
    sim.client()
        .endpoint
        .connection(ConnectionHandle(0))
        .map(|c| c.stats())
}

/// Samples the client's datagram size every millisecond.
fn watch(sim: &mut Simulation<PairHost>) -> Trace {
    fn sample(s: &mut Simulation<PairHost>, trace: Trace, start: std::time::Instant) {
        if let Some(st) = client_stats(s) {
            let mut t = trace.borrow_mut();
            if t.last().is_none_or(|&(_, m)| m != st.max_datagram_size) {
                t.push((s.now() - start, st.max_datagram_size));
            }
        }
        s.schedule_in(Duration::from_millis(1), move |s| sample(s, trace, start));
    }
    let trace: Trace = Rc::default();
    let start = sim.now();
    let t = trace.clone();
    sim.schedule(start, move |s| sample(s, t, start));
    trace
}

struct Run {
    stats: ConnectionStats,
    trace: Vec<(Duration, u16)>,
    /// Uplink counters.
    link: tern_sim::LinkStats,
    took: Duration,
}

fn run(t: &Transfer, size: u64, at: Option<(Duration, usize)>) -> Run {
    let mut sim = t.build();
    let start = sim.now();
    let trace = watch(&mut sim);
    let uplink = sim.links().next().expect("two links");
    let downlink = sim.links().nth(1).expect("two links");
    if let Some((when, mtu)) = at {
        sim.schedule(start + when, move |s| {
            s.link_mut(uplink).config_mut().mtu = mtu;
            s.link_mut(downlink).config_mut().mtu = mtu;
        });
    }
    let took = sim
        .run_until_done(start + Duration::from_secs(120))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None, "byte-exact");
    assert_eq!(server.total(), size);
    let stats = client_stats(&sim).expect("connection kept");
    let link = *sim.link(uplink).stats();
    let trace = trace.borrow().clone();
    eprintln!(
        "took {took:?}; size now {}; probes {} lost {}; black holes {}; lost {}; cuts {}; \
         mtu trace {:?}; uplink: {}",
        stats.max_datagram_size,
        stats.pmtu_probes_sent,
        stats.pmtu_probes_lost,
        stats.pmtu_black_holes,
        stats.packets_lost,
        stats.congestion_events,
        trace,
        link
    );
    Run {
        stats,
        trace,
        link,
        took,
    }
}

/// When the size first reached at least `min`.
fn reached(trace: &[(Duration, u16)], min: u16) -> Option<Duration> {
    trace.iter().find(|&&(_, m)| m >= min).map(|&(t, _)| t)
}

#[test]
fn a_jumbo_link_is_found_and_used() {
    const SIZE: u64 = 30_000_000;
    let link = LinkConfig::new(RATE, ONE_WAY).with_mtu(9000);
    let mut t = Transfer::new(tern_sim::seed_from_env(1), link, vec![SIZE]);
    t.configure = jumbo;
    let r = run(&t, SIZE, None);
    assert!(r.stats.max_datagram_size >= 8900, "{:?}", r.trace);
    let found = reached(&r.trace, 8900).expect("found");
    eprintln!(
        "9000-byte link: {} bytes after {found:?}",
        r.stats.max_datagram_size
    );
    assert!(found < Duration::from_millis(500), "{found:?}");
    // The bulk transfer then runs at that size: datagrams average well above Ethernet's.
    let average = r.link.bytes / r.link.delivered.max(1);
    assert!(average > 8000, "average datagram {average} B");
    assert_eq!(r.stats.pmtu_black_holes, 0);
}

#[test]
fn a_jumbo_search_below_the_ceiling() {
    // The link carries 8 000, the endpoints would take 9 000: binary search below.
    const SIZE: u64 = 10_000_000;
    let link = LinkConfig::new(RATE, ONE_WAY).with_mtu(8000);
    let mut t = Transfer::new(tern_sim::seed_from_env(2), link, vec![SIZE]);
    t.configure = jumbo;
    let r = run(&t, SIZE, None);
    let size = r.stats.max_datagram_size;
    assert!((8000 - 16..=8000).contains(&size), "{size}: {:?}", r.trace);
    eprintln!(
        "8000-byte link: {size} after {:?}",
        reached(&r.trace, size).expect("found")
    );
    // Only probes ever exceeded the link's MTU; slow start's queue overflow is no black hole.
    assert_eq!(r.link.dropped_mtu, r.stats.pmtu_probes_lost);
    assert_eq!(r.stats.pmtu_black_holes, 0);
}

#[test]
fn an_ethernet_link_is_found_without_losing_data() {
    const SIZE: u64 = 10_000_000;
    // The presets' MTU: 1 472 bytes of UDP payload (1 500-byte Ethernet, IPv4). The search
    // starts at 1 452 and tries up to 1 500, so it has to search below a failing ceiling.
    let link = LinkConfig::new(RATE, ONE_WAY);
    let mut t = Transfer::new(tern_sim::seed_from_env(3), link.clone(), vec![SIZE]);
    t.configure = above_ethernet;
    let r = run(&t, SIZE, None);
    let size = r.stats.max_datagram_size;
    assert!((1452..=1472).contains(&size), "{size}");
    assert!(size > 1452, "the search went above the start: {size}");
    eprintln!(
        "1472-byte link: {size} after {:?}, {} probes ({} lost)",
        reached(&r.trace, size).expect("found"),
        r.stats.pmtu_probes_sent,
        r.stats.pmtu_probes_lost
    );
    // Only probes ever exceeded the link's MTU: no data packet was too large.
    assert_eq!(r.link.dropped_mtu, r.stats.pmtu_probes_lost);
    assert!(r.stats.pmtu_probes_lost >= 3);
    assert_eq!(r.stats.pmtu_black_holes, 0);
    // A ceiling at the link's MTU: one probe, nothing lost.
    let mut t = Transfer::new(tern_sim::seed_from_env(3), link.clone(), vec![SIZE]);
    t.configure = |c| c.connection.max_pmtu = 1472;
    let r = run(&t, SIZE, None);
    assert_eq!(r.stats.max_datagram_size, 1472);
    assert_eq!((r.stats.pmtu_probes_sent, r.stats.pmtu_probes_lost), (1, 0));
    assert_eq!(r.link.dropped_mtu, 0);
    // The default (a jumbo ceiling, 8 972): the search ends within 16 bytes of the link's
    // 1 472, and only probes were lost.
    let mut t = Transfer::new(tern_sim::seed_from_env(3), link, vec![SIZE]);
    t.configure = |c| c.connection.max_pmtu = tern_proto::ConnectionConfig::default().max_pmtu;
    let r = run(&t, SIZE, None);
    let size = r.stats.max_datagram_size;
    assert!((1457..=1472).contains(&size), "{size}");
    assert!(r.stats.pmtu_probes_lost >= 3);
    assert_eq!(r.link.dropped_mtu, r.stats.pmtu_probes_lost);
    assert_eq!(r.stats.packets_lost, 0);
}

#[test]
fn a_black_hole_falls_back_to_the_base_size() {
    for (name, configure, mtu) in [
        ("jumbo", jumbo as fn(&mut EndpointConfig), 9000),
        ("ethernet", (|_| {}) as fn(&mut EndpointConfig), 1472),
    ] {
        const SIZE: u64 = 20_000_000;
        let link = LinkConfig::new(RATE, ONE_WAY).with_mtu(mtu);
        let mut t = Transfer::new(tern_sim::seed_from_env(4), link, vec![SIZE]);
        t.configure = configure;
        let at = Duration::from_secs(1);
        let r = run(&t, SIZE, Some((at, 1280)));
        assert!(r.stats.pmtu_black_holes >= 1, "{name}");
        let before = r
            .trace
            .iter()
            .rev()
            .find(|&&(t, _)| t < at)
            .expect("a size before")
            .1;
        assert!(before > 1400, "{name}: the path had grown: {before}");
        let fallback = r
            .trace
            .iter()
            .find(|&&(t, m)| t >= at && m == 1200)
            .map(|&(t, _)| t - at)
            .expect("fell back to 1 200");
        let size = r.stats.max_datagram_size;
        assert!((1200..=1280).contains(&size), "{name}: {size}");
        eprintln!(
            "{name} black hole at {at:?}: 1 200 after {fallback:?}, then {size}; took {:?}",
            r.took
        );
        assert!(fallback < Duration::from_secs(3), "{name}: {fallback:?}");
    }
}

#[test]
fn lost_probes_are_not_congestion() {
    // No queue to overflow and no random loss: every loss is a probe above the MTU.
    const SIZE: u64 = 10_000_000;
    let link = LinkConfig::new(RATE, ONE_WAY).with_queue_limit(64 << 20);
    let mut t = Transfer::new(tern_sim::seed_from_env(5), link.clone(), vec![SIZE]);
    t.configure = above_ethernet;
    let with = run(&t, SIZE, None);
    let mut t = Transfer::new(tern_sim::seed_from_env(5), link, vec![SIZE]);
    t.configure = no_pmtu;
    let without = run(&t, SIZE, None);
    assert!(with.stats.pmtu_probes_lost >= 3);
    assert_eq!(with.stats.packets_lost, 0, "probes are not packets lost");
    assert_eq!(with.stats.bytes_retransmitted, 0, "probes are never resent");
    assert_eq!(
        with.stats.congestion_events, without.stats.congestion_events,
        "probe losses are no congestion"
    );
    assert_eq!(without.stats.pmtu_probes_sent, 0);
    assert_eq!(without.stats.max_datagram_size, 1452);
}

/// A transfer over two paths: path 0 carries jumbo frames, path 1 Ethernet-sized ones; with
/// `hole`, path 0's MTU drops to 1 280 after a second. Returns each path's final size and the
/// client's statistics.
fn two_paths(hole: bool) -> (Vec<tern_proto::PathStats>, ConnectionStats) {
    use std::net::SocketAddr;
    use tern_proto::Endpoint;
    use tern_sim::tern::{endpoint_config, BulkSender, TernNode, VerifyingReceiver};
    const SIZE: u64 = 20_000_000;
    let (c, s, sb): (SocketAddr, SocketAddr, SocketAddr) = (
        "10.0.0.1:5000".parse().unwrap(),
        "10.0.0.2:4433".parse().unwrap(),
        "10.2.0.2:4433".parse().unwrap(),
    );
    let seed = tern_sim::seed_from_env(6);
    let mut sim = Simulation::new(seed);
    let now = sim.now();
    let mut server_cfg = endpoint_config(seed, true);
    jumbo(&mut server_cfg);
    server_cfg.connection.advertise = vec![sb];
    let mut client_cfg = endpoint_config(seed, false);
    jumbo(&mut client_cfg);
    let server_ep = Endpoint::new(server_cfg, now);
    let key = Some(server_ep.public_key());
    let client = TernNode::new(
        Endpoint::new(client_cfg, now),
        c,
        BulkSender::new(s, key, vec![SIZE]),
    );
    let server = TernNode::new(server_ep, s, VerifyingReceiver::new(1));
    sim.add_host(PairHost::Client(client), &[c.ip()]);
    sim.add_host(PairHost::Server(server), &[s.ip(), sb.ip()]);
    let link = LinkConfig::new(RATE / 2, ONE_WAY);
    let (up, down) = sim.add_duplex(c.ip(), s.ip(), link.clone().with_mtu(9000));
    sim.add_duplex(c.ip(), sb.ip(), link.with_mtu(1472));
    if hole {
        sim.schedule(now + Duration::from_secs(1), move |s| {
            s.link_mut(up).config_mut().mtu = 1280;
            s.link_mut(down).config_mut().mtu = 1280;
        });
    }
    sim.run_until_done(sim.now() + Duration::from_secs(60))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None, "byte-exact");
    assert_eq!(server.total(), SIZE);
    let ep = &sim.client().endpoint;
    let conn = ep.connection(ConnectionHandle(0)).expect("kept");
    let paths = conn.path_stats();
    eprintln!(
        "per-path sizes {:?}, bytes sent {:?}; {:?}",
        paths
            .iter()
            .map(|p| p.max_datagram_size)
            .collect::<Vec<_>>(),
        paths.iter().map(|p| p.bytes_sent).collect::<Vec<_>>(),
        conn.stats()
    );
    assert_eq!(paths.len(), 2);
    (paths, conn.stats())
}

#[test]
fn each_path_of_a_multipath_connection_finds_its_own_size() {
    let (paths, stats) = two_paths(false);
    assert_eq!(paths[0].max_datagram_size, 9000);
    assert!((1456..=1472).contains(&paths[1].max_datagram_size));
    assert!(paths.iter().all(|p| p.bytes_sent > 4_000_000), "{paths:#?}");
    assert_eq!(stats.pmtu_black_holes, 0);
}

#[test]
fn a_black_hole_on_one_path_of_several_is_detected_on_that_path() {
    // Path 0 goes silent for full-size packets: its data moves to path 1 at once (dead-path
    // failover), and its answered Pings show the black hole.
    let (paths, stats) = two_paths(true);
    assert!(stats.pmtu_black_holes >= 1, "{stats:?}");
    assert!(
        (1200..=1280).contains(&paths[0].max_datagram_size),
        "{paths:#?}"
    );
    assert!(
        (1456..=1472).contains(&paths[1].max_datagram_size),
        "{paths:#?}"
    );
}
