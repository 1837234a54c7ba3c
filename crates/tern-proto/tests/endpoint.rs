//! Endpoint-level tests with a minimal in-memory network (no simulator): handshakes, security
//! checks, amplification, close and timeouts. Each test reads like the situation it checks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tern_proto::{
    ConnectionError, ConnectionHandle, Dir, Endpoint, EndpointConfig, Event, ReadError,
    RetryPolicy, StaticKeypair, Violation,
};

const CLIENT: &str = "127.0.0.1:5000";
const SERVER: &str = "127.0.0.1:4433";

fn config(seed: u8, server: bool) -> EndpointConfig {
    let mut c = EndpointConfig::new(StaticKeypair::generate([seed; 32]), [seed ^ 0x55; 32]);
    // These tests count and replay datagrams; PMTU probes (tern-sim's `pmtu.rs` tests them)
    // would add some and change their sizes, the pair having no MTU of its own.
    c.connection.max_pmtu = c.connection.max_datagram_size;
    if server {
        c.server()
    } else {
        c
    }
}

/// A pair whose server lets the client have at most `limit` one-way flows open at once.
fn pair_with_uni_limit(limit: u64) -> Pair {
    let mut server = config(2, true);
    server.connection.flows.max_concurrent_uni = limit;
    Pair::new(config(1, false), server)
}

/// A configuration with a wall clock (the same on both ends), for first-flight freshness.
fn clocked(seed: u8, server: bool) -> EndpointConfig {
    let mut c = config(seed, server);
    c.wall_clock = Some(WALL_CLOCK);
    c
}

/// An arbitrary wall clock at the tests' epoch (2023-11-14).
const WALL_CLOCK: Duration = Duration::from_secs(1_700_000_000);

/// Two endpoints and the datagrams between them; time advances only when asked.
struct Pair {
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    /// Datagrams sent by each side, for tests that replay or tamper.
    client_sent: Vec<Vec<u8>>,
    server_sent: Vec<Vec<u8>>,
    /// Drop everything the server sends (a spoofed client address that never answers).
    server_blackholed: bool,
}

impl Pair {
    fn new(client: EndpointConfig, server: EndpointConfig) -> Self {
        #[allow(clippy::disallowed_methods)] // Tests fix an arbitrary epoch; only offsets matter.
        let now = Instant::now();
        Self {
            now,
            client: Endpoint::new(client, now),
            server: Endpoint::new(server, now),
            client_sent: Vec::new(),
            server_sent: Vec::new(),
            server_blackholed: false,
        }
    }

    /// Delivers everything both sides want to send, repeatedly, without time passing.
    fn exchange(&mut self) {
        let (c, s): (SocketAddr, SocketAddr) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
        for _ in 0..10_000 {
            let mut progress = false;
            let mut buf = Vec::new();
            while let Some(t) = self.client.poll_transmit(self.now, &mut buf) {
                let mut d = buf[buf.len() - t.size..].to_vec();
                self.client_sent.push(d.clone());
                self.server.handle(self.now, c, None, &mut d);
                progress = true;
            }
            buf.clear();
            while let Some(t) = self.server.poll_transmit(self.now, &mut buf) {
                let mut d = buf[buf.len() - t.size..].to_vec();
                self.server_sent.push(d.clone());
                if !self.server_blackholed {
                    self.client.handle(self.now, s, None, &mut d);
                }
                progress = true;
            }
            if !progress {
                return;
            }
        }
        panic!("endpoints never went quiet");
    }

    /// Everything the client sends at `sent`, handed to the server at `arrives`.
    fn client_to_server(&mut self, sent: Instant, arrives: Instant) {
        let client: SocketAddr = CLIENT.parse().unwrap();
        let mut out = Vec::new();
        while let Some(t) = self.client.poll_transmit(sent, &mut out) {
            let mut d = out[out.len() - t.size..].to_vec();
            self.server.handle(arrives, client, None, &mut d);
        }
    }

    /// Lets time pass to the next timer of either side and runs it.
    fn advance(&mut self) -> bool {
        let next = [self.client.poll_timeout(), self.server.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        self.exchange();
        true
    }

    fn events(ep: &mut Endpoint) -> Vec<(ConnectionHandle, Event)> {
        std::iter::from_fn(|| ep.poll_event()).collect()
    }
}

fn connect(pair: &mut Pair, ik: bool) -> (ConnectionHandle, ConnectionHandle) {
    let key = ik.then(|| pair.server.public_key());
    let c = pair
        .client
        .connect(pair.now, SERVER.parse().unwrap(), key)
        .unwrap();
    pair.exchange();
    let s = pair.server.accept().expect("server accepted");
    (c, s)
}

#[test]
fn ik_and_xx_handshakes_complete_and_carry_data() {
    for ik in [true, false] {
        let mut pair = Pair::new(config(1, false), config(2, true));
        let server_key = pair.server.public_key();
        let key = ik.then_some(server_key);
        let c = pair
            .client
            .connect(pair.now, SERVER.parse().unwrap(), key)
            .unwrap();
        // Data written before the handshake: with IK it rides in the first flight.
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn.open_flow(Dir::Bi).unwrap();
        conn.write(flow, b"hello tern").unwrap();
        conn.finish(flow).unwrap();
        pair.exchange();
        let s = pair.server.accept().expect("server accepted");
        let client_events = Pair::events(&mut pair.client);
        assert!(
            client_events.contains(&(c, Event::Connected)),
            "{client_events:?}"
        );
        let server_conn = pair.server.connection_mut(s).unwrap();
        assert!(server_conn.is_established());
        let id = server_conn.accept_flow(Dir::Bi).expect("flow opened");
        let mut buf = [0u8; 64];
        let n = server_conn.read(id, &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..n], b"hello tern");
        assert_eq!(server_conn.read(id, &mut buf), Ok(None), "finished");
        // Each side knows the other's identity.
        assert_eq!(
            pair.client.connection(c).unwrap().peer_key(),
            Some(server_key)
        );
        assert_eq!(
            pair.server.connection(s).unwrap().peer_key(),
            Some(StaticKeypair::generate([1; 32]).public())
        );
    }
}

#[test]
fn ik_first_flight_carries_data_before_any_round_trip() {
    // A server that trusts its clock from the start (no earlier instance could have seen
    // this flight) proves the first flight fresh by its timestamp, and with `early_accept`
    // hands it out before the client proved its address (0.5-RTT).
    let mut server = clocked(2, true);
    server.first_flight.trust_start = true;
    server.early_accept = true;
    let mut pair = Pair::new(clocked(1, false), server);
    let key = pair.server.public_key();
    let c = pair
        .client
        .connect(pair.now, SERVER.parse().unwrap(), Some(key))
        .unwrap();
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"frame 1 of an AR session").unwrap();
    // Only the client's very first datagram reaches the server.
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    assert!(t.size >= 1200, "Initial datagrams are padded");
    pair.server
        .handle(pair.now, CLIENT.parse().unwrap(), None, &mut buf[..t.size]);
    let s = pair.server.accept().expect("accepted from one datagram");
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn
        .accept_flow(Dir::Uni)
        .expect("flow opened by the first flight");
    let mut out = [0u8; 64];
    let n = conn.read(id, &mut out).unwrap().unwrap();
    assert_eq!(&out[..n], b"frame 1 of an AR session");
}

#[test]
fn wrong_server_key_fails_with_a_clear_error() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let wrong = StaticKeypair::generate([9; 32]).public();
    let c = pair
        .client
        .connect(pair.now, SERVER.parse().unwrap(), Some(wrong))
        .unwrap();
    pair.exchange();
    for _ in 0..10 {
        if !pair.advance() {
            break;
        }
    }
    let events = Pair::events(&mut pair.client);
    assert!(
        events.contains(&(c, Event::Closed(ConnectionError::HandshakeRefused))),
        "{events:?}"
    );
    let message = ConnectionError::HandshakeRefused.to_string();
    assert!(message.contains("wrong server public key"), "{message}");
    assert_eq!(
        pair.server.connection_count(),
        0,
        "the server kept no state"
    );
    assert!(pair.server.stats().refused >= 1);
}

#[test]
fn replayed_and_tampered_packets_are_dropped_and_counted() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &[7u8; 3000]).unwrap();
    pair.exchange();
    let from: SocketAddr = CLIENT.parse().unwrap();
    // Replay the client's last data packet.
    let last = pair.client_sent.last().unwrap().clone();
    let mut replay = last.clone();
    pair.server.handle(pair.now, from, None, &mut replay);
    let stats = pair.server.connection(s).unwrap().stats();
    assert_eq!(stats.replays, 1, "{stats:?}");
    // A fresh packet, intercepted: flip one payload bit, then one header bit (the key-phase
    // flag; the header is authenticated too), then deliver the original.
    let conn = pair.client.connection_mut(c).unwrap();
    conn.write(flow, &[7u8; 100]).unwrap();
    pair.now += Duration::from_millis(50); // let the pacer release the next packet
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let fresh = buf[..t.size].to_vec();
    let mut tampered = fresh.clone();
    let n = tampered.len();
    tampered[n - 20] ^= 1;
    pair.server.handle(pair.now, from, None, &mut tampered);
    let mut header_flip = fresh.clone();
    header_flip[0] ^= 0x04;
    pair.server.handle(pair.now, from, None, &mut header_flip);
    let stats = pair.server.connection(s).unwrap().stats();
    assert_eq!(stats.auth_failures, 2, "{stats:?}");
    let mut original = fresh;
    pair.server.handle(pair.now, from, None, &mut original);
    pair.exchange();
    let events = Pair::events(&mut pair.server);
    assert!(events.contains(&(s, Event::SecurityViolation(Violation::Replay))));
    assert!(events.contains(&(s, Event::SecurityViolation(Violation::Authentication))));
    // The connection still works: nothing was delivered twice or corrupted.
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).unwrap();
    let mut buf = vec![0u8; 10_000];
    let n = conn.read(id, &mut buf).unwrap().unwrap();
    assert_eq!(&buf[..n], &[7u8; 3100][..]);
}

#[test]
fn amplification_stays_within_three_times_before_address_proof() {
    for ik in [true, false] {
        let mut pair = Pair::new(config(1, false), config(2, true));
        // The "client" is a spoofed address: it never hears the server.
        pair.server_blackholed = true;
        let key = ik.then(|| pair.server.public_key());
        pair.client
            .connect(pair.now, SERVER.parse().unwrap(), key)
            .unwrap();
        // Send exactly one Initial, then let only the server's timers run for a minute.
        let mut buf = Vec::new();
        let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
        let received = t.size;
        let mut d = buf.clone();
        pair.server
            .handle(pair.now, CLIENT.parse().unwrap(), None, &mut d);
        let mut sent = 0;
        let end = pair.now + Duration::from_secs(60);
        loop {
            let mut out = Vec::new();
            while let Some(t) = pair.server.poll_transmit(pair.now, &mut out) {
                sent += t.size;
            }
            match pair.server.poll_timeout() {
                Some(t) if t < end => {
                    pair.now = t;
                    pair.server.handle_timeout(t);
                }
                _ => break,
            }
        }
        assert!(sent > 0, "the server answered");
        assert!(
            sent <= 3 * received,
            "sent {sent} bytes for {received} received (ik={ik})"
        );
    }
}

#[test]
fn retry_proves_the_address_before_the_server_keeps_state() {
    let mut server = config(2, true);
    server.retry = RetryPolicy::Always;
    let mut pair = Pair::new(config(1, false), server);
    let key = pair.server.public_key();
    let c = pair
        .client
        .connect(pair.now, SERVER.parse().unwrap(), Some(key))
        .unwrap();
    // The first Initial only: the server answers with a Retry and keeps nothing.
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let mut initial = buf[..t.size].to_vec();
    pair.server
        .handle(pair.now, CLIENT.parse().unwrap(), None, &mut initial);
    assert_eq!(pair.server.stats().retries_sent, 1);
    assert_eq!(
        pair.server.connection_count(),
        0,
        "no connection before the token"
    );
    assert_eq!(
        pair.server.half_open_count(),
        0,
        "no half-open state either"
    );
    assert!(pair.server.accept().is_none());
    // The Retry reaches the client, which comes back with the token: now it is accepted.
    pair.exchange();
    assert_eq!(pair.server.stats().retries_sent, 1);
    assert!(pair.server.accept().is_some());
    assert!(pair.client.connection(c).unwrap().is_established());
}

/// An XX client's first Initial handed to the server from `CLIENT`: the Initial as sent and
/// the server's message 2.
fn xx_first_exchange(pair: &mut Pair) -> (Vec<u8>, Vec<u8>) {
    pair.client
        .connect(pair.now, SERVER.parse().unwrap(), None)
        .unwrap();
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let initial = buf[..t.size].to_vec();
    pair.server.handle(
        pair.now,
        CLIENT.parse().unwrap(),
        None,
        &mut initial.clone(),
    );
    let mut out = Vec::new();
    let t = pair
        .server
        .poll_transmit(pair.now, &mut out)
        .expect("message 2");
    (initial, out[out.len() - t.size..].to_vec())
}

#[test]
fn a_short_damaged_copy_of_an_xx_first_message_is_not_answered() {
    // XX's first message is not authenticated, so a copy that differs from the one the
    // half-open connection was built from replaces it. A short copy from elsewhere must not
    // (the 1 200-byte minimum of every first message, §7.6): it could draw our answer, to a
    // spoofed source, larger than itself.
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (initial, _) = xx_first_exchange(&mut pair);
    // The header and payload only (no padding), one payload byte changed, from elsewhere.
    let packet = tern_proto::wire::LongPacket::decode(&initial).unwrap();
    let start = packet.payload.as_ptr() as usize - initial.as_ptr() as usize;
    let end = start + packet.payload.len();
    assert!(end < 1200);
    let mut damaged = initial[..end].to_vec();
    damaged[start + 5] ^= 1;
    let victim: SocketAddr = "192.0.2.9:9".parse().unwrap();
    let short_before = pair.server.stats().short_initials;
    pair.server.handle(pair.now, victim, None, &mut damaged);
    assert_eq!(pair.server.stats().short_initials, short_before + 1);
    let mut out = Vec::new();
    while let Some(t) = pair.server.poll_transmit(pair.now, &mut out) {
        assert_ne!(t.destination, victim, "answered a short first message");
    }
}

/// A client that sends a second XX first message under the server's CID (learned from
/// message 2) does not get its half-open connection rebuilt: before, the rebuilt connection
/// took that CID as its original DCID, the client's own DCID stayed routed to the slot after
/// the connection was gone, and the next connection in the slot received its Initials (found
/// by an outside read).
#[test]
fn a_first_message_under_the_servers_cid_leaves_no_route_behind() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (initial, msg2) = xx_first_exchange(&mut pair);
    let client: SocketAddr = CLIENT.parse().unwrap();
    let mut out = Vec::new();
    let answer = tern_proto::wire::LongPacket::decode(&msg2).unwrap();
    let server_cid = answer.scid.as_bytes().to_vec();
    let packet = tern_proto::wire::LongPacket::decode(&initial).unwrap();
    let client_dcid = packet.dcid.as_bytes().to_vec();
    assert_eq!(
        client_dcid.len(),
        server_cid.len(),
        "same length: rewritten in place"
    );
    let payload = packet.payload.as_ptr() as usize - initial.as_ptr() as usize;
    // DCID at byte 6 (type, version, length); a differing ephemeral key.
    let mut forged = initial.clone();
    forged[6..6 + server_cid.len()].copy_from_slice(&server_cid);
    forged[payload + 5] ^= 1;
    assert!(forged.len() >= 1200);
    pair.server.handle(pair.now, client, None, &mut forged);
    while pair.server.poll_transmit(pair.now, &mut out).is_some() {}
    // The half-open connection times out and is freed: nothing routes to its slot any more.
    let end = pair.now + Duration::from_secs(60);
    while let Some(t) = pair.server.poll_timeout().filter(|t| *t < end) {
        pair.now = t;
        pair.server.handle_timeout(t);
        while pair.server.poll_transmit(pair.now, &mut out).is_some() {}
        while pair.server.poll_event().is_some() {}
    }
    assert_eq!(pair.server.half_open_count(), 0);
    assert!(!pair.server.routes(&server_cid), "the server's CID");
    assert!(!pair.server.routes(&client_dcid), "the client's DCID");
}

/// Third messages that fail to authenticate cost the server a rebuild of its Noise state
/// (three X25519 operations) each: they must name the server's CID and are charged to the
/// source's handshake budget like Initials, so a forger is held to the budget, while the
/// client's genuine message still completes the handshake once the budget refills (found by
/// an outside read: unlimited X25519 work from one source).
#[test]
fn forged_third_messages_are_held_to_the_sources_handshake_budget() {
    let mut server = config(2, true);
    server.handshakes_per_source = (10.0, 20.0);
    let mut pair = Pair::new(config(1, false), server);
    let (initial, msg2) = xx_first_exchange(&mut pair);
    let odcid = tern_proto::wire::LongPacket::decode(&initial)
        .unwrap()
        .dcid
        .as_bytes()
        .to_vec();
    let client: SocketAddr = CLIENT.parse().unwrap();
    pair.client
        .handle(pair.now, SERVER.parse().unwrap(), None, &mut msg2.clone());
    let mut third = Vec::new();
    let t = pair
        .client
        .poll_transmit(pair.now, &mut third)
        .expect("message 3");
    let third = third[third.len() - t.size..].to_vec();
    let packet = tern_proto::wire::LongPacket::decode(&third).unwrap();
    let payload = packet.payload.as_ptr() as usize - third.as_ptr() as usize;
    // Under the client's original DCID: not read at all.
    let unroutable = pair.server.stats().unroutable;
    let mut wrong_cid = third.clone();
    wrong_cid[6..6 + odcid.len()].copy_from_slice(&odcid);
    pair.server.handle(pair.now, client, None, &mut wrong_cid);
    assert_eq!(pair.server.stats().unroutable, unroutable + 1);
    // A hundred forged ones: the budget (a burst of 20, one spent on the Initial) reads 19.
    let limited = pair.server.stats().rate_limited;
    for _ in 0..100 {
        let mut forged = third.clone();
        forged[payload + 40] ^= 1;
        pair.server.handle(pair.now, client, None, &mut forged);
    }
    assert_eq!(pair.server.stats().rate_limited, limited + 81);
    // The genuine one, once the budget refilled a little, completes the handshake.
    pair.now += Duration::from_secs(1);
    pair.server
        .handle(pair.now, client, None, &mut third.clone());
    assert!(
        pair.server.accept().is_some(),
        "the handshake survived the forgeries"
    );
}

/// Forged packets are counted, each, but queue one SecurityViolation event while it waits to
/// be polled: a half-open connection's events wait for `accept`, and a flood must not grow
/// the queue (found by an outside read: an event per forged packet).
#[test]
fn a_flood_of_forged_packets_queues_one_event() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    Pair::events(&mut pair.server);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"genuine").unwrap();
    let mut buf = Vec::new();
    let t = pair
        .client
        .poll_transmit(pair.now, &mut buf)
        .expect("a short packet");
    let genuine = buf[buf.len() - t.size..].to_vec();
    let client: SocketAddr = CLIENT.parse().unwrap();
    for i in 0..100 {
        let mut forged = genuine.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1 + (i as u8 % 7);
        pair.server.handle(pair.now, client, None, &mut forged);
    }
    let failures = pair.server.connection(s).unwrap().stats().auth_failures;
    assert_eq!(failures, 100);
    let violations = |pair: &mut Pair| {
        Pair::events(&mut pair.server)
            .into_iter()
            .filter(|(_, e)| matches!(e, Event::SecurityViolation(_)))
            .count()
    };
    assert_eq!(violations(&mut pair), 1);
    // Once polled, the next one is reported again.
    let mut forged = genuine.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x40;
    pair.server.handle(pair.now, client, None, &mut forged);
    assert_eq!(violations(&mut pair), 1);
}

#[test]
fn fast_close_frees_both_ends() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    Pair::events(&mut pair.client);
    Pair::events(&mut pair.server);
    pair.client
        .connection_mut(c)
        .unwrap()
        .close(pair.now, 42, b"bye");
    pair.exchange();
    let server_events = Pair::events(&mut pair.server);
    assert!(server_events.contains(&(
        s,
        Event::Closed(ConnectionError::ApplicationClosed {
            code: 42,
            reason: "bye".into()
        })
    )));
    // The client heard the answer: freed at once, no drain period.
    let client_events = Pair::events(&mut pair.client);
    assert!(
        client_events.contains(&(c, Event::Drained)),
        "{client_events:?}"
    );
    assert_eq!(pair.client.connection_count(), 0);
    // The server drains briefly, then frees.
    while pair.advance() {}
    let server_events = Pair::events(&mut pair.server);
    assert!(
        server_events.contains(&(s, Event::Drained)),
        "{server_events:?}"
    );
    assert_eq!(pair.server.connection_count(), 0);
}

#[test]
fn a_vanished_peer_is_detected_by_idle_timeout() {
    let mut client = config(1, false);
    client.connection.idle_timeout = Duration::from_secs(5);
    let mut pair = Pair::new(client, config(2, true));
    let (c, _) = connect(&mut pair, true);
    pair.server_blackholed = true;
    let start = pair.now;
    while pair.advance() {
        if pair.client.connection(c).is_none_or(|c| c.is_closed()) {
            break;
        }
    }
    let events = Pair::events(&mut pair.client);
    assert!(events.contains(&(c, Event::Closed(ConnectionError::TimedOut))));
    let waited = pair.now - start;
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
}

#[test]
fn a_peer_that_lost_its_state_is_detected_by_stateless_reset() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, _) = connect(&mut pair, true);
    // The server restarts with the same reset secret but no connections.
    pair.server = Endpoint::new(config(2, true), pair.now);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"are you there?").unwrap();
    pair.exchange();
    assert!(pair.server.stats().resets_sent >= 1);
    let events = Pair::events(&mut pair.client);
    assert!(
        events.contains(&(c, Event::Closed(ConnectionError::Reset))),
        "{events:?}"
    );
}

/// The server of an IK handshake learns the client's reset token from message 1 and
/// recognises its reset (found by an outside read: the token was routed only when another
/// long packet arrived, which IK seldom sends, and the server waited for its idle timeout).
#[test]
fn an_ik_server_detects_a_client_that_lost_its_state() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (_, s) = connect(&mut pair, true);
    client_loses_its_state_and_the_server_sees_its_reset(&mut pair, s);
}

/// The client restarts with the same reset secret but no connections: the server's next
/// packet is answered with a reset, which the server's connection `s` recognises.
fn client_loses_its_state_and_the_server_sees_its_reset(pair: &mut Pair, s: ConnectionHandle) {
    pair.client = Endpoint::new(config(1, false), pair.now);
    Pair::events(&mut pair.server);
    let conn = pair.server.connection_mut(s).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"are you there?").unwrap();
    pair.exchange();
    assert!(pair.client.stats().resets_sent >= 1);
    let events = Pair::events(&mut pair.server);
    assert!(
        events.contains(&(s, Event::Closed(ConnectionError::Reset))),
        "{events:?}"
    );
}

#[test]
fn an_xx_client_sends_its_reset_token_only_under_encryption() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (_, s) = connect(&mut pair, false);
    let initial = pair.client_sent[0].clone();
    // Recognised by the token the server got in message 3.
    client_loses_its_state_and_the_server_sees_its_reset(&mut pair, s);
    // XX's first message is not encrypted: the token must not be in it.
    let reset = pair.client_sent.last().unwrap();
    let token = &reset[reset.len() - 16..];
    assert!(
        !initial.windows(16).any(|w| w == token),
        "the reset token travelled in the clear"
    );
}

#[test]
fn reading_a_reset_flow_reports_the_code() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"partial").unwrap();
    pair.exchange();
    pair.client
        .connection_mut(c)
        .unwrap()
        .reset_flow(flow, 7)
        .unwrap();
    pair.exchange();
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(conn.read(id, &mut buf), Err(ReadError::Reset(7)));
    assert_eq!(
        conn.read(id, &mut buf),
        Err(ReadError::ClosedFlow),
        "told once, then freed"
    );
}

#[test]
fn flows_the_peer_reset_give_their_place_back_once_read() {
    // A peer that resets every flow it opens must not use up the flow limit for good.
    let mut pair = pair_with_uni_limit(4);
    let (c, s) = connect(&mut pair, true);
    for round in 0..10 {
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn
            .open_flow(Dir::Uni)
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        conn.write(flow, b"x").unwrap();
        pair.exchange();
        pair.client
            .connection_mut(c)
            .unwrap()
            .reset_flow(flow, 1)
            .unwrap();
        pair.exchange();
        let conn = pair.server.connection_mut(s).unwrap();
        let id = conn.accept_flow(Dir::Uni).expect("announced");
        let mut buf = [0u8; 4];
        assert_eq!(conn.read(id, &mut buf), Err(ReadError::Reset(1)));
        pair.exchange();
    }
}

#[test]
fn keep_alive_holds_an_idle_connection_open() {
    let mut client = config(1, false);
    client.connection.idle_timeout = Duration::from_secs(5);
    client.connection.keep_alive = Some(Duration::from_secs(1));
    let mut server = config(2, true);
    server.connection.idle_timeout = Duration::from_secs(5);
    let mut pair = Pair::new(client, server);
    let (c, s) = connect(&mut pair, true);
    let start = pair.now;
    while pair.now < start + Duration::from_secs(30) {
        assert!(pair.advance(), "timers keep running");
    }
    assert!(pair.client.connection(c).unwrap().is_established());
    assert!(pair.server.connection(s).unwrap().is_established());
}

#[test]
fn stop_sending_reaches_the_writer() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Bi).unwrap();
    conn.write(flow, b"first").unwrap();
    pair.exchange();
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Bi).unwrap();
    conn.stop_flow(id, 9).unwrap();
    pair.exchange();
    let events = Pair::events(&mut pair.client);
    assert!(
        events.contains(&(c, Event::FlowStopped { id: flow, code: 9 })),
        "{events:?}"
    );
    let conn = pair.client.connection_mut(c).unwrap();
    assert_eq!(
        conn.write(flow, b"more"),
        Err(tern_proto::WriteError::Stopped(9))
    );
}

#[test]
fn a_receive_batch_of_thousands_of_packets_is_acknowledged_in_full() {
    // The runtime may take thousands of datagrams from its socket before the receiver gets to
    // send an ACK (a long GRO batch, a busy host). The ACK that follows must cover every one:
    // none may be declared lost for having fallen out of it.
    use std::sync::Arc;
    use tern_proto::cc::CubicConfig;
    let mut client = config(1, false);
    client.connection.congestion = Arc::new(CubicConfig::default().initial_window_packets(4000));
    let mut pair = Pair::new(client, config(2, true));
    let (c, _) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    let data = vec![7u8; 4 << 20];
    let mut written = 0;
    while written < data.len() {
        match conn.write(flow, &data[written..]) {
            Ok(n) if n > 0 => written += n,
            _ => break,
        }
    }
    // Everything the client may send, held back from the server (paced: time moves on).
    let mut batch = Vec::new();
    let mut buf = Vec::new();
    for _ in 0..100_000 {
        buf.clear();
        match pair.client.poll_transmit(pair.now, &mut buf) {
            Some(t) => batch.push(buf[..t.size].to_vec()),
            None if pair.client.poll_timeout().is_some() => {
                pair.now += Duration::from_micros(50);
                pair.client.handle_timeout(pair.now);
            }
            None => break,
        }
        if batch.len() >= 2_500 {
            break;
        }
    }
    assert!(batch.len() >= 2_500, "only {} datagrams", batch.len());
    // The server reads the whole batch, then answers.
    let from: SocketAddr = CLIENT.parse().unwrap();
    for mut d in batch {
        pair.server.handle(pair.now, from, None, &mut d);
    }
    pair.exchange();
    let stats = pair.client.connection(c).unwrap().stats();
    assert_eq!(stats.packets_lost, 0, "{stats:?}");
    assert_eq!(stats.spurious_losses, 0);
    assert_eq!(stats.bytes_retransmitted, 0);
}

#[test]
fn a_flow_whose_first_frame_is_a_reset_is_announced() {
    // The peer learns of a flow from whatever frame names it first; a flow reset before any
    // of its data left is opened by the ResetFlow, and the application must hear of it.
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    Pair::events(&mut pair.server);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.reset_flow(flow, 5).unwrap();
    pair.exchange();
    let events = Pair::events(&mut pair.server);
    assert!(
        events
            .iter()
            .any(|(h, e)| *h == s && matches!(e, Event::FlowOpened { dir: Dir::Uni })),
        "{events:?}"
    );
    let server = pair.server.connection_mut(s).unwrap();
    let id = server
        .accept_flow(Dir::Uni)
        .expect("the flow is there to accept");
    let mut buf = [0u8; 8];
    assert_eq!(server.read(id, &mut buf), Err(ReadError::Reset(5)));
}

#[test]
fn stopping_a_flow_frees_what_it_buffered() {
    // Data nobody will read must not keep its memory, nor its share of the connection
    // window; and a flow that arrived whole is discarded without a StopSending.
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let whole = conn.open_flow(Dir::Uni).unwrap();
    conn.write(whole, &[1u8; 20_000]).unwrap();
    conn.finish(whole).unwrap();
    let open = conn.open_flow(Dir::Uni).unwrap();
    conn.write(open, &[2u8; 20_000]).unwrap();
    // Until both arrived (pacing spreads them over a few timer steps).
    pair.exchange();
    for _ in 0..50 {
        if pair.server.connection(s).unwrap().recv_buffered() >= 40_000 {
            break;
        }
        pair.advance();
    }
    let server = pair.server.connection_mut(s).unwrap();
    let a = server.accept_flow(Dir::Uni).unwrap();
    let b = server.accept_flow(Dir::Uni).unwrap();
    assert_eq!(server.recv_buffered(), 40_000);
    server.stop_flow(a, 1).unwrap();
    server.stop_flow(b, 2).unwrap();
    assert_eq!(server.recv_buffered(), 0);
    let mut buf = [0u8; 8];
    assert_eq!(server.read(b, &mut buf), Err(ReadError::ClosedFlow));
    pair.exchange();
    // Only the flow still open was stopped on the wire: its writer hears of it.
    let events = Pair::events(&mut pair.client);
    let stopped: Vec<_> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::FlowStopped { id, code } => Some((*id, *code)),
            _ => None,
        })
        .collect();
    assert_eq!(stopped, vec![(open, 2)]);
}

#[test]
fn a_copy_from_a_spoofed_address_moves_the_path_but_gets_at_most_three_times_its_size() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    // The server has 1 MB to send to the client.
    let conn = pair.server.connection_mut(s).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &vec![7u8; 1 << 20]).unwrap();
    conn.finish(flow).unwrap();
    // An attacker copies the client's next packet and gets it to the server first, from the
    // victim's address.
    let client = pair.client.connection_mut(c).unwrap();
    let up = client.open_flow(Dir::Uni).unwrap();
    client.write(up, &[1u8; 1000]).unwrap();
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let genuine = buf[..t.size].to_vec();
    let victim: SocketAddr = "192.0.2.66:5000".parse().unwrap();
    let mut copy = genuine.clone();
    pair.server.handle(pair.now, victim, None, &mut copy);
    // Until the victim answers (it never will), the server sends it at most 3× the copy.
    let mut to_victim = 0;
    let end = pair.now + Duration::from_secs(5);
    loop {
        let mut out = Vec::new();
        while let Some(t) = pair.server.poll_transmit(pair.now, &mut out) {
            assert_eq!(t.destination, victim, "the path followed the copy");
            to_victim += t.size;
        }
        match pair.server.poll_timeout() {
            Some(t) if t < end => {
                pair.now = t;
                pair.server.handle_timeout(t);
            }
            _ => break,
        }
    }
    assert!(to_victim > 0, "the server challenged the new address");
    assert!(
        to_victim <= 3 * genuine.len(),
        "{to_victim} bytes to the victim for {} received from it",
        genuine.len()
    );
    // The real client is heard again (a new packet from its own address): the path comes
    // back, is validated, and the whole megabyte arrives.
    let client = pair.client.connection_mut(c).unwrap();
    client.write(up, b"y").unwrap();
    client.finish(up).unwrap();
    pair.exchange();
    let mut got = 0;
    let mut id = None;
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..100_000 {
        let client = pair.client.connection_mut(c).unwrap();
        id = id.or_else(|| client.accept_flow(Dir::Uni));
        if let Some(id) = id {
            while let Ok(Some(n)) = client.read(id, &mut buf) {
                got += n;
            }
        }
        if got == 1 << 20 || !pair.advance() {
            break;
        }
    }
    assert_eq!(got, 1 << 20, "the whole megabyte arrives");
    let paths = pair.server.connection(s).unwrap().path_stats();
    assert_eq!(paths[0].remote, CLIENT.parse::<SocketAddr>().unwrap());
    assert!(paths[0].validated, "{paths:#?}");
}

/// An IK client that writes `data` on a new flow before the handshake; returns its handle.
fn connect_with_early_data(pair: &mut Pair, data: &[u8]) -> ConnectionHandle {
    let key = pair.server.public_key();
    let c = pair
        .client
        .connect(pair.now, SERVER.parse().unwrap(), Some(key))
        .unwrap();
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, data).unwrap();
    conn.finish(flow).unwrap();
    c
}

/// Reads the first flow the server's connection `s` accepted, whole.
fn read_first_flow(pair: &mut Pair, s: ConnectionHandle) -> Vec<u8> {
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).expect("a flow");
    let mut out = vec![0u8; 4096];
    let n = conn.read(id, &mut out).unwrap().unwrap();
    out.truncate(n);
    out
}

/// Runs the timers of both sides until nothing is left to do (bounded).
fn run_out(pair: &mut Pair) {
    for _ in 0..1000 {
        if !pair.advance() {
            return;
        }
    }
}

#[test]
fn a_replayed_initial_from_elsewhere_does_not_raise_the_budget_of_an_unvalidated_address() {
    // Found by fuzz/endpoint_handshake: an Initial routed to the connection by its original
    // DCID credited the handshake path's amplification budget wherever it came from.
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let initial = pair.client_sent[0].clone();
    let conn = pair.server.connection_mut(s).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &vec![7u8; 1 << 20]).unwrap();
    // A copy of the client's next packet moves the path to a victim's address.
    let client = pair.client.connection_mut(c).unwrap();
    let up = client.open_flow(Dir::Uni).unwrap();
    client.write(up, &[1u8; 100]).unwrap();
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let genuine = buf[..t.size].to_vec();
    let victim: SocketAddr = "192.0.2.66:5000".parse().unwrap();
    let mut copy = genuine.clone();
    pair.server.handle(pair.now, victim, None, &mut copy);
    // The attacker replays the recorded first Initial from its own address.
    let attacker: SocketAddr = "198.51.100.7:4000".parse().unwrap();
    for _ in 0..3 {
        let mut d = initial.clone();
        pair.server.handle(pair.now, attacker, None, &mut d);
    }
    let mut to_victim = 0;
    let end = pair.now + Duration::from_secs(5);
    loop {
        let mut out = Vec::new();
        while let Some(t) = pair.server.poll_transmit(pair.now, &mut out) {
            if t.destination == victim {
                to_victim += t.size;
            }
        }
        match pair.server.poll_timeout() {
            Some(t) if t < end => {
                pair.now = t;
                pair.server.handle_timeout(t);
            }
            _ => break,
        }
    }
    assert!(
        to_victim <= 3 * genuine.len(),
        "{to_victim} bytes to the victim for {} received from it",
        genuine.len()
    );
}

#[test]
fn a_first_flight_replayed_after_its_connection_ended_is_dropped() {
    let mut server = clocked(2, true);
    server.first_flight.trust_start = true;
    let mut pair = Pair::new(clocked(1, false), server);
    let c = connect_with_early_data(&mut pair, b"transfer 100 EUR");
    pair.exchange();
    let s = pair
        .server
        .accept()
        .expect("fresh first flight: accepted at once");
    assert_eq!(read_first_flow(&mut pair, s), b"transfer 100 EUR");
    let initial = pair.client_sent[0].clone();
    pair.client
        .connection_mut(c)
        .unwrap()
        .close(pair.now, 0, b"done");
    pair.exchange();
    run_out(&mut pair);
    Pair::events(&mut pair.server);
    assert_eq!(pair.server.connection_count(), 0, "freed");
    // An observer recorded the first datagram and sends it again, twice, within the window.
    pair.now += Duration::from_secs(2);
    for _ in 0..2 {
        let mut d = initial.clone();
        pair.server
            .handle(pair.now, CLIENT.parse().unwrap(), None, &mut d);
    }
    assert!(pair.server.accept().is_none(), "no connection for a replay");
    assert_eq!(pair.server.connection_count(), 0);
    assert_eq!(pair.server.half_open_count(), 0, "no state kept");
    assert_eq!(pair.server.stats().replayed_first_flights, 2);
    let mut buf = Vec::new();
    assert!(
        pair.server.poll_transmit(pair.now, &mut buf).is_none(),
        "no answer to a replay"
    );
}

#[test]
fn a_first_flight_replayed_to_a_restarted_server_is_never_announced() {
    // The recorded flight reaches a server that started after it was first seen: nothing
    // remembers it, so it cannot be proven fresh, and only a live client could go further.
    let mut pair = Pair::new(clocked(1, false), clocked(2, true));
    connect_with_early_data(&mut pair, b"open the door");
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let initial = buf[..t.size].to_vec();
    let mut restarted = clocked(2, true);
    restarted.first_flight.trust_start = false;
    let mut server = Endpoint::new(restarted, pair.now + Duration::from_millis(300));
    let at = pair.now + Duration::from_millis(400);
    let mut d = initial.clone();
    server.handle(at, CLIENT.parse().unwrap(), None, &mut d);
    assert_eq!(server.stats().unproven_first_flights, 1);
    assert_eq!(server.half_open_count(), 1, "a half-open handshake");
    assert!(server.accept().is_none(), "not handed to the application");
    assert!(
        server.poll_event().is_none(),
        "no event of a half-open handshake"
    );
    // Nobody answers its response; the handshake times out without a trace.
    let mut now = at;
    while let Some(t) = server.poll_timeout() {
        now = t;
        server.handle_timeout(now);
        let mut out = Vec::new();
        while server.poll_transmit(now, &mut out).is_some() {}
        while server.poll_event().is_some() {}
        if server.half_open_count() == 0 {
            break;
        }
    }
    assert!(
        now - at <= Duration::from_secs(11),
        "within the handshake timeout"
    );
    assert_eq!(server.half_open_count(), 0);
    assert_eq!(server.stats().half_open_expired, 1);
    assert!(server.accept().is_none());
}

#[test]
fn an_unproven_first_flight_connects_when_the_client_proves_it_is_live() {
    for (client, why) in [
        (config(1, false), "a client without a clock"),
        (
            {
                let mut c = clocked(1, false);
                c.wall_clock = Some(WALL_CLOCK - Duration::from_secs(3600));
                c
            },
            "a client an hour slow",
        ),
    ] {
        let mut server = clocked(2, true);
        server.first_flight.trust_start = true;
        let mut pair = Pair::new(client, server);
        let c = connect_with_early_data(&mut pair, b"hello");
        // The first flight alone is not enough.
        let mut buf = Vec::new();
        let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
        let mut d = buf[..t.size].to_vec();
        pair.server
            .handle(pair.now, CLIENT.parse().unwrap(), None, &mut d);
        assert!(pair.server.accept().is_none(), "{why}: held");
        assert_eq!(pair.server.stats().unproven_first_flights, 1, "{why}");
        // The client's first protected packet proves it holds the keys.
        pair.client_sent.push(d);
        pair.exchange();
        let s = pair.server.accept().expect("announced once live");
        assert_eq!(read_first_flow(&mut pair, s), b"hello", "{why}");
        let events = Pair::events(&mut pair.client);
        assert!(events.contains(&(c, Event::Connected)), "{why}: {events:?}");
        let server_events = Pair::events(&mut pair.server);
        assert_eq!(
            server_events
                .iter()
                .filter(|(h, e)| *h == s && *e == Event::Connected)
                .count(),
            1,
            "{why}: the held events are delivered once announced: {server_events:?}"
        );
    }
}

#[test]
fn a_spoofed_xx_initial_is_never_announced() {
    // XX's first message is not authenticated: anyone can send one from any address.
    let mut pair = Pair::new(config(1, false), config(2, true));
    pair.server_blackholed = true;
    pair.client
        .connect(pair.now, SERVER.parse().unwrap(), None)
        .unwrap();
    pair.exchange();
    assert_eq!(pair.server.half_open_count(), 1);
    assert!(pair.server.accept().is_none(), "not before message 3");
    assert_eq!(pair.server.connection_count(), 0);
}

#[test]
fn half_open_handshakes_are_bounded() {
    let mut server = config(2, true);
    server.max_half_open = 3;
    server.retry = RetryPolicy::Never;
    let mut pair = Pair::new(config(1, false), server);
    pair.server_blackholed = true;
    for _ in 0..5 {
        pair.client
            .connect(pair.now, SERVER.parse().unwrap(), None)
            .unwrap();
    }
    pair.exchange();
    assert_eq!(pair.server.half_open_count(), 3);
    assert_eq!(pair.server.stats().half_open_refused, 2);
}

#[test]
fn unproven_addresses_never_get_more_than_three_times_their_bytes() {
    // A spoofing attacker's traffic of every kind, with a Retry for every Initial: Initials
    // without and with forged tokens, Initials of an unknown version, short packets for
    // unknown connections. The server answers each with less than three times its size and
    // keeps no state.
    let mut server = config(2, true);
    server.retry = RetryPolicy::Always;
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut server = Endpoint::new(server, now);
    let mut client = Endpoint::new(config(1, false), now);
    let victim: SocketAddr = CLIENT.parse().unwrap();
    let (mut received, mut sent) = (0usize, 0usize);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..400 {
        let mut d = match i % 4 {
            0 | 1 => {
                // A genuine-looking Initial (a new client each time).
                client
                    .connect(now, SERVER.parse().unwrap(), Some(server.public_key()))
                    .unwrap();
                let mut buf = Vec::new();
                let t = client.poll_transmit(now, &mut buf).unwrap();
                let d = buf[..t.size].to_vec();
                if i % 4 == 1 {
                    // The same Initial with a forged token.
                    let p = tern_proto::wire::LongPacket::decode(&d).unwrap();
                    let token: Vec<u8> = (0..40).map(|_| next() as u8).collect();
                    let mut forged = Vec::new();
                    tern_proto::wire::encode_long_packet(
                        &mut forged,
                        p.ty,
                        tern_proto::wire::VERSION_1,
                        &p.dcid,
                        &p.scid,
                        &token,
                        p.payload,
                    );
                    forged.resize(d.len(), 0);
                    forged
                } else {
                    d
                }
            }
            2 => {
                // An unknown version: version negotiation.
                let mut d = vec![0u8; 1200];
                d[0] = 0xc0;
                d[1..5].copy_from_slice(&0x1a2a_3a4a_u32.to_be_bytes());
                d[5] = 8;
                d[14] = 8;
                d
            }
            _ => {
                // A short packet for no connection: a stateless reset.
                let len = 21 + (next() % 1400) as usize;
                let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                d[0] = 0x40 | (d[0] & 0x3f);
                d
            }
        };
        received += d.len();
        server.handle(now, victim, None, &mut d);
        let mut out = Vec::new();
        while let Some(t) = server.poll_transmit(now, &mut out) {
            assert_eq!(t.destination, victim);
            sent += t.size;
        }
    }
    let stats = server.stats();
    assert!(stats.retries_sent >= 100, "{stats:?}");
    assert!(stats.invalid_tokens >= 100, "forged tokens: {stats:?}");
    assert!(stats.resets_sent >= 50, "{stats:?}");
    assert!(stats.version_negotiations >= 50, "{stats:?}");
    assert_eq!(server.connection_count() + server.half_open_count(), 0);
    assert!(sent <= 3 * received, "sent {sent} for {received}");
}

#[test]
fn two_ends_without_state_cannot_loop_on_stateless_resets() {
    // Each reset is shorter than what triggered it, and nothing too short to be a packet is
    // answered: two endpoints that both lost their state stop within a few bounces.
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut a = Endpoint::new(config(1, true), now);
    let mut b = Endpoint::new(config(2, true), now);
    let (addr_a, addr_b): (SocketAddr, SocketAddr) =
        (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
    let mut d = vec![0x41u8; 1400];
    let mut bounces = 0;
    let mut to_b = true;
    loop {
        let (to, from) = if to_b {
            (&mut b, addr_a)
        } else {
            (&mut a, addr_b)
        };
        to.handle(now, from, None, &mut d);
        let mut out = Vec::new();
        let Some(t) = to.poll_transmit(now, &mut out) else {
            break;
        };
        assert!(t.size < d.len(), "a reset is shorter than its trigger");
        d = out[..t.size].to_vec();
        to_b = !to_b;
        bounces += 1;
        assert!(bounces < 40, "resets loop");
    }
    assert!(bounces >= 1);
}

#[test]
fn one_source_over_its_handshake_rate_gets_a_retry_then_a_refusal() {
    let mut server = config(2, true);
    server.handshakes_per_source = (1.0, 3.0);
    server.retry = RetryPolicy::Never;
    let mut pair = Pair::new(config(1, false), server);
    pair.server_blackholed = true;
    for _ in 0..5 {
        pair.client
            .connect(pair.now, SERVER.parse().unwrap(), None)
            .unwrap();
    }
    pair.exchange();
    let stats = pair.server.stats().clone();
    assert_eq!(pair.server.half_open_count(), 3, "the burst");
    assert_eq!(stats.rate_limited, 2, "{stats:?}");
    assert_eq!(stats.retries_sent, 2, "proof of address asked first");
}

/// The key phase bit of a short-header datagram (PROTOCOL.md §4.7).
fn key_phase(datagram: &[u8]) -> bool {
    datagram[0] & 0x04 != 0
}

#[test]
fn a_key_update_flips_the_phase_the_peer_follows_and_the_next_waits_for_an_ack() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &[1u8; 2000]).unwrap();
    pair.exchange();
    let mut sent = 2000;
    for generation in 1..=3u64 {
        // The server acknowledges data asking for it within 1 ms (its answer may carry the
        // ACK): let that ACK arrive.
        pair.now += Duration::from_millis(2);
        pair.server.handle_timeout(pair.now);
        pair.exchange();
        let now = pair.now;
        let conn = pair.client.connection_mut(c).unwrap();
        conn.initiate_key_update(now)
            .expect("the last update was acknowledged");
        assert_eq!(
            conn.initiate_key_update(now),
            Err(tern_proto::KeyUpdateError::Pending),
            "no second update before a packet under the new key is acknowledged"
        );
        conn.write(flow, &[1u8; 500]).unwrap();
        sent += 500;
        pair.now += Duration::from_millis(50);
        let before = pair.client_sent.len();
        pair.exchange();
        assert_eq!(
            key_phase(&pair.client_sent[before]),
            generation % 2 == 1,
            "K is the low bit of the generation"
        );
        let client = pair.client.connection(c).unwrap().stats();
        let server = pair.server.connection(s).unwrap().stats();
        assert_eq!(client.key_generation, generation, "{client:?}");
        assert_eq!(
            server.key_generation, generation,
            "the server's send key followed"
        );
        assert_eq!(client.key_updates_initiated, generation);
        assert_eq!(server.key_updates_received, generation);
        assert_eq!(server.key_updates_initiated, 0);
        assert_eq!(server.auth_failures, 0);
    }
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).unwrap();
    let mut buf = vec![0u8; 10_000];
    let n = conn.read(id, &mut buf).unwrap().unwrap();
    assert_eq!(n, sent);
}

#[test]
fn a_forged_packet_with_the_phase_flipped_changes_no_key() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &[7u8; 100]).unwrap();
    pair.now += Duration::from_millis(50);
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let fresh = buf[..t.size].to_vec();
    let from: SocketAddr = CLIENT.parse().unwrap();
    // K flipped, and K flipped with a later packet number: neither authenticates under the
    // next key, so neither rotates anything.
    for pn_bump in [0u8, 9] {
        let mut forged = fresh.clone();
        forged[0] ^= 0x04;
        forged[10] = forged[10].wrapping_add(pn_bump);
        pair.server.handle(pair.now, from, None, &mut forged);
    }
    let stats = pair.server.connection(s).unwrap().stats();
    assert_eq!(stats.auth_failures, 2, "{stats:?}");
    assert_eq!(
        (stats.key_generation, stats.key_updates_received),
        (0, 0),
        "{stats:?}"
    );
    let mut original = fresh;
    pair.server.handle(pair.now, from, None, &mut original);
    pair.exchange();
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).unwrap();
    let mut buf = vec![0u8; 1000];
    assert_eq!(conn.read(id, &mut buf).unwrap(), Some(100));
}

#[test]
fn the_integrity_limit_closes_the_connection_with_aead_limit_reached() {
    let mut server = config(2, true);
    server.connection.integrity_limit = 3;
    let mut pair = Pair::new(config(1, false), server);
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &[7u8; 100]).unwrap();
    pair.now += Duration::from_millis(50);
    let mut buf = Vec::new();
    let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
    let fresh = buf[..t.size].to_vec();
    let from: SocketAddr = CLIENT.parse().unwrap();
    for i in 0..3 {
        assert!(!pair.server.connection(s).unwrap().is_closed(), "{i}");
        let mut forged = fresh.clone();
        let n = forged.len();
        forged[n - 1 - i] ^= 1;
        pair.server.handle(pair.now, from, None, &mut forged);
    }
    let conn = pair.server.connection(s).unwrap();
    assert!(matches!(
        conn.close_reason(),
        Some(ConnectionError::AeadLimitReached { .. })
    ));
    pair.exchange();
    let reason = pair
        .client
        .connection(c)
        .and_then(|c| c.close_reason().cloned());
    assert!(
        matches!(
            reason,
            Some(ConnectionError::TransportError { code, .. })
                if code == tern_proto::wire::TransportErrorCode::AEAD_LIMIT_REACHED
        ),
        "{reason:?}"
    );
}

#[test]
fn a_packet_overtaken_by_an_update_opens_with_the_previous_key_until_it_is_discarded() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    // Two packets, the second asking for an ACK: with no answer to carry it, the ACK leaves
    // within 1 ms (§9.5), which allows an update.
    conn.write(flow, &[3u8; 2000]).unwrap();
    pair.exchange();
    pair.now += Duration::from_millis(1);
    pair.server.handle_timeout(pair.now);
    pair.exchange();
    // Two packets under generation 0, held back (reordered) while the update goes through.
    let mut held = Vec::new();
    for _ in 0..2 {
        let conn = pair.client.connection_mut(c).unwrap();
        conn.write(flow, &[3u8; 100]).unwrap();
        pair.now += Duration::from_millis(50);
        let mut buf = Vec::new();
        let t = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
        assert!(!key_phase(&buf[..t.size]));
        held.push(buf[..t.size].to_vec());
    }
    let now = pair.now;
    let conn = pair.client.connection_mut(c).unwrap();
    conn.initiate_key_update(now).unwrap();
    conn.write(flow, &[3u8; 100]).unwrap();
    pair.exchange();
    let stats = pair.server.connection(s).unwrap().stats();
    assert_eq!(stats.key_updates_received, 1, "{stats:?}");
    let from: SocketAddr = CLIENT.parse().unwrap();
    // Within 3 PTO the previous key opens the first; long after, the second is dropped
    // without decryption (not counted as a forgery).
    pair.server.handle(pair.now, from, None, &mut held[0]);
    pair.now += Duration::from_secs(5);
    pair.server.handle(pair.now, from, None, &mut held[1]);
    let stats = pair.server.connection(s).unwrap().stats();
    assert_eq!(stats.previous_key_opened, 1, "{stats:?}");
    assert_eq!(stats.unknown_phase_dropped, 1, "{stats:?}");
    assert_eq!(stats.auth_failures, 0, "{stats:?}");
    // The dropped packet's data is resent under the current key: everything arrives.
    for _ in 0..100 {
        if pair.server.connection(s).unwrap().recv_buffered() >= 2300 || !pair.advance() {
            break;
        }
    }
    let conn = pair.server.connection_mut(s).unwrap();
    let id = conn.accept_flow(Dir::Uni).unwrap();
    let mut buf = vec![0u8; 10_000];
    let n = conn.read(id, &mut buf).unwrap().unwrap();
    assert_eq!(&buf[..n], &[3u8; 2300][..]);
}

#[test]
fn a_fresh_first_flight_from_a_spoofed_source_is_not_accepted_by_default() {
    // Anyone who knows the server's public key can write a fresh IK first flight, from any
    // source address. By default `accept` waits until the client proves it is live.
    let mut server = clocked(2, true);
    server.first_flight.trust_start = true;
    let mut pair = Pair::new(clocked(1, false), server);
    pair.server_blackholed = true;
    connect_with_early_data(&mut pair, b"from nowhere");
    pair.exchange();
    assert!(pair.server.accept().is_none());
    assert_eq!(pair.server.half_open_count(), 1);
    run_out(&mut pair);
    while pair.server.poll_event().is_some() {}
    assert_eq!(pair.server.half_open_count(), 0, "expired");
    assert!(pair.server.accept().is_none());
}

#[test]
fn an_early_accepted_connection_whose_client_never_proves_itself_closes() {
    let mut server = clocked(2, true);
    server.first_flight.trust_start = true;
    server.early_accept = true;
    let mut pair = Pair::new(clocked(1, false), server);
    pair.server_blackholed = true;
    connect_with_early_data(&mut pair, b"from nowhere");
    pair.exchange();
    let s = pair.server.accept().expect("handed out early");
    assert_eq!(read_first_flow(&mut pair, s), b"from nowhere");
    assert_eq!(
        pair.server.half_open_count(),
        1,
        "still counted until proven"
    );
    run_out(&mut pair);
    let events = Pair::events(&mut pair.server);
    assert!(
        events.contains(&(s, Event::Closed(ConnectionError::HandshakeTimedOut))),
        "{events:?}"
    );
    assert_eq!(pair.server.half_open_count(), 0);
}

#[test]
fn stateless_resets_are_rate_limited() {
    let mut c = config(2, true);
    c.stateless_resets_per_second = (10.0, 20.0);
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut server = Endpoint::new(c, now);
    let mut sent = 0;
    for i in 0..100u8 {
        let mut d = vec![0x41u8; 100];
        d[1] = i;
        server.handle(now, CLIENT.parse().unwrap(), None, &mut d);
        let mut out = Vec::new();
        while server.poll_transmit(now, &mut out).is_some() {
            sent += 1;
        }
    }
    assert_eq!(sent, 20, "the burst");
    assert_eq!(server.stats().resets_suppressed, 80);
}

/// Servers that share a reset secret answer an unknown connection ID with a reset only if
/// the ID names them: otherwise another server's live ID would get its valid token back, and
/// with it anyone could reset that connection (found by an outside read).
#[test]
fn a_server_with_routable_ids_resets_only_its_own() {
    use tern_proto::lb::{QuicLb, RoutableCids};
    let lb = QuicLb::new(2, 3, 4, Some([9; 16])).unwrap();
    let ours = RoutableCids::new(lb.clone(), &[0xab, 0xcd, 0x01]).unwrap();
    let mut c = config(2, true);
    c.routable_cids = Some(ours);
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut server = Endpoint::new(c, now);
    for (server_id, answered) in [([0xab, 0xcd, 0x01], true), ([0xab, 0xcd, 0x02], false)] {
        let cid = lb.encode(&server_id, &[5, 6, 7, 8]).unwrap();
        let mut d = vec![0x41u8; 100];
        d[1..9].copy_from_slice(cid.as_bytes());
        server.handle(now, CLIENT.parse().unwrap(), None, &mut d);
        let mut out = Vec::new();
        let mut sent = 0;
        while server.poll_transmit(now, &mut out).is_some() {
            sent += 1;
        }
        assert_eq!(sent, usize::from(answered), "{server_id:?}");
    }
    assert_eq!(server.stats().resets_not_ours, 1);
}

#[test]
fn a_server_with_a_quic_lb_configuration_puts_its_server_id_in_every_connection_id() {
    use tern_proto::lb::{QuicLb, RoutableCids};
    let lb = QuicLb::new(2, 3, 4, Some([9; 16])).unwrap();
    let mut server = config(2, true);
    server.routable_cids = Some(RoutableCids::new(lb.clone(), &[0xab, 0xcd, 0x01]).unwrap());
    let mut pair = Pair::new(config(1, false), server);
    let (c, s) = connect(&mut pair, true);
    for _ in 0..20 {
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn.open_flow(Dir::Uni).unwrap();
        conn.write(flow, b"hello").unwrap();
        conn.finish(flow).unwrap();
        pair.exchange();
    }
    // Every datagram the client sent after the handshake is addressed by an ID from which a
    // balancer that has the key reads the server ID, and the nonces differ across
    // connections.
    let short: Vec<_> = pair
        .client_sent
        .iter()
        .filter(|d| d[0] & 0x80 == 0)
        .cloned()
        .collect();
    assert!(short.len() >= 20);
    for d in &short {
        assert_eq!(lb.server_id(&d[1..9]), Some(vec![0xab, 0xcd, 0x01]));
    }
    let first = lb.decode(&short[0][1..9]).unwrap().1;
    // A second connection to the same server: same server ID, another nonce.
    let (c2, _) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c2).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, b"again").unwrap();
    pair.exchange();
    let d = pair.client_sent.last().unwrap();
    assert_eq!(lb.server_id(&d[1..9]), Some(vec![0xab, 0xcd, 0x01]));
    assert_ne!(lb.decode(&d[1..9]).unwrap().1, first, "fresh nonce");
    // A balancer with another key reads nothing useful; one with no config reads nothing.
    let wrong = QuicLb::new(2, 3, 4, Some([8; 16])).unwrap();
    assert_ne!(
        wrong.server_id(&short[0][1..9]),
        Some(vec![0xab, 0xcd, 0x01])
    );
    assert!(pair.server.connection(s).is_some());
}

#[test]
fn workers_sharing_a_register_see_a_first_flight_replayed_to_the_other_as_replayed() {
    // Two endpoints with one identity (the worker threads of one server): the kernel may
    // hand a replay from another address to the other worker.
    let mut a = clocked(2, true);
    a.first_flight.trust_start = true;
    let register = a.first_flight.new_shared_register();
    a.first_flight.shared_register = Some(register.clone());
    let mut b = a.clone();
    b.rng_seed = [0x77; 32];
    let mut pair = Pair::new(clocked(1, false), a);
    connect_with_early_data(&mut pair, b"pay once");
    pair.exchange();
    assert!(pair.server.accept().is_some(), "fresh at worker a");
    let initial = pair.client_sent[0].clone();
    let mut worker_b = Endpoint::new(b, pair.now);
    let mut d = initial.clone();
    worker_b.handle(
        pair.now + Duration::from_millis(5),
        "203.0.113.9:7000".parse().unwrap(),
        None,
        &mut d,
    );
    assert_eq!(worker_b.stats().replayed_first_flights, 1);
    assert_eq!(worker_b.half_open_count(), 0, "no state for the replay");
    assert!(worker_b.accept().is_none());
    // Without the shared register the other worker would have taken it as fresh.
    let mut alone = clocked(2, true);
    alone.first_flight.trust_start = true;
    let mut worker_c = Endpoint::new(alone, pair.now);
    let mut d = initial;
    worker_c.handle(pair.now, "203.0.113.9:7000".parse().unwrap(), None, &mut d);
    assert_eq!(worker_c.stats().replayed_first_flights, 0);
}

#[test]
fn with_thousands_of_idle_connections_only_the_busy_one_is_polled_and_timers_still_fire() {
    // 3 000 connections, all idle but one: polling must not depend on the idle ones (the
    // endpoint keeps work queues and a timer heap), and every idle one still times out
    // when its idle timer comes (none is forgotten by the heap).
    let mut client = config(1, false);
    client.connection.idle_timeout = Duration::from_secs(30);
    let mut server = config(2, true);
    server.retry = RetryPolicy::Never;
    server.handshakes_per_source = (f64::INFINITY, f64::INFINITY);
    server.connection.idle_timeout = Duration::from_secs(30);
    let mut pair = Pair::new(client, server);
    let mut handles = Vec::new();
    for _ in 0..3000 {
        handles.push(connect(&mut pair, true));
    }
    Pair::events(&mut pair.client);
    Pair::events(&mut pair.server);
    // One connection moves 2 MB while the others sit idle.
    let (c, s) = handles[1234];
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    let data = vec![3u8; 2 << 20];
    let mut written = 0;
    let mut received = 0;
    let mut incoming = None;
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..100_000 {
        if written < data.len() {
            let conn = pair.client.connection_mut(c).unwrap();
            written += conn.write(flow, &data[written..]).unwrap_or(0);
            if written == data.len() {
                conn.finish(flow).unwrap();
            }
        }
        pair.exchange();
        let conn = pair.server.connection_mut(s).unwrap();
        if incoming.is_none() {
            incoming = conn.accept_flow(Dir::Uni);
        }
        while let Some(Ok(Some(n))) = incoming.map(|f| conn.read(f, &mut buf)) {
            if n == 0 {
                break;
            }
            received += n;
        }
        if received == data.len() {
            break;
        }
        if !pair.advance() {
            break;
        }
    }
    assert_eq!(received, data.len());
    // Then everyone falls silent: all 6 000 connection ends time out, the busy one too.
    run_out(&mut pair);
    let closed = |ep: &mut Endpoint| {
        Pair::events(ep)
            .into_iter()
            .filter(|(_, e)| matches!(e, Event::Closed(ConnectionError::TimedOut)))
            .count()
    };
    assert_eq!(closed(&mut pair.client), 3000);
    assert_eq!(closed(&mut pair.server), 3000);
    assert_eq!(pair.client.connection_count(), 0);
    assert_eq!(pair.server.connection_count(), 0);
}

/// `poll_transmit` appends one datagram to the caller's buffer, or nothing: the runtime writes
/// datagrams straight into a GSO batch, so a packet given up half built (here: sealing refused
/// at the confidentiality limit, then the close it causes) must leave no bytes behind.
#[test]
fn poll_transmit_appends_a_whole_datagram_or_nothing() {
    let mut client = config(1, false);
    client.connection.confidentiality_limit = 16;
    let mut pair = Pair::new(client, config(2, true));
    let (c, _s) = connect(&mut pair, true);
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &[7u8; 60_000]).unwrap();
    let mut buf = b"earlier datagrams".to_vec();
    let mut sent = 0;
    // Nothing is delivered: the sender goes on through probe timeouts (and one key update
    // if the handshake left a packet of the current key acknowledged) to the limit.
    for _ in 0..4000 {
        if pair.client.connection(c).is_none_or(|c| c.is_closed()) {
            break;
        }
        pair.now += Duration::from_millis(5);
        while let Some(t) = pair.client.poll_timeout() {
            if t > pair.now {
                break;
            }
            pair.client.handle_timeout(pair.now);
        }
        let before = buf.len();
        match pair.client.poll_transmit(pair.now, &mut buf) {
            Some(t) => {
                assert_eq!(buf.len(), before + t.size, "one whole datagram appended");
                sent += 1;
            }
            None => assert_eq!(buf.len(), before, "nothing appended"),
        }
    }
    assert!(sent > 0);
    assert!(pair.client.connection(c).is_none_or(|c| c.is_closed()));
}

/// Lets the handshake's acknowledgements and the sender's AckFrequency settle.
fn settle(pair: &mut Pair) {
    for _ in 0..3 {
        pair.now += Duration::from_millis(20);
        pair.client.handle_timeout(pair.now);
        pair.server.handle_timeout(pair.now);
        pair.exchange();
    }
}

/// Ten requests of `size` bytes, each echoed by the server as its reply, the application
/// thinking 200 µs between them (well within the ACK's response window). Returns the
/// datagrams each end sent meanwhile.
fn echo_requests(
    pair: &mut Pair,
    c: ConnectionHandle,
    s: ConnectionHandle,
    size: usize,
) -> (usize, usize) {
    use tern_proto::message::MessageOptions;
    let (client_before, server_before) = (pair.client_sent.len(), pair.server_sent.len());
    for i in 0..10u8 {
        let now = pair.now;
        let conn = pair.client.connection_mut(c).unwrap();
        let request = bytes::Bytes::from(vec![i; size]);
        conn.send_message(now, request, MessageOptions::default())
            .unwrap();
        pair.exchange();
        let conn = pair.server.connection_mut(s).unwrap();
        let request = conn.recv_message().expect("the request arrived");
        assert_eq!((request.data.len(), request.data[0]), (size, i));
        let opts = MessageOptions::default().reply_to(request.id);
        conn.send_message(now, request.data, opts).unwrap();
        pair.exchange();
        let conn = pair.client.connection_mut(c).unwrap();
        assert_eq!(conn.recv_message().expect("the reply arrived").data[0], i);
        pair.now += Duration::from_micros(200);
    }
    (
        pair.client_sent.len() - client_before,
        pair.server_sent.len() - server_before,
    )
}

#[test]
fn a_request_and_its_reply_cost_one_datagram_each_way() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    // Past the handshake and its acknowledgements; the sender asks for an ACK per several
    // packets, so the last packet of each message carries an AckRequest.
    settle(&mut pair);
    assert_eq!(
        echo_requests(&mut pair, c, s, 64),
        (10, 10),
        "each message carries the ACK of the one before; no ACK-only datagram"
    );
    let stats = pair.server.connection(s).unwrap().stats();
    assert!(stats.ack_threshold_requested > 2, "{stats:?}");
}

#[test]
fn a_request_of_several_packets_and_its_reply_send_no_ack_only_datagram() {
    // With an ACK every 2 packets (the default before any AckFrequency, and the only one
    // with `max_ack_threshold` 2) the request's packets used to reach the threshold and get
    // an ACK-only datagram before the reply could carry the ACK (§9.5, §11.1).
    for threshold in [2, 10] {
        let mut client = config(1, false);
        client.connection.max_ack_threshold = threshold;
        let mut server = config(2, true);
        server.connection.max_ack_threshold = threshold;
        let mut pair = Pair::new(client, server);
        let (c, s) = connect(&mut pair, true);
        settle(&mut pair);
        let acks_only = |pair: &Pair| {
            (
                pair.client.connection(c).unwrap().stats().ack_only_sent,
                pair.server.connection(s).unwrap().stats().ack_only_sent,
            )
        };
        let before = acks_only(&pair);
        let sent = echo_requests(&mut pair, c, s, 4_000);
        assert!(
            sent.0 >= 30 && sent.1 >= 30,
            "several packets a message: {sent:?}"
        );
        assert_eq!(
            acks_only(&pair),
            before,
            "threshold {threshold}: every ACK rode on a message ({sent:?} datagrams)"
        );
    }
}

#[test]
fn a_connection_that_sends_only_datagrams_searches_its_path_mtu() {
    // The library's default ceiling; the pair has no MTU of its own, so the first probe (the
    // ceiling) is acknowledged.
    let mut client = config(1, false);
    client.connection.max_pmtu = tern_proto::ConnectionConfig::default().max_pmtu;
    let mut pair = Pair::new(client, config(2, true));
    let (c, _) = connect(&mut pair, true);
    for _ in 0..20 {
        let conn = pair.client.connection_mut(c).unwrap();
        conn.send_datagram(bytes::Bytes::from_static(b"a video frame"))
            .unwrap();
        pair.now += Duration::from_millis(5);
        pair.client.handle_timeout(pair.now);
        pair.server.handle_timeout(pair.now);
        pair.exchange();
    }
    let stats = pair.client.connection(c).unwrap().stats();
    assert!(stats.pmtu_probes_sent >= 1, "{stats:?}");
    assert_eq!(stats.max_datagram_size, 8972, "{stats:?}");
}

/// A controller with a window of two datagrams and a fixed pacing rate: ACK-clocked pairs
/// until the pacer's bucket runs dry, then the pacer decides.
#[derive(Debug)]
struct PairsThenPacer;

const PAIRS_MDS: u64 = 1452;

impl tern_proto::cc::Controller for PairsThenPacer {
    fn window(&self) -> u64 {
        2 * PAIRS_MDS
    }
    fn pacing_rate(&self, _: &tern_proto::cc::RttEstimator) -> Option<u64> {
        Some(1_000_000)
    }
    fn initial_window(&self) -> u64 {
        self.window()
    }
    fn metrics(&self) -> tern_proto::cc::Metrics {
        tern_proto::cc::Metrics::new(self.window())
    }
    fn name(&self) -> &'static str {
        "pairs-then-pacer"
    }
}

impl tern_proto::cc::ControllerFactory for PairsThenPacer {
    fn build(
        &self,
        _: Instant,
        _: &tern_proto::cc::PathInfo,
    ) -> Box<dyn tern_proto::cc::Controller> {
        Box::new(PairsThenPacer)
    }
}

/// One pass of `from` in the runtime driver's order (its expired timers, then every datagram
/// it has, each handed to `to` at once). Returns whether it sent anything.
fn driver_pass(
    from: &mut Endpoint,
    to: &mut Endpoint,
    now: Instant,
    from_addr: SocketAddr,
) -> bool {
    if from.poll_timeout().is_some_and(|t| t <= now) {
        from.handle_timeout(now);
    }
    let mut sent = false;
    let mut buf = Vec::new();
    while let Some(t) = from.poll_transmit(now, &mut buf) {
        let mut d = buf[buf.len() - t.size..].to_vec();
        to.handle(now, from_addr, None, &mut d);
        sent = true;
    }
    sent
}

#[test]
fn a_sender_held_back_by_its_pacer_with_nothing_in_flight_wakes_when_the_pacer_allows() {
    // Driven in the runtime driver's order: a datagram arrives (here an ACK of everything in
    // flight), the endpoint's next deadline is read, then it is asked for datagrams. The
    // window has room again but the pacer says "not yet": that sets a deadline inside the
    // connection, which the endpoint must see, or the sender sleeps until its idle timeout
    // (the stall `tern perf --cc udt` hit on loopback with 8 972-byte packets).
    let mut client = config(1, false);
    client.connection.congestion = std::sync::Arc::new(PairsThenPacer);
    let mut pair = Pair::new(client, config(2, true));
    let (c, s) = connect(&mut pair, true);
    const SIZE: usize = 100_000;
    let conn = pair.client.connection_mut(c).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    assert_eq!(conn.write(flow, &[7u8; SIZE]).unwrap(), SIZE);
    conn.finish(flow).unwrap();
    let (caddr, saddr): (SocketAddr, SocketAddr) =
        (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
    let start = pair.now;
    let mut received = 0;
    let mut server_flow = None;
    let mut out = vec![0u8; 65536];
    while received < SIZE && pair.now < start + Duration::from_secs(5) {
        // One round per side: timers, then datagrams, each delivered at once.
        let mut progress = true;
        while progress {
            progress = false;
            progress |= driver_pass(&mut pair.client, &mut pair.server, pair.now, caddr);
            let endpoint_deadline = pair.client.poll_timeout();
            let conn = pair.client.connection(c).unwrap();
            assert_eq!(
                endpoint_deadline,
                conn.poll_timeout(),
                "the endpoint's deadline is its connection's ({} bytes in flight)",
                conn.stats().bytes_in_flight
            );
            progress |= driver_pass(&mut pair.server, &mut pair.client, pair.now, saddr);
            let conn = pair.server.connection_mut(s).unwrap();
            let id = match server_flow {
                Some(id) => Some(id),
                None => conn.accept_flow(Dir::Uni),
            };
            server_flow = id;
            if let Some(id) = id {
                while let Ok(Some(n)) = conn.read(id, &mut out) {
                    if n == 0 {
                        break;
                    }
                    received += n;
                }
            }
        }
        if received == SIZE {
            // Done at `pair.now`; the next timer may be the idle timeout.
            break;
        }
        let next = [pair.client.poll_timeout(), pair.server.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("a timer");
        pair.now = pair.now.max(next);
    }
    assert_eq!(received, SIZE, "after {:?}", pair.now - start);
    // 100 kB at 1 MB/s: about 0.1 s, nowhere near the idle timeout.
    assert!(
        pair.now - start < Duration::from_secs(1),
        "{:?}",
        pair.now - start
    );
    let stats = pair.client.connection(c).unwrap().stats();
    assert_eq!(stats.packets_lost, 0, "{stats:?}");
}

#[test]
fn may_have_events_tells_a_touch_from_an_event() {
    // The runtime's inline sender skips waking its driver when nothing is left for it: an
    // application command touches its connection, which alone is not an event.
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    Pair::events(&mut pair.client);
    Pair::events(&mut pair.server);
    assert!(!pair.client.may_have_events());
    // A command that raises no event.
    let flow = pair
        .client
        .connection_mut(c)
        .unwrap()
        .open_flow(Dir::Bi)
        .unwrap();
    let conn = pair.client.connection_mut(c).unwrap();
    assert_eq!(conn.write(flow, b"hello").unwrap(), 5);
    assert!(!pair.client.may_have_events(), "a touch is not an event");
    // The server hears of the flow: an event.
    pair.exchange();
    assert!(pair.server.may_have_events());
    assert!(!Pair::events(&mut pair.server).is_empty());
    assert!(!pair.server.may_have_events());
    // Closing raises one on the closing side.
    pair.server
        .connection_mut(s)
        .unwrap()
        .close(pair.now, 0, b"bye");
    assert!(pair.server.may_have_events());
}

#[test]
fn handshakes_prepared_ahead_complete_and_each_uses_what_was_made_for_it() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    for round in 0..3 {
        // The client has not connected to this server before the first round: its
        // ephemeral key is made ahead, and from the second round its `es` too.
        assert!(pair.client.prepare_handshake(), "round {round}");
        assert!(pair.server.prepare_handshake(), "round {round}");
        // One handshake ahead at most.
        assert!(!pair.client.prepare_handshake() && !pair.server.prepare_handshake());
        let (c, s) = connect(&mut pair, round != 1);
        assert!(pair.client.connection(c).unwrap().is_established());
        assert!(pair.server.connection(s).unwrap().is_established());
        assert_eq!(
            pair.client.connection(c).unwrap().peer_key(),
            Some(pair.server.public_key())
        );
    }
}

/// An IK server's first RTT sample is its response's round trip (PROTOCOL.md §7.4), before
/// any data: the client answers message 2 at once with its packet number 0. A response sent
/// twice gives none (Karn), nor does a later answer (the first lost: the resend carries the
/// client's timer), nor XX's message 3 (a resent one cannot be told apart).
#[test]
fn the_server_measures_its_first_rtt_from_its_response() {
    for (ik, lose_response, lose_answer) in [
        (true, false, false),
        (true, true, false),
        (true, false, true),
        (false, false, false),
    ] {
        let mut pair = Pair::new(config(1, false), config(2, true));
        let (c, s): (SocketAddr, SocketAddr) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
        let one_way = Duration::from_millis(20);
        let key = ik.then(|| pair.server.public_key());
        pair.client.connect(pair.now, s, key).unwrap();
        let mut buf = Vec::new();
        let initial = pair.client.poll_transmit(pair.now, &mut buf).unwrap();
        let mut d = buf[..initial.size].to_vec();
        let mut now = pair.now + one_way;
        pair.server.handle(now, c, None, &mut d);
        buf.clear();
        let t = pair
            .server
            .poll_transmit(now, &mut buf)
            .expect("the response");
        if lose_response {
            now = pair.server.poll_timeout().expect("the response's timer");
            pair.server.handle_timeout(now);
            buf.clear();
            pair.server
                .poll_transmit(now, &mut buf)
                .expect("the response again");
        }
        let mut response = buf[buf.len() - t.size..].to_vec();
        now += one_way;
        pair.client.handle(now, s, None, &mut response);
        let mut answers = Vec::new();
        buf.clear();
        while let Some(t) = pair.client.poll_transmit(now, &mut buf) {
            answers.push(buf[buf.len() - t.size..].to_vec());
        }
        if lose_answer {
            // Lost: the client says it again when its probe timer fires.
            now = pair.client.poll_timeout().expect("the client's timer");
            pair.client.handle_timeout(now);
            answers.clear();
            buf.clear();
            while let Some(t) = pair.client.poll_transmit(now, &mut buf) {
                answers.push(buf[buf.len() - t.size..].to_vec());
            }
            assert!(!answers.is_empty(), "the client answers again");
        }
        now += one_way;
        for mut a in answers {
            pair.server.handle(now, c, None, &mut a);
        }
        let h = pair.server.accept().expect("the client proved it is live");
        let rtt = pair.server.connection(h).unwrap().stats().min_rtt;
        if ik && !lose_response && !lose_answer {
            assert_eq!(rtt, 2 * one_way);
        } else {
            assert_eq!(
                rtt,
                Duration::ZERO,
                "ik {ik}, response lost {lose_response}, answer lost {lose_answer}: {rtt:?}"
            );
        }
    }
}

/// A pair whose server answers handshake trains and whose client asks for one if `asked`,
/// with the client's connect made (nothing sent yet): the pair, the client's and the
/// server's addresses, and the time of the connect.
fn handshake_train_pair(asked: bool) -> (Pair, SocketAddr, SocketAddr, Instant) {
    let mut client_cfg = config(1, false);
    client_cfg.connection.handshake_train = asked;
    let mut server_cfg = config(2, true);
    server_cfg.connection.handshake_train = true;
    let mut pair = Pair::new(client_cfg, server_cfg);
    let (c, s): (SocketAddr, SocketAddr) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
    let t0 = pair.now;
    pair.client
        .connect(t0, s, Some(pair.server.public_key()))
        .unwrap();
    (pair, c, s, t0)
}

/// A client that asks for a handshake probe train (`handshake_train`, PROTOCOL.md §4.3, §11.10) pads
/// its first flight; the server sends a whole train of full-size packets right behind its
/// response, within three times what it received, and the client's first packets report the
/// rate the train's arrivals show. A client that does not pad gets no train, and padding that
/// reaches a server before any Initial (or from another address) changes nothing.
#[test]
fn a_padded_first_flight_buys_a_handshake_train() {
    for asked in [true, false] {
        let (mut pair, c, s, t0) = handshake_train_pair(asked);
        let one_way = Duration::from_millis(20);
        let mut out = Vec::new();
        let mut first_flight = Vec::new();
        while let Some(t) = pair.client.poll_transmit(t0, &mut out) {
            first_flight.push(out[out.len() - t.size..].to_vec());
        }
        let padding = &first_flight[1..];
        if asked {
            assert_eq!(padding.len(), 4, "Initial and padding, 1 452 bytes each");
            for p in padding {
                assert!(p.len() >= 1200 && p[0] & 0xb0 == 0x80, "a padding Initial");
            }
            // Padding ahead of its Initial, or from elsewhere, finds no handshake to raise.
            let other: SocketAddr = "192.0.2.99:4433".parse().unwrap();
            pair.server.handle(t0, other, None, &mut padding[0].clone());
            pair.server.handle(t0, c, None, &mut padding[0].clone());
            assert_eq!(pair.server.stats().unroutable, 2);
        } else {
            assert!(padding.is_empty(), "no padding unless asked");
        }
        let t1 = t0 + one_way;
        for d in &first_flight {
            pair.server.handle(t1, c, None, &mut d.clone());
        }
        let mut flight = Vec::new();
        out.clear();
        while let Some(t) = pair.server.poll_transmit(t1, &mut out) {
            flight.push(out[out.len() - t.size..].to_vec());
        }
        let short = |d: &Vec<u8>| d[0] & 0x80 == 0;
        assert!(!short(&flight[0]), "the response goes first");
        let received: usize = first_flight.iter().map(Vec::len).sum();
        let sent: usize = flight.iter().map(Vec::len).sum();
        assert!(sent <= 3 * received, "{sent} bytes sent for {received}");
        let train = &flight[1..];
        if !asked {
            assert!(train.is_empty(), "no train without the client's padding");
            continue;
        }
        assert_eq!(train.len(), 10, "a whole train");
        assert!(train.iter().all(|p| short(p) && p.len() == train[0].len()));
        // 1 452-byte packets 232 µs apart: 50 Mbit/s.
        let t2 = t1 + one_way;
        pair.client.handle(t2, s, None, &mut flight[0].clone());
        for (k, p) in train.iter().enumerate() {
            let arrived = t2 + Duration::from_micros(232 * (k as u64 + 1));
            pair.client.handle(arrived, s, None, &mut p.clone());
        }
        let t3 = t2 + Duration::from_millis(3);
        let t4 = t3 + one_way;
        pair.client_to_server(t3, t4);
        let h = pair.server.accept().expect("the client proved it is live");
        let stats = pair.server.connection(h).unwrap().stats();
        assert_eq!(stats.probe_trains_sent, 1);
        assert_eq!(stats.rate_estimates, 1);
        let error = (stats.rate_estimate as f64 * 8.0 - 50e6).abs() / 50e6;
        assert!(error <= 0.1, "estimate {} B/s", stats.rate_estimate);
    }
}

/// The response lost, the handshake train behind it arrives first: the client keeps the
/// train's packets with their arrival times until the resent response gives it the keys, then
/// reports the rate they show; the server takes no RTT sample from the train (Karn).
#[test]
fn a_handshake_train_that_overtakes_a_lost_response_is_kept_and_timed() {
    let (mut pair, c, s, t0) = handshake_train_pair(true);
    let one_way = Duration::from_millis(20);
    let mut out = Vec::new();
    let t1 = t0 + one_way;
    while let Some(t) = pair.client.poll_transmit(t0, &mut out) {
        let mut d = out[out.len() - t.size..].to_vec();
        pair.server.handle(t1, c, None, &mut d);
    }
    let mut flight = Vec::new();
    out.clear();
    while let Some(t) = pair.server.poll_transmit(t1, &mut out) {
        flight.push(out[out.len() - t.size..].to_vec());
    }
    assert_eq!(flight.len(), 11, "the response and a train of ten");
    // The response is lost; the train arrives, 232 µs apart (50 Mbit/s).
    let t2 = t1 + one_way;
    for (k, p) in flight[1..].iter().enumerate() {
        let arrived = t2 + Duration::from_micros(232 * (k as u64 + 1));
        pair.client.handle(arrived, s, None, &mut p.clone());
    }
    let resend_at = pair.server.poll_timeout().expect("the response's timer");
    pair.server.handle_timeout(resend_at);
    out.clear();
    let t = pair
        .server
        .poll_transmit(resend_at, &mut out)
        .expect("the response again");
    let mut response = out[out.len() - t.size..].to_vec();
    assert!(
        pair.server.poll_transmit(resend_at, &mut out).is_none(),
        "no second train"
    );
    let t3 = resend_at + one_way;
    pair.client.handle(t3, s, None, &mut response);
    let t4 = t3 + one_way;
    pair.client_to_server(t3, t4);
    let h = pair.server.accept().expect("the client proved it is live");
    let stats = pair.server.connection(h).unwrap().stats();
    assert_eq!((stats.probe_trains_sent, stats.rate_estimates), (1, 1));
    let error = (stats.rate_estimate as f64 * 8.0 - 50e6).abs() / 50e6;
    assert!(error <= 0.1, "estimate {} B/s", stats.rate_estimate);
    // The train left before the response was resent: which copy let the client open it is
    // unknown, so its acknowledgements are no RTT sample (measured from the first copy they
    // would add the resend timeout, from the second a crossing resend would read short).
    assert_eq!(
        stats.min_rtt,
        Duration::ZERO,
        "no RTT sample from the train (response resent after {:?})",
        resend_at - t1
    );
}

/// The largest message a peer accepts always starts, whatever came before it: a receiver
/// raises its connection limit only every half window, so after a small message has been
/// read the sender may hold just over half a window of credit (found by an outside read: the
/// cap was the whole window less the overhead, and such a message waited for good).
#[test]
fn the_largest_message_starts_after_others_were_read() {
    use tern_proto::message::{MessageOptions, SendMessageError};
    let mut client_cfg = config(1, false);
    client_cfg.connection.flows.connection_window = 64 * 1024;
    let mut server_cfg = config(2, true);
    server_cfg.connection.flows.connection_window = 64 * 1024;
    let mut pair = Pair::new(client_cfg, server_cfg);
    let (c, s) = connect(&mut pair, true);
    let now = pair.now;
    let conn = pair.client.connection_mut(c).unwrap();
    conn.send_message(
        now,
        bytes::Bytes::from_static(b"x"),
        MessageOptions::default(),
    )
    .unwrap();
    pair.exchange();
    assert!(pair
        .server
        .connection_mut(s)
        .unwrap()
        .recv_message()
        .is_some());
    pair.exchange();
    // Find the largest size the sender accepts, and send it.
    let conn = pair.client.connection_mut(c).unwrap();
    let max = match conn.send_message(now, vec![0; 64 * 1024].into(), MessageOptions::default()) {
        Err(SendMessageError::TooLarge { max, .. }) => max as usize,
        other => panic!("a whole window is too large: {other:?}"),
    };
    assert!(max >= 30_000, "{max}");
    conn.send_message(now, vec![5; max].into(), MessageOptions::default())
        .unwrap();
    for _ in 0..20 {
        pair.exchange();
        if !pair.advance() {
            break;
        }
    }
    let m = pair.server.connection_mut(s).unwrap().recv_message();
    assert_eq!(
        m.map(|m| m.data.len()),
        Some(max),
        "the largest message arrived"
    );
}

/// A flow the application stopped is dropped once its final size is known (a FIN, or the
/// peer's ResetFlow answering the StopSending), so the peer may open another in its place:
/// before, such flows stayed until read, which nobody does, and the peer's `open_flow`
/// stayed blocked after `max_concurrent_uni` of them.
#[test]
fn stopped_flows_free_their_slots_for_the_peer() {
    let mut pair = pair_with_uni_limit(4);
    let (c, s) = connect(&mut pair, true);
    for i in 0..12u8 {
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn
            .open_flow(Dir::Uni)
            .unwrap_or_else(|e| panic!("flow {i}: {e:?}"));
        conn.write(flow, &[i; 3000]).unwrap();
        if i % 2 == 0 {
            // Half finish before the stop arrives, half are reset in answer to it.
            conn.finish(flow).unwrap();
        }
        pair.exchange();
        for _ in 0..5 {
            if pair.server.connection(s).unwrap().stats().bytes_received > 3000 * (u64::from(i) + 1)
            {
                break;
            }
            pair.advance();
        }
        let conn = pair.server.connection_mut(s).unwrap();
        let got = conn.accept_flow(Dir::Uni).unwrap_or_else(|| {
            panic!(
                "flow {i} ({flow:?}): the peer's flow; server {:?}; client {:?}",
                conn.stats(),
                Pair::events(&mut pair.client)
            )
        });
        conn.stop_flow(got, 7).unwrap();
        pair.exchange();
    }
}

/// With half its flow slots held by long-lived flows, a peer that opens and finishes short
/// flows one after another keeps getting slots (found by an outside read: MaxFlows was sent
/// only once the freed slots made half the concurrency beyond the flows the peer had opened,
/// which they never did, and the peer could open no flow again).
#[test]
fn long_lived_flows_do_not_stall_the_peers_new_ones() {
    let mut pair = pair_with_uni_limit(4);
    let (c, s) = connect(&mut pair, true);
    for _ in 0..2 {
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn.open_flow(Dir::Uni).unwrap();
        conn.write(flow, b"long-lived").unwrap();
    }
    pair.exchange();
    for i in 0..10u8 {
        let conn = pair.client.connection_mut(c).unwrap();
        let flow = conn
            .open_flow(Dir::Uni)
            .unwrap_or_else(|e| panic!("short flow {i}: {e:?}"));
        conn.write(flow, &[i; 100]).unwrap();
        conn.finish(flow).unwrap();
        pair.exchange();
        let conn = pair.server.connection_mut(s).unwrap();
        while let Some(got) = conn.accept_flow(Dir::Uni) {
            let mut buf = [0; 200];
            while let Ok(Some(_)) = conn.read(got, &mut buf) {}
        }
        pair.exchange();
    }
}

/// A message whose last fragment arrives after its deadline, in a datagram read before the
/// receiver's expiry timer fired, is dropped as the timer would have dropped it: whether a
/// runtime reads datagrams or fires timers first must not decide delivery (found by an
/// outside read: it was delivered late).
#[test]
fn a_message_completed_after_its_deadline_is_not_delivered() {
    use tern_proto::message::MessageOptions;
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let send = |pair: &mut Pair, deadline_ms: u64| {
        let now = pair.now;
        let mut opts = MessageOptions::default();
        opts.ordered = false;
        opts.deadline = Some(Duration::from_millis(deadline_ms));
        let conn = pair.client.connection_mut(c).unwrap();
        conn.send_message(now, vec![9; 3000].into(), opts).unwrap();
        let mut buf = Vec::new();
        let mut sent = Vec::new();
        while let Some(t) = pair.client.poll_transmit(now, &mut buf) {
            sent.push(buf[buf.len() - t.size..].to_vec());
        }
        assert!(sent.len() >= 2, "a 3 000-byte message takes two packets");
        sent
    };
    let client: SocketAddr = CLIENT.parse().unwrap();
    for (deadline_ms, delivered) in [(2_000, true), (50, false)] {
        let _ = Pair::events(&mut pair.server);
        let mut sent = send(&mut pair, deadline_ms);
        let last = sent.pop().unwrap();
        for mut d in sent {
            pair.server.handle(pair.now, client, None, &mut d);
        }
        // 200 ms later, before any timer of the server's runs.
        pair.now += Duration::from_millis(200);
        pair.server
            .handle(pair.now, client, None, &mut last.clone());
        let conn = pair.server.connection_mut(s).unwrap();
        assert_eq!(
            conn.recv_message().is_some(),
            delivered,
            "deadline {deadline_ms} ms"
        );
        let expired = Pair::events(&mut pair.server).into_iter().any(|(_, e)| {
            matches!(
                e,
                Event::MessageExpired {
                    by_sender: false,
                    ..
                }
            )
        });
        assert_eq!(expired, !delivered, "deadline {deadline_ms} ms");
        pair.exchange();
    }
}

/// Only a path's newest packet moves it to another peer address (RFC 9000 §9.3): a packet
/// held back from before the peer moved, arriving after the move, leaves the path where it
/// is (before, it moved the path back, restarting its state and validation; found by an
/// outside read).
#[test]
fn a_late_packet_from_the_old_address_does_not_move_the_path_back() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let now = pair.now;
    let mut sent = Vec::new();
    for i in 0..2u8 {
        let conn = pair.client.connection_mut(c).unwrap();
        conn.send_datagram(vec![i; 100].into()).unwrap();
        let mut buf = Vec::new();
        while let Some(t) = pair.client.poll_transmit(now, &mut buf) {
            sent.push(buf[buf.len() - t.size..].to_vec());
        }
    }
    assert_eq!(sent.len(), 2);
    let old: SocketAddr = CLIENT.parse().unwrap();
    let moved: SocketAddr = "127.0.0.9:6000".parse().unwrap();
    let mut second = sent.pop().unwrap();
    let mut first = sent.pop().unwrap();
    pair.server.handle(now, moved, None, &mut second);
    let remote = |pair: &Pair| pair.server.connection(s).unwrap().remote_address();
    assert_eq!(remote(&pair), moved, "the newest packet moves the path");
    pair.server.handle(now, old, None, &mut first);
    assert_eq!(remote(&pair), moved, "a late one does not move it back");
    let server = pair.server.connection_mut(s).unwrap();
    let got: Vec<u8> = std::iter::from_fn(|| server.recv_datagram())
        .map(|d| d[0])
        .collect();
    assert_eq!(got, vec![1, 0], "both were taken");
}

/// A receive-only client behind a NAT whose port changes (rebinding, the client unaware):
/// its first packet from the new port is an ACK of some 40 bytes, which leaves the server a
/// budget of three times that toward the unproven address. The server still challenges it
/// (unpadded, within the budget); the answer validates the address and the download goes on
/// (before, nothing under 200 bytes was sent, and the connection waited for the client to
/// say more, which a receiver with nothing in flight never does; found by an outside read).
#[test]
fn a_download_survives_a_nat_rebinding_announced_by_an_ack_alone() {
    let mut pair = Pair::new(config(1, false), config(2, true));
    let (c, s) = connect(&mut pair, true);
    let total = 300_000usize;
    let conn = pair.server.connection_mut(s).unwrap();
    let flow = conn.open_flow(Dir::Uni).unwrap();
    conn.write(flow, &vec![7u8; total]).unwrap();
    conn.finish(flow).unwrap();
    // Some of it arrives, then the client's NAT picks a new port.
    let now = pair.now;
    let mut buf = Vec::new();
    let server: SocketAddr = SERVER.parse().unwrap();
    for _ in 0..5 {
        if let Some(t) = pair.server.poll_transmit(now, &mut buf) {
            let mut d = buf[buf.len() - t.size..].to_vec();
            pair.client.handle(now, server, None, &mut d);
        }
    }
    let rebound: SocketAddr = "127.0.0.1:6001".parse().unwrap();
    pair.now += Duration::from_millis(30);
    pair.client.handle_timeout(pair.now);
    let mut acks = Vec::new();
    while let Some(t) = pair.client.poll_transmit(pair.now, &mut buf) {
        acks.push(buf[buf.len() - t.size..].to_vec());
    }
    assert!(!acks.is_empty(), "the client acknowledges");
    assert!(
        acks.iter().all(|a| a.len() < 100),
        "ACK-only: {:?}",
        acks.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for mut a in acks {
        pair.server.handle(pair.now, rebound, None, &mut a);
    }
    // From now on the client's datagrams come from the new port.
    let mut received = 0usize;
    for _ in 0..400 {
        let mut progress = false;
        let now = pair.now;
        while let Some(t) = pair.server.poll_transmit(now, &mut buf) {
            let mut d = buf[buf.len() - t.size..].to_vec();
            pair.client.handle(now, server, None, &mut d);
            progress = true;
        }
        while let Some(t) = pair.client.poll_transmit(now, &mut buf) {
            let mut d = buf[buf.len() - t.size..].to_vec();
            pair.server.handle(now, rebound, None, &mut d);
            progress = true;
        }
        let conn = pair.client.connection_mut(c).unwrap();
        let mut chunk = [0u8; 65536];
        while let Ok(Some(n)) = conn.read(flow, &mut chunk) {
            received += n;
        }
        if received == total {
            break;
        }
        if !progress {
            let next = [pair.client.poll_timeout(), pair.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = next else { break };
            pair.now = pair.now.max(t);
            pair.client.handle_timeout(pair.now);
            pair.server.handle_timeout(pair.now);
        }
    }
    assert_eq!(received, total, "the download went on after the rebinding");
    let path = &pair.server.connection(s).unwrap().path_stats()[0];
    assert_eq!(path.remote, rebound);
    assert!(path.validated);
}
