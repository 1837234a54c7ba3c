//! The explicit-rate controller (F12, docs/PROTOCOL.md §13) over a simulated bottleneck. The
//! router module that computes rates is written elsewhere; here a model router at the
//! sender's edge stamps a fixed share into every client datagram with
//! `wire::lower_feedback_rate`, through a [`Node`] wrapper (the harness's own interface), and
//! the bottleneck is an ordinary `tern-sim` link.
//!
//! `cargo test -p tern-sim --test explicit_rate -- --nocapture` prints the figures.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tern_proto::cc::Algorithm;
use tern_proto::{wire, ConnectionHandle, Endpoint, RateSource};
use tern_sim::tern::{
    endpoint_config, goodput_between, BulkSender, PairHost, TernNode, VerifyingReceiver,
    CLIENT_ADDR, SERVER_ADDR,
};
use tern_sim::{Datagram, LinkConfig, Node, Simulation};

const RATE: u64 = 10_000_000;
const SIZE: u64 = 4_000_000;

/// A host whose outgoing datagrams pass a model router that lowers their feedback rate to
/// `stamp` kbit/s (`None`: no router).
struct Stamped {
    host: PairHost,
    stamp: Option<u32>,
}

impl Node for Stamped {
    fn handle(&mut self, now: Instant, d: Datagram) {
        self.host.handle(now, d);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        let mut d = self.host.poll_transmit(now)?;
        if let Some(kbps) = self.stamp {
            wire::lower_feedback_rate(&mut d.data, 8, kbps);
        }
        Some(d)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.host.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.host.handle_timeout(now);
    }
    fn is_done(&self) -> bool {
        self.host.is_done()
    }
}

struct Outcome {
    /// bit/s, from half a second after the first byte to the last.
    goodput: f64,
    queue_drops: u64,
    /// Smoothed RTT over min RTT at the end of the transfer.
    rtt_ratio: f64,
    feedback: Option<u64>,
    source: Option<RateSource>,
}

/// One transfer of [`SIZE`] over a 10 Mbit/s, 40 ms RTT path with a one-BDP buffer.
fn run(seed: u64, algorithm: Algorithm, stamp: Option<u32>) -> Outcome {
    let mut sim: Simulation<Stamped> = Simulation::new(seed);
    let now = sim.now();
    let c: SocketAddr = CLIENT_ADDR.parse().expect("valid");
    let s: SocketAddr = SERVER_ADDR.parse().expect("valid");
    let mut client_cfg = endpoint_config(seed, false);
    client_cfg.connection.congestion = algorithm.factory();
    let server_ep = Endpoint::new(endpoint_config(seed, true), now);
    let key = Some(server_ep.public_key());
    let client = TernNode::new(
        Endpoint::new(client_cfg, now),
        c,
        BulkSender::new(s, key, vec![SIZE]),
    );
    let mut rx = VerifyingReceiver::new(1);
    rx.record_timeline = true;
    let server = TernNode::new(server_ep, s, rx);
    let client_host = sim.add_host(
        Stamped {
            host: PairHost::Client(client),
            stamp,
        },
        &[c.ip()],
    );
    let server_host = sim.add_host(
        Stamped {
            host: PairHost::Server(server),
            stamp: None,
        },
        &[s.ip()],
    );
    let mut up = LinkConfig::new(RATE, Duration::from_millis(20));
    up.queue_limit_bytes = 50_000;
    let uplink = sim.add_link(c.ip(), s.ip(), up);
    sim.add_link(
        s.ip(),
        c.ip(),
        LinkConfig::new(RATE, Duration::from_millis(20)),
    );
    let start = sim.now();
    if let Err(e) = sim.run_until_done(start + Duration::from_secs(60)) {
        panic!("transfer did not complete (seed {seed}): {e:?}");
    }
    let Stamped {
        host: PairHost::Server(server),
        ..
    } = sim.node(server_host)
    else {
        unreachable!("the server host")
    };
    assert_eq!(server.app.corrupt, None);
    assert_eq!(server.app.total(), SIZE);
    let timeline = &server.app.timeline;
    let (first, last) = (timeline[0].0, timeline[timeline.len() - 1].0);
    let goodput = goodput_between(timeline, first + Duration::from_millis(500), last);
    let Stamped {
        host: PairHost::Client(client),
        ..
    } = sim.node(client_host)
    else {
        unreachable!("the client host")
    };
    let conn = client
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection kept");
    let stats = conn.stats();
    Outcome {
        goodput,
        queue_drops: sim.link(uplink).stats().dropped_queue,
        rtt_ratio: stats.rtt.as_secs_f64() / stats.min_rtt.as_secs_f64().max(1e-9),
        feedback: stats.feedback_rate,
        source: conn.target_rate().map(|t| t.source),
    }
}

#[test]
fn a_stamped_flow_runs_at_its_share_without_a_queue() {
    let cubic = run(1, Algorithm::Cubic, None);
    let explicit = run(1, Algorithm::Explicit, Some(8_000));
    eprintln!(
        "cubic: {:.2} Mbit/s, {} queue drops, srtt/min {:.2}; explicit at 8 Mbit/s: {:.2} \
         Mbit/s, {} queue drops, srtt/min {:.2}",
        cubic.goodput * 1e-6,
        cubic.queue_drops,
        cubic.rtt_ratio,
        explicit.goodput * 1e-6,
        explicit.queue_drops,
        explicit.rtt_ratio
    );
    assert_eq!(explicit.feedback, Some(1_000_000));
    assert_eq!(explicit.source, Some(RateSource::Router));
    // At the share, less headers (and start-up), with no queue and nothing dropped.
    assert!(
        (7.0e6..=8.0e6).contains(&explicit.goodput),
        "{}",
        explicit.goodput
    );
    assert_eq!(explicit.queue_drops, 0);
    assert!(explicit.rtt_ratio < 1.1, "{}", explicit.rtt_ratio);
}

#[test]
fn without_a_router_the_explicit_controller_is_cubic() {
    let explicit = run(2, Algorithm::Explicit, None);
    eprintln!(
        "explicit without a router: {:.2} Mbit/s",
        explicit.goodput * 1e-6
    );
    assert_eq!(explicit.feedback, None);
    assert_eq!(explicit.source, Some(RateSource::Controller));
    assert!(explicit.goodput >= 0.85 * RATE as f64);
}
