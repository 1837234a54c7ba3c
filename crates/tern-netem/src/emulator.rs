//! The real-clock forwarder: for each direction of each emulated link, a TUN device in the
//! link's router namespace, a reader thread that feeds packets through a
//! [`DirectionEngine`] at the real time they arrive, and a writer thread that sleeps until
//! each packet's delivery time and writes it back into the TUN device, from where the kernel
//! forwards it on.
//!
//! The router namespace's policy routing sends every packet that enters from the A side into
//! the `up` TUN device and every packet from the B side into the `down` one (see
//! [`crate::topology`]); packets written back enter with the TUN device as their input
//! interface and follow the main routing table. The forwarder never looks inside packets, so
//! any protocol crosses it.

// This module owns the emulator's real clock: reading it is its job (the sans-I/O rule is for
// the protocol core; see docs/ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use nix::sched::{setns, CloneFlags};
use tun_rs::{DeviceBuilder, InterruptEvent, SyncDevice};

use crate::cmd;
use crate::config::{Direction, DirectionConfig};
use crate::engine::{DirectionEngine, DirectionStats};
use crate::shaper::QueueSample;
use crate::Error;

/// Largest packet read from a TUN device (its MTU is 1 500, or the largest `mtu` configured:
/// at most 65 535).
const READ_BUFFER: usize = 65_536;

/// The kernel-side queue of each TUN device: deep enough that the forwarder's own drop-tail
/// queue, not the kernel's, decides what is dropped.
const TUN_TXQUEUELEN: &str = "10000";

/// Real-time priority (`SCHED_FIFO`, cross-platform scale 0–99) of the forwarder threads.
/// Moderate, so that it preempts ordinary work but not kernel threads or other real-time
/// programs; the threads block whenever there is nothing to do, and the kernel's real-time
/// throttling still reserves 5 % of each CPU for everything else.
const REALTIME_PRIORITY: u8 = 20;

/// Where one direction is attached: the router namespace, its TUN device name, and the policy
/// routing table that points at it.
#[derive(Clone, Debug)]
pub(crate) struct Attachment {
    pub link: String,
    pub dir: Direction,
    pub ns: String,
    pub tun: String,
    pub table: u32,
    /// MTU of the TUN device.
    pub mtu: u16,
}

/// State shared by a direction's threads and the handle.
#[derive(Debug)]
struct Shared {
    engine: Mutex<DirectionEngine>,
    written: AtomicU64,
    written_bytes: AtomicU64,
    write_errors: AtomicU64,
    in_flight: AtomicUsize,
    failure: Mutex<Option<String>>,
}

impl Shared {
    fn engine(&self) -> MutexGuard<'_, DirectionEngine> {
        // A panic while holding the lock leaves a consistent engine (every update is a
        // counter or a push), so a poisoned lock is still usable.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, what: String) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(what);
    }
}

struct DirHandle {
    attachment: Attachment,
    shared: Arc<Shared>,
    stop: Arc<InterruptEvent>,
}

struct Inner {
    epoch: Instant,
    started_at: SystemTime,
    dirs: BTreeMap<(String, Direction), DirHandle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A running forwarder for every emulated link of a topology. Cheap to clone (a handle);
/// stopped by [`Emulator::stop`] or when the topology is torn down.
#[derive(Clone)]
pub struct Emulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("directions", &self.directions())
            .finish_non_exhaustive()
    }
}

/// A packet waiting in the delay line.
struct Pending {
    at: Instant,
    seq: u64,
    packet: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Reversed, so that `BinaryHeap` pops the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// FNV-1a of the link name and direction: the default seed, stable across runs.
fn default_seed(link: &str, dir: Direction) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in link.bytes().chain(dir.as_str().bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Opens a TUN device named `tun` inside namespace `ns`, from a short-lived thread that
/// enters the namespace (so neither the calling thread nor the process ever changes
/// namespace).
fn open_tun_in(ns: &str, tun: &str, mtu: u16) -> Result<SyncDevice, Error> {
    let ns_path = format!("/run/netns/{ns}");
    let tun_name = tun.to_owned();
    let opened = std::thread::Builder::new()
        .name(format!("tun-open-{tun}"))
        .spawn(move || -> Result<SyncDevice, String> {
            let file = File::open(&ns_path).map_err(|e| format!("cannot open {ns_path}: {e}"))?;
            setns(&file, CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot enter {ns_path}: {e}"))?;
            let dev = DeviceBuilder::new()
                .name(&tun_name)
                .mtu(mtu)
                .build_sync()
                .map_err(|e| format!("cannot create TUN device {tun_name}: {e}"))?;
            dev.set_nonblocking(true)
                .map_err(|e| format!("cannot make {tun_name} non-blocking: {e}"))?;
            Ok(dev)
        })
        .map_err(|e| Error::Io(format!("cannot spawn a thread: {e}")))?
        .join()
        .map_err(|_| Error::Io("TUN opening thread panicked".into()))?;
    opened.map_err(|e| Error::Io(format!("{e} (namespace {ns})")))
}

/// Puts the calling thread in the real-time FIFO class, so that compilers and other busy
/// processes on the machine do not delay packets by a scheduler tick. Best effort: without
/// the privilege the thread stays in the normal class, and the first failure is reported.
fn realtime_priority() {
    use thread_priority::{
        set_thread_priority_and_policy, thread_native_id, RealtimeThreadSchedulePolicy,
        ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
    };
    static WARNED: std::sync::Once = std::sync::Once::new();
    let Ok(value) = ThreadPriorityValue::try_from(REALTIME_PRIORITY) else {
        return;
    };
    if let Err(e) = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Crossplatform(value),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    ) {
        WARNED.call_once(|| {
            eprintln!(
                "tern-netem: cannot use real-time scheduling ({e:?}); timing may suffer under load"
            )
        });
    }
}

fn reader(
    dev: Arc<SyncDevice>,
    shared: Arc<Shared>,
    stop: Arc<InterruptEvent>,
    tx: Sender<(Instant, Vec<u8>)>,
    realtime: bool,
) {
    if realtime {
        realtime_priority();
    }
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        match dev.recv(&mut buf) {
            Ok(n) => {
                let now = Instant::now();
                let packet = buf[..n].to_vec();
                let mut engine = shared.engine();
                engine.offer(packet, now, |at, p| {
                    // Counted before the writer can take it (and count it out): the counter
                    // must not wrap below zero for a moment.
                    shared.in_flight.fetch_add(1, AtomicOrdering::Relaxed);
                    // The writer only goes away when stopping.
                    let _ = tx.send((at, p));
                });
                drop(engine);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match dev.wait_readable_intr(&stop) {
                    Ok(()) => {}
                    Err(_) if stop.is_trigger() => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        shared.fail(format!("waiting on TUN device: {e}"));
                        return;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if !stop.is_trigger() {
                    shared.fail(format!("reading TUN device: {e}"));
                }
                return;
            }
        }
        if stop.is_trigger() {
            return;
        }
    }
}

fn writer(
    dev: Arc<SyncDevice>,
    shared: Arc<Shared>,
    rx: Receiver<(Instant, Vec<u8>)>,
    realtime: bool,
) {
    if realtime {
        realtime_priority();
    }
    // Wake-ups within a microsecond of the deadline instead of the default 50 µs slack
    // (real-time threads have no slack anyway).
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let mut heap: BinaryHeap<Pending> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Pending>, (at, packet): (Instant, Vec<u8>)| {
        seq += 1;
        heap.push(Pending { at, seq, packet });
    };
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|p| p.at <= now) {
            let Some(p) = heap.pop() else { break };
            shared.in_flight.fetch_sub(1, AtomicOrdering::Relaxed);
            match dev.send(&p.packet) {
                Ok(_) => {
                    shared.written.fetch_add(1, AtomicOrdering::Relaxed);
                    shared
                        .written_bytes
                        .fetch_add(p.packet.len() as u64, AtomicOrdering::Relaxed);
                }
                Err(_) => {
                    shared.write_errors.fetch_add(1, AtomicOrdering::Relaxed);
                }
            }
        }
        let next = match heap.peek() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(p) => rx.recv_timeout(p.at.saturating_duration_since(Instant::now())),
        };
        match next {
            Ok(item) => {
                push(&mut heap, item);
                while let Ok(item) = rx.try_recv() {
                    push(&mut heap, item);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Emulator {
    /// Creates the TUN devices, points the routing tables at them and starts the threads.
    /// On failure everything started so far is stopped again.
    pub(crate) fn start(
        attachments: &[Attachment],
        config: impl Fn(&str, Direction) -> DirectionConfig,
        queue_trace: bool,
        realtime: bool,
    ) -> Result<Self, Error> {
        let epoch = Instant::now();
        let started_at = SystemTime::now();
        let mut dirs = BTreeMap::new();
        for a in attachments {
            let cfg = config(&a.link, a.dir);
            // A given seed is mixed with the link and direction too, so that the two directions (and
            // the links) never draw the same sequence.
            let seed = default_seed(&a.link, a.dir) ^ cfg.seed.unwrap_or(0);
            let mut engine = DirectionEngine::new(cfg, seed, epoch);
            engine.set_queue_trace(queue_trace);
            let shared = Arc::new(Shared {
                engine: Mutex::new(engine),
                written: AtomicU64::new(0),
                written_bytes: AtomicU64::new(0),
                write_errors: AtomicU64::new(0),
                in_flight: AtomicUsize::new(0),
                failure: Mutex::new(None),
            });
            let stop = Arc::new(
                InterruptEvent::new()
                    .map_err(|e| Error::Io(format!("cannot create an eventfd: {e}")))?,
            );
            dirs.insert(
                (a.link.clone(), a.dir),
                DirHandle {
                    attachment: a.clone(),
                    shared,
                    stop,
                },
            );
        }
        let emulator = Emulator {
            inner: Arc::new(Inner {
                epoch,
                started_at,
                dirs,
                threads: Mutex::new(Vec::new()),
            }),
        };
        if let Err(e) = emulator.attach_all(realtime) {
            emulator.stop();
            return Err(e);
        }
        Ok(emulator)
    }

    /// Opens the TUN devices, starts the threads and routes into the devices.
    fn attach_all(&self, realtime: bool) -> Result<(), Error> {
        for handle in self.inner.dirs.values() {
            let a = &handle.attachment;
            let dev = Arc::new(open_tun_in(&a.ns, &a.tun, a.mtu)?);
            let (tx, rx) = mpsc::channel();
            let (d, s, st) = (
                Arc::clone(&dev),
                Arc::clone(&handle.shared),
                Arc::clone(&handle.stop),
            );
            let r = std::thread::Builder::new()
                .name(format!("netem-rd-{}-{}", a.link, a.dir))
                .spawn(move || reader(d, s, st, tx, realtime))
                .map_err(|e| Error::Io(format!("cannot spawn a thread: {e}")))?;
            self.threads().push(r);
            let (d, s) = (dev, Arc::clone(&handle.shared));
            let w = std::thread::Builder::new()
                .name(format!("netem-wr-{}-{}", a.link, a.dir))
                .spawn(move || writer(d, s, rx, realtime))
                .map_err(|e| Error::Io(format!("cannot spawn a thread: {e}")))?;
            self.threads().push(w);
            let table = a.table.to_string();
            cmd::ip(&[
                "-n",
                &a.ns,
                "link",
                "set",
                &a.tun,
                "up",
                "txqueuelen",
                TUN_TXQUEUELEN,
            ])?;
            cmd::ip(&[
                "-n", &a.ns, "route", "replace", "default", "dev", &a.tun, "table", &table,
                "metric", "1",
            ])?;
        }
        Ok(())
    }

    fn threads(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.inner.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self, link: &str, dir: Direction) -> Result<&DirHandle, Error> {
        self.inner
            .dirs
            .get(&(link.to_owned(), dir))
            .ok_or_else(|| Error::UnknownLink(link.to_owned()))
    }

    /// When the forwarder started: the origin of trace replay and of queue traces.
    pub fn epoch(&self) -> Instant {
        self.inner.epoch
    }

    /// The wall-clock time of [`Emulator::epoch`].
    pub fn started_at(&self) -> SystemTime {
        self.inner.started_at
    }

    /// The emulated directions, as `(link, direction)`.
    pub fn directions(&self) -> Vec<(String, Direction)> {
        self.inner.dirs.keys().cloned().collect()
    }

    /// Counters and queue state of one direction now. Fails if the direction's threads hit an
    /// I/O error.
    pub fn stats(&self, link: &str, dir: Direction) -> Result<DirectionStats, Error> {
        let h = self.dir(link, dir)?;
        if let Some(f) = h
            .shared
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(Error::Io(format!("forwarder {link} {dir}: {f}")));
        }
        let mut s = h.shared.engine().stats(Instant::now());
        s.written = h.shared.written.load(AtomicOrdering::Relaxed);
        s.written_bytes = h.shared.written_bytes.load(AtomicOrdering::Relaxed);
        s.write_errors = h.shared.write_errors.load(AtomicOrdering::Relaxed);
        s.in_flight = h.shared.in_flight.load(AtomicOrdering::Relaxed);
        Ok(s)
    }

    /// The queue-length samples of one direction so far (one per enqueue and per departure;
    /// empty unless the queue trace was enabled at start).
    pub fn queue_trace(&self, link: &str, dir: Direction) -> Result<Vec<QueueSample>, Error> {
        Ok(self
            .dir(link, dir)?
            .shared
            .engine()
            .queue_trace(Instant::now()))
    }

    /// Takes (and clears) the queue-length samples recorded so far.
    pub fn take_queue_trace(&self, link: &str, dir: Direction) -> Result<Vec<QueueSample>, Error> {
        Ok(self
            .dir(link, dir)?
            .shared
            .engine()
            .take_queue_trace(Instant::now()))
    }

    /// The configuration of one direction.
    pub fn config(&self, link: &str, dir: Direction) -> Result<DirectionConfig, Error> {
        Ok(self.dir(link, dir)?.shared.engine().config().clone())
    }

    /// Changes one direction's configuration from now on (packets already accepted keep their
    /// delivery times; a new trace plays from the emulator's epoch, not from its start).
    pub fn set_config(
        &self,
        link: &str,
        dir: Direction,
        config: DirectionConfig,
    ) -> Result<(), Error> {
        self.dir(link, dir)?.shared.engine().reconfigure(config);
        Ok(())
    }

    /// Takes one direction down (every packet dropped) or back up: a path failure.
    pub fn set_up(&self, link: &str, dir: Direction, up: bool) -> Result<(), Error> {
        let h = self.dir(link, dir)?;
        let mut engine = h.shared.engine();
        let mut cfg = engine.config().clone();
        cfg.up = up;
        engine.reconfigure(cfg);
        Ok(())
    }

    /// Stops every thread and closes the TUN devices (their routes go with them, and the
    /// routing tables then fall back to a blackhole: nothing crosses a stopped emulator).
    /// Packets still in the delay line are discarded. Idempotent.
    pub fn stop(&self) {
        for h in self.inner.dirs.values() {
            let _ = h.stop.trigger();
        }
        let threads: Vec<JoinHandle<()>> = self.threads().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}
