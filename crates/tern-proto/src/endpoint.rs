//! The endpoint: owns many connections, routes datagrams to them by connection ID, accepts
//! new ones (with a stateless Retry under load), answers unknown packets with stateless resets
//! and never sends an unproven address more than 3× what it received (docs/PROTOCOL.md §7).
//!
//! # Driving an endpoint
//! Feed every received datagram to [`Endpoint::handle`]; then call [`Endpoint::poll_transmit`]
//! until it returns `None` and send what it writes; arm a timer for
//! [`Endpoint::poll_timeout`] and call [`Endpoint::handle_timeout`] when it fires; drain
//! [`Endpoint::poll_event`]. Application commands go through [`Endpoint::connection_mut`].
//! The endpoint never reads a clock, a socket or a global RNG.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::config::{EndpointConfig, RetryPolicy};
use crate::connection::handshake::{self, Accept};
use crate::connection::Announce;
use crate::connection::{Connection, Transmit};
use crate::crypto::{
    FirstFlightRegister, Freshness, Handshake, PublicKey, ResetKey, RetryTokenKey, RESET_TOKEN_LEN,
};
use crate::error::ConnectError;
use crate::event::Event;
use crate::recovery::EcnCodepoint;
use crate::wire::{self, ConnectionId, TransportParams};
use crate::Side;

/// Names a connection inside its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub usize);

/// Counters of what the endpoint dropped or answered without a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    /// Incoming connections handed to `accept`.
    pub accepted: u64,
    /// Datagrams that did not parse.
    pub malformed: u64,
    /// Datagrams for no known connection.
    pub unroutable: u64,
    /// Retry packets sent.
    pub retries_sent: u64,
    /// Initials with a bad or expired token.
    pub invalid_tokens: u64,
    /// Handshakes refused (authentication failed or too many connections).
    pub refused: u64,
    /// Stateless resets sent.
    pub resets_sent: u64,
    /// Stateless resets not sent because the budget (`stateless_resets_per_second`) was spent.
    pub resets_suppressed: u64,
    /// Stateless resets not sent because the connection ID names another server (routable
    /// IDs: servers sharing a reset secret answer only for their own).
    pub resets_not_ours: u64,
    /// Version negotiation packets sent.
    pub version_negotiations: u64,
    /// Initials below the 1200-byte minimum.
    pub short_initials: u64,
    /// IK first flights seen before within the replay window: dropped without state or
    /// answer (§7.6).
    pub replayed_first_flights: u64,
    /// IK first flights that could not be proven fresh (no or stale timestamp, register full,
    /// server starting): their early data waited for the client to prove it is live.
    pub unproven_first_flights: u64,
    /// Initials refused because `max_half_open` handshakes were in progress.
    pub half_open_refused: u64,
    /// Initials over their source's handshake rate (`handshakes_per_source`).
    pub rate_limited: u64,
    /// Half-open handshakes that timed out without the client proving it is live (replays,
    /// spoofed Initials, clients gone); the application never saw them.
    pub half_open_expired: u64,
}

/// A datagram the endpoint sends without a connection (Retry, reset, refusal, VN).
#[derive(Debug)]
struct Stateless {
    destination: SocketAddr,
    data: Vec<u8>,
}

/// Owns connections and routes datagrams (see the module documentation).
pub struct Endpoint {
    config: Arc<EndpointConfig>,
    epoch: Instant,
    rng: ChaCha20Rng,
    reset_key: ResetKey,
    token_key: RetryTokenKey,
    /// Boxed: a slot costs a pointer, not a whole connection, and the table grows without
    /// copying connections.
    connections: Vec<Option<Box<Connection>>>,
    /// Every connection's configuration, shared (not copied per connection).
    connection_config: Arc<crate::config::ConnectionConfig>,
    free: Vec<usize>,
    /// Routing table: our connection IDs (and clients' original DCIDs during the handshake).
    routes: HashMap<ConnectionId, usize>,
    /// Our connections' peers' stateless-reset tokens, to recognise a reset in O(1).
    reset_tokens: HashMap<[u8; RESET_TOKEN_LEN], usize>,
    /// Live connections, and how many of them are half-open (their client not yet proven
    /// live, whether or not handed out early).
    count: usize,
    hidden: usize,
    /// First flights seen recently (replay protection, §7.6).
    register: FirstFlightRegister,
    /// The wall clock at `epoch`, and when this endpoint started by it.
    wall_epoch: Option<Duration>,
    started_unix: Option<Duration>,
    /// Handshakes started per source address.
    handshake_rate: crate::limits::HandshakeRate,
    /// Stateless resets this endpoint may still send.
    reset_budget: crate::limits::TokenBucket,
    stateless: VecDeque<Stateless>,
    accepted: VecDeque<ConnectionHandle>,
    events: VecDeque<(ConnectionHandle, Event)>,
    /// Which connections have work, and their timers (polling costs the active ones only).
    schedule: crate::schedule::Schedule,
    stats: EndpointStats,
    /// The next handshake's entropy, drawn ahead by [`Endpoint::prepare_handshake`].
    next_entropy: Option<[u8; 32]>,
    /// The server this endpoint last connected to with `IK`: where its next connection
    /// most likely goes (a reconnection, a handover).
    last_server: Option<PublicKey>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("connections", &self.connection_count())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// A new endpoint. `now` fixes its epoch (retry token times are relative to it).
    pub fn new(config: EndpointConfig, now: Instant) -> Self {
        let mut rng = ChaCha20Rng::from_seed(config.rng_seed);
        let mut token_secret = [0; 32];
        rng.fill_bytes(&mut token_secret);
        let register = FirstFlightRegister::new(
            config.first_flight.window,
            config.first_flight.register_capacity,
        );
        let wall_clock = config.wall_clock;
        let (rate, burst) = config.handshakes_per_source;
        let handshake_rate = crate::limits::HandshakeRate::new(rate, burst, 1 << 16);
        let (rate, burst) = config.stateless_resets_per_second;
        let reset_budget = crate::limits::TokenBucket::new(rate, burst);
        Self {
            reset_key: ResetKey::new(&config.reset_secret),
            connection_config: Arc::new(config.connection.clone()),
            token_key: RetryTokenKey::new(&token_secret),
            config: Arc::new(config),
            epoch: now,
            rng,
            connections: Vec::new(),
            free: Vec::new(),
            routes: HashMap::new(),
            reset_tokens: HashMap::new(),
            count: 0,
            hidden: 0,
            register,
            wall_epoch: wall_clock,
            started_unix: wall_clock,
            handshake_rate,
            reset_budget,
            stateless: VecDeque::new(),
            accepted: VecDeque::new(),
            events: VecDeque::new(),
            schedule: crate::schedule::Schedule::default(),
            stats: EndpointStats::default(),
            next_entropy: None,
            last_server: None,
        }
    }

    /// Does the X25519 work of the next handshake ahead of it: makes its ephemeral key and,
    /// if this endpoint last connected to a server with `IK`, the key's DH with that server
    /// (a client's first message then needs no X25519 of its own). A driver calls it when it
    /// has nothing else to do, such as while a handshake message is in flight; the work is
    /// kept for the next handshake this endpoint starts or accepts. Returns whether there
    /// was work to do (at most one handshake is prepared ahead).
    ///
    /// It changes when the work is done, never the keys: the entropy is drawn from the
    /// endpoint's RNG now instead of when the handshake starts, and the handshake derives
    /// its ephemeral key from that entropy as always. A driver that never calls it (the
    /// simulator) draws the same numbers in the same order as before.
    pub fn prepare_handshake(&mut self) -> bool {
        if self.next_entropy.is_some() {
            return false;
        }
        let entropy = self.fresh_entropy();
        self.next_entropy = Some(entropy);
        crate::crypto::prepare_ephemeral(&self.config.keypair, &entropy, self.last_server.as_ref());
        true
    }

    /// A new handshake's entropy: the one drawn ahead, if any.
    fn handshake_entropy(&mut self) -> [u8; 32] {
        match self.next_entropy.take() {
            Some(entropy) => entropy,
            None => self.fresh_entropy(),
        }
    }

    /// 32 bytes from the endpoint's RNG.
    fn fresh_entropy(&mut self) -> [u8; 32] {
        let mut entropy = [0; 32];
        self.rng.fill_bytes(&mut entropy);
        entropy
    }

    /// This endpoint's identity.
    pub fn public_key(&self) -> PublicKey {
        self.config.keypair.public()
    }

    /// Endpoint-level counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// Live connections the application has: its own and those `accept` handed out.
    pub fn connection_count(&self) -> usize {
        self.count - self.hidden
    }

    /// Handshakes in progress that the application has not seen yet (server side).
    pub fn half_open_count(&self) -> usize {
        self.hidden
    }

    /// Resets the wall clock (time since the UNIX epoch) at `now`, e.g. after the system
    /// clock was stepped. See [`EndpointConfig::wall_clock`].
    pub fn set_wall_clock(&mut self, now: Instant, unix: Duration) {
        let since = now.saturating_duration_since(self.epoch);
        self.wall_epoch = Some(unix.saturating_sub(since));
        self.started_unix.get_or_insert(unix);
    }

    /// The wall clock at `now`, if the driver gave one.
    fn unix_now(&self, now: Instant) -> Option<Duration> {
        Some(self.wall_epoch? + now.saturating_duration_since(self.epoch))
    }

    /// A connection, for application commands (which may give it something to send, an
    /// event or a new timer: it is polled again).
    pub fn connection_mut(&mut self, handle: ConnectionHandle) -> Option<&mut Connection> {
        let conn = self.connections.get_mut(handle.0)?.as_mut()?;
        self.schedule.touch(handle.0);
        Some(conn)
    }

    /// One of this host's addresses changed (every connection's paths that used `old` now
    /// send from `new`; see [`Connection::local_ip_changed`]). Returns how many paths moved.
    pub fn local_ip_changed(&mut self, now: Instant, old: IpAddr, new: IpAddr) -> usize {
        let mut moved = 0;
        for (idx, conn) in self.connections.iter_mut().enumerate() {
            let Some(conn) = conn else { continue };
            let n = conn.local_ip_changed(now, old, new);
            if n > 0 {
                self.schedule.touch(idx);
                moved += n;
            }
        }
        moved
    }

    /// The handles of every connection alive on this endpoint that the application has.
    pub fn handles(&self) -> impl Iterator<Item = ConnectionHandle> + '_ {
        self.connections
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| c.announce.is_visible()))
            .map(|(i, _)| ConnectionHandle(i))
    }

    /// Whether datagrams for connection ID `dcid` go to one of this endpoint's connections
    /// (for a driver that steers datagrams between endpoints sharing a port).
    pub fn routes(&self, dcid: &[u8]) -> bool {
        ConnectionId::new(dcid).is_ok_and(|cid| self.routes.contains_key(&cid))
    }

    /// A connection, for reading state.
    pub fn connection(&self, handle: ConnectionHandle) -> Option<&Connection> {
        self.connections.get(handle.0)?.as_deref()
    }

    /// The next connection a client opened to us.
    pub fn accept(&mut self) -> Option<ConnectionHandle> {
        self.accepted.pop_front()
    }

    fn new_cid(&mut self) -> ConnectionId {
        loop {
            let mut b = [0u8; wire::DEFAULT_CID_LEN];
            self.rng.fill_bytes(&mut b);
            // A QUIC-LB ID when configured (its nonce from the same random bytes).
            let routable = self.config.routable_cids.as_ref();
            let cid = match routable.and_then(|r| r.generate(&b)) {
                Some(cid) => cid,
                None => ConnectionId::new(&b).expect("8 bytes is a valid connection ID"),
            };
            if !self.routes.contains_key(&cid) {
                return cid;
            }
        }
    }

    fn local_params(&self, cid: &ConnectionId) -> TransportParams {
        let c = &self.config.connection;
        TransportParams {
            initial_max_data: c.flows.connection_window,
            initial_max_flow_data_bidi_local: c.flows.flow_window,
            initial_max_flow_data_bidi_remote: c.flows.flow_window,
            initial_max_flow_data_uni: c.flows.flow_window,
            initial_max_flows_bidi: c.flows.max_concurrent_bidi,
            initial_max_flows_uni: c.flows.max_concurrent_uni,
            idle_timeout_ms: c.idle_timeout.as_millis() as u64,
            max_ack_delay_ms: c.max_ack_delay.as_millis() as u64,
            max_datagram_size: u64::from(c.max_recv_datagram_size),
            stateless_reset_token: Some(self.reset_key.token(cid)),
            // A message and its overhead must fit in half the connection window, or it could
            // wait for credit for good (§10.2).
            max_message_size: c
                .max_message_size
                .min(crate::message::max_message_for_window(
                    c.flows.connection_window,
                )),
            max_datagram_frame_size: c.max_datagram_size_in,
            ..TransportParams::default()
        }
    }

    /// Gives a new connection its own generator for path challenges.
    fn seed(&mut self, conn: &mut Connection) {
        let mut seed = [0u8; 32];
        self.rng.fill_bytes(&mut seed);
        conn.path_seed = seed;
        conn.path_rng = None;
    }

    fn insert(&mut self, mut conn: Box<Connection>) -> ConnectionHandle {
        self.seed(&mut conn);
        self.count += 1;
        if conn.announce != Announce::Announced {
            self.hidden += 1;
        }
        // An IK server has the client's reset token from message 1 already.
        let token = conn.peer_reset_token;
        let idx = match self.free.pop() {
            Some(i) => {
                self.connections[i] = Some(conn);
                i
            }
            None => {
                self.connections.push(Some(conn));
                self.connections.len() - 1
            }
        };
        self.schedule.occupy(idx);
        if let Some(token) = token {
            // The first connection with a token keeps it: a replayed IK message 1 carries the
            // live connection's token, and its half-open copy must not take the route over
            // (and take it away when it expires).
            self.reset_tokens.entry(token).or_insert(idx);
        }
        ConnectionHandle(idx)
    }

    /// Starts a connection to `remote`. With the server's key the handshake is `IK` (1 RTT,
    /// data in the first flight); without it, `XX` (the server's key is learned, see
    /// `Connection::peer_key`).
    pub fn connect(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        server_key: Option<PublicKey>,
    ) -> Result<ConnectionHandle, ConnectError> {
        if self.count >= self.config.max_connections {
            return Err(ConnectError::TooManyConnections);
        }
        let local_cid = self.new_cid();
        let odcid = self.new_cid();
        let entropy = self.handshake_entropy();
        let prologue = handshake::prologue(&odcid, &local_cid);
        let noise = Handshake::initiator(
            &self.config.keypair,
            server_key.as_ref(),
            &prologue,
            entropy,
        )?;
        if server_key.is_some() {
            self.last_server = server_key;
        }
        let mut params = self.local_params(&local_cid);
        // The server's replay check of our first flight (§7.6); never 0, which means none.
        params.first_flight_time_us = self
            .unix_now(now)
            .map_or(0, |t| (t.as_micros() as u64).max(1));
        let config = self.connection_config.clone();
        let conn = Connection::new(
            Side::Client,
            now,
            config,
            local_cid,
            odcid,
            odcid,
            remote,
            params,
            noise,
        );
        let handle = self.insert(Box::new(conn));
        self.routes.insert(local_cid, handle.0);
        Ok(handle)
    }

    /// Handles one received datagram and the ECN codepoint of its IP header (`None` when
    /// Not-ECT or unknown). `data` is used as scratch space (decrypted in place). For a host
    /// with one address; see [`handle_on`](Self::handle_on) for several.
    pub fn handle(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        ecn: Option<EcnCodepoint>,
        data: &mut [u8],
    ) {
        self.handle_on(now, None, remote, ecn, data);
    }

    /// Handles one received datagram that was sent to our address `local` (the destination
    /// IP of the datagram, when the socket reports it): a multipath connection tells its
    /// paths apart by (local, remote) pair and sends each path's datagrams from its local
    /// address ([`Transmit::source`](crate::Transmit::source)).
    pub fn handle_on(
        &mut self,
        now: Instant,
        local: Option<std::net::IpAddr>,
        remote: SocketAddr,
        ecn: Option<EcnCodepoint>,
        data: &mut [u8],
    ) {
        let Some(&first) = data.first() else {
            self.stats.malformed += 1;
            return;
        };
        if first & 0x80 == 0 {
            self.handle_short(now, local, remote, ecn, data);
        } else {
            self.handle_long(now, local, remote, data);
        }
    }

    fn handle_short(
        &mut self,
        now: Instant,
        local: Option<std::net::IpAddr>,
        remote: SocketAddr,
        ecn: Option<EcnCodepoint>,
        data: &mut [u8],
    ) {
        let cid_len = wire::DEFAULT_CID_LEN;
        let Some(cid) = data
            .get(1..1 + cid_len)
            .and_then(|b| ConnectionId::new(b).ok())
        else {
            self.stats.malformed += 1;
            return;
        };
        match self.routes.get(&cid) {
            Some(&idx) => {
                if let Some(conn) = self.connections[idx].as_mut() {
                    conn.handle_short(now, remote, local, ecn, data);
                    self.schedule.touch(idx);
                }
                self.announce_if_ready(idx);
            }
            None => {
                if self.detect_stateless_reset(data) {
                    return;
                }
                self.stats.unroutable += 1;
                self.send_stateless_reset(now, remote, &cid, data.len());
            }
        }
    }

    /// A datagram for no known connection may be a stateless reset from a peer that lost its
    /// state: its last 16 bytes are then the reset token that peer gave us.
    /// Looked up by token, so that a flood of unroutable datagrams costs O(1) each (the hash
    /// map's keys are randomised; the final comparison is constant-time).
    fn detect_stateless_reset(&mut self, data: &[u8]) -> bool {
        if data.len() < wire::STATELESS_RESET_MIN_LEN {
            return false;
        }
        let Some(token) = data
            .get(data.len() - RESET_TOKEN_LEN..)
            .and_then(|t| <[u8; RESET_TOKEN_LEN]>::try_from(t).ok())
        else {
            return false;
        };
        let Some(&idx) = self.reset_tokens.get(&token) else {
            return false;
        };
        match self.connections[idx].as_mut() {
            Some(conn)
                if conn
                    .peer_reset_token
                    .is_some_and(|t| wire::is_stateless_reset(data, &t))
                    && !conn.is_drained() =>
            {
                conn.enter_drained(crate::error::ConnectionError::Reset);
                self.schedule.touch(idx);
                true
            }
            _ => false,
        }
    }

    /// A stateless reset tells a peer whose connection we no longer have to stop at once. It
    /// is shorter than what triggered it, so two endpoints cannot loop, and never sent in
    /// answer to anything too short to be a real packet.
    fn send_stateless_reset(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        cid: &ConnectionId,
        len: usize,
    ) {
        // Any packet of ours is longer than the shortest reset, so every one gets an answer,
        // and a reset (one byte shorter than its trigger) can never trigger another forever.
        const MIN_TRIGGER: usize = wire::STATELESS_RESET_MIN_LEN + 1;
        if len < MIN_TRIGGER || self.stateless.len() > 64 {
            return;
        }
        // Servers that share a reset secret (one per cluster, §14.3) must not answer for each
        // other: a connection ID live on another server would get its valid token back from
        // us, and with it anyone could reset that connection. With routable IDs, only our own
        // server ID is answered for.
        if let Some(r) = &self.config.routable_cids {
            if r.config().server_id(cid.as_bytes()).as_deref() != Some(r.server_id()) {
                self.stats.resets_not_ours += 1;
                return;
            }
        }
        if !self.reset_budget.take(now) {
            // A flood, or two stateless ends bouncing resets: answer no more than the budget.
            self.stats.resets_suppressed += 1;
            return;
        }
        let size = (len - 1).min(43);
        let mut unpredictable = [0u8; 43];
        self.rng.fill_bytes(&mut unpredictable);
        let mut data = Vec::with_capacity(size);
        let token = self.reset_key.token(cid);
        wire::encode_stateless_reset(&unpredictable[..size - 16], &token, &mut data);
        self.stats.resets_sent += 1;
        self.stateless.push_back(Stateless {
            destination: remote,
            data,
        });
    }

    fn handle_long(
        &mut self,
        now: Instant,
        local: Option<std::net::IpAddr>,
        remote: SocketAddr,
        data: &mut [u8],
    ) {
        let len = data.len();
        let packet = match wire::LongPacket::decode(data) {
            Ok(p) => p,
            Err(wire::DecodeError::UnsupportedVersion(_)) => {
                self.send_version_negotiation(remote, data);
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        let padding =
            packet.ty == wire::LongType::Initial && packet.payload == [handshake::PATTERN_PADDING];
        if padding {
            // A client's first-flight padding (§4.3): it raises the anti-amplification budget
            // of the handshake it belongs to, from that handshake's address only, and never
            // creates, moves or replaces a connection.
            match self.routes.get(&packet.dcid) {
                Some(&idx) => {
                    if let Some(conn) = self.connections[idx].as_mut() {
                        conn.stats.datagrams_received += 1;
                        conn.stats.bytes_received += len as u64;
                        if conn.paths[0].remote == remote && !conn.paths[0].validated {
                            conn.paths[0].bytes_received += len as u64;
                            conn.handshake_train_asked = true;
                            self.schedule.touch(idx);
                        }
                    }
                }
                None => self.stats.unroutable += 1,
            }
            return;
        }
        if let Some(&idx) = self.routes.get(&packet.dcid) {
            if self.is_damaged_first_message(idx, &packet) {
                // XX's first message is not authenticated: if the copy we built the
                // connection from was damaged, the client can never read our reply. A
                // retransmission that differs from it replaces the half-open connection.
                self.reaccept(now, remote, idx, &packet, len);
                return;
            }
            if packet.ty == wire::LongType::Handshake
                && self.connections[idx]
                    .as_ref()
                    .is_some_and(|c| c.awaiting_client_finish())
                && !self.third_message_allowed(now, idx, remote, &packet)
            {
                return;
            }
            if let Some(conn) = self.connections[idx].as_mut() {
                self.schedule.touch(idx);
                if packet.ty == wire::LongType::Initial {
                    // The client moved before it heard our answer: answer where it is now.
                    conn.on_initial_from(now, remote);
                }
                conn.stats.datagrams_received += 1;
                conn.stats.bytes_received += len as u64;
                // Bytes from the handshake path's peer raise its anti-amplification budget;
                // a replayed Initial from elsewhere must not raise it for an address the path
                // moved to and that is not validated (found by fuzz endpoint_handshake).
                if conn.paths[0].remote == remote {
                    conn.paths[0].bytes_received += len as u64;
                }
                if conn.paths[0].local.is_none() {
                    // The handshake's path: our address on it, for opening the others.
                    conn.paths[0].local = local;
                }
                if let Err(code) = conn.handle_long(now, &packet) {
                    conn.fail(now, code, "bad handshake message");
                }
                if let Some(token) = conn.peer_reset_token {
                    self.reset_tokens.entry(token).or_insert(idx);
                }
            }
            self.announce_if_ready(idx);
            return;
        }
        if packet.ty != wire::LongType::Initial || !self.config.server {
            self.stats.unroutable += 1;
            return;
        }
        if len < wire::MIN_INITIAL_DATAGRAM_SIZE {
            // Too small to answer without amplifying.
            self.stats.short_initials += 1;
            return;
        }
        // Address validation: a Retry under load, before any state is kept.
        let mut validated = false;
        if !packet.token.is_empty() {
            let age = now.saturating_duration_since(self.epoch);
            match self
                .token_key
                .open(packet.token, remote, age, self.config.retry_token_lifetime)
            {
                Some(odcid) if odcid == packet.dcid => validated = true,
                // Expired, forged or damaged: treat the Initial as if it had no token.
                _ => self.stats.invalid_tokens += 1,
            }
        }
        if !validated && self.retry_required() {
            self.send_retry(now, remote, &packet);
            return;
        }
        if !self.handshake_rate.allow(now, remote.ip()) {
            // One source asks for too many handshakes: make it prove its address first (a
            // spoofer cannot), and refuse it once it has.
            self.stats.rate_limited += 1;
            if validated {
                self.refuse(remote, &packet, handshake::REFUSE_BUSY);
            } else {
                self.send_retry(now, remote, &packet);
            }
            return;
        }
        if self.count >= self.config.max_connections {
            self.refuse(remote, &packet, handshake::REFUSE_BUSY);
            return;
        }
        if self.hidden >= self.config.max_half_open {
            self.stats.half_open_refused += 1;
            self.refuse(remote, &packet, handshake::REFUSE_BUSY);
            return;
        }
        let local_cid = self.new_cid();
        let entropy = self.handshake_entropy();
        let params = self.local_params(&local_cid);
        let config = self.connection_config.clone();
        match handshake::accept(
            now,
            config,
            &self.config.keypair,
            entropy,
            local_cid,
            params,
            remote,
            &packet,
            len,
            validated,
        ) {
            Accept::Connection(conn) => {
                let mut conn = conn;
                if conn.first_flight_is_ik() {
                    match self.judge_first_flight(now, &conn) {
                        // Not a replay; its client may still be a spoofed source, so only
                        // with `early_accept` does the application get it before the proof.
                        Freshness::Fresh if self.config.early_accept => conn.announce_early(now),
                        Freshness::Fresh => {}
                        // Seen already: no state, no answer, nothing delivered again.
                        Freshness::Replayed => {
                            self.stats.replayed_first_flights += 1;
                            return;
                        }
                        Freshness::Unproven(_) => self.stats.unproven_first_flights += 1,
                    }
                }
                let odcid = conn.original_dcid;
                let early = conn.announce == Announce::Early;
                let handle = self.insert(conn);
                self.routes.insert(local_cid, handle.0);
                // Duplicate Initials reach the new connection until it is drained.
                self.routes.insert(odcid, handle.0);
                if early {
                    self.accepted.push_back(handle);
                    self.stats.accepted += 1;
                }
            }
            Accept::Refuse(reason) => self.refuse(remote, &packet, reason),
            Accept::Drop => self.stats.malformed += 1,
        }
    }

    /// Whether an authenticated IK first flight may deliver its early data now (§7.6).
    fn judge_first_flight(&mut self, now: Instant, conn: &Connection) -> Freshness {
        let timestamp = conn
            .peer_params
            .as_ref()
            .map(|p| p.first_flight_time_us)
            .filter(|&t| t > 0)
            .map(Duration::from_micros);
        let clock = self.unix_now(now).zip(self.started_unix);
        let trust_start = self.config.first_flight.trust_start;
        let ephemeral = conn.first_flight_ephemeral();
        match &self.config.first_flight.shared_register {
            // A poisoned lock still holds a consistent register (each check is one insert).
            Some(shared) => shared.lock().unwrap_or_else(|p| p.into_inner()).check(
                now,
                ephemeral,
                timestamp,
                clock,
                trust_start,
            ),
            None => self
                .register
                .check(now, ephemeral, timestamp, clock, trust_start),
        }
    }

    /// Hands a server connection to `accept` once it is proven, and stops counting it as
    /// half-open (see [`Announce`]).
    fn announce_if_ready(&mut self, idx: usize) {
        let Some(conn) = self.connections.get_mut(idx).and_then(|c| c.as_mut()) else {
            return;
        };
        match conn.announce {
            Announce::Ready => {
                conn.announce = Announce::Announced;
                self.hidden -= 1;
                self.accepted.push_back(ConnectionHandle(idx));
                self.stats.accepted += 1;
            }
            Announce::ProvenEarly => {
                conn.announce = Announce::Announced;
                self.hidden -= 1;
            }
            _ => {}
        }
    }

    /// Whether `packet` is another copy of the first message of the half-open XX connection
    /// `idx` that differs from the one it was built from. Only XX (IK's first message is
    /// authenticated and judged for replay, §7.8), and only under the client's own DCID (the
    /// server's CID, known from our answer, would leave the client's DCID routed to the
    /// slot for good, §7.4).
    fn is_damaged_first_message(&self, idx: usize, packet: &wire::LongPacket<'_>) -> bool {
        packet.ty == wire::LongType::Initial
            && packet.payload.first() == Some(&handshake::PATTERN_XX)
            && self.connections[idx].as_ref().is_some_and(|c| {
                c.awaiting_client_finish()
                    && !c.first_flight_is_ik()
                    && packet.dcid == c.original_dcid
                    && (c.initial_payload != packet.payload || c.remote_cid != packet.scid)
            })
    }

    /// Whether a Handshake packet for the half-open connection `idx` (an XX third message)
    /// may be read. Reading one that fails costs a rebuild of the Noise state (three X25519
    /// operations), so it must name the server's own CID (which only the client and whoever
    /// sees its packets know) and is charged to the source's handshake budget, as an Initial
    /// is: a forger is held to the budget, and a genuine message that finds it spent is
    /// dropped and comes again with the client's retransmission.
    fn third_message_allowed(
        &mut self,
        now: Instant,
        idx: usize,
        remote: SocketAddr,
        packet: &wire::LongPacket<'_>,
    ) -> bool {
        let ours = self.connections[idx]
            .as_ref()
            .is_some_and(|c| c.local_cid == packet.dcid);
        if !ours {
            self.stats.unroutable += 1;
            return false;
        }
        if !self.handshake_rate.allow(now, remote.ip()) {
            self.stats.rate_limited += 1;
            return false;
        }
        true
    }

    fn reaccept(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        idx: usize,
        packet: &wire::LongPacket<'_>,
        len: usize,
    ) {
        let Some(old) = self.connections[idx].as_ref() else {
            return;
        };
        // A replacement first message is held to a first message's rules: the minimum size
        // (so a short copy cannot draw a larger answer to a spoofed source), and an address
        // proven earlier counts only if the copy comes from that same address.
        if len < wire::MIN_INITIAL_DATAGRAM_SIZE {
            self.stats.short_initials += 1;
            return;
        }
        let validated = old.paths[0].validated && old.paths[0].remote == remote;
        let local_cid = old.local_cid;
        // Each rebuild is a handshake's Noise work: charged to the source like a new one.
        if !self.handshake_rate.allow(now, remote.ip()) {
            self.stats.rate_limited += 1;
            return;
        }
        let entropy = self.handshake_entropy();
        let params = self.local_params(&local_cid);
        let config = self.connection_config.clone();
        if let Accept::Connection(conn) = handshake::accept(
            now,
            config,
            &self.config.keypair,
            entropy,
            local_cid,
            params,
            remote,
            packet,
            len,
            validated,
        ) {
            let mut conn = conn;
            self.seed(&mut conn);
            self.connections[idx] = Some(conn);
            self.schedule.occupy(idx);
        }
    }

    fn retry_required(&self) -> bool {
        match self.config.retry {
            RetryPolicy::Never => false,
            RetryPolicy::Always => true,
            RetryPolicy::AboveHandshakes(n) => self.hidden >= n,
        }
    }

    fn send_retry(&mut self, now: Instant, remote: SocketAddr, packet: &wire::LongPacket<'_>) {
        let mut nonce = [0u8; 12];
        self.rng.fill(&mut nonce);
        let age = now.saturating_duration_since(self.epoch);
        let token = self.token_key.seal(nonce, age, remote, &packet.dcid);
        let scid = self.new_cid();
        let data =
            handshake::long_packet(wire::LongType::Retry, &packet.scid, &scid, &token, &[], 0);
        self.stats.retries_sent += 1;
        self.stateless.push_back(Stateless {
            destination: remote,
            data,
        });
    }

    fn refuse(&mut self, remote: SocketAddr, packet: &wire::LongPacket<'_>, reason: u8) {
        self.stats.refused += 1;
        let data = handshake::long_packet(
            wire::LongType::Handshake,
            &packet.scid,
            &packet.dcid,
            &[],
            &[reason],
            0,
        );
        self.stateless.push_back(Stateless {
            destination: remote,
            data,
        });
    }

    fn send_version_negotiation(&mut self, remote: SocketAddr, data: &[u8]) {
        if data.len() < wire::MIN_INITIAL_DATAGRAM_SIZE || !self.config.server {
            return;
        }
        let Ok(inv) = wire::LongHeaderInvariants::decode(data) else {
            return;
        };
        let mut out = Vec::new();
        wire::VersionNegotiation::encode_reply(&inv, wire::SUPPORTED_VERSIONS, &mut out);
        self.stats.version_negotiations += 1;
        self.stateless.push_back(Stateless {
            destination: remote,
            data: out,
        });
    }

    /// Appends the next datagram to send to `buf` (one whole datagram, or nothing: the bytes
    /// already in `buf` are left alone, so a caller can build a GSO batch in it). `None`
    /// means nothing until a datagram arrives, a timer expires (`poll_timeout`, then
    /// `handle_timeout`) or the application acts through `connection_mut`: only connections
    /// touched by one of these are asked, so the cost follows the active connections, not the
    /// open ones.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(s) = self.stateless.pop_front() {
            buf.extend_from_slice(&s.data);
            return Some(Transmit {
                destination: s.destination,
                source: None,
                size: s.data.len(),
                ecn: None,
                pmtu_probe: false,
            });
        }
        // Round robin between the connections that may have something to send.
        while let Some(idx) = self.schedule.next_transmit() {
            let sent = self
                .connections
                .get_mut(idx)
                .and_then(|c| c.as_mut())
                .and_then(|conn| conn.poll_transmit(now, buf));
            match sent {
                Some(t) => {
                    self.schedule.transmitted(idx);
                    return Some(t);
                }
                None => self.schedule.transmit_idle(),
            }
        }
        None
    }

    /// Re-reads the timers of the connections touched since the last look.
    fn refresh_timers(&mut self) {
        let connections = &self.connections;
        self.schedule.refresh(|idx| {
            connections
                .get(idx)
                .and_then(|c| c.as_ref())
                .and_then(|c| c.poll_timeout())
        });
    }

    /// When `handle_timeout` must next be called.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.refresh_timers();
        self.schedule.earliest()
    }

    /// Runs expired timers (of the connections whose deadline passed: O(log n) each).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.refresh_timers();
        while let Some(idx) = self.schedule.pop_expired(now) {
            if let Some(conn) = self.connections.get_mut(idx).and_then(|c| c.as_mut()) {
                if conn.poll_timeout().is_some_and(|t| t <= now) {
                    conn.handle_timeout(now);
                }
            }
        }
    }

    /// Whether [`poll_event`](Self::poll_event) may have an event. Every connection the
    /// application or a datagram touched is a candidate until `poll_event` looks at it; this
    /// looks at up to eight of them (an application's send touches its own) and answers
    /// `true` if there are more.
    #[must_use]
    pub fn may_have_events(&self) -> bool {
        const LOOKED_AT: usize = 8;
        if !self.events.is_empty() {
            return true;
        }
        let Some(mut candidates) = self.schedule.event_candidates(LOOKED_AT) else {
            return true;
        };
        candidates.any(|idx| {
            self.connections
                .get(idx)
                .and_then(|c| c.as_ref())
                .is_some_and(|c| !c.announce.is_visible() || c.has_events())
        })
    }

    /// The next application event. A connection's last event is `Drained`, after which its
    /// handle is freed.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<(ConnectionHandle, Event)> {
        if let Some(e) = self.events.pop_front() {
            return Some(e);
        }
        while let Some(idx) = self.schedule.next_event() {
            let Some(conn) = self.connections.get_mut(idx).and_then(|c| c.as_mut()) else {
                self.schedule.events_idle();
                continue;
            };
            if !conn.announce.is_visible() {
                // Half-open: its events wait for `accept`; if it ended, nobody is told.
                if conn.is_drained() {
                    self.stats.half_open_expired += 1;
                    self.remove(idx);
                }
                self.schedule.events_idle();
                continue;
            }
            match conn.poll_event() {
                Some(event) => {
                    if event == Event::Drained && self.config.release_drained {
                        self.remove(idx);
                    }
                    return Some((ConnectionHandle(idx), event));
                }
                None => self.schedule.events_idle(),
            }
        }
        None
    }

    /// Frees a drained connection (with `release_drained` off). Does nothing to a
    /// connection that is not drained yet, so a handle is never freed under live traffic.
    pub fn release(&mut self, handle: ConnectionHandle) {
        if self
            .connections
            .get(handle.0)
            .and_then(|c| c.as_ref())
            .is_some_and(|c| c.is_drained())
        {
            self.remove(handle.0);
        }
    }

    fn remove(&mut self, idx: usize) {
        let Some(conn) = self.connections[idx].take() else {
            return;
        };
        self.schedule.vacate(idx);
        self.count -= 1;
        if conn.announce != Announce::Announced {
            self.hidden -= 1;
        }
        // A connection is routed by its own CID and, on a server, the client's original DCID.
        for cid in [conn.local_cid, conn.original_dcid] {
            if self.routes.get(&cid) == Some(&idx) {
                self.routes.remove(&cid);
            }
        }
        if let Some(token) = conn.peer_reset_token {
            if self.reset_tokens.get(&token) == Some(&idx) {
                self.reset_tokens.remove(&token);
            }
        }
        self.free.push(idx);
    }

    /// Time since the endpoint's epoch (for logs).
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.epoch)
    }
}
