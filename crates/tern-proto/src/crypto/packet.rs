//! Packet protection: AES-256-GCM with keys from the Noise split and an explicit nonce built
//! from the path ID and the full packet number (docs/PROTOCOL.md §6). The short header is the
//! associated data, so every header bit except the router-writable feedback rate is covered.
//!
//! Two implementations of the same cipher are linked, and each process picks one once, from
//! its CPU's features ([`packet_cipher`]); the bytes on the wire are the same either way.
//! AES-GCM is the largest single item of a bulk receiver's CPU (36–49 % in profiles of `tern
//! perf`), and which implementation is faster depends on the CPU's vector extensions
//! (measured with ring 0.17.14 and aws-lc-rs 1.19 / aws-lc-sys 0.47, GB/s of one core):
//!
//! - With AVX-512 and VAES, **aws-lc-rs**, which has AVX-512 code for it: on the host of
//!   2026-11-28 it sealed 8 972-byte datagrams (loopback's path MTU) at 8.7 GB/s against
//!   ring's 6.5 (and 1 452-byte ones 7 % faster, 1 200-byte ones 7 % slower). That host's
//!   results record only "AMD EPYC"; that it had AVX-512 is inferred from aws-lc-rs being the
//!   faster there.
//! - Otherwise **ring**, which has VAES-AVX2 code: on an AMD EPYC host with VAES but without
//!   AVX-512 it sealed 8 972-byte datagrams at 6.3 GB/s against aws-lc-rs's 3.5, and
//!   1 452-byte ones at 3.6–4.1 against 2.2–2.6 (aws-lc-rs falls back to its AES-NI code
//!   there; `examples/aead_cost` measures both). Where neither extension exists, both run
//!   the same AES-NI code.
//!
//! docs/BENCHMARKS.md "AES-GCM picked per CPU" has the figures.

use std::sync::OnceLock;

use aws_lc_rs::aead as aws_aead;
use ring::aead as ring_aead;

/// Length of the authentication tag appended to every protected payload.
pub const TAG_LEN: usize = 16;

/// Length of the AEAD nonce (the path ID and the packet number).
const NONCE_LEN: usize = 12;

/// An implementation of AES-256-GCM (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    /// ring's (VAES-AVX2 or AES-NI code).
    Ring,
    /// aws-lc-rs's (AVX-512 or AES-NI code).
    AwsLc,
}

impl Cipher {
    /// The faster implementation on this CPU (module docs). aws-lc-rs only where aws-lc runs
    /// its AVX-512 AES-GCM: its own test (`crypto_gcm_avx512_enabled` in aws-lc's
    /// `modes/gcm.c`) asks for AVX-512 F, DQ, BW and VL with VAES and VPCLMULQDQ, and leaves
    /// that code out on Windows.
    fn detect() -> Self {
        #[cfg(all(target_arch = "x86_64", not(windows)))]
        {
            let avx512 = std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512dq")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl");
            let vaes = std::is_x86_feature_detected!("vaes")
                && std::is_x86_feature_detected!("vpclmulqdq");
            if avx512 && vaes {
                Cipher::AwsLc
            } else {
                Cipher::Ring
            }
        }
        #[cfg(all(target_arch = "x86_64", windows))]
        {
            Cipher::Ring
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            // ARMv8's AES and PMULL, where aws-lc-rs has code unrolled for recent cores; other
            // targets have no measurement here and keep the implementation tern used first.
            Cipher::AwsLc
        }
    }

    /// The implementation this process uses, detected once.
    pub fn current() -> Self {
        static CIPHER: OnceLock<Cipher> = OnceLock::new();
        *CIPHER.get_or_init(Cipher::detect)
    }

    /// `"ring"` or `"aws-lc-rs"`.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Ring => "ring",
            Cipher::AwsLc => "aws-lc-rs",
        }
    }
}

/// The AES-256-GCM implementation this process protects packets with: `"ring"` or
/// `"aws-lc-rs"`, chosen once from the CPU's features (module docs). For logs and benchmark
/// reports; the wire is the same with either.
pub fn packet_cipher() -> &'static str {
    Cipher::current().name()
}

/// One direction's packet key.
pub struct PacketKey(Key);

/// The expanded key of the implementation in use. ring's lives inline (half a kilobyte, so it
/// is boxed to keep the size of a connection's key schedule the same with either); aws-lc-rs's
/// is a handle to a context on the C heap.
enum Key {
    Ring(Box<ring_aead::LessSafeKey>),
    AwsLc(aws_aead::LessSafeKey),
}

impl std::fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketKey(..)")
    }
}

fn nonce_bytes(path_id: u32, pn: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[..4].copy_from_slice(&path_id.to_be_bytes());
    n[4..].copy_from_slice(&pn.to_be_bytes());
    n
}

impl PacketKey {
    /// A key from 32 bytes of Noise split output.
    pub fn new(key: &[u8; 32]) -> Self {
        Self::with_cipher(Cipher::current(), key)
    }

    /// A key of a given implementation (tests compare them byte for byte; `examples/aead_cost`
    /// times them).
    pub fn with_cipher(cipher: Cipher, key: &[u8; 32]) -> Self {
        const VALID: &str = "a 32-byte key is valid for AES-256-GCM";
        Self(match cipher {
            Cipher::Ring => Key::Ring(Box::new(ring_aead::LessSafeKey::new(
                ring_aead::UnboundKey::new(&ring_aead::AES_256_GCM, key).expect(VALID),
            ))),
            Cipher::AwsLc => Key::AwsLc(aws_aead::LessSafeKey::new(
                aws_aead::UnboundKey::new(&aws_aead::AES_256_GCM, key).expect(VALID),
            )),
        })
    }

    /// Encrypts `payload` in place and appends the tag. Packet numbers are never reused on a
    /// path, so (path, pn) is a unique nonce for this key.
    pub fn seal(&self, path_id: u32, pn: u64, header: &[u8], payload: &mut Vec<u8>) {
        self.seal_in_place(path_id, pn, header, payload.as_mut_slice())
            .map(|tag| payload.extend_from_slice(&tag))
            .expect("AES-GCM sealing fails only on absurd lengths");
    }

    /// Encrypts `payload` in place and returns the tag, for callers that lay packets out in
    /// one buffer.
    pub fn seal_in_place(
        &self,
        path_id: u32,
        pn: u64,
        header: &[u8],
        payload: &mut [u8],
    ) -> Option<[u8; TAG_LEN]> {
        let n = nonce_bytes(path_id, pn);
        match &self.0 {
            Key::Ring(k) => k
                .seal_in_place_separate_tag(
                    ring_aead::Nonce::assume_unique_for_key(n),
                    ring_aead::Aad::from(header),
                    payload,
                )
                .ok()?
                .as_ref()
                .try_into()
                .ok(),
            Key::AwsLc(k) => k
                .seal_in_place_separate_tag(
                    aws_aead::Nonce::assume_unique_for_key(n),
                    aws_aead::Aad::from(header),
                    payload,
                )
                .ok()?
                .as_ref()
                .try_into()
                .ok(),
        }
    }

    /// Decrypts `payload` (ciphertext plus tag) in place; returns the plaintext length, or
    /// `None` if it does not authenticate.
    pub fn open(&self, path_id: u32, pn: u64, header: &[u8], payload: &mut [u8]) -> Option<usize> {
        let n = nonce_bytes(path_id, pn);
        match &self.0 {
            Key::Ring(k) => k
                .open_in_place(
                    ring_aead::Nonce::assume_unique_for_key(n),
                    ring_aead::Aad::from(header),
                    payload,
                )
                .ok()
                .map(|plain| plain.len()),
            Key::AwsLc(k) => k
                .open_in_place(
                    aws_aead::Nonce::assume_unique_for_key(n),
                    aws_aead::Aad::from(header),
                    payload,
                )
                .ok()
                .map(|plain| plain.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: [Cipher; 2] = [Cipher::Ring, Cipher::AwsLc];

    #[test]
    fn tampering_is_detected() {
        for cipher in BOTH {
            let key = PacketKey::with_cipher(cipher, &[5; 32]);
            let mut p = b"abc".to_vec();
            key.seal(0, 1, b"h", &mut p);
            let mut bad = p.clone();
            bad[0] ^= 1;
            assert!(key.open(0, 1, b"h", &mut bad).is_none(), "{cipher:?}");
            assert!(key.open(0, 2, b"h", &mut p.clone()).is_none(), "other pn");
            assert!(key.open(1, 1, b"h", &mut p.clone()).is_none(), "other path");
            assert!(
                key.open(0, 1, b"H", &mut p.clone()).is_none(),
                "other header"
            );
            assert_eq!(key.open(0, 1, b"h", &mut p), Some(3), "{cipher:?}");
        }
    }

    /// Each process picks its implementation by CPU, so two ends may differ: every byte one
    /// seals, the other must open, and both must write the same bytes.
    #[test]
    fn ring_and_aws_lc_rs_agree_on_every_byte() {
        let secret = [9u8; 32];
        let ring = PacketKey::with_cipher(Cipher::Ring, &secret);
        let aws = PacketKey::with_cipher(Cipher::AwsLc, &secret);
        for len in [0usize, 1, 15, 16, 17, 1200, 1452, 8972] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let header = b"short header";
            let mut by_ring = plain.clone();
            ring.seal(3, 77, header, &mut by_ring);
            let mut by_aws = plain.clone();
            aws.seal(3, 77, header, &mut by_aws);
            assert_eq!(by_aws, by_ring, "{len} bytes");
            assert_eq!(aws.open(3, 77, header, &mut by_ring), Some(len));
            assert_eq!(&by_ring[..len], &plain[..]);
            assert_eq!(ring.open(3, 77, header, &mut by_aws), Some(len));
            assert_eq!(&by_aws[..len], &plain[..]);
        }
    }
}
