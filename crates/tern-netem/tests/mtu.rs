//! `mtu=` (DESIGN.md F14): the topology carries jumbo datagrams whole when a direction asks
//! for a large MTU, and a direction drops (and counts) packets above its own MTU.
//!
//! Needs root, /dev/net/tun and `ip netns`; skipped with a message otherwise.

mod common;

use common::{cfg, fig, prerequisites, probe, run, settle, Background};
use tern_netem::{Direction, DuplexConfig, EmulationConfig, Topology, TopologySpec};

/// Sends `count` datagrams of `size` bytes from `from` to `to_addr` and returns how many
/// arrived.
fn send(topo: &Topology, from: &str, to: &str, to_addr: &str, port: u16, size: usize) -> f64 {
    let dst = format!("{to_addr}:{port}");
    let rx = Background::start(probe(
        topo,
        to,
        &[
            "udp-recv", "--bind", &dst, "--max", "10s", "--idle", "500ms",
        ],
    ));
    settle();
    let size = size.to_string();
    run(probe(
        topo,
        from,
        &[
            "udp-send", "--to", &dst, "--count", "20", "--size", &size, "--pps", "200",
        ],
    ));
    let r = rx.finish();
    fig(&r, "received")
}

#[test]
fn jumbo_datagrams_cross_and_a_smaller_mtu_drops() {
    if !prerequisites("jumbo_datagrams_cross_and_a_smaller_mtu_drops") {
        return;
    }
    let spec = TopologySpec::single();
    let topo = Topology::build(&spec).unwrap();
    let link = topo.links()[0].clone();
    // Up carries 9 000-byte IP packets; down only 4 000.
    let emu = topo
        .start(&EmulationConfig::default().with_link(
            &link,
            DuplexConfig {
                up: cfg("delay=1ms mtu=9000"),
                down: cfg("delay=1ms mtu=4000"),
            },
        ))
        .unwrap();
    let (a, b) = (&spec.nodes[0].name, &spec.nodes.last().unwrap().name);
    let (a_addr, b_addr) = (
        topo.addr(a).unwrap().to_string(),
        topo.addr(b).unwrap().to_string(),
    );
    // 8 972 bytes of UDP payload: a 9 000-byte IP packet, whole (the veths carry 9 000).
    assert_eq!(send(&topo, a, b, &b_addr, 7201, 8972), 20.0);
    let up = emu.stats(&link, Direction::Up).unwrap();
    assert_eq!(up.dropped_mtu, 0);
    assert!(
        up.offered_bytes >= 20 * 9000,
        "whole, not fragmented: {up:?}"
    );
    // Down: 6 000-byte packets exceed 4 000 and are dropped; 3 000-byte ones pass.
    assert_eq!(send(&topo, b, a, &a_addr, 7202, 5972), 0.0);
    assert_eq!(send(&topo, b, a, &a_addr, 7203, 2972), 20.0);
    let down = emu.stats(&link, Direction::Down).unwrap();
    assert_eq!(down.dropped_mtu, 20, "{down:?}");
    println!(
        "mtu: up {} pkt / {} B, none dropped; down {} dropped for mtu, {} delivered",
        up.delivered, up.delivered_bytes, down.dropped_mtu, down.delivered
    );
}
