//! SVG figures with plotters, drawn like the source papers draw them: the MAR study's
//! RTT / jitter / throughput against frame size with one line per protocol; Viscous' mean
//! flow completion time against the number of parallel threads and FCT CDFs; completion time
//! against file size on log axes; SLTP's bars for start-up and bulk and RTT against message
//! size (log-log) per CPU load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use plotters::prelude::*;
use serde_json::Value;

use crate::results::{stats, Row, RunFile};

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text (a protocol name picks its colour).
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
    /// A reference line (black, no markers).
    pub reference: bool,
}

/// A protocol's colour, the same in every figure.
pub fn colour(name: &str) -> RGBColor {
    match name {
        "tern" => RGBColor(214, 39, 40),
        "tcp" => RGBColor(31, 119, 180),
        "tcp-bbr" => RGBColor(23, 190, 207),
        "tcp-tls" => RGBColor(57, 59, 121),
        "mptcp" => RGBColor(148, 103, 189),
        "quic" => RGBColor(44, 160, 44),
        "udp" => RGBColor(127, 127, 127),
        "rtp" => RGBColor(188, 189, 34),
        "udt" => RGBColor(255, 127, 14),
        "srt" => RGBColor(140, 86, 75),
        // tern with a named controller (`--tern-cc`, the `cc` scenario): one colour each.
        n if n.starts_with("tern") && n.ends_with("-newreno") => RGBColor(255, 152, 150),
        n if n.starts_with("tern") && n.ends_with("-cubic") => RGBColor(214, 39, 40),
        n if n.starts_with("tern") && n.ends_with("-bbr") => RGBColor(140, 20, 20),
        n if n.starts_with("tern") && n.ends_with("-udt") => RGBColor(255, 187, 120),
        n if n.starts_with("tern") && n.ends_with("-copa") => RGBColor(227, 119, 194),
        "tern-ncr" => RGBColor(120, 0, 60),
        // tern's message modes: the same hue, darker; with a deadline, pink.
        "tern-msg" => RGBColor(140, 20, 20),
        n if n.starts_with("tern-msg-") => RGBColor(227, 119, 194),
        _ => RGBColor(0, 0, 0),
    }
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else if a > 0.0 && a < 0.01 {
        format!("{v:.0e}")
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// A line chart; log axes are drawn by plotting log10 values with 10^v labels.
pub fn line_chart(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    (log_x, log_y): (bool, bool),
) -> anyhow::Result<()> {
    let tx = |v: f64| if log_x { v.max(1e-9).log10() } else { v };
    let ty = |v: f64| if log_y { v.max(1e-9).log10() } else { v };
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| (tx(x), ty(y)))
        .collect();
    if pts.is_empty() {
        return Err(anyhow!("no data for {title}"));
    }
    let (mut x0, mut x1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
        (a.0.min(p.0), a.1.max(p.0))
    });
    let (mut y0, mut y1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
        (a.0.min(p.1), a.1.max(p.1))
    });
    if !log_y {
        y0 = y0.min(0.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let xpad = (x1 - x0) * 0.03;
    let ypad = (y1 - y0) * 0.08;
    x0 -= xpad;
    x1 += xpad;
    if log_y {
        y0 -= ypad;
    }
    y1 += ypad;
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let xf = move |v: &f64| fmt_num(if log_x { 10f64.powf(*v) } else { *v });
    let yf = move |v: &f64| fmt_num(if log_y { 10f64.powf(*v) } else { *v });
    // On log axes, one label per decade.
    // (Less than two decades: let plotters pick finer log-space steps.)
    let decades = |a: f64, b: f64| {
        if b - a < 2.0 {
            6
        } else {
            ((b.floor() - a.ceil()) as usize + 1).clamp(2, 12)
        }
    };
    let nx = if log_x { decades(x0, x1) } else { 10 };
    let ny = if log_y { decades(y0, y1) } else { 10 };
    chart
        .configure_mesh()
        .x_labels(nx)
        .y_labels(ny)
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    for s in series {
        let c = if s.reference {
            RGBColor(0, 0, 0)
        } else {
            colour(&s.name)
        };
        let data: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| (tx(x), ty(y)))
            .collect();
        if data.is_empty() {
            continue;
        }
        let width = if s.name == "tern" { 3 } else { 2 };
        let drawn = if s.reference {
            chart
                .draw_series(DashedLineSeries::new(data.clone(), 6, 4, c.stroke_width(1)))
                .map_err(err)?
        } else {
            chart
                .draw_series(LineSeries::new(data.clone(), c.stroke_width(width)))
                .map_err(err)?
        };
        drawn
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        if !s.reference && data.len() <= 40 {
            chart
                .draw_series(data.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Grouped bars: one group per category, one bar per series.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> anyhow::Result<()> {
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if ymax <= 0.0 || categories.is_empty() {
        return Err(anyhow!("no data for {title}"));
    }
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = categories.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..n, 0.0..ymax * 1.15)
        .map_err(err)?;
    let cats = categories.to_vec();
    let xf = move |v: &f64| {
        let i = v.floor() as usize;
        if (v - v.floor() - 0.5).abs() < 0.26 {
            cats.get(i).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(categories.len() * 2 + 1)
        .x_label_formatter(&xf)
        .y_desc(y_label)
        .y_label_formatter(&|v| fmt_num(*v))
        .draw()
        .map_err(err)?;
    let k = series.len().max(1) as f64;
    let w = 0.8 / k;
    for (si, (name, values)) in series.iter().enumerate() {
        let c = if name == "ideal" {
            RGBColor(170, 170, 170)
        } else {
            colour(name)
        };
        // Bars of a protocol's category take the protocol's colour; every series after the
        // first is drawn lighter, so that series sharing those colours stay apart (`bulk`'s
        // worker counts).
        let opacity = if si == 0 || name == "ideal" {
            1.0
        } else {
            0.45
        };
        let bars: Vec<Rectangle<(f64, f64)>> = values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(ci, v)| {
                let x = ci as f64 + 0.1 + si as f64 * w;
                let cc = match categories.get(ci) {
                    Some(cat) if name != "ideal" && colour(cat) != RGBColor(0, 0, 0) => colour(cat),
                    _ => c,
                };
                Rectangle::new([(x, 0.0), (x + w * 0.92, *v)], cc.mix(opacity).filled())
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.mix(opacity).filled())
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A parameter value as text: numbers without a trailing `.0`.
pub fn value_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if f == f.trunc() && f.abs() < 1e15 => format!("{}", f as i64),
            Some(f) => format!("{f}"),
            None => n.to_string(),
        },
        Some(v) => v.to_string(),
        None => String::new(),
    }
}

fn pval(r: &Row, key: &str) -> String {
    value_text(r.params.get(key))
}

/// Rows grouped by the values of `keys` (in first-seen order).
fn groups<'a>(rows: &'a [Row], keys: &[&str]) -> Vec<(Vec<String>, Vec<&'a Row>)> {
    let mut out: Vec<(Vec<String>, Vec<&Row>)> = Vec::new();
    for r in rows {
        let k: Vec<String> = keys.iter().map(|k| pval(r, k)).collect();
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

fn by_protocol(rows: &[&Row], x: impl Fn(&Row) -> Option<f64>, y: &str) -> Vec<Series> {
    let mut m: BTreeMap<usize, Series> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for r in rows {
        if !order.contains(&r.protocol) {
            order.push(r.protocol.clone());
        }
        let i = order.iter().position(|p| *p == r.protocol).unwrap_or(0);
        let s = m.entry(i).or_insert_with(|| Series {
            name: r.protocol.clone(),
            points: vec![],
            reference: false,
        });
        if let (Some(x), Some(y)) = (x(r), r.metric(y)) {
            s.points.push((x, y));
        }
    }
    let mut v: Vec<Series> = m.into_values().collect();
    for s in &mut v {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    v
}

/// The mean of `protocol`'s `key` over `rows` (NaN when none has it).
fn protocol_mean<'a>(rows: impl IntoIterator<Item = &'a Row>, protocol: &str, key: &str) -> f64 {
    let v: Vec<f64> = rows
        .into_iter()
        .filter(|r| r.protocol == protocol)
        .filter_map(|r| r.metric(key))
        .collect();
    stats::mean(&v)
}

fn tag(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| p.replace('.', "p").replace([' ', '"'], ""))
        .collect::<Vec<_>>()
        .join("-")
}

/// Draws every figure of a run into `dir`; returns (caption, file) pairs.
pub fn render(run: &RunFile, dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let stem = run.file_stem();
    let mut out = Vec::new();
    let mut draw = |name: String, caption: String, f: &dyn Fn(&Path) -> anyhow::Result<()>| {
        let path = dir.join(format!("{stem}-{name}.svg"));
        match f(&path) {
            Ok(()) => out.push((caption, path)),
            Err(e) => eprintln!("figure {name}: {e:#}"),
        }
    };
    let rows = &run.summary;
    let prof = &run.profile;
    match run.scenario.as_str() {
        "mar" => {
            for (g, rs) in groups(rows, &["loss"]) {
                let loss = &g[0];
                for (metric, label, what) in [
                    ("rtt_p50_ms", "median RTT (ms)", "rtt-p50"),
                    ("rtt_p99_ms", "99th-percentile RTT (ms)", "rtt-p99"),
                    ("jitter_ms", "jitter: mean |ΔRTT| (ms)", "jitter"),
                    ("throughput_mbps", "throughput (Mbit/s)", "throughput"),
                    (
                        "on_time_pct",
                        "answered within the deadline (% of sent)",
                        "on-time",
                    ),
                ] {
                    // An adaptive row (one over every frame the encoder sized) is a point at
                    // its mean frame size.
                    let x = |r: &Row| {
                        r.num("size")
                            .or_else(|| r.metric("sent_size_mean_bytes"))
                            .map(|s| s / 1e3)
                    };
                    let mut series = by_protocol(&rs, x, metric);
                    series.retain(|s| !s.points.is_empty());
                    if metric == "rtt_p50_ms" {
                        let mut ideal: Vec<(f64, f64)> = rs
                            .iter()
                            .filter_map(|r| Some((r.num("size")? / 1e3, r.metric("ideal_ms")?)))
                            .collect();
                        ideal.sort_by(|a, b| a.0.total_cmp(&b.0));
                        ideal.dedup_by(|a, b| a.0 == b.0);
                        if !ideal.is_empty() {
                            series.push(Series {
                                name: "ideal".into(),
                                points: ideal,
                                reference: true,
                            });
                        }
                    }
                    let caption = format!("MAR, {prof}, {loss} % loss: {label} vs request size");
                    let t = caption.clone();
                    // Delays span 5 ms to seconds: log scale, as the study's CDFs do.
                    let log_y = metric != "throughput_mbps";
                    draw(
                        format!("{what}-loss{}", tag(std::slice::from_ref(loss))),
                        caption,
                        &move |p| {
                            line_chart(p, &t, ("request size (kB)", label), &series, (false, log_y))
                        },
                    );
                }
            }
        }
        "echo-sizes" => {
            for (g, rs) in groups(rows, &["load"]) {
                let series = by_protocol(&rs, |r| r.num("size"), "rtt_p50_ms");
                let caption = format!(
                    "Echo, {prof}, CPU load {} %: median round trip vs message size",
                    g[0]
                );
                let t = caption.clone();
                draw(format!("rtt-load{}", tag(&g)), caption, &move |p| {
                    line_chart(
                        p,
                        &t,
                        ("message size (bytes)", "median round trip (ms)"),
                        &series,
                        (true, true),
                    )
                });
            }
        }
        "short-flows" => {
            for (g, rs) in groups(rows, &["rtt_ms", "background"]) {
                let bg = if g[1] == "true" { "with" } else { "without" };
                let series = by_protocol(&rs, |r| r.num("threads"), "fct_mean_ms");
                let caption = format!(
                    "Short flows, RTT {} ms, {bg} background TCP: mean FCT vs threads",
                    g[0]
                );
                let t = caption.clone();
                draw(
                    format!("fct-rtt{}-bg{}", tag(&[g[0].clone()]), g[1]),
                    caption,
                    &move |p| {
                        line_chart(
                            p,
                            &t,
                            ("parallel threads", "mean flow completion time (ms)"),
                            &series,
                            (false, false),
                        )
                    },
                );
                // FCT CDF at the largest thread count.
                let max_t = rs
                    .iter()
                    .filter_map(|r| r.num("threads"))
                    .fold(0.0, f64::max);
                let mut cdfs = Vec::new();
                for c in &run.cases {
                    let same = |k: &str, v: &str| value_text(c.params.get(k)) == v;
                    if same("rtt_ms", &g[0])
                        && same("background", &g[1])
                        && c.params.get("threads").and_then(Value::as_f64) == Some(max_t)
                    {
                        let f: Vec<f64> = c.flows.iter().filter_map(|f| f.fct_ms).collect();
                        cdfs.push(Series {
                            name: c.protocol.clone(),
                            points: stats::cdf(&f),
                            reference: false,
                        });
                    }
                }
                if !cdfs.is_empty() {
                    let caption = format!(
                        "Short flows, RTT {} ms, {bg} background, {max_t} threads: FCT CDF",
                        g[0]
                    );
                    let t = caption.clone();
                    draw(
                        format!("cdf-rtt{}-bg{}", tag(&[g[0].clone()]), g[1]),
                        caption,
                        &move |p| {
                            line_chart(
                                p,
                                &t,
                                ("flow completion time (ms)", "fraction of flows"),
                                &cdfs,
                                (true, false),
                            )
                        },
                    );
                }
            }
        }
        "long-flow" => {
            let all: Vec<&Row> = rows.iter().collect();
            let series = by_protocol(&all, |r| r.num("size"), "fct_mean_ms");
            let series: Vec<Series> = series
                .into_iter()
                .map(|mut s| {
                    s.points.iter_mut().for_each(|p| p.1 /= 1e3);
                    s
                })
                .collect();
            let caption = format!("Long flow, {prof}: completion time vs size");
            let t = caption.clone();
            draw("completion".into(), caption, &move |p| {
                line_chart(
                    p,
                    &t,
                    ("transfer size (bytes)", "completion time (s)"),
                    &series,
                    (true, true),
                )
            });
        }
        "multipath" | "handover" => {
            // Bytes delivered against time, one line per protocol, per case: a stall is a
            // flat stretch, a path's loss a change of slope.
            let key = if run.scenario == "multipath" {
                "paths"
            } else {
                "event"
            };
            let mut names: Vec<String> = run
                .cases
                .iter()
                .map(|c| value_text(c.params.get(key)))
                .collect();
            names.dedup();
            names.sort();
            names.dedup();
            for name in names {
                let series: Vec<Series> = run
                    .cases
                    .iter()
                    .filter(|c| value_text(c.params.get(key)) == name)
                    .filter_map(|c| {
                        let t = c.transfer.as_ref()?;
                        let mut total = 0.0;
                        let mut points = vec![(0.0, 0.0)];
                        for (i, b) in t.bins.iter().enumerate() {
                            total += *b as f64 / 1e6;
                            points.push(((i + 1) as f64 * t.bin_ms as f64 / 1e3, total));
                        }
                        Some(Series {
                            name: c.protocol.clone(),
                            points,
                            reference: false,
                        })
                    })
                    .collect();
                if series.is_empty() {
                    continue;
                }
                let caption = if run.scenario == "multipath" {
                    format!("Multipath, {prof}, paths {name}: bytes delivered vs time")
                } else {
                    format!("Handover, {prof}, event {name} at 5 s: bytes delivered vs time")
                };
                let t = caption.clone();
                draw(
                    format!("delivered-{}", tag(std::slice::from_ref(&name))),
                    caption,
                    &move |p| {
                        line_chart(
                            p,
                            &t,
                            ("time since the client started (s)", "delivered (MB)"),
                            &series,
                            (false, false),
                        )
                    },
                );
            }
        }
        "cc" => {
            // The Pantheon view: one point per scheme, throughput against the queueing delay
            // it built (delay axis on a log scale; better is up and to the left).
            let bulk: Vec<&Row> = rows.iter().filter(|r| pval(r, "load") == "bulk").collect();
            let series = by_protocol(&bulk, |r| r.metric("queue_delay_p95_ms"), "goodput_mbps");
            let secs = run
                .settings
                .get("duration_s")
                .and_then(Value::as_u64)
                .unwrap_or(20);
            let loss = bulk.first().map(|r| pval(r, "loss")).unwrap_or_default();
            let caption = format!(
                "Controllers, {prof}, {loss} % loss: {secs} s bulk, throughput vs p95 queueing delay"
            );
            let t = caption.clone();
            draw("plane".into(), caption, &move |p| {
                line_chart(
                    p,
                    &t,
                    (
                        "95th-percentile queueing delay (ms, log; better ←)",
                        "throughput (Mbit/s)",
                    ),
                    &series,
                    (true, false),
                )
            });
            let protos = run.protocols();
            let p99: Vec<(String, Vec<f64>)> = vec![(
                "p99".into(),
                protos
                    .iter()
                    .map(|p| {
                        rows.iter()
                            .filter(|r| &r.protocol == p && r.metric("rtt_p99_ms").is_some())
                            .find_map(|r| r.metric("rtt_p99_ms"))
                            .unwrap_or(f64::NAN)
                    })
                    .collect(),
            )];
            let caption = format!("Controllers, {prof}: MAR requests, 99th-percentile RTT");
            let t = caption.clone();
            let cats = protos.clone();
            draw("mar-p99".into(), caption, &move |p| {
                bar_chart(p, &t, "p99 RTT (ms)", &cats, &p99)
            });
        }
        "fairness" => {
            // NC-TCP's figures: Jain's index over time, one line per row, per case; and the
            // throughput–queueing-delay plane (better is up and to the left).
            // A case is its name and its load (`together-video`; files written before
            // loads existed have none).
            let fair_name = |p: &BTreeMap<String, Value>| {
                let case = value_text(p.get("case"));
                match p.get("load") {
                    Some(l) => format!("{case}-{}", value_text(Some(l))),
                    None => case,
                }
            };
            let mut names: Vec<String> = Vec::new();
            for c in &run.cases {
                let name = fair_name(&c.params);
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            for name in names {
                let series: Vec<Series> = run
                    .cases
                    .iter()
                    .filter(|c| fair_name(&c.params) == name)
                    .map(|c| Series {
                        name: c.protocol.clone(),
                        points: crate::scenario::jain_over_time(c),
                        reference: false,
                    })
                    .collect();
                let caption = format!("Fairness, {prof}, {name}: Jain's index per second");
                let t = caption.clone();
                draw(
                    format!("jain-{}", tag(std::slice::from_ref(&name))),
                    caption,
                    &move |p| {
                        line_chart(
                            p,
                            &t,
                            ("time since the first flow started (s)", "Jain's index"),
                            &series,
                            (false, false),
                        )
                    },
                );
                let rs: Vec<&Row> = rows
                    .iter()
                    .filter(|r| fair_name(&r.params) == name)
                    .collect();
                let series =
                    by_protocol(&rs, |r| r.metric("queue_delay_p95_ms"), "throughput_mbps");
                let caption =
                    format!("Fairness, {prof}, {name}: total throughput vs p95 queueing delay");
                let t = caption.clone();
                draw(
                    format!("plane-{}", tag(std::slice::from_ref(&name))),
                    caption,
                    &move |p| {
                        line_chart(
                        p,
                        &t,
                        (
                            "95th-percentile queueing delay at the bottleneck (ms, log; better ←)",
                            "throughput of the three flows (Mbit/s)",
                        ),
                        &series,
                        (true, false),
                    )
                    },
                );
            }
        }
        "initwin" => {
            // PaUDT's curve: completion time against tern's initial window, per flow size,
            // with the other protocols (their own initial windows) as flat references.
            for (g, rs) in groups(rows, &["size"]) {
                let mean = |p: &str| protocol_mean(rs.iter().copied(), p, "fct_mean_ms");
                let mut tern = Series {
                    name: "tern".into(),
                    points: vec![],
                    reference: false,
                };
                let mut others = Vec::new();
                for p in run.protocols() {
                    match p
                        .strip_prefix("tern-iw")
                        .and_then(|n| n.parse::<f64>().ok())
                    {
                        Some(iw) => tern.points.push((iw, mean(&p))),
                        None => others.push(Series {
                            points: vec![(8.0, mean(&p)), (64.0, mean(&p))],
                            name: p,
                            reference: false,
                        }),
                    }
                }
                tern.points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut series = vec![tern];
                series.extend(others);
                let size = &g[0];
                let caption = format!(
                    "Initial window, {prof}: {size}-byte flow completion vs tern's initial window"
                );
                let t = caption.clone();
                draw(format!("fct-size{}", tag(&g)), caption, &move |p| {
                    line_chart(
                        p,
                        &t,
                        ("initial window (packets, log)", "mean completion (ms)"),
                        &series,
                        (true, false),
                    )
                });
            }
        }
        "mss" => {
            let protos = run.protocols();
            let bulk: Vec<&Row> = rows.iter().filter(|r| pval(r, "load") == "bulk").collect();
            let goodput: Vec<(String, Vec<f64>)> = vec![(
                "goodput".into(),
                protos
                    .iter()
                    .map(|p| {
                        bulk.iter()
                            .find(|r| &r.protocol == p)
                            .and_then(|r| r.metric("goodput_mbps"))
                            .unwrap_or(f64::NAN)
                    })
                    .collect(),
            )];
            let caption = format!("Packet size, {prof}: bulk goodput per MSS");
            let t = caption.clone();
            let cats = protos.clone();
            draw("goodput".into(), caption, &move |p| {
                bar_chart(p, &t, "goodput (Mbit/s)", &cats, &goodput)
            });
            let echo: Vec<&Row> = rows.iter().filter(|r| pval(r, "load") == "echo").collect();
            let series = by_protocol(&echo, |r| r.num("size"), "rtt_p50_ms");
            let caption = format!("Packet size, {prof}: median round trip vs request size");
            let t = caption.clone();
            draw("rtt".into(), caption, &move |p| {
                line_chart(
                    p,
                    &t,
                    ("request size (bytes)", "median round trip (ms)"),
                    &series,
                    (true, true),
                )
            });
        }
        "startup" | "bulk" => {
            let protos = run.protocols();
            let mean_of = |p: &str, k: &str| protocol_mean(rows, p, k);
            if run.scenario == "startup" {
                let mut series: Vec<(String, Vec<f64>)> = vec![(
                    "completion".into(),
                    protos.iter().map(|p| mean_of(p, "fct_mean_ms")).collect(),
                )];
                series.push((
                    "ideal".into(),
                    protos.iter().map(|p| mean_of(p, "ideal_ms")).collect(),
                ));
                let caption = format!("Start-up, {prof}: 1 MB completion time vs the ideal");
                let t = caption.clone();
                let cats = protos.clone();
                draw("completion".into(), caption, &move |p| {
                    bar_chart(p, &t, "completion time (ms)", &cats, &series)
                });
            } else {
                // One series per worker-thread count (`threads`; older files have none).
                let per_threads = |key: &str, label: &str, scale: f64| -> Vec<(String, Vec<f64>)> {
                    groups(rows, &["threads"])
                        .into_iter()
                        .map(|(k, rs)| {
                            let name = match k[0].as_str() {
                                "" => label.to_string(),
                                "1" => "1 worker".to_string(),
                                t => format!("{t} workers"),
                            };
                            let values = protos
                                .iter()
                                .map(|p| protocol_mean(rs.iter().copied(), p, key) / scale)
                                .collect();
                            (name, values)
                        })
                        .collect()
                };
                let g = per_threads("goodput_mbps", "goodput", 1e3);
                let caption = "Bulk on loopback: goodput".to_string();
                let t = caption.clone();
                let cats = protos.clone();
                draw("goodput".into(), caption, &move |p| {
                    bar_chart(p, &t, "goodput (Gbit/s)", &cats, &g)
                });
                let c = per_threads("cpu_s_per_gb", "cpu", 1.0);
                let caption = "Bulk on loopback: CPU seconds per GB (client + server)".to_string();
                let t = caption.clone();
                let cats = protos.clone();
                draw("cpu".into(), caption, &move |p| {
                    bar_chart(p, &t, "CPU s per GB", &cats, &c)
                });
            }
        }
        _ => {}
    }
    Ok(out)
}
