//! The Noise handshake (docs/PROTOCOL.md §7).
//!
//! `IK` when the client knows the server's static key: the first flight is encrypted to that
//! key, so it can carry data, and the handshake completes in one round trip. `XX` otherwise:
//! the server's key is learned (and must be checked by the application) and a third message
//! completes the handshake.

use super::{PacketKey, PublicKey, SeededResolver, StaticKeypair};
use crate::error::HandshakeError;

/// Which Noise pattern a handshake uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakePattern {
    /// `Noise_IK_25519_AESGCM_SHA256`: 1 round trip, the client knows the server's key.
    IK,
    /// `Noise_XX_25519_AESGCM_SHA256`: 1.5 round trips, keys are exchanged.
    XX,
}

pub(super) fn params(pattern: HandshakePattern) -> snow::params::NoiseParams {
    let name = match pattern {
        HandshakePattern::IK => "Noise_IK_25519_AESGCM_SHA256",
        HandshakePattern::XX => "Noise_XX_25519_AESGCM_SHA256",
    };
    name.parse()
        .expect("the two pattern names are valid Noise names")
}

/// One side of a Noise handshake.
///
/// A message that fails to authenticate (corrupted or forged) must not spoil the handshake,
/// but snow's state is not defined after a failed read. Since our RNG is seeded, the state is
/// a pure function of the inputs and the messages so far, so it is rebuilt and replayed.
pub struct Handshake {
    state: snow::HandshakeState,
    pattern: HandshakePattern,
    inputs: Inputs,
    /// Messages written (their payloads) and read (the messages), in order.
    transcript: Vec<(bool, Vec<u8>)>,
}

#[derive(Clone)]
struct Inputs {
    local: StaticKeypair,
    remote: Option<PublicKey>,
    prologue: Vec<u8>,
    entropy: [u8; 32],
    initiator: bool,
}

fn build(pattern: HandshakePattern, i: &Inputs) -> Result<snow::HandshakeState, HandshakeError> {
    let builder = snow::Builder::with_resolver(
        params(pattern),
        SeededResolver::boxed(
            i.entropy,
            Some(&i.local),
            i.remote.as_ref().filter(|_| i.initiator),
        ),
    )
    .local_private_key(i.local.private_bytes())
    .and_then(|b| b.prologue(&i.prologue))
    .map_err(|_| HandshakeError::Crypto)?;
    let builder = match &i.remote {
        Some(key) if i.initiator => builder
            .remote_public_key(&key.0)
            .map_err(|_| HandshakeError::Crypto)?,
        _ => builder,
    };
    if i.initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    }
    .map_err(|_| HandshakeError::Crypto)
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("pattern", &self.pattern)
            .field("finished", &self.state.is_handshake_finished())
            .finish()
    }
}

impl Handshake {
    /// The client side. `server` selects `IK` (known key) or `XX` (unknown key).
    /// `prologue` binds the version and connection IDs into the handshake hash.
    pub fn initiator(
        local: &StaticKeypair,
        server: Option<&PublicKey>,
        prologue: &[u8],
        entropy: [u8; 32],
    ) -> Result<Self, HandshakeError> {
        let pattern = if server.is_some() {
            HandshakePattern::IK
        } else {
            HandshakePattern::XX
        };
        let inputs = Inputs {
            local: local.clone(),
            remote: server.copied(),
            prologue: prologue.to_vec(),
            entropy,
            initiator: true,
        };
        Ok(Self {
            state: build(pattern, &inputs)?,
            pattern,
            inputs,
            transcript: Vec::new(),
        })
    }

    /// The server side, for the pattern the client's first message announced.
    pub fn responder(
        local: &StaticKeypair,
        pattern: HandshakePattern,
        prologue: &[u8],
        entropy: [u8; 32],
    ) -> Result<Self, HandshakeError> {
        let inputs = Inputs {
            local: local.clone(),
            remote: None,
            prologue: prologue.to_vec(),
            entropy,
            initiator: false,
        };
        Ok(Self {
            state: build(pattern, &inputs)?,
            pattern,
            inputs,
            transcript: Vec::new(),
        })
    }

    /// The pattern in use.
    pub fn pattern(&self) -> HandshakePattern {
        self.pattern
    }

    /// Writes the next handshake message carrying `payload`, appending it to `out`.
    pub fn write(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), HandshakeError> {
        let start = out.len();
        out.resize(start + payload.len() + 200, 0);
        match self.state.write_message(payload, &mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                self.transcript.push((true, payload.to_vec()));
                Ok(())
            }
            Err(_) => {
                out.truncate(start);
                Err(HandshakeError::Crypto)
            }
        }
    }

    /// Reads the peer's next handshake message, appending its payload to `payload`.
    /// Fails (without detail, so nothing leaks to a peer) when the message does not
    /// authenticate: for `IK`, typically because the client used the wrong server key.
    pub fn read(&mut self, message: &[u8], payload: &mut Vec<u8>) -> Result<(), HandshakeError> {
        let start = payload.len();
        payload.resize(start + message.len(), 0);
        match self.state.read_message(message, &mut payload[start..]) {
            Ok(n) => {
                payload.truncate(start + n);
                self.transcript.push((false, message.to_vec()));
                Ok(())
            }
            Err(_) => {
                payload.truncate(start);
                self.restore();
                Err(HandshakeError::Authentication)
            }
        }
    }

    /// Rebuilds the state as it was before a failed read.
    fn restore(&mut self) {
        let Ok(mut state) = build(self.pattern, &self.inputs) else {
            return;
        };
        // Room for the largest message so far and the Noise overhead written around a
        // payload (an ephemeral key, an encrypted static key, tags): a forged message costs a
        // rebuild, but not a 64 KiB buffer.
        let largest = self.transcript.iter().map(|(_, b)| b.len()).max();
        let mut scratch = vec![0u8; (largest.unwrap_or(0) + 256).min(65_535)];
        for (write, bytes) in &self.transcript {
            let ok = if *write {
                state.write_message(bytes, &mut scratch).is_ok()
            } else {
                state.read_message(bytes, &mut scratch).is_ok()
            };
            if !ok {
                return;
            }
        }
        self.state = state;
    }

    /// Whether the last message has been written or read.
    pub fn is_finished(&self) -> bool {
        self.state.is_handshake_finished()
    }

    /// The peer's static key, once the handshake revealed it.
    pub fn remote_static(&self) -> Option<PublicKey> {
        let key = self.state.get_remote_static()?;
        Some(PublicKey(key.try_into().ok()?))
    }

    /// The packet keys `(send, receive)` for this side, once the handshake is finished.
    pub fn split(&mut self) -> Option<(PacketKey, PacketKey)> {
        let (send, recv) = self.split_secrets()?;
        Some((PacketKey::new(&send), PacketKey::new(&recv)))
    }

    /// The raw 32-byte secrets `(send, receive)` of the packet keys, once the handshake is
    /// finished: key updates derive the next keys from them (§6.4).
    pub fn split_secrets(&mut self) -> Option<([u8; 32], [u8; 32])> {
        if !self.is_finished() {
            return None;
        }
        let (initiator_to_responder, responder_to_initiator) =
            self.state.dangerously_get_raw_split();
        Some(if self.state.is_initiator() {
            (initiator_to_responder, responder_to_initiator)
        } else {
            (responder_to_initiator, initiator_to_responder)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_reconnecting_to_a_server_reuses_their_static_dh_and_still_agrees() {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        let other_server = StaticKeypair::generate([9; 32]);
        for (i, server) in [&server_key, &server_key, &other_server]
            .into_iter()
            .enumerate()
        {
            let key = server.public();
            let mut client =
                Handshake::initiator(&client_key, Some(&key), b"p", [i as u8; 32]).unwrap();
            let mut responder =
                Handshake::responder(server, HandshakePattern::IK, b"p", [7; 32]).unwrap();
            let (mut m, mut p) = (Vec::new(), Vec::new());
            client.write(b"hi", &mut m).unwrap();
            responder.read(&m, &mut p).unwrap();
            m.clear();
            responder.write(b"ok", &mut m).unwrap();
            client.read(&m, &mut p).unwrap();
            assert!(client.is_finished() && responder.is_finished());
        }
        // One remembered secret per server the client initiated to; none on the servers.
        assert_eq!(client_key.static_dh.lock().unwrap().len(), 2);
        assert!(server_key.static_dh.lock().unwrap().is_empty());
    }

    /// One IK round between fresh handshakes seeded `seed` (client) and `[7; 32]` (server):
    /// the client's first message, and whether the server could read it.
    fn first_message(
        client_key: &StaticKeypair,
        server: &StaticKeypair,
        seed: u8,
    ) -> (Vec<u8>, bool) {
        let key = server.public();
        let mut client = Handshake::initiator(client_key, Some(&key), b"p", [seed; 32]).unwrap();
        let mut responder =
            Handshake::responder(server, HandshakePattern::IK, b"p", [7; 32]).unwrap();
        let (mut m, mut p) = (Vec::new(), Vec::new());
        client.write(b"hi", &mut m).unwrap();
        let read = responder.read(&m, &mut p).is_ok();
        (m, read)
    }

    #[test]
    fn an_ephemeral_key_made_ahead_is_used_and_changes_no_byte() {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        // The same private key with a cache of its own: nothing prepared.
        let plain = StaticKeypair::from_private(*client_key.private_bytes());
        super::super::prepare_ephemeral(&client_key, &[5; 32], Some(&server_key.public()));
        assert_eq!(client_key.prepared.lock().unwrap().len(), 1);
        let (prepared, read) = first_message(&client_key, &server_key, 5);
        assert!(read);
        // Taken by the handshake it was made for; the bytes are those made without it.
        assert!(client_key.prepared.lock().unwrap().is_empty());
        assert_eq!(prepared, first_message(&plain, &server_key, 5).0);
        // Made for other entropy: left alone, and the handshake makes its own key.
        super::super::prepare_ephemeral(&client_key, &[6; 32], None);
        assert!(first_message(&client_key, &server_key, 5).1);
        assert_eq!(client_key.prepared.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_dh_made_ahead_is_the_one_the_first_message_uses() {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        // Spoil the prepared `es`: if the handshake used it, the server cannot read.
        super::super::prepare_ephemeral(&client_key, &[5; 32], Some(&server_key.public()));
        for p in client_key.prepared.lock().unwrap().iter_mut() {
            p.spoil_es_for_test();
        }
        assert!(!first_message(&client_key, &server_key, 5).1);
        // Prepared for another server: not used for this one.
        let other = StaticKeypair::generate([9; 32]);
        super::super::prepare_ephemeral(&client_key, &[5; 32], Some(&other.public()));
        assert!(first_message(&client_key, &server_key, 5).1);
    }

    fn run(pattern_known: bool) -> (Handshake, Handshake) {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        let known = server_key.public();
        let mut client =
            Handshake::initiator(&client_key, pattern_known.then_some(&known), b"p", [3; 32])
                .unwrap();
        let pattern = client.pattern();
        let mut server = Handshake::responder(&server_key, pattern, b"p", [4; 32]).unwrap();
        let (mut m, mut p) = (Vec::new(), Vec::new());
        client.write(b"hello", &mut m).unwrap();
        server.read(&m, &mut p).unwrap();
        assert_eq!(p, b"hello");
        m.clear();
        p.clear();
        server.write(b"world", &mut m).unwrap();
        client.read(&m, &mut p).unwrap();
        assert_eq!(p, b"world");
        if pattern == HandshakePattern::XX {
            assert_eq!(client.remote_static(), Some(known));
            m.clear();
            p.clear();
            client.write(b"done", &mut m).unwrap();
            server.read(&m, &mut p).unwrap();
        }
        assert!(client.is_finished() && server.is_finished());
        assert_eq!(server.remote_static(), Some(client_key.public()));
        (client, server)
    }

    #[test]
    fn ik_and_xx_agree_on_keys() {
        for known in [true, false] {
            let (mut c, mut s) = run(known);
            let (c_send, c_recv) = c.split().unwrap();
            let (s_send, s_recv) = s.split().unwrap();
            let mut pkt = b"payload".to_vec();
            c_send.seal(0, 5, b"hdr", &mut pkt);
            let n = s_recv.open(0, 5, b"hdr", &mut pkt).unwrap();
            assert_eq!(&pkt[..n], b"payload");
            let mut pkt = b"back".to_vec();
            s_send.seal(1, 9, b"h", &mut pkt);
            assert!(c_recv.open(1, 9, b"h", &mut pkt).is_some());
        }
    }

    #[test]
    fn a_corrupted_message_does_not_spoil_the_handshake() {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        let known = server_key.public();
        let mut client = Handshake::initiator(&client_key, Some(&known), b"p", [3; 32]).unwrap();
        let mut server =
            Handshake::responder(&server_key, HandshakePattern::IK, b"p", [4; 32]).unwrap();
        let (mut m, mut p) = (Vec::new(), Vec::new());
        client.write(b"hello", &mut m).unwrap();
        server.read(&m, &mut p).unwrap();
        m.clear();
        server.write(b"world", &mut m).unwrap();
        let mut bad = m.clone();
        bad[40] ^= 4;
        assert_eq!(
            client.read(&bad, &mut p),
            Err(HandshakeError::Authentication)
        );
        p.clear();
        client.read(&m, &mut p).unwrap();
        assert_eq!(p, b"world");
        assert!(client.is_finished());
    }

    #[test]
    fn a_forged_xx_message_3_does_not_spoil_the_servers_handshake() {
        let server_key = StaticKeypair::generate([1; 32]);
        let client_key = StaticKeypair::generate([2; 32]);
        let mut client = Handshake::initiator(&client_key, None, b"p", [3; 32]).unwrap();
        let mut server =
            Handshake::responder(&server_key, HandshakePattern::XX, b"p", [4; 32]).unwrap();
        let (mut m, mut p) = (Vec::new(), Vec::new());
        client.write(b"", &mut m).unwrap();
        server.read(&m, &mut p).unwrap();
        m.clear();
        server.write(b"params", &mut m).unwrap();
        client.read(&m, &mut p).unwrap();
        m.clear();
        client.write(&[7; 16], &mut m).unwrap();
        for i in 0..3 {
            let mut forged = m.clone();
            forged[10 + i] ^= 1;
            assert_eq!(
                server.read(&forged, &mut p),
                Err(HandshakeError::Authentication)
            );
        }
        p.clear();
        server.read(&m, &mut p).unwrap();
        assert_eq!(p, [7; 16]);
        assert!(server.is_finished());
        assert_eq!(server.remote_static(), Some(client_key.public()));
    }

    #[test]
    fn wrong_server_key_fails_to_authenticate() {
        let server_key = StaticKeypair::generate([1; 32]);
        let wrong = StaticKeypair::generate([9; 32]).public();
        let client_key = StaticKeypair::generate([2; 32]);
        let mut client = Handshake::initiator(&client_key, Some(&wrong), b"p", [3; 32]).unwrap();
        let mut server =
            Handshake::responder(&server_key, HandshakePattern::IK, b"p", [4; 32]).unwrap();
        let (mut m, mut p) = (Vec::new(), Vec::new());
        client.write(b"x", &mut m).unwrap();
        assert_eq!(server.read(&m, &mut p), Err(HandshakeError::Authentication));
    }
}
