//! Key update and the AEAD usage limits (PROTOCOL.md §6.4) in the simulator: with a tiny
//! confidentiality limit, transfers run through dozens of key updates in both directions,
//! over loss, reordering and two paths, and deliver every byte; every (key, nonce) pair is
//! used once; a path that corrupts packets closes the connection at the integrity limit.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use tern_proto::qlog::QlogEvent;
use tern_proto::wire::TransportErrorCode;
use tern_proto::{ConnectionError, ConnectionHandle, ConnectionStats, Endpoint, EndpointConfig};
use tern_sim::tern::{
    endpoint_config, BulkSender, PairAccess, PairHost, TernNode, Transfer, VerifyingReceiver,
};
use tern_sim::{LinkConfig, LossModel, SimError, Simulation};

/// Packets per key in these tests: an update every 200 packets (at half the limit).
const LIMIT: u64 = 400;

const CLIENT: &str = "10.0.0.1:5000";
const SERVER: &str = "10.0.0.2:4433";
const SERVER_B: &str = "10.2.0.2:4433";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn low_limit(c: &mut EndpointConfig) {
    c.connection.confidentiality_limit = LIMIT;
}

fn conn_stats(ep: &Endpoint) -> ConnectionStats {
    let h = ep.handles().next().expect("a connection");
    ep.connection(h).expect("kept").stats()
}

/// What both ends must show after a transfer through many updates.
fn check_updates(client: &ConnectionStats, server: &ConnectionStats, min_updates: u64) {
    eprintln!(
        "client: generation {}, initiated {} received {}, previous-key opens {}, unknown phase \
         {}, auth failures {}, lost {}",
        client.key_generation,
        client.key_updates_initiated,
        client.key_updates_received,
        client.previous_key_opened,
        client.unknown_phase_dropped,
        client.auth_failures,
        client.packets_lost,
    );
    eprintln!(
        "server: generation {}, initiated {} received {}, previous-key opens {}, unknown phase \
         {}, auth failures {}",
        server.key_generation,
        server.key_updates_initiated,
        server.key_updates_received,
        server.previous_key_opened,
        server.unknown_phase_dropped,
        server.auth_failures,
    );
    assert!(client.key_generation >= min_updates, "{client:?}");
    // Each update is started by one end and followed by the other: the generations agree
    // (or one is a step ahead, an update under way when the run ended).
    assert!(client.key_generation.abs_diff(server.key_generation) <= 1);
    assert_eq!(
        client.key_updates_initiated + client.key_updates_received,
        client.key_generation
    );
    assert_eq!(
        server.key_updates_initiated + server.key_updates_received,
        server.key_generation
    );
    // No packet was mistaken for a forgery.
    assert_eq!(client.auth_failures, 0);
    assert_eq!(server.auth_failures, 0);
    assert!(client.packets_sealed_current_key < LIMIT);
}

/// Which end's keys roll over at a low limit in a bulk transfer.
fn client_limit(c: &mut EndpointConfig) {
    if !c.server {
        low_limit(c);
    }
}

/// The acknowledging end sends about a third as many packets: a lower limit for it.
fn server_limit(c: &mut EndpointConfig) {
    if c.server {
        c.connection.confidentiality_limit = LIMIT / 2;
    }
}

/// The server's connection in a simulation of one client and one server.
fn server_conn(sim: &mut Simulation<PairHost>) -> Option<&mut tern_proto::Connection> {
    let host = sim.owner(addr(SERVER).ip())?;
    let PairHost::Server(n) = sim.node_mut(host) else {
        return None;
    };
    let h = n.endpoint.handles().next()?;
    n.endpoint.connection_mut(h)
}

/// Every 250 ms the server asks for a key update (refused while one is pending), so that
/// updates start at both ends, sometimes at once.
fn server_updates(sim: &mut Simulation<PairHost>) {
    let now = sim.now();
    if let Some(conn) = server_conn(sim) {
        let _ = conn.initiate_key_update(now);
    }
    sim.schedule_in(Duration::from_millis(250), server_updates);
}

#[test]
fn a_bulk_transfer_runs_through_many_key_updates_over_loss_and_reordering() {
    let mut previous_opened = 0;
    // The data sender's limit, the acknowledger's, and both (with the server also asking for
    // updates through the API): each end starts updates, the other follows.
    type Configure = fn(&mut EndpointConfig);
    let variants: [(&str, Configure); 3] = [
        ("client", client_limit),
        ("server", server_limit),
        ("both", low_limit),
    ];
    for (seed, (who, configure)) in (1..).zip(variants) {
        let link = LinkConfig::new(20_000_000, Duration::from_millis(15))
            .with_loss(LossModel::Random(0.02))
            .with_reorder(0.05, Duration::from_millis(4));
        let mut t = Transfer::new(seed, link, vec![4_000_000]);
        t.configure = configure;
        let mut sim = t.build();
        if who == "both" {
            server_updates(&mut sim);
        }
        sim.run_until_done(sim.now() + Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{who}: {e}"));
        let rx = &sim.server().app;
        assert_eq!(rx.corrupt, None, "{who}");
        assert_eq!(rx.total(), 4_000_000, "{who}: every byte");
        assert_eq!(sim.client().app.error, None, "{who}");
        let client = conn_stats(&sim.client().endpoint);
        let server = conn_stats(&sim.server().endpoint);
        eprintln!("{who} limited:");
        check_updates(&client, &server, 5);
        match who {
            "client" => assert_eq!(client.key_updates_initiated, client.key_generation),
            "server" => assert_eq!(server.key_updates_initiated, server.key_generation),
            _ => assert!(client.key_updates_initiated + server.key_updates_initiated > 0),
        }
        previous_opened += server.previous_key_opened + client.previous_key_opened;
    }
    assert!(
        previous_opened > 0,
        "reordering carried packets across updates, opened with the kept previous key"
    );
}

/// A client and a server with two addresses: two paths of unequal delay, both lossy and
/// reordering, so that packets of the old phase on the slow path arrive after the new phase
/// on the fast one.
fn two_paths(seed: u64, bytes: u64, qlog: bool) -> Simulation<PairHost> {
    let (c, s, sb) = (addr(CLIENT).ip(), addr(SERVER).ip(), addr(SERVER_B).ip());
    let mut sim = Simulation::new(seed);
    let now = sim.now();
    let mut server_cfg = endpoint_config(seed, true);
    server_cfg.connection.advertise = vec![addr(SERVER_B)];
    let mut client_cfg = endpoint_config(seed, false);
    for cfg in [&mut server_cfg, &mut client_cfg] {
        low_limit(cfg);
        cfg.connection.qlog = qlog;
    }
    let server_ep = Endpoint::new(server_cfg, now);
    let key = Some(server_ep.public_key());
    let client = TernNode::new(
        Endpoint::new(client_cfg, now),
        addr(CLIENT),
        BulkSender::new(addr(SERVER), key, vec![bytes]),
    );
    let server = TernNode::new(server_ep, addr(SERVER), VerifyingReceiver::new(1));
    sim.add_host(PairHost::Client(client), &[c]);
    sim.add_host(PairHost::Server(server), &[s, sb]);
    let lossy = |rate, ms| {
        LinkConfig::new(rate, Duration::from_millis(ms))
            .with_loss(LossModel::Random(0.01))
            .with_reorder(0.03, Duration::from_millis(3))
    };
    sim.add_duplex(c, s, lossy(10_000_000, 10));
    sim.add_duplex(c, sb, lossy(8_000_000, 30));
    sim
}

fn client_node(sim: &Simulation<PairHost>) -> &TernNode<BulkSender> {
    let host = sim
        .hosts()
        .find(|h| matches!(sim.node(*h), PairHost::Client(_)))
        .expect("a client host");
    match sim.node(host) {
        PairHost::Client(n) => n,
        PairHost::Server(_) => unreachable!(),
    }
}

fn server_node(sim: &Simulation<PairHost>) -> &TernNode<VerifyingReceiver> {
    match sim.node(sim.owner(addr(SERVER).ip()).expect("server host")) {
        PairHost::Server(n) => n,
        PairHost::Client(_) => unreachable!(),
    }
}

/// Every packet each end sealed, as (key generation, path ID, packet number), read from
/// the qlog: a `key_updated` record of the send key comes before the first packet under it.
#[derive(Default)]
struct NonceLog {
    /// Per end (client 0, server 1): the send key's generation now.
    generation: [u64; 2],
    /// Per end: the nonces used, with the key.
    used: [HashSet<(u64, u32, u64)>; 2],
    /// Per end: packets recorded.
    packets: [u64; 2],
    /// Per end: the largest generation seen.
    updates: [u64; 2],
}

impl NonceLog {
    fn drain(&mut self, sim: &mut Simulation<PairHost>) {
        let hosts: Vec<_> = sim.hosts().collect();
        for host in hosts {
            let (side, ep) = match sim.node_mut(host) {
                PairHost::Client(n) => (0, &mut n.endpoint),
                PairHost::Server(n) => (1, &mut n.endpoint),
            };
            let handles: Vec<ConnectionHandle> = ep.handles().collect();
            for h in handles {
                let Some(conn) = ep.connection_mut(h) else {
                    continue;
                };
                assert_eq!(conn.qlog_dropped(), 0, "the log is drained often enough");
                while let Some(record) = conn.poll_qlog() {
                    match record.event {
                        QlogEvent::KeyUpdated {
                            send: true,
                            generation,
                            ..
                        } => {
                            assert_eq!(generation, self.generation[side] + 1, "one step");
                            self.generation[side] = generation;
                            self.updates[side] = generation;
                        }
                        QlogEvent::PacketSent {
                            path,
                            packet_number: Some(pn),
                            ..
                        } => {
                            let nonce = (self.generation[side], path, pn);
                            assert!(
                                self.used[side].insert(nonce),
                                "end {side}: (key, nonce) {nonce:?} used twice"
                            );
                            self.packets[side] += 1;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Runs `sim` to completion in 5 ms steps, draining the qlog between them.
fn run_logging(sim: &mut Simulation<PairHost>, log: &mut NonceLog, limit: Duration) {
    let end = sim.now() + limit;
    loop {
        let step = (sim.now() + Duration::from_millis(5)).min(end);
        match sim.run_until_done(step) {
            Ok(_) => break,
            Err(SimError::TimeLimit { .. }) if step < end => log.drain(sim),
            Err(e) => panic!("{e}"),
        }
    }
    log.drain(sim);
}

#[test]
fn no_key_and_nonce_pair_is_used_twice_across_updates_and_path_changes() {
    let (c, moved) = (addr(CLIENT).ip(), addr("10.0.9.1:5000"));
    let bytes = 3_000_000;
    let mut sim = two_paths(5, bytes, true);
    server_updates(&mut sim);
    // Half a second in, the client's address changes (a new lease): its path follows,
    // revalidates and goes on with the same path ID and packet numbers.
    sim.schedule_in(Duration::from_millis(500), move |sim| {
        let host = sim.owner(c).expect("client host");
        sim.change_address(host, c, moved.ip())
            .expect("address change");
        if let PairHost::Client(n) = sim.node_mut(host) {
            n.set_addr(moved);
        }
    });
    let mut log = NonceLog::default();
    run_logging(&mut sim, &mut log, Duration::from_secs(60));
    let rx = &server_node(&sim).app;
    assert_eq!(rx.corrupt, None);
    assert_eq!(rx.total(), bytes, "every byte");
    let server_ep = &server_node(&sim).endpoint;
    let paths = server_ep
        .connection(server_ep.handles().next().unwrap())
        .unwrap()
        .path_stats();
    assert!(paths.iter().any(|p| p.remote == moved), "{paths:#?}");
    eprintln!(
        "packets sealed (client, server): {:?}, key generations reached: {:?}",
        log.packets, log.updates
    );
    assert!(
        log.updates[0] >= 8 && log.updates[1] >= 8,
        "{:?}",
        log.updates
    );
    assert!(log.packets[0] > 2_000 && log.packets[1] > 200);
}

#[test]
fn a_path_that_corrupts_packets_closes_the_connection_at_the_integrity_limit() {
    // 2 % of the client's packets arrive with one bit flipped: to the server they are
    // forgeries. With an integrity limit of 20 it closes after the 20th.
    let link = LinkConfig::new(20_000_000, Duration::from_millis(10));
    let mut t = Transfer::new(3, link.clone(), vec![20_000_000]);
    t.uplink = link.with_corrupt(0.02);
    t.configure = |c| c.connection.integrity_limit = 20;
    let mut sim = t.build();
    let _ = sim.run_until_done(sim.now() + Duration::from_secs(30));
    let error = sim.client().app.error.clone();
    assert!(
        matches!(
            &error,
            Some(ConnectionError::TransportError { code, .. })
                if *code == TransportErrorCode::AEAD_LIMIT_REACHED
        ),
        "the client is told why: {error:?}"
    );
    assert!(
        sim.server().app.total() < 20_000_000,
        "closed before the end"
    );
    let server_ep = &sim.server().endpoint;
    if let Some(conn) = server_ep.connection(ConnectionHandle(0)) {
        assert!(matches!(
            conn.close_reason(),
            Some(ConnectionError::AeadLimitReached { .. })
        ));
        let stats = conn.stats();
        assert_eq!(stats.auth_failures, 20, "{stats:?}");
    }
}

#[test]
fn key_updates_hold_across_two_paths() {
    for seed in 1..=3 {
        let bytes = 3_000_000;
        let mut sim = two_paths(seed, bytes, false);
        server_updates(&mut sim);
        sim.run_until_done(sim.now() + Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let rx = &server_node(&sim).app;
        assert_eq!(rx.corrupt, None, "seed {seed}");
        assert_eq!(rx.total(), bytes, "seed {seed}: every byte");
        let client_ep = &client_node(&sim).endpoint;
        let paths = client_ep
            .connection(client_ep.handles().next().unwrap())
            .unwrap()
            .path_stats();
        assert_eq!(paths.len(), 2, "seed {seed}");
        assert!(
            paths.iter().all(|p| p.bytes_sent > 200_000),
            "seed {seed}: both paths carried data: {paths:#?}"
        );
        let client = conn_stats(client_ep);
        let server = conn_stats(&server_node(&sim).endpoint);
        check_updates(&client, &server, 5);
    }
}
