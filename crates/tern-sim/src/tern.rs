//! tern endpoints as simulator nodes, and the applications the tests run on them: a bulk
//! sender of several flows and a receiver that checks every byte, and a download (a server
//! that sends one flow to a client that checks every byte).
//!
//! Flow payloads are a pure function of (flow index, offset), so the receiver verifies each
//! byte without the sender's copy, and memory stays bounded by the protocol's windows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tern_proto::{
    ConnectionHandle, Dir, Endpoint, EndpointConfig, Event, FlowId, PublicKey, StaticKeypair,
    WriteError,
};

use crate::sim::{Datagram, Node};

/// Length of the shared payload pattern: a prime a little over 1 MiB, so that a byte moved
/// by any multiple of a packet or a power of two lands on a different value.
const PATTERN_LEN: usize = (1 << 20) + 7;

/// The payload pattern every simulated flow draws from, generated once.
fn pattern() -> &'static Bytes {
    static PATTERN: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| {
        let mut x: u64 = 0x243F_6A88_85A3_08D3;
        let mut v = Vec::with_capacity(PATTERN_LEN);
        while v.len() < PATTERN_LEN {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(PATTERN_LEN);
        Bytes::from(v)
    })
}

/// Where flow `flow`'s byte at `offset` sits in the pattern.
fn pattern_index(flow: u64, offset: u64) -> usize {
    ((offset + flow.wrapping_mul(7919)) % PATTERN_LEN as u64) as usize
}

/// Byte `offset` of flow number `flow`: a pure function of both, so the receiver checks
/// every byte without the sender's copy.
pub fn payload_byte(flow: u64, offset: u64) -> u8 {
    pattern()[pattern_index(flow, offset)]
}

/// Up to `max` bytes of flow `flow`'s payload from `offset`, without copying.
pub fn payload_slice(flow: u64, offset: u64, max: usize) -> Bytes {
    let start = pattern_index(flow, offset);
    let end = (start + max).min(PATTERN_LEN);
    pattern().slice(start..end)
}

/// Whether `data` is flow `flow`'s payload at `offset`; else the offset of the first wrong
/// byte.
pub fn check_payload(flow: u64, offset: u64, data: &[u8]) -> Result<(), u64> {
    let mut pos = 0;
    while pos < data.len() {
        let expected = payload_slice(flow, offset + pos as u64, data.len() - pos);
        let got = &data[pos..pos + expected.len()];
        if got != &expected[..] {
            let j = (0..got.len()).find(|&j| got[j] != expected[j]).unwrap_or(0);
            return Err(offset + (pos + j) as u64);
        }
        pos += expected.len();
    }
    Ok(())
}

/// For a client application's `poll`: connects to `server` on the first call (remembering the
/// handle in `conn`) and returns the connection once it is established.
///
/// # Panics
/// If the endpoint refuses to connect (a test set-up error).
pub fn established<'a>(
    conn: &mut Option<ConnectionHandle>,
    ep: &'a mut Endpoint,
    now: Instant,
    server: SocketAddr,
    key: PublicKey,
) -> Option<&'a mut tern_proto::Connection> {
    let h = *conn.get_or_insert_with(|| ep.connect(now, server, Some(key)).expect("connect"));
    ep.connection_mut(h).filter(|c| c.is_established())
}

/// What an application does on a simulated host.
pub trait App {
    /// Called once at the start and after every event or datagram: issue commands here.
    fn poll(&mut self, now: Instant, endpoint: &mut Endpoint);
    /// An event from a connection.
    fn on_event(
        &mut self,
        now: Instant,
        endpoint: &mut Endpoint,
        conn: ConnectionHandle,
        event: Event,
    );
    /// Whether the application's work is done.
    fn is_done(&self) -> bool;
    /// When the application next wants `poll` called (e.g. to send at a fixed rate).
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

/// A host running one tern endpoint and one application.
pub struct TernNode<A: App> {
    /// The protocol endpoint.
    pub endpoint: Endpoint,
    /// The application.
    pub app: A,
    addr: SocketAddr,
    buf: Vec<u8>,
    /// Buffers of received datagrams, reused for sending.
    pool: Vec<Vec<u8>>,
    started: bool,
}

impl<A: App> TernNode<A> {
    /// A node at `addr`.
    pub fn new(endpoint: Endpoint, addr: SocketAddr, app: A) -> Self {
        Self {
            endpoint,
            app,
            addr,
            buf: Vec::with_capacity(2048),
            pool: Vec::new(),
            started: false,
        }
    }

    /// The node's address changed (the scenario moved its host with
    /// [`Simulation::change_address`](crate::Simulation::change_address), or a NAT gave it a new
    /// port): what it sends leaves from `addr` from now on.
    pub fn set_addr(&mut self, addr: SocketAddr) {
        self.addr = addr;
    }

    fn pump(&mut self, now: Instant) {
        self.started = true;
        self.app.poll(now, &mut self.endpoint);
        while let Some((conn, event)) = self.endpoint.poll_event() {
            self.app.on_event(now, &mut self.endpoint, conn, event);
            self.app.poll(now, &mut self.endpoint);
        }
    }
}

impl<A: App> Node for TernNode<A> {
    fn handle(&mut self, now: Instant, mut dgram: Datagram) {
        let ecn = tern_proto::EcnCodepoint::from_bits(dgram.ecn);
        self.endpoint
            .handle_on(now, Some(dgram.dst.ip()), dgram.src, ecn, &mut dgram.data);
        // Keep the buffer for a datagram this node sends: no allocation per packet.
        if self.pool.len() < 64 {
            self.pool.push(dgram.data);
        }
        self.pump(now);
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        if !self.started {
            self.pump(now);
        }
        // The endpoint writes straight into the buffer that becomes the datagram: no copy,
        // and no allocation when there is nothing to send.
        self.buf.clear();
        let t = self.endpoint.poll_transmit(now, &mut self.buf)?;
        self.buf.truncate(t.size);
        let spare = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(2048));
        let data = std::mem::replace(&mut self.buf, spare);
        // A path opened from another of this host's addresses leaves from it (same port).
        let src = t
            .source
            .map_or(self.addr, |ip| SocketAddr::new(ip, self.addr.port()));
        Some(Datagram {
            src,
            dst: t.destination,
            data,
            ecn: t.ecn.map_or(0, |e| e.bits()),
        })
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        match (self.endpoint.poll_timeout(), self.app.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.endpoint.handle_timeout(now);
        self.pump(now);
    }

    fn is_done(&self) -> bool {
        self.app.is_done()
    }
}

/// The wall clock of every simulated endpoint at its start (2023-11-14).
pub const SIMULATED_WALL_CLOCK: std::time::Duration = std::time::Duration::from_secs(1_700_000_000);

/// Deterministic endpoint configuration from a seed.
pub fn endpoint_config(seed: u64, server: bool) -> EndpointConfig {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8] = u8::from(server);
    let mut k = s;
    k[31] = 0xaa;
    let mut cfg = EndpointConfig::new(StaticKeypair::generate(k), s);
    // Every simulated endpoint starts at the same instant with the same clock, and no
    // earlier instance exists: first flights are proven fresh by their timestamps (§7.6).
    cfg.wall_clock = Some(SIMULATED_WALL_CLOCK);
    cfg.first_flight.trust_start = true;
    // A fixed datagram size (1 452) unless a test raises `max_pmtu`: the suite's figures
    // (packet counts, loss accounting, fairness at kbit/s) are about other things, and a
    // search would make every one of them depend on it. `tests/pmtu.rs` runs the default
    // search (`ConnectionConfig::default().max_pmtu`, 8 972) on its own.
    cfg.connection.max_pmtu = cfg.connection.max_datagram_size;
    if server {
        cfg.server()
    } else {
        cfg
    }
}

/// A client that opens one connection and sends `sizes[i]` bytes on flow i.
pub struct BulkSender {
    server: SocketAddr,
    server_key: Option<PublicKey>,
    sizes: Vec<u64>,
    conn: Option<ConnectionHandle>,
    flows: Vec<(FlowId, u64, bool)>,
    /// When the connection was established.
    pub connected_at: Option<Instant>,
    /// Every flow was acknowledged completely.
    pub finished: usize,
    /// The connection ended with this error.
    pub error: Option<tern_proto::ConnectionError>,
    /// Close the connection once every flow is acknowledged.
    pub close_when_done: bool,
    closed: bool,
    /// Messages to send once connected: (size ≥ 8, options). Message i carries i in its
    /// first 8 bytes and the payload pattern of "flow" 1000 + i after that.
    pub messages: Vec<(usize, tern_proto::MessageOptions)>,
    messages_sent: bool,
    /// Connect no earlier than this (a flow that joins a running competition).
    pub start_at: Option<Instant>,
    /// The expected rate (bytes/s) declared to explicit-rate routers (F12), set on connect.
    pub expected_rate: Option<u64>,
}

impl BulkSender {
    /// Sends `sizes` (one flow each) to `server`.
    pub fn new(server: SocketAddr, server_key: Option<PublicKey>, sizes: Vec<u64>) -> Self {
        Self {
            server,
            server_key,
            sizes,
            conn: None,
            flows: Vec::new(),
            connected_at: None,
            finished: 0,
            error: None,
            close_when_done: false,
            closed: false,
            messages: Vec::new(),
            messages_sent: false,
            start_at: None,
            expected_rate: None,
        }
    }
}

impl App for BulkSender {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let handle = match self.conn {
            Some(h) => h,
            None if self.start_at.is_some_and(|t| now < t) => return,
            None => {
                let h = ep
                    .connect(now, self.server, self.server_key)
                    .expect("connect");
                if let (Some(rate), Some(conn)) = (self.expected_rate, ep.connection_mut(h)) {
                    conn.set_expected_rate(Some(rate));
                }
                self.conn = Some(h);
                h
            }
        };
        let Some(conn) = ep.connection_mut(handle) else {
            return;
        };
        if conn.is_closed() {
            // No more writes: the Closed event said why (`error`).
            return;
        }
        if self.flows.len() < self.sizes.len() && (conn.is_established() || self.flows.is_empty()) {
            while self.flows.len() < self.sizes.len() {
                match conn.open_flow(Dir::Uni) {
                    Ok(id) => self.flows.push((id, 0, false)),
                    Err(_) => break,
                }
            }
        }
        for (i, (id, sent, finished)) in self.flows.iter_mut().enumerate() {
            let size = self.sizes[i];
            while *sent < size {
                let max = ((size - *sent) as usize).min(64 * 1024);
                let chunk = payload_slice(i as u64, *sent, max);
                match conn.write_bytes(*id, chunk) {
                    Ok(k) => *sent += k as u64,
                    Err(WriteError::Blocked) => break,
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            if *sent == size && !*finished {
                conn.finish(*id).expect("finish");
                *finished = true;
            }
        }
        if !self.messages_sent && conn.is_established() {
            self.messages_sent = true;
            for (i, (size, opts)) in self.messages.iter().enumerate() {
                conn.send_message(now, message_payload(i as u64, *size), *opts)
                    .expect("message within the peer's limits");
            }
        }
        if self.close_when_done
            && !self.closed
            && self.finished == self.sizes.len()
            && self.messages_sent
            && conn.outstanding_messages() == 0
        {
            self.closed = true;
            conn.close(now, 0, b"done");
        }
    }

    fn on_event(&mut self, now: Instant, _: &mut Endpoint, _: ConnectionHandle, event: Event) {
        match event {
            Event::Connected => self.connected_at = Some(now),
            Event::FlowFinished(_) => self.finished += 1,
            Event::Closed(tern_proto::ConnectionError::LocallyClosed { .. }) => {}
            Event::Closed(e) => self.error = Some(e),
            _ => {}
        }
    }

    fn is_done(&self) -> bool {
        self.error.is_some() || self.finished == self.sizes.len()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.start_at.filter(|_| self.conn.is_none())
    }
}

/// The payload of test message `index`: its index, then a pattern.
pub fn message_payload(index: u64, size: usize) -> Bytes {
    let mut v = Vec::with_capacity(size.max(8));
    v.extend_from_slice(&index.to_be_bytes());
    let rest = size.saturating_sub(8);
    let mut off = 0;
    while v.len() < 8 + rest {
        let chunk = payload_slice(1000 + index, off, 8 + rest - v.len());
        off += chunk.len() as u64;
        v.extend_from_slice(&chunk);
    }
    Bytes::from(v)
}

/// Per-flow progress seen by the receiver.
#[derive(Debug, Clone, Default)]
pub struct FlowProgress {
    /// Bytes read in order and verified.
    pub received: u64,
    /// When FIN was read.
    pub finished_at: Option<Instant>,
    /// When the first byte was read.
    pub first_byte_at: Option<Instant>,
}

/// A server that reads every flow, verifies each byte and records progress.
pub struct VerifyingReceiver {
    /// Expected flow count (done when all are finished).
    pub expected_flows: usize,
    /// Progress per flow index.
    pub flows: HashMap<u64, FlowProgress>,
    /// Bytes delivered over time: (time, cumulative bytes), one sample per read.
    pub timeline: Vec<(Instant, u64)>,
    /// Peak bytes held in the connection's receive buffers.
    pub peak_buffered: u64,
    /// The first byte that did not match, if any: (flow, offset).
    pub corrupt: Option<(u64, u64)>,
    /// Connections accepted.
    pub accepted: Vec<ConnectionHandle>,
    /// Record the timeline (costs memory on long runs).
    pub record_timeline: bool,
    /// Messages received whole: index → times received (must be 1).
    pub messages: HashMap<u64, u32>,
    /// Messages reported expired on this side.
    pub messages_expired: usize,
    /// A message whose content was wrong.
    pub bad_message: Option<u64>,
    /// Messages expected (done when all are received or expired).
    pub expected_messages: usize,
    total: u64,
}

impl VerifyingReceiver {
    /// Expects `flows` flows.
    pub fn new(flows: usize) -> Self {
        Self {
            expected_flows: flows,
            flows: HashMap::new(),
            timeline: Vec::new(),
            peak_buffered: 0,
            corrupt: None,
            accepted: Vec::new(),
            record_timeline: false,
            messages: HashMap::new(),
            messages_expired: 0,
            bad_message: None,
            expected_messages: 0,
            total: 0,
        }
    }

    /// Bytes delivered in total.
    pub fn total(&self) -> u64 {
        self.total
    }

    fn drain(&mut self, now: Instant, ep: &mut Endpoint, handle: ConnectionHandle) {
        let Some(conn) = ep.connection_mut(handle) else {
            return;
        };
        while let Some(m) = conn.recv_message() {
            let index = m
                .data
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or(u64::MAX);
            if index == u64::MAX || m.data != message_payload(index, m.data.len()) {
                self.bad_message.get_or_insert(index);
            }
            *self.messages.entry(index).or_default() += 1;
        }
        while let Some(id) = conn.accept_flow(Dir::Uni) {
            self.flows.entry(id.index()).or_default();
        }
        while let Some(id) = conn.accept_flow(Dir::Bi) {
            self.flows.entry(id.index()).or_default();
        }
        self.peak_buffered = self.peak_buffered.max(conn.recv_buffered());
        for (&index, p) in self.flows.iter_mut() {
            if p.finished_at.is_some() {
                continue;
            }
            let id = FlowId::from_parts(tern_proto::Side::Client, Dir::Uni, index);
            loop {
                match conn.read_chunk(id, usize::MAX) {
                    Ok(Some(chunk)) => {
                        let n = chunk.len();
                        p.first_byte_at.get_or_insert(now);
                        if let Err(at) = check_payload(index, p.received, &chunk) {
                            self.corrupt.get_or_insert((index, at));
                        }
                        p.received += n as u64;
                        self.total += n as u64;
                        if self.record_timeline {
                            self.timeline.push((now, self.total));
                        }
                    }
                    Ok(None) => {
                        p.finished_at = Some(now);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// Event-driven, as a real application: a connection is read when accepted and then on each
/// `FlowOpened`, `FlowReadable` and `MessageReceived` (edge-triggered, so a missed event
/// would stall the run, which the tests would see).
impl App for VerifyingReceiver {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        while let Some(h) = ep.accept() {
            self.accepted.push(h);
            self.drain(now, ep, h);
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, conn: ConnectionHandle, event: Event) {
        match event {
            Event::FlowReadable(_) | Event::FlowOpened { .. } | Event::MessageReceived => {
                self.drain(now, ep, conn)
            }
            Event::MessageExpired {
                by_sender: false, ..
            } => self.messages_expired += 1,
            _ => {}
        }
    }

    fn is_done(&self) -> bool {
        self.flows
            .values()
            .filter(|p| p.finished_at.is_some())
            .count()
            >= self.expected_flows
            && self.messages.len() + self.messages_expired >= self.expected_messages
    }
}

/// Goodput in bit/s between two instants from a receiver timeline.
pub fn goodput_between(timeline: &[(Instant, u64)], from: Instant, to: Instant) -> f64 {
    let at = |t: Instant| {
        let i = timeline.partition_point(|(x, _)| *x <= t);
        if i == 0 {
            0
        } else {
            timeline[i - 1].1
        }
    };
    let secs = to.saturating_duration_since(from).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    (at(to) - at(from)) as f64 * 8.0 / secs
}

/// A server that sends `size` bytes on one unidirectional flow to the first client once the
/// connection is handed to it (a download; the flow's payload is flow 0's).
pub struct FlowServer {
    size: u64,
    sent: u64,
    conn: Option<ConnectionHandle>,
    flow: Option<FlowId>,
}

impl FlowServer {
    /// A server that sends `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            sent: 0,
            conn: None,
            flow: None,
        }
    }
}

impl App for FlowServer {
    fn poll(&mut self, _: Instant, ep: &mut Endpoint) {
        if let Some(h) = ep.accept() {
            self.conn.get_or_insert(h);
        }
        let Some(conn) = self.conn.and_then(|h| ep.connection_mut(h)) else {
            return;
        };
        let id = match self.flow {
            Some(id) => id,
            None => match conn.open_flow(Dir::Uni) {
                Ok(id) => *self.flow.insert(id),
                Err(_) => return,
            },
        };
        while self.sent < self.size {
            let max = ((self.size - self.sent) as usize).min(64 * 1024);
            match conn.write_bytes(id, payload_slice(0, self.sent, max)) {
                Ok(n) => self.sent += n as u64,
                Err(_) => return,
            }
        }
        let _ = conn.finish(id);
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, _: ConnectionHandle, _: Event) {
        self.poll(now, ep);
    }
    fn is_done(&self) -> bool {
        true
    }
}

/// A client that only receives: connects to `server`, reads the server's first
/// unidirectional flow and checks every byte.
pub struct Downloader {
    server: SocketAddr,
    server_key: Option<PublicKey>,
    conn: Option<ConnectionHandle>,
    /// Bytes read.
    pub received: u64,
    /// Offset of the first byte that was not the pattern's.
    pub corrupt: Option<u64>,
    /// When the flow's end was read.
    pub finished_at: Option<Instant>,
}

impl Downloader {
    /// A client of `server` (IK when its key is given).
    pub fn new(server: SocketAddr, server_key: Option<PublicKey>) -> Self {
        Self {
            server,
            server_key,
            conn: None,
            received: 0,
            corrupt: None,
            finished_at: None,
        }
    }
}

impl App for Downloader {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let h = *self.conn.get_or_insert_with(|| {
            ep.connect(now, self.server, self.server_key)
                .expect("connect")
        });
        let Some(conn) = ep.connection_mut(h) else {
            return;
        };
        let id = FlowId::from_parts(tern_proto::Side::Server, Dir::Uni, 0);
        let _ = conn.accept_flow(Dir::Uni);
        loop {
            match conn.read_chunk(id, usize::MAX) {
                Ok(Some(chunk)) => {
                    if let Err(at) = check_payload(0, self.received, &chunk) {
                        self.corrupt.get_or_insert(at);
                    }
                    self.received += chunk.len() as u64;
                }
                Ok(None) => {
                    self.finished_at.get_or_insert(now);
                    break;
                }
                Err(_) => break,
            }
        }
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, _: ConnectionHandle, _: Event) {
        self.poll(now, ep);
    }
    fn is_done(&self) -> bool {
        self.finished_at.is_some()
    }
}

/// Convenience: how long after `start` something happened.
pub fn since(start: Instant, t: Instant) -> Duration {
    t.saturating_duration_since(start)
}

/// The two hosts of a client–server scenario.
pub enum PairHost<C: App = BulkSender, S: App = VerifyingReceiver> {
    /// The client.
    Client(TernNode<C>),
    /// The server.
    Server(TernNode<S>),
}

impl<C: App, S: App> Node for PairHost<C, S> {
    fn handle(&mut self, now: Instant, d: Datagram) {
        match self {
            PairHost::Client(n) => n.handle(now, d),
            PairHost::Server(n) => n.handle(now, d),
        }
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Datagram> {
        match self {
            PairHost::Client(n) => n.poll_transmit(now),
            PairHost::Server(n) => n.poll_transmit(now),
        }
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        match self {
            PairHost::Client(n) => n.poll_timeout(),
            PairHost::Server(n) => n.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            PairHost::Client(n) => n.handle_timeout(now),
            PairHost::Server(n) => n.handle_timeout(now),
        }
    }
    fn is_done(&self) -> bool {
        match self {
            PairHost::Client(n) => n.is_done(),
            PairHost::Server(n) => n.is_done(),
        }
    }
}

/// A bulk transfer from a client to a server over one pair of links.
pub struct Transfer {
    /// Simulation seed (links and endpoints).
    pub seed: u64,
    /// Client → server link.
    pub uplink: crate::LinkConfig,
    /// Server → client link.
    pub downlink: crate::LinkConfig,
    /// One flow per entry, of that many bytes.
    pub sizes: Vec<u64>,
    /// Use IK (client knows the server key) rather than XX.
    pub ik: bool,
    /// Adjusts both endpoints' configuration.
    pub configure: fn(&mut EndpointConfig),
    /// Record the receiver's delivery timeline.
    pub timeline: bool,
    /// The client closes the connection once every flow is acknowledged.
    pub close: bool,
    /// Messages the client sends (see [`BulkSender::messages`]).
    pub messages: Vec<(usize, tern_proto::MessageOptions)>,
}

/// The client and server addresses of a [`Transfer`].
pub const CLIENT_ADDR: &str = "10.0.0.1:5000";
/// See [`CLIENT_ADDR`].
pub const SERVER_ADDR: &str = "10.0.0.2:4433";

impl Transfer {
    /// A transfer of `sizes` over a symmetric link.
    pub fn new(seed: u64, link: crate::LinkConfig, sizes: Vec<u64>) -> Self {
        Self {
            seed,
            uplink: link.clone(),
            downlink: link,
            sizes,
            ik: true,
            configure: |_| {},
            timeline: false,
            close: false,
            messages: Vec::new(),
        }
    }

    /// Builds the simulation.
    pub fn build(&self) -> crate::Simulation<PairHost> {
        let mut sim = crate::Simulation::new(self.seed);
        let now = sim.now();
        let c: SocketAddr = CLIENT_ADDR.parse().expect("valid address");
        let s: SocketAddr = SERVER_ADDR.parse().expect("valid address");
        let mut server_cfg = endpoint_config(self.seed, true);
        (self.configure)(&mut server_cfg);
        let mut client_cfg = endpoint_config(self.seed, false);
        (self.configure)(&mut client_cfg);
        let server_ep = Endpoint::new(server_cfg, now);
        let key = self.ik.then(|| server_ep.public_key());
        let mut sender = BulkSender::new(s, key, self.sizes.clone());
        sender.close_when_done = self.close;
        sender.messages = self.messages.clone();
        let client = TernNode::new(Endpoint::new(client_cfg, now), c, sender);
        let mut rx = VerifyingReceiver::new(self.sizes.len());
        rx.record_timeline = self.timeline;
        rx.expected_messages = self.messages.len();
        let server = TernNode::new(server_ep, s, rx);
        sim.add_host(PairHost::Client(client), &[c.ip()]);
        sim.add_host(PairHost::Server(server), &[s.ip()]);
        sim.add_link(c.ip(), s.ip(), self.uplink.clone());
        sim.add_link(s.ip(), c.ip(), self.downlink.clone());
        sim
    }
}

/// One flow of a [`SharedBottleneck`]: a bulk transfer from its own client to its own server.
#[derive(Clone, Debug)]
pub struct Competitor {
    /// Bytes to send.
    pub size: u64,
    /// Adjusts both of this pair's endpoints (e.g. its congestion controller).
    pub configure: fn(&mut EndpointConfig),
    /// When the client connects, after the start of the simulation.
    pub start: Duration,
}

/// Several bulk transfers through one bottleneck: pair i is client 10.1.0.i → server
/// 10.2.0.i; every client's datagrams cross the same `bottleneck` link (one rate, one
/// queue), and each server's acknowledgements come back over a `reverse` link of its own. The
/// servers record their delivery timelines, for goodput and fairness over time.
#[derive(Clone, Debug)]
pub struct SharedBottleneck {
    /// Simulation seed.
    pub seed: u64,
    /// The shared client → server link.
    pub bottleneck: crate::LinkConfig,
    /// Each server → client link.
    pub reverse: crate::LinkConfig,
    /// The flows.
    pub flows: Vec<Competitor>,
}

impl SharedBottleneck {
    /// The client and server addresses of pair `i`.
    pub fn addrs(i: usize) -> (SocketAddr, SocketAddr) {
        let i = u8::try_from(i + 1).expect("at most 255 flows");
        (
            SocketAddr::from(([10, 1, 0, i], 5000)),
            SocketAddr::from(([10, 2, 0, i], 4433)),
        )
    }

    /// Builds the simulation: hosts 2i (client) and 2i + 1 (server) for flow i.
    pub fn build(&self) -> crate::Simulation<PairHost> {
        let mut sim = crate::Simulation::new(self.seed);
        let now = sim.now();
        let mut bottleneck = None;
        for (i, flow) in self.flows.iter().enumerate() {
            let (c, s) = Self::addrs(i);
            let seed = self.seed.wrapping_add(i as u64 * 1000);
            let mut server_cfg = endpoint_config(seed, true);
            (flow.configure)(&mut server_cfg);
            let mut client_cfg = endpoint_config(seed, false);
            (flow.configure)(&mut client_cfg);
            let server_ep = Endpoint::new(server_cfg, now);
            let mut sender = BulkSender::new(s, Some(server_ep.public_key()), vec![flow.size]);
            sender.start_at = Some(now + flow.start);
            let mut rx = VerifyingReceiver::new(1);
            rx.record_timeline = true;
            sim.add_host(
                PairHost::Client(TernNode::new(Endpoint::new(client_cfg, now), c, sender)),
                &[c.ip()],
            );
            sim.add_host(PairHost::Server(TernNode::new(server_ep, s, rx)), &[s.ip()]);
            match bottleneck {
                None => bottleneck = Some(sim.add_link(c.ip(), s.ip(), self.bottleneck.clone())),
                Some(link) => sim.add_route(c.ip(), s.ip(), link),
            }
            sim.add_link(s.ip(), c.ip(), self.reverse.clone());
        }
        sim
    }

    /// The receiver of flow `i`.
    pub fn receiver(sim: &crate::Simulation<PairHost>, i: usize) -> &TernNode<VerifyingReceiver> {
        let host = sim.hosts().nth(2 * i + 1).expect("flow i has a server");
        match sim.node(host) {
            PairHost::Server(n) => n,
            PairHost::Client(_) => unreachable!("servers are the odd hosts"),
        }
    }

    /// The sender of flow `i`.
    pub fn sender(sim: &crate::Simulation<PairHost>, i: usize) -> &TernNode<BulkSender> {
        let host = sim.hosts().nth(2 * i).expect("flow i has a client");
        match sim.node(host) {
            PairHost::Client(n) => n,
            PairHost::Server(_) => unreachable!("clients are the even hosts"),
        }
    }
}

/// Jain's fairness index of `rates`: 1 when all are equal, 1/n when one takes everything.
pub fn jain_index(rates: &[f64]) -> f64 {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    if squares <= 0.0 {
        return 1.0;
    }
    sum * sum / (rates.len() as f64 * squares)
}

/// Accessors for the two hosts of a [`Transfer`] simulation.
pub trait PairAccess {
    /// The client's node.
    fn client(&self) -> &TernNode<BulkSender>;
    /// The server's node.
    fn server(&self) -> &TernNode<VerifyingReceiver>;
}

impl PairAccess for crate::Simulation<PairHost> {
    fn client(&self) -> &TernNode<BulkSender> {
        let ip = CLIENT_ADDR.parse::<SocketAddr>().expect("valid").ip();
        match self.owner(ip).map(|h| self.node(h)) {
            Some(PairHost::Client(n)) => n,
            _ => unreachable!("the client host is added first"),
        }
    }
    fn server(&self) -> &TernNode<VerifyingReceiver> {
        let ip = SERVER_ADDR.parse::<SocketAddr>().expect("valid").ip();
        match self.owner(ip).map(|h| self.node(h)) {
            Some(PairHost::Server(n)) => n,
            _ => unreachable!("the server host is added second"),
        }
    }
}
