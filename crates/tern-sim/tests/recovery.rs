//! Loss recovery that declares only real losses (PROTOCOL.md §11): reordering costs no
//! retransmission once the path has shown it, a real loss is still repaired, a congestion
//! response caused by a loss that proves spurious is undone, and ECN marks replace losses on
//! a marking bottleneck (or are given up on a path that bleaches or rewrites them).

use std::time::Duration;

use tern_proto::{ConnectionHandle, ConnectionStats, EcnState, EndpointConfig};
use tern_sim::tern::{goodput_between, PairAccess, Transfer};
use tern_sim::{LinkConfig, LinkId, LinkStats, LossModel};

const RATE: u64 = 50_000_000;
const ONE_WAY: Duration = Duration::from_millis(20);
const SIZE: u64 = 20_000_000;

struct Run {
    goodput: f64,
    /// The data sender's statistics.
    sender: ConnectionStats,
    /// The data direction's link.
    link: LinkStats,
}

fn run(uplink: LinkConfig, size: u64, configure: fn(&mut EndpointConfig)) -> Run {
    let mut t = Transfer::new(
        tern_sim::seed_from_env(11),
        LinkConfig::new(RATE, ONE_WAY),
        vec![size],
    );
    t.uplink = uplink;
    t.configure = configure;
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(120))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None, "byte-exact");
    assert_eq!(server.total(), size);
    let last_byte = server.timeline.last().expect("data arrived").0;
    let goodput = goodput_between(&server.timeline, start + Duration::from_secs(1), last_byte);
    let sender = sim
        .client()
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection kept")
        .stats();
    // The uplink (client to server) was added first.
    let uplink = sim.links().next().expect("two links");
    let link = *sim.link(uplink).stats();
    eprintln!(
        "{:.1} Mbit/s; lost {} (spurious {}), retransmitted {} B, cuts {} (undone {}), \
         reorder threshold {} window {:?}, ECN {} (CE {}); link: {}",
        goodput / 1e6,
        sender.packets_lost,
        sender.spurious_losses,
        sender.bytes_retransmitted,
        sender.congestion_events,
        sender.congestion_events_undone,
        sender.reorder_threshold,
        sender.reorder_window,
        sender.ecn,
        sender.ecn_ce_reported,
        link,
    );
    Run {
        goodput,
        sender,
        link,
    }
}

fn clean() -> LinkConfig {
    LinkConfig::new(RATE, ONE_WAY)
}

/// A link that never drops: its queue has no limit (slow start would overflow any other).
fn lossless() -> LinkConfig {
    clean().with_queue_limit(usize::MAX)
}

fn reordering(probability: f64, extra: Duration) -> LinkConfig {
    lossless().with_reorder(probability, extra)
}

#[test]
fn reordering_without_loss_is_learned_and_then_costs_nothing() {
    let base = run(lossless(), SIZE, |_| {});
    assert_eq!(base.sender.packets_lost, 0);
    // With packet-pair fast start (the default) the window is one BDP from the second round
    // trip, so more packets are in flight while the path is still showing how far it
    // reorders: a few more early spurious losses than from slow start.
    for (fast_start, max_spurious) in [(false, 8), (true, 16)] {
        for (p, extra) in [
            (0.02, Duration::from_millis(5)),
            (0.10, Duration::from_millis(20)),
        ] {
            let configure: fn(&mut EndpointConfig) = if fast_start {
                |_| {}
            } else {
                |c| c.connection.fast_start = false
            };
            let r = run(reordering(p, extra), SIZE, configure);
            // Every loss declared was spurious (the link lost nothing), and only the first
            // few, while the path showed how far it reorders: thousands of packets were
            // reordered.
            assert_eq!(r.link.dropped(), 0);
            assert_eq!(r.sender.packets_lost, r.sender.spurious_losses);
            assert!(
                r.sender.spurious_losses <= max_spurious,
                "{} (fast start {fast_start})",
                r.sender.spurious_losses
            );
            assert!(
                r.sender.bytes_retransmitted <= max_spurious * 1500,
                "{}",
                r.sender.bytes_retransmitted
            );
            // No window cut stands: each one was undone when its loss proved spurious.
            assert_eq!(
                r.sender.congestion_events, r.sender.congestion_events_undone,
                "reordering {p} {extra:?}"
            );
            assert!(
                r.sender.reorder_window >= extra,
                "{:?}",
                r.sender.reorder_window
            );
            assert!(
                r.goodput >= 0.9 * base.goodput,
                "{:.1} vs {:.1} Mbit/s",
                r.goodput / 1e6,
                base.goodput / 1e6
            );
        }
    }
}

#[test]
fn real_losses_on_a_reordering_path_are_still_repaired() {
    let link = reordering(0.05, Duration::from_millis(10)).with_loss(LossModel::Random(0.005));
    let r = run(link, 5_000_000, |_| {});
    // The transfer completed byte-exact (checked in `run`); every packet the link dropped
    // was found lost (the sender's ACK-only packets are dropped too but never declared).
    let real = r.sender.packets_lost - r.sender.spurious_losses;
    assert!(r.link.dropped_loss > 0);
    assert!(real >= r.link.dropped_loss);
    assert!(real <= r.link.dropped(), "{real} > {}", r.link.dropped());
    assert!(r.sender.bytes_retransmitted > 0);
}

#[test]
fn ecn_marks_replace_losses_at_a_marking_bottleneck() {
    // A queue of two bandwidth-delay products, marked from half of one (CUBIC's cut to 0.7
    // of the window then still leaves it above the BDP: the link stays busy).
    let bdp = (RATE / 8) as usize * 2 * ONE_WAY.as_millis() as usize / 1000;
    let marking = clean().with_queue_limit(2 * bdp).with_ecn_marking(bdp / 2);
    // What fills the queue here is slow start's overshoot: with packet-pair fast start (the
    // default) the window opens to one BDP and never reaches the marking threshold, so
    // nothing is marked or lost at all.
    let fast = run(marking.clone(), SIZE, |_| {});
    assert_eq!(fast.link.dropped(), 0);
    assert_eq!(fast.sender.packets_lost, 0);
    assert!(fast.goodput >= 0.85 * RATE as f64, "{}", fast.goodput);
    let with_ecn = run(marking.clone(), SIZE, |c| c.connection.fast_start = false);
    assert_eq!(with_ecn.sender.ecn, EcnState::Capable);
    assert!(with_ecn.sender.ecn_ce_reported > 0);
    assert!(with_ecn.sender.congestion_events > 0);
    assert_eq!(with_ecn.link.dropped(), 0, "the queue never overflowed");
    assert_eq!(with_ecn.sender.packets_lost, 0);
    assert!(
        with_ecn.goodput >= 0.85 * RATE as f64,
        "{}",
        with_ecn.goodput
    );

    // The same bottleneck with ECN off at the sender: the queue fills until it drops.
    let without = run(marking, SIZE, |c| {
        c.connection.ecn = false;
        c.connection.fast_start = false;
    });
    assert_eq!(without.sender.ecn, EcnState::Disabled);
    assert_eq!(
        without.link.ce_marked, 0,
        "unmarked packets are never marked"
    );
    assert!(without.link.dropped_queue > 0);
    assert!(without.sender.packets_lost > 0);
}

#[test]
fn a_path_that_bleaches_or_rewrites_ecn_falls_back_to_unmarked() {
    for bits in [0b00, 0b01] {
        let link = clean().with_ecn_rewrite(bits).with_ecn_marking(usize::MAX);
        let r = run(link, 2_000_000, |_| {});
        assert_eq!(r.sender.ecn, EcnState::Failed, "rewritten to {bits:02b}");
        assert_eq!(r.sender.ecn_ce_reported, 0);
    }
}

#[test]
fn a_real_loss_on_a_reordering_path_is_repaired_within_an_rtt_and_the_reorder_window() {
    // 2 % of packets 5 ms late, nothing lost, until 2 s in, when the link drops what it is
    // offered for 1 ms (a paced burst: a few packets). By then the sender has learned the
    // reordering; the hole stops in-order delivery until the resends arrive.
    let mut t = Transfer::new(
        tern_sim::seed_from_env(11),
        LinkConfig::new(RATE, ONE_WAY),
        vec![SIZE],
    );
    // A queue of 1.5 BDP: slow start overflows it once; after that CUBIC keeps it below the
    // limit for many seconds, so the drop below is the only loss then.
    let bdp = (RATE / 8) as usize * 2 * ONE_WAY.as_millis() as usize / 1000;
    t.uplink = clean()
        .with_queue_limit(bdp * 3 / 2)
        .with_reorder(0.02, Duration::from_millis(5));
    t.timeline = true;
    let mut sim = t.build();
    let start = sim.now();
    let uplink = sim.links().next().expect("two links");
    let drop_at = start + Duration::from_secs(2);
    // Down until it has dropped something (the sender's next paced burst), then up again.
    fn up_once_dropped(s: &mut tern_sim::Simulation<tern_sim::tern::PairHost>, link: LinkId) {
        if s.link(link).stats().dropped_down > 0 {
            s.link_mut(link).set_up(true);
        } else {
            s.schedule_in(Duration::from_micros(10), move |s| up_once_dropped(s, link));
        }
    }
    // The sender's RTT when the loss happens (it includes the standing queue).
    let rtt_at_drop = std::rc::Rc::new(std::cell::Cell::new(Duration::ZERO));
    let rtt = rtt_at_drop.clone();
    sim.schedule(drop_at, move |s| {
        rtt.set(
            s.client()
                .endpoint
                .connection(ConnectionHandle(0))
                .expect("open")
                .stats()
                .rtt,
        );
        s.link_mut(uplink).set_up(false);
        up_once_dropped(s, uplink);
    });
    sim.run_until_done(start + Duration::from_secs(60))
        .expect("transfer completes");
    let link = *sim.link(uplink).stats();
    let dropped = link.dropped_down;
    assert!(dropped >= 1);
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None);
    assert_eq!(server.total(), SIZE);
    let sender = sim
        .client()
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection kept")
        .stats();
    assert!(
        sender.reorder_window > Duration::ZERO,
        "reordering was learned"
    );
    assert_eq!(
        sender.packets_lost - sender.spurious_losses,
        link.dropped(),
        "{sender:?} {link}"
    );
    // The longest pause in in-order delivery after the drop.
    let stall = server
        .timeline
        .windows(2)
        .filter(|w| w[1].0 > drop_at && w[0].0 < drop_at + Duration::from_secs(1))
        .map(|w| w[1].0.saturating_duration_since(w[0].0))
        .max()
        .expect("data after the drop");
    // One RTT (the resend is queued like the packets it replaces) and the reordering window,
    // plus the resends' serialization and the gap to the sender's next burst (whose
    // acknowledgement shows the hole): 3 ms at this rate.
    let resend = Duration::from_secs_f64(dropped as f64 * 1500.0 * 8.0 / RATE as f64);
    let rtt = rtt_at_drop.get();
    let bound = rtt + sender.reorder_window + resend + Duration::from_millis(3);
    eprintln!(
        "{dropped} dropped at 2 s; stall {stall:?}; smoothed RTT {rtt:?} + reordering window \
         {:?} + resend {resend:?} + 3 ms = bound {bound:?}; {link}",
        sender.reorder_window
    );
    assert!(stall <= bound, "{stall:?} > {bound:?}");
}
