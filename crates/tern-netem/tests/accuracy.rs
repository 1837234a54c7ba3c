//! Emulator accuracy, measured with real processes and kernel sockets in the namespaces of a
//! `single` topology (c 10.77.1.1 — [r] — s 10.77.2.1). Each test prints configured vs
//! measured figures (`cargo test -p tern-netem --release --test accuracy -- --nocapture`).
//!
//! Needs root, /dev/net/tun and `ip netns`; skipped with a message otherwise. The tests run one
//! at a time (timing on a shared 2-core machine). Every topology is removed when its test ends,
//! also when it fails.

// Measuring against the wall clock is what these tests do.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use common::{cfg, fig, prerequisites, probe, run, serial, settle, Background};
use tern_netem::{
    Direction, DuplexConfig, EmulationConfig, RateModel, Topology, TopologySpec, Trace,
};

fn single() -> Topology {
    Topology::build(&TopologySpec::single()).expect("build single topology")
}

/// Configured 20 ms one-way delay measures 20 ± 1 ms: one-way delays of 300 UDP datagrams
/// (sender and receiver share the machine's clock) and round-trip times of 200 pings.
#[test]
fn delay_20ms_measures_20_plus_minus_1ms() {
    if !prerequisites("delay_20ms_measures_20_plus_minus_1ms") {
        return;
    }
    let _serial = serial();
    let topo = single();
    topo.start(&EmulationConfig::uniform(DuplexConfig::symmetric(cfg(
        "delay=20ms",
    ))))
    .unwrap();

    let rx = Background::start(probe(
        &topo,
        "s",
        &[
            "udp-recv",
            "--bind",
            "10.77.2.1:7001",
            "--max",
            "20s",
            "--idle",
            "500ms",
        ],
    ));
    settle();
    run(probe(
        &topo,
        "c",
        &[
            "udp-send",
            "--to",
            "10.77.2.1:7001",
            "--count",
            "300",
            "--size",
            "200",
            "--pps",
            "100",
        ],
    ));
    let owd = rx.finish();

    let echo = Background::start(probe(
        &topo,
        "s",
        &["udp-echo", "--bind", "10.77.2.1:7002", "--max", "20s"],
    ));
    settle();
    let ping = run(probe(
        &topo,
        "c",
        &[
            "udp-ping",
            "--to",
            "10.77.2.1:7002",
            "--count",
            "200",
            "--interval",
            "10ms",
        ],
    ));
    drop(echo);

    let mean = fig(&owd, "owd_mean_ms");
    let p50 = fig(&owd, "owd_p50_ms");
    let rtt_half = fig(&ping, "rtt_mean_ms") / 2.0;
    println!(
        "delay: configured 20 ms one-way; measured one-way mean {mean:.3} ms, median {p50:.3} \
         ms, min {:.3}, p99 {:.3}, max {:.3} ms ({} datagrams); ping RTT/2 mean {rtt_half:.3} \
         ms (RTT min {:.3}, p99 {:.3} ms)",
        fig(&owd, "owd_min_ms"),
        fig(&owd, "owd_p99_ms"),
        fig(&owd, "owd_max_ms"),
        fig(&owd, "received"),
        fig(&ping, "rtt_min_ms"),
        fig(&ping, "rtt_p99_ms"),
    );
    assert_eq!(fig(&owd, "received"), 300.0);
    assert_eq!(fig(&ping, "received"), 200.0);
    // The median is the accuracy figure. Means also carry the host's late wake-ups, which a
    // loaded 2-core CI machine makes common (a mean of 21.02 ms with a median of 20.63 has
    // been seen): they get 2 ms above.
    assert!(
        (19.0..=21.0).contains(&p50),
        "one-way median {p50} ms is not 20 ± 1 ms"
    );
    for (what, v) in [("one-way mean", mean), ("RTT/2", rtt_half)] {
        assert!(
            (19.0..=22.0).contains(&v),
            "{what} {v} ms is not within 20 − 1 … 20 + 2 ms"
        );
    }
    // Never faster than configured.
    assert!(fig(&owd, "owd_min_ms") >= 20.0);
    topo.teardown().unwrap();
}

/// Jitter adds 0..=5 ms without reordering.
#[test]
fn jitter_stays_in_range_and_keeps_order() {
    if !prerequisites("jitter_stays_in_range_and_keeps_order") {
        return;
    }
    let _serial = serial();
    let topo = single();
    topo.start(&EmulationConfig::uniform(DuplexConfig::symmetric(cfg(
        "delay=20ms,jitter=5ms",
    ))))
    .unwrap();
    let rx = Background::start(probe(
        &topo,
        "s",
        &[
            "udp-recv",
            "--bind",
            "10.77.2.1:7003",
            "--max",
            "20s",
            "--idle",
            "500ms",
        ],
    ));
    settle();
    run(probe(
        &topo,
        "c",
        &[
            "udp-send",
            "--to",
            "10.77.2.1:7003",
            "--count",
            "2000",
            "--size",
            "200",
            "--pps",
            "1000",
        ],
    ));
    let r = rx.finish();
    println!(
        "jitter: configured 20 ms + 0..5 ms, in order; measured min {:.3} mean {:.3} p99 {:.3} \
         max {:.3} ms, {} of {} reordered",
        fig(&r, "owd_min_ms"),
        fig(&r, "owd_mean_ms"),
        fig(&r, "owd_p99_ms"),
        fig(&r, "owd_max_ms"),
        fig(&r, "reordered"),
        fig(&r, "received"),
    );
    assert_eq!(fig(&r, "received"), 2000.0);
    assert_eq!(fig(&r, "reordered"), 0.0);
    assert!(fig(&r, "owd_min_ms") >= 20.0);
    // Uniform 0..5 ms plus the in-order rule: mean a little above 22.5 ms. The engine's own
    // delays are checked exactly (≤ 25 ms) in engine.rs; here the host's timers and two TUN
    // hops add to every packet, up to 17 ms at the tail on a loaded 2-core machine (p99 34 ms
    // seen in CI), so the tail is printed, not asserted; the mean catches a wrong jitter.
    assert!((22.0..=24.5).contains(&fig(&r, "owd_mean_ms")));
}

/// Configured 10 Mbit/s measures 9.5–10.5 Mbit/s of kernel TCP goodput (cubic, 10 ms each
/// way, default queue of 100 ms). Rates count IP packets, as in mahimahi, so the most a TCP
/// flow with 1448-byte segments can carry is 1448/1500 × 10 = 9.65 Mbit/s. Also checks that the
/// queue length is exposed over time.
#[test]
fn rate_10mbit_measures_tcp_goodput_within_5_percent() {
    if !prerequisites("rate_10mbit_measures_tcp_goodput_within_5_percent") {
        return;
    }
    let _serial = serial();
    let topo = single();
    let emu = topo
        .start(
            &EmulationConfig::uniform(DuplexConfig::symmetric(cfg("delay=10ms,rate=10mbit")))
                .with_queue_trace(true),
        )
        .unwrap();
    let sink = Background::start(probe(
        &topo,
        "s",
        &[
            "tcp-sink",
            "--bind",
            "10.77.2.1:7004",
            "--max",
            "40s",
            "--warmup",
            "2s",
        ],
    ));
    settle();
    let sent = run(probe(
        &topo,
        "c",
        &[
            "tcp-send",
            "--to",
            "10.77.2.1:7004",
            "--secs",
            "12s",
            "--cc",
            "cubic",
        ],
    ));
    let r = sink.finish();
    let steady = fig(&r, "steady_mbit");
    let stats = emu.stats("r", Direction::Up).unwrap();
    let trace = emu.queue_trace("r", Direction::Up).unwrap();
    println!(
        "rate: configured 10 Mbit/s; measured TCP goodput {steady:.3} Mbit/s over {:.1} s after \
         2 s warm-up ({:.3} Mbit/s from first byte; {} bytes sent); link: {} packets, {} queue \
         drops, max queue {} B / {} pkt; queue trace {} samples",
        fig(&r, "steady_secs"),
        fig(&r, "goodput_mbit"),
        fig(&sent, "bytes"),
        stats.written,
        stats.dropped_queue,
        stats.max_queue_bytes,
        stats.max_queue_packets,
        trace.len(),
    );
    assert_eq!(fig(&r, "bytes"), fig(&sent, "bytes"));
    assert!((9.5..=10.5).contains(&steady), "goodput {steady} Mbit/s");
    // The queue trace saw the queue build up to its limit region and drain again.
    assert!(trace.len() > 1000);
    assert!(trace.iter().any(|q| q.bytes > 50_000));
    assert!(trace.windows(2).all(|w| w[0].at <= w[1].at));
    let mut csv = Vec::new();
    tern_netem::write_queue_csv(&mut csv, &trace).unwrap();
    assert!(String::from_utf8(csv)
        .unwrap()
        .starts_with("time_ms,bytes,packets\n"));
}

/// Configured 1 % random loss measures 0.8–1.2 % over 100 000 UDP datagrams counted at the
/// receiver.
#[test]
fn loss_1_percent_measures_within_0_2_points_over_100k_packets() {
    if !prerequisites("loss_1_percent_measures_within_0_2_points_over_100k_packets") {
        return;
    }
    let _serial = serial();
    let topo = single();
    let emu = topo
        .start(&EmulationConfig::uniform(DuplexConfig {
            up: cfg("loss=1%"),
            down: cfg(""),
        }))
        .unwrap();
    let rx = Background::start(probe(
        &topo,
        "s",
        &[
            "udp-recv",
            "--bind",
            "10.77.2.1:7005",
            "--max",
            "60s",
            "--idle",
            "1s",
        ],
    ));
    settle();
    let tx = run(probe(
        &topo,
        "c",
        &[
            "udp-send",
            "--to",
            "10.77.2.1:7005",
            "--count",
            "100000",
            "--size",
            "200",
            "--pps",
            "25000",
        ],
    ));
    let r = rx.finish();
    let sent = fig(&tx, "sent");
    let received = fig(&r, "received");
    let loss = 100.0 * (1.0 - received / sent);
    let stats = emu.stats("r", Direction::Up).unwrap();
    println!(
        "loss: configured 1 %; measured {loss:.3} % ({received} of {sent} datagrams arrived; \
         the link model dropped {} of {} offered)",
        stats.dropped_loss, stats.offered
    );
    assert_eq!(sent, 100_000.0);
    assert_eq!(
        stats.offered, 100_000,
        "every datagram reached the emulator"
    );
    assert!((0.8..=1.2).contains(&loss), "loss {loss} %");
}

/// The receive window's IP bytes against the trace's capacity over the same window.
fn trace_window(r: &tern_netem::probe::Report, started: std::time::SystemTime) -> (f64, f64, f64) {
    let epoch_ms = started.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1e3;
    let from = Duration::from_secs_f64((fig(r, "first_unix_ms") - epoch_ms).max(0.0) / 1e3);
    let to = Duration::from_secs_f64((fig(r, "last_unix_ms") - epoch_ms).max(0.0) / 1e3);
    let secs = (to - from).as_secs_f64();
    // The first datagram used the opportunity at `from`, outside (from, to].
    let measured = (fig(r, "ip_bytes") - 1500.0) * 8.0 / secs;
    (measured, secs, from.as_secs_f64())
}

/// A mahimahi trace (Verizon LTE downlink, ../shared/traces) replays at its rate ± 5 %:
/// 25 s of a saturating 24 Mbit/s UDP flow through it, delivered bytes against the trace's
/// capacity over the same window.
#[test]
fn trace_replays_at_its_rate_within_5_percent() {
    if !prerequisites("trace_replays_at_its_rate_within_5_percent") {
        return;
    }
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/Verizon-LTE-short.down");
    if !file.exists() {
        eprintln!("SKIPPED: {} not found", file.display());
        return;
    }
    let _serial = serial();
    let trace = Arc::new(Trace::load(&file).unwrap());
    let topo = single();
    let mut down = cfg("queue=100pkt");
    down.rate = RateModel::Trace(Arc::clone(&trace));
    let emu = topo
        .start(&EmulationConfig::uniform(DuplexConfig {
            up: cfg(""),
            down,
        }))
        .unwrap();
    let rx = Background::start(probe(
        &topo,
        "c",
        &[
            "udp-recv",
            "--bind",
            "10.77.1.1:7006",
            "--max",
            "60s",
            "--idle",
            "1s",
        ],
    ));
    settle();
    run(probe(
        &topo,
        "s",
        &[
            "udp-send",
            "--to",
            "10.77.1.1:7006",
            "--count",
            "50000",
            "--size",
            "1472",
            "--pps",
            "2000",
        ],
    ));
    let r = rx.finish();
    let (measured, secs, from) = trace_window(&r, emu.started_at());
    let epoch = Duration::from_secs_f64(from);
    let window = trace.capacity_bytes_between(epoch, epoch + Duration::from_secs_f64(secs)) as f64
        * 8.0
        / secs;
    println!(
        "trace: {} (mean {:.3} Mbit/s over its 140 s period); replayed {secs:.1} s from t = \
         {from:.2} s, whose capacity is {:.3} Mbit/s; measured {:.3} Mbit/s delivered \
         ({:+.2} %)",
        file.display(),
        trace.mean_rate_bps() / 1e6,
        window / 1e6,
        measured / 1e6,
        100.0 * (measured / window - 1.0)
    );
    assert!(secs > 20.0);
    assert!(
        (measured / window - 1.0).abs() <= 0.05,
        "measured {measured} vs trace {window}"
    );
}

/// A trace shorter than the run loops with its last timestamp as the period and replays at its
/// mean rate ± 5 %: a synthetic 3 s trace (4, 12, then 2 Mbit/s for one second each: mean
/// 6 Mbit/s) replayed for 12 s.
#[test]
fn looping_trace_replays_at_its_mean_rate_within_5_percent() {
    if !prerequisites("looping_trace_replays_at_its_mean_rate_within_5_percent") {
        return;
    }
    let _serial = serial();
    // Per second k, `n` opportunities spread evenly (1 opportunity = 12 000 bits).
    let mut ts = Vec::new();
    for (k, mbit) in [4u64, 12, 2].into_iter().enumerate() {
        let n = mbit * 1_000_000 / 12_000;
        for i in 0..n {
            ts.push(k as u64 * 1000 + (i * 1000 + 500) / n);
        }
    }
    ts.push(3000);
    let trace = Arc::new(Trace::from_opportunities(ts).unwrap());
    let mean = trace.mean_rate_bps();
    let topo = single();
    let mut down = cfg("queue=100pkt");
    down.rate = RateModel::Trace(Arc::clone(&trace));
    let emu = topo
        .start(&EmulationConfig::uniform(DuplexConfig {
            up: cfg(""),
            down,
        }))
        .unwrap();
    let rx = Background::start(probe(
        &topo,
        "c",
        &[
            "udp-recv",
            "--bind",
            "10.77.1.1:7007",
            "--max",
            "60s",
            "--idle",
            "1s",
        ],
    ));
    settle();
    run(probe(
        &topo,
        "s",
        &[
            "udp-send",
            "--to",
            "10.77.1.1:7007",
            "--count",
            "24000",
            "--size",
            "1472",
            "--pps",
            "2000",
        ],
    ));
    let r = rx.finish();
    let (measured, secs, from) = trace_window(&r, emu.started_at());
    println!(
        "looping trace: period 3 s, mean {:.3} Mbit/s; replayed {secs:.1} s ({:.1} periods) \
         from t = {from:.2} s; measured {:.3} Mbit/s ({:+.2} %)",
        mean / 1e6,
        secs / 3.0,
        measured / 1e6,
        100.0 * (measured / mean - 1.0)
    );
    assert!(secs > 9.0);
    assert!(
        (measured / mean - 1.0).abs() <= 0.05,
        "measured {measured} vs mean {mean}"
    );
}
