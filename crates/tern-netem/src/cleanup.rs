//! Making sure everything tern-netem creates goes away.
//!
//! Three layers:
//! 1. [`crate::Topology`]'s `Drop` tears down what it built (also when a test panics).
//! 2. [`install_signal_cleanup`] makes Ctrl-C, SIGTERM and SIGHUP tear down every live
//!    topology of the process before it exits.
//! 3. For what neither can catch (SIGKILL, power loss), every topology records the namespaces
//!    it creates in a registry file under [`REGISTRY_DIR`], written *before* each namespace is
//!    created, together with the owner's PID and process start time. [`cleanup_stale`]
//!    (run by `tern-netem cleanup` and at the start of every build) removes the namespaces
//!    listed in files whose owner is gone, and nothing else.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cmd;
use crate::Error;

/// Where the registry files live (tmpfs, cleared at boot like `/run/netns`).
pub const REGISTRY_DIR: &str = "/run/tern-netem";

/// Start time of a process in clock ticks since boot (field 22 of `/proc/PID/stat`), which
/// tells a live owner from a recycled PID.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The registry file of one topology.
#[derive(Debug)]
pub(crate) struct Registration {
    path: PathBuf,
}

impl Registration {
    /// Creates `REGISTRY_DIR/<prefix>.txt` naming this process as the owner.
    pub(crate) fn create(prefix: &str) -> Result<Self, Error> {
        fs::create_dir_all(REGISTRY_DIR)
            .map_err(|e| Error::Io(format!("cannot create {REGISTRY_DIR}: {e}")))?;
        let path = Path::new(REGISTRY_DIR).join(format!("{prefix}.txt"));
        let pid = std::process::id();
        let started = start_time(pid).unwrap_or(0);
        fs::write(&path, format!("owner {pid} {started}\n"))
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))?;
        Ok(Self { path })
    }

    /// Records a namespace about to be created.
    pub(crate) fn add_namespace(&self, ns: &str) -> Result<(), Error> {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| Error::Io(format!("cannot open {}: {e}", self.path.display())))?;
        writeln!(f, "ns {ns}")
            .and_then(|()| f.sync_data())
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", self.path.display())))
    }

    /// Deletes the file (after the namespaces are gone).
    pub(crate) fn remove(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Whether a namespace of this name is mounted under `/run/netns`.
pub(crate) fn namespace_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// PIDs of the processes inside namespace `ns` (never this process).
fn pids_in(ns: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    cmd::ip(&["netns", "pids", ns])
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|&p| p != me)
                .collect()
        })
        .unwrap_or_default()
}

/// Stops the processes inside the given namespaces (SIGTERM, then SIGKILL after up to 1 s)
/// and deletes the namespaces. Missing namespaces are skipped. Returns the first error.
pub(crate) fn remove_namespaces(names: &[String]) -> Result<(), Error> {
    let existing: Vec<&String> = names.iter().filter(|n| namespace_exists(n)).collect();
    let mut any = false;
    for ns in &existing {
        for pid in pids_in(ns) {
            any = true;
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    if any {
        for _ in 0..20 {
            if existing.iter().all(|ns| pids_in(ns).is_empty()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for ns in &existing {
            for pid in pids_in(ns) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
    let mut first_error = None;
    for ns in existing.iter().rev() {
        if let Err(e) = cmd::ip(&["netns", "del", ns]) {
            if namespace_exists(ns) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// A registry file whose owner has exited.
#[derive(Debug)]
struct Stale {
    path: PathBuf,
    namespaces: Vec<String>,
}

fn stale_registrations() -> Vec<Stale> {
    let Ok(dir) = fs::read_dir(REGISTRY_DIR) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("txt") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let mut owner = None;
        let mut namespaces = Vec::new();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("owner"), Some(pid), Some(started)) => {
                    owner = pid.parse::<u32>().ok().zip(started.parse::<u64>().ok());
                }
                (Some("ns"), Some(ns), None) if ns.starts_with("tn") => {
                    namespaces.push(ns.to_owned())
                }
                _ => {}
            }
        }
        let Some((pid, started)) = owner else {
            continue;
        };
        let alive = start_time(pid).is_some_and(|t| t == started || started == 0);
        if !alive {
            out.push(Stale { path, namespaces });
        }
    }
    out
}

/// Removes the namespaces of tern-netem runs whose process has exited (killed with SIGKILL,
/// crashed with `panic = "abort"`, …) and their registry files. Returns the namespaces removed.
/// Only namespaces recorded in a registry file are ever touched.
pub fn cleanup_stale() -> Result<Vec<String>, Error> {
    let mut removed = Vec::new();
    let mut first_error = None;
    for stale in stale_registrations() {
        let present: Vec<String> = stale
            .namespaces
            .iter()
            .filter(|n| namespace_exists(n))
            .cloned()
            .collect();
        match remove_namespaces(&present) {
            Ok(()) => {
                removed.extend(present);
                let _ = fs::remove_file(&stale.path);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(removed), Err)
}

static HANDLER: OnceLock<Result<(), String>> = OnceLock::new();

/// Installs a Ctrl-C / SIGTERM / SIGHUP handler (once per process; later calls are no-ops)
/// that tears down every live [`crate::Topology`] of this process — emulators stopped,
/// processes in their namespaces killed, namespaces deleted — and then exits with status 130.
///
/// A program that has its own handler should call [`crate::teardown_all`] from it instead.
pub fn install_signal_cleanup() -> Result<(), Error> {
    HANDLER
        .get_or_init(|| {
            ctrlc::set_handler(|| {
                eprintln!("tern-netem: signal received, removing namespaces");
                crate::topology::teardown_all();
                std::process::exit(130);
            })
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| Error::Io(format!("cannot install the signal handler: {e}")))
}
