//! BBR (v3 semantics) in the simulator: link utilisation of one bulk flow on a clean and on a
//! lossy 50 Mbit/s, 40 ms link, and the share two BBR flows get of one bottleneck.
//!
//! Run with `cargo test --release -p tern-sim --test cc_bbr -- --nocapture` to see the figures.

use std::sync::Arc;
use std::time::Duration;

use tern_proto::cc::BbrConfig;
use tern_proto::{ConnectionHandle, EndpointConfig};
use tern_sim::tern::{
    goodput_between, jain_index, Competitor, PairAccess, SharedBottleneck, Transfer,
};
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

fn bbr(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(BbrConfig::default());
}

/// Returns the utilisation after the first second of a transfer of `size` bytes.
fn run(seed: u64, loss: f64, size: u64) -> f64 {
    let seed = tern_sim::seed_from_env(seed);
    let mut t = Transfer::new(seed, link(loss), vec![size]);
    // ACKs travel on a clean reverse path; the loss under test is on the data path.
    t.downlink = link(0.0);
    t.configure = bbr;
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(60))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), size);
    let end = server.timeline.last().expect("data arrived").0;
    let from = start + Duration::from_secs(1);
    let goodput = goodput_between(&server.timeline, from, end);
    let conn = sim.client().endpoint.connection(ConnectionHandle(0));
    eprintln!(
        "BBR seed {seed} loss {loss}, {} MB: goodput after 1 s {:.1} Mbit/s ({:.1} %), completed in \
         {took:?}; {:?}",
        size / 1_000_000,
        goodput / 1e6,
        100.0 * goodput / RATE as f64,
        conn.map(|c| c.stats()),
    );
    goodput / RATE as f64
}

#[test]
fn bbr_fills_a_clean_link() {
    let u = run(1, 0.0, SIZE);
    assert!(u >= 0.90, "BBR reached {:.1} % of the link", 100.0 * u);
}

/// Long enough (about 10 s) for ProbeBW cycles and a ProbeRTT.
#[test]
fn bbr_keeps_a_clean_link_full_in_steady_state() {
    let u = run(1, 0.0, 6 * SIZE);
    assert!(u >= 0.90, "BBR reached {:.1} % of the link", 100.0 * u);
}

#[test]
fn bbr_keeps_most_of_the_link_at_one_percent_loss() {
    for seed in 1..=3 {
        let u = run(seed, 0.01, SIZE);
        assert!(
            u >= 0.70,
            "BBR at 1 % loss reached {:.1} % (seed {seed})",
            100.0 * u
        );
    }
}

#[test]
fn bbr_keeps_most_of_the_link_at_one_percent_loss_in_steady_state() {
    for seed in 1..=3 {
        let u = run(seed, 0.01, 6 * SIZE);
        assert!(
            u >= 0.70,
            "BBR at 1 % loss reached {:.1} % (seed {seed})",
            100.0 * u
        );
    }
}

/// Two BBR bulk flows, the second starting `stagger` after the first, over one 50 Mbit/s,
/// 40 ms bottleneck; returns each flow's goodput (bit/s) from `measure_from` to `until`.
/// With `BBR_DEBUG` set, prints both flows' goodput every 2 s.
fn share(seed: u64, stagger: Duration, measure_from: Duration, until: Duration) -> Vec<f64> {
    let flow = |start| Competitor {
        // Large enough never to finish within the run.
        size: 1 << 30,
        configure: bbr,
        start,
    };
    let setup = SharedBottleneck {
        seed,
        bottleneck: link(0.0),
        reverse: link(0.0),
        flows: vec![flow(Duration::ZERO), flow(stagger)],
    };
    let mut sim = setup.build();
    let now = sim.now();
    sim.run_until(now + until);
    let timeline = |i| &SharedBottleneck::receiver(&sim, i).app.timeline;
    if std::env::var("BBR_DEBUG").is_ok() {
        let mut t = Duration::ZERO;
        while t < until {
            let (a, b) = (now + t, now + t + Duration::from_secs(2));
            let g: Vec<String> = (0..2)
                .map(|i| format!("{:5.1}", goodput_between(timeline(i), a, b) / 1e6))
                .collect();
            eprintln!("  {t:?}: {}", g.join(" "));
            t += Duration::from_secs(2);
        }
    }
    (0..2)
        .map(|i| {
            assert_eq!(SharedBottleneck::receiver(&sim, i).app.corrupt, None);
            goodput_between(timeline(i), now + measure_from, now + until)
        })
        .collect()
}

#[test]
fn two_bbr_flows_share_a_bottleneck() {
    // Started together, the flows share within Jain's 0.95 from the start.
    let seed = tern_sim::seed_from_env(1);
    let g = share(
        seed,
        Duration::ZERO,
        Duration::from_secs(10),
        Duration::from_secs(30),
    );
    let index = jain_index(&g);
    eprintln!(
        "two BBR flows started together (seed {seed}), 10s..30s: {:.1} and {:.1} Mbit/s, \
         {:.1} % of the link together, Jain's index {index:.3}",
        g[0] / 1e6,
        g[1] / 1e6,
        100.0 * g.iter().sum::<f64>() / RATE as f64,
    );
    assert!(index >= 0.95, "Jain's index {index:.3} (seed {seed})");
}

#[test]
fn a_late_bbr_flow_usually_catches_up() {
    // Started 1-5 s apart, the late flow catches up only gradually (BBR has no window halving
    // to hand a newcomer its share; its probing shifts the shares a little per cycle), and
    // where it ends up depends on how the two flows' probing cycles and ProbeRTTs fall: over
    // 60-80 s most staggers share within Jain's 0.95, but now and then one sits near 34 / 13
    // Mbit/s (0.84), and which stagger does moves with any change in the timing of events (it
    // was 5 s, then 2 s after flow data started to be read in larger chunks). One trajectory
    // cannot tell, so this holds the set: the median at 0.95, the worst at 0.80. The slow
    // convergence is a known shortfall of this BBR, recorded in the controller issue.
    let seed = tern_sim::seed_from_env(2);
    let mut indices = Vec::new();
    for ms in [1000, 1500, 2000, 2500, 3000, 4000, 5000] {
        let g = share(
            seed,
            Duration::from_millis(ms),
            Duration::from_secs(60),
            Duration::from_secs(80),
        );
        let index = jain_index(&g);
        eprintln!(
            "two BBR flows (seed {seed}, second starts after {ms} ms), 60s..80s: {:.1} and \
             {:.1} Mbit/s, {:.1} % of the link together, Jain's index {index:.3}",
            g[0] / 1e6,
            g[1] / 1e6,
            100.0 * g.iter().sum::<f64>() / RATE as f64,
        );
        indices.push(index);
    }
    indices.sort_by(f64::total_cmp);
    let (worst, median) = (indices[0], indices[indices.len() / 2]);
    assert!(
        median >= 0.95,
        "median Jain's index {median:.3}: {indices:?}"
    );
    assert!(worst >= 0.80, "worst Jain's index {worst:.3}: {indices:?}");
}
