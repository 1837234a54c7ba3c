//! Convenience views for the handshake layer: one long-header packet with its fields flat,
//! and builders for the long packets the connection and endpoint send.

use bytes::BufMut;

use super::{
    ConnectionId, DecodeError, HandshakeHeader, Header, InitialHeader, LongType, Packet,
    RetryHeader, WriteExt,
};

/// A decoded Initial, Handshake or Retry packet (the first one of its datagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongPacket<'a> {
    /// Packet type.
    pub ty: LongType,
    /// Destination connection ID.
    pub dcid: ConnectionId,
    /// Source connection ID.
    pub scid: ConnectionId,
    /// Initial: the Retry token echoed (maybe empty); Retry: the token issued.
    pub token: &'a [u8],
    /// Initial and Handshake: the handshake payload (pattern byte and/or Noise message).
    pub payload: &'a [u8],
}

impl<'a> LongPacket<'a> {
    /// Decodes the first packet of `datagram`, which must have a long header.
    pub fn decode(datagram: &'a [u8]) -> Result<Self, DecodeError> {
        let (packet, _rest) = Packet::decode(datagram, 0)?;
        match packet.header {
            Header::Initial(h) => Ok(Self {
                ty: LongType::Initial,
                dcid: h.dcid,
                scid: h.scid,
                token: h.token,
                payload: packet.payload,
            }),
            Header::Handshake(h) => Ok(Self {
                ty: LongType::Handshake,
                dcid: h.dcid,
                scid: h.scid,
                token: &[],
                payload: packet.payload,
            }),
            Header::Retry(h) => Ok(Self {
                ty: LongType::Retry,
                dcid: h.dcid,
                scid: h.scid,
                token: h.token,
                payload: &[],
            }),
            _ => Err(DecodeError::InvalidValue(
                "not an Initial, Handshake or Retry packet",
            )),
        }
    }
}

/// Writes an Initial, Handshake or Retry packet.
pub fn encode_long_packet<B: BufMut + ?Sized>(
    buf: &mut B,
    ty: LongType,
    version: u32,
    dcid: &ConnectionId,
    scid: &ConnectionId,
    token: &[u8],
    payload: &[u8],
) {
    let (dcid, scid) = (*dcid, *scid);
    match ty {
        LongType::Initial => {
            InitialHeader {
                version,
                dcid,
                scid,
                token,
            }
            .encode(payload.len(), buf);
            buf.put_slice(payload);
        }
        LongType::Handshake => {
            HandshakeHeader {
                version,
                dcid,
                scid,
            }
            .encode(payload.len(), buf);
            buf.put_slice(payload);
        }
        LongType::Retry => RetryHeader {
            version,
            dcid,
            scid,
            token,
        }
        .encode(buf),
    }
}

/// Writes the header of a Flow frame with an explicit length; the caller appends `len` bytes.
pub fn encode_flow_header<B: BufMut + ?Sized>(
    buf: &mut B,
    flow_id: u64,
    offset: u64,
    len: u64,
    fin: bool,
) {
    let mut ty = super::frame_type::FLOW | 0x02;
    if offset > 0 {
        ty |= 0x04;
    }
    if fin {
        ty |= 0x01;
    }
    buf.put_varint(ty);
    buf.put_varint(flow_id);
    if offset > 0 {
        buf.put_varint(offset);
    }
    buf.put_varint(len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Frame, FrameIter, VERSION_1};

    #[test]
    fn long_packets_round_trip() {
        let a = ConnectionId::new(&[1; 8]).unwrap();
        let b = ConnectionId::new(&[2; 8]).unwrap();
        for ty in [LongType::Initial, LongType::Handshake, LongType::Retry] {
            let mut buf = Vec::new();
            encode_long_packet(&mut buf, ty, VERSION_1, &a, &b, b"tok", b"payload");
            let p = LongPacket::decode(&buf).unwrap();
            assert_eq!((p.ty, p.dcid, p.scid), (ty, a, b));
            if ty != LongType::Handshake {
                assert_eq!(p.token, b"tok");
            }
            if ty != LongType::Retry {
                assert_eq!(p.payload, b"payload");
            }
        }
    }

    #[test]
    fn flow_header_matches_frame_codec() {
        for (offset, fin) in [(0, false), (7, true), (1 << 40, false)] {
            let mut buf = Vec::new();
            encode_flow_header(&mut buf, 9, offset, 3, fin);
            buf.extend_from_slice(b"abc");
            let frame = FrameIter::new(&buf).next().unwrap().unwrap();
            let Frame::Flow(f) = frame else {
                panic!("not a flow frame")
            };
            assert_eq!(
                (f.flow_id, f.offset, f.fin, f.data),
                (9, offset, fin, &b"abc"[..])
            );
        }
    }
}
