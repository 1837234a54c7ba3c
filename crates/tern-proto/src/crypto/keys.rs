//! Static identity keys (X25519). A node's identity is its public key (DESIGN.md F19).

use std::fmt;

/// Length of an X25519 key, private or public.
pub const KEY_LEN: usize = 32;

/// Why a key could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is neither 64 hex digits nor 43/44 characters of base64.
    #[error("a key is 32 bytes written as 64 hex digits or base64; got {0} characters")]
    BadFormat(usize),
}

/// A static public key: what a client must know for the 1-RTT `IK` handshake.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl PublicKey {
    /// Parses 64 hex digits or standard/URL-safe base64 (with or without padding).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        parse_hex(text)
            .or_else(|| parse_base64(text))
            .map(Self)
            .ok_or(KeyError::BadFormat(text.len()))
    }

    /// The key as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A static key pair. The private half never leaves this struct except through
/// [`StaticKeypair::private_bytes`], which key files use.
#[derive(Clone)]
pub struct StaticKeypair {
    private: [u8; KEY_LEN],
    public: PublicKey,
    /// The private key loaded into aws-lc once, not at every handshake.
    pub(super) loaded: super::x25519::LoadedKey,
    /// Ephemeral keys made ahead for the next handshakes (shared by clones; see
    /// [`Endpoint::prepare_handshake`](crate::Endpoint::prepare_handshake)).
    pub(super) prepared: super::x25519::PreparedKeys,
    /// The static–static DH of this key with servers it connected to with IK (shared by
    /// clones), as WireGuard precomputes it per peer: reconnecting to the same server (a
    /// handover) costs one X25519 less on the client. Only the initiator uses it, so no
    /// one else can probe it for timing.
    pub(super) static_dh: super::x25519::StaticDhCache,
}

impl StaticKeypair {
    /// Generates a key pair from the caller's 32 bytes of entropy (the core has no RNG).
    pub fn generate(entropy: [u8; 32]) -> Self {
        // The key snow's key generation would draw from our seeded RNG, loaded once.
        Self::from_private(super::first_private_key(&entropy))
    }

    /// Rebuilds a key pair from its private half.
    pub fn from_private(private: [u8; KEY_LEN]) -> Self {
        let loaded =
            super::x25519::LoadedKey::new(private).expect("any 32 bytes are an X25519 private key");
        Self {
            public: PublicKey(loaded.public()),
            loaded,
            private,
            static_dh: Default::default(),
            prepared: Default::default(),
        }
    }

    /// The public half: the node's identity.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The private half, for writing a key file.
    pub fn private_bytes(&self) -> &[u8; KEY_LEN] {
        &self.private
    }
}

impl fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

fn parse_hex(text: &str) -> Option<[u8; KEY_LEN]> {
    if text.len() != 2 * KEY_LEN || !text.is_ascii() {
        return None;
    }
    let mut out = [0; KEY_LEN];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn parse_base64(text: &str) -> Option<[u8; KEY_LEN]> {
    let text = text.trim_end_matches('=');
    if text.len() != 43 {
        return None;
    }
    let mut bits: u32 = 0;
    let mut nbits = 0;
    let mut out = Vec::with_capacity(KEY_LEN);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    out.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_makes_the_key_snow_draws_from_the_same_seed() {
        // What `prepare_ephemeral` relies on too: a handshake's first key is this one.
        for seed in [[1; 32], [7; 32], [0xa5; 32]] {
            let pair = snow::Builder::with_resolver(
                super::super::handshake::params(super::super::HandshakePattern::XX),
                super::super::SeededResolver::boxed(seed, None, None),
            )
            .generate_keypair()
            .unwrap();
            let ours = StaticKeypair::generate(seed);
            assert_eq!(&ours.private_bytes()[..], &pair.private[..]);
            assert_eq!(&ours.public().0[..], &pair.public[..]);
        }
    }

    #[test]
    fn public_key_matches_private() {
        let pair = StaticKeypair::generate([7; 32]);
        let again = StaticKeypair::from_private(*pair.private_bytes());
        assert_eq!(pair.public(), again.public());
    }

    #[test]
    fn parse_hex_and_base64() {
        let key = PublicKey([0xab; 32]);
        assert_eq!(PublicKey::parse(&key.to_hex()), Ok(key));
        // 32 bytes of 0xab in base64.
        let b64 = "q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=";
        assert_eq!(PublicKey::parse(b64), Ok(key));
        assert_eq!(PublicKey::parse("nope"), Err(KeyError::BadFormat(4)));
    }
}
