//! Fuzz entry points (for `cargo fuzz` targets in `fuzz/`): each decodes arbitrary bytes and,
//! on success, re-encodes and checks that decoding the result gives the same value.
//!
//! They panic only when a round-trip property is broken, which is what a fuzzer should report.

use super::{
    feedback_rate_offset, lower_feedback_rate, read_feedback_rate, stateless_reset_token, Frame,
    FrameIter, LongHeaderInvariants, Packet, PacketIter, Reader, TransportParams, DEFAULT_CID_LEN,
    MAX_CID_LEN,
};

/// Packet headers: every packet of the datagram, for several local CID lengths, plus the
/// router's feedback-rate rewrite, stateless-reset detection, and what a load balancer or a
/// worker reads of the destination connection ID (QUIC-LB decoding, which must give back
/// what it encodes).
pub fn header(data: &[u8]) {
    let _ = LongHeaderInvariants::decode(data);
    let _ = stateless_reset_token(data);
    if let Some(dcid) = super::destination_cid(data) {
        for (sid_len, nonce_len, key) in
            [(3, 4, Some([7; 16])), (1, 6, None), (8, 8, Some([1; 16]))]
        {
            let Ok(lb) = crate::lb::QuicLb::new(
                dcid.first().map_or(0, |b| b >> 5).min(6),
                sid_len,
                nonce_len,
                key,
            ) else {
                continue;
            };
            if let Some((sid, nonce)) = lb.decode(dcid) {
                let again = lb.encode(&sid, &nonce).expect("decoded lengths encode");
                assert_eq!(
                    lb.decode(again.as_bytes()),
                    Some((sid, nonce)),
                    "QUIC-LB round trip"
                );
            }
        }
    }
    for cid_len in [DEFAULT_CID_LEN, 0, MAX_CID_LEN] {
        for packet in PacketIter::new(data, cid_len).flatten() {
            let mut buf = Vec::with_capacity(packet.encoded_len());
            packet.encode(&mut buf);
            assert_eq!(buf.len(), packet.encoded_len(), "encoded_len mismatch");
            let (again, rest) = Packet::decode(&buf, cid_len).expect("re-encoded packet decodes");
            assert!(rest.is_empty(), "re-encoded packet has trailing bytes");
            assert_eq!(again.header, packet.header, "header round trip");
            assert_eq!(again.payload, packet.payload, "payload round trip");
        }

        let before = read_feedback_rate(data, cid_len);
        let mut copy = data.to_vec();
        let new_kbps = before.map_or(0, |r| r / 2);
        let lowered = lower_feedback_rate(&mut copy, cid_len, new_kbps);
        assert_eq!(lowered, before.is_some_and(|r| new_kbps < r));
        if lowered {
            assert_eq!(read_feedback_rate(&copy, cid_len), Some(new_kbps));
            // Only the four bytes of the field changed.
            let o = feedback_rate_offset(data, cid_len).expect("offset");
            assert_eq!(copy[..o], data[..o]);
            assert_eq!(copy[o + 4..], data[o + 4..]);
        } else {
            assert_eq!(copy, data);
        }
    }
}

/// Frames: every frame of the payload until the first error; each decoded frame is encoded
/// alone, its length checked against `encoded_len`, and decoded again.
pub fn frames(data: &[u8]) {
    let mut buf = Vec::new();
    for frame in FrameIter::new(data) {
        let Ok(frame) = frame else { break };
        buf.clear();
        frame.encode(&mut buf);
        assert_eq!(buf.len(), frame.encoded_len(), "encoded_len of {frame:?}");
        let mut r = Reader::new(&buf);
        let again = Frame::decode(&mut r).expect("re-encoded frame decodes");
        assert!(r.is_empty(), "trailing bytes after re-encoded {frame:?}");
        assert_eq!(again, frame, "frame round trip");
        // Walk the borrowed lists too.
        match frame {
            Frame::Ack(a) => {
                let n = a.ranges.iter().count() as u64;
                assert_eq!(n, a.ranges.len());
                assert_eq!(
                    a.ranges.iter().last().map(|r| *r.start()),
                    Some(a.ranges.smallest())
                );
            }
            Frame::Nack(n) => {
                let count = n.missing.iter().count() as u64;
                assert_eq!(count, n.missing.len());
                assert_eq!(n.missing.iter().last(), Some(n.missing.last()));
            }
            _ => {}
        }
    }
}

/// Transport parameters.
pub fn transport_params(data: &[u8]) {
    if let Ok(params) = TransportParams::decode(data) {
        let mut buf = Vec::with_capacity(params.encoded_len());
        params.encode(&mut buf);
        assert_eq!(buf.len(), params.encoded_len(), "encoded_len mismatch");
        let again = TransportParams::decode(&buf).expect("re-encoded parameters decode");
        assert_eq!(again, params, "transport parameters round trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn fuzz_header(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            header(&data);
        }

        #[test]
        fn fuzz_header_plausible(
            first in prop_oneof![0x40u8..0x80, 0xc0u8..=0xff],
            data in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            // Start most inputs with a valid form/fixed bit and version 1.
            let mut d = vec![first];
            if first & 0x80 != 0 {
                d.extend_from_slice(&crate::wire::VERSION_1.to_be_bytes());
                d.push(data.len() as u8 % 21);
            }
            d.extend_from_slice(&data);
            header(&d);
        }

        #[test]
        fn fuzz_frames(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            frames(&data);
        }

        #[test]
        fn fuzz_frames_mutated(
            specs in proptest::collection::vec(crate::wire::frame::tests::arb_frame_spec(), 1..4),
            at in any::<usize>(),
            byte in any::<u8>(),
        ) {
            let mut buf = Vec::new();
            for s in &specs {
                s.frame().encode(&mut buf);
            }
            let i = at % buf.len();
            buf[i] = byte;
            frames(&buf);
            frames(&buf[..i]);
        }

        #[test]
        fn fuzz_header_mutated(
            token in proptest::collection::vec(any::<u8>(), 0..20),
            rate in any::<bool>(),
            pn in any::<u64>(),
            at in any::<usize>(),
            byte in any::<u8>(),
        ) {
            use crate::wire::{ConnectionId, InitialHeader, RateArea, ShortHeader, VERSION_1};
            let cid = ConnectionId::from_array([7; 8]);
            let mut buf = Vec::new();
            InitialHeader { version: VERSION_1, dcid: cid, scid: cid, token: &token }.encode(3, &mut buf);
            buf.extend_from_slice(b"abc");
            let rate = rate.then_some(RateArea { expected_kbps: 1000, feedback_kbps: 900 });
            ShortHeader::new(cid, 1, true, pn >> 2, None, rate).encode(&mut buf);
            buf.extend_from_slice(&[0xee; 17]);
            let i = at % buf.len();
            buf[i] = byte;
            header(&buf);
            header(&buf[..i]);
        }

        #[test]
        fn fuzz_transport_params_mutated(
            p in crate::wire::params::tests::arb_params(),
            at in any::<usize>(),
            byte in any::<u8>(),
        ) {
            let mut buf = Vec::new();
            p.encode(&mut buf);
            if !buf.is_empty() {
                let i = at % buf.len();
                buf[i] = byte;
                transport_params(&buf[..i]);
            }
            transport_params(&buf);
        }

        #[test]
        fn fuzz_transport_params(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            transport_params(&data);
        }
    }
}
