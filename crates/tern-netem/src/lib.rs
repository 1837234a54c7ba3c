//! tern-netem: a link emulator for real processes, for kernels without netem.
//!
//! It builds network-namespace topologies joined by veth pairs ([`Topology`], presets in
//! [`TopologySpec`]) and runs a user-space forwarder ([`Emulator`]) on the routers that
//! emulate links: each direction of each emulated link has a TUN device; packets are read
//! from it, pass a drop-tail queue drained at a constant rate or by a mahimahi trace
//! ([`shaper`]), then the simulator's link model from `tern-sim` (random or Gilbert–Elliott
//! loss, duplication, corruption, propagation delay, order-preserving jitter, optional
//! reordering), and are written back at their delivery time. One link model, two clocks: the
//! simulator runs it in virtual time, this crate against the real clock.
//!
//! The forwarder works on whole IP packets and never looks inside them, so TCP, MPTCP, QUIC,
//! UDT, SRT and tern all cross it alike. Sizes and rates count IP packets (headers included),
//! as mahimahi does.
//!
//! # Example
//!
//! ```no_run
//! use tern_netem::{DirectionConfig, DuplexConfig, EmulationConfig, Topology, TopologySpec};
//!
//! # fn main() -> Result<(), tern_netem::Error> {
//! tern_netem::install_signal_cleanup()?; // Ctrl-C removes the namespaces too
//! let topo = Topology::build(&TopologySpec::single())?;
//! let mut link = DirectionConfig::default();
//! link.apply("delay=20ms rate=10mbit loss=1%")?;
//! let emu = topo.start(&EmulationConfig::uniform(DuplexConfig::symmetric(link)))?;
//! let status = topo.command("c", "ping")?.args(["-c", "3", "10.77.2.1"]).status();
//! println!("{status:?} {:?}", emu.stats("r", tern_netem::Direction::Up)?);
//! # Ok(()) }   // dropping `topo` removes everything
//! ```
//!
//! # Cleanup
//!
//! Everything lives in namespaces named `tn<pid>-<n>-<node>`, created with `ip` and recorded
//! in `/run/tern-netem/` before they exist. A [`Topology`] removes its namespaces (and with
//! them every veth and TUN device; processes inside are killed first) when dropped, also while
//! a panic unwinds; [`install_signal_cleanup`] does it on Ctrl-C/SIGTERM/SIGHUP; and
//! [`cleanup_stale`] (`tern-netem cleanup`, also run before every build) removes what a
//! killed process left, looking only at namespaces recorded by tern-netem runs that have
//! exited.

pub mod cleanup;
mod cmd;
pub mod config;
pub mod ecn;
pub mod emulator;
pub mod engine;
pub mod ncr;
pub mod probe;
pub mod shaper;
pub mod topology;
pub mod trace;
pub mod units;

pub use cleanup::{cleanup_stale, install_signal_cleanup};
pub use config::{Direction, DirectionConfig, DuplexConfig, EmulationConfig};
pub use emulator::Emulator;
pub use engine::{DirectionEngine, DirectionStats};
pub use shaper::{DelayHistogram, QueueLimit, QueueSample, RateModel, Shaper};
pub use tern_sim::{Fade, LossModel, Outage};
pub use topology::{
    check_environment, teardown_all, test_prerequisites, Role, Topology, TopologySpec,
};
pub use trace::Trace;
pub use units::QueueSpec;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A value on the command line or in a spec could not be parsed.
    #[error("{0}")]
    Parse(String),
    /// An external command failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and stderr, or why it could not start.
        detail: String,
    },
    /// A system call or file operation failed.
    #[error("{0}")]
    Io(String),
    /// The topology is inconsistent or in the wrong state.
    #[error("topology: {0}")]
    Topology(String),
    /// No node of that name.
    #[error("no node named {0:?}")]
    UnknownNode(String),
    /// No emulated link of that name.
    #[error("no emulated link named {0:?}")]
    UnknownLink(String),
    /// This machine cannot run the emulator (not root, no TUN, no `ip netns`).
    #[error("unsupported here: {0}")]
    Unsupported(String),
}

/// Writes a queue-length trace as CSV: `time_ms,bytes,packets`.
pub fn write_queue_csv(
    out: &mut impl std::io::Write,
    samples: &[QueueSample],
) -> std::io::Result<()> {
    writeln!(out, "time_ms,bytes,packets")?;
    for s in samples {
        writeln!(
            out,
            "{:.3},{},{}",
            s.at.as_secs_f64() * 1e3,
            s.bytes,
            s.packets
        )?;
    }
    Ok(())
}
