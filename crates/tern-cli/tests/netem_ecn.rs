//! `tern perf` across a real emulated bottleneck (tern-netem: network namespaces and a TUN
//! forwarder), where ECN decides what happens at the queue: a link that marks CE from 30 kB
//! slows tern down before its 250 kB queue overflows, and a middlebox that bleaches or rewrites
//! the ECN bits is detected and tern falls back to unmarked packets.
//!
//! Needs root, /dev/net/tun and `ip netns`; says SKIPPED otherwise.

mod common;

use tern_netem::DirectionStats;

/// One 20 MB `tern perf` from `c` to `s` over a 50 Mbit/s, 20 ms RTT link with a 250 kB queue
/// and `ecn` settings on the data direction. Returns the client's report line and the data
/// direction's counters.
fn perf(ecn: &str) -> (String, DirectionStats) {
    let (report, stats) = common::perf_over(
        &format!("delay=10ms rate=50mbit queue=250kB {ecn}"),
        "delay=10ms rate=50mbit",
        &[],
        "20M",
    );
    println!("{ecn:>12}: {report}\n{:>12}  link: {stats:?}", "");
    (report, stats)
}

/// The `lost N pkts` figure of a report line.
fn lost(report: &str) -> u64 {
    let after = report.split("lost ").nth(1).expect("lost figure");
    after.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn ecn_marks_hold_the_queue_below_overflow_and_bleaching_is_detected() {
    let test = "ecn_marks_hold_the_queue_below_overflow_and_bleaching_is_detected";
    if !tern_netem::test_prerequisites(test) {
        return;
    }
    let (marked, link) = perf("ecn=30kB");
    assert!(marked.contains("ECN capable"), "{marked}");
    assert!(link.ce_marked > 0);
    assert_eq!(
        link.dropped_queue, 0,
        "marks came before the queue overflowed"
    );
    assert_eq!(lost(&marked), 0);
    let marked_delay = link.queue_delay.mean().expect("packets crossed the queue");

    let (plain, link) = perf("");
    assert!(
        plain.contains("ECN capable"),
        "marks survive an unmarking link: {plain}"
    );
    assert_eq!(link.ce_marked, 0);
    // Without marks only loss stops the window, so the queue stands higher for the whole
    // transfer. Compared by the mean queueing delay over every packet, not by the peak: the
    // peak is the start-up burst's and moves with how the 2-core host schedules the sender
    // (marked peaks of 50-117 kB against 150-160 kB without; means 1.7 against 12.5 ms).
    let plain_delay = link.queue_delay.mean().expect("packets crossed the queue");
    assert!(
        plain_delay > 2 * marked_delay,
        "without marks the queue stands higher: {plain_delay:?} of mean queueing delay against {marked_delay:?} with them"
    );

    for rewrite in ["ecn=bleach", "ecn=ect1"] {
        let (report, _) = perf(rewrite);
        assert!(report.contains("ECN failed"), "{rewrite}: {report}");
    }
}
