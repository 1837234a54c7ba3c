//! Time-based impairments of the link model (issue 9): tern transfers across scheduled outages
//! and fades complete byte-exact, and the links drop what they should.

use std::time::Duration;

use tern_proto::ConnectionHandle;
use tern_sim::tern::{PairAccess, PairHost, Transfer};
use tern_sim::{Fade, LinkConfig, LinkStats, Outage, Simulation};

const RATE: u64 = 20_000_000;
const ONE_WAY: Duration = Duration::from_millis(20);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Runs `t` to completion (60 s of virtual time at most) and checks the data byte by byte.
fn complete(t: &Transfer) -> Simulation<PairHost> {
    let mut sim = t.build();
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(60))
        .expect("transfer completes");
    let server = &sim.server().app;
    assert_eq!(server.corrupt, None, "byte-exact");
    assert_eq!(server.total(), t.sizes.iter().sum::<u64>());
    sim
}

/// The sending client's connection statistics.
fn sender_stats(sim: &Simulation<PairHost>) -> tern_proto::ConnectionStats {
    sim.client()
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection kept")
        .stats()
}

/// Both links' counters: (client → server, server → client).
fn link_stats(sim: &Simulation<PairHost>) -> (LinkStats, LinkStats) {
    let mut links = sim.links();
    let up = links.next().expect("uplink");
    let down = links.next().expect("downlink");
    (*sim.link(up).stats(), *sim.link(down).stats())
}

#[test]
fn a_transfer_crosses_a_two_second_outage_mid_transfer() {
    // 12 MB at 20 Mbit/s takes about 5 s; both directions go dark during [2 s, 4 s).
    let size = 12_000_000;
    let link = LinkConfig::new(RATE, ONE_WAY).with_outage(Outage::once(secs(2.0), secs(2.0)));
    let mut t = Transfer::new(tern_sim::seed_from_env(31), link, vec![size]);
    t.timeline = true;
    let sim = complete(&t);
    let epoch = sim.epoch();
    let (up, down) = link_stats(&sim);
    assert!(up.dropped_outage > 0, "data was sent into the outage: {up}");
    assert!(down.dropped_outage > 0, "so were ACKs: {down}");
    assert_eq!(up.dropped() - up.dropped_queue, up.dropped_outage, "{up}");
    let timeline = &sim.server().app.timeline;
    let at = |i: usize| timeline[i].0 - epoch;
    // Data flowed before the outage, nothing arrived inside it (past what was already on the
    // wire: one-way delay plus the queue), and the rest came after it.
    assert!(at(0) < secs(2.0));
    let inside = timeline
        .iter()
        .filter(|(t, _)| (secs(2.2)..secs(4.0)).contains(&(*t - epoch)))
        .count();
    assert_eq!(inside, 0, "deliveries while dark");
    let resumed = timeline
        .iter()
        .map(|(t, _)| *t - epoch)
        .find(|t| *t >= secs(4.0))
        .expect("data after the outage");
    let stats = sender_stats(&sim);
    eprintln!(
        "outage: resumed at {resumed:?}, done at {:?}; sender lost {} packets, resent {} B, \
         persistent congestion {}; up: {up}; down: {down}",
        at(timeline.len() - 1),
        stats.packets_lost,
        stats.bytes_retransmitted,
        stats.persistent_congestion_events,
    );
    // Two seconds of nothing acknowledged is many probe timeouts: the ACK that ends the
    // outage declares the packets sent into it lost, and the window collapses (§11.7).
    assert!(stats.persistent_congestion_events >= 1, "{stats:?}");
}

#[test]
fn a_short_outage_loses_packets_without_persistent_congestion() {
    // Dark for 60 ms mid-transfer on a 40 ms path: losses, but over less than three probe
    // timeouts, so the controller reduces its window and does not collapse it.
    let link = LinkConfig::new(RATE, ONE_WAY).with_outage(Outage::once(secs(1.5), secs(0.06)));
    let t = Transfer::new(tern_sim::seed_from_env(34), link, vec![8_000_000]);
    let sim = complete(&t);
    let (up, _) = link_stats(&sim);
    assert!(up.dropped_outage > 0, "{up}");
    let stats = sender_stats(&sim);
    assert!(stats.packets_lost > 0, "{stats:?}");
    assert!(stats.congestion_events >= 1, "{stats:?}");
    assert_eq!(stats.persistent_congestion_events, 0, "{stats:?}");
}

#[test]
fn a_handshake_sent_into_an_outage_completes_after_it() {
    // Dark for the first second: the client's first flights are lost, a later one gets through.
    let link = LinkConfig::new(RATE, ONE_WAY).with_outage(Outage::once(Duration::ZERO, secs(1.0)));
    let mut t = Transfer::new(tern_sim::seed_from_env(32), link, vec![200_000]);
    t.timeline = true;
    let sim = complete(&t);
    let (up, _) = link_stats(&sim);
    assert!(up.dropped_outage > 0, "{up}");
    let first = sim.server().app.timeline[0].0 - sim.epoch();
    assert!(
        first >= secs(1.0),
        "data before the link came up: {first:?}"
    );
}

#[test]
fn periodic_outages_and_fades_are_crossed_and_replay_from_the_seed() {
    // Dark 300 ms of every 3 s, and fades of 30 ms on average every second, 80 % loss in
    // them, both ways.
    let link = LinkConfig::new(RATE, ONE_WAY)
        .with_outage(Outage::periodic(secs(1.0), secs(0.3), secs(3.0)))
        .with_fade(Fade::new(secs(1.0), secs(0.03)).with_loss_in_bad(0.8));
    let t = Transfer::new(tern_sim::seed_from_env(33), link, vec![8_000_000, 100_000]);
    let first = complete(&t);
    let (up, down) = link_stats(&first);
    assert!(up.dropped_outage > 0 && up.dropped_loss > 0, "{up}");
    assert!(down.dropped_outage > 0, "{down}");
    eprintln!(
        "periodic outages and fades: done at {:?}; up: {up}; down: {down}",
        first.now() - first.epoch()
    );
    // The same seed replays the same run.
    let again = complete(&t);
    assert_eq!(link_stats(&again), (up, down));
    assert_eq!(again.now(), again.epoch() + (first.now() - first.epoch()));
}
