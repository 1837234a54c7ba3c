//! Connection IDs a load balancer can route without state: QUIC-LB
//! (draft-ietf-quic-load-balancers-21, "Server ID Encoding in Connection IDs").
//!
//! A server's connection IDs carry its *server ID*, encrypted with a key it shares with the
//! balancers; a balancer decrypts the ID of every packet and forwards it to that server, so
//! a connection survives the client's address changes behind an L4 balancer and N servers
//! share no state. The same encoding steers datagrams between the worker threads of one
//! host (the worker's index is the last byte of the server ID; see `tern::EndpointBuilder`).
//!
//! Layout: a first octet (3 config-rotation bits, 5 bits of length self-description), then
//! `server ID ‖ nonce`, encrypted as one AES-128 block when they sum to 16 bytes and with
//! the draft's four-pass Feistel network of AES-128-ECB rounds otherwise (tern's 8-byte
//! connection IDs: 7 bytes, e.g. a 3-byte server ID and a 4-byte nonce). Without a key the
//! server ID is in clear.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;

use crate::wire::ConnectionId;

/// Why a QUIC-LB configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbConfigError {
    /// Config rotation codepoints are 0–6 (7 marks unroutable IDs).
    #[error("config rotation id {0} is not 0-6")]
    ConfigId(u8),
    /// The server ID is at least 1 byte, the nonce at least 4, and both at most 19.
    #[error("server ID of {server_id} bytes and nonce of {nonce} bytes: need >= 1, >= 4 and a sum <= 19")]
    Lengths {
        /// Server ID length.
        server_id: usize,
        /// Nonce length.
        nonce: usize,
    },
    /// A server ID of the wrong length for this configuration.
    #[error("server ID is {got} bytes, the configuration says {want}")]
    ServerIdLength {
        /// The configuration's length.
        want: usize,
        /// The ID's.
        got: usize,
    },
    /// tern's connection IDs have a fixed length; the configuration must produce it.
    #[error("the configuration makes {got}-byte connection IDs; tern uses {want}")]
    CidLength {
        /// tern's length.
        want: usize,
        /// The configuration's.
        got: usize,
    },
}

/// One QUIC-LB configuration: what servers and balancers share.
#[derive(Clone)]
pub struct QuicLb {
    config_id: u8,
    server_id_len: usize,
    nonce_len: usize,
    cipher: Option<Aes128>,
}

impl std::fmt::Debug for QuicLb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicLb")
            .field("config_id", &self.config_id)
            .field("server_id_len", &self.server_id_len)
            .field("nonce_len", &self.nonce_len)
            .field("encrypted", &self.cipher.is_some())
            .finish()
    }
}

impl QuicLb {
    /// A configuration: rotation codepoint `config_id` (0–6), server IDs of
    /// `server_id_len` bytes, nonces of `nonce_len`, and the key shared with the balancers
    /// (`None`: server IDs in clear, which lets observers link a client's addresses).
    pub fn new(
        config_id: u8,
        server_id_len: usize,
        nonce_len: usize,
        key: Option<[u8; 16]>,
    ) -> Result<Self, LbConfigError> {
        if config_id > 6 {
            return Err(LbConfigError::ConfigId(config_id));
        }
        if server_id_len == 0 || nonce_len < 4 || server_id_len + nonce_len > 19 {
            return Err(LbConfigError::Lengths {
                server_id: server_id_len,
                nonce: nonce_len,
            });
        }
        Ok(Self {
            config_id,
            server_id_len,
            nonce_len,
            cipher: key.map(|k| Aes128::new(&k.into())),
        })
    }

    /// Length of the connection IDs this configuration makes (first octet included).
    pub fn cid_len(&self) -> usize {
        1 + self.plaintext_len()
    }

    /// Length of the server IDs.
    pub fn server_id_len(&self) -> usize {
        self.server_id_len
    }

    fn plaintext_len(&self) -> usize {
        self.server_id_len + self.nonce_len
    }

    /// The connection ID for `server_id` and `nonce` (of the configured lengths; `None`
    /// otherwise). The first octet's low 5 bits self-describe the length.
    pub fn encode(&self, server_id: &[u8], nonce: &[u8]) -> Option<ConnectionId> {
        if server_id.len() != self.server_id_len || nonce.len() != self.nonce_len {
            return None;
        }
        let len = self.plaintext_len();
        let mut out = [0u8; 20];
        out[0] = (self.config_id << 5) | (len as u8 & 0x1f);
        let body = &mut out[1..=len];
        body[..server_id.len()].copy_from_slice(server_id);
        body[server_id.len()..].copy_from_slice(nonce);
        if let Some(cipher) = &self.cipher {
            if len == 16 {
                let mut block = aes::Block::clone_from_slice(body);
                cipher.encrypt_block(&mut block);
                body.copy_from_slice(&block);
            } else {
                feistel(cipher, body, true);
            }
        }
        ConnectionId::new(&out[..=len]).ok()
    }

    /// The server ID and nonce in `cid`, if it is one of this configuration's (its rotation
    /// bits and length match). A balancer needs only the server ID ([`QuicLb::server_id`]).
    pub fn decode(&self, cid: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let len = self.plaintext_len();
        let first = *cid.first()?;
        if first >> 5 != self.config_id || cid.len() < 1 + len {
            return None;
        }
        let mut body = [0u8; 19];
        let body = &mut body[..len];
        body.copy_from_slice(&cid[1..=len]);
        if let Some(cipher) = &self.cipher {
            if len == 16 {
                use aes::cipher::BlockDecrypt;
                let mut block = aes::Block::clone_from_slice(body);
                cipher.decrypt_block(&mut block);
                body.copy_from_slice(&block);
            } else {
                feistel(cipher, body, false);
            }
        }
        let (sid, nonce) = body.split_at(self.server_id_len);
        Some((sid.to_vec(), nonce.to_vec()))
    }

    /// The server ID a packet with destination connection ID `cid` goes to.
    pub fn server_id(&self, cid: &[u8]) -> Option<Vec<u8>> {
        self.decode(cid).map(|(sid, _)| sid)
    }
}

/// What a server puts in its connection IDs: the configuration and its own server ID.
#[derive(Clone, Debug)]
pub struct RoutableCids {
    lb: QuicLb,
    server_id: Vec<u8>,
}

impl RoutableCids {
    /// `server_id` under `lb`, which must make connection IDs of tern's length (8 bytes: a
    /// server ID and a nonce that sum to 7, the nonce at least 4).
    pub fn new(lb: QuicLb, server_id: &[u8]) -> Result<Self, LbConfigError> {
        if server_id.len() != lb.server_id_len {
            return Err(LbConfigError::ServerIdLength {
                want: lb.server_id_len,
                got: server_id.len(),
            });
        }
        if lb.cid_len() != crate::wire::DEFAULT_CID_LEN {
            return Err(LbConfigError::CidLength {
                want: crate::wire::DEFAULT_CID_LEN,
                got: lb.cid_len(),
            });
        }
        Ok(Self {
            lb,
            server_id: server_id.to_vec(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &QuicLb {
        &self.lb
    }

    /// This server's ID.
    pub fn server_id(&self) -> &[u8] {
        &self.server_id
    }

    /// A new connection ID with a nonce from `random` (of the configured length).
    pub(crate) fn generate(&self, random: &[u8]) -> Option<ConnectionId> {
        self.lb
            .encode(&self.server_id, random.get(..self.lb.nonce_len)?)
    }
}

/// The four-pass Feistel network of the draft (§ "General Case: Four-Pass Encryption"), in
/// place over `body` (5–19 bytes but not 16). For an odd length the halves share the middle
/// byte: the left half keeps its high nibble, the right half its low one.
fn feistel(cipher: &Aes128, body: &mut [u8], encrypt: bool) {
    let len = body.len();
    let half = len.div_ceil(2);
    let odd = len % 2 == 1;
    let mut left = [0u8; 10];
    let mut right = [0u8; 10];
    left[..half].copy_from_slice(&body[..half]);
    right[..half].copy_from_slice(&body[len - half..]);
    let (left, right) = (&mut left[..half], &mut right[..half]);
    let clear_left = |l: &mut [u8]| {
        if odd {
            l[half - 1] &= 0xf0;
        }
    };
    let clear_right = |r: &mut [u8]| {
        if odd {
            r[0] &= 0x0f;
        }
    };
    clear_left(left);
    clear_right(right);
    let round = |pass: u8, input: &[u8], target: &mut [u8]| {
        let mut block = aes::Block::default();
        block[..input.len()].copy_from_slice(input);
        block[14] = len as u8;
        block[15] = pass;
        cipher.encrypt_block(&mut block);
        for (t, b) in target.iter_mut().zip(block.iter()) {
            *t ^= b;
        }
    };
    if encrypt {
        round(1, left, right);
        clear_right(right);
        round(2, right, left);
        clear_left(left);
        round(3, left, right);
        clear_right(right);
        round(4, right, left);
        clear_left(left);
    } else {
        round(4, right, left);
        clear_left(left);
        round(3, left, right);
        clear_right(right);
        round(2, right, left);
        clear_left(left);
        round(1, left, right);
        clear_right(right);
    }
    body[..half].copy_from_slice(left);
    if odd {
        body[half - 1] |= right[0];
        body[half..].copy_from_slice(&right[1..]);
    } else {
        body[half..].copy_from_slice(right);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn key(s: &str) -> [u8; 16] {
        hex(s).try_into().unwrap()
    }

    #[test]
    fn the_drafts_encryption_example() {
        let lb = QuicLb::new(0, 3, 4, Some(key("fdf726a9893ec05c0632d3956680baf0"))).unwrap();
        let cid = lb.encode(&hex("31441a"), &hex("9c69c275")).unwrap();
        assert_eq!(cid.as_bytes(), hex("0767947d29be054a"));
        assert_eq!(
            lb.decode(cid.as_bytes()),
            Some((hex("31441a"), hex("9c69c275")))
        );
    }

    #[test]
    fn the_drafts_test_vectors() {
        let k = key("8f95f09245765f80256934e50c66207f");
        // (config id, server ID, nonce, connection ID); the last vector's first octet in the
        // draft has config bits 0 although it is listed as 3, so it is checked as 0.
        let vectors = [
            (0, "ed793a", "ee080dbf", "0720b1d07b359d3c"),
            (
                1,
                "ed793a51d49b8f5fab65",
                "ee080dbf48",
                "2fcc381bc74cb4fbad2823a3d1f8fed2",
            ),
            (
                2,
                "ed793a51d49b8f5f",
                "ee080dbf48c0d1e5",
                "504dd2d05a7b0de9b2b9907afb5ecf8cc3",
            ),
            (
                0,
                "ed793a51d49b8f5fab",
                "ee080dbf48c0d1e55d",
                "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc",
            ),
        ];
        for (cr, sid, nonce, want) in vectors {
            let (sid, nonce) = (hex(sid), hex(nonce));
            let lb = QuicLb::new(cr, sid.len(), nonce.len(), Some(k)).unwrap();
            let cid = lb.encode(&sid, &nonce).unwrap();
            assert_eq!(cid.as_bytes(), hex(want), "config {cr}");
            assert_eq!(lb.server_id(&hex(want)), Some(sid.clone()));
            assert_eq!(lb.decode(&hex(want)), Some((sid, nonce)));
        }
    }

    #[test]
    fn unencrypted_ids_carry_the_server_id_in_clear() {
        let lb = QuicLb::new(0, 3, 4, None).unwrap();
        let cid = lb.encode(&hex("c4605e"), &hex("4504cc4f")).unwrap();
        assert_eq!(cid.as_bytes(), hex("07c4605e4504cc4f"));
    }

    #[test]
    fn every_length_round_trips_and_other_configs_are_not_decoded() {
        let k = [7u8; 16];
        for sid_len in 1..=15 {
            for nonce_len in 4..=(19 - sid_len) {
                let lb = QuicLb::new(3, sid_len, nonce_len, Some(k)).unwrap();
                let sid: Vec<u8> = (0..sid_len as u8).map(|b| b.wrapping_mul(37)).collect();
                let nonce: Vec<u8> = (0..nonce_len as u8).map(|b| b ^ 0x5a).collect();
                let cid = lb.encode(&sid, &nonce).unwrap();
                assert_eq!(cid.len(), 1 + sid_len + nonce_len);
                assert_ne!(&cid.as_bytes()[1..=sid_len], &sid[..], "encrypted");
                assert_eq!(lb.decode(cid.as_bytes()), Some((sid.clone(), nonce)));
                let other = QuicLb::new(4, sid_len, nonce_len, Some(k)).unwrap();
                assert_eq!(other.decode(cid.as_bytes()), None);
            }
        }
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(
            QuicLb::new(7, 3, 4, None).unwrap_err(),
            LbConfigError::ConfigId(7)
        );
        assert!(QuicLb::new(0, 0, 7, None).is_err());
        assert!(QuicLb::new(0, 4, 3, None).is_err());
        assert!(QuicLb::new(0, 10, 10, None).is_err());
        let lb = QuicLb::new(0, 3, 5, None).unwrap();
        assert!(matches!(
            RoutableCids::new(lb.clone(), &[1, 2, 3]),
            Err(LbConfigError::CidLength { want: 8, got: 9 })
        ));
        let lb = QuicLb::new(0, 3, 4, None).unwrap();
        assert!(RoutableCids::new(lb.clone(), &[1, 2]).is_err());
        assert!(RoutableCids::new(lb, &[1, 2, 3]).is_ok());
    }

    #[test]
    fn short_or_foreign_ids_decode_to_nothing() {
        let lb = QuicLb::new(1, 3, 4, Some([1; 16])).unwrap();
        assert_eq!(lb.decode(&[]), None);
        assert_eq!(lb.decode(&[0x27, 1, 2]), None);
        assert_eq!(lb.decode(&[0x07, 1, 2, 3, 4, 5, 6, 7]), None);
    }
}
