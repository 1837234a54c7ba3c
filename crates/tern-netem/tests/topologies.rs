//! The preset topologies carry traffic where they should (paths, bottlenecks, address
//! changes, link failures), and everything tern-netem creates is removed: on drop, on Ctrl-C
//! of the command, and after a SIGKILL by `cleanup_stale`.
//!
//! Needs root, /dev/net/tun and `ip netns`; skipped with a message otherwise.

mod common;

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{cfg, fig, prerequisites, probe, run, settle, Background};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tern_netem::probe::Report;
use tern_netem::{Direction, DuplexConfig, EmulationConfig, Topology, TopologySpec};

fn ns_exists(ns: &str) -> bool {
    std::path::Path::new("/run/netns").join(ns).exists()
}

/// Smallest one-way delay of 50 datagrams from `from` (optionally bound to `bind`) to `to` on
/// `port`. The minimum, not the mean: these tests ask which path a datagram took, and the tests
/// of this file run side by side on a loaded machine, where scheduling adds milliseconds to some
/// datagrams but the emulator never delivers one early (accuracy.rs checks the delays).
fn owd(topo: &Topology, from: &str, bind: Option<&str>, to: &str, to_addr: &str, port: u16) -> f64 {
    let dst = format!("{to_addr}:{port}");
    let rx = Background::start(probe(
        topo,
        to,
        &[
            "udp-recv", "--bind", &dst, "--max", "20s", "--idle", "300ms",
        ],
    ));
    settle();
    let mut args = vec![
        "udp-send", "--to", &dst, "--count", "50", "--size", "100", "--pps", "500",
    ];
    if let Some(b) = bind {
        args.extend(["--bind", b]);
    }
    run(probe(topo, from, &args));
    let r = rx.finish();
    assert_eq!(fig(&r, "received"), 50.0, "{from} -> {to} {dst}");
    fig(&r, "owd_min_ms")
}

/// `owd` came through the link of `delay_ms`: never early, and nearer it than any other link
/// of the topology (the links differ by at least 10 ms).
fn crossed(owd: f64, delay_ms: f64) -> bool {
    (delay_ms..delay_ms + 5.0).contains(&owd)
}

#[test]
fn dual_paths_are_disjoint_and_chosen_by_source_address() {
    if !prerequisites("dual_paths_are_disjoint_and_chosen_by_source_address") {
        return;
    }
    let topo = Topology::build(&TopologySpec::dual()).unwrap();
    let emu = topo
        .start(
            &EmulationConfig::default()
                .with_link("r1", DuplexConfig::symmetric(cfg("delay=10ms")))
                .with_link("r2", DuplexConfig::symmetric(cfg("delay=40ms"))),
        )
        .unwrap();
    let p1 = owd(&topo, "c", None, "s", "10.77.2.1", 7101);
    let p2 = owd(&topo, "c", None, "s", "10.77.4.1", 7102);
    // Bound to the second path's address but aimed at the first path's server address: the
    // source decides, so it crosses r2.
    let cross = owd(&topo, "c", Some("10.77.3.1:0"), "s", "10.77.2.1", 7103);
    let back = owd(&topo, "s", Some("10.77.4.1:0"), "c", "10.77.1.1", 7104);
    println!("dual: path 1 {p1:.2} ms, path 2 {p2:.2} ms, from 10.77.3.1 {cross:.2} ms, back via r2 {back:.2} ms");
    assert!(crossed(p1, 10.0), "{p1}");
    assert!(crossed(p2, 40.0), "{p2}");
    assert!(crossed(cross, 40.0), "{cross}");
    assert!(crossed(back, 40.0), "{back}");
    let r1 = emu.stats("r1", Direction::Up).unwrap();
    let r2 = emu.stats("r2", Direction::Up).unwrap();
    assert_eq!(r1.offered, 50);
    assert_eq!(r2.offered, 100);
    assert_eq!(emu.stats("r2", Direction::Down).unwrap().offered, 50);

    // A path failure: r1 down drops everything, r2 still carries traffic.
    emu.set_up("r1", Direction::Up, false).unwrap();
    let echo = Background::start(probe(
        &topo,
        "s",
        &["udp-echo", "--bind", "10.77.2.1:7105", "--max", "20s"],
    ));
    let ping = run(probe(
        &topo,
        "c",
        &[
            "udp-ping",
            "--to",
            "10.77.2.1:7105",
            "--count",
            "10",
            "--timeout",
            "200ms",
        ],
    ));
    assert_eq!(fig(&ping, "received"), 0.0);
    emu.set_up("r1", Direction::Up, true).unwrap();
    let ping = run(probe(
        &topo,
        "c",
        &["udp-ping", "--to", "10.77.2.1:7105", "--count", "10"],
    ));
    drop(echo);
    assert_eq!(fig(&ping, "received"), 10.0);
    assert!(emu.stats("r1", Direction::Up).unwrap().dropped_down >= 10);
}

#[test]
fn parking_lot_flows_cross_their_bottlenecks() {
    if !prerequisites("parking_lot_flows_cross_their_bottlenecks") {
        return;
    }
    let topo = Topology::build(&TopologySpec::parking_lot()).unwrap();
    let emu = topo
        .start(
            &EmulationConfig::default()
                .with_link("b1", DuplexConfig::symmetric(cfg("delay=10ms")))
                .with_link("b2", DuplexConfig::symmetric(cfg("delay=20ms"))),
        )
        .unwrap();
    let f0 = owd(&topo, "src0", None, "dst0", "10.77.9.1", 7201);
    let f1 = owd(&topo, "src1", None, "dst1", "10.77.5.1", 7202);
    let f2 = owd(&topo, "src2", None, "dst2", "10.77.10.1", 7203);
    println!(
        "parking lot: flow 0 {f0:.2} ms (b1+b2), flow 1 {f1:.2} ms (b1), flow 2 {f2:.2} ms (b2)"
    );
    assert!(crossed(f0, 30.0), "{f0}");
    assert!(crossed(f1, 10.0), "{f1}");
    assert!(crossed(f2, 20.0), "{f2}");
    assert_eq!(emu.stats("b1", Direction::Up).unwrap().offered, 100);
    assert_eq!(emu.stats("b2", Direction::Up).unwrap().offered, 100);
    assert_eq!(emu.stats("b1", Direction::Down).unwrap().offered, 0);
}

/// A paced UDP train of `count` datagrams at 100 per second from `from` to `to_addr:port`
/// (`to` receives), through the emulated link; the receiver's report.
fn train(topo: &Topology, from: &str, to: &str, to_addr: &str, port: u16, count: u32) -> Report {
    let dst = format!("{to_addr}:{port}");
    // The receiver's idle limit is longer than any dark window.
    let rx = Background::start(probe(
        topo,
        to,
        &[
            "udp-recv", "--bind", &dst, "--max", "30s", "--idle", "1500ms",
        ],
    ));
    settle();
    let count = count.to_string();
    let sent = run(probe(
        topo,
        from,
        &[
            "udp-send", "--to", &dst, "--count", &count, "--size", "100", "--pps", "100",
        ],
    ));
    assert_eq!(fig(&sent, "sent").to_string(), count, "{from} -> {to}");
    rx.finish()
}

#[test]
fn outages_darken_a_link_for_their_windows() {
    if !prerequisites("outages_darken_a_link_for_their_windows") {
        return;
    }
    let topo = Topology::build(&TopologySpec::single()).unwrap();
    // Up: dark once during [3 s, 4 s) of the emulator's clock. Down: dark 300 ms of every
    // second, from its start.
    let emu = topo
        .start(&EmulationConfig::uniform(DuplexConfig {
            up: cfg("delay=5ms outage=3s+1s"),
            down: cfg("delay=5ms outage=0s+300ms/1s"),
        }))
        .unwrap();
    // The machine is loaded, so these checks count datagrams and never time them: a 5 s train
    // at 100 per second that starts well before 3 s crosses the whole dark second (100
    // datagrams, give or take the sender's pacing), and a 4 s train crosses four dark windows
    // of 300 ms (120), whenever it starts.
    let since = emu.epoch().elapsed();
    if since < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_secs(1) - since);
    }
    let up = train(&topo, "c", "s", "10.77.2.1", 7401, 500);
    let down = train(&topo, "s", "c", "10.77.1.1", 7402, 400);
    let su = emu.stats("r", Direction::Up).unwrap();
    let sd = emu.stats("r", Direction::Down).unwrap();
    println!(
        "outages: up received {} of 500, {} dropped dark; down received {} of 400, {} dropped dark",
        fig(&up, "received"),
        su.dropped_outage,
        fig(&down, "received"),
        sd.dropped_outage
    );
    for (s, r, count, dark) in [(su, &up, 500, 85..=115), (sd, &down, 400, 100..=140)] {
        assert_eq!(s.offered, count);
        assert!(dark.contains(&s.dropped_outage), "{s:?}");
        assert_eq!(
            s.dropped_loss + s.dropped_queue + s.dropped_down,
            0,
            "{s:?}"
        );
        assert_eq!(s.written, count - s.dropped_outage, "{s:?}");
        assert_eq!(fig(r, "received"), s.written as f64);
    }
    // The up train's last datagrams came after the dark second, and got through.
    assert_eq!(fig(&up, "max_seq"), 499.0);
}

#[test]
fn mobile_host_changes_address_mid_run() {
    if !prerequisites("mobile_host_changes_address_mid_run") {
        return;
    }
    let topo = Topology::build(&TopologySpec::mobile()).unwrap();
    let emu = topo
        .start(&EmulationConfig::uniform(DuplexConfig::symmetric(cfg(
            "delay=5ms",
        ))))
        .unwrap();
    let echo = Background::start(probe(
        &topo,
        "s",
        &["udp-echo", "--bind", "10.77.2.1:7301", "--max", "30s"],
    ));
    settle();
    let ping = || {
        fig(
            &run(probe(
                &topo,
                "c",
                &["udp-ping", "--to", "10.77.2.1:7301", "--count", "20"],
            )),
            "received",
        )
    };
    let home = Ipv4Addr::new(10, 77, 1, 1);
    let away = Ipv4Addr::new(10, 77, 5, 1);
    let rebound = Ipv4Addr::new(10, 77, 1, 11);
    assert_eq!(topo.addr("c").unwrap(), home);
    assert_eq!(ping(), 20.0);
    // A new network, then back, then NAT-rebinding-style within the first subnet.
    for (from, to) in [(home, away), (away, home), (home, rebound)] {
        topo.change_address("c", from, to).unwrap();
        assert_eq!(topo.addrs("c").unwrap(), vec![to]);
        let shown = Command::new("ip")
            .args([
                "-n",
                &topo.ns("c").unwrap(),
                "-4",
                "addr",
                "show",
                "dev",
                "to-r",
            ])
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.contains(&format!("{to}/24")), "{shown}");
        assert!(!shown.contains(&format!("{from}/")), "{shown}");
        assert_eq!(ping(), 20.0, "after moving {from} -> {to}");
    }
    drop(echo);
    assert!(emu.stats("r", Direction::Up).unwrap().written >= 80);
    assert!(
        topo.change_address("c", home, away).is_err(),
        "home is no longer c's"
    );
}

#[test]
fn drop_removes_namespaces_and_processes() {
    if !prerequisites("drop_removes_namespaces_and_processes") {
        return;
    }
    let topo = Topology::build(&TopologySpec::single()).unwrap();
    topo.start(&EmulationConfig::default()).unwrap();
    let names: Vec<String> = ["c", "r", "s"]
        .iter()
        .map(|n| topo.ns(n).unwrap())
        .collect();
    assert!(names.iter().all(|n| ns_exists(n)));
    let mut server = probe(
        &topo,
        "s",
        &["udp-echo", "--bind", "10.77.2.1:7401", "--max", "60s"],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    settle();
    drop(topo);
    assert!(
        names.iter().all(|n| !ns_exists(n)),
        "namespaces left: {names:?}"
    );
    let exited = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        server.try_wait().unwrap().is_some()
    });
    assert!(exited, "the process inside the namespace was not stopped");
}

/// Starts `tern-netem up --duration 60s` and returns it with its namespace prefix.
fn start_cli() -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tern-netem"))
        .args(["up", "--delay", "1ms", "--duration", "60s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut prefix = None;
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.split("(prefix ").nth(1) {
            prefix = Some(rest.trim().trim_end_matches(')').to_owned());
        }
        if line.contains("running;") {
            break;
        }
        line.clear();
    }
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    (child, prefix.expect("prefix in the output"))
}

#[test]
fn ctrl_c_of_the_command_removes_everything() {
    if !prerequisites("ctrl_c_of_the_command_removes_everything") {
        return;
    }
    let (mut child, prefix) = start_cli();
    let names: Vec<String> = ["c", "r", "s"]
        .iter()
        .map(|n| format!("{prefix}-{n}"))
        .collect();
    assert!(names.iter().all(|n| ns_exists(n)));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        names.iter().all(|n| !ns_exists(n)),
        "namespaces left: {names:?}"
    );
}

#[test]
fn namespaces_of_a_killed_run_are_removed_by_cleanup_stale() {
    if !prerequisites("namespaces_of_a_killed_run_are_removed_by_cleanup_stale") {
        return;
    }
    let (mut child, prefix) = start_cli();
    let names: Vec<String> = ["c", "r", "s"]
        .iter()
        .map(|n| format!("{prefix}-{n}"))
        .collect();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    // (Another test's build may have cleaned them already: both are fine.)
    let removed = tern_netem::cleanup_stale().unwrap();
    assert!(
        names.iter().all(|n| !ns_exists(n)),
        "namespaces left: {names:?}"
    );
    println!("cleanup_stale removed {removed:?}");
}
