//! End-to-end behaviour of the simulator with small test nodes: rates, delays, determinism,
//! scripted incidents, address changes, stall detection.

mod common;

use std::time::{Duration, Instant};

use common::{addr, ip, Peer};
use tern_sim::{
    seed_from_env, Datagram, LinkConfig, LossModel, Node, Recorder, RunOutcome, SimError,
    Simulation,
};

/// Source at 10.0.0.1 sending to a sink at 10.0.0.2 over `forward`, acks back over `back`.
/// `source` builds the source from the simulation's epoch.
fn pair(
    seed: u64,
    source: impl FnOnce(Instant) -> Peer,
    forward: LinkConfig,
    back: LinkConfig,
) -> Simulation<Peer> {
    let mut sim = Simulation::new(seed);
    let source = source(sim.epoch());
    let mut sink = Peer::sink(addr(2));
    sink.log = true;
    sink.ack = true;
    sim.add_host(source, &[ip(1)]);
    sim.add_host(sink, &[ip(2)]);
    sim.add_link(ip(1), ip(2), forward);
    sim.add_link(ip(2), ip(1), back);
    sim
}

/// Delivered rate measured at the sink from the spacing of arrivals of a saturating source.
fn measured_rate(sim: &Simulation<Peer>, sink: usize) -> f64 {
    let arrivals = &sim.node(sim.hosts().nth(sink).unwrap()).arrivals;
    assert!(arrivals.len() > 100);
    // Skip the first arrival: the rate is the bytes after it over the time after it.
    let (t0, _, _) = arrivals[0];
    let (t1, _, _) = *arrivals.last().unwrap();
    let bytes: usize = arrivals[1..].iter().map(|&(_, _, len)| len).sum();
    bytes as f64 * 8.0 / (t1 - t0).as_secs_f64()
}

#[test]
fn saturated_link_delivers_configured_rate() {
    let seed = seed_from_env(1);
    for (rate, size) in [
        (10_000_000u64, 1200usize),
        (100_000_000, 1452),
        (7_777_777, 1000),
    ] {
        // The source offers twice the link rate; the drop-tail queue sheds the excess, so the
        // link is never idle and what comes out is the link rate.
        let interval = Peer::interval_for(rate, size) / 2;
        let count = (Duration::from_secs(5).as_nanos() / interval.as_nanos()) as u64;
        let source = |epoch| Peer::source(addr(1), addr(2), epoch, interval, size, count);
        let forward = LinkConfig::new(rate, Duration::from_millis(20)).with_queue_limit(30_000);
        let mut sim = pair(seed, source, forward, LinkConfig::ideal());
        sim.run_for(Duration::from_secs(6));
        let got = measured_rate(&sim, 1);
        let err = (got - rate as f64).abs() / rate as f64;
        assert!(
            err < 0.01,
            "rate {rate}: measured {got:.0} ({:.3} %)",
            err * 100.0
        );
        let link = sim.link(sim.link_between(ip(1), ip(2)).unwrap()).stats();
        assert!(
            link.dropped_queue > count / 3,
            "the queue should have shed the excess"
        );
        println!("{}", sim.summary());
    }
}

#[test]
fn rate_holds_with_jitter_and_loss() {
    let seed = seed_from_env(2);
    let rate = 20_000_000;
    let interval = Peer::interval_for(rate, 1000) / 2;
    let count = (Duration::from_secs(5).as_nanos() / interval.as_nanos()) as u64;
    let forward = LinkConfig::new(rate, Duration::from_millis(10))
        .with_jitter(Duration::from_millis(2))
        .with_loss(LossModel::Random(0.02))
        .with_queue_limit(50_000);
    let source = |epoch| Peer::source(addr(1), addr(2), epoch, interval, 1000, count);
    let mut sim = pair(seed, source, forward, LinkConfig::ideal());
    let epoch = sim.epoch();
    let sink = sim.hosts().nth(1).unwrap();
    let ab = sim.link_between(ip(1), ip(2)).unwrap();
    let recorder = Recorder::new();
    sim.node_mut(sink).recorder = Some((recorder.clone(), epoch, "goodput".into()));
    sim.link_mut(ab).set_queue_trace(true);
    sim.run_for(Duration::from_secs(6));

    let got = measured_rate(&sim, 1);
    let expect = rate as f64 * (1.0 - 0.02);
    let err = (got - expect).abs() / expect;
    assert!(err < 0.01, "measured {got:.0}, expected {expect:.0}");

    // The same figure from the recorder the sink appended to, over a steady window.
    let window = Duration::from_secs(1)..Duration::from_secs(5);
    let goodput = recorder.goodput_bps("goodput", window.clone()).unwrap();
    assert!(
        (goodput - expect).abs() / expect < 0.01,
        "recorded goodput {goodput:.0}"
    );

    // The queue stayed near its limit while the source was overloading it, and drained after.
    let trace = sim.link(ab).queue_trace();
    assert!(trace.iter().all(|&(_, bytes)| bytes <= 50_000));
    let busy: Vec<f64> = trace
        .iter()
        .filter(|&&(t, _)| window.contains(&t))
        .map(|&(_, b)| b as f64)
        .collect();
    let mean = busy.iter().sum::<f64>() / busy.len() as f64;
    assert!(mean > 45_000.0, "mean backlog {mean}");
    assert_eq!(trace.last().map(|&(_, b)| b), Some(0));
}

#[test]
fn delay_is_exact_on_an_idle_link() {
    let seed = seed_from_env(3);
    let interval = Duration::from_millis(10);
    let source = |epoch| Peer::source(addr(1), addr(2), epoch, interval, 1000, 100);
    // 1000 B at 8 Mbit/s = 1 ms of serialization, plus 25 ms of propagation.
    let forward = LinkConfig::new(8_000_000, Duration::from_millis(25));
    let mut sim = pair(seed, source, forward, LinkConfig::ideal());
    sim.run_for(Duration::from_secs(2));
    let arrivals = &sim.node(sim.hosts().nth(1).unwrap()).arrivals;
    assert_eq!(arrivals.len(), 100);
    for &(at, seq, _) in arrivals {
        let sent = sim.epoch() + interval * seq as u32;
        assert_eq!(at - sent, Duration::from_millis(26), "datagram {seq}");
    }
}

#[test]
fn jitter_spreads_delay_around_its_mean() {
    let seed = seed_from_env(4);
    let interval = Duration::from_millis(5);
    let source = |epoch| Peer::source(addr(1), addr(2), epoch, interval, 100, 2000);
    let forward = LinkConfig::ideal()
        .with_delay(Duration::from_millis(20))
        .with_jitter(Duration::from_millis(4));
    let mut sim = pair(seed, source, forward, LinkConfig::ideal());
    let epoch = sim.epoch();
    sim.run_for(Duration::from_secs(11));
    let arrivals = &sim.node(sim.hosts().nth(1).unwrap()).arrivals;
    assert_eq!(arrivals.len(), 2000);
    let delays: Vec<f64> = arrivals
        .iter()
        .map(|&(at, seq, _)| (at - (epoch + interval * seq as u32)).as_secs_f64() * 1e3)
        .collect();
    let mean = delays.iter().sum::<f64>() / delays.len() as f64;
    let min = delays.iter().copied().fold(f64::MAX, f64::min);
    let max = delays.iter().copied().fold(0.0, f64::max);
    // Datagrams 5 ms apart never catch up with each other, so the delay is uniform 20..24 ms.
    assert!(min >= 20.0 && max <= 24.0, "delay range {min}..{max} ms");
    assert!((mean - 22.0).abs() < 0.1, "mean delay {mean} ms");
    assert!(arrivals.windows(2).all(|w| w[0].1 < w[1].1), "reordered");
}

/// A lossy, jittery, reordering, duplicating scenario, reduced to what must be reproducible.
fn scenario(
    seed: u64,
    extra_link: bool,
) -> (Vec<tern_sim::LinkSummary>, Vec<(Duration, u64, usize)>) {
    let source = |epoch| {
        Peer::source(
            addr(1),
            addr(2),
            epoch,
            Duration::from_micros(250),
            1200,
            8000,
        )
    };
    let forward = LinkConfig::new(30_000_000, Duration::from_millis(15))
        .with_jitter(Duration::from_millis(3))
        .with_reorder(0.02, Duration::from_millis(4))
        .with_duplicate(0.01)
        .with_corrupt(0.01)
        .with_loss(LossModel::bursty(0.03, 3.0))
        .with_queue_limit(20_000);
    let back = LinkConfig::lte().with_loss(LossModel::Random(0.05));
    let mut sim = pair(seed, source, forward, back);
    if extra_link {
        sim.add_link(
            ip(7),
            ip(8),
            LinkConfig::lte().with_loss(LossModel::Random(0.5)),
        );
    }
    let epoch = sim.epoch();
    sim.run_for(Duration::from_secs(3));
    let arrivals = sim
        .node(sim.hosts().nth(1).unwrap())
        .arrivals
        .iter()
        .map(|&(at, seq, len)| (at - epoch, seq, len))
        .collect();
    let mut links = sim.summary().links;
    links.truncate(2);
    (links, arrivals)
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let seed = seed_from_env(5);
    let a = scenario(seed, false);
    let b = scenario(seed, false);
    assert_eq!(
        a, b,
        "same seed must reproduce counters and arrival times exactly"
    );
    let c = scenario(seed.wrapping_add(1), false);
    assert_ne!(a.0, c.0, "a different seed should draw differently");
    assert_ne!(a.1, c.1);
    // Sanity: the scenario exercises every knob.
    let s = a.0[0].stats;
    assert!(s.dropped_loss > 0 && s.dropped_queue > 0 && s.duplicated > 0 && s.corrupted > 0);
}

#[test]
fn adding_a_link_leaves_other_links_draws_alone() {
    let seed = seed_from_env(6);
    assert_eq!(scenario(seed, false), scenario(seed, true));
}

#[test]
fn address_change_rekeys_links() {
    let seed = seed_from_env(7);
    let mut sim = Simulation::new(seed);
    let epoch = sim.epoch();
    let mut source = Peer::source(addr(1), addr(2), epoch, Duration::from_millis(1), 200, 2000);
    source.log = true;
    let mut sink = Peer::sink(addr(2));
    sink.ack = true;
    let a = sim.add_host(source, &[ip(1)]);
    let b = sim.add_host(sink, &[ip(2)]);
    let (ab, ba) = sim.add_duplex(
        ip(1),
        ip(2),
        LinkConfig::new(10_000_000, Duration::from_millis(10)),
    );
    assert_eq!(sim.link_ends(ab), (ip(1), ip(2)));

    // At t = 1 s the sink's address changes and the source learns the new one at once.
    sim.schedule(epoch + Duration::from_secs(1), move |sim| {
        sim.change_address(b, ip(2), ip(3)).unwrap();
        sim.node_mut(b).me = addr(3);
        sim.node_mut(a).dst = Some(addr(3));
    });
    sim.run_for(Duration::from_millis(1500));
    assert_eq!(sim.link_ends(ab), (ip(1), ip(3)));
    assert_eq!(sim.link_ends(ba), (ip(3), ip(1)));
    assert_eq!(sim.link_between(ip(1), ip(2)), None);
    assert_eq!(sim.link_between(ip(1), ip(3)), Some(ab));
    assert_eq!(sim.owner(ip(3)), Some(b));
    assert_eq!(sim.owner(ip(2)), None);
    assert_eq!(sim.addrs(b), &[ip(3)]);

    sim.run_for(Duration::from_secs(2));
    let stats = *sim.stats();
    // Datagrams to the old address that were in flight (10 ms of them, one per ms) are lost.
    assert!((9..=11).contains(&stats.undeliverable), "{stats:?}");
    assert_eq!(stats.unroutable, 0);
    let sink = sim.node(b);
    assert_eq!(sink.received + stats.undeliverable, 2000);
    // One link carried everything, before and after the move.
    assert_eq!(sim.link(ab).stats().sent, 2000);
    assert_eq!(sim.node(a).acks_received, sink.received);

    assert_eq!(
        sim.change_address(b, ip(2), ip(4)),
        Err(SimError::NotOwner {
            host: b,
            addr: ip(2)
        })
    );
    assert_eq!(
        sim.change_address(b, ip(3), ip(1)),
        Err(SimError::AddressInUse {
            addr: ip(1),
            owner: a
        })
    );
}

#[test]
fn scheduled_link_flap_drops_while_down() {
    let seed = seed_from_env(8);
    let mut sim = Simulation::new(seed);
    let epoch = sim.epoch();
    let source = Peer::source(addr(1), addr(2), epoch, Duration::from_millis(1), 100, 3000);
    sim.add_host(source, &[ip(1)]);
    let b = sim.add_host(Peer::sink(addr(2)), &[ip(2)]);
    let ab = sim.add_link(
        ip(1),
        ip(2),
        LinkConfig::new(10_000_000, Duration::from_millis(5)),
    );
    // Sent at 1000.0 ms .. 1499.0 ms are dropped: 500 datagrams.
    sim.schedule(epoch + Duration::from_millis(1000), move |sim| {
        sim.link_mut(ab).set_up(false)
    });
    sim.schedule(epoch + Duration::from_micros(1_499_500), move |sim| {
        sim.link_mut(ab).set_up(true)
    });
    assert_eq!(sim.run_for(Duration::from_secs(4)), RunOutcome::Idle);
    assert_eq!(sim.link(ab).stats().dropped_down, 500);
    assert_eq!(sim.node(b).received, 2500);
    assert_eq!(sim.stats().actions, 2);
}

#[test]
fn unroutable_datagrams_are_counted() {
    let seed = seed_from_env(9);
    let mut sim = Simulation::new(seed);
    let epoch = sim.epoch();
    // No link from 10.0.0.1 to 10.0.0.9.
    sim.add_host(
        Peer::source(addr(1), addr(9), epoch, Duration::from_millis(1), 100, 10),
        &[ip(1)],
    );
    sim.run_for(Duration::from_secs(1));
    assert_eq!(sim.stats().unroutable, 10);
    assert_eq!(sim.stats().sent, 10);
}

#[test]
fn run_until_done_reports_completion_time_and_errors() {
    let seed = seed_from_env(10);
    let make = |count: u64, forward: LinkConfig| {
        let mut sim = Simulation::new(seed);
        let epoch = sim.epoch();
        let mut source = Peer::source(
            addr(1),
            addr(2),
            epoch,
            Duration::from_millis(1),
            1000,
            count,
        );
        source.wait_for_acks = true;
        let mut sink = Peer::sink(addr(2));
        sink.ack = true;
        sim.add_host(source, &[ip(1)]);
        sim.add_host(sink, &[ip(2)]);
        sim.add_link(ip(1), ip(2), forward);
        sim.add_link(
            ip(2),
            ip(1),
            LinkConfig::new(8_000_000, Duration::from_millis(10)),
        );
        sim
    };
    let link = LinkConfig::new(8_000_000, Duration::from_millis(10));
    // 100 datagrams, the last sent at 99 ms: 1 ms serialization + 10 ms, then the 40-byte ack:
    // 40 µs + 10 ms.
    let mut sim = make(100, link.clone());
    let took = sim
        .run_until_done(sim.epoch() + Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        took,
        Duration::from_micros(99_000 + 1_000 + 10_000 + 40 + 10_000)
    );

    let mut sim = make(100, link.clone());
    let limit = sim.epoch() + Duration::from_millis(50);
    match sim.run_until_done(limit) {
        Err(SimError::TimeLimit { limit: l, not_done }) => {
            assert_eq!(l, Duration::from_millis(50));
            assert_eq!(not_done.len(), 1);
            assert_eq!(sim.now(), limit);
        }
        other => panic!("expected a time limit error, got {other:?}"),
    }

    // Everything lost, nobody retransmits: the simulation runs dry.
    let mut sim = make(10, link.with_loss(LossModel::Random(1.0)));
    match sim.run_until_done(sim.epoch() + Duration::from_secs(10)) {
        Err(SimError::Idle { at, not_done }) => {
            assert_eq!(at, Duration::from_millis(9));
            assert_eq!(not_done.len(), 1);
        }
        other => panic!("expected an idle error, got {other:?}"),
    }
}

/// A node driven only by its timer: records when it fires and follows a plan of deadlines.
struct Clock {
    deadline: Option<Instant>,
    plan: Vec<Instant>,
    fired: Vec<Instant>,
}

impl Node for Clock {
    fn handle(&mut self, _now: Instant, _dgram: Datagram) {}
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        None
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        self.deadline
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.fired.push(now);
        self.deadline = self.plan.pop();
    }
}

#[test]
fn timers_fire_at_the_latest_requested_deadline_only() {
    let mut sim = Simulation::new(seed_from_env(11));
    let e = sim.epoch();
    let ms = Duration::from_millis;
    let h = sim.add_host(
        Clock {
            deadline: Some(e + ms(10)),
            // Popped from the back: a deadline in the past (fires at once), then 30 ms.
            plan: vec![e + ms(30), e + ms(1)],
            fired: Vec::new(),
        },
        &[],
    );
    // At 5 ms the deadline moves from 10 ms to 20 ms: 10 ms must not fire.
    sim.schedule(e + ms(5), move |sim| {
        sim.node_mut(h).deadline = Some(e + ms(20))
    });
    assert_eq!(sim.run_until(e + ms(100)), RunOutcome::Idle);
    assert_eq!(sim.node(h).fired, vec![e + ms(20), e + ms(20), e + ms(30)]);
    assert_eq!(sim.now(), e + ms(100));
    assert_eq!(sim.stats().timers, 3);
}

#[test]
fn boxed_nodes_mix_in_one_simulation() {
    let mut sim: Simulation<Box<dyn Node>> = Simulation::new(seed_from_env(12));
    let epoch = sim.epoch();
    sim.add_host(
        Box::new(Peer::source(
            addr(1),
            addr(2),
            epoch,
            Duration::from_millis(1),
            100,
            5,
        )),
        &[ip(1)],
    );
    let mut sink = Peer::sink(addr(2));
    sink.expect = 5;
    sim.add_host(Box::new(sink), &[ip(2)]);
    sim.add_link(
        ip(1),
        ip(2),
        LinkConfig::ideal().with_delay(Duration::from_millis(1)),
    );
    let took = sim.run_until_done(epoch + Duration::from_secs(1)).unwrap();
    assert_eq!(took, Duration::from_millis(5));
}

/// Asks for a timeout at the epoch forever and never does anything about it.
struct Livelock(Instant);

impl Node for Livelock {
    fn handle(&mut self, _now: Instant, _dgram: Datagram) {}
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        None
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        // Any time in the past means "now".
        Some(self.0)
    }
    fn handle_timeout(&mut self, _now: Instant) {}
}

#[test]
#[should_panic(expected = "simulation stalled at t=")]
fn a_timer_livelock_panics() {
    let mut sim = Simulation::new(seed_from_env(13));
    sim.set_stall_limit(10_000);
    let epoch = sim.epoch();
    sim.add_host(Livelock(epoch), &[]);
    sim.run_for(Duration::from_secs(1));
}

/// Bounces every datagram straight back.
struct Mirror {
    me: std::net::SocketAddr,
    peer: std::net::SocketAddr,
    pending: Option<Datagram>,
}

impl Node for Mirror {
    fn handle(&mut self, _now: Instant, dgram: Datagram) {
        self.pending = Some(Datagram::new(self.me, self.peer, dgram.data));
    }
    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        self.pending.take()
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {}
}

#[test]
#[should_panic(expected = "simulation stalled at t=")]
fn zero_delay_ping_pong_panics() {
    let mut sim = Simulation::new(seed_from_env(14));
    sim.set_stall_limit(10_000);
    let first = Datagram::new(addr(1), addr(2), vec![1]);
    sim.add_host(
        Mirror {
            me: addr(1),
            peer: addr(2),
            pending: Some(first),
        },
        &[ip(1)],
    );
    sim.add_host(
        Mirror {
            me: addr(2),
            peer: addr(1),
            pending: None,
        },
        &[ip(2)],
    );
    sim.add_duplex(ip(1), ip(2), LinkConfig::ideal());
    sim.run_for(Duration::from_secs(1));
}

#[test]
fn node_rngs_are_reproducible_and_distinct() {
    use rand::Rng;
    let sim = Simulation::<Peer>::new(99);
    let draw = |stream| sim.rng(stream).random::<u64>();
    assert_eq!(draw(0), Simulation::<Peer>::new(99).rng(0).random::<u64>());
    assert_ne!(draw(0), draw(1));
}
