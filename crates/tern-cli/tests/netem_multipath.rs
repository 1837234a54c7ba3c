//! `tern perf` over two real emulated paths (tern-netem's `dual` topology: the client and
//! the server each have an address on either path): with no options, the server advertises
//! both its addresses, the client opens paths from both of its own, and both emulated links
//! carry a large share of the data. `--local none` keeps to the client's first interface.
//!
//! Needs root, /dev/net/tun and `ip netns`; says SKIPPED otherwise.

mod common;

use std::process::Stdio;

use common::Killed;
use tern_netem::{Direction, DirectionConfig, DuplexConfig, EmulationConfig};
use tern_netem::{Topology, TopologySpec};

/// One 16 MB `tern perf` from `c` to `s` with `client_args`, both paths 20 Mbit/s and 10 ms
/// each way. Returns the client's stdout and the bytes each path's data direction carried.
fn perf(client_args: &[&str]) -> (String, [u64; 2]) {
    let topo = Topology::build(&TopologySpec::dual()).expect("topology");
    let link = || {
        let mut d = DirectionConfig::default();
        d.apply("delay=10ms rate=20mbit queue=100kB")
            .expect("settings");
        DuplexConfig {
            up: d.clone(),
            down: d,
        }
    };
    let emu = topo
        .start(
            &EmulationConfig::default()
                .with_link("r1", link())
                .with_link("r2", link()),
        )
        .expect("emulator");
    let server_ip = topo.addr("s").expect("server address");
    let tern = env!("CARGO_BIN_EXE_tern");
    let (server, _stderr) = common::perf_server(&topo, "s", "0.0.0.0:4433");
    let target = format!("{server_ip}:4433");
    let mut args = vec!["perf", target.as_str(), "--bytes", "16M"];
    args.extend_from_slice(client_args);
    let out = topo
        .command("c", tern)
        .expect("node")
        .args(&args)
        .stderr(Stdio::inherit())
        .output()
        .expect("client runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tern perf failed: {stdout}");
    let carried = ["r1", "r2"].map(|r| {
        emu.stats(r, Direction::Up)
            .expect("counters")
            .delivered_bytes
    });
    drop(server);
    println!("{client_args:?}:\n{stdout}links carried {carried:?}");
    (stdout, carried)
}

#[test]
fn perf_uses_both_paths_by_default_and_one_when_asked() {
    let test = "perf_uses_both_paths_by_default_and_one_when_asked";
    if !tern_netem::test_prerequisites(test) {
        return;
    }
    let (report, carried) = perf(&[]);
    let path_lines = report
        .lines()
        .filter(|l| l.trim_start().starts_with("path "))
        .count();
    assert!(path_lines >= 2, "per-path lines: {report}");
    for (i, bytes) in carried.iter().enumerate() {
        assert!(
            *bytes > 4_000_000,
            "path {} carried {bytes} of 16 MB: {report}",
            i + 1
        );
    }

    // One local address: paths to both server addresses still open, but all leave from the
    // client's first interface, so only r1 carries data.
    let (report, carried) = perf(&["--local", "none"]);
    assert!(
        report
            .lines()
            .filter(|l| l.trim_start().starts_with("path "))
            .all(|l| l.contains("10.77.1.1 ->")),
        "{report}"
    );
    assert!(carried[1] < 1_000_000, "r2 idle: {carried:?}");
}

/// `tern perf` from a client whose address changes mid-transfer (tern-netem's `mobile`
/// topology: 10.77.1.1 moves to 10.77.5.1, a new network): the connection follows by its
/// connection ID, the server revalidates the new address, and every byte arrives.
#[test]
fn perf_survives_the_client_moving_to_a_new_network() {
    let test = "perf_survives_the_client_moving_to_a_new_network";
    if !tern_netem::test_prerequisites(test) {
        return;
    }
    let topo = Topology::build(&TopologySpec::mobile()).expect("topology");
    let mut d = DirectionConfig::default();
    d.apply("delay=10ms rate=10mbit queue=60kB")
        .expect("settings");
    let _emu = topo
        .start(&EmulationConfig::default().with_link(
            "r",
            DuplexConfig {
                up: d.clone(),
                down: d,
            },
        ))
        .expect("emulator");
    let server_addr = format!("{}:4433", topo.addr("s").expect("server address"));
    let tern = env!("CARGO_BIN_EXE_tern");
    let (server, rx) = common::perf_server(&topo, "s", &server_addr);
    // 12 MiB at 10 Mbit/s: about ten seconds, so a move two seconds in is mid-transfer.
    let client = topo
        .command("c", tern)
        .expect("node")
        .args(["perf", &server_addr, "--bytes", "12M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("client runs");
    let client = Killed(client);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (home, away) = ("10.77.1.1".parse().unwrap(), "10.77.5.1".parse().unwrap());
    topo.change_address("c", home, away)
        .expect("the client moves");
    let mut client = client;
    let out = std::mem::replace(
        &mut client.0,
        std::process::Command::new("true").spawn().expect("true"),
    )
    .wait_with_output()
    .expect("client ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tern perf failed after the move: {stdout}"
    );
    let received = std::iter::from_fn(|| rx.recv_timeout(std::time::Duration::from_secs(10)).ok())
        .find(|l| l.starts_with("received"))
        .expect("the server reports what it received");
    assert!(
        received.starts_with("received 12582912 bytes"),
        "{received}; client: {stdout}"
    );
    drop(server);
}
