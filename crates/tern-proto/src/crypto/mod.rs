//! Cryptography: the Noise handshake (IK / XX, via `snow`), packet protection with explicit
//! nonces (AES-256-GCM, by ring or aws-lc-rs, picked per CPU), key update and the AEAD usage
//! limits, the replay window, the first-flight register, retry tokens and stateless-reset
//! tokens.
//!
//! See docs/PROTOCOL.md §6 (packet protection) and §7 (handshake).

mod first_flight;
mod handshake;
mod key_schedule;
mod keys;
mod packet;
mod replay;
mod token;
mod x25519;

pub use first_flight::{FirstFlightRegister, Freshness, Unproven};
pub use handshake::{Handshake, HandshakePattern};
pub use key_schedule::{
    next_secret, KeySchedule, KeyUpdateError, OpenFailure, Opened, SendCheck, CLOSE_RESERVE,
    DEFAULT_CONFIDENTIALITY_LIMIT, DEFAULT_INTEGRITY_LIMIT, KEY_UPDATE_LABEL,
};
pub use keys::{KeyError, PublicKey, StaticKeypair};
pub use packet::{packet_cipher, Cipher, PacketKey, TAG_LEN};
pub use replay::ReplayWindow;
pub use token::{ResetKey, RetryTokenKey, RESET_TOKEN_LEN};

use rand::RngCore;

/// A source of randomness for `snow`, seeded by the caller, so that the core never reads the
/// operating system's RNG: simulations stay reproducible and drivers choose the entropy.
struct SeededRandom(rand_chacha::ChaCha20Rng);

impl snow::types::Random for SeededRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

/// Makes ahead the ephemeral key a handshake seeded with `entropy` will generate (the first
/// 32 bytes of its RNG, as [`SeededRandom`] gives them to snow), and its DH with `peer`, into
/// `keypair`'s cache (see `x25519.rs`). A handshake that finds its key there skips the work;
/// one that does not (another endpoint's key pair, a full cache) does it as before.
pub(crate) fn prepare_ephemeral(
    keypair: &StaticKeypair,
    entropy: &[u8; 32],
    peer: Option<&PublicKey>,
) {
    let private = first_private_key(entropy);
    x25519::prepare(&keypair.prepared, private, peer.map(|p| &p.0));
}

/// The first X25519 private key a handshake (or key generation) seeded with `entropy` draws:
/// the first 32 bytes of its RNG, as [`SeededRandom`] gives them to snow.
fn first_private_key(entropy: &[u8; 32]) -> [u8; 32] {
    use rand::SeedableRng;
    let mut private = [0; 32];
    rand_chacha::ChaCha20Rng::from_seed(*entropy).fill_bytes(&mut private);
    private
}

/// Resolves the Noise primitives: the RNG is ours (seeded), X25519 is aws-lc-rs's
/// (`x25519.rs`), the hash and cipher are snow's defaults.
struct SeededResolver {
    seed: [u8; 32],
    /// The endpoint's static pair, loaded, so that setting it costs nothing.
    known: Option<x25519::LoadedKey>,
    /// Ephemeral keys made ahead.
    prepared: Option<x25519::PreparedKeys>,
    /// The initiator's knowledge of the responder's static key, and the keypair's cache of
    /// DH results with such keys.
    remembered: Option<(x25519::StaticDhCache, [u8; 32])>,
    inner: snow::resolvers::DefaultResolver,
}

impl SeededResolver {
    fn boxed(
        seed: [u8; 32],
        known: Option<&StaticKeypair>,
        remote: Option<&PublicKey>,
    ) -> snow::resolvers::BoxedCryptoResolver {
        Box::new(Self {
            seed,
            known: known.map(|k| k.loaded.clone()),
            prepared: known.map(|k| k.prepared.clone()),
            remembered: known.zip(remote).map(|(k, r)| (k.static_dh.clone(), r.0)),
            inner: snow::resolvers::DefaultResolver,
        })
    }
}

impl snow::resolvers::CryptoResolver for SeededResolver {
    fn resolve_rng(&self) -> Option<Box<dyn snow::types::Random>> {
        use rand::SeedableRng;
        Some(Box::new(SeededRandom(rand_chacha::ChaCha20Rng::from_seed(
            self.seed,
        ))))
    }
    fn resolve_dh(&self, choice: &snow::params::DHChoice) -> Option<Box<dyn snow::types::Dh>> {
        match choice {
            snow::params::DHChoice::Curve25519 => Some(Box::new(x25519::AwsX25519::new(
                self.known.clone(),
                self.remembered.clone(),
                self.prepared.clone(),
            ))),
            _ => self.inner.resolve_dh(choice),
        }
    }
    fn resolve_hash(
        &self,
        choice: &snow::params::HashChoice,
    ) -> Option<Box<dyn snow::types::Hash>> {
        self.inner.resolve_hash(choice)
    }
    fn resolve_cipher(
        &self,
        choice: &snow::params::CipherChoice,
    ) -> Option<Box<dyn snow::types::Cipher>> {
        self.inner.resolve_cipher(choice)
    }
}
