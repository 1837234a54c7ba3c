//! Transport error codes carried by `Close` frames (PROTOCOL.md §15).

use std::fmt;

/// A transport error code: the `error_code` of a transport `Close` frame (type 0x22).
///
/// A newtype rather than an enum because a peer may send codes this version does not know;
/// [`TransportErrorCode::name`] tells the known ones apart. The values follow QUIC's
/// (RFC 9000 §20.1) where the meaning is the same, with "stream" read as "flow".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransportErrorCode(u64);

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $value:expr, )*) => {
        impl TransportErrorCode {
            $( $(#[$doc])* pub const $name: TransportErrorCode = TransportErrorCode($value); )*

            /// Every code this version defines, in numeric order.
            pub const ALL: &'static [TransportErrorCode] = &[$(TransportErrorCode::$name),*];

            /// The code's name as written in PROTOCOL.md, if this version defines it.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some(stringify!($name)), )*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// The connection is being closed abruptly without an error.
    NO_ERROR = 0x0,
    /// The endpoint met an internal error and cannot continue.
    INTERNAL_ERROR = 0x1,
    /// The server refuses the connection (e.g. overload, policy).
    CONNECTION_REFUSED = 0x2,
    /// The peer sent more data than the advertised connection or flow credit (§10).
    FLOW_CONTROL_ERROR = 0x3,
    /// The peer opened more flows than `MaxFlows` allowed (§10).
    FLOW_LIMIT_ERROR = 0x4,
    /// A frame arrived for a flow in a state that does not allow it (e.g. data on a flow
    /// the receiver can only send on).
    FLOW_STATE_ERROR = 0x5,
    /// A flow's final size changed, or data arrived beyond it.
    FINAL_SIZE_ERROR = 0x6,
    /// A frame could not be decoded: unknown type, truncated, or a field breaks its rules.
    FRAME_ENCODING_ERROR = 0x7,
    /// Transport parameters could not be decoded, are duplicated, or hold invalid values (§8).
    TRANSPORT_PARAMETER_ERROR = 0x8,
    /// The peer supplied more connection IDs than allowed, or retired one it must not.
    CONNECTION_ID_LIMIT_ERROR = 0x9,
    /// The peer broke a protocol rule not covered by a more specific code.
    PROTOCOL_VIOLATION = 0xa,
    /// A Retry/Initial token was invalid or expired (§7.5).
    INVALID_TOKEN = 0xb,
    /// The Noise handshake or packet protection failed. The detail (snow's error) is never sent
    /// to the peer.
    CRYPTO_ERROR = 0xc,
    /// The handshake did not complete in time.
    HANDSHAKE_TIMEOUT = 0xd,
    /// The connection was idle for longer than the idle timeout. Local only: never sent on the
    /// wire, since an idle-timed-out connection closes silently (§14.2).
    IDLE_TIMEOUT = 0xe,
    /// A message (F5) or datagram (F6) exceeds the peer's advertised maximum.
    MESSAGE_TOO_LARGE = 0xf,
    /// A packet key reached an AEAD usage limit (§6.4): too many packets failed
    /// authentication, or one key sealed nearly its confidentiality limit and could not be
    /// updated. QUIC's AEAD_LIMIT_REACHED (0xf there; 0xf is taken here).
    AEAD_LIMIT_REACHED = 0x10,
}

impl TransportErrorCode {
    /// The numeric code carried on the wire.
    pub const fn code(self) -> u64 {
        self.0
    }

    /// The code for a wire value (known or not).
    pub const fn from_code(code: u64) -> Self {
        TransportErrorCode(code)
    }

    /// Whether this code may appear on the wire (every code but `IDLE_TIMEOUT`).
    pub const fn is_sent_on_wire(self) -> bool {
        self.0 != Self::IDLE_TIMEOUT.0
    }
}

impl From<TransportErrorCode> for u64 {
    fn from(c: TransportErrorCode) -> u64 {
        c.0
    }
}

impl From<u64> for TransportErrorCode {
    fn from(code: u64) -> Self {
        TransportErrorCode(code)
    }
}

impl fmt::Debug for TransportErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "TransportErrorCode({:#x})", self.0),
        }
    }
}

impl fmt::Display for TransportErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DecodeError;

    /// Every mapping in one table: name, wire value, sent on the wire (PROTOCOL.md §15).
    #[test]
    fn error_codes() {
        type C = TransportErrorCode;
        let table: &[(C, &str, u64, bool)] = &[
            (C::NO_ERROR, "NO_ERROR", 0x0, true),
            (C::INTERNAL_ERROR, "INTERNAL_ERROR", 0x1, true),
            (C::CONNECTION_REFUSED, "CONNECTION_REFUSED", 0x2, true),
            (C::FLOW_CONTROL_ERROR, "FLOW_CONTROL_ERROR", 0x3, true),
            (C::FLOW_LIMIT_ERROR, "FLOW_LIMIT_ERROR", 0x4, true),
            (C::FLOW_STATE_ERROR, "FLOW_STATE_ERROR", 0x5, true),
            (C::FINAL_SIZE_ERROR, "FINAL_SIZE_ERROR", 0x6, true),
            (C::FRAME_ENCODING_ERROR, "FRAME_ENCODING_ERROR", 0x7, true),
            (
                C::TRANSPORT_PARAMETER_ERROR,
                "TRANSPORT_PARAMETER_ERROR",
                0x8,
                true,
            ),
            (
                C::CONNECTION_ID_LIMIT_ERROR,
                "CONNECTION_ID_LIMIT_ERROR",
                0x9,
                true,
            ),
            (C::PROTOCOL_VIOLATION, "PROTOCOL_VIOLATION", 0xa, true),
            (C::INVALID_TOKEN, "INVALID_TOKEN", 0xb, true),
            (C::CRYPTO_ERROR, "CRYPTO_ERROR", 0xc, true),
            (C::HANDSHAKE_TIMEOUT, "HANDSHAKE_TIMEOUT", 0xd, true),
            (C::IDLE_TIMEOUT, "IDLE_TIMEOUT", 0xe, false),
            (C::MESSAGE_TOO_LARGE, "MESSAGE_TOO_LARGE", 0xf, true),
            (C::AEAD_LIMIT_REACHED, "AEAD_LIMIT_REACHED", 0x10, true),
        ];
        assert_eq!(table.len(), C::ALL.len());
        for (i, &(code, name, value, on_wire)) in table.iter().enumerate() {
            assert_eq!(C::ALL[i], code);
            assert_eq!(code.code(), value, "{name}");
            assert_eq!(u64::from(code), value);
            assert_eq!(C::from_code(value), code);
            assert_eq!(code.name(), Some(name));
            assert_eq!(format!("{code}"), name);
            assert_eq!(code.is_sent_on_wire(), on_wire, "{name}");
        }
        assert_eq!(C::from_code(0x11).name(), None);
        assert_eq!(
            format!("{:?}", C::from_code(0x11)),
            "TransportErrorCode(0x11)"
        );

        // Decode errors map to wire codes (DecodeError::code).
        let decode: &[(DecodeError, C)] = &[
            (DecodeError::UnexpectedEnd, C::FRAME_ENCODING_ERROR),
            (DecodeError::UnknownFrameType(0x99), C::FRAME_ENCODING_ERROR),
            (DecodeError::InvalidValue("x"), C::FRAME_ENCODING_ERROR),
            (DecodeError::TooLong, C::FRAME_ENCODING_ERROR),
            (DecodeError::UnsupportedVersion(7), C::PROTOCOL_VIOLATION),
            (
                DecodeError::DuplicateParameter(1),
                C::TRANSPORT_PARAMETER_ERROR,
            ),
        ];
        for &(err, code) in decode {
            assert_eq!(err.code(), code, "{err}");
        }
    }
}
