//! The event loop: hosts running [`Node`]s, directional [`Link`]s between addresses, scripted
//! actions, all in virtual time.
//!
//! # Driving loop
//!
//! The simulation keeps one ordered queue of events — datagram arrivals and scripted actions,
//! ordered by `(time, insertion sequence)` — and one timer per host, ordered by
//! `(deadline, host)`. Each step takes the earliest of the two (an arrival or action before a
//! timer due at the same instant), sets the clock to its time, and runs it:
//!
//! - an **arrival** is given to the host that owns the destination IP ([`Node::handle`]);
//! - a **timer** calls [`Node::handle_timeout`];
//! - an **action** runs the closure given to [`Simulation::schedule`] with the whole simulation.
//!
//! After a node has been handed anything, the simulation drains [`Node::poll_transmit`] (each
//! datagram enters the link keyed by its `(src IP, dst IP)` at once, and gets its arrival time
//! there), then asks [`Node::poll_timeout`] and re-arms that host's single timer. So virtual
//! time only moves on once nothing more can happen at the current instant (STYLE.md example 10).
//!
//! If more than [`Simulation::stall_limit`] steps (events plus transmitted datagrams) happen
//! without the clock moving, the simulation panics with "simulation stalled at t=…": a node that
//! asks for a timeout in the past forever, or two nodes ping-ponging over zero-delay links, is a
//! bug that should fail a test rather than hang it.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::link::{Link, LinkConfig};
use crate::trace::{LinkSummary, Summary};

/// A UDP datagram in flight: addresses and payload.
///
/// The payload is an owned `Vec` so a node can keep and reuse the buffers it receives for the
/// datagrams it sends, which keeps a long run free of per-packet allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Datagram {
    /// Sender's address; its IP selects the link together with `dst`'s.
    pub src: SocketAddr,
    /// Receiver's address; its IP selects the host it is delivered to.
    pub dst: SocketAddr,
    /// UDP payload.
    pub data: Vec<u8>,
    /// The ECN bits of the IP header (`0b00` Not-ECT, `0b10` ECT(0), `0b01` ECT(1), `0b11`
    /// CE). Links may mark or rewrite them.
    pub ecn: u8,
}

impl Datagram {
    /// A datagram from `src` to `dst` carrying `data`, not ECN-capable.
    pub fn new(src: SocketAddr, dst: SocketAddr, data: Vec<u8>) -> Self {
        Self {
            src,
            dst,
            data,
            ecn: 0,
        }
    }

    /// The same with the given ECN bits.
    pub fn with_ecn(mut self, ecn: u8) -> Self {
        self.ecn = ecn & 0b11;
        self
    }
}

/// What the simulator drives: a sans-I/O endpoint (the shape of `tern-proto`'s driving API).
///
/// The simulator calls `handle` or `handle_timeout`, then `poll_transmit` until it returns
/// `None`, then `poll_timeout`. `now` never goes backwards.
pub trait Node {
    /// A datagram addressed to one of this node's addresses arrived.
    fn handle(&mut self, now: Instant, dgram: Datagram);
    /// The next datagram this node wants to send now, if any (called repeatedly until None).
    #[must_use]
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram>;
    /// When this node next wants `handle_timeout` (timers, pacing). None = idle.
    ///
    /// A time before `now` means "as soon as possible" and is treated as `now`.
    #[must_use]
    fn poll_timeout(&mut self) -> Option<Instant>;
    /// The deadline last returned by `poll_timeout` has been reached.
    fn handle_timeout(&mut self, now: Instant);
    /// True when this node's application work is finished (lets run() stop early).
    fn is_done(&self) -> bool {
        true
    }
}

/// Lets one simulation hold different kinds of node (`Simulation<Box<dyn Node>>`).
impl<T: Node + ?Sized> Node for Box<T> {
    fn handle(&mut self, now: Instant, dgram: Datagram) {
        (**self).handle(now, dgram);
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        (**self).poll_transmit(now)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now);
    }
    fn is_done(&self) -> bool {
        (**self).is_done()
    }
}

/// Identifies a host within one [`Simulation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(u32);

impl HostId {
    /// Position in the order hosts were added (0-based).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host{}", self.0)
    }
}

/// Identifies a link within one [`Simulation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(u32);

impl LinkId {
    /// Position in the order links were added (0-based); also the link's RNG stream.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "link{}", self.0)
    }
}

/// Why [`Simulation::run_until`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunOutcome {
    /// The deadline was reached with events still pending after it.
    Deadline,
    /// Nothing is pending at all: no datagram in flight, no timer, no scheduled action.
    /// The clock still stands at the deadline.
    Idle,
}

/// Errors of the simulator's API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// [`Simulation::run_until_done`] reached its virtual-time limit.
    #[error("virtual time limit {limit:?} reached; not done: {not_done:?}")]
    TimeLimit {
        /// The limit, as time since the epoch.
        limit: Duration,
        /// Hosts whose [`Node::is_done`] was false.
        not_done: Vec<HostId>,
    },
    /// [`Simulation::run_until_done`] found nothing left to happen while some hosts were not
    /// done: a deadlock (for a protocol, typically a lost datagram with no timer to resend it).
    #[error("nothing left to happen at {at:?}, but not done: {not_done:?}")]
    Idle {
        /// When the simulation went idle, as time since the epoch.
        at: Duration,
        /// Hosts whose [`Node::is_done`] was false.
        not_done: Vec<HostId>,
    },
    /// [`Simulation::change_address`] was asked to move an address the host does not have.
    #[error("{host} does not own address {addr}")]
    NotOwner {
        /// The host named in the call.
        host: HostId,
        /// The address it does not own.
        addr: IpAddr,
    },
    /// The address belongs to another host.
    #[error("address {addr} already belongs to {owner}")]
    AddressInUse {
        /// The contested address.
        addr: IpAddr,
        /// Its current owner.
        owner: HostId,
    },
    /// Re-keying links would make two links share the same `(from, to)` pair.
    #[error("a link {from} -> {to} already exists")]
    LinkExists {
        /// Source IP of the clashing link.
        from: IpAddr,
        /// Destination IP of the clashing link.
        to: IpAddr,
    },
    /// `TERN_SEED` is set but is not an unsigned integer.
    #[error("TERN_SEED={value:?} is not an unsigned integer (decimal or 0x-prefixed hex)")]
    BadSeed {
        /// The variable's value.
        value: String,
    },
}

/// Simulation-wide counters (per-link ones live in [`crate::LinkStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SimStats {
    /// Events processed: arrivals, timers and actions.
    pub events: u64,
    /// Datagrams nodes sent.
    pub sent: u64,
    /// Datagrams handed to a node.
    pub delivered: u64,
    /// Datagrams dropped because no link joins their source and destination IPs.
    pub unroutable: u64,
    /// Datagrams that arrived for an IP no host owns (e.g. the old address after a change).
    pub undeliverable: u64,
    /// Timers fired.
    pub timers: u64,
    /// Scripted actions run.
    pub actions: u64,
}

/// A scripted action, see [`Simulation::schedule`].
type Action<N> = Box<dyn FnOnce(&mut Simulation<N>)>;

/// Default for [`Simulation::set_stall_limit`].
pub const DEFAULT_STALL_LIMIT: u64 = 1_000_000;

/// RNG streams below this are the links' (stream = link index); node streams start here.
const NODE_STREAM_BASE: u64 = 1 << 63;

/// A queued event. Ordered so that `BinaryHeap` (a max-heap) pops the earliest, and among
/// equal times the first inserted: that tie-break is what makes runs reproducible.
///
/// The time is kept as nanoseconds since the epoch and packed with the sequence number into one
/// `u128`, because heap sifting compares keys constantly and an integer compare is much cheaper
/// than comparing two `Instant`s and then the sequence numbers (u64 nanoseconds cover 584 years).
struct Event {
    key: u128,
    kind: EventKind,
}

impl Event {
    fn new(at_nanos: u64, seq: u64, kind: EventKind) -> Self {
        Self {
            key: (u128::from(at_nanos) << 64) | u128::from(seq),
            kind,
        }
    }

    fn at_nanos(&self) -> u64 {
        (self.key >> 64) as u64
    }
}

/// Indices into the slabs, so heap entries stay small and cheap to move.
#[derive(Clone, Copy)]
enum EventKind {
    /// A datagram (its slot) leaves a link (its index).
    Arrival(u32, u32),
    Action(u32),
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key)
    }
}

/// Nanoseconds from `epoch` to `at` (0 if `at` is earlier), saturating at `u64::MAX`.
fn nanos_since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// A small, fast, deterministic hasher (the FxHash multiply-rotate) for the address maps that
/// are looked up for every datagram; `HashMap`'s default SipHash showed up as 15 % of a run.
/// Hash flooding is no concern inside a simulator.
#[derive(Clone, Copy, Default)]
struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxBuild = std::hash::BuildHasherDefault<FxHasher>;

/// A free-list arena, so queued datagrams and actions don't ride inside the heap.
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    fn insert(&mut self, item: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(item);
                i
            }
            None => {
                let i = u32::try_from(self.items.len()).expect("more than 4 billion queued events");
                self.items.push(Some(item));
                i
            }
        }
    }

    fn take(&mut self, i: u32) -> Option<T> {
        let item = self.items.get_mut(i as usize)?.take();
        if item.is_some() {
            self.free.push(i);
        }
        item
    }
}

struct Host<N> {
    node: N,
    addrs: Vec<IpAddr>,
    /// The deadline currently in `Simulation::timers` for this host, if any.
    timer: Option<Instant>,
    /// Cached `node.is_done()`, refreshed whenever the node is touched.
    done: bool,
}

struct LinkSlot {
    from: IpAddr,
    to: IpAddr,
    link: Link,
}

/// A deterministic discrete-event simulation of hosts joined by links. See the
/// [module docs](self) for the driving loop and the [crate docs](crate) for the contract.
///
/// `N` is the node type; use an enum or `Box<dyn Node>` to mix kinds of node.
pub struct Simulation<N> {
    seed: u64,
    epoch: Instant,
    now: Instant,
    hosts: Vec<Host<N>>,
    owners: HashMap<IpAddr, HostId, FxBuild>,
    links: Vec<LinkSlot>,
    routes: HashMap<(IpAddr, IpAddr), LinkId, FxBuild>,
    /// Multi-hop paths: a datagram `src -> dst` leaving the link goes on to the next one.
    next_hops: HashMap<(IpAddr, IpAddr, LinkId), LinkId, FxBuild>,
    events: BinaryHeap<Event>,
    /// One entry per host with a pending timer. An ordered set rather than heap entries with
    /// generation counters: protocols re-arm far-off timers (idle, keep-alive) on every packet,
    /// and each re-arm would otherwise leave a stale heap entry behind until its time came,
    /// growing the heap by the packet rate times the timer horizon.
    timers: BTreeSet<(Instant, HostId)>,
    packets: Slab<Datagram>,
    actions: Slab<Action<N>>,
    seq: u64,
    stall_limit: u64,
    steps_at_now: u64,
    not_done: usize,
    stats: SimStats,
    wall: Duration,
}

impl<N> fmt::Debug for Simulation<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("seed", &self.seed)
            .field("now", &(self.now - self.epoch))
            .field("hosts", &self.hosts.len())
            .field("links", &self.links.len())
            .field("pending_events", &self.events.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<N: Node> Simulation<N> {
    /// An empty simulation whose randomness all derives from `seed`.
    pub fn new(seed: u64) -> Self {
        // The one clock read of the simulator: an `Instant` can only be made from the OS
        // clock, so virtual time is this arbitrary origin plus an offset. Only differences from
        // it are ever used, so its value does not affect any result.
        #[allow(clippy::disallowed_methods)]
        let epoch = Instant::now();
        Self {
            seed,
            epoch,
            now: epoch,
            hosts: Vec::new(),
            owners: HashMap::default(),
            links: Vec::new(),
            routes: HashMap::default(),
            next_hops: HashMap::default(),
            events: BinaryHeap::new(),
            timers: BTreeSet::new(),
            packets: Slab::new(),
            actions: Slab::new(),
            seq: 0,
            stall_limit: DEFAULT_STALL_LIMIT,
            steps_at_now: 0,
            not_done: 0,
            stats: SimStats::default(),
            wall: Duration::ZERO,
        }
    }

    /// The seed this simulation was created with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time zero.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Current virtual time as an offset from the epoch.
    pub fn elapsed(&self) -> Duration {
        self.now - self.epoch
    }

    /// A generator for a node or a test, derived from the simulation seed and `stream`, and
    /// independent of every link's (those use streams below 2⁶³). Same seed and stream, same
    /// numbers.
    pub fn rng(&self, stream: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(NODE_STREAM_BASE | stream);
        rng
    }

    /// Adds a host running `node` that owns `addrs` (datagrams to those IPs reach it).
    ///
    /// The node is first polled when the simulation next runs, so links added after the host
    /// already carry its first datagrams.
    ///
    /// # Panics
    /// If an address already belongs to a host: that is a bug in the scenario, not a runtime
    /// condition.
    pub fn add_host(&mut self, node: N, addrs: &[IpAddr]) -> HostId {
        let id = HostId(u32::try_from(self.hosts.len()).expect("too many hosts"));
        for &addr in addrs {
            if let Some(owner) = self.owners.insert(addr, id) {
                panic!("add_host: address {addr} already belongs to {owner}");
            }
        }
        self.hosts.push(Host {
            node,
            addrs: addrs.to_vec(),
            timer: None,
            done: true,
        });
        // Not polled yet: links may not exist yet. The run methods poll every node first.
        id
    }

    /// Adds a one-way link carrying datagrams whose source IP is `from` and destination IP is
    /// `to`. Its random draws use stream `index` of the simulation seed, so adding a link never
    /// changes the draws of the links added before it.
    ///
    /// # Panics
    /// If a link `from -> to` already exists (a scenario bug).
    pub fn add_link(&mut self, from: IpAddr, to: IpAddr, config: LinkConfig) -> LinkId {
        let index = self.links.len();
        let id = LinkId(u32::try_from(index).expect("too many links"));
        if self.routes.insert((from, to), id).is_some() {
            panic!("add_link: a link {from} -> {to} already exists");
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index as u64);
        self.links.push(LinkSlot {
            from,
            to,
            link: Link::with_rng(config, rng, self.epoch),
        });
        id
    }

    /// Sends datagrams `from -> to` over an existing `link` as well: several pairs of hosts
    /// then share its rate and queue (a common bottleneck; multi-hop forwarding is not
    /// modelled here: see [`Simulation::add_path`]). Delivery is by destination address, so the link carries each datagram to
    /// its own host. [`Simulation::link_ends`] keeps naming the pair the link was made for.
    ///
    /// # Panics
    /// If a route `from -> to` already exists (a scenario bug).
    pub fn add_route(&mut self, from: IpAddr, to: IpAddr, link: LinkId) {
        if self.routes.insert((from, to), link).is_some() {
            panic!("add_route: a link {from} -> {to} already exists");
        }
    }

    /// Sends datagrams `from -> to` over existing `links` in turn (a multi-hop path, e.g. the
    /// long flow of a parking lot that crosses two bottlenecks): the first link is the route
    /// as with [`Simulation::add_route`]; a datagram leaving link i enters link i + 1, and
    /// leaving the last one it is delivered. Hops are keyed by the pair's addresses, so
    /// [`Simulation::change_address`] moves only the first hop.
    ///
    /// # Panics
    /// If `links` is empty, or a route `from -> to` already exists (a scenario bug).
    pub fn add_path(&mut self, from: IpAddr, to: IpAddr, links: &[LinkId]) {
        let (&first, _) = links.split_first().expect("add_path: at least one link");
        self.add_route(from, to, first);
        for hop in links.windows(2) {
            self.next_hops.insert((from, to, hop[0]), hop[1]);
        }
    }

    /// Adds `a -> b` and `b -> a` with the same configuration (each with its own randomness).
    pub fn add_duplex(&mut self, a: IpAddr, b: IpAddr, config: LinkConfig) -> (LinkId, LinkId) {
        let ab = self.add_link(a, b, config.clone());
        let ba = self.add_link(b, a, config);
        (ab, ba)
    }

    /// The node of a host.
    pub fn node(&self, host: HostId) -> &N {
        &self.hosts[host.index()].node
    }

    /// The node of a host, to change it between runs or from a scripted action. The
    /// simulation polls every node again before it next runs, so what the change makes the
    /// node want to send goes out at the current time.
    pub fn node_mut(&mut self, host: HostId) -> &mut N {
        &mut self.hosts[host.index()].node
    }

    /// Hosts in the order they were added.
    pub fn hosts(&self) -> impl Iterator<Item = HostId> + '_ {
        (0..self.hosts.len()).map(|i| HostId(i as u32))
    }

    /// The addresses a host owns now.
    pub fn addrs(&self, host: HostId) -> &[IpAddr] {
        &self.hosts[host.index()].addrs
    }

    /// The host owning an address, if any.
    pub fn owner(&self, addr: IpAddr) -> Option<HostId> {
        self.owners.get(&addr).copied()
    }

    /// A link.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.links[id.index()].link
    }

    /// A link, to change its configuration or take it down mid-run.
    pub fn link_mut(&mut self, id: LinkId) -> &mut Link {
        &mut self.links[id.index()].link
    }

    /// The `(from, to)` IPs a link carries now (they follow [`Simulation::change_address`]).
    pub fn link_ends(&self, id: LinkId) -> (IpAddr, IpAddr) {
        let slot = &self.links[id.index()];
        (slot.from, slot.to)
    }

    /// The link carrying datagrams from `from` to `to`, if any.
    pub fn link_between(&self, from: IpAddr, to: IpAddr) -> Option<LinkId> {
        self.routes.get(&(from, to)).copied()
    }

    /// Links in the order they were added.
    pub fn links(&self) -> impl Iterator<Item = LinkId> + '_ {
        (0..self.links.len()).map(|i| LinkId(i as u32))
    }

    /// Simulation-wide counters.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// How many steps may happen at one instant before the simulation declares a stall.
    pub fn stall_limit(&self) -> u64 {
        self.stall_limit
    }

    /// Sets the stall limit (default [`DEFAULT_STALL_LIMIT`]).
    pub fn set_stall_limit(&mut self, steps: u64) {
        self.stall_limit = steps;
    }

    /// Runs `action` at virtual time `at` (now, if `at` is in the past), after the events
    /// already queued for that instant. Use it for scripted incidents: an address change, a
    /// link going down, a rate change.
    pub fn schedule(&mut self, at: Instant, action: impl FnOnce(&mut Simulation<N>) + 'static) {
        let slot = self.actions.insert(Box::new(action));
        self.push(at.max(self.now), EventKind::Action(slot));
    }

    /// [`Simulation::schedule`] at `delay` from now.
    pub fn schedule_in(
        &mut self,
        delay: Duration,
        action: impl FnOnce(&mut Simulation<N>) + 'static,
    ) {
        self.schedule(self.now + delay, action);
    }

    /// Moves `host` from address `old` to `new`: datagrams to `new` now reach it, datagrams to
    /// `old` (including those in flight) are undeliverable, and every link with `old` as an end
    /// now carries `new` instead, keeping its configuration, queue and counters (the host moved,
    /// the path did not). The node itself is not told; the scenario does that.
    pub fn change_address(
        &mut self,
        host: HostId,
        old: IpAddr,
        new: IpAddr,
    ) -> Result<(), SimError> {
        let h = &self.hosts[host.index()];
        let Some(pos) = h.addrs.iter().position(|&a| a == old) else {
            return Err(SimError::NotOwner { host, addr: old });
        };
        if old == new {
            return Ok(());
        }
        if let Some(&owner) = self.owners.get(&new) {
            return Err(SimError::AddressInUse { addr: new, owner });
        }
        let rekey = |ip: IpAddr| if ip == old { new } else { ip };
        let moved: Vec<((IpAddr, IpAddr), LinkId)> = self
            .routes
            .iter()
            .filter(|((from, to), _)| *from == old || *to == old)
            .map(|(&k, &v)| (k, v))
            .collect();
        for &((from, to), _) in &moved {
            let key = (rekey(from), rekey(to));
            if self.routes.contains_key(&key) && !moved.iter().any(|(k, _)| *k == key) {
                return Err(SimError::LinkExists {
                    from: key.0,
                    to: key.1,
                });
            }
        }
        for (key, _) in &moved {
            self.routes.remove(key);
        }
        for &((from, to), id) in &moved {
            let (from, to) = (rekey(from), rekey(to));
            self.routes.insert((from, to), id);
            // A shared link keeps the pair it was made for: rename only the moved end.
            let slot = &mut self.links[id.index()];
            slot.from = rekey(slot.from);
            slot.to = rekey(slot.to);
        }
        self.hosts[host.index()].addrs[pos] = new;
        self.owners.remove(&old);
        self.owners.insert(new, host);
        tracing::debug!(%host, %old, %new, links = moved.len(), "address changed");
        Ok(())
    }

    /// Runs every event up to and including `deadline`, then sets the clock to `deadline`
    /// (if it is later than now).
    ///
    /// # Panics
    /// On a stall, see [`Simulation::set_stall_limit`].
    pub fn run_until(&mut self, deadline: Instant) -> RunOutcome {
        let wall = WallTimer::start();
        self.touch_all();
        while let Some(t) = self.next_due() {
            if t > deadline {
                break;
            }
            self.step();
        }
        self.advance_to(deadline);
        self.settle_links();
        self.wall += wall.elapsed();
        if self.next_due().is_some() {
            RunOutcome::Deadline
        } else {
            RunOutcome::Idle
        }
    }

    /// [`Simulation::run_until`] `now + duration`.
    pub fn run_for(&mut self, duration: Duration) -> RunOutcome {
        self.run_until(self.now + duration)
    }

    /// Runs until every node reports [`Node::is_done`], and returns the virtual time that took
    /// (from the call). The clock stops at the instant the last node became done.
    ///
    /// Errors with [`SimError::TimeLimit`] if the next event would be after `limit` (the clock
    /// is then left at `limit`), or [`SimError::Idle`] if nothing is left to happen.
    ///
    /// # Panics
    /// On a stall, see [`Simulation::set_stall_limit`].
    pub fn run_until_done(&mut self, limit: Instant) -> Result<Duration, SimError> {
        let wall = WallTimer::start();
        let start = self.now;
        self.touch_all();
        let result = loop {
            if self.not_done == 0 {
                break Ok(self.now - start);
            }
            match self.next_due() {
                None => {
                    break Err(SimError::Idle {
                        at: self.elapsed(),
                        not_done: self.not_done_hosts(),
                    })
                }
                Some(t) if t > limit => {
                    self.advance_to(limit);
                    break Err(SimError::TimeLimit {
                        limit: limit.saturating_duration_since(self.epoch),
                        not_done: self.not_done_hosts(),
                    });
                }
                Some(_) => self.step(),
            }
        };
        self.settle_links();
        self.wall += wall.elapsed();
        result
    }

    /// Counters of every link and of the simulation, with virtual and wall time, ready to print.
    pub fn summary(&self) -> Summary {
        Summary {
            seed: self.seed,
            simulated: self.elapsed(),
            wall: self.wall,
            stats: self.stats,
            links: self
                .links
                .iter()
                .enumerate()
                .map(|(i, slot)| LinkSummary {
                    id: LinkId(i as u32),
                    from: slot.from,
                    to: slot.to,
                    stats: *slot.link.stats(),
                })
                .collect(),
        }
    }

    fn not_done_hosts(&self) -> Vec<HostId> {
        self.hosts()
            .filter(|h| !self.hosts[h.index()].done)
            .collect()
    }

    /// Brings every link's queue trace up to the current time.
    fn settle_links(&mut self) {
        let now = self.now;
        for slot in &mut self.links {
            slot.link.queued_bytes(now);
        }
    }

    fn push(&mut self, at: Instant, kind: EventKind) {
        self.seq += 1;
        self.events
            .push(Event::new(nanos_since(self.epoch, at), self.seq, kind));
    }

    fn instant(&self, nanos: u64) -> Instant {
        self.epoch + Duration::from_nanos(nanos)
    }

    /// The time of the next event or timer.
    fn next_due(&self) -> Option<Instant> {
        let event = self.events.peek().map(|e| self.instant(e.at_nanos()));
        let timer = self.timers.first().map(|&(t, _)| t);
        match (event, timer) {
            (Some(e), Some(t)) => Some(e.min(t)),
            (e, t) => e.or(t),
        }
    }

    fn advance_to(&mut self, t: Instant) {
        if t > self.now {
            self.now = t;
            self.steps_at_now = 0;
        }
    }

    /// Counts one unit of work at the current instant and fails loudly on a livelock.
    fn count_step(&mut self) {
        self.steps_at_now += 1;
        if self.steps_at_now > self.stall_limit {
            panic!(
                "simulation stalled at t={:?}: {} steps without virtual time advancing \
                 (seed {}; replay with TERN_SEED={}). A node keeps asking for a timeout at or \
                 before now, or datagrams ping-pong over zero-delay links.",
                self.elapsed(),
                self.steps_at_now,
                self.seed,
                self.seed
            );
        }
    }

    /// Processes the earliest event or timer. Arrivals and actions go before a timer due at the
    /// same instant, so a timer sees everything that arrived "at the same time".
    fn step(&mut self) {
        let event_at = self.events.peek().map(|e| self.instant(e.at_nanos()));
        let timer = self.timers.first().copied();
        let take_event = match (event_at, timer) {
            (Some(e), Some((t, _))) => e <= t,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return,
        };
        self.stats.events += 1;
        if take_event {
            let Some(event) = self.events.pop() else {
                return;
            };
            self.advance_to(self.instant(event.at_nanos()));
            self.count_step();
            match event.kind {
                EventKind::Arrival(slot, link) => {
                    if let Some(dgram) = self.packets.take(slot) {
                        let key = (dgram.src.ip(), dgram.dst.ip(), LinkId(link));
                        match self.next_hops.get(&key) {
                            Some(&next) => self.forward(dgram, next),
                            None => self.deliver(dgram),
                        }
                    }
                }
                EventKind::Action(slot) => {
                    if let Some(action) = self.actions.take(slot) {
                        self.stats.actions += 1;
                        action(self);
                        // The action may have changed any node; let them all act on it now.
                        self.touch_all();
                    }
                }
            }
        } else if let Some((at, host)) = timer {
            self.timers.remove(&(at, host));
            self.advance_to(at);
            self.count_step();
            self.stats.timers += 1;
            let h = &mut self.hosts[host.index()];
            h.timer = None;
            h.node.handle_timeout(self.now);
            self.touch(host);
        }
    }

    fn deliver(&mut self, dgram: Datagram) {
        match self.owners.get(&dgram.dst.ip()) {
            Some(&host) => {
                self.stats.delivered += 1;
                self.hosts[host.index()].node.handle(self.now, dgram);
                self.touch(host);
            }
            None => self.stats.undeliverable += 1,
        }
    }

    /// Puts a datagram a node sent onto its link.
    fn send(&mut self, dgram: Datagram) {
        self.stats.sent += 1;
        let Some(&id) = self.routes.get(&(dgram.src.ip(), dgram.dst.ip())) else {
            self.stats.unroutable += 1;
            return;
        };
        self.forward(dgram, id);
    }

    /// Puts a datagram onto link `id` (its first hop, or the next one of a multi-hop path).
    fn forward(&mut self, dgram: Datagram, id: LinkId) {
        let now = self.now;
        let epoch = self.epoch;
        let packets = &mut self.packets;
        let events = &mut self.events;
        let seq = &mut self.seq;
        self.links[id.index()].link.process(dgram, now, |at, d| {
            let slot = packets.insert(d);
            *seq += 1;
            events.push(Event::new(
                nanos_since(epoch, at),
                *seq,
                EventKind::Arrival(slot, id.0),
            ));
        });
    }

    /// After a node has been handed something: send what it wants to send, re-arm its timer,
    /// refresh its done flag.
    fn touch(&mut self, host: HostId) {
        let now = self.now;
        while let Some(dgram) = self.hosts[host.index()].node.poll_transmit(now) {
            self.count_step();
            self.send(dgram);
        }
        let h = &mut self.hosts[host.index()];
        let want = h.node.poll_timeout().map(|t| t.max(now));
        if want != h.timer {
            if let Some(old) = h.timer {
                self.timers.remove(&(old, host));
            }
            if let Some(t) = want {
                self.timers.insert((t, host));
            }
            h.timer = want;
        }
        let done = h.node.is_done();
        if done != h.done {
            h.done = done;
            if done {
                self.not_done -= 1;
            } else {
                self.not_done += 1;
            }
        }
    }

    fn touch_all(&mut self) {
        for i in 0..self.hosts.len() {
            self.touch(HostId(i as u32));
        }
    }
}

/// Wall-clock measurement for the "simulated X in Y wall" line. The only other clock read of
/// the simulator; it never influences the simulation.
struct WallTimer(Instant);

impl WallTimer {
    #[allow(clippy::disallowed_methods)]
    fn start() -> Self {
        Self(Instant::now())
    }

    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}
