//! `endpoint_handshake`: a real client and server complete an IK handshake over a perfect
//! network; then the input is a script of what happens next, so that the fuzzer reaches the
//! established connection's deeper states (flows, credit, recovery, path validation, close)
//! through packets the peers really encrypted, plus raw datagrams of its own.
//!
//! # Input format
//! A sequence of operations; each is one opcode byte (taken modulo [`OPS`]) and its argument
//! bytes. Missing bytes read as 0, so every input is a valid script.
//!
//! | op | name | arguments |
//! |----|------|-----------|
//! | 0 | [`RAW_TO_SERVER`] | `len: u16`, `len % 1501` bytes: a datagram "from the client" |
//! | 1 | [`RAW_TO_CLIENT`] | same, "from the server" |
//! | 2 | [`OPEN`] | `side: u8` (bit 0: server), `uni: u8` (bit 0) |
//! | 3 | [`WRITE`] | `side`, `flow: u8` (index into that side's writable flows), `len: u16` |
//! | 4 | [`FINISH`] | `side`, `flow` |
//! | 5 | [`RESET`] | `side`, `flow`, `code: u8` |
//! | 6 | [`STOP`] | `side`, `flow` (index into readable flows), `code: u8` |
//! | 7 | [`PUMP`] | none: both sides' pending datagrams go into the network queues |
//! | 8 | [`DELIVER`] | `dir: u8` (bit 0: server to client), `fate: u8`, `arg: u16` |
//! | 9 | [`ADVANCE`] | `ms: u8`: 0 jumps to the next timer, else `4 * ms` milliseconds |
//! | 10 | [`CLOSE`] | `side`, `code: u8` |
//! | 11 | [`EXCHANGE`] | none: pump and deliver both ways until the network is quiet |
//! | 12 | [`PATH_STATE`] | `side`, `path: u8` (ID `path % 4`), `state: u8` (0 active, 1 standby, 2 abandoned) |
//! | 13 | [`WITHDRAW`] | none: the server withdraws its second address (RemoveAddress) |
//! | 14 | [`REPLAY`] | `dir: u8` (bit 0: server to client), `index: u16`: deliver again, unchanged, datagram `index % n` of the last `n` (at most [`MAX_HISTORY`]) delivered that way |
//! | 15 | [`REPLAY_INITIAL`] | `wait: u8`, `from: u8`: `wait * 100` ms pass, then the client's first Initial datagram of the handshake reaches the server again, from the client's address (`from` bit 0 clear) or from the unproven [`CLIENT_REBOUND`] |
//!
//! Multipath: the server advertises [`SERVER_B`] and the client opens paths from
//! [`CLIENT_B`] too, so up to four paths carry the script's traffic; each datagram is
//! delivered to the address it was sent to, from the address it left.
//!
//! `DELIVER` takes the oldest queued datagram of that direction; `fate % 7` is: 0 deliver,
//! 1 drop, 2 deliver twice, 3 flip bit `arg % (8 * len)` and deliver, 4 truncate to
//! `arg % len` bytes and deliver, 5 deliver from a rebound client address (client to server
//! only; else deliver), 6 put it at the back of the queue (reordering).
//!
//! The client and the server have the same wall clock (`EndpointConfig::wall_clock`) and the
//! server trusts it from the start, so the client's first flight carries a timestamp and the
//! server records it in its first-flight register (docs/PROTOCOL.md §7.6): a replay within
//! two windows (20 s) is judged *seen*, a later one *unproven* (stale timestamp).
//!
//! After the script the network runs clean (exchanges and timers, a bounded number of
//! steps) so that retransmissions and closes play out.
//!
//! # Checks
//! - No panic.
//! - Data integrity: the harness keeps a model of every byte each side wrote on each flow
//!   (what `write` took; the bytes are [`pattern`] bytes mixed with the write's length, so
//!   two writes at one offset differ). Every byte either side reads is the byte the other
//!   side wrote at that offset, never past what it wrote. Forged datagrams cannot
//!   authenticate and real ones may be lost, repeated or reordered, so anything else is a
//!   bug.
//! - A flow read to its end (FIN) ends exactly where its writer stopped writing: it
//!   delivered exactly the written bytes.
//! - No replay: a short-header datagram that a side accepted (its authenticated packet
//!   counted on a path: `PathStats::bytes_received` grew) is never accepted again, whether
//!   it comes back as a duplicate, a [`REPLAY`] or after a rebinding.
//! - The server hands out exactly one connection by `Endpoint::accept` (the handshake's):
//!   a replayed first flight ([`REPLAY_INITIAL`]) is dropped or held half-open, never
//!   announced.
//! - Anti-amplification (as in `endpoint_recv`): until the server has a validated path to a
//!   client address, it sends that address at most 3x the bytes it received from it plus
//!   [`ALLOWANCE`](crate::recv::ALLOWANCE). The handshake's address is proven by the
//!   handshake; [`CLIENT_REBOUND`] and [`CLIENT_B`] must be validated first.
//! - Neither connection ends with a protocol or transport error, a refusal or a version
//!   mismatch: both ends are tern, and the fuzzer holds no keys, so such an end means that
//!   tern sent something tern rejects, or that an unauthenticated datagram killed a
//!   connection (`Violation`: "a forged packet must not be able to end a connection").
//! - Endpoints stop sending at one instant, and timers do not stay due after they ran.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tern_proto::{
    ConnectionError, ConnectionHandle, Dir, EcnCodepoint, Endpoint, Event, FlowId, PathState,
    ReadError,
};

use crate::recv::{ALLOWANCE, MAX_STUCK};

/// How datagrams arrive unless a fate changes it: with the mark both ends send.
const ECT0: Option<EcnCodepoint> = Some(EcnCodepoint::Ect0);
use crate::{
    client_config, drain_transmits, epoch, server_config, CLIENT, CLIENT_B, CLIENT_REBOUND, SERVER,
    SERVER_B,
};

/// Number of opcodes.
pub const OPS: u8 = 16;
/// Raw datagram to the server from the client's address.
pub const RAW_TO_SERVER: u8 = 0;
/// Raw datagram to the client from the server's address.
pub const RAW_TO_CLIENT: u8 = 1;
/// Open a flow.
pub const OPEN: u8 = 2;
/// Write pattern bytes on a flow.
pub const WRITE: u8 = 3;
/// Finish a flow.
pub const FINISH: u8 = 4;
/// Reset a flow's sending half.
pub const RESET: u8 = 5;
/// Stop a flow's receiving half.
pub const STOP: u8 = 6;
/// Move pending datagrams into the network.
pub const PUMP: u8 = 7;
/// Deliver (or mistreat) the oldest queued datagram of one direction.
pub const DELIVER: u8 = 8;
/// Let time pass.
pub const ADVANCE: u8 = 9;
/// Close a connection.
pub const CLOSE: u8 = 10;
/// Run the network clean until quiet.
pub const EXCHANGE: u8 = 11;
/// Make a path active, standby or abandoned.
pub const PATH_STATE: u8 = 12;
/// The server withdraws its second address.
pub const WITHDRAW: u8 = 13;
/// Deliver again a datagram delivered earlier.
pub const REPLAY: u8 = 14;
/// Replay the client's first Initial to the server, later.
pub const REPLAY_INITIAL: u8 = 15;

/// Fates of [`DELIVER`].
pub mod fate {
    /// Deliver it.
    pub const DELIVER: u8 = 0;
    /// Lose it.
    pub const DROP: u8 = 1;
    /// Deliver it twice.
    pub const DUPLICATE: u8 = 2;
    /// Flip one bit, then deliver.
    pub const FLIP: u8 = 3;
    /// Truncate, then deliver.
    pub const TRUNCATE: u8 = 4;
    /// Deliver from a new client address (NAT rebinding).
    pub const REBIND: u8 = 5;
    /// Requeue at the back.
    pub const REORDER: u8 = 6;
    /// Deliver it marked CE (a congested ECN router).
    pub const CE: u8 = 7;
    /// Deliver it with its ECN bits cleared (a bleaching middlebox).
    pub const BLEACH: u8 = 8;
    /// How many fates there are.
    pub const COUNT: u8 = 9;
}

/// Largest single write, in bytes.
const MAX_WRITE: usize = 16 * 1024;
/// Datagrams kept per direction; more are lost (a full router queue).
const MAX_QUEUE: usize = 512;
/// Rounds of one `EXCHANGE`.
const MAX_ROUNDS: usize = 64;
/// Timer steps after the script.
const SETTLE_STEPS: usize = 300;
/// Delivered datagrams remembered per direction for [`REPLAY`].
pub const MAX_HISTORY: usize = 256;

/// The byte a writer puts at `offset` of `flow`; readers check it.
pub fn pattern(flow: FlowId, offset: u64) -> u8 {
    let x = offset
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(flow.0.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    (x >> 56) as u8
}

/// Argument reader: missing bytes read as 0.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (b, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        b
    }
}

/// One end: its endpoint, its connection and what it wrote and read.
struct Peer {
    ep: Endpoint,
    conn: Option<ConnectionHandle>,
    /// Flows this side may write on (opened by it, or bidirectional ones it accepted).
    writable: Vec<FlowId>,
    /// Flows this side may read from (accepted ones, or bidirectional ones it opened).
    readable: Vec<FlowId>,
    /// Every byte written per flow (what `write` took), in order: the data model.
    model: HashMap<FlowId, Vec<u8>>,
    /// Next offset to read, per flow.
    read: HashMap<FlowId, u64>,
    /// Read buffer.
    buf: Vec<u8>,
    /// How the connection ended, if it did.
    closed: Option<String>,
    /// Flows read to their end, and where that end was.
    finished: HashMap<FlowId, u64>,
    name: &'static str,
}

impl Peer {
    fn new(ep: Endpoint, name: &'static str) -> Self {
        Peer {
            ep,
            conn: None,
            writable: Vec::new(),
            readable: Vec::new(),
            model: HashMap::new(),
            read: HashMap::new(),
            buf: vec![0; 16 * 1024],
            closed: None,
            finished: HashMap::new(),
            name,
        }
    }

    fn pick(list: &[FlowId], i: u8) -> Option<FlowId> {
        (!list.is_empty()).then(|| list[usize::from(i) % list.len()])
    }

    /// Drains events, accepts flows, reads everything readable and checks it against what
    /// the other side wrote (`peer_model`).
    fn service(&mut self, peer_model: &HashMap<FlowId, Vec<u8>>) {
        while let Some((h, event)) = self.ep.poll_event() {
            if Some(h) != self.conn {
                continue;
            }
            match event {
                Event::Closed(e) => {
                    check_close(self.name, &e);
                    self.closed = Some(format!("{e:?}"));
                }
                Event::Drained => self.conn = None,
                _ => {}
            }
        }
        let Some(h) = self.conn else { return };
        let Some(conn) = self.ep.connection_mut(h) else {
            return;
        };
        if let Some(e) = conn.close_reason() {
            check_close(self.name, e);
        }
        for dir in [Dir::Bi, Dir::Uni] {
            while let Some(id) = conn.accept_flow(dir) {
                self.readable.push(id);
                if dir == Dir::Bi {
                    self.writable.push(id);
                }
            }
        }
        for &id in &self.readable {
            for _ in 0..256 {
                match conn.read(id, &mut self.buf) {
                    Ok(Some(n)) => {
                        let at = self.read.entry(id).or_insert(0);
                        let written: &[u8] = peer_model.get(&id).map_or(&[], Vec::as_slice);
                        let start = *at as usize;
                        assert!(
                            start + n <= written.len(),
                            "{} read {n} bytes on flow {id:?} at offset {start}, past the {} \
                             bytes written",
                            self.name,
                            written.len()
                        );
                        if self.buf[..n] != written[start..start + n] {
                            let i = (0..n)
                                .find(|&i| self.buf[i] != written[start + i])
                                .unwrap_or(0);
                            panic!(
                                "{} read a wrong byte on flow {id:?} at offset {}: {:#04x}, \
                                 written {:#04x}",
                                self.name,
                                start + i,
                                self.buf[i],
                                written[start + i]
                            );
                        }
                        *at += n as u64;
                    }
                    Ok(None) => {
                        let end = self.read.get(&id).copied().unwrap_or(0);
                        self.finished.insert(id, end);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// Ends a connection between two tern endpoints may have while the network is hostile but
/// holds no keys.
fn check_close(who: &str, e: &ConnectionError) {
    match e {
        ConnectionError::LocallyClosed { .. }
        | ConnectionError::ApplicationClosed { .. }
        | ConnectionError::TimedOut
        | ConnectionError::Reset => {}
        other => panic!("{who}'s connection ended with {other:?}: {other}"),
    }
}

/// A datagram in flight: the local address it left from (`None`: the sender's first), where
/// it goes, its bytes.
#[derive(Clone)]
struct Dgram {
    source: Option<IpAddr>,
    to: SocketAddr,
    data: Vec<u8>,
}

/// The network between the two peers, and the time.
struct Net {
    now: Instant,
    client: Peer,
    server: Peer,
    /// Datagrams in flight, client to server and back.
    c2s: VecDeque<Dgram>,
    s2c: VecDeque<Dgram>,
    /// The client's address as the server sees it now (it changes on REBIND).
    client_seen_as: SocketAddr,
    /// Datagrams delivered, client to server (with the address they came from) and back,
    /// for [`REPLAY`]: the last [`MAX_HISTORY`] of each, and how many in all.
    history: [Vec<(SocketAddr, Dgram)>; 2],
    delivered: [usize; 2],
    /// The client's first Initial datagram, for [`REPLAY_INITIAL`].
    first_initial: Option<Dgram>,
    /// Hashes of the short-header datagrams each side (client, server) accepted.
    accepted: [HashSet<u64>; 2],
    /// Per client address: bytes the server received from it and sent to it.
    amplification: HashMap<SocketAddr, (u64, u64)>,
    /// Client addresses the server has validated (a validated path to them).
    proven: Vec<SocketAddr>,
    /// Write buffer.
    scratch: Vec<u8>,
    /// Whether the server announced the handshake's connection (`Endpoint::accept`).
    server_accepted: bool,
}

/// Which of a peer's paths' `bytes_received` add up to: it grows by the datagram's length
/// when a short-header packet is accepted (authenticated, fresh) and for nothing else.
fn bytes_accepted(peer: &Peer) -> u64 {
    peer.conn
        .and_then(|h| peer.ep.connection(h))
        .map_or(0, |c| c.path_stats().iter().map(|p| p.bytes_received).sum())
}

/// Identifies a datagram by its bytes (the same bytes are the same packet: same path, packet
/// number and keys), wherever it is sent.
fn datagram_key(d: &Dgram) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    d.data.hash(&mut h);
    h.finish()
}

/// Whether a datagram starts with a short header (one packet, to its end).
fn is_short(d: &Dgram) -> bool {
    d.data.first().is_some_and(|b| b & 0x80 == 0)
}

impl Net {
    fn pump(&mut self) {
        let now = self.now;
        let (c2s, s2c) = (&mut self.c2s, &mut self.s2c);
        drain_transmits(&mut self.client.ep, now, |t, d| {
            let to = t.destination;
            assert!(
                to == SERVER || to == SERVER_B,
                "client sent to an unknown address {to}"
            );
            if c2s.len() < MAX_QUEUE {
                c2s.push_back(Dgram {
                    source: t.source,
                    to,
                    data: d.to_vec(),
                });
            }
        });
        let client_addrs = [CLIENT, CLIENT_REBOUND, CLIENT_B];
        let amplification = &mut self.amplification;
        drain_transmits(&mut self.server.ep, now, |t, d| {
            let to = t.destination;
            assert!(client_addrs.contains(&to), "server sent to {to}");
            amplification.entry(to).or_default().1 += d.len() as u64;
            if s2c.len() < MAX_QUEUE {
                s2c.push_back(Dgram {
                    source: t.source,
                    to,
                    data: d.to_vec(),
                });
            }
        });
        self.check_amplification();
    }

    /// Until an address is validated, the server sends it at most 3x what came from it.
    /// (Validation is noted after every operation and exchange round, and before failing.)
    fn check_amplification(&mut self) {
        let over = |proven: &[SocketAddr], a: &HashMap<SocketAddr, (u64, u64)>| {
            a.iter().any(|(addr, &(received, sent))| {
                !proven.contains(addr) && sent > 3 * received + ALLOWANCE as u64
            })
        };
        if !over(&self.proven, &self.amplification) {
            return;
        }
        self.note_proven();
        for (addr, &(received, sent)) in &self.amplification {
            if self.proven.contains(addr) {
                continue;
            }
            assert!(
                sent <= 3 * received + ALLOWANCE as u64,
                "amplification: the server sent {sent} bytes to {addr}, not validated, which \
                 sent it {received}"
            );
        }
    }

    /// Notes the client addresses the server's connection has validated paths to.
    fn note_proven(&mut self) {
        let server = &self.server;
        let Some(conn) = server.conn.and_then(|h| server.ep.connection(h)) else {
            return;
        };
        for p in conn.path_stats() {
            if p.validated && !self.proven.contains(&p.remote) {
                self.proven.push(p.remote);
            }
        }
    }

    /// Remembers a delivered datagram for [`REPLAY`].
    fn remember(&mut self, dir: usize, from: SocketAddr, d: &Dgram) {
        let n = self.delivered[dir];
        self.delivered[dir] += 1;
        let history = &mut self.history[dir];
        if history.len() < MAX_HISTORY {
            history.push((from, d.clone()));
        } else {
            history[n % MAX_HISTORY] = (from, d.clone());
        }
    }

    /// Where the server sees a client datagram come from: the client's second interface, or
    /// its first as the server currently sees it (it changes on REBIND).
    fn client_from(&self, d: &Dgram) -> SocketAddr {
        match d.source {
            Some(ip) if ip == CLIENT_B.ip() => CLIENT_B,
            _ => self.client_seen_as,
        }
    }

    /// Delivers to the server. Datagrams travel ECT(0)-marked, as both ends send them, unless
    /// a fate says otherwise.
    /// Every delivery is remembered for [`REPLAY`] unless it is one (`remember`), and checked:
    /// a short-header datagram the server already accepted must not be accepted again.
    fn send_to_server(
        &mut self,
        from: SocketAddr,
        mut d: Dgram,
        ecn: Option<EcnCodepoint>,
        remember: bool,
    ) {
        self.amplification.entry(from).or_default().0 += d.data.len() as u64;
        if remember {
            self.remember(0, from, &d);
        }
        let short = is_short(&d);
        let key = datagram_key(&d);
        let before = if short {
            bytes_accepted(&self.server)
        } else {
            0
        };
        self.server
            .ep
            .handle_on(self.now, Some(d.to.ip()), from, ecn, &mut d.data);
        if short && bytes_accepted(&self.server) > before {
            assert!(
                self.accepted[1].insert(key),
                "the server accepted a datagram it had accepted before (replay) from {from}"
            );
        }
    }

    fn send_to_client(&mut self, mut d: Dgram, ecn: Option<EcnCodepoint>, remember: bool) {
        let from = SocketAddr::new(d.source.unwrap_or(SERVER.ip()), SERVER.port());
        if remember {
            self.remember(1, from, &d);
        }
        let to = if d.to == CLIENT_REBOUND { CLIENT } else { d.to };
        let short = is_short(&d);
        let key = datagram_key(&d);
        let before = if short {
            bytes_accepted(&self.client)
        } else {
            0
        };
        self.client
            .ep
            .handle_on(self.now, Some(to.ip()), from, ecn, &mut d.data);
        if short && bytes_accepted(&self.client) > before {
            assert!(
                self.accepted[0].insert(key),
                "the client accepted a datagram it had accepted before (replay) from {from}"
            );
        }
    }

    fn service(&mut self) {
        self.client.service(&self.server.model);
        self.server.service(&self.client.model);
        // The handshake's connection is the only one the server ever announces.
        while let Some(h) = self.server.ep.accept() {
            assert!(
                !self.server_accepted,
                "the server accepted a second connection {h:?} (replayed first flight?): {:?}",
                self.server.ep.stats()
            );
            self.server_accepted = true;
            self.server.conn = Some(h);
            self.server.service(&self.client.model);
        }
        // A flow read to its end (FIN) ends where its writer stopped: writes after `finish`
        // are refused, so anything else is lost or invented data.
        for (reader, writer) in [(&self.client, &self.server), (&self.server, &self.client)] {
            for (id, &end) in &reader.finished {
                let written = writer.model.get(id).map_or(0, |m| m.len() as u64);
                assert_eq!(
                    end, written,
                    "{} read flow {id:?} to its end at {end}, but {} wrote {written} bytes",
                    reader.name, writer.name
                );
            }
        }
    }

    /// Pumps and delivers both ways until nothing moves (bounded).
    fn exchange(&mut self) {
        for _ in 0..MAX_ROUNDS {
            self.pump();
            if self.c2s.is_empty() && self.s2c.is_empty() {
                return;
            }
            while let Some(d) = self.c2s.pop_front() {
                self.send_to_server(self.client_from(&d), d, ECT0, true);
            }
            while let Some(d) = self.s2c.pop_front() {
                self.send_to_client(d, ECT0, true);
            }
            self.note_proven();
            self.service();
        }
    }

    /// Moves time to `t` (never backwards) and runs both endpoints' due timers.
    fn advance_to(&mut self, t: Instant) {
        self.now = self.now.max(t);
        self.client.ep.handle_timeout(self.now);
        self.server.ep.handle_timeout(self.now);
    }

    fn next_timer(&mut self) -> Option<Instant> {
        [self.client.ep.poll_timeout(), self.server.ep.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    fn peer(&mut self, side: u8) -> &mut Peer {
        if side & 1 == 0 {
            &mut self.client
        } else {
            &mut self.server
        }
    }

    fn deliver(&mut self, to_client: bool, fate: u8, arg: u16) {
        let popped = if to_client {
            self.s2c.pop_front()
        } else {
            self.c2s.pop_front()
        };
        let Some(mut d) = popped else {
            return;
        };
        let mut from = self.client_from(&d);
        let mut ecn = ECT0;
        match fate % fate::COUNT {
            fate::DROP => return,
            fate::DUPLICATE => {
                if to_client {
                    self.send_to_client(d.clone(), ecn, true);
                } else {
                    self.send_to_server(from, d.clone(), ecn, true);
                }
            }
            fate::FLIP if !d.data.is_empty() => {
                let bit = usize::from(arg) % (8 * d.data.len());
                d.data[bit / 8] ^= 1 << (bit % 8);
            }
            fate::TRUNCATE if !d.data.is_empty() => {
                d.data.truncate(usize::from(arg) % d.data.len())
            }
            fate::REBIND if !to_client && from != CLIENT_B => {
                self.client_seen_as = if from == CLIENT {
                    CLIENT_REBOUND
                } else {
                    CLIENT
                };
                from = self.client_seen_as;
            }
            fate::REORDER => {
                if to_client {
                    self.s2c.push_back(d);
                } else {
                    self.c2s.push_back(d);
                }
                return;
            }
            fate::CE => ecn = Some(EcnCodepoint::Ce),
            fate::BLEACH => ecn = None,
            _ => {}
        }
        if to_client {
            self.send_to_client(d, ecn, true);
        } else {
            self.send_to_server(from, d, ecn, true);
        }
    }

    /// `WRITE`: `len % (MAX_WRITE + 1)` bytes on a flow; what `write` takes joins the model.
    fn write(&mut self, side: u8, flow: u8, len: u16, data: &mut Vec<u8>) {
        let peer = self.peer(side);
        let (Some(h), Some(id)) = (peer.conn, Peer::pick(&peer.writable, flow)) else {
            return;
        };
        let Some(conn) = peer.ep.connection_mut(h) else {
            return;
        };
        let model = peer.model.entry(id).or_default();
        let at = model.len() as u64;
        let salt = len as u8;
        let len = usize::from(len) % (MAX_WRITE + 1);
        data.clear();
        data.extend((0..len as u64).map(|i| pattern(id, at + i).wrapping_add(salt)));
        if let Ok(n) = conn.write(id, data) {
            assert!(n <= len, "write took {n} of {len} bytes");
            model.extend_from_slice(&data[..n]);
        }
    }

    fn step(&mut self, op: u8, input: &mut Input<'_>) {
        match op % OPS {
            RAW_TO_SERVER | RAW_TO_CLIENT => {
                let len = usize::from(input.u16()) % 1501;
                let data = input.bytes(len).to_vec();
                if op % OPS == RAW_TO_SERVER {
                    let d = Dgram {
                        source: None,
                        to: SERVER,
                        data,
                    };
                    self.send_to_server(self.client_seen_as, d, ECT0, true);
                } else {
                    let d = Dgram {
                        source: None,
                        to: CLIENT,
                        data,
                    };
                    self.send_to_client(d, ECT0, true);
                }
            }
            OPEN => {
                let (side, uni) = (input.u8(), input.u8() & 1 == 1);
                let peer = self.peer(side);
                let Some(h) = peer.conn else { return };
                let Some(conn) = peer.ep.connection_mut(h) else {
                    return;
                };
                let dir = if uni { Dir::Uni } else { Dir::Bi };
                if let Ok(id) = conn.open_flow(dir) {
                    peer.writable.push(id);
                    if !uni {
                        peer.readable.push(id);
                    }
                }
            }
            WRITE => {
                let (side, flow, len) = (input.u8(), input.u8(), input.u16());
                let mut data = std::mem::take(&mut self.scratch);
                self.write(side, flow, len, &mut data);
                self.scratch = data;
            }
            REPLAY => {
                let (dir, index) = (input.u8() & 1, input.u16());
                let history = &self.history[usize::from(dir)];
                if history.is_empty() {
                    return;
                }
                let (from, d) = history[usize::from(index) % history.len()].clone();
                if dir == 1 {
                    self.send_to_client(d, ECT0, false);
                } else {
                    self.send_to_server(from, d, ECT0, false);
                }
            }
            REPLAY_INITIAL => {
                let (wait, from) = (input.u8(), input.u8());
                let t = self.now + Duration::from_millis(100 * u64::from(wait));
                self.advance_to(t);
                self.pump();
                let from = if from & 1 == 0 {
                    CLIENT
                } else {
                    CLIENT_REBOUND
                };
                if let Some(d) = self.first_initial.clone() {
                    self.send_to_server(from, d, ECT0, false);
                }
            }
            FINISH => {
                let (side, flow) = (input.u8(), input.u8());
                let peer = self.peer(side);
                if let (Some(h), Some(id)) = (peer.conn, Peer::pick(&peer.writable, flow)) {
                    if let Some(conn) = peer.ep.connection_mut(h) {
                        let _ = conn.finish(id);
                    }
                }
            }
            RESET => {
                let (side, flow, code) = (input.u8(), input.u8(), input.u8());
                let peer = self.peer(side);
                if let (Some(h), Some(id)) = (peer.conn, Peer::pick(&peer.writable, flow)) {
                    if let Some(conn) = peer.ep.connection_mut(h) {
                        let _ = conn.reset_flow(id, u64::from(code));
                    }
                }
            }
            STOP => {
                let (side, flow, code) = (input.u8(), input.u8(), input.u8());
                let peer = self.peer(side);
                if let (Some(h), Some(id)) = (peer.conn, Peer::pick(&peer.readable, flow)) {
                    if let Some(conn) = peer.ep.connection_mut(h) {
                        match conn.stop_flow(id, u64::from(code)) {
                            Ok(()) | Err(ReadError::ClosedFlow) => {}
                            Err(e) => panic!("stop_flow on a readable flow: {e:?}"),
                        }
                    }
                }
            }
            PUMP => self.pump(),
            DELIVER => {
                let (dir, fate, arg) = (input.u8(), input.u8(), input.u16());
                self.deliver(dir & 1 == 1, fate, arg);
            }
            ADVANCE => {
                let ms = input.u8();
                let t = if ms == 0 {
                    self.next_timer().unwrap_or(self.now)
                } else {
                    self.now + Duration::from_millis(4 * u64::from(ms))
                };
                self.advance_to(t);
            }
            CLOSE => {
                let (side, code) = (input.u8(), input.u8());
                let now = self.now;
                let peer = self.peer(side);
                if let Some(conn) = peer.conn.and_then(|h| peer.ep.connection_mut(h)) {
                    conn.close(now, u64::from(code), b"fuzz");
                }
            }
            EXCHANGE => self.exchange(),
            PATH_STATE => {
                let (side, path, state) = (input.u8(), input.u8(), input.u8());
                let state = [PathState::Active, PathState::Standby, PathState::Abandoned]
                    [usize::from(state % 3)];
                let now = self.now;
                let peer = self.peer(side);
                if let Some(conn) = peer.conn.and_then(|h| peer.ep.connection_mut(h)) {
                    conn.set_path_state(now, u32::from(path % 4), state);
                }
            }
            WITHDRAW => {
                let peer = &mut self.server;
                if let Some(conn) = peer.conn.and_then(|h| peer.ep.connection_mut(h)) {
                    conn.remove_address(SERVER_B);
                }
            }
            _ => unreachable!("op % OPS"),
        }
    }
}

/// Sets up an established IK connection over a perfect network.
fn established() -> Net {
    let now = epoch();
    let mut client = Endpoint::new(client_config(), now);
    let server = Endpoint::new(server_config(), now);
    let c = client
        .connect(now, SERVER, Some(server.public_key()))
        .expect("connect");
    let mut net = Net {
        now,
        client: Peer::new(client, "client"),
        server: Peer::new(server, "server"),
        c2s: VecDeque::new(),
        s2c: VecDeque::new(),
        client_seen_as: CLIENT,
        history: [Vec::new(), Vec::new()],
        delivered: [0; 2],
        first_initial: None,
        accepted: [HashSet::new(), HashSet::new()],
        amplification: HashMap::new(),
        proven: Vec::new(),
        scratch: Vec::new(),
        server_accepted: false,
    };
    net.client.conn = Some(c);
    net.pump();
    net.first_initial = net.c2s.front().cloned();
    assert!(net.first_initial.is_some(), "the client sent its Initial");
    net.exchange();
    net.service();
    assert!(net.server_accepted, "the server accepted the client");
    for p in [&net.client, &net.server] {
        let conn =
            p.ep.connection(p.conn.expect("handle"))
                .expect("connection");
        assert!(conn.is_established(), "{} not established", p.name);
    }
    net
}

/// What a run did, for checking that seeds reach what they are meant to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Operations executed.
    pub ops: usize,
    /// Bytes written (taken by `write`), client then server.
    pub written: [u64; 2],
    /// Bytes read and checked against the pattern, client then server.
    pub read: [u64; 2],
    /// How each connection ended, if it did (`Debug` of the error), client then server.
    pub closed: [Option<String>; 2],
    /// Virtual time the run covered.
    pub elapsed: Duration,
}

/// The target.
pub fn run(data: &[u8]) {
    run_traced(data);
}

/// The target, reporting what it did.
pub fn run_traced(data: &[u8]) -> Outcome {
    let mut net = established();
    let mut input = Input(data);
    let mut ops = 0;
    while let Some((&op, rest)) = input.0.split_first() {
        input.0 = rest;
        net.step(op, &mut input);
        net.note_proven();
        net.service();
        ops += 1;
    }
    // Let it play out on a clean network.
    let mut stuck = 0;
    for _ in 0..SETTLE_STEPS {
        net.exchange();
        let Some(t) = net.next_timer() else { break };
        stuck = if t <= net.now { stuck + 1 } else { 0 };
        assert!(stuck < MAX_STUCK, "a timer stays due after handle_timeout");
        net.advance_to(t);
        net.service();
    }
    let peers = [&net.client, &net.server];
    Outcome {
        ops,
        written: peers.map(|p| p.model.values().map(|m| m.len() as u64).sum()),
        read: peers.map(|p| p.read.values().sum()),
        closed: peers.map(|p| p.closed.clone()),
        elapsed: net.now - epoch(),
    }
}
