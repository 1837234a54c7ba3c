//! Configuration of endpoints and connections. Every default is stated with its reason.

use std::sync::Arc;
use std::time::Duration;

use crate::cc::ControllerFactory;
use crate::crypto::StaticKeypair;

/// Flow and credit limits a side grants its peer.
#[derive(Debug, Clone)]
pub struct FlowConfig {
    /// Per-flow receive window in bytes. 4 MiB covers 100 Mbit/s × 320 ms.
    pub flow_window: u64,
    /// Connection receive window in bytes (all flows together).
    pub connection_window: u64,
    /// Per-flow send buffer: writes beyond this many unacknowledged bytes are refused until
    /// data is acknowledged, which bounds memory per flow.
    pub send_buffer: u64,
    /// Flows the peer may have open at once, both ways / one way.
    pub max_concurrent_bidi: u64,
    /// See `max_concurrent_bidi`.
    pub max_concurrent_uni: u64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            flow_window: 4 << 20,
            connection_window: 16 << 20,
            send_buffer: 4 << 20,
            max_concurrent_bidi: 100,
            max_concurrent_uni: 100,
        }
    }
}

/// Settings of one connection.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Flow-control limits granted to the peer.
    pub flows: FlowConfig,
    /// The congestion controller for each path (DESIGN.md F10). CUBIC with an initial window
    /// of [`DEFAULT_INITIAL_WINDOW_PACKETS`](crate::cc::DEFAULT_INITIAL_WINDOW_PACKETS) by
    /// default (`cc::Algorithm::Cubic`; why not Copa or BBR: docs/BENCHMARKS.md, `cc`).
    pub congestion: Arc<dyn ControllerFactory>,
    /// RTT assumed before the first sample (RFC 9002 uses 333 ms; the mobile edge is
    /// nearer, and a too-large value only slows the first retransmission).
    pub initial_rtt: Duration,
    /// Close the connection after this long without hearing from the peer.
    pub idle_timeout: Duration,
    /// Send a PING when nothing ack-eliciting was sent for this long (keeps NAT bindings and
    /// detects a dead peer). None: no keep-alive.
    pub keep_alive: Option<Duration>,
    /// Give up a handshake after this long.
    pub handshake_timeout: Duration,
    /// Most we delay an ACK (advertised to the peer).
    pub max_ack_delay: Duration,
    /// Acknowledge at least every this many ack-eliciting packets, until the peer asks for
    /// another number (AckFrequency).
    pub ack_frequency: u32,
    /// Most ack-eliciting packets per ACK we ask the peer for (AckFrequency, PROTOCOL.md
    /// §11.1). We ask for one ACK per eighth of the congestion window, at least 2 and at most
    /// this: at 100 Mbit/s that is a fifth of the ACKs, and so of their cost on both hosts.
    /// 2 or less never asks.
    pub max_ack_threshold: u32,
    /// Mark packets ECT(0) and react to CE marks the peer reports (PROTOCOL.md §11.5). On by
    /// default: a path that bleaches or drops marked packets is detected and sent unmarked,
    /// and receiving ECN counts does not depend on this.
    pub ecn: bool,
    /// Largest UDP payload we send once the handshake is done (IPv6 minimum-safe value on a
    /// 1500-byte Ethernet MTU; PMTU discovery will raise or lower it, DESIGN.md F14).
    pub max_datagram_size: u16,
    /// Largest UDP payload we accept (advertised: the peer never sends more, PMTU probes
    /// included). 8 972 by default, like `max_pmtu`.
    pub max_recv_datagram_size: u16,
    /// Datagram path MTU discovery (DPLPMTUD, RFC 8899; PROTOCOL.md §5.5): each validated
    /// path probes for a datagram size above `max_datagram_size`, up to `max_pmtu`, and falls
    /// back to 1 200 bytes when full-size packets stop getting through (a black hole). On by
    /// default: it starts from the negotiated size and only grows past it on proof; lost
    /// probes are neither resent nor counted as congestion.
    pub pmtu_discovery: bool,
    /// Largest datagram size (UDP payload) PMTU discovery searches for; the peer's
    /// `max_datagram_size` caps it too. 8 972 by default: a 9 000-byte jumbo frame over IPv4
    /// (loopback and veth carry it; on Ethernet the search ends within 16 bytes of 1 472, after
    /// probes that the local stack refuses or the path drops, none of them counted as
    /// congestion). 1 452 (the start size) searches nothing but still detects black holes.
    pub max_pmtu: u16,
    /// How long a completed search rests before it probes again (RFC 8899 §5.1.1's
    /// PMTU_RAISE_TIMER: 600 s).
    pub pmtu_research_interval: Duration,
    /// Largest message the peer may send us.
    pub max_message_size: u64,
    /// Largest datagram the peer may send us (0: datagrams refused).
    pub max_datagram_size_in: u64,
    /// Datagrams kept for the application (oldest dropped beyond this) and queued to send.
    pub datagram_queue: usize,
    /// Bytes of received datagrams kept for the application: beyond this the oldest are
    /// dropped (counted in `datagrams_recv_dropped`), as beyond `datagram_queue`. Datagrams
    /// have no flow control, so this and the count are all that bound what a peer can make
    /// us hold for an application that does not read them. 1 MiB: 256 datagrams of 4 KiB,
    /// or about 870 full-size ones.
    pub datagram_queue_bytes: u64,
    /// Disjoint ranges of received data held, all flows and messages together (out-of-order
    /// fragments, and message IDs finished above a gap). Credit bounds the bytes held, but
    /// each range costs map nodes whatever its size: a peer sending one-byte fragments with
    /// gaps between them could make us hold ~100 times its credit. A peer beyond this is
    /// closed with PROTOCOL_VIOLATION (PROTOCOL.md §10). A sender only makes ranges by
    /// losses, one or two per packet lost in flight at most: 16 384 covers a window of
    /// 16 384 packets lost one in two (20 MB in flight at 1 200 bytes), at ~2 MB of nodes.
    pub max_recv_ranges: usize,
    /// Most datagrams the pacer releases at once. The pacer lets about 2 ms of sending go in
    /// one burst; this caps it. Drivers whose timers are coarse (1 ms for tokio) need bursts
    /// to reach high rates on short paths; 64 also matches a full GSO batch.
    pub max_pacing_burst: u64,
    /// Which path carries the next data packet when there are several (DESIGN.md F16).
    pub scheduler: crate::path::scheduler::SchedulerKind,
    /// Messages of at least this priority are also copied onto every other active path,
    /// whatever the scheduler (the redundant scheduler per message priority: small urgent
    /// messages arrive by the first path that delivers them). `None`: off.
    pub redundant_priority: Option<u8>,
    /// Other addresses of ours the peer may reach us at (a server's second interface): a
    /// server advertises them (AddAddress) once the handshake is done, and the client opens a
    /// path to each (PROTOCOL.md §13).
    pub advertise: Vec<std::net::SocketAddr>,
    /// Our local IP addresses to open paths from (a client's Wi-Fi and cellular interfaces):
    /// right after the handshake, a path is opened from each to each of the peer's addresses.
    /// The runtime sends each path's datagrams from its address.
    pub local_ips: Vec<std::net::IpAddr>,
    /// Paths per connection, at most [`MAX_PATHS`](crate::MAX_PATHS); 1 turns multipath off.
    pub max_paths: usize,
    /// Record qlog events (packets, RTT, congestion state) for
    /// [`Connection::poll_qlog`](crate::Connection::poll_qlog). Off by default.
    pub qlog: bool,
    /// Packet-pair fast start (DESIGN.md F11, PROTOCOL.md §11.10): when a path starts sending
    /// data, and again after it was idle for a smoothed RTT, it sends a short train of
    /// full-size packets back to back; the peer measures the bottleneck rate from their
    /// spacing and the controller opens its window to about one bandwidth-delay product
    /// instead of slow-starting to it. On by default: in `tern-sim` a 1 MB transfer on a
    /// 50 Mbit/s, 100 ms path completes in 1.29× the ideal time instead of 2.37×, and one
    /// joining a busy bottleneck 25–44 % sooner with both flows together carrying
    /// 97–100 % of what they carry without it
    /// (`tern-sim/tests/packet_pair.rs`). Receiving and reporting trains does not depend on
    /// this.
    pub fast_start: bool,
    /// A probe train with the handshake (PROTOCOL.md §4.3, §11.10; needs `fast_start`), so
    /// that a download starts at the measured rate one round trip earlier. A client (IK only)
    /// sends four padding Initials of 1 200 bytes right behind its first Initial (with
    /// 1 452-byte datagrams and a train of 10), which ask for a train and give the server's
    /// anti-amplification budget room for it; a server then sends its path's first train
    /// (min(`probe_train_len`, 10) full-size packets, padding while it has no data) right
    /// behind its response, and the client's first packets report the rate. Off by default: it costs the client's padding and the
    /// server's train on every connection, which a short exchange never gains back.
    pub handshake_train: bool,
    /// Packets per probe train (2..=64; at most what the congestion window has room for is
    /// sent, and no train below 4).
    pub probe_train_len: u8,
    /// Most packets one packet key may seal (PROTOCOL.md §6.4; RFC 9001 §6.6: 2^23 for
    /// AES-GCM with packets up to 16 KiB). The key is updated at half of it (once it is
    /// 3 PTO old, a wait waived near the limit); should no update be possible before the
    /// limit (the last one not acknowledged yet), the connection closes with
    /// AEAD_LIMIT_REACHED. At 1.3 M packets/s the default means an update every 3.2 s.
    /// Tests lower it to run many updates.
    pub confidentiality_limit: u64,
    /// Packets that may fail authentication in the connection before it closes with
    /// AEAD_LIMIT_REACHED (RFC 9001 §6.6: 2^52 for AES-GCM).
    pub integrity_limit: u64,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            flows: FlowConfig::default(),
            congestion: crate::cc::Algorithm::Cubic.factory(),
            initial_rtt: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(30),
            keep_alive: None,
            handshake_timeout: Duration::from_secs(10),
            max_ack_delay: Duration::from_millis(10),
            ack_frequency: 2,
            max_ack_threshold: 10,
            ecn: true,
            max_datagram_size: 1452,
            max_recv_datagram_size: 8972,
            pmtu_discovery: true,
            max_pmtu: 8972,
            pmtu_research_interval: Duration::from_secs(600),
            max_pacing_burst: 64,
            max_message_size: 16 << 20,
            max_datagram_size_in: 65_535,
            datagram_queue: 256,
            datagram_queue_bytes: 1 << 20,
            max_recv_ranges: 16_384,
            scheduler: Default::default(),
            redundant_priority: None,
            advertise: Vec::new(),
            local_ips: Vec::new(),
            max_paths: crate::path::MAX_PATHS,
            qlog: false,
            fast_start: true,
            handshake_train: false,
            probe_train_len: crate::path::probe::DEFAULT_TRAIN_LEN,
            confidentiality_limit: crate::crypto::DEFAULT_CONFIDENTIALITY_LIMIT,
            integrity_limit: crate::crypto::DEFAULT_INTEGRITY_LIMIT,
        }
    }
}

/// When a server asks clients to prove their address with a Retry before it keeps state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Never: accept every valid Initial (the 3× amplification limit still applies).
    Never,
    /// Always send a Retry first.
    Always,
    /// Only while more than this many handshakes are in progress (under load).
    AboveHandshakes(usize),
}

/// How a server decides whether the early data of an IK first flight may be delivered at once
/// (docs/PROTOCOL.md §7.6). A flight it cannot prove fresh still connects; its early data waits
/// until the client proves it is live (one more round trip).
#[derive(Debug, Clone)]
pub struct FirstFlightConfig {
    /// How far a client's timestamp may be from the server's clock. Larger tolerates worse
    /// clocks and costs register memory (a flight is kept for two windows). 10 s, as
    /// WireGuard's and TLS deployments' skew allowances are of that order.
    pub window: Duration,
    /// Most first flights remembered (about 60 bytes each). Beyond it flights are unproven,
    /// never accepted twice. 65 536 is 3 300 handshakes/s for two windows of 10 s.
    pub register_capacity: usize,
    /// Trust timestamps from the start: only when no earlier instance of this server, with
    /// the same key, can have seen a flight in the last window (simulations, tests). Off by
    /// default: a restarted server proves nothing fresh for one window (RFC 8446 §8.2).
    pub trust_start: bool,
    /// A register shared by several endpoints that share one identity (the worker threads
    /// of one server, see `tern::EndpointBuilder::workers`): a flight replayed to another
    /// worker is still seen as replayed. `None`: the endpoint keeps its own.
    pub shared_register: Option<SharedRegister>,
}

/// A first-flight register several endpoints consult (behind a lock taken once per IK
/// first flight).
pub type SharedRegister = std::sync::Arc<std::sync::Mutex<crate::crypto::FirstFlightRegister>>;

impl FirstFlightConfig {
    /// A register to share between endpoints with this configuration.
    pub fn new_shared_register(&self) -> SharedRegister {
        std::sync::Arc::new(std::sync::Mutex::new(
            crate::crypto::FirstFlightRegister::new(self.window, self.register_capacity),
        ))
    }
}

impl Default for FirstFlightConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            register_capacity: 1 << 16,
            trust_start: false,
            shared_register: None,
        }
    }
}

/// Settings of an endpoint: identity, secrets and defaults for its connections.
#[derive(Clone)]
pub struct EndpointConfig {
    /// This node's static key: its identity.
    pub keypair: StaticKeypair,
    /// Secret for stateless-reset tokens. Keep it across restarts so that peers of a crashed
    /// instance learn at once that their connection is gone.
    pub reset_secret: [u8; 32],
    /// Seed of the endpoint's RNG (connection IDs, ephemeral keys, retry tokens). Drivers
    /// pass OS entropy; simulations pass a seed, which makes them reproducible.
    pub rng_seed: [u8; 32],
    /// Whether this endpoint accepts incoming connections.
    pub server: bool,
    /// Retry policy for incoming connections.
    pub retry: RetryPolicy,
    /// Lifetime of a retry token.
    pub retry_token_lifetime: Duration,
    /// Defaults for connections.
    pub connection: ConnectionConfig,
    /// Most connections kept at once; further Initials are refused.
    pub max_connections: usize,
    /// Most handshakes in progress at once (server connections not yet handed to
    /// `Endpoint::accept`); further Initials are refused as busy. Bounds what a flood of
    /// Initials or replayed first flights can hold.
    pub max_half_open: usize,
    /// Hand a connection to `accept` as soon as its IK first flight is proven fresh, before
    /// its client proves it is live (0.5-RTT: the application can answer first-flight data
    /// in the server's first flight). Off by default: such a client may be an off-path
    /// attacker that knows the server's public key and spoofs its source address; the
    /// connection then closes with `HandshakeTimedOut` after `handshake_timeout` and counts
    /// against `max_half_open` until proven. Default `accept` waits one round trip more.
    pub early_accept: bool,
    /// Stateless resets sent per second, and at once (token bucket; RFC 9000 §10.3.3). A
    /// flood of datagrams for unknown connections, or two endpoints that both lost their
    /// state, cost at most this many answers. 1 000/s with a burst of 1 000 tells the peers of
    /// a restarted server with thousands of connections within seconds.
    pub stateless_resets_per_second: (f64, f64),
    /// Handshakes per second one source IP address may start, and how many at once (token
    /// bucket; tracked for up to 65 536 sources; `f64::INFINITY` turns it off). Beyond it an
    /// Initial without a valid token gets a Retry, one with a valid token is refused as busy.
    /// 500/s with a burst of 1000 leaves room for a carrier NAT of many clients while one host
    /// cannot take all of a server's handshake work (≈ 1 500/s per core here).
    pub handshakes_per_source: (f64, f64),
    /// The wall clock at the instant the endpoint is created with (time since the UNIX
    /// epoch). The core reads no clock; drivers pass `SystemTime::now()`. Without it a client
    /// sends no timestamp and a server proves no first flight fresh (§7.6), so early data
    /// waits one round trip.
    pub wall_clock: Option<Duration>,
    /// Replay protection of the client's first flight (docs/PROTOCOL.md §7.6).
    pub first_flight: FirstFlightConfig,
    /// Make this server's connection IDs routable by a QUIC-LB load balancer (its server
    /// ID encrypted in every ID, see [`crate::lb`]); `None`: random IDs.
    pub routable_cids: Option<crate::lb::RoutableCids>,
    /// Free a connection as soon as its `Drained` event is polled. Simple drivers and
    /// simulations want this; a runtime whose application may still hold unread data of a
    /// closed connection turns it off and calls `Endpoint::release` itself.
    pub release_drained: bool,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("public_key", &self.keypair.public())
            .field("server", &self.server)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl EndpointConfig {
    /// A configuration with `keypair` and an RNG seeded with `seed` (32 random bytes). The
    /// stateless-reset secret is derived from the private key, so it survives restarts with
    /// the same identity (which is what lets peers of a crashed node learn of it at once).
    pub fn new(keypair: StaticKeypair, seed: [u8; 32]) -> Self {
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, keypair.private_bytes()),
            b"tern stateless reset secret",
        );
        let mut reset_secret = [0u8; 32];
        reset_secret.copy_from_slice(tag.as_ref());
        Self {
            keypair,
            reset_secret,
            rng_seed: seed,
            server: false,
            retry: RetryPolicy::AboveHandshakes(256),
            retry_token_lifetime: Duration::from_secs(10),
            connection: ConnectionConfig::default(),
            max_connections: 100_000,
            max_half_open: 4096,
            early_accept: false,
            stateless_resets_per_second: (1000.0, 1000.0),
            handshakes_per_source: (500.0, 1000.0),
            wall_clock: None,
            first_flight: FirstFlightConfig::default(),
            routable_cids: None,
            release_drained: true,
        }
    }

    /// Accepts incoming connections.
    pub fn server(mut self) -> Self {
        self.server = true;
        self
    }
}
