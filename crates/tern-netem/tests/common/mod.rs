//! Helpers for the integration tests: skipping where the emulator cannot run, and running
//! the `tern-netem probe` tools inside a topology's namespaces.

#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tern_netem::probe::Report;
use tern_netem::{DirectionConfig, Topology};

pub use tern_netem::test_prerequisites as prerequisites;

/// Serializes the tests of one binary that measure timing (two cores, shared).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A direction config from settings text.
pub fn cfg(settings: &str) -> DirectionConfig {
    let mut c = DirectionConfig::default();
    c.apply(settings).expect("settings");
    c
}

/// `tern-netem probe ARGS…` inside `node`, in the real-time class below the emulator's
/// threads when `chrt` is available, so that other work on the machine does not blur what is
/// measured (the emulator's accuracy).
pub fn probe(topo: &Topology, node: &str, args: &[&str]) -> Command {
    let exe = env!("CARGO_BIN_EXE_tern-netem");
    let chrt = Command::new("chrt")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let mut c = if chrt {
        let mut c = topo.command(node, "chrt").expect("node");
        c.args(["-f", "5", exe]);
        c
    } else {
        topo.command(node, exe).expect("node")
    };
    c.arg("probe").args(args);
    c
}

/// Runs a probe to completion and parses its report.
pub fn run(mut c: Command) -> Report {
    let out = c.stderr(Stdio::inherit()).output().expect("probe runs");
    assert!(out.status.success(), "probe failed: {:?}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    Report::parse(line)
}

/// A probe running in the background (a server or receiver), killed if dropped unfinished.
pub struct Background {
    child: Option<Child>,
    stdout: BufReader<ChildStdout>,
}

impl Background {
    /// Starts the probe and waits for its "ready" line.
    pub fn start(mut c: Command) -> Self {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("probe starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("ready line");
        assert_eq!(line.trim(), "ready", "probe did not start");
        Self {
            child: Some(child),
            stdout,
        }
    }

    /// Waits for the probe to exit and parses its report.
    pub fn finish(mut self) -> Report {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("report line");
        if let Some(mut c) = self.child.take() {
            let status = c.wait().expect("wait");
            assert!(status.success(), "probe failed: {status:?}");
        }
        Report::parse(&line)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A figure of a report, or a panic naming the missing key.
pub fn fig(r: &Report, key: &str) -> f64 {
    r.get(key)
        .unwrap_or_else(|| panic!("report has no {key}: {}", r.line()))
}

/// Short pause for sockets to settle (e.g. between a server's bind and the first packet).
pub fn settle() {
    std::thread::sleep(Duration::from_millis(100));
}
