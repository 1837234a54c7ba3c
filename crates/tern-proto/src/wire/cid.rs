//! Connection IDs (PROTOCOL.md §3).

use std::fmt;
use std::ops::Deref;

use bytes::BufMut;

use super::{DecodeError, Reader, MAX_CID_LEN};

/// A connection ID of 0 to 20 bytes, stored inline (no allocation, `Copy`).
///
/// tern endpoints choose [`DEFAULT_CID_LEN`](super::DEFAULT_CID_LEN)-byte IDs for themselves.
/// Equality and hashing cover only the ID's bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionId {
    // Invariant: `len as usize <= MAX_CID_LEN` and `bytes[len..]` is all zero, so the derived
    // `Eq`/`Hash`/`Ord` only depend on the ID's bytes.
    len: u8,
    bytes: [u8; MAX_CID_LEN],
}

impl ConnectionId {
    /// Longest connection ID (20 bytes).
    pub const MAX_LEN: usize = MAX_CID_LEN;
    /// The zero-length connection ID.
    pub const EMPTY: ConnectionId = ConnectionId {
        len: 0,
        bytes: [0; MAX_CID_LEN],
    };

    /// A connection ID with the given bytes; [`DecodeError::TooLong`] above 20 bytes.
    pub fn new(id: &[u8]) -> Result<Self, DecodeError> {
        if id.len() > MAX_CID_LEN {
            return Err(DecodeError::TooLong);
        }
        let mut bytes = [0; MAX_CID_LEN];
        bytes[..id.len()].copy_from_slice(id);
        Ok(ConnectionId {
            len: id.len() as u8,
            bytes,
        })
    }

    /// A connection ID from a fixed-size array of at most 20 bytes (checked at compile time).
    pub const fn from_array<const N: usize>(id: [u8; N]) -> Self {
        const { assert!(N <= MAX_CID_LEN) };
        let mut bytes = [0; MAX_CID_LEN];
        let mut i = 0;
        while i < N {
            bytes[i] = id[i];
            i += 1;
        }
        ConnectionId {
            len: N as u8,
            bytes,
        }
    }

    /// The ID's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether this is the zero-length ID.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads a connection ID of known length `len` (short headers: the receiver's own length).
    pub fn decode(r: &mut Reader<'_>, len: usize) -> Result<Self, DecodeError> {
        if len > MAX_CID_LEN {
            return Err(DecodeError::TooLong);
        }
        ConnectionId::new(r.bytes(len)?)
    }

    /// Reads a one-byte length, then that many bytes (long headers, `NewConnectionId`).
    pub fn decode_len_prefixed(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let start = r.clone();
        let len = usize::from(r.u8()?);
        ConnectionId::decode(r, len).inspect_err(|_| *r = start)
    }

    /// Writes the ID's bytes (no length).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        buf.put_slice(self.as_bytes());
    }

    /// Writes a one-byte length, then the bytes.
    pub fn encode_len_prefixed<B: BufMut + ?Sized>(&self, buf: &mut B) {
        buf.put_u8(self.len);
        buf.put_slice(self.as_bytes());
    }
}

impl Default for ConnectionId {
    fn default() -> Self {
        ConnectionId::EMPTY
    }
}

impl Deref for ConnectionId {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for ConnectionId {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl TryFrom<&[u8]> for ConnectionId {
    type Error = DecodeError;
    fn try_from(id: &[u8]) -> Result<Self, DecodeError> {
        ConnectionId::new(id)
    }
}

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionId({self})")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Any valid connection ID of length `lens`.
    pub(crate) fn arb_cid(
        lens: std::ops::RangeInclusive<usize>,
    ) -> impl Strategy<Value = ConnectionId> {
        proptest::collection::vec(any::<u8>(), lens).prop_map(|v| ConnectionId::new(&v).unwrap())
    }

    #[test]
    fn a_connection_id_holds_up_to_20_bytes_and_prints_in_hex() {
        let cid = ConnectionId::new(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
        assert_eq!(cid.len(), 4);
        assert_eq!(&*cid, &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(format!("{cid:?}"), "ConnectionId(deadbeef)");
        assert_eq!(cid, ConnectionId::from_array([0xde, 0xad, 0xbe, 0xef]));
        assert_ne!(
            cid,
            ConnectionId::new(&[0xde, 0xad, 0xbe, 0xef, 0]).unwrap()
        );
        assert!(ConnectionId::EMPTY.is_empty());
        assert_eq!(ConnectionId::new(&[0; 21]), Err(DecodeError::TooLong));
        assert_eq!(ConnectionId::new(&[7; 20]).unwrap().len(), 20);
    }

    #[test]
    fn len_prefixed_errors_do_not_advance() {
        let mut r = Reader::new(&[21, 0, 0]);
        assert_eq!(
            ConnectionId::decode_len_prefixed(&mut r),
            Err(DecodeError::TooLong)
        );
        assert_eq!(r.position(), 0);
        let mut r = Reader::new(&[3, 0, 0]);
        assert_eq!(
            ConnectionId::decode_len_prefixed(&mut r),
            Err(DecodeError::UnexpectedEnd)
        );
        assert_eq!(r.position(), 0);
    }

    proptest! {
        #[test]
        fn round_trip(cid in arb_cid(0..=20)) {
            let mut buf = Vec::new();
            cid.encode_len_prefixed(&mut buf);
            prop_assert_eq!(buf.len(), 1 + cid.len());
            let mut r = Reader::new(&buf);
            prop_assert_eq!(ConnectionId::decode_len_prefixed(&mut r), Ok(cid));
            let mut r = Reader::new(&buf[1..]);
            prop_assert_eq!(ConnectionId::decode(&mut r, cid.len()), Ok(cid));
        }
    }
}
