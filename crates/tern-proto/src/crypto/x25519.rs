//! X25519 for the Noise handshake through aws-lc-rs (its assembly is 2.3× faster here than
//! curve25519-dalek's Montgomery ladder, which snow uses by default: 36 µs against 85 µs a
//! scalar multiplication; a handshake does four on each side). Keys still come from our
//! seeded RNG, so simulations stay reproducible.
//!
//! Loading a private key into aws-lc derives its public key, a base-point multiplication
//! (11.5 µs here). So the static key is loaded once per [`StaticKeypair`](super::StaticKeypair),
//! and the next handshake's ephemeral key can be made ahead, while the endpoint has nothing
//! else to do ([`Prepared`]): a cache keyed by the private bytes the handshake's seeded RNG
//! will draw, so a hit or a miss changes the time a handshake takes, never its keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey, X25519};

/// Remembered static–static shared secrets, by the peer's static public key.
pub(crate) type StaticDhCache = Arc<Mutex<HashMap<[u8; 32], [u8; 32]>>>;

/// Most peers remembered (beyond, the cache starts again).
const REMEMBERED_PEERS: usize = 64;

/// Most ephemeral keys prepared ahead and not yet used (endpoints sharing a key pair, such as
/// a server's workers, each prepare their own).
const PREPARED_KEYS: usize = 4;

/// A private key loaded into aws-lc, with its two halves.
#[derive(Clone)]
pub(crate) struct LoadedKey {
    private: [u8; 32],
    public: [u8; 32],
    key: Arc<PrivateKey>,
}

impl LoadedKey {
    /// Loads `private` (one base-point multiplication).
    pub(crate) fn new(private: [u8; 32]) -> Option<Self> {
        let key = PrivateKey::from_private_key(&X25519, &private).ok()?;
        let public = key.compute_public_key().ok()?;
        Some(Self {
            private,
            public: <[u8; 32]>::try_from(public.as_ref()).ok()?,
            key: Arc::new(key),
        })
    }

    pub(crate) fn public(&self) -> [u8; 32] {
        self.public
    }

    /// Whether this is the key of `private` (in constant time: the bytes are secret).
    fn is(&self, private: &[u8; 32]) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(&self.private, private).is_ok()
    }
}

/// An ephemeral key made before its handshake, and, for an initiator that knows which
/// server it will talk to next, its DH with that server's static key (Noise's `es`): an
/// `IK` initiator then spends no X25519 before its first message leaves.
#[derive(Clone)]
pub(crate) struct Prepared {
    key: LoadedKey,
    /// The peer's static public key and the shared secret with it.
    es: Option<([u8; 32], [u8; 32])>,
}

#[cfg(test)]
impl Prepared {
    /// Flips a bit of the prepared `es` (tests that it is the one used).
    pub(crate) fn spoil_es_for_test(&mut self) {
        if let Some((_, secret)) = &mut self.es {
            secret[0] ^= 1;
        }
    }
}

/// Ephemeral keys prepared ahead, shared by the clones of a key pair.
pub(crate) type PreparedKeys = Arc<Mutex<Vec<Prepared>>>;

/// Prepares the ephemeral key of `private` (and its DH with `peer`, if given) into `keys`.
/// Nothing is kept if aws-lc refuses the key; a peer key it refuses is left out.
pub(crate) fn prepare(keys: &PreparedKeys, private: [u8; 32], peer: Option<&[u8; 32]>) {
    let Some(key) = LoadedKey::new(private) else {
        return;
    };
    let es = peer.and_then(|peer| {
        let mut secret = [0; 32];
        agree(&key.key, peer, &mut secret).ok()?;
        Some((*peer, secret))
    });
    let mut keys = keys.lock().unwrap_or_else(|p| p.into_inner());
    if keys.len() >= PREPARED_KEYS {
        keys.remove(0);
    }
    keys.push(Prepared { key, es });
}

/// snow's `Dh` over aws-lc-rs X25519. The endpoint's static pair is loaded up front, so that
/// setting it (every handshake) costs a comparison, not a base-point multiplication.
pub(super) struct AwsX25519 {
    private: [u8; 32],
    public: [u8; 32],
    key: Option<Arc<PrivateKey>>,
    /// The endpoint's static key pair, if known.
    known: Option<LoadedKey>,
    /// Whether the loaded key is that static key.
    is_static: bool,
    /// The peer's static key as the initiator knows it, and where DH results with it are
    /// remembered.
    remembered: Option<(StaticDhCache, [u8; 32])>,
    /// Ephemeral keys made ahead; the one in use, if it came from there, keeps its `es`.
    prepared: Option<PreparedKeys>,
    es: Option<([u8; 32], [u8; 32])>,
}

impl AwsX25519 {
    pub(super) fn new(
        known: Option<LoadedKey>,
        remembered: Option<(StaticDhCache, [u8; 32])>,
        prepared: Option<PreparedKeys>,
    ) -> Self {
        Self {
            private: [0; 32],
            public: [0; 32],
            key: None,
            known,
            is_static: false,
            remembered,
            prepared,
            es: None,
        }
    }

    fn load(&mut self, private: [u8; 32]) {
        self.private = private;
        self.es = None;
        self.is_static = self.known.as_ref().is_some_and(|k| k.is(&private));
        let found = if self.is_static {
            self.known.clone()
        } else {
            self.take_prepared(&private)
        };
        match found.or_else(|| LoadedKey::new(private)) {
            Some(loaded) => {
                self.public = loaded.public;
                self.key = Some(loaded.key);
            }
            None => {
                self.public = [0; 32];
                self.key = None;
            }
        }
    }

    /// The prepared ephemeral key of `private`, if one was made, taken out of the cache.
    fn take_prepared(&mut self, private: &[u8; 32]) -> Option<LoadedKey> {
        let keys = self.prepared.as_ref()?;
        let mut keys = keys.lock().unwrap_or_else(|p| p.into_inner());
        let i = keys.iter().position(|p| p.key.is(private))?;
        let prepared = keys.remove(i);
        self.es = prepared.es;
        Some(prepared.key)
    }
}

impl snow::types::Dh for AwsX25519 {
    fn name(&self) -> &'static str {
        "25519"
    }

    fn pub_len(&self) -> usize {
        32
    }

    fn priv_len(&self) -> usize {
        32
    }

    fn set(&mut self, privkey: &[u8]) {
        let mut private = [0; 32];
        let n = privkey.len().min(32);
        private[..n].copy_from_slice(&privkey[..n]);
        self.load(private);
    }

    fn generate(&mut self, rng: &mut dyn snow::types::Random) -> Result<(), snow::Error> {
        let mut private = [0; 32];
        rng.try_fill_bytes(&mut private)?;
        self.load(private);
        Ok(())
    }

    fn pubkey(&self) -> &[u8] {
        &self.public
    }

    fn privkey(&self) -> &[u8] {
        &self.private
    }

    /// Refuses a low-order peer key (an all-zero shared secret), which snow's default
    /// accepts: such a handshake fails instead of running on a secret anyone knows.
    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        if let Some((peer, secret)) = &self.es {
            if pubkey.get(..32) == Some(&peer[..]) {
                let n = out.len().min(32);
                out[..n].copy_from_slice(&secret[..n]);
                return Ok(());
            }
        }
        let remembered = self
            .remembered
            .as_ref()
            .filter(|(_, peer)| self.is_static && pubkey.get(..32) == Some(&peer[..]));
        if let Some((cache, peer)) = remembered {
            let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(secret) = cache.get(peer) {
                let n = out.len().min(32);
                out[..n].copy_from_slice(&secret[..n]);
                return Ok(());
            }
        }
        self.agree(pubkey, out)?;
        if let Some((cache, peer)) = remembered {
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= REMEMBERED_PEERS {
                cache.clear();
            }
            let mut secret = [0; 32];
            let n = out.len().min(32);
            secret[..n].copy_from_slice(&out[..n]);
            cache.insert(*peer, secret);
        }
        Ok(())
    }
}

impl AwsX25519 {
    fn agree(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let key = self.key.as_ref().ok_or(snow::Error::Dh)?;
        agree(key, pubkey, out)
    }
}

/// X25519 of `key` with the peer's public key; refuses a low-order one.
fn agree(key: &PrivateKey, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
    let peer = UnparsedPublicKey::new(&X25519, pubkey.get(..32).ok_or(snow::Error::Dh)?);
    agreement::agree(key, peer, snow::Error::Dh, |secret| {
        let n = secret.len().min(out.len());
        out[..n].copy_from_slice(&secret[..n]);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use snow::types::Dh;

    #[test]
    fn agrees_with_rfc_7748() {
        // RFC 7748 §6.1.
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..64)
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let alice = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let alice_pub = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        let bob = hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
        let bob_pub = hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
        let shared = hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
        assert_eq!(LoadedKey::new(alice).map(|k| k.public()), Some(alice_pub));
        let mut a = AwsX25519::new(None, None, None);
        a.set(&alice);
        assert_eq!(a.pubkey(), alice_pub);
        let mut out = [0; 32];
        a.dh(&bob_pub, &mut out).unwrap();
        assert_eq!(out, shared);
        // The known pair is taken as given.
        let mut b = AwsX25519::new(LoadedKey::new(bob), None, None);
        b.set(&bob);
        assert_eq!(b.pubkey(), bob_pub);
        b.dh(&alice_pub, &mut out).unwrap();
        assert_eq!(out, shared);
    }

    #[test]
    fn a_low_order_peer_key_is_refused() {
        let mut a = AwsX25519::new(None, None, None);
        a.set(&[9; 32]);
        let mut out = [0; 32];
        assert!(a.dh(&[0; 32], &mut out).is_err());
        let mut one = [0; 32];
        one[0] = 1;
        assert!(a.dh(&one, &mut out).is_err());
    }
}
