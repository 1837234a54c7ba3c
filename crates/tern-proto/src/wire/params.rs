//! Transport parameters (PROTOCOL.md §8), carried inside the Noise handshake payloads.
//!
//! Encoding: a sequence of `(id varint, length varint, value)` entries. Unknown IDs are
//! skipped (extensibility, §16), any ID appearing twice is an error, and a parameter equal to
//! its default is omitted by the encoder (an absent parameter takes its default).

use std::net::SocketAddr;

use bytes::BufMut;

use super::frame::{addr_len, decode_addr, encode_addr};
use super::{
    len_prefixed_len, varint_len, DecodeError, Reader, ResetToken, VarInt, WriteExt, MAX_FLOWS,
    MIN_MAX_DATAGRAM_SIZE, RESET_TOKEN_LEN,
};

/// Transport parameter IDs (§8).
pub mod param_id {
    /// `initial_max_data`.
    pub const INITIAL_MAX_DATA: u64 = 0x00;
    /// `initial_max_flow_data_bidi_local`.
    pub const INITIAL_MAX_FLOW_DATA_BIDI_LOCAL: u64 = 0x01;
    /// `initial_max_flow_data_bidi_remote`.
    pub const INITIAL_MAX_FLOW_DATA_BIDI_REMOTE: u64 = 0x02;
    /// `initial_max_flow_data_uni`.
    pub const INITIAL_MAX_FLOW_DATA_UNI: u64 = 0x03;
    /// `initial_max_flows_bidi`.
    pub const INITIAL_MAX_FLOWS_BIDI: u64 = 0x04;
    /// `initial_max_flows_uni`.
    pub const INITIAL_MAX_FLOWS_UNI: u64 = 0x05;
    /// `idle_timeout_ms`.
    pub const IDLE_TIMEOUT_MS: u64 = 0x06;
    /// `max_ack_delay_ms`.
    pub const MAX_ACK_DELAY_MS: u64 = 0x07;
    /// `max_datagram_size`.
    pub const MAX_DATAGRAM_SIZE: u64 = 0x08;
    /// `stateless_reset_token` (server only).
    pub const STATELESS_RESET_TOKEN: u64 = 0x09;
    /// `max_message_size`.
    pub const MAX_MESSAGE_SIZE: u64 = 0x0a;
    /// `max_datagram_frame_size`.
    pub const MAX_DATAGRAM_FRAME_SIZE: u64 = 0x0b;
    /// `active_connection_id_limit`.
    pub const ACTIVE_CONNECTION_ID_LIMIT: u64 = 0x0c;
    /// `addresses` (server only).
    pub const ADDRESSES: u64 = 0x0d;
    /// `first_flight_time_us` (client only).
    pub const FIRST_FLIGHT_TIME_US: u64 = 0x0e;
}

use param_id as id;

/// Largest UDP payload (65 535 − 8).
pub const MAX_UDP_PAYLOAD: u64 = 65_527;
/// Largest `max_ack_delay_ms` (as QUIC: 2^14 ms).
pub const MAX_ACK_DELAY_LIMIT_MS: u64 = 1 << 14;
/// Most addresses a server may advertise.
pub const MAX_ADDRESSES: usize = 16;

/// An endpoint's transport parameters (§8). Absent parameters take the values of
/// [`TransportParams::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportParams {
    /// Connection-level credit: total bytes the peer may send on all flows. Default 1 MiB.
    pub initial_max_data: u64,
    /// Credit for bidirectional flows opened by the sender of these parameters. Default 256 KiB.
    pub initial_max_flow_data_bidi_local: u64,
    /// Credit for bidirectional flows opened by the peer. Default 256 KiB.
    pub initial_max_flow_data_bidi_remote: u64,
    /// Credit for unidirectional flows opened by the peer. Default 256 KiB.
    pub initial_max_flow_data_uni: u64,
    /// Bidirectional flows the peer may open (≤ 2^60). Default 100.
    pub initial_max_flows_bidi: u64,
    /// Unidirectional flows the peer may open (≤ 2^60). Default 100.
    pub initial_max_flows_uni: u64,
    /// Idle timeout in ms; 0 disables it. Default 30 000.
    pub idle_timeout_ms: u64,
    /// Longest the sender delays an ACK, in ms (< 2^14). Default 25.
    pub max_ack_delay_ms: u64,
    /// Largest UDP payload the sender accepts (1200..=65 527). Default 65 527.
    pub max_datagram_size: u64,
    /// Server only: stateless reset token of the server's handshake connection ID.
    pub stateless_reset_token: Option<ResetToken>,
    /// Largest message (F5) the sender accepts, in bytes; 0: messages not accepted.
    /// Default 16 MiB.
    pub max_message_size: u64,
    /// Largest `Datagram` frame (F6) the sender accepts; 0 (the default): datagrams not
    /// accepted.
    pub max_datagram_frame_size: u64,
    /// Connection IDs the sender is willing to store for the peer (≥ 2). Default 2.
    pub active_connection_id_limit: u64,
    /// Server only: the server's other addresses, for multipath (F15). Default empty;
    /// at most [`MAX_ADDRESSES`].
    pub addresses: Vec<SocketAddr>,
    /// Client only: its wall clock when it wrote message 1, in µs since the UNIX epoch, for
    /// the server's first-flight replay check (§7.6). Default 0: no clock.
    pub first_flight_time_us: u64,
}

impl Default for TransportParams {
    fn default() -> Self {
        TransportParams {
            initial_max_data: 1 << 20,
            initial_max_flow_data_bidi_local: 256 << 10,
            initial_max_flow_data_bidi_remote: 256 << 10,
            initial_max_flow_data_uni: 256 << 10,
            initial_max_flows_bidi: 100,
            initial_max_flows_uni: 100,
            idle_timeout_ms: 30_000,
            max_ack_delay_ms: 25,
            max_datagram_size: MAX_UDP_PAYLOAD,
            stateless_reset_token: None,
            max_message_size: 16 << 20,
            max_datagram_frame_size: 0,
            active_connection_id_limit: 2,
            addresses: Vec::new(),
            first_flight_time_us: 0,
        }
    }
}

type Get = fn(&TransportParams) -> u64;
type Set = fn(&mut TransportParams, u64);

/// The integer parameters: ID, name (for errors), accessors, valid range.
const INTEGER_PARAMS: &[(u64, &str, Get, Set, u64, u64)] = &[
    (
        id::INITIAL_MAX_DATA,
        "initial_max_data",
        |p| p.initial_max_data,
        |p, v| p.initial_max_data = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::INITIAL_MAX_FLOW_DATA_BIDI_LOCAL,
        "initial_max_flow_data_bidi_local",
        |p| p.initial_max_flow_data_bidi_local,
        |p, v| p.initial_max_flow_data_bidi_local = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::INITIAL_MAX_FLOW_DATA_BIDI_REMOTE,
        "initial_max_flow_data_bidi_remote",
        |p| p.initial_max_flow_data_bidi_remote,
        |p, v| p.initial_max_flow_data_bidi_remote = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::INITIAL_MAX_FLOW_DATA_UNI,
        "initial_max_flow_data_uni",
        |p| p.initial_max_flow_data_uni,
        |p, v| p.initial_max_flow_data_uni = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::INITIAL_MAX_FLOWS_BIDI,
        "initial_max_flows_bidi",
        |p| p.initial_max_flows_bidi,
        |p, v| p.initial_max_flows_bidi = v,
        0,
        MAX_FLOWS,
    ),
    (
        id::INITIAL_MAX_FLOWS_UNI,
        "initial_max_flows_uni",
        |p| p.initial_max_flows_uni,
        |p, v| p.initial_max_flows_uni = v,
        0,
        MAX_FLOWS,
    ),
    (
        id::IDLE_TIMEOUT_MS,
        "idle_timeout_ms",
        |p| p.idle_timeout_ms,
        |p, v| p.idle_timeout_ms = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::MAX_ACK_DELAY_MS,
        "max_ack_delay_ms",
        |p| p.max_ack_delay_ms,
        |p, v| p.max_ack_delay_ms = v,
        0,
        MAX_ACK_DELAY_LIMIT_MS - 1,
    ),
    (
        id::MAX_DATAGRAM_SIZE,
        "max_datagram_size",
        |p| p.max_datagram_size,
        |p, v| p.max_datagram_size = v,
        MIN_MAX_DATAGRAM_SIZE,
        MAX_UDP_PAYLOAD,
    ),
    (
        id::MAX_MESSAGE_SIZE,
        "max_message_size",
        |p| p.max_message_size,
        |p, v| p.max_message_size = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::MAX_DATAGRAM_FRAME_SIZE,
        "max_datagram_frame_size",
        |p| p.max_datagram_frame_size,
        |p, v| p.max_datagram_frame_size = v,
        0,
        VarInt::MAX.into_inner(),
    ),
    (
        id::ACTIVE_CONNECTION_ID_LIMIT,
        "active_connection_id_limit",
        |p| p.active_connection_id_limit,
        |p, v| p.active_connection_id_limit = v,
        2,
        VarInt::MAX.into_inner(),
    ),
    (
        id::FIRST_FLIGHT_TIME_US,
        "first_flight_time_us",
        |p| p.first_flight_time_us,
        |p, v| p.first_flight_time_us = v,
        0,
        VarInt::MAX.into_inner(),
    ),
];

impl TransportParams {
    /// Decodes and validates parameters. Any error closes the connection with
    /// `TRANSPORT_PARAMETER_ERROR`.
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let mut params = TransportParams::default();
        let mut seen: Vec<u64> = Vec::new();
        let mut r = Reader::new(data);
        while !r.is_empty() {
            let pid = r.varint()?;
            let value = r.len_prefixed(usize::MAX)?;
            seen.push(pid);
            if let Some(&(_, name, _, set, min, max)) = INTEGER_PARAMS.iter().find(|p| p.0 == pid) {
                let mut vr = Reader::new(value);
                let v = vr.varint().map_err(|_| DecodeError::InvalidValue(name))?;
                if !vr.is_empty() || v < min || v > max {
                    return Err(DecodeError::InvalidValue(name));
                }
                set(&mut params, v);
                continue;
            }
            match pid {
                id::STATELESS_RESET_TOKEN => {
                    let token: ResetToken = value
                        .try_into()
                        .map_err(|_| DecodeError::InvalidValue("stateless_reset_token"))?;
                    params.stateless_reset_token = Some(token);
                }
                id::ADDRESSES => {
                    let mut ar = Reader::new(value);
                    while !ar.is_empty() {
                        if params.addresses.len() == MAX_ADDRESSES {
                            return Err(DecodeError::TooLong);
                        }
                        let addr = decode_addr(&mut ar)
                            .map_err(|_| DecodeError::InvalidValue("addresses"))?;
                        params.addresses.push(addr);
                    }
                }
                // §16: unknown parameters are ignored.
                _ => {}
            }
        }
        // Sorting keeps this O(n log n) on hostile input with thousands of entries.
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(DecodeError::DuplicateParameter(w[0]));
        }
        Ok(params)
    }

    /// Checks the rules that apply to parameters sent by a client: no
    /// `stateless_reset_token`, no `addresses` (§8).
    pub fn validate_for_client(&self) -> Result<(), DecodeError> {
        if self.stateless_reset_token.is_some() {
            return Err(DecodeError::InvalidValue("stateless_reset_token"));
        }
        if !self.addresses.is_empty() {
            return Err(DecodeError::InvalidValue("addresses"));
        }
        Ok(())
    }

    fn addresses_capped(&self) -> &[SocketAddr] {
        debug_assert!(self.addresses.len() <= MAX_ADDRESSES, "too many addresses");
        &self.addresses[..self.addresses.len().min(MAX_ADDRESSES)]
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        let defaults = TransportParams::default();
        let mut len = 0;
        for &(pid, _, get, _, _, _) in INTEGER_PARAMS {
            let v = get(self);
            if v != get(&defaults) {
                len += varint_len(pid) + len_prefixed_len(varint_len(v));
            }
        }
        if self.stateless_reset_token.is_some() {
            len += varint_len(id::STATELESS_RESET_TOKEN) + len_prefixed_len(RESET_TOKEN_LEN);
        }
        if !self.addresses.is_empty() {
            let n: usize = self.addresses_capped().iter().map(addr_len).sum();
            len += varint_len(id::ADDRESSES) + len_prefixed_len(n);
        }
        len
    }

    /// Writes the parameters that differ from their defaults, in ID order. Values outside
    /// their valid range are caller bugs (`debug_assert!`).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        let defaults = TransportParams::default();
        for &(pid, name, get, _, min, max) in INTEGER_PARAMS {
            let v = get(self);
            debug_assert!((min..=max).contains(&v), "{name} out of range: {v}");
            if v != get(&defaults) {
                buf.put_varint(pid);
                buf.put_varint(varint_len(v) as u64);
                buf.put_varint(v);
            }
        }
        if let Some(token) = &self.stateless_reset_token {
            buf.put_varint(id::STATELESS_RESET_TOKEN);
            buf.put_len_prefixed(token);
        }
        if !self.addresses.is_empty() {
            let addrs = self.addresses_capped();
            buf.put_varint(id::ADDRESSES);
            buf.put_varint(addrs.iter().map(addr_len).sum::<usize>() as u64);
            for a in addrs {
                encode_addr(a, buf);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, SocketAddrV4, SocketAddrV6};

    #[test]
    fn defaults_encode_to_nothing() {
        let p = TransportParams::default();
        let mut buf = Vec::new();
        p.encode(&mut buf);
        assert!(buf.is_empty());
        assert_eq!(p.encoded_len(), 0);
        assert_eq!(TransportParams::decode(&[]), Ok(p));
    }

    #[test]
    fn layout_and_unknown_skipped() {
        let p = TransportParams {
            max_datagram_size: 1452,
            addresses: vec![SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::new(10, 0, 0, 1),
                4433,
            ))],
            ..TransportParams::default()
        };
        let mut buf = Vec::new();
        // A reserved (greasing) parameter 31*1+27 = 58 before the real ones.
        buf.extend_from_slice(&[58, 3, 1, 2, 3]);
        p.encode(&mut buf);
        assert_eq!(
            &buf[5..],
            &[
                0x08, 2, 0x45, 0xac, // max_datagram_size = 1452
                0x0d, 7, 4, 10, 0, 0, 1, 0x11, 0x51, // addresses
            ]
        );
        assert_eq!(p.encoded_len(), buf.len() - 5);
        assert_eq!(TransportParams::decode(&buf), Ok(p.clone()));
        assert_eq!(
            p.validate_for_client(),
            Err(DecodeError::InvalidValue("addresses"))
        );
        assert_eq!(TransportParams::default().validate_for_client(), Ok(()));
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let cases: &[(&[u8], DecodeError)] = &[
            (
                &[0x08, 2, 0x44, 0xaf],
                DecodeError::InvalidValue("max_datagram_size"),
            ), // 1199
            (
                &[0x08, 4, 0x80, 1, 0, 0],
                DecodeError::InvalidValue("max_datagram_size"),
            ), // 65536
            (
                &[0x07, 2, 0x80 | 0x40, 0],
                DecodeError::InvalidValue("max_ack_delay_ms"),
            ),
            (
                &[0x07, 4, 0x80, 0, 0x40, 0],
                DecodeError::InvalidValue("max_ack_delay_ms"),
            ),
            (
                &[0x0c, 1, 1],
                DecodeError::InvalidValue("active_connection_id_limit"),
            ),
            (
                &[0x00, 2, 1, 1],
                DecodeError::InvalidValue("initial_max_data"),
            ), // trailing
            (&[0x00, 0], DecodeError::InvalidValue("initial_max_data")), // empty
            (
                &[0x09, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                DecodeError::InvalidValue("stateless_reset_token"),
            ),
            (&[0x0d, 2, 5, 0], DecodeError::InvalidValue("addresses")),
            (&[0x0d, 3, 4, 1, 2], DecodeError::InvalidValue("addresses")),
            (
                &[0x06, 1, 5, 0x06, 1, 5],
                DecodeError::DuplicateParameter(6),
            ),
            (&[0x3a, 0, 0x3a, 0], DecodeError::DuplicateParameter(0x3a)),
            (&[0x06, 5, 1], DecodeError::UnexpectedEnd),
            (&[0x06], DecodeError::UnexpectedEnd),
        ];
        for (bytes, err) in cases {
            assert_eq!(TransportParams::decode(bytes), Err(*err), "{bytes:02x?}");
        }
        // Too many addresses.
        let mut buf = vec![0x0d];
        buf.put_varint(7 * 17);
        for _ in 0..17 {
            buf.extend_from_slice(&[4, 1, 2, 3, 4, 0, 80]);
        }
        assert_eq!(TransportParams::decode(&buf), Err(DecodeError::TooLong));
    }

    fn v() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..64, 0u64..=VarInt::MAX.into_inner()]
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(ip.into(), port))),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::V6(SocketAddrV6::new(ip.into(), port, 0, 0))),
        ]
    }

    pub(crate) fn arb_params() -> impl Strategy<Value = TransportParams> {
        (
            (v(), v(), v(), v(), 0..=MAX_FLOWS, 0..=MAX_FLOWS, v()),
            (
                0..MAX_ACK_DELAY_LIMIT_MS,
                MIN_MAX_DATAGRAM_SIZE..=MAX_UDP_PAYLOAD,
                proptest::option::of(any::<ResetToken>()),
                v(),
                v(),
                2..=VarInt::MAX.into_inner(),
                proptest::collection::vec(arb_addr(), 0..=MAX_ADDRESSES),
            ),
            v(),
        )
            .prop_map(|((a, b, c, d, e, f, g), (h, i, j, k, l, m, n), o)| {
                TransportParams {
                    initial_max_data: a,
                    initial_max_flow_data_bidi_local: b,
                    initial_max_flow_data_bidi_remote: c,
                    initial_max_flow_data_uni: d,
                    initial_max_flows_bidi: e,
                    initial_max_flows_uni: f,
                    idle_timeout_ms: g,
                    max_ack_delay_ms: h,
                    max_datagram_size: i,
                    stateless_reset_token: j,
                    max_message_size: k,
                    max_datagram_frame_size: l,
                    active_connection_id_limit: m,
                    addresses: n,
                    first_flight_time_us: o,
                }
            })
    }

    proptest! {
        #[test]
        fn round_trip(p in arb_params()) {
            let mut buf = Vec::new();
            p.encode(&mut buf);
            prop_assert_eq!(buf.len(), p.encoded_len());
            prop_assert_eq!(TransportParams::decode(&buf), Ok(p));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..80)) {
            crate::wire::fuzz::transport_params(&data);
        }
    }
}
