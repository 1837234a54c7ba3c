//! tern's wire format: varints, packet headers, frames and transport parameters.
//!
//! The normative description is `docs/PROTOCOL.md`; section numbers (§) in comments refer to it.
//!
//! # Contract
//!
//! - **Decoders never panic and never copy payload bytes.** Every decoder reads through a
//!   [`Reader`], which returns [`DecodeError::UnexpectedEnd`] instead of indexing out of bounds,
//!   and every variable-length field (flow data, tokens, reasons, ...) is a `&'a [u8]` view into
//!   the datagram. Decoders allocate only for [`TransportParams::addresses`] (once per handshake).
//! - **Validation happens when a representation ("Repr") is built**: a value returned by a
//!   decoder satisfies every rule of PROTOCOL.md for that field (lengths, ranges, reserved bits).
//! - **Encoders append to a caller-owned buffer** (`impl bytes::BufMut`, e.g. `Vec<u8>`) and every
//!   Repr has an `encoded_len()` (or a `plan_*` function) so a packetizer can plan a packet
//!   without encoding it. Encoders never panic on a well-formed Repr; a value the wire cannot carry
//!   (a varint above 2^62 − 1, an oversized reason) is a caller bug caught by `debug_assert!` and
//!   clamped or truncated in release builds.
//! - Round trip: for every Repr `x` built by a decoder, `decode(encode(x)) == x`. Property tests
//!   check this, and [`fuzz`] exposes the same checks as fuzz entry points.
//!
//! # Map
//!
//! - [`varint`] — QUIC variable-length integers ([`VarInt`]).
//! - [`cid`] — [`ConnectionId`].
//! - [`header`] — long and short packet headers ([`Packet`], [`Header`], [`ShortHeader`]), packet
//!   number truncation, the explicit-rate area (F12) and stateless resets.
//! - [`frame`] and [`ack`] — the [`Frame`] enum, [`FrameIter`], ACK ranges and NACK lists.
//! - [`params`] — [`TransportParams`].
//! - [`error_code`] — [`TransportErrorCode`], the codes carried by `Close` frames.

use bytes::BufMut;

pub mod ack;
pub mod cid;
pub mod error_code;
pub mod frame;
pub mod fuzz;
pub mod header;
mod long;
pub mod params;
pub mod varint;
pub use long::{encode_flow_header, encode_long_packet, LongPacket};

pub use ack::{
    encode_ack, encode_nack, plan_ack, plan_nack, Ack, AckPlan, AckRangeIter, AckRanges, Nack,
    NackIter, NackList, NackPlan,
};
pub use cid::ConnectionId;
pub use error_code::TransportErrorCode;
pub use frame::{
    frame_type, FlowFrame, Frame, FrameIter, MessageFrame, PathStatusCode, MAX_ACK_THRESHOLD,
    MAX_PROBE_TRAIN,
};
pub use header::{
    decode_pn, encode_pn_len, encode_stateless_reset, feedback_rate_offset, is_stateless_reset,
    is_tern_long_header, lower_feedback_rate, read_feedback_rate, short_header_aad,
    stateless_reset_len, stateless_reset_token, truncate_pn, HandshakeHeader, Header,
    InitialHeader, LongHeaderInvariants, LongType, Packet, PacketIter, RateArea, RetryHeader,
    ShortHeader, VersionList, VersionNegotiation,
};
pub use params::TransportParams;
pub use varint::{varint_len, VarInt, VarIntBoundsExceeded};

/// tern version 1 on the wire: `'t' 'e' 'r' 0x01` (§2, §16).
pub const VERSION_1: u32 = 0x7465_7201;
/// The version field of a Version Negotiation packet (§4.6).
pub const VERSION_NEGOTIATION: u32 = 0;
/// Versions this implementation speaks, most preferred first.
pub const SUPPORTED_VERSIONS: &[u32] = &[VERSION_1];

/// Longest connection ID tern v1 accepts (§3).
pub const MAX_CID_LEN: usize = 20;
/// Connection ID length tern endpoints choose for themselves unless configured otherwise (§3).
pub const DEFAULT_CID_LEN: usize = 8;

/// A datagram carrying an Initial packet must be at least this long (§4.3).
pub const MIN_INITIAL_DATAGRAM_SIZE: usize = 1200;
/// Smallest `max_datagram_size` a peer may advertise (§8).
pub const MIN_MAX_DATAGRAM_SIZE: u64 = 1200;
/// Longest token in an Initial or Retry packet (§4.3, §4.5).
pub const MAX_TOKEN_LEN: usize = 512;
/// Longest reason phrase in `Close` and `WindowClose` frames (§9).
pub const MAX_REASON_LEN: usize = 1024;
/// Longest multicast group name in `Join` and `Leave` frames (§9.28).
pub const MAX_GROUP_LEN: usize = 255;
/// Length of a stateless reset token (§14.3).
pub const RESET_TOKEN_LEN: usize = 16;
/// A stateless reset token.
pub type ResetToken = [u8; RESET_TOKEN_LEN];
/// Shortest datagram that can be a stateless reset: 1 first byte, 4 unpredictable bytes, token.
pub const STATELESS_RESET_MIN_LEN: usize = 21;
/// Length of the explicit-rate area of a short header (§4.8).
pub const RATE_AREA_LEN: usize = 8;
/// Rate value meaning "no limit / not set" in the explicit-rate area and `RateEcho` (§13).
pub const NO_RATE_LIMIT: u32 = u32::MAX;
/// Longest short header: first byte, 20-byte CID, path ID, 4-byte packet number, rate area.
pub const MAX_SHORT_HEADER_LEN: usize = 1 + MAX_CID_LEN + 1 + 4 + RATE_AREA_LEN;
/// Largest flow count a `MaxFlows` frame or transport parameter may carry (§10).
pub const MAX_FLOWS: u64 = 1 << 60;

/// The destination connection ID of a datagram, read from the invariant header only (long:
/// its DCID field; short: the [`DEFAULT_CID_LEN`] bytes after the first byte), for steering
/// datagrams between endpoints that share a port. `None` if too short to hold one.
pub fn destination_cid(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & 0x80 != 0 {
        LongHeaderInvariants::decode(datagram).ok().map(|h| h.dcid)
    } else {
        datagram.get(1..1 + DEFAULT_CID_LEN)
    }
}

/// Why a decoder rejected its input.
///
/// Decoding errors in a packet payload close the connection with
/// [`TransportErrorCode::FRAME_ENCODING_ERROR`] (see [`DecodeError::code`]); errors in transport
/// parameters close it with [`TransportErrorCode::TRANSPORT_PARAMETER_ERROR`]; a malformed
/// packet header makes the receiver drop the datagram silently (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended in the middle of a field.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// A frame type this version does not define (§9, §16).
    #[error("unknown frame type {0:#x}")]
    UnknownFrameType(u64),
    /// A field holds a value its rules forbid; the string names the field.
    #[error("invalid value in field `{0}`")]
    InvalidValue(&'static str),
    /// A length field exceeds its limit (token, reason, group name, connection ID).
    #[error("length exceeds its limit")]
    TooLong,
    /// A long header carries a version other than the supported ones (§16).
    #[error("unsupported version {0:#010x}")]
    UnsupportedVersion(u32),
    /// A transport parameter appears twice (§8).
    #[error("duplicate transport parameter {0:#x}")]
    DuplicateParameter(u64),
}

impl DecodeError {
    /// The wire error code for this error when it was found in a packet payload.
    ///
    /// Transport-parameter decoding failures always map to `TRANSPORT_PARAMETER_ERROR`,
    /// whatever the variant; callers decoding parameters use that code directly.
    pub const fn code(self) -> TransportErrorCode {
        match self {
            DecodeError::DuplicateParameter(_) => TransportErrorCode::TRANSPORT_PARAMETER_ERROR,
            DecodeError::UnsupportedVersion(_) => TransportErrorCode::PROTOCOL_VIOLATION,
            _ => TransportErrorCode::FRAME_ENCODING_ERROR,
        }
    }
}

/// A panic-free, zero-copy cursor over a byte slice (big-endian, as on the wire).
///
/// Every read either returns the value and advances, or returns
/// [`DecodeError::UnexpectedEnd`] and leaves the position unchanged.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub const fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes left to read.
    pub const fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Whether everything has been read.
    pub const fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Bytes read so far (offset into the original slice).
    pub const fn position(&self) -> usize {
        self.pos
    }

    /// The unread bytes, without advancing.
    pub fn rest(&self) -> &'a [u8] {
        // `pos <= buf.len()` is an invariant of every method.
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// The whole input, read and unread.
    pub const fn input(&self) -> &'a [u8] {
        self.buf
    }

    /// Consumes and returns all unread bytes.
    pub fn take_rest(&mut self) -> &'a [u8] {
        let rest = self.rest();
        self.pos = self.buf.len();
        rest
    }

    /// The next byte, without advancing.
    pub fn peek_u8(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// Consumes `n` bytes and returns them as a view.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::UnexpectedEnd)?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::UnexpectedEnd)?;
        self.pos = end;
        Ok(s)
    }

    /// Consumes `N` bytes into an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    /// Advances past `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.bytes(n).map(|_| ())
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek_u8().ok_or(DecodeError::UnexpectedEnd)?;
        self.pos += 1;
        Ok(b)
    }

    /// Reads a big-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_be_bytes)
    }

    /// Reads a big-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    /// Reads a big-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_be_bytes)
    }

    /// Reads a QUIC variable-length integer (RFC 9000 §16). Non-minimal encodings are accepted.
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let first = self.peek_u8().ok_or(DecodeError::UnexpectedEnd)?;
        let len = 1usize << (first >> 6);
        let raw = self
            .buf
            .get(self.pos..self.pos + len)
            .ok_or(DecodeError::UnexpectedEnd)?;
        let v = raw
            .iter()
            .skip(1)
            .fold(u64::from(first & 0x3f), |v, b| (v << 8) | u64::from(*b));
        self.pos += len;
        Ok(v)
    }

    /// Reads a varint and checks that it fits in a `u32`; `field` names it in the error.
    pub fn varint_u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let start = self.pos;
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| {
            self.pos = start;
            DecodeError::InvalidValue(field)
        })
    }

    /// Reads a varint length `n`, then `n` bytes; [`DecodeError::TooLong`] if `n > max`.
    pub fn len_prefixed(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let start = self.pos;
        let n = self.varint()?;
        let result = match usize::try_from(n) {
            Ok(n) if n <= max => self.bytes(n),
            _ => Err(DecodeError::TooLong),
        };
        if result.is_err() {
            self.pos = start;
        }
        result
    }
}

/// Writing helpers for any [`BufMut`] (including `Vec<u8>`).
pub trait WriteExt: BufMut {
    /// Writes `v` as a minimal QUIC varint.
    ///
    /// `v` above [`VarInt::MAX`] is a caller bug: it panics in debug builds and is clamped to
    /// [`VarInt::MAX`] in release builds (so `encoded_len` computations stay consistent).
    fn put_varint(&mut self, v: u64) {
        debug_assert!(v <= VarInt::MAX.into_inner(), "varint out of range: {v}");
        let v = v.min(VarInt::MAX.into_inner());
        match varint_len(v) {
            1 => self.put_u8(v as u8),
            2 => self.put_u16(0x4000 | v as u16),
            4 => self.put_u32(0x8000_0000 | v as u32),
            _ => self.put_u64(0xc000_0000_0000_0000 | v),
        }
    }

    /// Writes a [`VarInt`].
    fn put_var(&mut self, v: VarInt) {
        self.put_varint(v.into_inner());
    }

    /// Writes `data.len()` as a varint, then `data`.
    fn put_len_prefixed(&mut self, data: &[u8]) {
        self.put_varint(data.len() as u64);
        self.put_slice(data);
    }
}

impl<T: BufMut + ?Sized> WriteExt for T {}

/// Length of `data` with a varint length prefix.
pub(crate) const fn len_prefixed_len(len: usize) -> usize {
    varint_len(len as u64) + len
}

/// Constant-time equality of two equally long byte strings (stateless reset tokens).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reads_and_fails_without_advancing() {
        let data = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07];
        let mut r = Reader::new(&data);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x0203));
        assert_eq!(r.position(), 3);
        assert_eq!(r.u64(), Err(DecodeError::UnexpectedEnd));
        assert_eq!(r.position(), 3);
        assert_eq!(r.u32(), Ok(0x0405_0607));
        assert!(r.is_empty());
        assert_eq!(r.u8(), Err(DecodeError::UnexpectedEnd));
        assert_eq!(r.bytes(0), Ok(&[][..]));
        assert_eq!(r.bytes(usize::MAX), Err(DecodeError::UnexpectedEnd));
    }

    #[test]
    fn len_prefixed_limits() {
        let data = [3, b'a', b'b', b'c', 5, b'x'];
        let mut r = Reader::new(&data);
        assert_eq!(r.len_prefixed(2), Err(DecodeError::TooLong));
        assert_eq!(r.position(), 0);
        assert_eq!(r.len_prefixed(3), Ok(&b"abc"[..]));
        assert_eq!(r.len_prefixed(10), Err(DecodeError::UnexpectedEnd));
        assert_eq!(r.position(), 4);
        assert_eq!(r.rest(), &[5, b'x']);
        assert_eq!(r.take_rest(), &[5, b'x']);
        assert!(r.is_empty());
    }

    #[test]
    fn varint_u32_bounds() {
        let mut buf = Vec::new();
        buf.put_varint(u64::from(u32::MAX));
        buf.put_varint(u64::from(u32::MAX) + 1);
        let mut r = Reader::new(&buf);
        assert_eq!(r.varint_u32("x"), Ok(u32::MAX));
        assert_eq!(r.varint_u32("x"), Err(DecodeError::InvalidValue("x")));
    }

    #[test]
    fn ct_eq_compares_contents_and_length() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
