//! The report generator: one self-contained HTML page of every results file (tables, the
//! SVG figures inlined, machine, versions and settings), and Markdown tables for
//! docs/BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::results::{stats, Row, RunFile};

/// A table column: metric key, header, scale, decimals.
type Col = (&'static str, &'static str, f64, usize);

/// The metric columns of a scenario's table.
pub fn columns(scenario: &str) -> Vec<Col> {
    match scenario {
        "mar" => vec![
            ("rtt_p50_ms", "p50 RTT ms", 1.0, 1),
            ("rtt_std_ms", "std ms", 1.0, 1),
            ("rtt_p99_ms", "p99 RTT ms", 1.0, 1),
            ("jitter_ms", "jitter ms", 1.0, 2),
            ("throughput_mbps", "Mbit/s", 1.0, 2),
            ("lost_pct", "lost %", 1.0, 1),
            ("on_time_pct", "on time %", 1.0, 1),
            ("on_time_size_mean_bytes", "on-time size kB", 1e-3, 1),
            ("sent_size_mean_bytes", "sent size kB", 1e-3, 1),
            ("p50_over_ideal", "p50/ideal", 1.0, 2),
            ("rtt_p99_vs_tcp", "p99/TCP", 1.0, 2),
        ],
        "echo-sizes" => vec![
            ("rtt_p50_ms", "p50 ms", 1.0, 3),
            ("rtt_p99_ms", "p99 ms", 1.0, 3),
            ("lost_pct", "lost %", 1.0, 1),
            ("rtt_p50_vs_tcp", "p50/TCP", 1.0, 2),
        ],
        "short-flows" => vec![
            ("fct_mean_ms", "mean FCT ms", 1.0, 0),
            ("fct_p50_ms", "p50 FCT ms", 1.0, 0),
            ("fct_p99_ms", "p99 FCT ms", 1.0, 0),
            ("goodput_mbps", "goodput Mbit/s", 1.0, 1),
            ("failed", "failed", 1.0, 0),
            ("fct_mean_vs_tcp", "FCT/TCP", 1.0, 2),
        ],
        "long-flow" => vec![
            ("fct_mean_ms", "completion s", 1e-3, 2),
            ("goodput_mbps", "goodput Mbit/s", 1.0, 1),
            ("failed", "failed", 1.0, 0),
            ("fct_mean_vs_tcp", "time/TCP", 1.0, 2),
            ("sender_packets_lost", "lost pkts", 1.0, 0),
            ("sender_spurious_losses", "spurious", 1.0, 0),
            ("sender_bytes_retransmitted", "resent kB", 1e-3, 0),
            ("sender_congestion_events", "cuts", 1.0, 0),
            ("sender_congestion_events_undone", "undone", 1.0, 0),
            ("link_drops_down", "link drops", 1.0, 0),
            ("rcvbuf_errors", "rcvbuf drops", 1.0, 0),
        ],
        "initwin" => vec![
            ("fct_mean_ms", "completion ms", 1.0, 0),
            ("ideal_ms", "ideal ms", 1.0, 0),
            ("fct_over_ideal", "/ideal", 1.0, 2),
            ("sender_rtt_ms", "sender RTT ms", 1.0, 1),
            ("sender_packets_lost", "lost pkts", 1.0, 0),
            ("fct_mean_vs_tcp", "time/TCP", 1.0, 2),
        ],
        "mss" => vec![
            ("goodput_mbps", "goodput Mbit/s", 1.0, 0),
            ("cpu_s_per_gb", "CPU s/GB", 1.0, 2),
            ("sender_datagrams_sent", "datagrams", 1.0, 0),
            ("rtt_p50_ms", "p50 RTT ms", 1.0, 3),
            ("rtt_p99_ms", "p99 RTT ms", 1.0, 3),
            ("goodput_vs_tcp", "goodput/TCP", 1.0, 2),
        ],
        "startup" => vec![
            ("fct_mean_ms", "completion ms", 1.0, 0),
            ("ideal_ms", "ideal ms", 1.0, 0),
            ("fct_over_ideal", "/ideal", 1.0, 2),
            ("failed", "failed", 1.0, 0),
        ],
        "robustness" => vec![
            ("goodput_mbps", "goodput Mbit/s", 1.0, 1),
            ("goodput_kept", "kept", 1.0, 3),
            ("intact", "intact", 1.0, 0),
            ("completed", "done", 1.0, 0),
            ("max_gap_ms", "max gap ms", 1.0, 0),
            ("slow_s", "s < 90 %", 1.0, 1),
            ("attack_sent", "junk sent", 1.0, 0),
            ("attack_pps", "junk/s", 1.0, 0),
            ("server_cpu_pct", "server CPU %", 1.0, 0),
            ("server_socket_drops", "socket drops", 1.0, 0),
            ("server_accepted", "accepted", 1.0, 0),
            ("cpu_us_per_junk", "CPU µs/junk", 1.0, 2),
            ("ep_malformed", "malformed", 1.0, 0),
            ("ep_unroutable", "unroutable", 1.0, 0),
            ("server_auth_failures", "auth fail", 1.0, 0),
            ("server_replays", "replays", 1.0, 0),
            ("ep_resets_sent", "resets sent", 1.0, 0),
            ("ep_retries_sent", "retries", 1.0, 0),
            ("ep_replayed_first_flights", "replayed FF", 1.0, 0),
            ("ep_unproven_first_flights", "unproven FF", 1.0, 0),
            ("ep_half_open_refused", "half-open refused", 1.0, 0),
            ("ep_rate_limited", "rate limited", 1.0, 0),
            ("ep_refused", "refused", 1.0, 0),
            ("client_auth_failures", "client auth fail", 1.0, 0),
            ("client_ep_resets_sent", "client resets sent", 1.0, 0),
        ],
        "scale" => vec![
            ("handshakes_per_s", "handshakes/s", 1.0, 0),
            ("latency_p99_ms", "p99 ms", 1.0, 2),
            ("server_cpu_us_per_handshake", "server CPU µs/hs", 1.0, 0),
            ("opened", "opened", 1.0, 0),
            ("server_bytes_per_conn", "server B/conn", 1.0, 0),
            ("client_bytes_per_conn", "client B/conn", 1.0, 0),
            ("accept_s", "accept s", 1.0, 2),
            ("udp_rcvbuf_errors", "UDP rcvbuf errs", 1.0, 0),
            ("handshakes_per_s_vs_quic", "hs/quinn", 1.0, 2),
            ("handshakes_per_s_vs_tcp-tls", "hs/TLS", 1.0, 2),
            ("server_bytes_per_conn_vs_quic", "B/quinn", 1.0, 2),
            ("server_bytes_per_conn_vs_tcp-tls", "B/TLS", 1.0, 2),
        ],
        "bulk" => vec![
            ("goodput_mbps", "goodput Gbit/s", 1e-3, 2),
            ("cpu_s_per_gb", "CPU s/GB", 1.0, 2),
            ("cpu_client_s_per_gb", "client", 1.0, 2),
            ("cpu_server_s_per_gb", "server", 1.0, 2),
            ("goodput_vs_tcp", "goodput/TCP", 1.0, 2),
            ("goodput_vs_tcp-tls", "goodput/TLS", 1.0, 2),
            ("goodput_vs_quic", "goodput/quinn", 1.0, 2),
            ("cpu_s_per_gb_vs_quic", "CPU/quinn", 1.0, 2),
            ("sender_packets_lost", "lost pkts", 1.0, 0),
            ("sender_spurious_losses", "spurious", 1.0, 0),
            ("sender_bytes_retransmitted", "resent kB", 1e-3, 0),
            ("udp_rcvbuf_errors", "UDP rcvbuf errs", 1.0, 0),
            ("udp_sndbuf_errors", "UDP sndbuf errs", 1.0, 0),
            ("udp_in_errors", "UDP in errs", 1.0, 0),
            ("receiver_socket_drops", "socket drops", 1.0, 0),
        ],
        "multipath" => vec![
            ("goodput_mbps", "goodput Mbit/s", 1.0, 1),
            ("goodput_of_sum", "of sum", 1.0, 2),
            ("goodput_vs_one", "/ one path", 1.0, 2),
            ("goodput_vs_mptcp", "/ MPTCP", 1.0, 2),
            ("link_r1_down_mb", "path 1 MB", 1.0, 1),
            ("link_r2_down_mb", "path 2 MB", 1.0, 1),
            ("paths_used", "tern paths", 1.0, 0),
        ],
        "handover" => vec![
            ("completed", "done", 1.0, 0),
            ("bytes_lost", "bytes lost", 1.0, 0),
            ("stall_ms", "stall ms", 1.0, 0),
            ("stall_target_ms", "target ms", 1.0, 0),
            ("stall_at_ms", "stall at ms", 1.0, 0),
            ("connections", "conns", 1.0, 0),
            ("reconnect_ms", "reconnect ms", 1.0, 0),
            ("recovered_ms", "rate back ms", 1.0, 0),
            ("window_resume_ms", "reopen→data ms", 1.0, 0),
            ("goodput_mbps", "goodput Mbit/s", 1.0, 1),
        ],
        "cc" => vec![
            ("goodput_mbps", "throughput Mbit/s", 1.0, 1),
            ("utilisation_pct", "util %", 1.0, 0),
            ("queue_delay_mean_ms", "qdelay mean ms", 1.0, 1),
            ("queue_delay_p95_ms", "qdelay p95 ms", 1.0, 1),
            ("goodput_vs_tcp-bbr", "tput/BBR", 1.0, 2),
            ("queue_delay_p95_vs_tcp-bbr", "qdelay95/BBR", 1.0, 2),
            ("rtt_p50_ms", "MAR p50 ms", 1.0, 1),
            ("rtt_p99_ms", "MAR p99 ms", 1.0, 1),
            ("rtt_p99_vs_tcp", "p99/TCP", 1.0, 2),
            ("rtt_p99_vs_quic", "p99/quinn", 1.0, 2),
            ("lost_pct", "unanswered %", 1.0, 1),
            ("on_time_pct", "MAR on time %", 1.0, 1),
            ("on_time_size_mean_bytes", "on-time size kB", 1e-3, 1),
        ],
        "fairness" => vec![
            ("jain_mean", "Jain mean", 1.0, 3),
            ("jain_min", "Jain min", 1.0, 3),
            ("throughput_mbps", "total Mbit/s", 1.0, 3),
            ("flow0_mbps", "flow 0", 1.0, 3),
            ("flow1_mbps", "flow 1", 1.0, 3),
            ("flow2_mbps", "flow 2", 1.0, 3),
            ("utilisation_pct", "util %", 1.0, 1),
            ("util_b1_pct", "util b1 %", 1.0, 1),
            ("util_b2_pct", "util b2 %", 1.0, 1),
            ("link_utilisation_pct", "link util %", 1.0, 1),
            ("queue_delay_mean_ms", "qdelay mean ms", 1.0, 1),
            ("queue_delay_p95_ms", "qdelay p95 ms", 1.0, 1),
            ("queue_wait_mean_ms", "wait mean ms", 1.0, 2),
            ("queue_wait_steady_mean_ms", "steady wait ms", 1.0, 2),
            ("queue_wait_steady_p95_ms", "steady wait p95", 1.0, 1),
            ("qdelay_b1_p95_ms", "b1 p95 ms", 1.0, 1),
            ("qdelay_b2_p95_ms", "b2 p95 ms", 1.0, 1),
            ("frames_sent", "frames", 1.0, 0),
            ("frames_missed", "missed", 1.0, 0),
            ("miss_pct", "miss %", 1.0, 1),
            ("frame_size_mean_bytes", "frame kB", 1e-3, 2),
            ("flows_failed", "failed", 1.0, 0),
        ],
        "coexist" => vec![
            ("flow0_mbps", "row's flow Mbit/s", 1.0, 2),
            ("flow1_mbps", "TCP CUBIC Mbit/s", 1.0, 2),
            ("share_pct", "row's share %", 1.0, 1),
            ("jain_mean", "Jain mean", 1.0, 3),
            ("link_utilisation_pct", "link util %", 1.0, 1),
            ("queue_drop_pct", "queue drops %", 1.0, 2),
            ("queue_delay_mean_ms", "qdelay mean ms", 1.0, 1),
            ("flows_failed", "failed", 1.0, 0),
        ],
        _ => vec![],
    }
}

fn fmt(v: Option<f64>, scale: f64, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{:.*}", decimals, v * scale),
        _ => "–".into(),
    }
}

fn param_keys(rows: &[Row]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for r in rows {
        for k in r.params.keys() {
            if !keys.contains(k)
                && !["error", "rep", "duration_s", "stall_target_ms"].contains(&k.as_str())
            {
                keys.push(k.clone());
            }
        }
    }
    // Put the size last: tables read "case, size, protocol".
    keys.sort_by_key(|k| (k == "size", k.clone()));
    keys
}

/// Rows, averaged over repetitions (`rep`), in (params, protocol order) order.
fn merged_rows(run: &RunFile) -> Vec<Row> {
    let mut out: Vec<(Row, Vec<Row>)> = Vec::new();
    for r in &run.summary {
        let mut key = r.clone();
        key.params.remove("rep");
        key.params.remove("error");
        key.metrics.clear();
        match out
            .iter_mut()
            .find(|(k, _)| k.protocol == key.protocol && k.params == key.params)
        {
            Some((_, v)) => v.push(r.clone()),
            None => out.push((key, vec![r.clone()])),
        }
    }
    let protos = run.protocols();
    let mut rows: Vec<Row> = out
        .into_iter()
        .map(|(mut k, v)| {
            let mut names: Vec<&String> = v.iter().flat_map(|r| r.metrics.keys()).collect();
            names.sort();
            names.dedup();
            for n in names {
                let vals: Vec<f64> = v.iter().filter_map(|r| r.metric(n)).collect();
                k.metrics.insert(n.clone(), stats::mean(&vals));
            }
            if v.iter().any(|r| r.params.contains_key("error")) {
                k.params.insert("error".into(), serde_json::json!(true));
            }
            k
        })
        .collect();
    let keys = param_keys(&rows);
    rows.sort_by(|a, b| {
        for k in &keys {
            let (x, y) = (a.num(k), b.num(k));
            let o = match (x, y) {
                (Some(x), Some(y)) => x.total_cmp(&y),
                _ => a.text(k).cmp(&b.text(k)),
            };
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        }
        let pa = protos.iter().position(|p| *p == a.protocol);
        let pb = protos.iter().position(|p| *p == b.protocol);
        pa.cmp(&pb)
    });
    rows
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn param_text(r: &Row, k: &str) -> String {
    let pow2 = |v: f64| v >= 1024.0 && (v as u64).is_power_of_two();
    match (k, r.num(k)) {
        ("size", Some(v)) if pow2(v) && v >= 1_048_576.0 => format!("{} MiB", v / 1_048_576.0),
        ("size", Some(v)) if pow2(v) => format!("{} KiB", v / 1024.0),
        ("size", Some(v)) if v >= 1e6 => format!("{} MB", v / 1e6),
        ("size", Some(v)) if v >= 1e3 => format!("{} kB", v / 1e3),
        ("size", Some(v)) => format!("{v} B"),
        _ => crate::plot::value_text(r.params.get(k)),
    }
}

/// The HTML table of a run.
pub fn html_table(run: &RunFile) -> String {
    let rows = merged_rows(run);
    let keys = param_keys(&rows);
    let cols = columns(&run.scenario);
    let mut h = String::from("<table><thead><tr>");
    for k in &keys {
        let _ = write!(h, "<th>{}</th>", esc(k));
    }
    h += "<th>protocol</th>";
    for c in &cols {
        let _ = write!(h, "<th>{}</th>", esc(c.1));
    }
    h += "</tr></thead><tbody>\n";
    for r in &rows {
        let cls = if r.protocol == "tern" {
            " class=\"tern\""
        } else {
            ""
        };
        let _ = write!(h, "<tr{cls}>");
        for k in &keys {
            let _ = write!(h, "<td>{}</td>", esc(&param_text(r, k)));
        }
        let err = if r.params.contains_key("error") {
            " ⚠"
        } else {
            ""
        };
        let _ = write!(h, "<td>{}{err}</td>", esc(&r.protocol));
        for c in &cols {
            let _ = write!(h, "<td>{}</td>", fmt(r.metric(c.0), c.2, c.3));
        }
        h += "</tr>\n";
    }
    h += "</tbody></table>\n";
    h
}

/// Markdown tables of a run. `mar` is pivoted (protocols × three sizes) to stay readable.
pub fn markdown(run: &RunFile) -> String {
    if run.scenario == "scale" {
        return crate::scale::markdown(run);
    }
    let rows = merged_rows(run);
    let mut m = String::new();
    let _ = writeln!(
        m,
        "**{} on {}{}** — {} (kernel {}, {} × {}), {}",
        run.scenario,
        run.profile,
        if run.variant.is_empty() {
            String::new()
        } else {
            format!(" ({})", run.variant)
        },
        run.date,
        run.machine.kernel,
        run.machine.cpus,
        run.machine.cpu_model,
        mode(run)
    );
    m += "\n";
    if run.scenario == "mar" {
        let sizes = [4_500.0, 26_100.0, 151_200.0];
        let deadline = crate::plot::value_text(run.settings.get("deadline_ms"));
        let deadline = if deadline.is_empty() {
            crate::plot::value_text(Some(&serde_json::json!(
                crate::scenario::DEFAULT_DEADLINE_MS
            )))
        } else {
            deadline
        };
        let mut losses: Vec<String> = rows
            .iter()
            .map(|r| crate::plot::value_text(r.params.get("loss")))
            .collect();
        losses.dedup();
        losses.sort();
        losses.dedup();
        for loss in losses {
            let _ = writeln!(m, "Loss {loss} %: RTT in ms and on-time % (answered within {deadline} ms, of every request sent) at request sizes 4.5 / 26.1 / 151.2 kB (an adaptive encoder's row: once, over every frame it sized); jitter and lost % averaged over all 9 sizes; on time (all) over every request of every size; sent and on-time kB: the mean size of every request sent and of those answered on time; p99/TCP is the mean over sizes of the p99 ratio.\n");
            m += "| protocol | p50 RTT | p99 RTT | std | jitter | lost % | on time % | on time (all) % | sent kB | on-time kB | p99/TCP |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
            for p in run.protocols() {
                let rs: Vec<&Row> = rows
                    .iter()
                    .filter(|r| {
                        r.protocol == p && crate::plot::value_text(r.params.get("loss")) == loss
                    })
                    .collect();
                if rs.is_empty() {
                    continue;
                }
                let adaptive = rs.iter().find(|r| {
                    r.params.get("size").and_then(serde_json::Value::as_str)
                        == Some(crate::scenario::ADAPTIVE_SIZE)
                });
                let at = |k: &str| {
                    if let Some(r) = adaptive {
                        return fmt(r.metric(k), 1.0, 1);
                    }
                    sizes
                        .iter()
                        .map(|s| {
                            fmt(
                                rs.iter()
                                    .find(|r| r.num("size") == Some(*s))
                                    .and_then(|r| r.metric(k)),
                                1.0,
                                1,
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(" / ")
                };
                let avg = |k: &str, d: usize| {
                    let v: Vec<f64> = rs.iter().filter_map(|r| r.metric(k)).collect();
                    fmt(Some(stats::mean(&v)), 1.0, d)
                };
                let name = if p == "tern" {
                    "**tern**".to_string()
                } else {
                    p.clone()
                };
                // Every request of every size: the rows' fractions weighted by their counts.
                let (mut sent, mut on_time) = (0.0, 0.0);
                for r in &rs {
                    if let (Some(n), Some(pct)) = (r.metric("n"), r.metric("on_time_pct")) {
                        sent += n;
                        on_time += n * pct;
                    }
                }
                let all = (sent > 0.0).then(|| on_time / sent);
                // Mean sizes over every request: sent weighted by count, on time by the
                // number answered on time.
                let (mut sent_bytes, mut ok_n, mut ok_bytes) = (0.0, 0.0, 0.0);
                for r in &rs {
                    let n = r.metric("n").unwrap_or(0.0);
                    if let Some(s) = r.metric("sent_size_mean_bytes") {
                        sent_bytes += n * s;
                    }
                    if let (Some(pct), Some(s)) =
                        (r.metric("on_time_pct"), r.metric("on_time_size_mean_bytes"))
                    {
                        ok_n += n * pct / 100.0;
                        ok_bytes += n * pct / 100.0 * s;
                    }
                }
                let sent_kb = (sent > 0.0 && sent_bytes > 0.0).then(|| sent_bytes / sent);
                let ok_kb = (ok_n > 0.0).then(|| ok_bytes / ok_n);
                let _ = writeln!(
                    m,
                    "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    at("rtt_p50_ms"),
                    at("rtt_p99_ms"),
                    at("rtt_std_ms"),
                    avg("jitter_ms", 2),
                    avg("lost_pct", 1),
                    at("on_time_pct"),
                    fmt(all, 1.0, 1),
                    fmt(sent_kb, 1e-3, 1),
                    fmt(ok_kb, 1e-3, 1),
                    avg("rtt_p99_vs_tcp", 2)
                );
            }
            m += "\n";
        }
        return m;
    }
    let keys = param_keys(&rows);
    let cols = columns(&run.scenario);
    for k in &keys {
        let _ = write!(m, "| {k} ");
    }
    m += "| protocol ";
    for c in &cols {
        let _ = write!(m, "| {} ", c.1);
    }
    m += "|\n";
    m += &"|---".repeat(keys.len() + 1 + cols.len());
    m += "|\n";
    for r in &rows {
        for k in &keys {
            let _ = write!(m, "| {} ", param_text(r, k));
        }
        let name = if r.protocol == "tern" {
            "**tern**".to_string()
        } else {
            r.protocol.clone()
        };
        let _ = write!(m, "| {name} ");
        for c in &cols {
            let _ = write!(m, "| {} ", fmt(r.metric(c.0), c.2, c.3));
        }
        m += "|\n";
    }
    m
}

/// `--quick`, `full`, or the `--count` given.
fn mode(run: &RunFile) -> String {
    let base = if run.quick { "--quick" } else { "full" };
    match run
        .settings
        .get("count")
        .and_then(serde_json::Value::as_u64)
    {
        Some(n) => format!("{base}, --count {n}"),
        None => base.to_string(),
    }
}

fn inline_svg(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    match text.find("<svg") {
        Some(i) => text[i..].to_string(),
        None => String::new(),
    }
}

/// One HTML page of every run, with its figures.
pub fn html(runs: &[(RunFile, Vec<(String, PathBuf)>)]) -> String {
    let mut h = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>tern-bench results</title>\n<style>\n\
body{font-family:sans-serif;max-width:1500px;margin:1em auto;padding:0 1em;color:#222}\n\
table{border-collapse:collapse;font-size:13px;margin:.5em 0}\ntd,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\n\
th{background:#f3f3f3}\ntr.tern td{background:#fdecea}\n.figs{display:flex;flex-wrap:wrap;gap:8px}\n\
.figs figure{margin:0;border:1px solid #eee}\n.figs figcaption{font-size:12px;padding:2px 6px}\n\
.meta{font-size:13px;color:#555}\ncode,pre{font-size:12px}\n</style></head><body>\n\
<h1>tern-bench results</h1>\n<p class=\"meta\">Every protocol of a run ran in the same run over the same emulated link; ratios compare rows of one run. \
Made by <code>tern-bench report</code>; the JSON files beside this page hold every sample.</p>\n<ul>\n",
    );
    for (run, _) in runs {
        let stem = run.file_stem();
        let _ = writeln!(
            h,
            "<li><a href=\"#{stem}\">{stem}</a> — {} ({})</li>",
            esc(&run.date),
            mode(run)
        );
    }
    h += "</ul>\n";
    for (run, figs) in runs {
        let stem = run.file_stem();
        let _ = writeln!(
            h,
            "<h2 id=\"{stem}\">{} on {}{}</h2>",
            esc(&run.scenario),
            esc(&run.profile),
            if run.variant.is_empty() {
                String::new()
            } else {
                format!(" ({})", esc(&run.variant))
            }
        );
        let scen = crate::scenario::SCENARIOS
            .iter()
            .find(|s| s.0 == run.scenario)
            .map_or("", |s| s.1);
        let _ = writeln!(h, "<p>{}</p>", esc(scen));
        let _ = writeln!(
            h,
            "<p class=\"meta\">{} · {:.0} s · {} · kernel {} · {} × {} · {:.0} GiB · load {:.2} at start · <code>{}</code></p>",
            esc(&run.date),
            run.duration_s,
            esc(&run.machine.os),
            esc(&run.machine.kernel),
            run.machine.cpus,
            esc(&run.machine.cpu_model),
            run.machine.mem_gib,
            run.machine.load_avg_start,
            esc(&run.command.join(" "))
        );
        let versions: Vec<String> = run
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            h,
            "<p class=\"meta\">Versions: {}</p>",
            esc(&versions.join(", "))
        );
        if !run.skipped.is_empty() {
            let s: Vec<String> = run
                .skipped
                .iter()
                .map(|s| format!("{}: {}", s.protocol, s.reason))
                .collect();
            let _ = writeln!(h, "<p class=\"meta\">Not run: {}</p>", esc(&s.join("; ")));
        }
        let errors: Vec<String> = run
            .cases
            .iter()
            .filter_map(|c| {
                c.error.as_ref().map(|e| {
                    format!(
                        "{} {}: {}",
                        c.protocol,
                        serde_json::to_string(&c.params).unwrap_or_default(),
                        e
                    )
                })
            })
            .collect();
        if !errors.is_empty() {
            h += "<details><summary>Errors (⚠ rows)</summary><pre>";
            h += &esc(&errors.join("\n"));
            h += "</pre></details>\n";
        }
        h += &html_table(run);
        h += "<div class=\"figs\">\n";
        for (cap, path) in figs {
            let _ = writeln!(
                h,
                "<figure>{}<figcaption>{}</figcaption></figure>",
                inline_svg(path),
                esc(cap)
            );
        }
        h += "</div>\n";
        let _ = writeln!(
            h,
            "<details><summary>Settings</summary><pre>{}</pre></details>",
            esc(&serde_json::to_string_pretty(&run.settings).unwrap_or_default())
        );
    }
    h += "</body></html>\n";
    h
}
