//! Explicit rate end to end (F12, F13; docs/PROTOCOL.md §4.8, §9.27, §13) between two
//! endpoints over a minimal in-memory network with a fixed one-way delay and no rate limit.
//! A model router stamps the client's packets with `wire::lower_feedback_rate`, the way a
//! tern router rewrites the field on the path (the real router module lives elsewhere).
//!
//! Each test reads like the situation it checks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tern_proto::cc::Algorithm;
use tern_proto::{
    wire, ConnectionHandle, Dir, Endpoint, EndpointConfig, Event, RateSource, StaticKeypair,
    TargetRate,
};

const CLIENT: &str = "127.0.0.1:5000";
const SERVER: &str = "127.0.0.1:4433";
const ONE_WAY: Duration = Duration::from_millis(20);
/// Connection IDs are 8 bytes in this version: what a router parses with.
const CID_LEN: usize = 8;

fn config(seed: u8, server: bool, algorithm: Algorithm) -> EndpointConfig {
    let mut c = EndpointConfig::new(StaticKeypair::generate([seed; 32]), [seed ^ 0x55; 32]);
    c.connection.congestion = algorithm.factory();
    // First flights proven fresh by their timestamps (PROTOCOL.md §7.6): the server's
    // connection is announced on the first datagram, whatever happens to later ones.
    c.wall_clock = Some(Duration::from_secs(1_700_000_000));
    c.first_flight.trust_start = true;
    c.early_accept = true;
    if server {
        c.server()
    } else {
        c
    }
}

/// A datagram on the wire: (arrival, sequence, to the server, bytes).
type InFlight = Reverse<(Instant, u64, bool, Vec<u8>)>;

/// What the model router does to each client → server datagram.
#[derive(Clone, Copy)]
enum Router {
    /// No router on the path: the feedback stays "no limit".
    None,
    /// Lowers the feedback rate to this many kbit/s.
    Stamp(u32),
    /// Flips a bit of the expected rate (authenticated): the packet must be dropped.
    TamperExpected,
}

/// Two endpoints, the datagrams between them (delivered after `ONE_WAY`), a bulk transfer
/// from client to server, and what was observed on the way.
struct Net {
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    c: ConnectionHandle,
    s: Option<ConnectionHandle>,
    router: Router,
    wire: BinaryHeap<InFlight>,
    seq: u64,
    flow: Option<tern_proto::FlowId>,
    /// Bytes the server application read, with when.
    received: Vec<(Instant, u64)>,
    client_events: Vec<Event>,
    /// Rate areas seen on the client's datagrams: (expected, feedback) as sent.
    areas: Vec<(u32, u32)>,
    /// Server datagrams that carried a rate area.
    server_areas: u64,
}

impl Net {
    fn new(client: Algorithm, server: Algorithm, router: Router) -> Self {
        #[allow(clippy::disallowed_methods)] // Tests fix an arbitrary epoch; only offsets matter.
        let now = Instant::now();
        let mut client = Endpoint::new(config(1, false, client), now);
        let server = Endpoint::new(config(2, true, server), now);
        let key = server.public_key();
        let c = client
            .connect(now, SERVER.parse().unwrap(), Some(key))
            .expect("connect");
        Self {
            now,
            client,
            server,
            c,
            s: None,
            router,
            wire: BinaryHeap::new(),
            seq: 0,
            flow: None,
            received: Vec::new(),
            client_events: Vec::new(),
            areas: Vec::new(),
            server_areas: 0,
        }
    }

    fn client(&mut self) -> &mut tern_proto::Connection {
        self.client
            .connection_mut(self.c)
            .expect("client connection")
    }

    /// Keeps the client's flow full and the server's read, sends what both want to send.
    fn step(&mut self) {
        if self.client().is_established() {
            let flow = match self.flow {
                Some(f) => f,
                None => {
                    let f = self.client().open_flow(Dir::Uni).expect("open");
                    self.flow = Some(f);
                    f
                }
            };
            let chunk = [7u8; 16 * 1024];
            while self.client().write(flow, &chunk).unwrap_or(0) > 0 {}
        }
        if self.s.is_none() {
            self.s = self.server.accept();
        }
        if let Some(s) = self.s {
            let conn = self.server.connection_mut(s).expect("server connection");
            while let Some(id) = conn.accept_flow(Dir::Uni) {
                let _ = id;
            }
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0;
            // Flow IDs of the client's unidirectional flows: read the first one.
            let id = tern_proto::FlowId(2);
            while let Ok(Some(n)) = conn.read(id, &mut buf) {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            if total > 0 {
                self.received.push((self.now, total));
            }
        }
        while let Some((_, e)) = self.client.poll_event() {
            self.client_events.push(e);
        }
        while self.server.poll_event().is_some() {}
        let mut buf = Vec::new();
        while let Some(t) = self.client.poll_transmit(self.now, &mut buf) {
            let mut d = buf.split_off(buf.len() - t.size);
            if let Some(offset) = wire::feedback_rate_offset(&d, CID_LEN) {
                let field = |o: usize| u32::from_be_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
                self.areas.push((field(offset - 4), field(offset)));
                match self.router {
                    Router::None => {}
                    Router::Stamp(kbps) => {
                        wire::lower_feedback_rate(&mut d, CID_LEN, kbps);
                    }
                    Router::TamperExpected => d[offset - 1] ^= 1,
                }
            }
            self.seq += 1;
            self.wire
                .push(Reverse((self.now + ONE_WAY, self.seq, true, d)));
        }
        buf.clear();
        while let Some(t) = self.server.poll_transmit(self.now, &mut buf) {
            let d = buf.split_off(buf.len() - t.size);
            if wire::feedback_rate_offset(&d, CID_LEN).is_some() {
                self.server_areas += 1;
            }
            self.seq += 1;
            self.wire
                .push(Reverse((self.now + ONE_WAY, self.seq, false, d)));
        }
    }

    /// Runs until `end`: sends, then jumps to the next arrival or timer.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        let (c, s): (SocketAddr, SocketAddr) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
        loop {
            self.step();
            let next = [
                self.wire.peek().map(|Reverse((t, ..))| *t),
                self.client.poll_timeout(),
                self.server.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next.filter(|t| *t <= end) else {
                self.now = end;
                return;
            };
            self.now = self.now.max(next);
            while let Some(Reverse((t, ..))) = self.wire.peek() {
                if *t > self.now {
                    break;
                }
                let Some(Reverse((_, _, to_server, mut d))) = self.wire.pop() else {
                    break;
                };
                if to_server {
                    self.server.handle(self.now, c, None, &mut d);
                } else {
                    self.client.handle(self.now, s, None, &mut d);
                }
            }
            self.client.handle_timeout(self.now);
            self.server.handle_timeout(self.now);
        }
    }

    /// Application bytes the server read per second between `from` and `to` (offsets from
    /// the first byte read).
    fn goodput(&self, from: Duration, to: Duration) -> f64 {
        let Some(&(t0, _)) = self.received.first() else {
            return 0.0;
        };
        let bytes: u64 = self
            .received
            .iter()
            .filter(|(t, _)| *t >= t0 + from && *t < t0 + to)
            .map(|(_, n)| n)
            .sum();
        bytes as f64 / (to - from).as_secs_f64()
    }

    fn target_events(&self) -> Vec<TargetRate> {
        self.client_events
            .iter()
            .filter_map(|e| match e {
                Event::TargetRate(t) => Some(*t),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_router_stamp_reaches_the_sender_and_sets_its_pace() {
    // 4 Mbit/s from the router; the application wants 16 Mbit/s; the server runs CUBIC.
    let mut net = Net::new(Algorithm::Explicit, Algorithm::Cubic, Router::Stamp(4_000));
    net.client().set_expected_rate(Some(2_000_000));
    net.run_for(Duration::from_secs(4));

    // Every client packet after the handshake carries the area, with the expected rate in
    // kbit/s and "no limit" as sent; the server (CUBIC) sends none.
    assert!(net.areas.len() > 100, "{} areas", net.areas.len());
    assert!(net.areas.iter().all(|&(_, f)| f == wire::NO_RATE_LIMIT));
    assert!(net.areas.iter().skip(10).all(|&(e, _)| e == 16_000));
    assert_eq!(net.server_areas, 0);

    let s = net.s.expect("accepted");
    let server_stats = net.server.connection(s).expect("server").stats();
    assert!(server_stats.rate_echoes_sent > 10, "{server_stats:?}");
    assert_eq!(server_stats.rate_echoes_received, 0);
    assert_eq!(
        server_stats.auth_failures, 0,
        "the stamp is outside the tag"
    );
    let stats = net.client().stats();
    assert_eq!(stats.feedback_rate, Some(500_000));
    assert!(stats.rate_echoes_received > 10);
    assert_eq!(
        stats.rate_echoes_sent, 0,
        "the server's packets carry no area"
    );
    assert_eq!(stats.pacing_rate, 500_000);
    let path = &net.client().path_stats()[0];
    assert_eq!(path.feedback_rate, Some(500_000));
    assert!(path.rate_echoes_received > 10);

    // The transfer runs at the stamp (less headers).
    let goodput = net.goodput(Duration::from_secs(1), Duration::from_secs(3));
    eprintln!("goodput at a 4 Mbit/s stamp: {:.2} Mbit/s", goodput * 8e-6);
    assert!(
        (0.85 * 500_000.0..=500_000.0).contains(&goodput),
        "{goodput}"
    );

    // F13: the application is told the router's rate, less the overheads.
    let target = net.client().target_rate().expect("known");
    assert_eq!(target.source, RateSource::Router);
    assert!(
        (400_000..500_000).contains(&target.bytes_per_second),
        "{target:?}"
    );
    let events = net.target_events();
    assert!(!events.is_empty(), "no TargetRate event");
    assert_eq!(events.last().map(|t| t.source), Some(RateSource::Router));
}

#[test]
fn without_a_router_the_explicit_controller_runs_its_fallback() {
    let mut net = Net::new(Algorithm::Explicit, Algorithm::Cubic, Router::None);
    net.run_for(Duration::from_secs(2));
    let stats = net.client().stats();
    assert!(stats.rate_echoes_received > 10, "echoes of 0xFFFFFFFF");
    assert_eq!(stats.feedback_rate, None);
    let target = net.client().target_rate().expect("known");
    assert_eq!(target.source, RateSource::Controller);
    assert!(target.bytes_per_second > 0);
    // No router and no link limit: CUBIC grows well beyond any stamp above.
    let goodput = net.goodput(Duration::from_millis(500), Duration::from_secs(1));
    assert!(goodput > 1_000_000.0, "{goodput}");
    // Events: the first known value, then changes of more than 10 %, at most one per RTT.
    let events = net.target_events();
    assert!(!events.is_empty());
    assert!(events.len() < 2_000 / 40 + 2, "{} events", events.len());
}

#[test]
fn any_receiver_echoes_and_an_explicit_server_gets_echoes_from_a_cubic_client() {
    let mut net = Net::new(Algorithm::Cubic, Algorithm::Explicit, Router::None);
    net.run_for(Duration::from_secs(1));
    // The client (CUBIC) sends no area, the server (explicit) does; the client echoes.
    assert!(net.areas.is_empty());
    assert!(net.server_areas > 0);
    let stats = net.client().stats();
    assert!(stats.rate_echoes_sent > 0, "{stats:?}");
}

#[test]
fn tampering_with_the_expected_rate_fails_authentication() {
    let mut net = Net::new(
        Algorithm::Explicit,
        Algorithm::Cubic,
        Router::TamperExpected,
    );
    net.run_for(Duration::from_millis(500));
    let s = net.s.expect("the handshake does not carry the area");
    let stats = net.server.connection(s).expect("server").stats();
    assert!(stats.auth_failures > 0, "{stats:?}");
    assert!(net.received.is_empty(), "nothing tampered was accepted");
}
