//! Packet headers (PROTOCOL.md §4), packet numbers (§5), the explicit-rate area (§4.8, §13)
//! and stateless resets (§4.9, §14.3).
//!
//! A datagram holds either one short-header packet, or one or more long-header packets
//! (Initial, Handshake) optionally followed by zero padding or by one short-header packet, or
//! exactly one Retry or Version Negotiation packet. [`PacketIter`] walks them; [`Packet::decode`]
//! decodes one and returns the rest of the datagram.

use std::fmt;

use bytes::BufMut;

use super::{
    ct_eq, len_prefixed_len, varint_len, ConnectionId, DecodeError, Reader, ResetToken, WriteExt,
    MAX_SHORT_HEADER_LEN, MAX_TOKEN_LEN, NO_RATE_LIMIT, RATE_AREA_LEN, RESET_TOKEN_LEN,
    STATELESS_RESET_MIN_LEN, SUPPORTED_VERSIONS, VERSION_1, VERSION_NEGOTIATION,
};

/// Header form bit: 1 = long header (RFC 8999 invariant).
const LONG_FORM: u8 = 0x80;
/// Fixed bit: always 1 in tern v1 packets (except Version Negotiation, where it is unused).
const FIXED_BIT: u8 = 0x40;
/// Long header: packet type bits.
const LONG_TYPE_MASK: u8 = 0x30;
/// Long header: reserved bits, must be 0.
const LONG_RESERVED: u8 = 0x0f;
/// Short header: explicit-rate area present.
const RATE_BIT: u8 = 0x20;
/// Short header: reserved bits, must be 0.
const SHORT_RESERVED: u8 = 0x18;
/// Short header: key phase.
const KEY_PHASE_BIT: u8 = 0x04;
/// Short header: packet number length − 1.
const PN_LEN_MASK: u8 = 0x03;
/// AEAD tag length; a short packet shorter than header + tag cannot be authentic.
const AEAD_TAG_LEN: usize = 16;

/// The type of a tern v1 long-header packet (first byte bits 0x30, §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LongType {
    /// 0: first handshake flight (client → server).
    Initial,
    /// 1: later handshake flights.
    Handshake,
    /// 2: server's stateless retry (§7.5).
    Retry,
}

impl LongType {
    const fn bits(self) -> u8 {
        match self {
            LongType::Initial => 0x00,
            LongType::Handshake => 0x10,
            LongType::Retry => 0x20,
        }
    }
}

/// The version-independent fields of any long header (RFC 8999 §5.1): what a server needs to
/// answer an unknown version with Version Negotiation. Connection IDs may be up to 255 bytes
/// here, since other versions may allow that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongHeaderInvariants<'a> {
    /// The version field.
    pub version: u32,
    /// Destination connection ID (0..=255 bytes).
    pub dcid: &'a [u8],
    /// Source connection ID (0..=255 bytes).
    pub scid: &'a [u8],
}

impl<'a> LongHeaderInvariants<'a> {
    /// Reads the invariant fields of a long header at the start of `datagram`.
    pub fn decode(datagram: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(datagram);
        let first = r.u8()?;
        if first & LONG_FORM == 0 {
            return Err(DecodeError::InvalidValue("header form"));
        }
        let version = r.u32()?;
        let dcid_len = usize::from(r.u8()?);
        let dcid = r.bytes(dcid_len)?;
        let scid_len = usize::from(r.u8()?);
        let scid = r.bytes(scid_len)?;
        Ok(LongHeaderInvariants {
            version,
            dcid,
            scid,
        })
    }
}

/// Initial packet header (§4.3): the client's first flight; its payload is the handshake
/// pattern byte and Noise message 1 (§7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitialHeader<'a> {
    /// Version (tern v1: [`VERSION_1`]).
    pub version: u32,
    /// Destination connection ID (chosen by the client for the first flight).
    pub dcid: ConnectionId,
    /// Source connection ID (the client's own).
    pub scid: ConnectionId,
    /// Token from a Retry packet, or empty (≤ 512 bytes).
    pub token: &'a [u8],
}

impl InitialHeader<'_> {
    /// Header length for a payload of `payload_len` bytes.
    pub fn encoded_len(&self, payload_len: usize) -> usize {
        long_prefix_len(&self.dcid, &self.scid)
            + len_prefixed_len(self.token.len().min(MAX_TOKEN_LEN))
            + varint_len(payload_len as u64)
    }

    /// Writes the header; the caller appends `payload_len` payload bytes, then pads the
    /// datagram to at least [`MIN_INITIAL_DATAGRAM_SIZE`](super::MIN_INITIAL_DATAGRAM_SIZE).
    pub fn encode<B: BufMut + ?Sized>(&self, payload_len: usize, buf: &mut B) {
        debug_assert!(self.token.len() <= MAX_TOKEN_LEN, "token too long");
        put_long_prefix(LongType::Initial, self.version, &self.dcid, &self.scid, buf);
        buf.put_len_prefixed(&self.token[..self.token.len().min(MAX_TOKEN_LEN)]);
        buf.put_varint(payload_len as u64);
    }
}

/// Handshake packet header (§4.4): later handshake flights, carrying a Noise message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeHeader {
    /// Version.
    pub version: u32,
    /// Destination connection ID.
    pub dcid: ConnectionId,
    /// Source connection ID.
    pub scid: ConnectionId,
}

impl HandshakeHeader {
    /// Header length for a payload of `payload_len` bytes.
    pub fn encoded_len(&self, payload_len: usize) -> usize {
        long_prefix_len(&self.dcid, &self.scid) + varint_len(payload_len as u64)
    }

    /// Writes the header; the caller appends `payload_len` payload bytes.
    pub fn encode<B: BufMut + ?Sized>(&self, payload_len: usize, buf: &mut B) {
        put_long_prefix(
            LongType::Handshake,
            self.version,
            &self.dcid,
            &self.scid,
            buf,
        );
        buf.put_varint(payload_len as u64);
    }
}

/// Retry packet (§4.5): the whole datagram; the rest after the CIDs is the server's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryHeader<'a> {
    /// Version.
    pub version: u32,
    /// Destination connection ID (the client's SCID).
    pub dcid: ConnectionId,
    /// Source connection ID (new, chosen by the server; the client uses it as DCID).
    pub scid: ConnectionId,
    /// Opaque token, 1..=512 bytes, to echo in the next Initial.
    pub token: &'a [u8],
}

impl RetryHeader<'_> {
    /// Length of the whole Retry packet.
    pub fn encoded_len(&self) -> usize {
        long_prefix_len(&self.dcid, &self.scid) + self.token.len().min(MAX_TOKEN_LEN)
    }

    /// Writes the whole Retry packet.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        debug_assert!(
            (1..=MAX_TOKEN_LEN).contains(&self.token.len()),
            "retry token must be 1..=512 bytes"
        );
        put_long_prefix(LongType::Retry, self.version, &self.dcid, &self.scid, buf);
        buf.put_slice(&self.token[..self.token.len().min(MAX_TOKEN_LEN)]);
    }
}

/// A list of 32-bit versions, borrowed from a Version Negotiation packet.
///
/// Built by the decoder (non-empty, a multiple of 4 bytes) or by [`VersionList::from_raw`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct VersionList<'a>(&'a [u8]);

impl<'a> VersionList<'a> {
    /// A list from its wire bytes; `None` unless non-empty and a multiple of 4 bytes.
    pub fn from_raw(raw: &'a [u8]) -> Option<Self> {
        (!raw.is_empty() && raw.len() % 4 == 0).then_some(VersionList(raw))
    }

    /// The wire bytes.
    pub fn raw(&self) -> &'a [u8] {
        self.0
    }

    /// Number of versions.
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    /// Always false for a decoded list.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The versions, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.0
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// Whether `version` is listed.
    pub fn contains(&self, version: u32) -> bool {
        self.iter().any(|v| v == version)
    }
}

impl fmt::Debug for VersionList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|v| format!("{v:#010x}")))
            .finish()
    }
}

/// Version Negotiation packet (§4.6): version 0, then the versions the server supports.
///
/// Connection IDs are raw slices (up to 255 bytes) because they echo a client of any version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionNegotiation<'a> {
    /// Destination connection ID (the client's SCID).
    pub dcid: &'a [u8],
    /// Source connection ID (the client's DCID).
    pub scid: &'a [u8],
    /// Supported versions.
    pub versions: VersionList<'a>,
}

impl VersionNegotiation<'_> {
    /// Length of the whole packet.
    pub fn encoded_len(&self) -> usize {
        vn_len(self.dcid, self.scid, self.versions.len())
    }

    /// Writes the whole packet.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        put_vn_prefix(self.dcid, self.scid, buf);
        buf.put_slice(self.versions.raw());
    }

    /// Writes a Version Negotiation packet answering a client whose long header had
    /// `client`'s fields, listing `versions` (e.g. [`SUPPORTED_VERSIONS`]).
    pub fn encode_reply<B: BufMut + ?Sized>(
        client: &LongHeaderInvariants<'_>,
        versions: &[u32],
        buf: &mut B,
    ) {
        // RFC 8999 §6: the server's DCID echoes the client's SCID and vice versa.
        put_vn_prefix(client.scid, client.dcid, buf);
        for v in versions {
            buf.put_u32(*v);
        }
    }

    /// Length of [`VersionNegotiation::encode_reply`]'s output.
    pub fn reply_len(client: &LongHeaderInvariants<'_>, versions: &[u32]) -> usize {
        vn_len(client.scid, client.dcid, versions.len())
    }
}

fn vn_len(dcid: &[u8], scid: &[u8], n_versions: usize) -> usize {
    1 + 4 + 1 + dcid.len().min(255) + 1 + scid.len().min(255) + 4 * n_versions
}

fn put_vn_prefix<B: BufMut + ?Sized>(dcid: &[u8], scid: &[u8], buf: &mut B) {
    // RFC 9000 §17.2.1: the unused bits are arbitrary; setting 0x40 keeps the packet
    // recognisable where QUIC-like protocols are multiplexed with others.
    buf.put_u8(LONG_FORM | FIXED_BIT);
    buf.put_u32(VERSION_NEGOTIATION);
    for cid in [dcid, scid] {
        let cid = &cid[..cid.len().min(255)];
        buf.put_u8(cid.len() as u8);
        buf.put_slice(cid);
    }
}

fn long_prefix_len(dcid: &ConnectionId, scid: &ConnectionId) -> usize {
    1 + 4 + 1 + dcid.len() + 1 + scid.len()
}

fn put_long_prefix<B: BufMut + ?Sized>(
    ty: LongType,
    version: u32,
    dcid: &ConnectionId,
    scid: &ConnectionId,
    buf: &mut B,
) {
    buf.put_u8(LONG_FORM | FIXED_BIT | ty.bits());
    buf.put_u32(version);
    dcid.encode_len_prefixed(buf);
    scid.encode_len_prefixed(buf);
}

/// The explicit-rate area of a short header (§4.8, §13, F12). Rates in kbit/s;
/// [`NO_RATE_LIMIT`] means "no limit / not set".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateArea {
    /// The sender's expected (desired) rate. Covered by the AEAD tag.
    pub expected_kbps: u32,
    /// The path's feedback rate: set by the sender, lowered by routers. Not covered by the
    /// AEAD tag (zeroed in the associated data).
    pub feedback_kbps: u32,
}

impl RateArea {
    /// Both fields "no limit".
    pub const UNSET: RateArea = RateArea {
        expected_kbps: NO_RATE_LIMIT,
        feedback_kbps: NO_RATE_LIMIT,
    };
}

/// A short header (§4.7): every packet after the handshake.
///
/// ```text
/// 0 1 R 0 0 K L L | DCID (receiver's length) | Path ID (8) | PN (8..32) | [Expected (32) | Feedback (32)]
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortHeader {
    /// Key phase bit (key update, §6).
    pub key_phase: bool,
    /// Destination connection ID; its length is not on the wire.
    pub dcid: ConnectionId,
    /// Path (channel) the packet number belongs to (§5).
    pub path_id: u8,
    /// Bytes of the truncated packet number, 1..=4.
    pub pn_len: usize,
    /// Low `8 * pn_len` bits of the packet number.
    pub truncated_pn: u32,
    /// Explicit-rate area, if present (R bit).
    pub rate: Option<RateArea>,
}

impl ShortHeader {
    /// A header for packet `full_pn` on a path whose largest acknowledged packet is
    /// `largest_acked`, with the packet number truncated per §5.2.
    pub fn new(
        dcid: ConnectionId,
        path_id: u8,
        key_phase: bool,
        full_pn: u64,
        largest_acked: Option<u64>,
        rate: Option<RateArea>,
    ) -> Self {
        let pn_len = encode_pn_len(full_pn, largest_acked);
        ShortHeader {
            key_phase,
            dcid,
            path_id,
            pn_len,
            truncated_pn: truncate_pn(full_pn, pn_len),
            rate,
        }
    }

    /// Reads a short header at the start of `datagram`, whose destination connection ID is
    /// `local_cid_len` bytes long. Returns the header and its length: the payload (AEAD
    /// ciphertext and tag) is `&datagram[len..]`, to the end of the datagram.
    pub fn decode(datagram: &[u8], local_cid_len: usize) -> Result<(Self, usize), DecodeError> {
        let mut r = Reader::new(datagram);
        let first = r.u8()?;
        if first & LONG_FORM != 0 {
            return Err(DecodeError::InvalidValue("header form"));
        }
        if first & FIXED_BIT == 0 {
            return Err(DecodeError::InvalidValue("fixed bit"));
        }
        if first & SHORT_RESERVED != 0 {
            return Err(DecodeError::InvalidValue("reserved bits"));
        }
        let dcid = ConnectionId::decode(&mut r, local_cid_len)?;
        let path_id = r.u8()?;
        let pn_len = usize::from(first & PN_LEN_MASK) + 1;
        let truncated_pn = r
            .bytes(pn_len)?
            .iter()
            .fold(0u32, |pn, b| (pn << 8) | u32::from(*b));
        let rate = if first & RATE_BIT != 0 {
            Some(RateArea {
                expected_kbps: r.u32()?,
                feedback_kbps: r.u32()?,
            })
        } else {
            None
        };
        let header = ShortHeader {
            key_phase: first & KEY_PHASE_BIT != 0,
            dcid,
            path_id,
            pn_len,
            truncated_pn,
            rate,
        };
        Ok((header, r.position()))
    }

    fn pn_len_clamped(&self) -> usize {
        self.pn_len.clamp(1, 4)
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        1 + self.dcid.len()
            + 1
            + self.pn_len_clamped()
            + if self.rate.is_some() {
                RATE_AREA_LEN
            } else {
                0
            }
    }

    /// Same as [`ShortHeader::header_len`] (uniform with other Reprs).
    pub fn encoded_len(&self) -> usize {
        self.header_len()
    }

    /// Offset of the 4-byte feedback-rate field from the start of the header, if present.
    /// The crypto layer zeroes these bytes in the associated data (§6.3).
    pub fn feedback_rate_offset(&self) -> Option<usize> {
        self.rate
            .map(|_| 1 + self.dcid.len() + 1 + self.pn_len_clamped() + 4)
    }

    /// Writes the header. `pn_len` outside 1..=4 is clamped and `truncated_pn` is masked to
    /// `pn_len` bytes.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.encode_inner(false, buf);
    }

    /// Writes the associated data of the packet: the header with the feedback-rate field
    /// zeroed (§6.3). Equals [`short_header_aad`] of the encoded header.
    pub fn encode_aad<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.encode_inner(true, buf);
    }

    fn encode_inner<B: BufMut + ?Sized>(&self, zero_feedback: bool, buf: &mut B) {
        debug_assert!((1..=4).contains(&self.pn_len), "pn_len must be 1..=4");
        let pn_len = self.pn_len_clamped();
        let mut first = FIXED_BIT | (pn_len as u8 - 1);
        if self.key_phase {
            first |= KEY_PHASE_BIT;
        }
        if self.rate.is_some() {
            first |= RATE_BIT;
        }
        buf.put_u8(first);
        self.dcid.encode(buf);
        buf.put_u8(self.path_id);
        buf.put_slice(&self.truncated_pn.to_be_bytes()[4 - pn_len..]);
        if let Some(rate) = self.rate {
            buf.put_u32(rate.expected_kbps);
            buf.put_u32(if zero_feedback { 0 } else { rate.feedback_kbps });
        }
    }

    /// The full packet number, given the largest packet number received on this path (§5.3).
    pub fn decode_pn(&self, largest_received: u64) -> u64 {
        decode_pn(largest_received, self.truncated_pn, self.pn_len)
    }
}

/// Copies a short header's bytes into `scratch` with the feedback-rate field (at
/// `feedback_offset`, from [`ShortHeader::feedback_rate_offset`]) zeroed, and returns the
/// associated data (§6.3). A header longer than [`MAX_SHORT_HEADER_LEN`] is truncated, which
/// makes authentication fail rather than panic.
pub fn short_header_aad<'b>(
    header: &[u8],
    feedback_offset: Option<usize>,
    scratch: &'b mut [u8; MAX_SHORT_HEADER_LEN],
) -> &'b [u8] {
    let n = header.len().min(MAX_SHORT_HEADER_LEN);
    scratch[..n].copy_from_slice(&header[..n]);
    let field = feedback_offset.and_then(|o| scratch.get_mut(o..o.checked_add(4)?));
    if let Some(field) = field {
        field.fill(0);
    }
    &scratch[..n]
}

/// A header of any packet type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Header<'a> {
    /// Initial (long, type 0).
    Initial(InitialHeader<'a>),
    /// Handshake (long, type 1).
    Handshake(HandshakeHeader),
    /// Retry (long, type 2).
    Retry(RetryHeader<'a>),
    /// Version Negotiation (long, version 0).
    VersionNegotiation(VersionNegotiation<'a>),
    /// Short header (data packets).
    Short(ShortHeader),
}

impl Header<'_> {
    /// Header length for a payload of `payload_len` bytes (Retry and Version Negotiation: the
    /// whole packet, `payload_len` is ignored).
    pub fn encoded_len(&self, payload_len: usize) -> usize {
        match self {
            Header::Initial(h) => h.encoded_len(payload_len),
            Header::Handshake(h) => h.encoded_len(payload_len),
            Header::Retry(h) => h.encoded_len(),
            Header::VersionNegotiation(h) => h.encoded_len(),
            Header::Short(h) => h.header_len(),
        }
    }

    /// Writes the header for a payload of `payload_len` bytes.
    pub fn encode<B: BufMut + ?Sized>(&self, payload_len: usize, buf: &mut B) {
        match self {
            Header::Initial(h) => h.encode(payload_len, buf),
            Header::Handshake(h) => h.encode(payload_len, buf),
            Header::Retry(h) => h.encode(buf),
            Header::VersionNegotiation(h) => h.encode(buf),
            Header::Short(h) => h.encode(buf),
        }
    }

    /// The destination connection ID, for routing (Version Negotiation: its raw bytes).
    pub fn dcid(&self) -> &[u8] {
        match self {
            Header::Initial(h) => &h.dcid,
            Header::Handshake(h) => &h.dcid,
            Header::Retry(h) => &h.dcid,
            Header::VersionNegotiation(h) => h.dcid,
            Header::Short(h) => &h.dcid,
        }
    }
}

/// One packet of a datagram: header, the bytes it was decoded from, and its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The decoded header.
    pub header: Header<'a>,
    /// The header's bytes: from the packet's first byte to the first payload byte (for short
    /// packets, the associated data before zeroing the feedback rate, §6.3). For Retry and
    /// Version Negotiation, the whole packet.
    pub header_bytes: &'a [u8],
    /// The payload: the handshake pattern byte and a Noise message (Initial, §7.1), a Noise
    /// message (Handshake), AEAD ciphertext and tag (short), or empty (Retry, Version
    /// Negotiation). Opaque to this module.
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Decodes the packet at the start of `datagram`; returns it and the rest of the datagram
    /// after it (coalesced packets or padding; empty after short, Retry and VN packets).
    ///
    /// `local_cid_len` is the length of this endpoint's connection IDs (short headers do not
    /// carry it). A long header with an unknown version fails with
    /// [`DecodeError::UnsupportedVersion`]; use [`LongHeaderInvariants`] to answer it.
    pub fn decode(
        datagram: &'a [u8],
        local_cid_len: usize,
    ) -> Result<(Packet<'a>, &'a [u8]), DecodeError> {
        let first = *datagram.first().ok_or(DecodeError::UnexpectedEnd)?;
        if first & LONG_FORM == 0 {
            let (header, len) = ShortHeader::decode(datagram, local_cid_len)?;
            let (header_bytes, payload) = datagram.split_at(len);
            let packet = Packet {
                header: Header::Short(header),
                header_bytes,
                payload,
            };
            return Ok((packet, &[]));
        }
        decode_long(datagram)
    }

    /// Length of the encoded packet.
    pub fn encoded_len(&self) -> usize {
        self.header.encoded_len(self.payload.len()) + self.payload.len()
    }

    /// Writes header and payload.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.header.encode(self.payload.len(), buf);
        buf.put_slice(self.payload);
    }
}

fn decode_long(datagram: &[u8]) -> Result<(Packet<'_>, &[u8]), DecodeError> {
    let mut r = Reader::new(datagram);
    let first = r.u8()?;
    let version = r.u32()?;
    if version == VERSION_NEGOTIATION {
        let inv = LongHeaderInvariants::decode(datagram)?;
        let versions_raw = datagram
            .get(1 + 4 + 1 + inv.dcid.len() + 1 + inv.scid.len()..)
            .unwrap_or_default();
        let versions =
            VersionList::from_raw(versions_raw).ok_or(DecodeError::InvalidValue("version list"))?;
        let packet = Packet {
            header: Header::VersionNegotiation(VersionNegotiation {
                dcid: inv.dcid,
                scid: inv.scid,
                versions,
            }),
            header_bytes: datagram,
            payload: &[],
        };
        return Ok((packet, &[]));
    }
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    if first & FIXED_BIT == 0 {
        return Err(DecodeError::InvalidValue("fixed bit"));
    }
    if first & LONG_RESERVED != 0 {
        return Err(DecodeError::InvalidValue("reserved bits"));
    }
    // §3: tern v1 connection IDs are at most 20 bytes.
    let dcid = ConnectionId::decode_len_prefixed(&mut r)?;
    let scid = ConnectionId::decode_len_prefixed(&mut r)?;
    let (header, payload_len) = match first & LONG_TYPE_MASK {
        0x00 => {
            let token = r.len_prefixed(MAX_TOKEN_LEN)?;
            let header = Header::Initial(InitialHeader {
                version,
                dcid,
                scid,
                token,
            });
            (header, r.varint()?)
        }
        0x10 => {
            let header = Header::Handshake(HandshakeHeader {
                version,
                dcid,
                scid,
            });
            (header, r.varint()?)
        }
        0x20 => {
            let token = r.take_rest();
            if token.is_empty() {
                return Err(DecodeError::InvalidValue("retry token"));
            }
            if token.len() > MAX_TOKEN_LEN {
                return Err(DecodeError::TooLong);
            }
            let header = Header::Retry(RetryHeader {
                version,
                dcid,
                scid,
                token,
            });
            let packet = Packet {
                header,
                header_bytes: datagram,
                payload: &[],
            };
            return Ok((packet, &[]));
        }
        _ => return Err(DecodeError::InvalidValue("long packet type")),
    };
    if payload_len == 0 {
        return Err(DecodeError::InvalidValue("payload length"));
    }
    let header_len = r.position();
    let payload_len = usize::try_from(payload_len).map_err(|_| DecodeError::UnexpectedEnd)?;
    let payload = r.bytes(payload_len)?;
    let packet = Packet {
        header,
        header_bytes: &datagram[..header_len],
        payload,
    };
    Ok((packet, r.rest()))
}

/// Iterator over the packets coalesced in one datagram (§4.1).
///
/// Stops at the end of the datagram, after a packet that extends to the end of it (short,
/// Retry, Version Negotiation), or at a zero byte where a packet would start (padding, whose
/// content is ignored). After an error it yields nothing more: the remaining bytes cannot be
/// delimited.
#[derive(Debug, Clone)]
pub struct PacketIter<'a> {
    rest: &'a [u8],
    local_cid_len: usize,
    first: bool,
}

impl<'a> PacketIter<'a> {
    /// Packets of `datagram`, for an endpoint whose connection IDs are `local_cid_len` long.
    pub fn new(datagram: &'a [u8], local_cid_len: usize) -> Self {
        PacketIter {
            rest: datagram,
            local_cid_len,
            first: true,
        }
    }
}

impl<'a> Iterator for PacketIter<'a> {
    type Item = Result<Packet<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let first_byte = *self.rest.first()?;
        if !self.first && first_byte == 0 {
            self.rest = &[];
            return None;
        }
        self.first = false;
        match Packet::decode(self.rest, self.local_cid_len) {
            Ok((packet, rest)) => {
                self.rest = rest;
                Some(Ok(packet))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for PacketIter<'_> {}

// ---------------------------------------------------------------------------------------------
// Packet numbers (§5)

/// Bytes needed to send packet number `full_pn` when the peer has acknowledged up to
/// `largest_acked` (None: nothing yet): enough to represent twice the unacknowledged range
/// (RFC 9000 §17.1, Appendix A.2), 1..=4.
pub fn encode_pn_len(full_pn: u64, largest_acked: Option<u64>) -> usize {
    let unacked = match largest_acked {
        Some(acked) => full_pn.saturating_sub(acked),
        None => full_pn.saturating_add(1),
    };
    let range = unacked.saturating_mul(2);
    if range < 1 << 8 {
        1
    } else if range < 1 << 16 {
        2
    } else if range < 1 << 24 {
        3
    } else {
        // More than 2^31 unacknowledged packets cannot be disambiguated; 4 is the most the
        // header can carry.
        4
    }
}

/// The low `pn_len` bytes of `full_pn`.
pub fn truncate_pn(full_pn: u64, pn_len: usize) -> u32 {
    let bits = 8 * pn_len.clamp(1, 4) as u32;
    (full_pn & ((1u64 << bits) - 1)) as u32
}

/// Recovers a full packet number from its `pn_len`-byte truncation, given the largest packet
/// number received so far on the path (0 before the first one), per RFC 9000 Appendix A.3.
/// `pn_len` outside 1..=4 is clamped.
pub fn decode_pn(largest_received: u64, truncated: u32, pn_len: usize) -> u64 {
    let bits = 8 * pn_len.clamp(1, 4) as u32;
    let expected = largest_received.saturating_add(1);
    let win = 1u64 << bits;
    let hwin = win / 2;
    let mask = win - 1;
    let candidate = (expected & !mask) | (u64::from(truncated) & mask);
    let max_pn = (1u64 << 62) - 1;
    if expected
        .checked_sub(hwin)
        .is_some_and(|low| candidate <= low)
        && candidate < (max_pn + 1) - win
    {
        candidate + win
    } else if candidate > expected.saturating_add(hwin) && candidate >= win {
        candidate - win
    } else {
        candidate
    }
}

// ---------------------------------------------------------------------------------------------
// Explicit rate: router access to the feedback field (§13)

/// Offset of the feedback-rate field of the short-header packet in `datagram` (skipping
/// coalesced Initial/Handshake packets), if there is one with a rate area and at least an AEAD
/// tag of payload. `local_cid_len` is the connection-ID length of the datagram's receiver
/// (for a router: the length the deployment uses, 8 by default).
pub fn feedback_rate_offset(datagram: &[u8], local_cid_len: usize) -> Option<usize> {
    let mut start = 0;
    loop {
        let rest = datagram.get(start..)?;
        let first = *rest.first()?;
        if first & LONG_FORM != 0 {
            match Packet::decode(rest, local_cid_len).ok()? {
                (
                    Packet {
                        header: Header::Initial(_) | Header::Handshake(_),
                        ..
                    },
                    after,
                ) => start = datagram.len() - after.len(),
                _ => return None,
            }
        } else {
            let (header, len) = ShortHeader::decode(rest, local_cid_len).ok()?;
            if rest.len() < len + AEAD_TAG_LEN {
                return None;
            }
            return header.feedback_rate_offset().map(|o| start + o);
        }
    }
}

/// Whether `datagram` starts with a tern v1 long header (the long-form and fixed bits, then
/// [`VERSION_1`]): how a router on the path tells a tern flow from another protocol built on
/// the same invariants. QUIC's short header looks like tern's: its spin bit is tern's R bit
/// and its reserved bits are under header protection, so about one QUIC 1-RTT packet in eight
/// parses as a tern packet with a rate area, and rewriting its four "feedback" bytes breaks
/// its AEAD tag. A router therefore stamps only the flows on which it saw a tern handshake.
pub fn is_tern_long_header(datagram: &[u8]) -> bool {
    match datagram {
        [first, v0, v1, v2, v3, ..] => {
            first & (LONG_FORM | FIXED_BIT) == LONG_FORM | FIXED_BIT
                && u32::from_be_bytes([*v0, *v1, *v2, *v3]) == VERSION_1
        }
        _ => false,
    }
}

/// The feedback rate (kbit/s) carried by `datagram`, if any (see [`feedback_rate_offset`]).
pub fn read_feedback_rate(datagram: &[u8], local_cid_len: usize) -> Option<u32> {
    let o = feedback_rate_offset(datagram, local_cid_len)?;
    let field = datagram.get(o..o + 4)?;
    Some(u32::from_be_bytes([field[0], field[1], field[2], field[3]]))
}

/// Router helper (§13): rewrites the feedback rate of `datagram` in place to `new_kbps` if that
/// is lower than the current value. Returns whether it rewrote the field. Never raises it.
pub fn lower_feedback_rate(datagram: &mut [u8], local_cid_len: usize, new_kbps: u32) -> bool {
    let Some(o) = feedback_rate_offset(datagram, local_cid_len) else {
        return false;
    };
    let Some(field) = datagram.get_mut(o..o + 4) else {
        return false;
    };
    let current = u32::from_be_bytes([field[0], field[1], field[2], field[3]]);
    if new_kbps < current {
        field.copy_from_slice(&new_kbps.to_be_bytes());
        true
    } else {
        false
    }
}

// ---------------------------------------------------------------------------------------------
// Stateless reset (§4.9, §14.3)

/// The last 16 bytes of `datagram` if it could be a stateless reset: at least
/// [`STATELESS_RESET_MIN_LEN`] bytes with a short-header first bit. For a lookup of the token
/// among the connection's known ones.
pub fn stateless_reset_token(datagram: &[u8]) -> Option<ResetToken> {
    if datagram.len() < STATELESS_RESET_MIN_LEN || datagram[0] & LONG_FORM != 0 {
        return None;
    }
    let mut token = [0; RESET_TOKEN_LEN];
    token.copy_from_slice(&datagram[datagram.len() - RESET_TOKEN_LEN..]);
    Some(token)
}

/// Whether `datagram` is a stateless reset carrying `token` (constant-time comparison).
pub fn is_stateless_reset(datagram: &[u8], token: &ResetToken) -> bool {
    stateless_reset_token(datagram).is_some_and(|t| ct_eq(&t, token))
}

/// Writes a stateless reset: a first byte `0 1 0 0 0 x x x` (x from `unpredictable[0]`), the
/// rest of `unpredictable`, then `token`. `unpredictable` must be at least 5 bytes (it is
/// zero-extended otherwise) and the result must be shorter than the packet that triggered it
/// (§14.3). The R and reserved bits are clear so that a router never rewrites the bytes.
pub fn encode_stateless_reset<B: BufMut + ?Sized>(
    unpredictable: &[u8],
    token: &ResetToken,
    buf: &mut B,
) {
    const MIN_UNPREDICTABLE: usize = STATELESS_RESET_MIN_LEN - RESET_TOKEN_LEN;
    let first = unpredictable.first().copied().unwrap_or(0);
    buf.put_u8(FIXED_BIT | (first & (KEY_PHASE_BIT | PN_LEN_MASK)));
    if let Some(tail) = unpredictable.get(1..) {
        buf.put_slice(tail);
    }
    for _ in unpredictable.len().max(1)..MIN_UNPREDICTABLE {
        buf.put_u8(0);
    }
    buf.put_slice(token);
}

/// Length of [`encode_stateless_reset`]'s output.
pub fn stateless_reset_len(unpredictable_len: usize) -> usize {
    unpredictable_len.max(STATELESS_RESET_MIN_LEN - RESET_TOKEN_LEN) + RESET_TOKEN_LEN
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cid::tests::arb_cid;
    use crate::wire::{DEFAULT_CID_LEN, VERSION_1};
    use proptest::prelude::*;

    fn cid(bytes: &[u8]) -> ConnectionId {
        ConnectionId::new(bytes).unwrap()
    }

    /// RFC 9000 Appendix A.2 and §17.1 examples.
    #[test]
    fn pn_len_rfc_examples() {
        assert_eq!(encode_pn_len(0xac5c02, Some(0xabe8b3)), 2);
        assert_eq!(encode_pn_len(0xace8fe, Some(0xabe8b3)), 3);
        assert_eq!(encode_pn_len(0, None), 1);
        assert_eq!(encode_pn_len(127, None), 2); // 128 unacked → range 256
        assert_eq!(encode_pn_len(126, None), 1);
        assert_eq!(encode_pn_len(u64::MAX, Some(0)), 4);
        assert_eq!(encode_pn_len(5, Some(9)), 1); // acked above full_pn: caller bug, no panic
    }

    /// RFC 9000 Appendix A.3 example, plus edges.
    #[test]
    fn pn_decode_rfc_examples() {
        assert_eq!(decode_pn(0xa82f30ea, 0x9b32, 2), 0xa82f9b32);
        // Wrap forward and backward around the window.
        assert_eq!(decode_pn(0xff, 0x01, 1), 0x101);
        assert_eq!(decode_pn(0x101, 0xff, 1), 0xff);
        assert_eq!(decode_pn(0, 0, 1), 0);
        assert_eq!(decode_pn(0, 5, 4), 5);
        // Near 2^62 the candidate is not pushed past the maximum.
        let max = (1u64 << 62) - 1;
        assert_eq!(decode_pn(max - 1, (max & 0xff) as u32, 1), max);
        // Out-of-range pn_len is clamped, never panics.
        assert_eq!(decode_pn(10, 11, 0), 11);
        assert_eq!(decode_pn(10, 11, 9), 11);
        assert_eq!(decode_pn(u64::MAX, 0, 1), decode_pn(u64::MAX, 0, 1));
    }

    #[test]
    fn short_header_layout() {
        let h = ShortHeader {
            key_phase: true,
            dcid: cid(&[1, 2, 3, 4, 5, 6, 7, 8]),
            path_id: 3,
            pn_len: 2,
            truncated_pn: 0xabcd,
            rate: Some(RateArea {
                expected_kbps: 0x0102_0304,
                feedback_kbps: 0x0a0b_0c0d,
            }),
        };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(
            buf,
            [
                0x40 | 0x20 | 0x04 | 0x01,
                1,
                2,
                3,
                4,
                5,
                6,
                7,
                8,
                3,
                0xab,
                0xcd,
                1,
                2,
                3,
                4,
                0x0a,
                0x0b,
                0x0c,
                0x0d
            ]
        );
        assert_eq!(h.header_len(), buf.len());
        assert_eq!(h.feedback_rate_offset(), Some(16));
        let no_rate = ShortHeader { rate: None, ..h };
        assert_eq!(no_rate.header_len(), 12);
        assert_eq!(no_rate.feedback_rate_offset(), None);
        // ≤ 16 bytes without the rate area for the default CID length.
        let widest = ShortHeader {
            pn_len: 4,
            rate: None,
            ..h
        };
        assert!(widest.header_len() <= 16);

        let mut aad = Vec::new();
        h.encode_aad(&mut aad);
        let mut scratch = [0; MAX_SHORT_HEADER_LEN];
        assert_eq!(
            short_header_aad(&buf, h.feedback_rate_offset(), &mut scratch),
            &aad[..]
        );
        assert_eq!(&aad[16..], &[0, 0, 0, 0]);
        assert_eq!(&aad[..16], &buf[..16]);
    }

    #[test]
    fn short_header_rejects() {
        let ok = [0x40, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9];
        assert!(ShortHeader::decode(&ok, 8).is_ok());
        let mut bad = ok;
        bad[0] = 0x00; // fixed bit
        assert_eq!(
            ShortHeader::decode(&bad, 8),
            Err(DecodeError::InvalidValue("fixed bit"))
        );
        for reserved in [0x08, 0x10] {
            bad[0] = 0x40 | reserved;
            assert_eq!(
                ShortHeader::decode(&bad, 8),
                Err(DecodeError::InvalidValue("reserved bits"))
            );
        }
        bad[0] = 0x43; // 4-byte pn, but only one byte left
        assert_eq!(
            ShortHeader::decode(&bad, 8),
            Err(DecodeError::UnexpectedEnd)
        );
        assert_eq!(ShortHeader::decode(&ok, 21), Err(DecodeError::TooLong));
        bad[0] = 0x60; // rate area missing
        assert_eq!(
            ShortHeader::decode(&bad, 8),
            Err(DecodeError::UnexpectedEnd)
        );
    }

    #[test]
    fn initial_layout_and_coalescing() {
        let initial = InitialHeader {
            version: VERSION_1,
            dcid: cid(&[0xaa; 8]),
            scid: cid(&[0xbb; 8]),
            token: b"tok",
        };
        let hs = HandshakeHeader {
            version: VERSION_1,
            dcid: cid(&[0xaa; 8]),
            scid: cid(&[0xbb; 8]),
        };
        let mut dgram = Vec::new();
        initial.encode(5, &mut dgram);
        assert_eq!(
            &dgram[..6],
            &[0xc0, 0x74, 0x65, 0x72, 0x01, 8],
            "form, fixed, type 0, version 'ter'1, dcid len"
        );
        assert_eq!(dgram.len(), initial.encoded_len(5));
        dgram.extend_from_slice(b"hello");
        hs.encode(3, &mut dgram);
        dgram.extend_from_slice(b"abc");
        let short = ShortHeader::new(cid(&[0xcc; 8]), 0, false, 7, None, Some(RateArea::UNSET));
        short.encode(&mut dgram);
        dgram.extend_from_slice(&[0x55; 20]);

        let packets: Vec<_> = PacketIter::new(&dgram, DEFAULT_CID_LEN)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(packets.len(), 3);
        assert_eq!(packets[0].header, Header::Initial(initial));
        assert_eq!(packets[0].payload, b"hello");
        assert_eq!(packets[1].header, Header::Handshake(hs));
        assert_eq!(packets[1].payload, b"abc");
        assert_eq!(packets[2].header, Header::Short(short));
        assert_eq!(packets[2].payload, &[0x55; 20]);
        assert_eq!(packets[2].header_bytes.len(), short.header_len());

        // The router finds and lowers the rate behind the coalesced long packets.
        let before = read_feedback_rate(&dgram, DEFAULT_CID_LEN);
        assert_eq!(before, Some(NO_RATE_LIMIT));
        assert!(lower_feedback_rate(&mut dgram, DEFAULT_CID_LEN, 5000));
        assert!(!lower_feedback_rate(&mut dgram, DEFAULT_CID_LEN, 6000));
        assert!(lower_feedback_rate(&mut dgram, DEFAULT_CID_LEN, 4000));
        assert_eq!(read_feedback_rate(&dgram, DEFAULT_CID_LEN), Some(4000));
        let (p, _) = Packet::decode(&dgram[dgram.len() - 20 - short.header_len()..], 8).unwrap();
        let Header::Short(h) = p.header else {
            panic!("short expected")
        };
        assert_eq!(h.rate.unwrap().feedback_kbps, 4000);
        assert_eq!(h.rate.unwrap().expected_kbps, NO_RATE_LIMIT);
    }

    #[test]
    fn padding_after_initial_is_ignored() {
        let initial = InitialHeader {
            version: VERSION_1,
            dcid: cid(&[1; 8]),
            scid: cid(&[2; 8]),
            token: &[],
        };
        let mut dgram = Vec::new();
        initial.encode(4, &mut dgram);
        dgram.extend_from_slice(b"nois\x18"); // 0x18: no fixed bit
        dgram.resize(crate::wire::MIN_INITIAL_DATAGRAM_SIZE, 0);
        let mut it = PacketIter::new(&dgram, 8);
        let p = it.next().unwrap().unwrap();
        assert_eq!(p.payload, b"nois");
        // 'e' is not a valid packet start
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());

        let mut dgram = Vec::new();
        initial.encode(5, &mut dgram);
        dgram.extend_from_slice(b"noise");
        dgram.resize(1200, 0);
        assert_eq!(PacketIter::new(&dgram, 8).count(), 1);
        // A datagram that starts with zero is not a packet.
        assert!(PacketIter::new(&[0, 0, 0], 8).next().unwrap().is_err());
        assert!(feedback_rate_offset(&dgram, 8).is_none());
    }

    #[test]
    fn long_header_rejects() {
        let h = HandshakeHeader {
            version: VERSION_1,
            dcid: cid(&[1; 8]),
            scid: cid(&[2; 4]),
        };
        let mut good = Vec::new();
        h.encode(1, &mut good);
        good.push(0xff);
        assert!(Packet::decode(&good, 8).is_ok());

        let mut bad = good.clone();
        bad[0] |= 0x01;
        assert_eq!(
            Packet::decode(&bad, 8),
            Err(DecodeError::InvalidValue("reserved bits"))
        );
        let mut bad = good.clone();
        bad[0] &= !FIXED_BIT;
        assert_eq!(
            Packet::decode(&bad, 8),
            Err(DecodeError::InvalidValue("fixed bit"))
        );
        let mut bad = good.clone();
        bad[0] |= 0x30;
        assert_eq!(
            Packet::decode(&bad, 8),
            Err(DecodeError::InvalidValue("long packet type"))
        );
        let mut bad = good.clone();
        bad[1..5].copy_from_slice(&0x0a0a_0a0au32.to_be_bytes());
        assert_eq!(
            Packet::decode(&bad, 8),
            Err(DecodeError::UnsupportedVersion(0x0a0a_0a0a))
        );
        let inv = LongHeaderInvariants::decode(&bad).unwrap();
        assert_eq!(inv.dcid, &[1; 8]);
        assert_eq!(inv.scid, &[2; 4]);
        let mut bad = good.clone();
        bad.pop();
        assert_eq!(Packet::decode(&bad, 8), Err(DecodeError::UnexpectedEnd));
        let mut bad = good.clone();
        bad[5] = 21; // dcid length above 20
        bad.extend_from_slice(&[0; 30]);
        assert_eq!(Packet::decode(&bad, 8), Err(DecodeError::TooLong));
        let mut bad = Vec::new();
        h.encode(0, &mut bad);
        assert_eq!(
            Packet::decode(&bad, 8),
            Err(DecodeError::InvalidValue("payload length"))
        );
    }

    #[test]
    fn retry_and_version_negotiation() {
        let retry = RetryHeader {
            version: VERSION_1,
            dcid: cid(&[1; 8]),
            scid: cid(&[9; 8]),
            token: &[7; 40],
        };
        let mut buf = Vec::new();
        retry.encode(&mut buf);
        assert_eq!(buf[0], 0xe0);
        let (p, rest) = Packet::decode(&buf, 8).unwrap();
        assert_eq!(p.header, Header::Retry(retry));
        assert!(rest.is_empty());
        buf.truncate(buf.len() - 40);
        assert_eq!(
            Packet::decode(&buf, 8),
            Err(DecodeError::InvalidValue("retry token"))
        );
        buf.extend_from_slice(&[1; 513]);
        assert_eq!(Packet::decode(&buf, 8), Err(DecodeError::TooLong));

        // A client with an unknown version and a 30-byte DCID gets a VN echoing its CIDs.
        let mut client = vec![0xc0, 0x1a, 0x2a, 0x3a, 0x4a, 30];
        client.extend_from_slice(&[5; 30]);
        client.push(2);
        client.extend_from_slice(&[6; 2]);
        client.extend_from_slice(&[0; 1200]);
        assert_eq!(
            Packet::decode(&client, 8),
            Err(DecodeError::UnsupportedVersion(0x1a2a_3a4a))
        );
        let inv = LongHeaderInvariants::decode(&client).unwrap();
        let mut vn = Vec::new();
        VersionNegotiation::encode_reply(&inv, SUPPORTED_VERSIONS, &mut vn);
        assert_eq!(
            vn.len(),
            VersionNegotiation::reply_len(&inv, SUPPORTED_VERSIONS)
        );
        let (p, _) = Packet::decode(&vn, 8).unwrap();
        let Header::VersionNegotiation(v) = p.header else {
            panic!("VN expected")
        };
        assert_eq!(v.dcid, &[6; 2]);
        assert_eq!(v.scid, &[5; 30]);
        assert_eq!(v.versions.iter().collect::<Vec<_>>(), vec![VERSION_1]);
        assert!(v.versions.contains(VERSION_1));
        vn.pop();
        assert_eq!(
            Packet::decode(&vn, 8),
            Err(DecodeError::InvalidValue("version list"))
        );
    }

    #[test]
    fn stateless_reset() {
        let token = [0x5a; 16];
        let mut buf = Vec::new();
        encode_stateless_reset(&[0xff, 1, 2, 3, 4, 5, 6], &token, &mut buf);
        assert_eq!(buf.len(), stateless_reset_len(7));
        assert_eq!(
            buf[0], 0x47,
            "fixed bit + random K/L, never R or reserved bits"
        );
        assert!(is_stateless_reset(&buf, &token));
        assert!(!is_stateless_reset(&buf, &[0x5b; 16]));
        assert_eq!(stateless_reset_token(&buf), Some(token));
        // Too short.
        assert!(!is_stateless_reset(&buf[..20], &token));
        let mut short = Vec::new();
        encode_stateless_reset(&[0], &token, &mut short);
        assert_eq!(short.len(), STATELESS_RESET_MIN_LEN);
        assert!(is_stateless_reset(&short, &token));
        // Long-header datagrams are never resets.
        let mut long = buf.clone();
        long[0] |= 0x80;
        assert!(!is_stateless_reset(&long, &token));
        // A reset never has a rate area a router could rewrite.
        assert_eq!(feedback_rate_offset(&buf, 8), None);
    }

    // ---- property tests ----------------------------------------------------------------

    fn arb_rate() -> impl Strategy<Value = Option<RateArea>> {
        proptest::option::of((any::<u32>(), any::<u32>()).prop_map(|(e, f)| RateArea {
            expected_kbps: e,
            feedback_kbps: f,
        }))
    }

    fn arb_short(cid_len: usize) -> impl Strategy<Value = ShortHeader> {
        (
            any::<bool>(),
            arb_cid(cid_len..=cid_len),
            any::<u8>(),
            1usize..=4,
            any::<u32>(),
            arb_rate(),
        )
            .prop_map(|(key_phase, dcid, path_id, pn_len, pn, rate)| ShortHeader {
                key_phase,
                dcid,
                path_id,
                pn_len,
                truncated_pn: truncate_pn(u64::from(pn), pn_len),
                rate,
            })
    }

    fn arb_bytes(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), len)
    }

    proptest! {
        #[test]
        fn short_round_trip(
            (cid_len, h) in (0usize..=20).prop_flat_map(|l| (Just(l), arb_short(l))),
            payload in arb_bytes(0..=40),
        ) {
            let mut buf = Vec::new();
            h.encode(&mut buf);
            prop_assert_eq!(buf.len(), h.header_len());
            buf.extend_from_slice(&payload);
            let (p, rest) = Packet::decode(&buf, cid_len).unwrap();
            prop_assert_eq!(p.header, Header::Short(h));
            prop_assert_eq!(p.payload, &payload[..]);
            prop_assert!(rest.is_empty());
            prop_assert_eq!(p.encoded_len(), buf.len());
            let mut again = Vec::new();
            p.encode(&mut again);
            prop_assert_eq!(again, buf);
        }

        #[test]
        fn long_round_trip(
            dcid in arb_cid(0..=20),
            scid in arb_cid(0..=20),
            ty in 0u8..3,
            token in arb_bytes(1..=MAX_TOKEN_LEN),
            empty_token in any::<bool>(),
            payload in arb_bytes(1..=300),
        ) {
            let header = match ty {
                0 => Header::Initial(InitialHeader {
                    version: VERSION_1, dcid, scid,
                    token: if empty_token { &[] } else { &token },
                }),
                1 => Header::Handshake(HandshakeHeader { version: VERSION_1, dcid, scid }),
                _ => Header::Retry(RetryHeader { version: VERSION_1, dcid, scid, token: &token }),
            };
            let payload: &[u8] = if ty == 2 { &[] } else { &payload };
            let packet = Packet { header, header_bytes: &[], payload };
            let mut buf = Vec::new();
            packet.encode(&mut buf);
            prop_assert_eq!(buf.len(), packet.encoded_len());
            if ty != 2 {
                buf.extend_from_slice(&[0; 7]); // padding after it
            }
            let (decoded, rest) = Packet::decode(&buf, 8).unwrap();
            prop_assert_eq!(decoded.header, header);
            prop_assert_eq!(decoded.payload, payload);
            prop_assert_eq!(decoded.header_bytes.len(), header.encoded_len(payload.len()));
            if ty != 2 {
                prop_assert_eq!(rest, &[0; 7]);
            }
        }

        #[test]
        fn vn_round_trip(
            dcid in arb_bytes(0..=255),
            scid in arb_bytes(0..=255),
            versions in proptest::collection::vec(any::<u32>(), 1..10),
        ) {
            let client = LongHeaderInvariants { version: 0x1234, dcid: &dcid, scid: &scid };
            let mut buf = Vec::new();
            VersionNegotiation::encode_reply(&client, &versions, &mut buf);
            let (p, _) = Packet::decode(&buf, 8).unwrap();
            let Header::VersionNegotiation(vn) = p.header else { panic!() };
            prop_assert_eq!(vn.dcid, &scid[..]);
            prop_assert_eq!(vn.scid, &dcid[..]);
            prop_assert_eq!(vn.versions.iter().collect::<Vec<_>>(), versions);
            let mut again = Vec::new();
            vn.encode(&mut again);
            prop_assert_eq!(again.len(), vn.encoded_len());
            prop_assert_eq!(again, buf);
        }

        #[test]
        fn pn_round_trip(largest in 0u64..(1 << 62) - (1 << 33), delta in 1u64..(1 << 31)) {
            // The sender's view: largest acked = the receiver's largest received.
            let full = largest + delta;
            let len = encode_pn_len(full, Some(largest));
            prop_assert_eq!(decode_pn(largest, truncate_pn(full, len), len), full);
        }

        #[test]
        fn pn_round_trip_reordered(largest in 0u64..(1 << 40), back in 0u64..100, pn_len in 1usize..=4) {
            // A late packet (below the largest received) still decodes within half a window.
            let full = largest.saturating_sub(back);
            prop_assert_eq!(decode_pn(largest, truncate_pn(full, pn_len), pn_len), full);
        }

        #[test]
        fn arbitrary_datagrams_never_panic(data in arb_bytes(0..=80), cid_len in 0usize..=21, rate in any::<u32>()) {
            for p in PacketIter::new(&data, cid_len).flatten() {
                let mut buf = Vec::new();
                p.encode(&mut buf);
                prop_assert_eq!(buf.len(), p.encoded_len());
            }
            let _ = LongHeaderInvariants::decode(&data);
            let _ = stateless_reset_token(&data);
            let mut copy = data.clone();
            let before = read_feedback_rate(&data, cid_len);
            let lowered = lower_feedback_rate(&mut copy, cid_len, rate);
            prop_assert_eq!(lowered, before.is_some_and(|b| rate < b));
            if !lowered {
                prop_assert_eq!(copy, data);
            }
        }
    }
}
