//! AckFrequency (PROTOCOL.md §11.1): at a high rate the sender asks for one ACK per eighth of
//! its window, which cuts the ACKs (and their cost on both hosts) about fivefold without
//! losing throughput, and the last packet before the sender falls silent is still
//! acknowledged at once.

use std::time::Duration;

use std::net::SocketAddr;
use std::time::Instant;

use tern_proto::{
    ConnectionHandle, ConnectionStats, Dir, Endpoint, EndpointConfig, Event, FlowId, PublicKey,
};
use tern_sim::tern::{
    endpoint_config, established, goodput_between, payload_slice, App, PairAccess, PairHost,
    TernNode, Transfer, VerifyingReceiver, CLIENT_ADDR, SERVER_ADDR,
};
use tern_sim::{LinkConfig, Simulation};

const RATE: u64 = 100_000_000;
const ONE_WAY: Duration = Duration::from_millis(10);

struct Run {
    goodput: f64,
    client: ConnectionStats,
    server: ConnectionStats,
}

fn run(size: u64, configure: fn(&mut EndpointConfig)) -> Run {
    let mut link = LinkConfig::new(RATE, ONE_WAY);
    link.queue_limit_bytes = 250_000;
    let mut t = Transfer::new(tern_sim::seed_from_env(7), link, vec![size]);
    t.configure = configure;
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(60))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), size);
    let last_byte = server.timeline.last().expect("data arrived").0;
    let goodput = goodput_between(&server.timeline, start + Duration::from_secs(1), last_byte);
    let stats = |ep: &tern_proto::Endpoint| {
        ep.connection(ConnectionHandle(0))
            .expect("connection kept")
            .stats()
    };
    Run {
        goodput,
        client: stats(&sim.client().endpoint),
        server: stats(&sim.server().endpoint),
    }
}

#[test]
fn fewer_acks_at_high_rate_and_the_same_throughput() {
    let every_two = run(40_000_000, |c| c.connection.max_ack_threshold = 2);
    let asked = run(40_000_000, |_| {});
    for (name, r) in [("threshold 2", &every_two), ("AckFrequency", &asked)] {
        eprintln!(
            "{name}: {:.1} Mbit/s after 1 s; {} data packets, {} ACK-only packets back \
             ({:.1} per ACK); receiver acknowledges every {} (asked {})",
            r.goodput / 1e6,
            r.client.datagrams_sent,
            r.server.ack_only_sent,
            r.client.datagrams_sent as f64 / r.server.ack_only_sent.max(1) as f64,
            r.server.ack_threshold,
            r.client.ack_threshold_requested,
        );
    }
    assert_eq!(every_two.server.ack_threshold, 2);
    assert!(every_two.server.ack_only_sent * 3 > every_two.client.datagrams_sent);
    assert_eq!(asked.client.ack_threshold_requested, 10);
    assert_eq!(asked.server.ack_threshold, 10);
    assert!(asked.server.ack_only_sent * 6 < asked.client.datagrams_sent);
    assert!(asked.goodput >= 0.9 * RATE as f64, "{}", asked.goodput);
    assert!(asked.goodput >= 0.98 * every_two.goodput);
}

/// Writes `size` bytes on one flow and keeps it open (a stream that pauses), then notes when
/// everything it sent is acknowledged.
struct PausingWriter {
    server: SocketAddr,
    key: PublicKey,
    size: u64,
    conn: Option<ConnectionHandle>,
    flow: Option<FlowId>,
    written: u64,
    all_acked_at: Option<Instant>,
}

impl App for PausingWriter {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let Some(conn) = established(&mut self.conn, ep, now, self.server, self.key) else {
            return;
        };
        let flow = *self
            .flow
            .get_or_insert_with(|| conn.open_flow(Dir::Uni).unwrap());
        while self.written < self.size {
            let n = ((self.size - self.written) as usize).min(64 << 10);
            match conn.write_bytes(flow, payload_slice(0, self.written, n)) {
                Ok(k) => self.written += k as u64,
                Err(_) => break,
            }
        }
        if self.written == self.size
            && self.all_acked_at.is_none()
            && conn.stats().bytes_in_flight == 0
        {
            self.all_acked_at = Some(now);
        }
    }
    fn on_event(&mut self, _: Instant, _: &mut Endpoint, _: ConnectionHandle, _: Event) {}
    fn is_done(&self) -> bool {
        self.all_acked_at.is_some()
    }
}

#[test]
fn the_last_packet_before_a_pause_is_acknowledged_at_once() {
    let seed = tern_sim::seed_from_env(7);
    let mut sim = Simulation::new(seed);
    let now = sim.now();
    let (c, s): (SocketAddr, SocketAddr) =
        (CLIENT_ADDR.parse().unwrap(), SERVER_ADDR.parse().unwrap());
    let server = Endpoint::new(endpoint_config(seed, true), now);
    let writer = PausingWriter {
        server: s,
        key: server.public_key(),
        // Enough for the congestion window, and so the threshold, to grow.
        size: 5_000_000,
        conn: None,
        flow: None,
        written: 0,
        all_acked_at: None,
    };
    let mut reader = VerifyingReceiver::new(1);
    reader.record_timeline = true;
    let client = TernNode::new(Endpoint::new(endpoint_config(seed, false), now), c, writer);
    let server = TernNode::new(server, s, reader);
    let mut link = LinkConfig::new(RATE, ONE_WAY);
    link.queue_limit_bytes = 250_000;
    let ch = sim.add_host(PairHost::Client(client), &[c.ip()]);
    let sh = sim.add_host(PairHost::<PausingWriter>::Server(server), &[s.ip()]);
    sim.add_link(c.ip(), s.ip(), link.clone());
    sim.add_link(s.ip(), c.ip(), link);
    sim.run_until(now + Duration::from_secs(10));
    let (PairHost::Client(client), PairHost::Server(server)) = (sim.node(ch), sim.node(sh)) else {
        unreachable!("hosts in the order added");
    };
    assert_eq!(server.app.total(), 5_000_000);
    assert_eq!(server.app.corrupt, None);
    let last_byte = server.app.timeline.last().expect("data arrived").0;
    let acked = client.app.all_acked_at.expect("everything acknowledged");
    let threshold = server
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection open")
        .stats()
        .ack_threshold;
    let lag = acked.saturating_duration_since(last_byte);
    eprintln!(
        "last byte to all acknowledged: {lag:?} (one-way {ONE_WAY:?}); threshold {threshold}"
    );
    assert!(threshold > 2);
    // Without the AckRequest on the last packet its ACK would wait max_ack_delay (10 ms).
    assert!(lag < ONE_WAY + Duration::from_millis(3), "{lag:?}");
}
