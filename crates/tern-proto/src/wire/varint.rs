//! QUIC variable-length integers (RFC 9000 §16; PROTOCOL.md §1.2).
//!
//! The two most significant bits of the first byte give the length: `00` 1 byte (6-bit value),
//! `01` 2 bytes (14 bits), `10` 4 bytes (30 bits), `11` 8 bytes (62 bits), big endian.

use std::fmt;

use bytes::BufMut;

use super::{DecodeError, Reader, WriteExt};

/// An integer in `0..=2^62 − 1`, the range a QUIC varint can carry.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VarInt(u64);

/// A value above [`VarInt::MAX`] was given to [`VarInt::from_u64`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("value exceeds 2^62 - 1")]
pub struct VarIntBoundsExceeded;

impl VarInt {
    /// The largest representable value, 2^62 − 1.
    pub const MAX: VarInt = VarInt((1 << 62) - 1);
    /// Zero.
    pub const ZERO: VarInt = VarInt(0);

    /// Every `u32` fits.
    pub const fn from_u32(v: u32) -> Self {
        VarInt(v as u64)
    }

    /// `v` if it is at most [`VarInt::MAX`].
    pub const fn from_u64(v: u64) -> Result<Self, VarIntBoundsExceeded> {
        if v <= Self::MAX.0 {
            Ok(VarInt(v))
        } else {
            Err(VarIntBoundsExceeded)
        }
    }

    /// The value.
    pub const fn into_inner(self) -> u64 {
        self.0
    }

    /// Bytes of the minimal encoding: 1, 2, 4 or 8.
    pub const fn encoded_len(self) -> usize {
        varint_len(self.0)
    }

    /// Reads one varint.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.varint().map(VarInt)
    }

    /// Writes the minimal encoding.
    pub fn encode<B: BufMut + ?Sized>(self, buf: &mut B) {
        buf.put_varint(self.0);
    }
}

/// Bytes of the minimal varint encoding of `v` (8 for values above [`VarInt::MAX`], which
/// encoders clamp).
pub const fn varint_len(v: u64) -> usize {
    if v < 1 << 6 {
        1
    } else if v < 1 << 14 {
        2
    } else if v < 1 << 30 {
        4
    } else {
        8
    }
}

impl From<u8> for VarInt {
    fn from(v: u8) -> Self {
        VarInt(v.into())
    }
}

impl From<u16> for VarInt {
    fn from(v: u16) -> Self {
        VarInt(v.into())
    }
}

impl From<u32> for VarInt {
    fn from(v: u32) -> Self {
        VarInt::from_u32(v)
    }
}

impl TryFrom<u64> for VarInt {
    type Error = VarIntBoundsExceeded;
    fn try_from(v: u64) -> Result<Self, Self::Error> {
        VarInt::from_u64(v)
    }
}

impl TryFrom<usize> for VarInt {
    type Error = VarIntBoundsExceeded;
    fn try_from(v: usize) -> Result<Self, Self::Error> {
        VarInt::from_u64(v as u64)
    }
}

impl From<VarInt> for u64 {
    fn from(v: VarInt) -> u64 {
        v.0
    }
}

impl fmt::Display for VarInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 9000 Appendix A.1 examples.
    #[test]
    fn rfc9000_examples() {
        let cases: &[(&[u8], u64)] = &[
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
            (&[0x40, 0x25], 37),
        ];
        for (bytes, value) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.varint(), Ok(*value));
            assert!(r.is_empty());
        }
        let mut buf = Vec::new();
        buf.put_varint(37);
        buf.put_varint(15_293);
        buf.put_varint(494_878_333);
        buf.put_varint(151_288_809_941_952_652);
        assert_eq!(
            buf,
            [
                0x25, 0x7b, 0xbd, 0x9d, 0x7f, 0x3e, 0x7d, 0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8,
                0x8c
            ]
        );
    }

    #[test]
    fn values_past_2_62_are_refused_and_lengths_follow_the_value() {
        assert_eq!(VarInt::from_u64(1 << 62), Err(VarIntBoundsExceeded));
        assert_eq!(VarInt::from_u64((1 << 62) - 1), Ok(VarInt::MAX));
        assert_eq!(VarInt::from_u32(u32::MAX).into_inner(), u64::from(u32::MAX));
        assert_eq!(VarInt::MAX.encoded_len(), 8);
        for (v, len) in [(63, 1), (64, 2), (16383, 2), (16384, 4), (1 << 30, 8)] {
            assert_eq!(varint_len(v), len, "{v}");
        }
    }

    #[test]
    fn truncated_input() {
        for bytes in [&[][..], &[0x40], &[0x80, 0, 0], &[0xc0, 0, 0, 0, 0, 0, 0]] {
            assert_eq!(Reader::new(bytes).varint(), Err(DecodeError::UnexpectedEnd));
        }
    }

    proptest! {
        #[test]
        fn round_trip(v in 0..=VarInt::MAX.into_inner()) {
            let v = VarInt::from_u64(v).unwrap();
            let mut buf = Vec::new();
            v.encode(&mut buf);
            prop_assert_eq!(buf.len(), v.encoded_len());
            let mut r = Reader::new(&buf);
            prop_assert_eq!(VarInt::decode(&mut r), Ok(v));
            prop_assert!(r.is_empty());
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..12)) {
            let mut r = Reader::new(&data);
            while let Ok(v) = r.varint() {
                prop_assert!(v <= VarInt::MAX.into_inner());
            }
        }
    }
}
