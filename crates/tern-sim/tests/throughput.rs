//! Link utilisation of a single bulk flow (issue: ≥ 90 % of a 50 Mbit/s, 40 ms link after the
//! first second with NewReno and CUBIC; ≥ 50 % with CUBIC at 1 % random loss).

use std::sync::Arc;
use std::time::Duration;

use tern_proto::cc::{CubicConfig, NewRenoConfig};
use tern_proto::EndpointConfig;
use tern_sim::tern::{goodput_between, PairAccess, Transfer};
use tern_sim::{LinkConfig, LossModel};

const RATE: u64 = 50_000_000;
const SIZE: u64 = 10_000_000;

fn link(loss: f64) -> LinkConfig {
    let mut l = LinkConfig::new(RATE, Duration::from_millis(20));
    // One bandwidth-delay product of buffer (50 Mbit/s × 40 ms = 250 kB).
    l.queue_limit_bytes = 250_000;
    if loss > 0.0 {
        l.loss = LossModel::Random(loss);
    }
    l
}

/// Returns (utilisation after the first second, completion time).
fn run(seed: u64, loss: f64, configure: fn(&mut EndpointConfig)) -> (f64, Duration) {
    let mut t = Transfer::new(seed, link(loss), vec![SIZE]);
    // ACKs travel on a clean reverse path; the loss under test is on the data path.
    t.downlink = link(0.0);
    t.configure = configure;
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(60))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), SIZE);
    let end = server.timeline.last().expect("data arrived").0;
    let from = start + Duration::from_secs(1);
    let goodput = goodput_between(&server.timeline, from, end);
    eprintln!(
        "seed {seed} loss {loss}: goodput after 1 s {:.1} Mbit/s ({:.1} %), completed in {took:?}; {:?}",
        goodput / 1e6,
        100.0 * goodput / RATE as f64,
        sim.client().endpoint.connection(tern_proto::ConnectionHandle(0)).map(|c| c.stats()),
    );
    (goodput / RATE as f64, took)
}

fn new_reno(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(NewRenoConfig::default());
}

fn cubic(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(CubicConfig::default());
}

#[test]
fn new_reno_fills_a_clean_link() {
    let (u, _) = run(1, 0.0, new_reno);
    assert!(u >= 0.90, "NewReno reached {:.1} % of the link", 100.0 * u);
}

#[test]
fn cubic_fills_a_clean_link() {
    let (u, _) = run(1, 0.0, cubic);
    assert!(u >= 0.90, "CUBIC reached {:.1} % of the link", 100.0 * u);
}

#[test]
fn cubic_keeps_half_the_link_at_one_percent_loss() {
    for seed in 1..=3 {
        let (u, _) = run(seed, 0.01, cubic);
        assert!(
            u >= 0.50,
            "CUBIC at 1 % loss reached {:.1} % (seed {seed})",
            100.0 * u
        );
    }
}
