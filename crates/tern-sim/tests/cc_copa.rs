//! Copa (`tern_proto::cc::Copa`) on a single bulk flow over a 50 Mbit/s, 40 ms link with one
//! bandwidth-delay product of drop-tail buffer: utilisation after the first second, behaviour at
//! 1 % random loss, and the queueing delay it keeps compared with CUBIC's on the same link.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tern_proto::cc::{CopaConfig, CubicConfig};
use tern_proto::EndpointConfig;
use tern_sim::tern::{goodput_between, PairAccess, Transfer, CLIENT_ADDR, SERVER_ADDR};
use tern_sim::{LinkConfig, LossModel};

const RATE: u64 = 50_000_000;
/// 30 MB: about five seconds at the link rate.
const SIZE: u64 = 30_000_000;

fn link(loss: f64) -> LinkConfig {
    let mut l = LinkConfig::new(RATE, Duration::from_millis(20));
    l.queue_limit_bytes = 250_000;
    if loss > 0.0 {
        l.loss = LossModel::Random(loss);
    }
    l
}

fn copa(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(CopaConfig::default());
}

fn cubic(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(CubicConfig::default());
}

#[derive(Debug)]
struct Outcome {
    /// Goodput after the first second / link rate.
    utilisation: f64,
    /// Time-weighted mean of the bottleneck queue after the first second, as delay.
    mean_queue: Duration,
    /// Largest bottleneck queue after the first second, as delay.
    max_queue: Duration,
}

fn run(name: &str, seed: u64, loss: f64, configure: fn(&mut EndpointConfig)) -> Outcome {
    let mut t = Transfer::new(seed, link(loss), vec![SIZE]);
    t.downlink = link(0.0);
    t.configure = configure;
    t.timeline = true;
    let mut sim = t.build();
    let c = CLIENT_ADDR.parse::<SocketAddr>().expect("valid").ip();
    let s = SERVER_ADDR.parse::<SocketAddr>().expect("valid").ip();
    let uplink = sim.link_between(c, s).expect("uplink");
    sim.link_mut(uplink).set_queue_trace(true);
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(300))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), SIZE);
    let end = server.timeline.last().expect("data arrived").0;
    let from = start + Duration::from_secs(1);
    let goodput = goodput_between(&server.timeline, from, end);

    // Time-weighted queue over [from, end]; the trace is a step function of bytes queued.
    let epoch = sim.epoch();
    let (lo, hi) = (from - epoch, end - epoch);
    let trace = sim.link(uplink).queue_trace();
    let (mut area, mut max, mut prev_t, mut prev_b) = (0.0, 0usize, lo, 0usize);
    for &(at, bytes) in trace {
        if at <= lo {
            prev_b = bytes;
            continue;
        }
        let at = at.min(hi);
        area += (at - prev_t).as_secs_f64() * prev_b as f64;
        max = max.max(prev_b);
        prev_t = at;
        prev_b = bytes;
        if at >= hi {
            break;
        }
    }
    let span = (hi - lo).as_secs_f64().max(1e-9);
    let as_delay = |bytes: f64| Duration::from_secs_f64(bytes * 8.0 / RATE as f64);
    let outcome = Outcome {
        utilisation: goodput / RATE as f64,
        mean_queue: as_delay(area / span),
        max_queue: as_delay(max as f64),
    };
    let stats = sim
        .client()
        .endpoint
        .connection(tern_proto::ConnectionHandle(0))
        .map(|c| c.stats());
    eprintln!(
        "{name} seed {seed} loss {loss}: goodput after 1 s {:.1} Mbit/s ({:.1} %), mean queue \
         {:?}, max queue {:?}, completed in {took:?}; {stats:?}",
        goodput / 1e6,
        100.0 * outcome.utilisation,
        outcome.mean_queue,
        outcome.max_queue,
    );
    outcome
}

/// Copa with δ = 0.1 (1/δ = 10 packets of target queue per flow).
fn copa_tenth(c: &mut EndpointConfig) {
    c.connection.congestion = Arc::new(CopaConfig::default().delta(0.1));
}

/// The paper's default δ = 0.5 aims at a queue of 1/δ = 2 packets, 0.46 ms at 50 Mbit/s. At
/// this rate tern's peer ACKs every 10 packets, so the window opens 10 packets at a time and
/// they leave back to back (the pacer's bucket holds 10): the packet whose RTT is sampled has
/// queued ~2 ms behind the others even while the link idles between bursts, and Copa settles
/// at about 0.75 BDP. Measured: 68.1 % of the link after the first second (seed 1), mean queue
/// 0.9 ms. This test pins that figure; with 1/δ at least the burst size (δ = 0.1, next test)
/// Copa fills the link. See the "burst floor" section of `tern_proto::cc::copa`.
#[test]
fn copa_default_delta_on_a_clean_link() {
    let o = run("copa", 1, 0.0, copa);
    assert!(
        o.utilisation >= 0.60,
        "Copa (δ = 0.5) reached {:.1} % of the link",
        100.0 * o.utilisation
    );
}

#[test]
fn copa_delta_tenth_fills_a_clean_link() {
    let o = run("copa δ=0.1", 1, 0.0, copa_tenth);
    assert!(
        o.utilisation >= 0.90,
        "Copa (δ = 0.1) reached {:.1} % of the link",
        100.0 * o.utilisation
    );
}

#[test]
fn copa_keeps_a_smaller_queue_than_cubic() {
    let cubic = run("cubic", 1, 0.0, cubic);
    for (name, configure) in [
        ("copa", copa as fn(&mut EndpointConfig)),
        ("copa δ=0.1", copa_tenth),
    ] {
        let copa = run(name, 1, 0.0, configure);
        assert!(
            copa.mean_queue.mul_f64(3.0) < cubic.mean_queue,
            "{name}: mean queue {:?}, CUBIC's {:?}",
            copa.mean_queue,
            cubic.mean_queue
        );
        assert!(copa.max_queue < cubic.max_queue);
    }
}

/// Copa ignores random loss (only its delay signal moves the window): the figures at 1 % loss
/// stay close to the clean link's.
#[test]
fn copa_at_one_percent_loss() {
    for seed in 1..=3 {
        let o = run("copa", seed, 0.01, copa);
        assert!(
            o.utilisation >= 0.5,
            "seed {seed}: Copa at 1 % loss reached {:.1} %",
            100.0 * o.utilisation
        );
        let o = run("copa δ=0.1", seed, 0.01, copa_tenth);
        assert!(
            o.utilisation >= 0.85,
            "seed {seed}: Copa (δ = 0.1) at 1 % loss reached {:.1} %",
            100.0 * o.utilisation
        );
    }
}
