//! UDT's DAIMD controller (`tern_proto::cc::Udt`) on a single bulk flow over a 50 Mbit/s,
//! 40 ms link with one bandwidth-delay product of drop-tail buffer: utilisation after the first
//! second on a clean link, and what it keeps at 1 % random loss.

use std::sync::Arc;
use std::time::Duration;

use tern_proto::cc::UdtConfig;
use tern_proto::EndpointConfig;
use tern_sim::tern::{goodput_between, PairAccess, Transfer};
use tern_sim::{LinkConfig, LossModel};

const RATE: u64 = 50_000_000;
/// 30 MB: about five seconds at the link rate, so that "after the first second" is most of the
/// transfer.
const SIZE: u64 = 30_000_000;

fn link(loss: f64) -> LinkConfig {
    let mut l = LinkConfig::new(RATE, Duration::from_millis(20));
    l.queue_limit_bytes = 250_000;
    if loss > 0.0 {
        l.loss = LossModel::Random(loss);
    }
    l
}

fn udt(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(UdtConfig::default());
}

/// Returns the utilisation after the first second.
fn run(seed: u64, loss: f64) -> f64 {
    let mut t = Transfer::new(seed, link(loss), vec![SIZE]);
    t.downlink = link(0.0);
    t.configure = udt;
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(300))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), SIZE);
    let end = server.timeline.last().expect("data arrived").0;
    let goodput = goodput_between(&server.timeline, start + Duration::from_secs(1), end);
    let stats = sim
        .client()
        .endpoint
        .connection(tern_proto::ConnectionHandle(0))
        .map(|c| c.stats());
    eprintln!(
        "udt seed {seed} loss {loss}: goodput after 1 s {:.1} Mbit/s ({:.1} %), completed in \
         {took:?}; {stats:?}",
        goodput / 1e6,
        100.0 * goodput / RATE as f64,
    );
    goodput / RATE as f64
}

#[test]
fn udt_fills_a_clean_link() {
    let u = run(1, 0.0);
    assert!(u >= 0.90, "UDT reached {:.1} % of the link", 100.0 * u);
}

/// UDT reads every loss epoch as congestion (a 1/9 decrease per epoch, at 1 % loss about one
/// per lost packet at these rates) and, without a packet-pair capacity estimate, its `B` is the
/// delivery rate it saw when the first random loss ended slow start; below the rate of its last
/// decrease the increase is capped at the `B / 9` step. The measured result is a collapse to
/// about 1 Mbit/s (under 2 % of the link, seeds 1–3), which this test pins down so that a
/// change shows up; it is UDT's known weakness on lossy links, not a tern bug.
#[test]
fn udt_at_one_percent_loss() {
    for seed in 1..=3 {
        let u = run(seed, 0.01);
        assert!(
            u >= 0.01,
            "seed {seed}: UDT at 1 % loss reached {:.1} %",
            100.0 * u
        );
    }
}
