//! The embedded demo: tern transfers over simulated mobile-edge links, in virtual time.
//!
//! For each link profile of DESIGN.md §3 (5G, LTE, Wi-Fi), with and without 1 % random loss,
//! a client opens one encrypted connection (Noise IK, data in the first flight) and sends
//! 4 MB on four concurrent flows; the server checks every byte. Prints completion time,
//! goodput and the protocol's own counters. Deterministic: `TERN_SEED=n` replays a run.
//!
//! Run: `cargo run --release -p tern-sim --example demo`

use std::time::Duration;

use tern_proto::ConnectionHandle;
use tern_sim::tern::{PairAccess, Transfer};
use tern_sim::{LinkConfig, LossModel};

fn main() {
    let seed = tern_sim::seed_from_env(1);
    println!("tern over simulated mobile-edge links (4 flows x 1 MB, encrypted, seed {seed})\n");
    println!(
        "{:<8} {:>5} {:>10} {:>12} {:>11} {:>8} {:>7} {:>9}",
        "profile", "loss", "rate", "completion", "goodput", "srtt", "lost", "resent"
    );
    #[allow(clippy::disallowed_methods)] // wall-clock report of the simulator itself
    let wall = std::time::Instant::now();
    let profiles: [(&str, LinkConfig, LinkConfig); 3] = [
        ("5g", LinkConfig::fiveg(), LinkConfig::fiveg()),
        ("lte", LinkConfig::lte(), LinkConfig::lte()),
        ("wifi", LinkConfig::wifi(), LinkConfig::wifi()),
    ];
    for (name, up, down) in profiles {
        for loss in [0.0, 0.01] {
            let mut up = up.clone();
            if loss > 0.0 {
                up.loss = LossModel::Random(loss);
            }
            let mut t = Transfer::new(seed, up.clone(), vec![1_000_000; 4]);
            t.downlink = down.clone();
            let mut sim = t.build();
            let start = sim.now();
            let took = match sim.run_until_done(start + Duration::from_secs(120)) {
                Ok(d) => d,
                Err(e) => {
                    println!("{name:<8} {:>4.0}% failed: {e}", loss * 100.0);
                    continue;
                }
            };
            let server = &sim.server().app;
            assert_eq!(
                server.corrupt, None,
                "delivered bytes differ from those sent"
            );
            let stats = sim
                .client()
                .endpoint
                .connection(ConnectionHandle(0))
                .map(|c| c.stats())
                .unwrap_or_default();
            let goodput = server.total() as f64 * 8.0 / took.as_secs_f64() / 1e6;
            println!(
                "{name:<8} {:>4.0}% {:>6.0} Mb/s {:>9.0} ms {:>6.1} Mb/s {:>6.1?} {:>7} {:>6} kB",
                loss * 100.0,
                up.rate_bps.unwrap_or(0) as f64 / 1e6,
                took.as_secs_f64() * 1000.0,
                goodput,
                stats.rtt,
                stats.packets_lost,
                stats.bytes_retransmitted / 1000,
            );
        }
    }
    println!(
        "\nall bytes verified; simulated in {:.2?} of wall time",
        wall.elapsed()
    );
}
