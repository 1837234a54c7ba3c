//! The connection's side of the handshake (docs/PROTOCOL.md §7): building and resending the
//! handshake flights, reading the peer's, and switching to packet protection.
//!
//! Client, IK: Initial(msg1: params + first-flight frames) → Handshake(msg2: params) — done.
//! Client, XX: Initial(msg1: params) → Handshake(msg2) → Handshake(msg3) — done when the first
//! protected packet from the server arrives. A lost flight is resent on a timer with
//! exponential backoff; a duplicate of the peer's previous flight also triggers a resend.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Announce, Connection, State};
use crate::crypto::{Handshake, HandshakePattern};
use crate::error::ConnectionError;
use crate::event::Event;

use crate::wire::{
    self, ConnectionId, TransportErrorCode, TransportParams, WriteExt, RESET_TOKEN_LEN,
};
use crate::Side;

/// First byte of an Initial payload: which Noise pattern follows.
pub(crate) const PATTERN_IK: u8 = 1;
/// See [`PATTERN_IK`].
pub(crate) const PATTERN_XX: u8 = 2;
/// An Initial whose payload is this one byte is padding (PROTOCOL.md §4.3, §11.10): a client that
/// asks for a handshake probe train sends a few right behind its first Initial, so that the
/// server's anti-amplification budget has room for the train; a server counts their bytes
/// and otherwise ignores them (they never create, move or replace a connection).
pub(crate) const PATTERN_PADDING: u8 = 0;
/// A Handshake payload of one byte is a refusal with this reason (Noise messages are longer).
pub(crate) const REFUSE_AUTHENTICATION: u8 = 1;
/// See [`REFUSE_AUTHENTICATION`].
pub(crate) const REFUSE_BUSY: u8 = 2;
/// Refusals that end a handshake (see `client_on_response`).
const REFUSALS_BELIEVED: u32 = 3;

/// Client-side handshake state before keys exist.
#[derive(Debug, Default)]
pub(crate) struct HandshakeState {
    /// The Noise first message (kept to rebuild the Initial with a Retry token).
    pub(crate) msg1: Option<Vec<u8>>,
    /// Retry token from the server.
    pub(crate) token: Vec<u8>,
    /// Retry packets followed (a few are allowed: a Retry has no integrity check of its own,
    /// so a corrupted one must not end the connection).
    pub(crate) retries: u32,
    /// Refusals received: a damaged Initial is refused too, so only repeated refusals of
    /// identical Initials are believed.
    pub(crate) refusals: u32,
    /// Flow data carried in the first flight, acknowledged implicitly by the response.
    pub(crate) first_flight: crate::recovery::SentFrames,
    /// Protected packets that arrived before the response (a server's handshake probe train
    /// goes right behind it, §11.10, and overtakes a response that was lost), with when they
    /// arrived: opened once the keys exist, the train timed by its arrivals, not behind the
    /// response's Noise work. At most [`MAX_EARLY_PACKETS`].
    pub(crate) early_packets: Vec<EarlyPacket>,
    /// Padding Initials still to send behind the first Initial (`handshake_train`).
    pub(crate) padding_left: u8,
}

/// Most protected packets a client keeps while it waits for the handshake's response.
pub(crate) const MAX_EARLY_PACKETS: usize = crate::path::probe::DEFAULT_TRAIN_LEN as usize;

/// A protected packet kept until the keys to open it exist, and how it arrived.
#[derive(Debug)]
pub(crate) struct EarlyPacket {
    pub(crate) arrived: Instant,
    pub(crate) remote: SocketAddr,
    pub(crate) local: Option<std::net::IpAddr>,
    pub(crate) ecn: Option<crate::recovery::EcnCodepoint>,
    pub(crate) data: Vec<u8>,
}

/// A handshake datagram that is resent until the handshake is confirmed.
#[derive(Debug)]
pub(crate) struct Flight {
    pub(crate) datagram: Vec<u8>,
    pub(crate) send_now: bool,
    pub(crate) retransmit_at: Option<Instant>,
    pub(crate) backoff: u32,
    /// When it was first sent, and how often: the answer to a flight sent once is the
    /// connection's first RTT sample (Karn: none from a resent one).
    pub(crate) first_sent: Option<Instant>,
    pub(crate) sends: u32,
}

impl Flight {
    fn new(datagram: Vec<u8>) -> Self {
        Self {
            datagram,
            send_now: true,
            retransmit_at: None,
            backoff: 0,
            first_sent: None,
            sends: 0,
        }
    }

    /// The round trip its answer, arriving `now`, measures, if it was sent only once.
    fn rtt_sample(&self, now: Instant) -> Option<Duration> {
        let sent = self.first_sent.filter(|_| self.sends == 1)?;
        Some(now.saturating_duration_since(sent))
    }
}

/// The prologue binds the version and the client's connection IDs into the handshake hash, so
/// a changed Initial header fails authentication.
pub(crate) fn prologue(odcid: &ConnectionId, client_cid: &ConnectionId) -> Vec<u8> {
    let mut p = b"tern/1".to_vec();
    p.extend_from_slice(&wire::VERSION_1.to_be_bytes());
    p.push(odcid.len() as u8);
    p.extend_from_slice(odcid.as_bytes());
    p.push(client_cid.len() as u8);
    p.extend_from_slice(client_cid.as_bytes());
    p
}

/// Encodes a handshake payload: length-prefixed transport parameters, then frames.
fn params_payload(params: &TransportParams, out: &mut Vec<u8>) {
    let mut tp = Vec::new();
    params.encode(&mut tp);
    out.put_varint(tp.len() as u64);
    out.extend_from_slice(&tp);
}

/// Splits a handshake payload into transport parameters and the frames after them.
fn parse_payload(payload: &[u8]) -> Result<(TransportParams, &[u8]), TransportErrorCode> {
    let mut r = wire::Reader::new(payload);
    let len = r
        .varint()
        .map_err(|_| TransportErrorCode::TRANSPORT_PARAMETER_ERROR)?;
    let tp = r
        .bytes(len as usize)
        .map_err(|_| TransportErrorCode::TRANSPORT_PARAMETER_ERROR)?;
    let params =
        TransportParams::decode(tp).map_err(|_| TransportErrorCode::TRANSPORT_PARAMETER_ERROR)?;
    use crate::flow::{PRE_HANDSHAKE_CREDIT, PRE_HANDSHAKE_FLOWS};
    let too_small = params.initial_max_data < PRE_HANDSHAKE_CREDIT
        || params.initial_max_flow_data_bidi_local < PRE_HANDSHAKE_CREDIT
        || params.initial_max_flow_data_bidi_remote < PRE_HANDSHAKE_CREDIT
        || params.initial_max_flow_data_uni < PRE_HANDSHAKE_CREDIT
        || params.initial_max_flows_bidi < PRE_HANDSHAKE_FLOWS
        || params.initial_max_flows_uni < PRE_HANDSHAKE_FLOWS;
    if too_small || params.max_datagram_size < wire::MIN_MAX_DATAGRAM_SIZE {
        return Err(TransportErrorCode::TRANSPORT_PARAMETER_ERROR);
    }
    Ok((params, r.rest()))
}

/// Builds a long-header datagram.
pub(crate) fn long_packet(
    ty: wire::LongType,
    dcid: &ConnectionId,
    scid: &ConnectionId,
    token: &[u8],
    payload: &[u8],
    pad_to: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(pad_to.max(payload.len() + 64));
    wire::encode_long_packet(&mut out, ty, wire::VERSION_1, dcid, scid, token, payload);
    if out.len() < pad_to {
        out.resize(pad_to, 0);
    }
    out
}

impl Connection {
    /// Starts a client connection's first flight (called on the first `poll_transmit`).
    pub(crate) fn build_initial(&mut self) {
        let State::Handshake(hs) = &mut self.state else {
            return;
        };
        if hs.msg1.is_none() {
            let Some(noise) = self.handshake.as_mut() else {
                return;
            };
            let ik = noise.pattern() == HandshakePattern::IK;
            let mut payload = Vec::with_capacity(1200);
            if ik {
                params_payload(&self.local_params, &mut payload);
            } else {
                // XX's first message is not encrypted: our reset token waits for message 3,
                // or anyone on the path could forge a reset that ends the connection.
                let mut params = self.local_params.clone();
                params.stateless_reset_token = None;
                params_payload(&params, &mut payload);
            }
            let mut first_flight = crate::recovery::SentFrames::new();
            if ik {
                // IK encrypts the first message to the server's key: data may ride along.
                let budget = 1200usize.saturating_sub(payload.len() + 200);
                let mut frames = Vec::new();
                self.write_flow_frames(&mut frames, budget, &mut first_flight);
                payload.extend_from_slice(&frames);
            }
            let mut msg = vec![if ik { PATTERN_IK } else { PATTERN_XX }];
            let Some(noise) = self.handshake.as_mut() else {
                return;
            };
            if noise.write(&payload, &mut msg).is_err() {
                self.enter_drained(ConnectionError::HandshakeRefused);
                return;
            }
            let State::Handshake(hs) = &mut self.state else {
                return;
            };
            hs.first_flight = first_flight;
            hs.msg1 = Some(msg);
            if ik && self.config.handshake_train && self.config.fast_start {
                let padding = self.handshake_train_padding();
                if let State::Handshake(hs) = &mut self.state {
                    hs.padding_left = padding;
                }
            }
        }
        self.rebuild_initial();
    }

    /// How many padding Initials let a server send a whole probe train with its response:
    /// the 3× limit must cover the train's packets (our datagram size at most) and two
    /// responses (each bounded here by the Initial's size), less what the Initial itself
    /// brings. They are 1 200 bytes, as the Initial: any path that carried it carries them.
    fn handshake_train_padding(&self) -> u8 {
        let size = u64::from(self.config.max_datagram_size.max(1));
        let initial = wire::MIN_INITIAL_DATAGRAM_SIZE as u64;
        let train = self.handshake_train_len();
        let needed = (train * size + 2 * initial).div_ceil(3);
        needed.saturating_sub(initial).div_ceil(initial).min(16) as u8
    }

    /// A client's padding Initial (`PATTERN_PADDING`), due right after the first send of its
    /// Initial (not after a resend), into `buf`.
    pub(crate) fn poll_first_flight_padding(&mut self, buf: &mut Vec<u8>) -> Option<usize> {
        let sent_once = self.flight.as_ref().is_some_and(|f| f.sends == 1);
        let State::Handshake(hs) = &mut self.state else {
            return None;
        };
        if hs.padding_left == 0 || !sent_once {
            return None;
        }
        hs.padding_left -= 1;
        let datagram = long_packet(
            wire::LongType::Initial,
            &self.original_dcid,
            &self.local_cid,
            &hs.token,
            &[PATTERN_PADDING],
            wire::MIN_INITIAL_DATAGRAM_SIZE,
        );
        buf.extend_from_slice(&datagram);
        Some(datagram.len())
    }

    fn rebuild_initial(&mut self) {
        let State::Handshake(hs) = &self.state else {
            return;
        };
        let Some(msg1) = &hs.msg1 else { return };
        let datagram = long_packet(
            wire::LongType::Initial,
            &self.original_dcid,
            &self.local_cid,
            &hs.token,
            msg1,
            wire::MIN_INITIAL_DATAGRAM_SIZE,
        );
        let backoff = self.flight.as_ref().map_or(0, |f| f.backoff);
        let mut flight = Flight::new(datagram);
        flight.backoff = backoff;
        self.flight = Some(flight);
    }

    /// When the handshake flight must be resent.
    pub(crate) fn flight_timer(&self) -> Option<Instant> {
        if self.confirmed {
            return None;
        }
        self.flight.as_ref()?.retransmit_at
    }

    /// Resends the handshake flight when its timer expired.
    pub(crate) fn handshake_timeout(&mut self, now: Instant) {
        if self.confirmed {
            return;
        }
        if let Some(f) = self.flight.as_mut() {
            if f.retransmit_at.is_some_and(|t| now >= t) {
                f.send_now = true;
                f.retransmit_at = None;
                f.backoff = (f.backoff + 1).min(8);
            }
        }
    }

    /// Copies the handshake flight into `buf` if it is due and the amplification limit allows.
    pub(crate) fn poll_flight(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<usize> {
        if matches!(self.state, State::Handshake(_)) && self.side == Side::Client {
            let State::Handshake(hs) = &self.state else {
                return None;
            };
            if hs.msg1.is_none() {
                self.build_initial();
            }
        }
        let pto = self.paths[0].rtt.pto_base();
        let cap = self.max_probe_interval(&self.paths[0]);
        let budget = self.paths[0].amplification_budget();
        let flight = self.flight.as_mut()?;
        if !flight.send_now || self.confirmed {
            return None;
        }
        if flight.datagram.len() as u64 > budget {
            // Wait for more bytes from the client (3× limit before address validation).
            return None;
        }
        flight.send_now = false;
        flight.retransmit_at = Some(now + (pto * (1 << flight.backoff)).min(cap));
        flight.first_sent.get_or_insert(now);
        flight.sends += 1;
        buf.extend_from_slice(&flight.datagram);
        let len = flight.datagram.len();
        if flight.sends > 1 && self.side == Side::Server {
            // A server's packets sent before this copy of its response (a handshake probe
            // train, §11.10) can be opened, and so acknowledged, only after the client has a
            // copy, and which one it got is unknown: their acknowledgements give no RTT sample
            // (Karn; measured from the first copy a lost one would add a timeout, from this
            // one a crossing resend would read a round trip short).
            let sent = &mut self.paths[0].sent;
            sent.no_rtt_sample_below = sent.next_pn;
        }
        Some(len)
    }

    /// A long-header packet arrived for this connection.
    pub(crate) fn handle_long(
        &mut self,
        now: Instant,
        packet: &wire::LongPacket<'_>,
    ) -> Result<(), TransportErrorCode> {
        match (self.side, packet.ty) {
            (Side::Server, wire::LongType::Initial) => {
                // The client did not hear our response: send it again.
                if !self.confirmed {
                    if let Some(f) = self.flight.as_mut() {
                        f.send_now = true;
                    }
                }
                Ok(())
            }
            (Side::Client, wire::LongType::Retry) => {
                self.on_retry(packet.token);
                Ok(())
            }
            (Side::Client, wire::LongType::Handshake) => self.client_on_response(now, packet),
            (Side::Server, wire::LongType::Handshake) => self.server_on_msg3(now, packet),
            _ => Ok(()),
        }
    }

    fn on_retry(&mut self, token: &[u8]) {
        let State::Handshake(hs) = &mut self.state else {
            return;
        };
        if hs.retries >= 3 || token.is_empty() {
            return;
        }
        hs.retries += 1;
        hs.token = token.to_vec();
        hs.early_packets.clear();
        self.rebuild_initial();
    }

    fn client_on_response(
        &mut self,
        now: Instant,
        packet: &wire::LongPacket<'_>,
    ) -> Result<(), TransportErrorCode> {
        if !matches!(self.state, State::Handshake(_)) {
            // A duplicate of msg2: our msg3 (XX) or our first protected packet (IK) was lost,
            // and the server waits for it to hand the connection to its application.
            if !self.confirmed {
                if let Some(f) = self.flight.as_mut() {
                    f.send_now = true;
                }
            } else if self.keys.is_some() {
                self.ping_pending = true;
            }
            return Ok(());
        }
        if packet.payload.len() == 1 {
            // A refusal in clear: the server could not read our first message. The Initial may
            // have been damaged on the way, so resend it and believe only the third refusal.
            if let State::Handshake(hs) = &mut self.state {
                hs.refusals += 1;
                if hs.refusals < REFUSALS_BELIEVED {
                    if let Some(f) = self.flight.as_mut() {
                        f.send_now = true;
                    }
                    return Ok(());
                }
            }
            let error = match packet.payload[0] {
                REFUSE_AUTHENTICATION => ConnectionError::HandshakeRefused,
                _ => ConnectionError::ConnectionRefused,
            };
            self.enter_drained(error);
            return Ok(());
        }
        let Some(noise) = self.handshake.as_mut() else {
            return Ok(());
        };
        let mut payload = Vec::new();
        if noise.read(packet.payload, &mut payload).is_err() {
            // Not from the server we are talking to: ignore (an attacker cannot end us).
            self.stats.auth_failures += 1;
            self.report_violation(crate::event::Violation::Authentication);
            return Ok(());
        }
        let mut r = wire::Reader::new(&payload);
        let server_cid = ConnectionId::decode_len_prefixed(&mut r)
            .map_err(|_| TransportErrorCode::PROTOCOL_VIOLATION)?;
        // The authenticated copy wins over the header's, which may have been altered.
        let (params, frames) = parse_payload(r.rest())?;
        if !frames.is_empty() {
            return Err(TransportErrorCode::PROTOCOL_VIOLATION);
        }
        self.peer_key = noise.remote_static();
        let pattern = noise.pattern();
        // The response answers our first flight: a first RTT sample, so that pacing,
        // probe timers and message deadlines start from the path rather than a guess.
        if let Some(sample) = self.flight.as_ref().and_then(|f| f.rtt_sample(now)) {
            self.paths[0].rtt.update(Duration::ZERO, sample);
        }
        self.remote_cid = server_cid;
        self.apply_peer_params(params);
        if pattern == HandshakePattern::XX {
            let Some(noise) = self.handshake.as_mut() else {
                return Ok(());
            };
            // Message 3 is encrypted: it carries our reset token (§7.2, §14.3).
            let token = self.local_params.stateless_reset_token;
            let mut msg3 = Vec::new();
            if noise
                .write(token.as_ref().map_or(&[][..], |t| &t[..]), &mut msg3)
                .is_err()
            {
                return Err(TransportErrorCode::CRYPTO_ERROR);
            }
            let datagram = long_packet(
                wire::LongType::Handshake,
                &self.remote_cid,
                &self.local_cid,
                &[],
                &msg3,
                0,
            );
            self.flight = Some(Flight::new(datagram));
        } else {
            self.flight = None;
            self.confirmed = true;
            // Prove we are live at once (§7.6): a server that could not prove our first
            // flight fresh waits for a protected packet before it delivers our early data.
            self.ping_pending = true;
        }
        let State::Handshake(hs) = std::mem::replace(&mut self.state, State::Established) else {
            return Ok(());
        };
        // The response acknowledges the whole first flight.
        self.on_acked_frames(&hs.first_flight);
        self.install_keys();
        self.paths[0].validated = true;
        self.restart_idle_timer(now);
        self.events.push_back(Event::Connected);
        for mut p in hs.early_packets {
            self.open_short(now, p.arrived, p.remote, p.local, p.ecn, &mut p.data);
        }
        Ok(())
    }

    fn server_on_msg3(
        &mut self,
        now: Instant,
        packet: &wire::LongPacket<'_>,
    ) -> Result<(), TransportErrorCode> {
        if !matches!(self.state, State::Handshake(_)) {
            return Ok(());
        }
        let Some(noise) = self.handshake.as_mut() else {
            return Ok(());
        };
        let mut payload = Vec::new();
        if noise.read(packet.payload, &mut payload).is_err() {
            self.stats.auth_failures += 1;
            self.report_violation(crate::event::Violation::Authentication);
            return Ok(());
        }
        // The client's reset token, encrypted (message 1 of XX is not): 16 bytes, or none.
        self.peer_reset_token = match payload.len() {
            0 => None,
            RESET_TOKEN_LEN => <[u8; RESET_TOKEN_LEN]>::try_from(&payload[..]).ok(),
            _ => return Err(TransportErrorCode::PROTOCOL_VIOLATION),
        };
        self.peer_key = noise.remote_static();
        self.state = State::Established;
        self.install_keys();
        self.on_address_validated();
        self.handshake_done_pending = true;
        self.restart_idle_timer(now);
        self.events.push_back(Event::Connected);
        // Only the holder of the client's static key could write message 3.
        self.on_client_proven(now);
        Ok(())
    }

    /// The peer proved it owns its address (decrypted packet or msg3).
    pub(crate) fn on_address_validated(&mut self) {
        self.paths[0].validated = true;
        if self.side == Side::Server {
            self.confirmed = true;
            self.flight = None;
        }
    }

    /// Server, IK: the client's packet number 0 on the first path, which it sends as soon as
    /// it reads our response, arrived at `now`: the path's first RTT sample, if the response
    /// went once (Karn; a later packet number may be a resend after a loss, whose timer would
    /// be in the sample). Pacing and probe timers of the first data start from it rather
    /// than from the configured initial RTT.
    pub(crate) fn on_response_answered(&mut self, now: Instant) {
        let sample = self.flight.as_ref().and_then(|f| f.rtt_sample(now));
        if let Some(sample) = sample.filter(|_| !self.paths[0].rtt.has_sample()) {
            self.paths[0].rtt.update(Duration::ZERO, sample);
        }
    }

    pub(crate) fn install_keys(&mut self) {
        if let Some(mut noise) = self.handshake.take() {
            let (confidentiality, integrity) = (
                self.config.confidentiality_limit,
                self.config.integrity_limit,
            );
            self.keys = noise.split_secrets().map(|(send, recv)| {
                crate::crypto::KeySchedule::new(send, recv, confidentiality, integrity)
            });
        }
        let mtu = self.negotiated_udp_payload();
        self.paths[0].mtu = mtu;
        self.paths[0].cc.on_mtu_update(mtu);
        self.init_pmtu(0, mtu);
    }

    /// The datagram size both sides accept.
    pub(crate) fn negotiated_udp_payload(&self) -> u16 {
        let peer = self.peer_params.as_ref().map_or(1200, |p| {
            p.max_datagram_size.min(u64::from(u16::MAX)) as u16
        });
        self.config.max_datagram_size.min(peer).max(1200)
    }

    pub(crate) fn apply_peer_params(&mut self, params: TransportParams) {
        self.flows.apply_peer_limits(
            params.initial_max_data,
            [params.initial_max_flows_bidi, params.initial_max_flows_uni],
            params.initial_max_flow_data_bidi_local,
            params.initial_max_flow_data_bidi_remote,
            params.initial_max_flow_data_uni,
        );
        if params.idle_timeout_ms > 0 {
            let peer = std::time::Duration::from_millis(params.idle_timeout_ms);
            // The shorter of the two wins; zero means "none" on either side.
            self.idle_timeout = if self.idle_timeout.is_zero() {
                peer
            } else {
                self.idle_timeout.min(peer)
            };
        }
        self.peer_reset_token = params.stateless_reset_token;
        self.peer_params = Some(params);
    }
}

/// What the server does with a first Initial.
pub(crate) enum Accept {
    /// A new connection.
    Connection(Box<Connection>),
    /// Refuse in clear with this reason byte.
    Refuse(u8),
    /// Drop silently (malformed).
    Drop,
}

/// Server: reads a client's first message and builds the connection with its response.
#[allow(clippy::too_many_arguments)]
pub(crate) fn accept(
    now: Instant,
    config: std::sync::Arc<crate::config::ConnectionConfig>,
    keypair: &crate::crypto::StaticKeypair,
    entropy: [u8; 32],
    local_cid: ConnectionId,
    mut local_params: TransportParams,
    remote: SocketAddr,
    packet: &wire::LongPacket<'_>,
    datagram_len: usize,
    validated: bool,
) -> Accept {
    let Some((&pattern_byte, msg1)) = packet.payload.split_first() else {
        return Accept::Drop;
    };
    let pattern = match pattern_byte {
        PATTERN_IK => HandshakePattern::IK,
        PATTERN_XX => HandshakePattern::XX,
        _ => return Accept::Drop,
    };
    let prologue = prologue(&packet.dcid, &packet.scid);
    let Ok(mut noise) = Handshake::responder(keypair, pattern, &prologue, entropy) else {
        return Accept::Drop;
    };
    let mut payload = Vec::new();
    if noise.read(msg1, &mut payload).is_err() {
        return Accept::Refuse(REFUSE_AUTHENTICATION);
    }
    let Ok((mut params, frames)) = parse_payload(&payload) else {
        return Accept::Drop;
    };
    if pattern == HandshakePattern::XX {
        // XX's first message is not encrypted: it must not carry data, and a reset token in
        // it is known to anyone on the path, so it is not used (message 3 brings the token).
        if !frames.is_empty() {
            return Accept::Drop;
        }
        params.stateless_reset_token = None;
    }
    local_params.stateless_reset_token = local_params.stateless_reset_token.or(None);
    let mut conn = Connection::new(
        Side::Server,
        now,
        config,
        local_cid,
        packet.scid,
        packet.dcid,
        remote,
        local_params.clone(),
        noise,
    );
    conn.initial_payload = packet.payload.to_vec();
    conn.paths[0].bytes_received = datagram_len as u64;
    conn.stats.datagrams_received = 1;
    conn.stats.bytes_received = datagram_len as u64;
    conn.apply_peer_params(params);
    // Response: msg2 with our connection ID (authenticated, since the long header's SCID is
    // not covered by the Noise prologue) and our transport parameters.
    let mut out_payload = Vec::new();
    local_cid.encode_len_prefixed(&mut out_payload);
    params_payload(&local_params, &mut out_payload);
    let mut msg2 = Vec::new();
    let Some(noise) = conn.handshake.as_mut() else {
        return Accept::Drop;
    };
    if noise.write(&out_payload, &mut msg2).is_err() {
        return Accept::Drop;
    }
    conn.peer_key = noise.remote_static();
    let datagram = long_packet(
        wire::LongType::Handshake,
        &conn.remote_cid,
        &conn.local_cid,
        &[],
        &msg2,
        0,
    );
    conn.flight = Some(Flight::new(datagram));
    if validated {
        conn.paths[0].validated = true;
    }
    if pattern == HandshakePattern::IK {
        conn.state = State::Established;
        conn.install_keys();
        conn.events.push_back(Event::Connected);
        // Processed when the endpoint proves the flight fresh, or the client live (§7.6).
        conn.held_first_flight = Some(frames.to_vec());
    }
    Accept::Connection(Box::new(conn))
}

impl Connection {
    /// Server: the client proved it is live — neither a replay nor a spoofed source — by XX
    /// message 3 or its first protected packet: process the early data it held and let the
    /// endpoint hand the connection to the application (or stop counting it as half-open).
    pub(crate) fn on_client_proven(&mut self, now: Instant) {
        // The first message was kept to judge it and to spot a damaged copy; no more.
        self.initial_payload = Vec::new();
        match self.announce {
            Announce::Hidden => {
                self.announce = Announce::Ready;
                self.release_first_flight(now);
            }
            Announce::Early => self.announce = Announce::ProvenEarly,
            _ => {}
        }
    }

    /// Server: hands the connection out before its client is proven live (a fresh IK first
    /// flight with `early_accept`), processing its early data now.
    pub(crate) fn announce_early(&mut self, now: Instant) {
        if self.announce == Announce::Hidden {
            self.announce = Announce::Early;
            self.release_first_flight(now);
        }
    }

    fn release_first_flight(&mut self, now: Instant) {
        if let Some(frames) = self.held_first_flight.take().filter(|f| !f.is_empty()) {
            let result = first_flight_frames_allowed(&frames)
                .and_then(|()| self.process_frames(now, 0, &frames));
            if let Err((code, reason)) = result {
                self.fail(now, code, reason);
            }
        }
    }

    /// Server: the Noise ephemeral key of the first flight (its first 32 bytes after the
    /// pattern byte), which names the flight in the replay register.
    pub(crate) fn first_flight_ephemeral(&self) -> &[u8] {
        self.initial_payload.get(1..33).unwrap_or(&[])
    }

    /// Server: whether the first flight was IK (the only one that carries early data).
    pub(crate) fn first_flight_is_ik(&self) -> bool {
        self.initial_payload.first() == Some(&PATTERN_IK)
    }
}

/// §7.6: message 1 carries flow and message data and credit, nothing that refers to packet
/// numbers or paths (no packet was sent yet, and the server may already have sent some: its
/// handshake train). Checked before any frame takes effect.
fn first_flight_frames_allowed(payload: &[u8]) -> Result<(), super::recv::FrameError> {
    use crate::wire::Frame;
    for frame in crate::wire::FrameIter::new(payload) {
        let frame =
            frame.map_err(|_| (TransportErrorCode::FRAME_ENCODING_ERROR, "malformed frame"))?;
        let allowed = matches!(
            frame,
            Frame::Padding { .. }
                | Frame::Ping
                | Frame::Flow(_)
                | Frame::ResetFlow { .. }
                | Frame::StopSending { .. }
                | Frame::MaxData { .. }
                | Frame::MaxFlowData { .. }
                | Frame::MaxFlows { .. }
                | Frame::DataBlocked { .. }
                | Frame::FlowDataBlocked { .. }
                | Frame::Message(_)
                | Frame::MessageSkip { .. }
                | Frame::Datagram { .. }
        );
        if !allowed {
            return Err((
                TransportErrorCode::PROTOCOL_VIOLATION,
                "frame not allowed in the first flight",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Frame;

    #[test]
    fn a_first_flight_with_path_or_packet_number_frames_is_refused() {
        // Found by two outside reads: §7.6 forbids them, nothing enforced it, and the server
        // may already have sent packets (its handshake train) for an Ack to acknowledge.
        let mut ok = Vec::new();
        Frame::MaxData { max: 100_000 }.encode(&mut ok);
        Frame::Ping.encode(&mut ok);
        assert_eq!(first_flight_frames_allowed(&ok), Ok(()));
        for bad in [
            Frame::PathChallenge { data: [7; 8] },
            Frame::PathResponse { data: [7; 8] },
            Frame::AckRequest,
        ] {
            let mut payload = ok.clone();
            bad.encode(&mut payload);
            let refused = first_flight_frames_allowed(&payload);
            assert_eq!(
                refused.map_err(|e| e.0),
                Err(TransportErrorCode::PROTOCOL_VIOLATION),
                "{bad:?}"
            );
        }
        assert!(first_flight_frames_allowed(&[0xff, 0xff]).is_err());
    }
}
