//! Multipath (PROTOCOL.md §13) in the simulator: a connection opens a path for every pair of
//! addresses at once, validates each, spreads data over them, and survives one going dark.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tern_proto::{Endpoint, PathState, PathStats};
use tern_sim::tern::{endpoint_config, BulkSender, PairHost, TernNode, VerifyingReceiver};
use tern_sim::{LinkConfig, Simulation};

const CLIENT: &str = "10.0.0.1:5000";
const CLIENT_CELL: &str = "10.1.0.1:5000";
const SERVER: &str = "10.0.0.2:4433";
const SERVER_B: &str = "10.2.0.2:4433";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// What the topology gives each side: extra server addresses to advertise, extra client
/// addresses to open paths from, and the links (client ip, server ip, config).
struct Topology {
    seed: u64,
    advertise: Vec<SocketAddr>,
    client_ips: Vec<IpAddr>,
    links: Vec<(IpAddr, IpAddr, LinkConfig)>,
    bytes: u64,
}

fn build(t: &Topology) -> Simulation<PairHost> {
    let mut sim = Simulation::new(t.seed);
    let now = sim.now();
    let mut server_cfg = endpoint_config(t.seed, true);
    server_cfg.connection.advertise = t.advertise.clone();
    let mut client_cfg = endpoint_config(t.seed, false);
    client_cfg.connection.local_ips = t.client_ips.clone();
    let server_ep = Endpoint::new(server_cfg, now);
    let key = Some(server_ep.public_key());
    let client = TernNode::new(
        Endpoint::new(client_cfg, now),
        addr(CLIENT),
        BulkSender::new(addr(SERVER), key, vec![t.bytes]),
    );
    let server = TernNode::new(server_ep, addr(SERVER), VerifyingReceiver::new(1));
    let mut client_ips = vec![addr(CLIENT).ip()];
    client_ips.extend(&t.client_ips);
    let mut server_ips = vec![addr(SERVER).ip()];
    server_ips.extend(t.advertise.iter().map(|a| a.ip()));
    sim.add_host(PairHost::Client(client), &client_ips);
    sim.add_host(PairHost::Server(server), &server_ips);
    for (c, s, link) in &t.links {
        sim.add_duplex(*c, *s, link.clone());
    }
    sim
}

fn client(sim: &Simulation<PairHost>) -> &TernNode<BulkSender> {
    match sim.node(sim.owner(addr(CLIENT).ip()).unwrap()) {
        PairHost::Client(n) => n,
        PairHost::Server(_) => unreachable!(),
    }
}

fn server(sim: &Simulation<PairHost>) -> &TernNode<VerifyingReceiver> {
    match sim.node(sim.owner(addr(SERVER).ip()).unwrap()) {
        PairHost::Server(n) => n,
        PairHost::Client(_) => unreachable!(),
    }
}

fn client_paths(sim: &Simulation<PairHost>) -> Vec<PathStats> {
    let ep = &client(sim).endpoint;
    let h = ep.handles().next().expect("a connection");
    ep.connection(h).unwrap().path_stats()
}

#[test]
fn a_server_with_two_addresses_gets_both_paths_used_at_once() {
    let (c, s, sb) = (addr(CLIENT).ip(), addr(SERVER).ip(), addr(SERVER_B).ip());
    let link = |ms| LinkConfig::new(10_000_000, Duration::from_millis(ms));
    let t = Topology {
        seed: 1,
        advertise: vec![addr(SERVER_B)],
        client_ips: vec![],
        links: vec![(c, s, link(10)), (c, sb, link(25))],
        bytes: 5_000_000,
    };
    let mut sim = build(&t);
    let took = sim
        .run_until_done(sim.now() + Duration::from_secs(30))
        .expect("transfer completes");
    assert_eq!(server(&sim).app.corrupt, None);
    assert_eq!(server(&sim).app.total(), t.bytes);
    let paths = client_paths(&sim);
    eprintln!(
        "5 MB over 10 Mbit/s × (10 ms, 25 ms): {took:?}; bytes sent per path: {:?}",
        paths.iter().map(|p| p.bytes_sent).collect::<Vec<_>>()
    );
    assert_eq!(paths.len(), 2, "{paths:#?}");
    assert_eq!(paths[1].remote, addr(SERVER_B));
    for p in &paths {
        assert!(p.validated && p.state == PathState::Active, "{p:?}");
        assert!(
            p.bytes_sent > t.bytes / 4,
            "every path carries a good share: {paths:#?}"
        );
    }
    // One 10 Mbit/s path alone needs 4 s for 5 MB; two carry it in well under that.
    assert!(took < Duration::from_millis(3_200), "took {took:?}");
}

#[test]
fn a_client_with_two_interfaces_opens_a_path_from_each() {
    let (c, cc, s) = (addr(CLIENT).ip(), addr(CLIENT_CELL).ip(), addr(SERVER).ip());
    let t = Topology {
        seed: 2,
        advertise: vec![],
        client_ips: vec![cc],
        links: vec![
            (c, s, LinkConfig::wifi()),
            (
                cc,
                s,
                LinkConfig::new(20_000_000, Duration::from_millis(20)),
            ),
        ],
        bytes: 3_000_000,
    };
    let mut sim = build(&t);
    sim.run_until_done(sim.now() + Duration::from_secs(30))
        .expect("transfer completes");
    assert_eq!(server(&sim).app.corrupt, None);
    assert_eq!(server(&sim).app.total(), t.bytes);
    let paths = client_paths(&sim);
    assert_eq!(paths.len(), 2, "{paths:#?}");
    assert_eq!(paths[1].local, Some(cc));
    assert!(
        paths.iter().all(|p| p.validated && p.bytes_sent > 100_000),
        "{paths:#?}"
    );
    // The server answered the second path from the address it came to.
    let sep = &server(&sim).endpoint;
    let h = sep.handles().next().unwrap();
    let server_paths = sep.connection(h).unwrap().path_stats();
    assert_eq!(server_paths.len(), 2);
    assert!(server_paths
        .iter()
        .any(|p| p.remote.ip() == cc && p.validated));
}

#[test]
fn a_path_that_goes_dark_is_declared_dead_and_its_data_moves_to_the_other() {
    let (c, s, sb) = (addr(CLIENT).ip(), addr(SERVER).ip(), addr(SERVER_B).ip());
    let link = |ms| LinkConfig::new(10_000_000, Duration::from_millis(ms));
    for seed in 1..=5 {
        let t = Topology {
            seed,
            advertise: vec![addr(SERVER_B)],
            client_ips: vec![],
            links: vec![(c, s, link(10)), (c, sb, link(30))],
            bytes: 4_000_000,
        };
        let mut sim = build(&t);
        // The fast path (the first) blackholes 1 s in, both ways, for good.
        sim.schedule_in(Duration::from_secs(1), move |sim| {
            for (from, to) in [(c, s), (s, c)] {
                let id = sim.link_between(from, to).unwrap();
                sim.link_mut(id).set_up(false);
            }
        });
        sim.run_until_done(sim.now() + Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(server(&sim).app.corrupt, None, "seed {seed}");
        assert_eq!(server(&sim).app.total(), t.bytes, "seed {seed}: every byte");
        let paths = client_paths(&sim);
        assert_eq!(paths[0].state, PathState::Dead, "seed {seed}: {paths:#?}");
        assert_eq!(paths[1].state, PathState::Active, "seed {seed}");
        let ep = &client(&sim).endpoint;
        let stats = ep.connection(ep.handles().next().unwrap()).unwrap().stats();
        assert!(stats.packets_rerouted > 0, "seed {seed}: {stats:?}");
    }
}

#[test]
fn the_connection_follows_a_client_that_moves_and_validates_its_new_address() {
    let (c, s) = (addr(CLIENT).ip(), addr(SERVER).ip());
    // A new lease (a new IP: new RTT and window state) and a NAT rebinding (a new port only).
    for (seed, new) in [(3, "10.0.9.1:5000"), (4, "10.0.0.1:6000")] {
        let new = addr(new);
        let t = Topology {
            seed,
            advertise: vec![],
            client_ips: vec![],
            links: vec![(c, s, LinkConfig::new(20_000_000, Duration::from_millis(15)))],
            bytes: 3_000_000,
        };
        let mut sim = build(&t);
        sim.schedule_in(Duration::from_millis(600), move |sim| {
            let host = sim.owner(c).unwrap();
            if new.ip() != c {
                sim.change_address(host, c, new.ip()).unwrap();
            }
            if let PairHost::Client(n) = sim.node_mut(host) {
                n.set_addr(new);
            }
        });
        sim.run_until_done(sim.now() + Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{new}: {e}"));
        assert_eq!(server(&sim).app.corrupt, None);
        assert_eq!(server(&sim).app.total(), t.bytes, "{new}: every byte");
        let sep = &server(&sim).endpoint;
        let paths = sep
            .connection(sep.handles().next().unwrap())
            .unwrap()
            .path_stats();
        assert_eq!(paths.len(), 1, "{new}: still one path: {paths:#?}");
        assert_eq!(paths[0].remote, new);
        assert!(
            paths[0].validated,
            "{new}: the new address answered the challenge"
        );
    }
}
