//! Server-private tokens: retry tokens that prove a client's address without server state
//! (docs/PROTOCOL.md §7.5), and stateless-reset tokens (§14.3).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ring::{aead, hmac};

use crate::wire::ConnectionId;

/// Length of a stateless-reset token.
pub const RESET_TOKEN_LEN: usize = 16;

/// Derives stateless-reset tokens: HMAC-SHA256(key, connection ID), truncated. A node that
/// lost its state but kept this key can still end its peers' connections.
pub struct ResetKey(hmac::Key);

impl std::fmt::Debug for ResetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResetKey(..)")
    }
}

impl ResetKey {
    /// A key from 32 secret bytes.
    pub fn new(secret: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The reset token for one of our connection IDs.
    pub fn token(&self, cid: &ConnectionId) -> [u8; RESET_TOKEN_LEN] {
        let tag = hmac::sign(&self.0, cid.as_ref());
        let mut out = [0; RESET_TOKEN_LEN];
        out.copy_from_slice(&tag.as_ref()[..RESET_TOKEN_LEN]);
        out
    }
}

/// Seals and opens retry tokens: AES-256-GCM over (issue time, client address, original
/// destination CID), so only this endpoint can make or read them.
pub struct RetryTokenKey(aead::LessSafeKey);

impl std::fmt::Debug for RetryTokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryTokenKey(..)")
    }
}

const NONCE_LEN: usize = aead::NONCE_LEN;

impl RetryTokenKey {
    /// A key from 32 secret bytes.
    pub fn new(secret: &[u8; 32]) -> Self {
        let key = aead::UnboundKey::new(&aead::AES_256_GCM, secret)
            .expect("a 32-byte key is valid for AES-256-GCM");
        Self(aead::LessSafeKey::new(key))
    }

    /// A token for `client` issued at `issued` (time since the endpoint's epoch).
    /// `nonce` must be fresh random bytes.
    pub fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        issued: Duration,
        client: SocketAddr,
        original_dcid: &ConnectionId,
    ) -> Vec<u8> {
        let mut plain = Vec::with_capacity(64);
        plain.extend_from_slice(&(issued.as_millis() as u64).to_be_bytes());
        plain.push(original_dcid.len() as u8);
        plain.extend_from_slice(original_dcid.as_ref());
        let mut out = nonce.to_vec();
        let aad = addr_bytes(client);
        self.0
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(&aad[..]),
                &mut plain,
            )
            .expect("sealing a short token cannot fail");
        out.extend_from_slice(&plain);
        out
    }

    /// Opens a token presented by `client`; returns the original destination CID if the token
    /// is authentic, was issued to this address and is younger than `lifetime`.
    pub fn open(
        &self,
        token: &[u8],
        client: SocketAddr,
        now: Duration,
        lifetime: Duration,
    ) -> Option<ConnectionId> {
        if token.len() < NONCE_LEN + 9 + aead::AES_256_GCM.tag_len() {
            return None;
        }
        let (nonce, sealed) = token.split_at(NONCE_LEN);
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let aad = addr_bytes(client);
        let plain = self
            .0
            .open_in_place(nonce, aead::Aad::from(&aad[..]), &mut buf)
            .ok()?;
        let issued = u64::from_be_bytes(plain.get(..8)?.try_into().ok()?);
        let len = usize::from(*plain.get(8)?);
        let cid = ConnectionId::new(plain.get(9..9 + len)?).ok()?;
        let age = now.as_millis() as u64;
        (age >= issued && age - issued <= lifetime.as_millis() as u64).then_some(cid)
    }
}

fn addr_bytes(addr: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(18);
    match addr.ip() {
        IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_token_binds_address_and_time() {
        let key = RetryTokenKey::new(&[1; 32]);
        let addr: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let other: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        let cid = ConnectionId::new(&[1, 2, 3, 4]).unwrap();
        let t = key.seal([9; 12], Duration::from_secs(5), addr, &cid);
        let life = Duration::from_secs(10);
        assert_eq!(key.open(&t, addr, Duration::from_secs(6), life), Some(cid));
        assert_eq!(key.open(&t, other, Duration::from_secs(6), life), None);
        assert_eq!(key.open(&t, addr, Duration::from_secs(16), life), None);
        let mut bad = t.clone();
        bad[20] ^= 1;
        assert_eq!(key.open(&bad, addr, Duration::from_secs(6), life), None);
        assert_eq!(key.open(&t[..10], addr, Duration::from_secs(6), life), None);
    }

    #[test]
    fn reset_tokens_differ_per_cid() {
        let key = ResetKey::new(&[2; 32]);
        let a = ConnectionId::new(&[1; 8]).unwrap();
        let b = ConnectionId::new(&[2; 8]).unwrap();
        assert_ne!(key.token(&a), key.token(&b));
        assert_eq!(key.token(&a), key.token(&a));
    }
}
