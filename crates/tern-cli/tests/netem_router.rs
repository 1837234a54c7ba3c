//! `tern perf --cc explicit` across a real emulated bottleneck whose data direction runs tern's
//! explicit-rate router (tern-netem `router=ncr`, F12): the router stamps the flow's rate into
//! the packets crossing it, the receiver echoes it, and the sender paces at it, so the queue
//! stays near empty where CUBIC fills it. The same run without the router shows the explicit
//! controller falling back to its end-to-end controller.
//!
//! Needs root, /dev/net/tun and `ip netns`; says SKIPPED otherwise.

mod common;

use tern_netem::DirectionStats;

/// One 8 MB `tern --cc CC perf` from `c` to `s` over a 20 Mbit/s, 40 ms RTT link with a
/// 250 kB queue and `extra` settings on the data direction. Returns the client's report line
/// and the data direction's counters.
fn perf(cc: &str, extra: &str) -> (String, DirectionStats) {
    let (report, stats) = common::perf_over(
        &format!("delay=20ms rate=20mbit queue=250kB {extra}"),
        "delay=20ms rate=20mbit",
        &["--cc", cc],
        "8M",
    );
    println!("{cc} {extra:>10}: {report}\n{:>12}  link: {stats:?}", "");
    (report, stats)
}

#[test]
fn a_router_paces_the_explicit_sender_without_a_queue() {
    let test = "a_router_paces_the_explicit_sender_without_a_queue";
    if !tern_netem::test_prerequisites(test) {
        return;
    }
    let (routed, link) = perf("explicit", "router=ncr");
    assert!(
        link.rate_stamped > 0,
        "the router stamped packets: {link:?}"
    );
    assert!(
        routed.contains("router rate"),
        "the sender saw the router's rate: {routed}"
    );
    let routed_queue = link.queue_delay.mean().expect("packets crossed");

    let (plain, link) = perf("cubic", "");
    assert_eq!(link.rate_stamped, 0);
    assert!(!plain.contains("router rate"), "{plain}");
    let cubic_queue = link.queue_delay.mean().expect("packets crossed");
    // The mean over the transfer, not the peak: the peak is the fast-start probe train (ten
    // datagrams back to back, before any rate is known), the same for both controllers.
    assert!(
        routed_queue * 4 < cubic_queue,
        "the router kept the queue down: mean queueing delay {routed_queue:?} against CUBIC's \
         {cubic_queue:?}"
    );

    // No router on the path: the explicit controller runs its end-to-end fallback and still
    // completes the transfer.
    let (fallback, link) = perf("explicit", "");
    assert_eq!(link.rate_stamped, 0);
    assert!(!fallback.contains("router rate"), "{fallback}");
}
