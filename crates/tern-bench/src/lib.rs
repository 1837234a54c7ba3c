//! tern-bench: scenario × protocol × link profile → `results/*.json`, SVG figures and one
//! HTML report.
//!
//! The harness follows netbench's split (STYLE.md): [`scenario`] defines scenarios
//! independently of any protocol; [`proto`] has one driver per protocol (kernel TCP and
//! MPTCP, quinn, raw UDP, RTP, UDT, SRT, tern), each a client and a server that run as
//! agents inside tern-netem's namespaces ([`agent`]); [`runner`] is the collector that starts
//! them, bounds them in time and gathers their JSON lines with the emulator's counters; and
//! [`plot`] and [`report`] make the figures and the HTML page from the results files alone.
//!
//! Every protocol of a run runs in the same run over the same emulated link, one after the
//! other for each case; the emulator is restarted before each, so each protocol meets the
//! same seeded losses.
// A benchmark harness reads the real clock by nature (STYLE.md names tern-bench as one of
// the places where `Instant::now` belongs).
#![allow(clippy::disallowed_methods)]

pub mod agent;
pub mod plot;
pub mod profile;
pub mod proto;
pub mod report;
pub mod results;
pub mod robust;
pub mod runner;
pub mod scale;
pub mod scenario;
pub mod spec;
pub mod sysinfo;

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::results::RunFile;
use crate::scenario::RunOpts;
use crate::spec::Proto;

/// Runs a scenario and writes its results file and figures into `out`; returns the path of
/// the JSON file.
pub fn run(opts: &RunOpts, out: &Path) -> anyhow::Result<PathBuf> {
    if opts.scenario == "robustness" {
        // Its own collector: real processes on loopback, a relay and an attacker.
        return robust::run(opts, out);
    }
    if opts.scenario == "scale" {
        // Its own collector too: server and client processes on loopback, driven by stdin.
        return scale::run(opts, out);
    }
    let plan = scenario::plan(opts)?;
    let started = Instant::now();
    let mut file = RunFile::new(
        plan.scenario,
        plan.profile.name,
        plan.variant.clone(),
        opts.quick,
        plan.settings.clone(),
        plan.skipped.clone(),
    );
    let stem = file.file_stem();
    let logs = out.join("logs").join(&stem);
    let _ = std::fs::remove_dir_all(&logs);
    tern_netem::install_signal_cleanup().map_err(|e| anyhow::anyhow!("{e}"))?;
    // One network at a time: built for the first case that needs it, replaced (and the old
    // one removed) when a case needs another kind (`handover` uses two).
    let mut net: Option<runner::Net> = None;
    let mut networks = serde_json::Map::new();
    let protos: Vec<String> = plan
        .protocols
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    eprintln!(
        "tern-bench: {stem}: {} case(s) × [{}]; results in {}",
        plan.cases.len(),
        protos.join(", "),
        out.display()
    );
    for s in &plan.skipped {
        eprintln!("  not run: {}: {}", s.protocol, s.reason);
    }
    // tern runs once per mode; every other protocol once.
    let runs: Vec<(Proto, &str)> = plan
        .protocols
        .iter()
        .flat_map(|&p| {
            let modes: Vec<&str> = if p == Proto::Tern {
                plan.tern_modes.iter().map(String::as_str).collect()
            } else {
                vec!["flows"]
            };
            modes.into_iter().map(move |m| (p, m))
        })
        .collect();
    let total = plan.cases.len() * runs.len();
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for def in &plan.cases {
        if net.as_ref().map(runner::Net::kind) != Some(def.net) {
            drop(net.take());
            // With several networks, each keeps its agents' logs apart.
            let several = plan.cases.iter().any(|c| c.net != def.net);
            let dir = if several {
                logs.join(format!("{:?}", def.net).to_lowercase())
            } else {
                logs.clone()
            };
            let n = runner::Net::new(def.net, &dir)?
                .with_qlog(opts.qlog.as_ref().map(|q| q.join(&stem)));
            networks.insert(
                format!("{:?}", def.net).to_lowercase(),
                serde_json::Value::from(n.describe()),
            );
            file.settings["network"] = if networks.len() == 1 {
                serde_json::Value::from(n.describe())
            } else {
                serde_json::Value::Object(networks.clone())
            };
            if plan.protocols.contains(&Proto::Mptcp) {
                n.setup_mptcp()?;
            }
            net = Some(n);
        }
        let Some(net) = net.as_mut() else {
            continue;
        };
        let cfg = plan.emulation(def, opts.seed)?;
        for &(proto, tern_mode) in &runs {
            let what = format!(
                "{proto}{} {}",
                if proto == Proto::Tern {
                    format!(" ({tern_mode})")
                } else {
                    String::new()
                },
                serde_json::to_string(&def.params).unwrap_or_default()
            );
            if let Some((_, why)) = def.exclude.iter().find(|(p, _)| *p == proto) {
                pb.println(format!("  skip {what}: {why}"));
                pb.inc(1);
                continue;
            }
            pb.set_message(what.clone());
            // The router row: the same case with the bottlenecks as explicit-rate routers.
            let routed = proto == Proto::Tern && plan.routed_modes.iter().any(|m| m == tern_mode);
            if routed {
                net.configure(plan.emulation_routed(def, opts.seed, true)?.as_ref())?;
            } else {
                net.configure(cfg.as_ref())?;
            }
            let mut case = if def.multi.is_some() {
                net.run_flows(proto, def, tern_mode, plan.scenario)
            } else {
                net.run_case(proto, def, tern_mode, plan.scenario)
            };
            if routed {
                case.protocol = scenario::ROUTER_ROW.into();
            }
            case.params = def.params.clone();
            if let Some(e) = &case.error {
                pb.println(format!("  {what}: {e}"));
            }
            file.cases.push(case);
            pb.inc(1);
            // Keep what was measured even if a later case dies.
            file.duration_s = started.elapsed().as_secs_f64();
            file.summary = scenario::summarize(&file);
            file.write(out)?;
        }
    }
    pb.finish_and_clear();
    drop(net);
    file.duration_s = started.elapsed().as_secs_f64();
    file.summary = scenario::summarize(&file);
    let path = file.write(out)?;
    let figs = plot::render(&file, out)?;
    eprintln!(
        "wrote {} and {} figure(s) in {:.0} s",
        path.display(),
        figs.len(),
        file.duration_s
    );
    println!("{}", report::markdown(&file));
    Ok(path)
}

/// Reads every results file in `dir`, redraws the figures and writes `dir/index.html`.
pub fn report_dir(dir: &Path) -> anyhow::Result<(PathBuf, Vec<RunFile>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut runs = Vec::new();
    for p in paths {
        match RunFile::read(&p) {
            Ok(mut r) => {
                r.summary = scenario::summarize(&r);
                let figs = plot::render(&r, dir)?;
                runs.push((r, figs));
            }
            Err(e) => eprintln!("skipping {}: {e:#}", p.display()),
        }
    }
    let order = |s: &str| {
        scenario::SCENARIOS
            .iter()
            .position(|x| x.0 == s)
            .unwrap_or(99)
    };
    runs.sort_by(|a, b| {
        (order(&a.0.scenario), a.0.file_stem()).cmp(&(order(&b.0.scenario), b.0.file_stem()))
    });
    let html = report::html(&runs);
    let path = dir.join("index.html");
    std::fs::write(&path, html)?;
    Ok((path, runs.into_iter().map(|r| r.0).collect()))
}
