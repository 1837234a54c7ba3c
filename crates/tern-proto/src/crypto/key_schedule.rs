//! Key update (docs/PROTOCOL.md §6.4): the packet keys of both directions, their key phase,
//! and the AEAD usage limits of RFC 9001 §6.6.
//!
//! Each direction has a chain of keys: generation 0 is the Noise split output, generation
//! n + 1 is `HKDF-Expand-SHA256(k_n, "tern ku", 32)`. The key phase bit K of a packet is the
//! low bit of its generation. The receiver keeps the current key, the next one (precomputed,
//! so that a packet with a flipped K is tried without a derivation) and, for a while after an
//! update, the previous one for packets that were reordered across the update.

use std::time::{Duration, Instant};

use ring::hkdf;

use super::{PacketKey, TAG_LEN};

/// The HKDF info of a key update (§6.4).
pub const KEY_UPDATE_LABEL: &[u8] = b"tern ku";

/// Packets one AES-256-GCM key may seal by default: RFC 9001 §6.6's limit for packets of up
/// to 16 KiB (2^23; 2^27 would do for 1 500-byte packets, but PMTU discovery may go to
/// jumbo frames).
pub const DEFAULT_CONFIDENTIALITY_LIMIT: u64 = 1 << 23;

/// Packets that may fail authentication in one connection by default (RFC 9001 §6.6 for
/// AES-GCM: 2^52).
pub const DEFAULT_INTEGRITY_LIMIT: u64 = 1 << 52;

/// Packets kept back below the confidentiality limit for the Close frames (and their
/// resends) of a connection that cannot update in time.
pub const CLOSE_RESERVE: u64 = 8;

/// `k' = HKDF-Expand-SHA256(k, "tern ku", 32)`, with `k` as the pseudorandom key: each key
/// is a fresh secret, so no extraction step is needed.
pub fn next_secret(secret: &[u8; 32]) -> [u8; 32] {
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let info = [KEY_UPDATE_LABEL];
    let mut out = [0; 32];
    prk.expand(&info, Len32)
        .and_then(|okm| okm.fill(&mut out))
        .expect("32 bytes is within HKDF-SHA256's output limit");
    out
}

/// One key of a direction's chain.
struct Generation {
    number: u64,
    secret: [u8; 32],
    key: PacketKey,
}

impl Generation {
    fn first(secret: [u8; 32]) -> Self {
        Self {
            number: 0,
            key: PacketKey::new(&secret),
            secret,
        }
    }

    fn next(&self) -> Self {
        let secret = next_secret(&self.secret);
        Self {
            number: self.number + 1,
            key: PacketKey::new(&secret),
            secret,
        }
    }

    fn phase(&self) -> bool {
        self.number & 1 == 1
    }
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generation({})", self.number)
    }
}

/// Which key opened a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The current receive key.
    Current,
    /// The previous receive key: the packet was sent before an update and overtaken.
    Previous,
    /// The next receive key: the peer updated, and the receive keys moved on. If our send
    /// side had not updated yet, it did too (`peer_initiated`).
    Rotated {
        /// The update was the peer's: our send key followed.
        peer_initiated: bool,
    },
}

/// Why a packet was not opened. Neither changes any key state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFailure {
    /// It did not authenticate under the key its phase and packet number point to.
    Authentication,
    /// It belongs to the previous phase (its packet number is below the first of the current
    /// phase on its path), whose key was already discarded.
    UnknownPhase,
}

/// What the send side must do before sealing the next packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendCheck {
    /// Seal with the current key.
    Ok,
    /// The current key reached half the confidentiality limit (and is old enough), or is
    /// near the limit: the send key was updated (generation given).
    Updated(u64),
    /// The current key is about to reach the confidentiality limit and cannot be updated
    /// (the last update is not acknowledged yet): the connection must close.
    LimitReached,
}

/// Why [`KeySchedule::initiate_update`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyUpdateError {
    /// No packet sealed with the current key has been acknowledged yet (a previous update is
    /// pending, or the handshake is not confirmed): the peer may not know the current key,
    /// so it could not derive the one after it.
    #[error("the previous key update is not acknowledged yet")]
    Pending,
    /// The current send key is younger than 3 PTO: packets sealed with the key before it may
    /// still be on their way, and the peer, which keeps one previous key only, would drop
    /// them once a newer key arrives.
    #[error("the current key is too young to be replaced (3 PTO)")]
    TooSoon,
    /// The connection has no packet keys (handshake under way) or is closed.
    #[error("the connection has no packet keys or is closed")]
    NoKeys,
}

/// The packet keys of a connection, both directions, with the key phase and usage counts.
#[derive(Debug)]
pub struct KeySchedule {
    send: Generation,
    /// Packets sealed with the send key.
    sealed: u64,
    /// Per path: the first packet number sealed with the send key. An acknowledgement of it
    /// or a later one proves the peer has the send key.
    send_first_pn: Vec<(u32, u64)>,
    /// A packet sealed with the send key was acknowledged: a new update is allowed.
    send_confirmed: bool,
    /// When the send key became current (`None`: the handshake's key).
    send_since: Option<Instant>,
    recv: Generation,
    /// Per path: the lowest packet number opened with the receive key, which tells a packet
    /// of the previous phase (below it) from one of the next (above it).
    recv_first_pn: Vec<(u32, u64)>,
    /// Expanded on the first packet with the other key phase, not before: an AES-GCM key is
    /// half a kilobyte that 100 000 idle connections should not each hold (its secret is
    /// one HKDF step from `recv`'s; the key phase is visible on the wire, so deriving it
    /// late reveals nothing).
    recv_next: Option<Box<Generation>>,
    /// The previous receive key and when it is discarded.
    recv_prev: Option<Box<(PacketKey, Instant)>>,
    /// A copy of a payload, for a packet that must be tried under two keys (a failed open
    /// overwrites it).
    scratch: Vec<u8>,
    confidentiality_limit: u64,
    integrity_limit: u64,
    /// Packets that failed authentication, all keys together.
    failures: u64,
}

impl KeySchedule {
    /// The keys from the Noise split, `(send, receive)` secrets, with the usage limits.
    pub fn new(
        send: [u8; 32],
        recv: [u8; 32],
        confidentiality_limit: u64,
        integrity_limit: u64,
    ) -> Self {
        let recv = Generation::first(recv);
        Self {
            send: Generation::first(send),
            sealed: 0,
            send_first_pn: Vec::new(),
            send_confirmed: false,
            send_since: None,
            recv_next: None,
            recv,
            recv_first_pn: Vec::new(),
            recv_prev: None,
            scratch: Vec::new(),
            // Below twice the reserve, updates would come before any packet was sealed.
            confidentiality_limit: confidentiality_limit.max(4 * CLOSE_RESERVE),
            integrity_limit: integrity_limit.max(1),
            failures: 0,
        }
    }

    /// Generation of the send key (0: the handshake's).
    pub fn send_generation(&self) -> u64 {
        self.send.number
    }

    /// Generation of the receive key.
    pub fn recv_generation(&self) -> u64 {
        self.recv.number
    }

    /// The key phase bit K of the next packet sent.
    pub fn send_phase(&self) -> bool {
        self.send.phase()
    }

    /// Packets sealed with the current send key.
    pub fn sealed(&self) -> u64 {
        self.sealed
    }

    /// Whether [`KeySchedule::check_send`] could do anything: the send key has sealed half
    /// its limit. Lets the caller skip computing the PTO for every packet.
    pub fn send_check_due(&self) -> bool {
        self.sealed >= self.confidentiality_limit / 2
    }

    /// The key phase of the current receive key: a packet with the other one may rotate.
    pub fn recv_phase(&self) -> bool {
        self.recv.phase()
    }

    /// Whether the previous receive key is still kept (at `now`).
    pub fn has_previous(&self, now: Instant) -> bool {
        self.recv_prev.as_ref().is_some_and(|prev| now < prev.1)
    }

    /// Packets that failed authentication so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Whether the peer must hold the send key: a packet sealed with it was acknowledged (so
    /// the peer has derived the next one) and the peer's own last update was answered.
    fn confirmed(&self) -> bool {
        self.send_confirmed && self.send.number == self.recv.number
    }

    /// Whether the send key has been current for `min_age` (3 PTO) at `now`.
    fn old_enough(&self, now: Instant, min_age: Duration) -> bool {
        self.send_since.is_none_or(|since| now >= since + min_age)
    }

    /// Starts a key update of the send direction (§6.4); the peer follows with its own.
    /// `min_age` is 3 PTO: a key younger than that is not replaced (RFC 9001 §6.5), so that
    /// packets of the key before it have arrived by the time the peer drops it.
    pub fn initiate_update(
        &mut self,
        now: Instant,
        min_age: Duration,
    ) -> Result<u64, KeyUpdateError> {
        if !self.confirmed() {
            return Err(KeyUpdateError::Pending);
        }
        if !self.old_enough(now, min_age) {
            return Err(KeyUpdateError::TooSoon);
        }
        self.update_send(now);
        Ok(self.send.number)
    }

    fn update_send(&mut self, now: Instant) {
        self.send = self.send.next();
        self.sealed = 0;
        self.send_first_pn.clear();
        self.send_confirmed = false;
        self.send_since = Some(now);
    }

    /// Called before each packet is built: updates the send key at half the confidentiality
    /// limit once it is `min_age` (3 PTO) old, which leaves the other half for the
    /// acknowledgement that allows the next update. Near the limit the age is waived (a
    /// late packet of the key before may then be dropped, and is resent); without the
    /// acknowledgement the connection must close.
    pub fn check_send(&mut self, now: Instant, min_age: Duration) -> SendCheck {
        let near_limit = self.sealed + CLOSE_RESERVE >= self.confidentiality_limit;
        let due = self.sealed >= self.confidentiality_limit / 2
            && (near_limit || self.old_enough(now, min_age));
        if due && self.confirmed() {
            self.update_send(now);
            return SendCheck::Updated(self.send.number);
        }
        if near_limit {
            return SendCheck::LimitReached;
        }
        SendCheck::Ok
    }

    /// Encrypts `payload` in place with the send key and returns the tag; `None` once the
    /// key has sealed `confidentiality_limit` packets (it is never used beyond).
    pub fn seal_in_place(
        &mut self,
        path_id: u32,
        pn: u64,
        header: &[u8],
        payload: &mut [u8],
    ) -> Option<[u8; TAG_LEN]> {
        if self.sealed >= self.confidentiality_limit {
            return None;
        }
        let tag = self.send.key.seal_in_place(path_id, pn, header, payload)?;
        self.sealed += 1;
        if !self.send_first_pn.iter().any(|&(p, _)| p == path_id) {
            self.send_first_pn.push((path_id, pn));
        }
        Some(tag)
    }

    /// The peer acknowledged packet `pn` of path `path_id`: if it was sealed with the send
    /// key, the peer holds that key and a new update is allowed.
    pub fn on_acked(&mut self, path_id: u32, pn: u64) {
        if self
            .send_first_pn
            .iter()
            .any(|&(p, first)| p == path_id && pn >= first)
        {
            self.send_confirmed = true;
        }
    }

    /// Counts a packet that failed authentication; true once the integrity limit is reached.
    pub fn on_auth_failure(&mut self) -> bool {
        self.failures += 1;
        self.failures >= self.integrity_limit
    }

    /// Decrypts `payload` (ciphertext and tag) in place with the key that the packet's phase
    /// `key_phase` and packet number point to; returns the plaintext length.
    ///
    /// A packet whose phase differs from the current one is of the previous phase if its
    /// number is below the first one opened in the current phase on its path (a peer's packet
    /// numbers grow on each path, and it switches keys for all paths at once), else of the
    /// next phase; on a path with no packet of the current phase yet it may be either, and
    /// both keys are tried. Only a packet that authenticates under the next key rotates the
    /// keys, so forged packets change nothing. The previous key is discarded `keep` (3 PTO)
    /// after the rotation that made it previous.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        now: Instant,
        keep: Duration,
        path_id: u32,
        pn: u64,
        key_phase: bool,
        header: &[u8],
        payload: &mut [u8],
    ) -> Result<(usize, Opened), OpenFailure> {
        if self.recv_prev.as_ref().is_some_and(|prev| now >= prev.1) {
            self.recv_prev = None;
        }
        let keep_until = now + keep;
        if key_phase == self.recv.phase() {
            let len = self
                .recv
                .key
                .open(path_id, pn, header, payload)
                .ok_or(OpenFailure::Authentication)?;
            self.note_recv_pn(path_id, pn);
            return Ok((len, Opened::Current));
        }
        let first = self
            .recv_first_pn
            .iter()
            .find(|&&(p, _)| p == path_id)
            .map(|&(_, first)| first);
        match (first, self.recv_prev.as_deref()) {
            (Some(first), prev) if pn < first => {
                let (key, _) = prev.as_ref().ok_or(OpenFailure::UnknownPhase)?;
                let len = key
                    .open(path_id, pn, header, payload)
                    .ok_or(OpenFailure::Authentication)?;
                Ok((len, Opened::Previous))
            }
            (None, Some((key, _))) => {
                self.scratch.clear();
                self.scratch.extend_from_slice(payload);
                if let Some(len) = key.open(path_id, pn, header, payload) {
                    return Ok((len, Opened::Previous));
                }
                payload.copy_from_slice(&self.scratch);
                self.open_next(now, keep_until, path_id, pn, header, payload)
            }
            _ => self.open_next(now, keep_until, path_id, pn, header, payload),
        }
    }

    fn open_next(
        &mut self,
        now: Instant,
        keep_until: Instant,
        path_id: u32,
        pn: u64,
        header: &[u8],
        payload: &mut [u8],
    ) -> Result<(usize, Opened), OpenFailure> {
        let recv = &self.recv;
        let next = self.recv_next.get_or_insert_with(|| Box::new(recv.next()));
        let len = next
            .key
            .open(path_id, pn, header, payload)
            .ok_or(OpenFailure::Authentication)?;
        let Some(next) = self.recv_next.take() else {
            return Err(OpenFailure::Authentication);
        };
        let old = std::mem::replace(&mut self.recv, *next);
        self.recv_prev = Some(Box::new((old.key, keep_until)));
        self.recv_first_pn.clear();
        self.note_recv_pn(path_id, pn);
        let peer_initiated = self.send.number < self.recv.number;
        if peer_initiated {
            self.update_send(now);
        }
        Ok((len, Opened::Rotated { peer_initiated }))
    }

    fn note_recv_pn(&mut self, path_id: u32, pn: u64) {
        match self.recv_first_pn.iter_mut().find(|(p, _)| *p == path_id) {
            Some((_, first)) => *first = (*first).min(pn),
            None => self.recv_first_pn.push((path_id, pn)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    /// Client and server schedules from the same split.
    fn pair(limit: u64) -> (KeySchedule, KeySchedule) {
        (
            KeySchedule::new(A, B, limit, 10),
            KeySchedule::new(B, A, limit, 10),
        )
    }

    /// A packet from `from`: (phase, sealed payload).
    fn seal(from: &mut KeySchedule, path: u32, pn: u64) -> (bool, Vec<u8>) {
        let phase = from.send_phase();
        let mut body = pn.to_be_bytes().to_vec();
        let tag = from
            .seal_in_place(path, pn, &[u8::from(phase)], &mut body)
            .expect("within the limit");
        body.extend_from_slice(&tag);
        (phase, body)
    }

    fn open(
        to: &mut KeySchedule,
        now: Instant,
        path: u32,
        pn: u64,
        (phase, mut body): (bool, Vec<u8>),
    ) -> Result<Opened, OpenFailure> {
        let r = to.open(
            now,
            Duration::from_secs(1),
            path,
            pn,
            phase,
            &[u8::from(phase)],
            &mut body,
        );
        if let Ok((len, _)) = r {
            assert_eq!(&body[..len], &pn.to_be_bytes());
        }
        r.map(|(_, o)| o)
    }

    #[test]
    fn next_secret_is_hkdf_expand() {
        // HKDF-Expand(PRK, info, 32) with one block: HMAC-SHA256(PRK, info ‖ 0x01).
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &A);
        let expected = ring::hmac::sign(&key, b"tern ku\x01");
        assert_eq!(&next_secret(&A)[..], expected.as_ref());
        assert_ne!(next_secret(&A), next_secret(&next_secret(&A)));
    }

    #[test]
    fn an_update_rotates_both_directions_and_keeps_the_previous_key_for_late_packets() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        let (mut c, mut s) = pair(1000);
        assert_eq!(
            c.initiate_update(t0, Duration::ZERO),
            Err(KeyUpdateError::Pending)
        );
        let p0 = seal(&mut c, 0, 0);
        let p1 = seal(&mut c, 0, 1);
        assert_eq!(open(&mut s, t0, 0, 0, p0), Ok(Opened::Current));
        // The server's packet 0 acknowledged: the client may update.
        let r0 = seal(&mut s, 0, 0);
        assert_eq!(open(&mut c, t0, 0, 0, r0), Ok(Opened::Current));
        c.on_acked(0, 1);
        assert_eq!(c.initiate_update(t0, Duration::ZERO), Ok(1));
        assert_eq!(
            c.initiate_update(t0, Duration::ZERO),
            Err(KeyUpdateError::Pending)
        );
        let p2 = seal(&mut c, 0, 2);
        assert!(p2.0, "K flipped");
        // Packet 2 (new phase) overtakes packet 1 (old phase).
        assert_eq!(
            open(&mut s, t0, 0, 2, p2),
            Ok(Opened::Rotated {
                peer_initiated: true
            })
        );
        assert_eq!((s.recv_generation(), s.send_generation()), (1, 1));
        assert_eq!(open(&mut s, t0, 0, 1, p1.clone()), Ok(Opened::Previous));
        // The server answers in the new phase; the client rotates without updating again.
        let r1 = seal(&mut s, 0, 1);
        assert_eq!(
            open(&mut c, t0, 0, 1, r1),
            Ok(Opened::Rotated {
                peer_initiated: false
            })
        );
        assert_eq!((c.recv_generation(), c.send_generation()), (1, 1));
        // The previous key goes after its time: a late old-phase packet is then dropped
        // without decryption.
        let later = t0 + Duration::from_secs(2);
        assert!(!s.has_previous(later));
        assert_eq!(
            open(&mut s, later, 0, 1, p1),
            Err(OpenFailure::UnknownPhase)
        );
    }

    #[test]
    fn a_forged_packet_with_a_flipped_phase_changes_nothing() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        let (mut c, mut s) = pair(1000);
        let p0 = seal(&mut c, 0, 0);
        assert_eq!(open(&mut s, t0, 0, 0, p0), Ok(Opened::Current));
        // A forged packet: K = 1, garbage under any key, on a known and a new path.
        for path in [0, 3] {
            let forged = (true, vec![0x5a; 40]);
            assert_eq!(
                open(&mut s, t0, path, 7, forged),
                Err(OpenFailure::Authentication)
            );
        }
        // A genuine packet of generation 0 sealed with its K flipped fails too.
        let (_, body) = seal(&mut c, 0, 1);
        assert_eq!(
            open(&mut s, t0, 0, 1, (true, body)),
            Err(OpenFailure::Authentication)
        );
        assert_eq!((s.recv_generation(), s.send_generation()), (0, 0));
        assert!(!s.has_previous(t0));
        let p2 = seal(&mut c, 0, 2);
        assert_eq!(open(&mut s, t0, 0, 2, p2), Ok(Opened::Current));
        // The caller counts failures; the tenth reaches the integrity limit of `pair`.
        assert!((1..10).all(|_| !s.on_auth_failure()));
        assert!(s.on_auth_failure());
        assert_eq!(s.failures(), 10);
    }

    #[test]
    fn on_a_path_without_current_phase_packets_both_neighbours_are_tried() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        let (mut c, mut s) = pair(1000);
        let a0 = seal(&mut c, 0, 0);
        let b0 = seal(&mut c, 1, 0);
        assert_eq!(open(&mut s, t0, 0, 0, a0), Ok(Opened::Current));
        c.on_acked(0, 0);
        let r0 = seal(&mut s, 0, 0);
        open(&mut c, t0, 0, 0, r0).unwrap();
        c.initiate_update(t0, Duration::ZERO).unwrap();
        let a1 = seal(&mut c, 0, 1);
        let b1 = seal(&mut c, 1, 1);
        // Path 0 moves to phase 1; path 1's old packet 0 then arrives, then its new packet 1.
        assert!(matches!(
            open(&mut s, t0, 0, 1, a1),
            Ok(Opened::Rotated { .. })
        ));
        assert_eq!(open(&mut s, t0, 1, 0, b0), Ok(Opened::Previous));
        assert_eq!(open(&mut s, t0, 1, 1, b1), Ok(Opened::Current));
    }

    #[test]
    fn the_send_key_updates_at_half_the_limit_and_closes_when_it_cannot() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        let (mut c, _) = pair(64);
        let mut pn = 0;
        // Nothing acknowledged: no update possible, so the limit is reached.
        let mut last = SendCheck::Ok;
        while last == SendCheck::Ok {
            seal(&mut c, 0, pn);
            pn += 1;
            last = c.check_send(t0, Duration::ZERO);
        }
        assert_eq!(last, SendCheck::LimitReached);
        assert_eq!(c.sealed(), 64 - CLOSE_RESERVE);
        // The reserve is for Close frames; beyond the limit nothing is sealed.
        for _ in 0..CLOSE_RESERVE {
            seal(&mut c, 0, pn);
            pn += 1;
        }
        assert_eq!(c.seal_in_place(0, pn, b"", &mut []), None);

        // With every packet acknowledged at once, the key rolls over every 32 packets.
        let (mut c, mut s) = pair(64);
        for pn in 0..200 {
            assert_ne!(c.check_send(t0, Duration::ZERO), SendCheck::LimitReached);
            let p = seal(&mut c, 0, pn);
            assert!(open(&mut s, t0, 0, pn, p).is_ok());
            let ack = seal(&mut s, 0, pn);
            assert!(open(&mut c, t0, 0, pn, ack).is_ok());
            c.on_acked(0, pn);
        }
        assert_eq!(c.send_generation(), 199 / 32);
        assert_eq!(s.recv_generation(), c.send_generation());
    }

    #[test]
    fn a_key_younger_than_3_pto_is_replaced_only_near_the_limit() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        let age = Duration::from_millis(300);
        let (mut c, mut s) = pair(64);
        // Exchange one packet each way under generation `g` and acknowledge it.
        let mut pn = 0;
        let mut round = |c: &mut KeySchedule, s: &mut KeySchedule, now| {
            let p = seal(c, 0, pn);
            assert!(open(s, now, 0, pn, p).is_ok());
            let a = seal(s, 0, pn);
            assert!(open(c, now, 0, pn, a).is_ok());
            c.on_acked(0, pn);
            pn += 1;
        };
        round(&mut c, &mut s, t0);
        assert_eq!(
            c.initiate_update(t0, age),
            Ok(1),
            "the first key has no age"
        );
        round(&mut c, &mut s, t0);
        let soon = t0 + Duration::from_millis(100);
        assert_eq!(c.initiate_update(soon, age), Err(KeyUpdateError::TooSoon));
        // At half the limit the young key stays; near the limit it goes anyway.
        while c.sealed() < 32 {
            round(&mut c, &mut s, soon);
        }
        assert_eq!(c.check_send(soon, age), SendCheck::Ok);
        while c.sealed() < 64 - CLOSE_RESERVE - 1 {
            round(&mut c, &mut s, soon);
        }
        assert_eq!(c.check_send(soon, age), SendCheck::Ok);
        round(&mut c, &mut s, soon);
        assert_eq!(c.check_send(soon, age), SendCheck::Updated(2));
        // Once old enough, half the limit is enough.
        while c.sealed() < 32 {
            round(&mut c, &mut s, soon);
        }
        let later = soon + age;
        assert_eq!(c.check_send(later, age), SendCheck::Updated(3));
    }
}
