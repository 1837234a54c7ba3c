//! Network-namespace topologies: hosts, plain routers and emulating routers joined by veth
//! pairs, with static routes, built with `ip` and removed again on drop.
//!
//! Every node is a network namespace named `<prefix>-<node>`, where the prefix
//! `tn<pid>-<n>` is unique to the process and the topology, so parallel runs never collide.
//! Every wire is a veth pair whose ends are named `to-<peer>` inside each namespace; nothing is
//! ever created in, or changed in, the namespace tern-netem runs in.
//!
//! An *emulating router* has exactly two wires, its A side (the first wire listed) and its B
//! side. Policy routing sends every packet that enters from the A side to the TUN device
//! `tun-up` (table 100) and every packet from the B side to `tun-down` (table 101); the
//! [`crate::Emulator`] reads them there and writes them back after the link model has had its
//! say. Each of those tables also has a lowest-priority blackhole route, so while no emulator
//! runs nothing crosses the router unshaped.
//!
//! Routes are computed by breadth-first search over the wires: every namespace gets a route to
//! every subnet it is not on, via the first hop of a shortest path (ties broken by wire order).
//! Single-homed hosts only get a default route. Multihomed hosts also get one routing table per
//! interface selected by source address, so a socket bound to an address leaves through that
//! address's path.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::cleanup::{self, Registration};
use crate::cmd;
use crate::config::{Direction, EmulationConfig};
use crate::emulator::{Attachment, Emulator};
use crate::Error;

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An end host: runs applications, does not forward.
    Host,
    /// A plain router: forwards, no emulation.
    Router,
    /// A router whose two wires form one emulated link, named after the node.
    Emulator,
}

/// A node of a [`TopologySpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Short name (`[a-z0-9]`, at most 10 characters), unique in the topology.
    pub name: String,
    /// What it does.
    pub role: Role,
}

/// A veth wire between two nodes, each end with a primary address and optional extra ones,
/// all with the same prefix length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireSpec {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
    /// `a`'s address.
    pub a_addr: Ipv4Addr,
    /// `b`'s address.
    pub b_addr: Ipv4Addr,
    /// Prefix length of every address on the wire.
    pub prefix_len: u8,
    /// Extra addresses of `a` on this wire (e.g. a second subnet a host can move into).
    pub a_extra: Vec<Ipv4Addr>,
    /// Extra addresses of `b` on this wire.
    pub b_extra: Vec<Ipv4Addr>,
}

/// The shape of a topology: nodes and wires. Presets: [`TopologySpec::single`],
/// [`TopologySpec::dual`], [`TopologySpec::parking_lot`], [`TopologySpec::mobile`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologySpec {
    /// Name of the shape (`single`, …), for messages.
    pub kind: String,
    /// Nodes, in creation order.
    pub nodes: Vec<NodeSpec>,
    /// Wires, in creation order (the order also breaks routing ties and picks emulator sides).
    pub wires: Vec<WireSpec>,
}

/// `10.77.<subnet>.<host>`.
fn net(subnet: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, subnet, host)
}

/// The names of the preset topologies.
pub const PRESETS: [&str; 4] = ["single", "dual", "parking-lot", "mobile"];

impl TopologySpec {
    /// An empty spec.
    pub fn new(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            nodes: Vec::new(),
            wires: Vec::new(),
        }
    }

    /// Adds a node.
    #[must_use]
    pub fn node(mut self, name: &str, role: Role) -> Self {
        self.nodes.push(NodeSpec {
            name: name.to_owned(),
            role,
        });
        self
    }

    /// Adds a /24 wire.
    #[must_use]
    pub fn wire(mut self, a: &str, a_addr: Ipv4Addr, b: &str, b_addr: Ipv4Addr) -> Self {
        self.wires.push(WireSpec {
            a: a.to_owned(),
            b: b.to_owned(),
            a_addr,
            b_addr,
            prefix_len: 24,
            a_extra: Vec::new(),
            b_extra: Vec::new(),
        });
        self
    }

    /// `c` — `r` — `s`: client 10.77.1.1, server 10.77.2.1, emulated link `r`
    /// (up = client → server).
    pub fn single() -> Self {
        Self::new("single")
            .node("c", Role::Host)
            .node("r", Role::Emulator)
            .node("s", Role::Host)
            .wire("c", net(1, 1), "r", net(1, 2))
            .wire("r", net(2, 2), "s", net(2, 1))
    }

    /// Two disjoint paths between multihomed hosts: `c` (10.77.1.1 and 10.77.3.1) and `s`
    /// (10.77.2.1 and 10.77.4.1), path 1 through emulated link `r1`, path 2 through `r2`.
    pub fn dual() -> Self {
        Self::new("dual")
            .node("c", Role::Host)
            .node("r1", Role::Emulator)
            .node("r2", Role::Emulator)
            .node("s", Role::Host)
            .wire("c", net(1, 1), "r1", net(1, 2))
            .wire("r1", net(2, 2), "s", net(2, 1))
            .wire("c", net(3, 1), "r2", net(3, 2))
            .wire("r2", net(4, 2), "s", net(4, 1))
    }

    /// Parking lot with two bottlenecks: junctions `j1` —`b1`— `j2` —`b2`— `j3`, where `b1`
    /// and `b2` are the emulated bottlenecks (up = left to right). Flow 0 `src0` → `dst0`
    /// crosses both, flow 1 `src1` → `dst1` only `b1`, flow 2 `src2` → `dst2` only `b2`.
    /// Hosts: src0 10.77.1.1, src1 10.77.2.1, dst1 10.77.5.1, src2 10.77.6.1,
    /// dst0 10.77.9.1, dst2 10.77.10.1.
    pub fn parking_lot() -> Self {
        Self::new("parking-lot")
            .node("src0", Role::Host)
            .node("src1", Role::Host)
            .node("src2", Role::Host)
            .node("dst0", Role::Host)
            .node("dst1", Role::Host)
            .node("dst2", Role::Host)
            .node("j1", Role::Router)
            .node("b1", Role::Emulator)
            .node("j2", Role::Router)
            .node("b2", Role::Emulator)
            .node("j3", Role::Router)
            .wire("src0", net(1, 1), "j1", net(1, 2))
            .wire("src1", net(2, 1), "j1", net(2, 2))
            .wire("j1", net(3, 1), "b1", net(3, 2))
            .wire("b1", net(4, 1), "j2", net(4, 2))
            .wire("dst1", net(5, 1), "j2", net(5, 2))
            .wire("src2", net(6, 1), "j2", net(6, 2))
            .wire("j2", net(7, 1), "b2", net(7, 2))
            .wire("b2", net(8, 1), "j3", net(8, 2))
            .wire("dst0", net(9, 1), "j3", net(9, 2))
            .wire("dst2", net(10, 1), "j3", net(10, 2))
    }

    /// Like [`TopologySpec::single`], plus a second subnet on the client's wire: the router
    /// also has 10.77.5.2 there, so the client can move from 10.77.1.1 to 10.77.5.1 (a new
    /// network) or to another address in 10.77.1.0/24 (NAT rebinding) with
    /// [`Topology::change_address`].
    pub fn mobile() -> Self {
        let mut spec = Self::single();
        spec.kind = "mobile".into();
        spec.wires[0].b_extra.push(net(5, 2));
        spec
    }

    /// A preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Result<Self, Error> {
        match name {
            "single" => Ok(Self::single()),
            "dual" => Ok(Self::dual()),
            "parking-lot" | "parking_lot" | "parkinglot" => Ok(Self::parking_lot()),
            "mobile" => Ok(Self::mobile()),
            other => Err(Error::Parse(format!(
                "unknown topology {other:?}; known: {}",
                PRESETS.join(", ")
            ))),
        }
    }

    /// The role of a node.
    pub fn role(&self, node: &str) -> Option<Role> {
        self.nodes.iter().find(|n| n.name == node).map(|n| n.role)
    }

    /// The emulated links (the names of the emulating routers).
    pub fn links(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Emulator)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Wires of `node`, in order, as `(wire index, peer)`.
    fn wires_of(&self, node: &str) -> Vec<(usize, &str)> {
        self.wires
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                if w.a == node {
                    Some((i, w.b.as_str()))
                } else if w.b == node {
                    Some((i, w.a.as_str()))
                } else {
                    None
                }
            })
            .collect()
    }

    /// Checks names, wiring and addresses.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Topology(m));
        let mut names = BTreeSet::new();
        for n in &self.nodes {
            let ok = !n.name.is_empty()
                && n.name.len() <= 10
                && n.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            if !ok {
                return bad(format!(
                    "node name {:?}: use 1-10 characters a-z, 0-9",
                    n.name
                ));
            }
            if !names.insert(n.name.as_str()) {
                return bad(format!("node {:?} appears twice", n.name));
            }
        }
        let mut pairs = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for w in &self.wires {
            for end in [&w.a, &w.b] {
                if !names.contains(end.as_str()) {
                    return bad(format!("wire to unknown node {end:?}"));
                }
            }
            if w.a == w.b {
                return bad(format!("wire from {:?} to itself", w.a));
            }
            let pair = if w.a < w.b {
                (w.a.clone(), w.b.clone())
            } else {
                (w.b.clone(), w.a.clone())
            };
            if !pairs.insert(pair) {
                return bad(format!("two wires between {} and {}", w.a, w.b));
            }
            if !(1..=30).contains(&w.prefix_len) {
                return bad(format!("prefix length /{} not supported", w.prefix_len));
            }
            for a in std::iter::once(&w.a_addr)
                .chain(std::iter::once(&w.b_addr))
                .chain(&w.a_extra)
                .chain(&w.b_extra)
            {
                if !addrs.insert(*a) {
                    return bad(format!("address {a} used twice"));
                }
            }
        }
        for n in &self.nodes {
            if n.role == Role::Emulator && self.wires_of(&n.name).len() != 2 {
                return bad(format!(
                    "emulating router {:?} needs exactly two wires",
                    n.name
                ));
            }
        }
        Ok(())
    }
}

/// An address on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IfAddr {
    node: String,
    iface: String,
    wire: usize,
    addr: Ipv4Addr,
    prefix_len: u8,
}

fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    let bits = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Ipv4Addr::from(u32::from(addr) & bits)
}

/// All addresses of a spec, primary ones first per wire end.
fn addresses(spec: &TopologySpec) -> Vec<IfAddr> {
    let mut out = Vec::new();
    for (i, w) in spec.wires.iter().enumerate() {
        for (node, peer, primary, extra) in [
            (&w.a, &w.b, w.a_addr, &w.a_extra),
            (&w.b, &w.a, w.b_addr, &w.b_extra),
        ] {
            for addr in std::iter::once(primary).chain(extra.iter().copied()) {
                out.push(IfAddr {
                    node: node.clone(),
                    iface: format!("to-{peer}"),
                    wire: i,
                    addr,
                    prefix_len: w.prefix_len,
                });
            }
        }
    }
    out
}

/// `ip` batch lines for the static routes of every node (see the module docs).
fn route_lines(spec: &TopologySpec, addrs: &[IfAddr]) -> BTreeMap<String, Vec<String>> {
    let subnets: Vec<(Ipv4Addr, u8)> = {
        let mut seen = Vec::new();
        for a in addrs {
            let s = (mask(a.addr, a.prefix_len), a.prefix_len);
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        seen
    };
    let on_subnet = |node: &str, (net, len): (Ipv4Addr, u8)| {
        addrs
            .iter()
            .any(|a| a.node == node && a.prefix_len == len && mask(a.addr, len) == net)
    };
    // The primary address of `node`'s end of wire `wire`.
    let primary = |node: &str, wire: usize| {
        let w = &spec.wires[wire];
        if w.a == node {
            w.a_addr
        } else {
            w.b_addr
        }
    };
    let mut out = BTreeMap::new();
    for n in &spec.nodes {
        let mut lines = Vec::new();
        let wires = spec.wires_of(&n.name);
        let single_homed_host = n.role == Role::Host && wires.len() == 1;
        if single_homed_host {
            let (w, peer) = wires[0];
            lines.push(format!(
                "route add default via {} dev to-{peer}",
                primary(peer, w)
            ));
        } else {
            for &subnet in &subnets {
                if on_subnet(&n.name, subnet) {
                    continue;
                }
                // BFS for the nearest node on the subnet; remember each node's first hop.
                let mut first_hop: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
                let mut queue = VecDeque::new();
                let mut seen = BTreeSet::from([n.name.as_str()]);
                for (w, peer) in &wires {
                    if seen.insert(peer) {
                        first_hop.insert(peer, (*w, peer));
                        queue.push_back(*peer);
                    }
                }
                let mut found = None;
                while let Some(x) = queue.pop_front() {
                    if on_subnet(x, subnet) {
                        found = Some(first_hop[x]);
                        break;
                    }
                    // Hosts do not forward: paths never go through them.
                    if spec.role(x) == Some(Role::Host) {
                        continue;
                    }
                    let hop = first_hop[x];
                    for (_, y) in spec.wires_of(x) {
                        if seen.insert(y) {
                            first_hop.insert(y, hop);
                            queue.push_back(y);
                        }
                    }
                }
                if let Some((w, peer)) = found {
                    lines.push(format!(
                        "route add {}/{} via {} dev to-{peer}",
                        subnet.0,
                        subnet.1,
                        primary(peer, w)
                    ));
                }
            }
            if n.role == Role::Host {
                // Multihomed: a default via the first wire, and per-source tables.
                let (w0, p0) = wires[0];
                lines.push(format!(
                    "route add default via {} dev to-{p0}",
                    primary(p0, w0)
                ));
                for (i, (w, peer)) in wires.iter().enumerate() {
                    let table = 10 + i;
                    lines.push(format!(
                        "route add default via {} dev to-{peer} table {table}",
                        primary(peer, *w)
                    ));
                    for a in addrs.iter().filter(|a| a.node == n.name && a.wire == *w) {
                        lines.push(format!(
                            "rule add from {} table {table} pref {}",
                            a.addr,
                            1000 + i
                        ));
                    }
                }
            }
        }
        if n.role == Role::Emulator {
            for (i, (_, peer)) in wires.iter().enumerate() {
                let table = 100 + i;
                lines.push(format!(
                    "rule add iif to-{peer} table {table} pref {}",
                    100 + i
                ));
                lines.push(format!(
                    "route add blackhole default table {table} metric 1000000"
                ));
            }
        }
        out.insert(n.name.clone(), lines);
    }
    out
}

static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(0);
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<Weak<Inner>>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tears down every live topology of this process (what the signal handler of
/// [`crate::install_signal_cleanup`] does before exiting). After this call no new topology can
/// be built in this process.
pub fn teardown_all() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
    let all: Vec<Arc<Inner>> = live().iter().filter_map(Weak::upgrade).collect();
    for t in all {
        if let Err(e) = t.teardown() {
            eprintln!("tern-netem: teardown of {}: {e}", t.prefix);
        }
    }
}

#[derive(Debug)]
struct State {
    /// Namespaces created (or being created), in order.
    created: Vec<String>,
    registration: Option<Registration>,
    emulator: Option<Emulator>,
    addrs: Vec<IfAddr>,
    torn_down: bool,
}

#[derive(Debug)]
struct Inner {
    prefix: String,
    spec: TopologySpec,
    state: Mutex<State>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn teardown(&self) -> Result<(), Error> {
        let mut st = self.state();
        if st.torn_down {
            return Ok(());
        }
        st.torn_down = true;
        if let Some(emu) = st.emulator.take() {
            emu.stop();
        }
        let result = cleanup::remove_namespaces(&st.created);
        if result.is_ok() {
            if let Some(r) = st.registration.take() {
                r.remove();
            }
        }
        result
    }
}

/// A built topology. Dropping it (or [`Topology::teardown`]) stops its emulator, kills the
/// processes inside its namespaces and deletes the namespaces (and with them every veth and
/// TUN device).
#[derive(Debug)]
pub struct Topology {
    inner: Arc<Inner>,
}

/// For a test that needs the emulator: whether this machine can run it (root,
/// `/dev/net/tun`, `ip netns`), saying `SKIPPED <test>: why` when it cannot. Also installs the
/// Ctrl-C cleanup handler, so an interrupted test run leaves nothing behind.
pub fn test_prerequisites(test: &str) -> bool {
    match check_environment() {
        Ok(()) => {
            crate::cleanup::install_signal_cleanup().expect("signal handler");
            true
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            false
        }
    }
}

/// Checks the prerequisites: root, `/dev/net/tun`, iproute2 with `ip netns`.
pub fn check_environment() -> Result<(), Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Unsupported("must run as root".into()));
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err(Error::Unsupported("/dev/net/tun is missing".into()));
    }
    if !cmd::available("ip", "-V") {
        return Err(Error::Unsupported(
            "`ip` (iproute2) is not installed".into(),
        ));
    }
    cmd::ip(&["netns", "list"])
        .map_err(|e| Error::Unsupported(format!("`ip netns` does not work: {e}")))?;
    Ok(())
}

impl Topology {
    /// Builds a topology. Stale namespaces of dead tern-netem processes are removed first
    /// (see [`crate::cleanup_stale`]). On failure, everything created so far is removed.
    pub fn build(spec: &TopologySpec) -> Result<Self, Error> {
        spec.validate()?;
        check_environment()?;
        if let Err(e) = cleanup::cleanup_stale() {
            eprintln!("tern-netem: removing stale namespaces: {e}");
        }
        let prefix = format!(
            "tn{}-{}",
            std::process::id(),
            NEXT_TOPOLOGY.fetch_add(1, Ordering::Relaxed)
        );
        let topo = Topology {
            inner: Arc::new(Inner {
                prefix: prefix.clone(),
                spec: spec.clone(),
                state: Mutex::new(State {
                    created: Vec::new(),
                    registration: Some(Registration::create(&prefix)?),
                    emulator: None,
                    addrs: addresses(spec),
                    torn_down: false,
                }),
            }),
        };
        {
            let mut l = live();
            l.retain(|w| w.strong_count() > 0);
            l.push(Arc::downgrade(&topo.inner));
        }
        // On error, `topo` is dropped and removes what was created.
        topo.create()?;
        Ok(topo)
    }

    fn create(&self) -> Result<(), Error> {
        let spec = &self.inner.spec;
        for n in &spec.nodes {
            let ns = self.ns_name(&n.name);
            let mut st = self.inner.state();
            if st.torn_down || SHUTTING_DOWN.load(Ordering::SeqCst) {
                return Err(Error::Topology("shutting down".into()));
            }
            if let Some(r) = &st.registration {
                r.add_namespace(&ns)?;
            }
            st.created.push(ns.clone());
            cmd::ip(&["netns", "add", &ns])?;
        }
        for n in &spec.nodes {
            let ns = self.ns_name(&n.name);
            let mut settings = vec![
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.all.promote_secondaries=1",
                "net.ipv4.conf.default.promote_secondaries=1",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ];
            if n.role != Role::Host {
                settings.push("net.ipv4.ip_forward=1");
            }
            cmd::sysctl_in(&ns, &settings)?;
        }
        for w in &spec.wires {
            let (ns_a, ns_b) = (self.ns_name(&w.a), self.ns_name(&w.b));
            cmd::ip(&[
                "-n",
                &ns_a,
                "link",
                "add",
                &format!("to-{}", w.b),
                "type",
                "veth",
                "peer",
                "name",
                &format!("to-{}", w.a),
                "netns",
                &ns_b,
            ])?;
        }
        let addrs = self.inner.state().addrs.clone();
        let routes = route_lines(spec, &addrs);
        for n in &spec.nodes {
            let mut lines = vec!["link set lo up".to_owned()];
            for a in addrs.iter().filter(|a| a.node == n.name) {
                lines.push(format!(
                    "addr add {}/{} dev {}",
                    a.addr, a.prefix_len, a.iface
                ));
            }
            for (_, peer) in spec.wires_of(&n.name) {
                lines.push(format!("link set to-{peer} up"));
            }
            lines.extend(routes[&n.name].iter().cloned());
            cmd::ip_batch(&self.ns_name(&n.name), &lines)?;
        }
        Ok(())
    }

    /// The unique prefix of this topology's namespaces (`tn<pid>-<n>`).
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The spec it was built from.
    pub fn spec(&self) -> &TopologySpec {
        &self.inner.spec
    }

    fn ns_name(&self, node: &str) -> String {
        format!("{}-{node}", self.inner.prefix)
    }

    fn check_node(&self, node: &str) -> Result<(), Error> {
        match self.inner.spec.role(node) {
            Some(_) => Ok(()),
            None => Err(Error::UnknownNode(node.to_owned())),
        }
    }

    /// The namespace of a node.
    pub fn ns(&self, node: &str) -> Result<String, Error> {
        self.check_node(node)?;
        Ok(self.ns_name(node))
    }

    /// The node's current addresses (primary address of its first wire first).
    pub fn addrs(&self, node: &str) -> Result<Vec<Ipv4Addr>, Error> {
        self.check_node(node)?;
        Ok(self
            .inner
            .state()
            .addrs
            .iter()
            .filter(|a| a.node == node)
            .map(|a| a.addr)
            .collect())
    }

    /// The node's first address.
    pub fn addr(&self, node: &str) -> Result<Ipv4Addr, Error> {
        self.addrs(node)?
            .first()
            .copied()
            .ok_or_else(|| Error::Topology(format!("node {node} has no address")))
    }

    /// The emulated links.
    pub fn links(&self) -> Vec<String> {
        self.inner.spec.links()
    }

    /// A command that runs `program` inside `node`'s namespace (`ip netns exec NS program`).
    /// Processes started this way are killed at teardown.
    pub fn command(&self, node: &str, program: impl AsRef<OsStr>) -> Result<Command, Error> {
        let ns = self.ns(node)?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec"]).arg(ns).arg(program);
        Ok(c)
    }

    /// Starts the emulator on every emulated link. Fails if one is already running.
    pub fn start(&self, config: &EmulationConfig) -> Result<Emulator, Error> {
        let links = self.links();
        for name in config.links.keys() {
            if !links.contains(name) {
                return Err(Error::UnknownLink(name.clone()));
            }
        }
        let mut st = self.inner.state();
        if st.torn_down {
            return Err(Error::Topology("already torn down".into()));
        }
        if st.emulator.is_some() {
            return Err(Error::Topology("the emulator is already running".into()));
        }
        // Jumbo datagrams (DESIGN.md F14): every veth and TUN device carries the largest MTU a
        // direction asks for; each direction's engine drops what exceeds its own.
        let mtu = config.max_mtu().unwrap_or(1500).clamp(1500, 65_535);
        if mtu > 1500 {
            self.set_wire_mtu(mtu)?;
        }
        let mut attachments = Vec::new();
        for link in &links {
            for (i, dir) in Direction::BOTH.into_iter().enumerate() {
                attachments.push(Attachment {
                    link: link.clone(),
                    dir,
                    ns: self.ns_name(link),
                    tun: format!("tun-{dir}"),
                    table: 100 + i as u32,
                    mtu: mtu as u16,
                });
            }
        }
        let emu = Emulator::start(
            &attachments,
            |link, dir| config.get(link, dir).clone(),
            config.queue_trace,
            config.realtime,
        )?;
        st.emulator = Some(emu.clone());
        Ok(emu)
    }

    /// Sets the MTU of both ends of every wire (raising it lets jumbo datagrams through).
    pub fn set_wire_mtu(&self, mtu: usize) -> Result<(), Error> {
        for w in &self.inner.spec.wires {
            let mtu = mtu.to_string();
            for (ns, peer) in [(self.ns_name(&w.a), &w.b), (self.ns_name(&w.b), &w.a)] {
                cmd::ip(&["-n", &ns, "link", "set", &format!("to-{peer}"), "mtu", &mtu])?;
            }
        }
        Ok(())
    }

    /// The running emulator, if any.
    pub fn emulator(&self) -> Option<Emulator> {
        self.inner.state().emulator.clone()
    }

    /// Stops the emulator (nothing crosses the emulated links until the next
    /// [`Topology::start`]).
    pub fn stop(&self) {
        if let Some(emu) = self.inner.state().emulator.take() {
            emu.stop();
        }
    }

    /// Moves `node` from address `old` to `new` (same interface and prefix length) while
    /// running: the new address is added, routes are pointed at the neighbour on that wire
    /// that has an address in the new subnet, then the old address is removed. Sockets bound
    /// to the old address stop working, as on a real handover.
    pub fn change_address(&self, node: &str, old: Ipv4Addr, new: Ipv4Addr) -> Result<(), Error> {
        self.check_node(node)?;
        let spec = &self.inner.spec;
        let mut st = self.inner.state();
        let idx = st
            .addrs
            .iter()
            .position(|a| a.node == node && a.addr == old)
            .ok_or_else(|| Error::Topology(format!("{node} has no address {old}")))?;
        if st.addrs.iter().any(|a| a.addr == new) {
            return Err(Error::Topology(format!("{new} is already in use")));
        }
        let this = st.addrs[idx].clone();
        let len = this.prefix_len;
        let gateway = st
            .addrs
            .iter()
            .find(|a| a.wire == this.wire && a.node != node && mask(a.addr, len) == mask(new, len))
            .map(|a| a.addr)
            .ok_or_else(|| {
                Error::Topology(format!(
                    "no neighbour on {node}'s {} has an address in {}/{len}",
                    this.iface,
                    mask(new, len)
                ))
            })?;
        let wires = spec.wires_of(node);
        let position = wires.iter().position(|(w, _)| *w == this.wire).unwrap_or(0);
        let mut lines = vec![format!("addr add {new}/{len} dev {}", this.iface)];
        let host = spec.role(node) == Some(Role::Host);
        if host && wires.len() == 1 {
            lines.push(format!(
                "route replace default via {gateway} dev {}",
                this.iface
            ));
        } else if host {
            let table = 10 + position;
            lines.push(format!(
                "route replace default via {gateway} dev {} table {table}",
                this.iface
            ));
            lines.push(format!("rule del from {old} table {table}"));
            lines.push(format!(
                "rule add from {new} table {table} pref {}",
                1000 + position
            ));
        }
        lines.push(format!("addr del {old}/{len} dev {}", this.iface));
        cmd::ip_batch(&self.ns_name(node), &lines)?;
        st.addrs[idx].addr = new;
        Ok(())
    }

    /// A human-readable description: nodes, namespaces, addresses, links.
    pub fn describe(&self) -> String {
        let spec = &self.inner.spec;
        let mut s = format!("topology {} (prefix {})\n", spec.kind, self.prefix());
        for n in &spec.nodes {
            let addrs = self.addrs(&n.name).unwrap_or_default();
            let addrs: Vec<String> = addrs.iter().map(Ipv4Addr::to_string).collect();
            let role = match n.role {
                Role::Host => "host",
                Role::Router => "router",
                Role::Emulator => "emulator",
            };
            let _ = writeln!(
                s,
                "  {:<5} {role:<8} ns {:<16} {}",
                n.name,
                self.ns_name(&n.name),
                addrs.join(" ")
            );
        }
        for n in spec.nodes.iter().filter(|n| n.role == Role::Emulator) {
            let w = spec.wires_of(&n.name);
            let _ = writeln!(
                s,
                "  link {}: up = {} -> {}, down = {} -> {}",
                n.name, w[0].1, w[1].1, w[1].1, w[0].1
            );
        }
        s
    }

    /// Environment variables describing the topology: `TN_PREFIX`, and per node
    /// `TN_NS_<NODE>` (namespace), `TN_ADDR_<NODE>` (first address) and `TN_ADDRS_<NODE>`
    /// (all, space-separated).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut v = vec![("TN_PREFIX".to_owned(), self.prefix().to_owned())];
        for n in &self.inner.spec.nodes {
            let up = n.name.to_ascii_uppercase();
            let addrs = self.addrs(&n.name).unwrap_or_default();
            v.push((format!("TN_NS_{up}"), self.ns_name(&n.name)));
            if let Some(a) = addrs.first() {
                v.push((format!("TN_ADDR_{up}"), a.to_string()));
            }
            let all: Vec<String> = addrs.iter().map(Ipv4Addr::to_string).collect();
            v.push((format!("TN_ADDRS_{up}"), all.join(" ")));
        }
        v
    }

    /// Removes everything now and reports errors (dropping does the same silently).
    pub fn teardown(self) -> Result<(), Error> {
        self.inner.teardown()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.inner.teardown() {
            eprintln!("tern-netem: teardown of {}: {e}", self.inner.prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        for p in PRESETS {
            TopologySpec::preset(p).unwrap().validate().unwrap();
        }
        assert!(TopologySpec::preset("torus").is_err());
        let bad = TopologySpec::new("x")
            .node("a", Role::Host)
            .node("e", Role::Emulator)
            .wire("a", net(1, 1), "e", net(1, 2));
        assert!(bad.validate().is_err());
        let bad = TopologySpec::new("x").node("Bad", Role::Host);
        assert!(bad.validate().is_err());
    }

    #[test]
    fn single_routes() {
        let spec = TopologySpec::single();
        let r = route_lines(&spec, &addresses(&spec));
        assert_eq!(r["c"], vec!["route add default via 10.77.1.2 dev to-r"]);
        assert_eq!(r["s"], vec!["route add default via 10.77.2.2 dev to-r"]);
        assert_eq!(
            r["r"],
            vec![
                "rule add iif to-c table 100 pref 100",
                "route add blackhole default table 100 metric 1000000",
                "rule add iif to-s table 101 pref 101",
                "route add blackhole default table 101 metric 1000000",
            ]
        );
    }

    #[test]
    fn dual_routes_keep_paths_apart() {
        let spec = TopologySpec::dual();
        let r = route_lines(&spec, &addresses(&spec));
        let c = r["c"].join("\n");
        assert!(
            c.contains("route add 10.77.2.0/24 via 10.77.1.2 dev to-r1"),
            "{c}"
        );
        assert!(
            c.contains("route add 10.77.4.0/24 via 10.77.3.2 dev to-r2"),
            "{c}"
        );
        assert!(c.contains("rule add from 10.77.3.1 table 11"), "{c}");
        let r1 = r["r1"].join("\n");
        // r1 reaches the client's second address through the client, never through s.
        assert!(
            r1.contains("route add 10.77.3.0/24 via 10.77.1.1 dev to-c"),
            "{r1}"
        );
        assert!(
            r1.contains("route add 10.77.4.0/24 via 10.77.2.1 dev to-s"),
            "{r1}"
        );
    }

    #[test]
    fn parking_lot_routes_cross_the_bottlenecks() {
        let spec = TopologySpec::parking_lot();
        let r = route_lines(&spec, &addresses(&spec));
        let j1 = r["j1"].join("\n");
        assert!(
            j1.contains("route add 10.77.9.0/24 via 10.77.3.2 dev to-b1"),
            "{j1}"
        );
        let j2 = r["j2"].join("\n");
        assert!(
            j2.contains("route add 10.77.9.0/24 via 10.77.7.2 dev to-b2"),
            "{j2}"
        );
        assert!(
            j2.contains("route add 10.77.1.0/24 via 10.77.4.1 dev to-b1"),
            "{j2}"
        );
        let b1 = r["b1"].join("\n");
        assert!(b1.contains("rule add iif to-j1 table 100"), "{b1}");
        assert!(b1.contains("rule add iif to-j2 table 101"), "{b1}");
    }

    #[test]
    fn mobile_has_a_second_subnet() {
        let spec = TopologySpec::mobile();
        let r = route_lines(&spec, &addresses(&spec));
        assert_eq!(r["s"], vec!["route add default via 10.77.2.2 dev to-r"]);
        let a = addresses(&spec);
        assert!(a
            .iter()
            .any(|x| x.node == "r" && x.addr == net(5, 2) && x.iface == "to-c"));
    }
}
