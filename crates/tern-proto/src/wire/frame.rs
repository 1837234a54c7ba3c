//! Frames (PROTOCOL.md §9): the contents of Initial/Handshake Noise payloads after decryption
//! and of short-header packet payloads.
//!
//! A payload is a sequence of frames, each starting with its type as a varint (minimal
//! encoding required). An unknown type is fatal ([`DecodeError::UnknownFrameType`]): frames
//! carry no length, so the rest of the payload cannot be skipped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use bytes::BufMut;

use super::{
    len_prefixed_len, varint_len, Ack, ConnectionId, DecodeError, Nack, Reader, ResetToken, VarInt,
    WriteExt, MAX_CID_LEN, MAX_FLOWS, MAX_GROUP_LEN, MAX_REASON_LEN, RESET_TOKEN_LEN,
};

const MAX: u64 = VarInt::MAX.into_inner();

/// Frame type values (§9).
pub mod frame_type {
    /// `Padding` (§9.1).
    pub const PADDING: u64 = 0x00;
    /// `Ping` (§9.2).
    pub const PING: u64 = 0x01;
    /// `Ack` (§9.3).
    pub const ACK: u64 = 0x02;
    /// `Nack` (§9.4).
    pub const NACK: u64 = 0x03;
    /// `AckRequest` (§9.5).
    pub const ACK_REQUEST: u64 = 0x04;
    /// `ResetFlow` (§9.6).
    pub const RESET_FLOW: u64 = 0x05;
    /// `StopSending` (§9.7).
    pub const STOP_SENDING: u64 = 0x06;
    /// `Flow`, lowest of 0x08..=0x0f (§9.8).
    pub const FLOW: u64 = 0x08;
    /// `Flow` type bit: offset field present.
    pub const FLOW_OFF_BIT: u64 = 0x04;
    /// `Flow` type bit: length field present.
    pub const FLOW_LEN_BIT: u64 = 0x02;
    /// `Flow` type bit: final data of the flow.
    pub const FLOW_FIN_BIT: u64 = 0x01;
    /// `MaxData` (§9.9).
    pub const MAX_DATA: u64 = 0x10;
    /// `MaxFlowData` (§9.10).
    pub const MAX_FLOW_DATA: u64 = 0x11;
    /// `MaxFlows` for bidirectional flows (§9.11).
    pub const MAX_FLOWS_BIDI: u64 = 0x12;
    /// `MaxFlows` for unidirectional flows (§9.11).
    pub const MAX_FLOWS_UNI: u64 = 0x13;
    /// `DataBlocked` (§9.12).
    pub const DATA_BLOCKED: u64 = 0x14;
    /// `FlowDataBlocked` (§9.13).
    pub const FLOW_DATA_BLOCKED: u64 = 0x15;
    /// `WindowClose` (§9.14).
    pub const WINDOW_CLOSE: u64 = 0x16;
    /// `WindowOpen` (§9.15).
    pub const WINDOW_OPEN: u64 = 0x17;
    /// `WindowStatus` (§9.16).
    pub const WINDOW_STATUS: u64 = 0x18;
    /// `Message` (§9.17).
    pub const MESSAGE: u64 = 0x19;
    /// `MessageSkip` (§9.18).
    pub const MESSAGE_SKIP: u64 = 0x1a;
    /// `Datagram` (§9.19).
    pub const DATAGRAM: u64 = 0x1b;
    /// `PathChallenge` (§9.20).
    pub const PATH_CHALLENGE: u64 = 0x1c;
    /// `PathResponse` (§9.20).
    pub const PATH_RESPONSE: u64 = 0x1d;
    /// `AddAddress` (§9.21).
    pub const ADD_ADDRESS: u64 = 0x1e;
    /// `RemoveAddress` (§9.21).
    pub const REMOVE_ADDRESS: u64 = 0x1f;
    /// `NewConnectionId` (§9.22).
    pub const NEW_CONNECTION_ID: u64 = 0x20;
    /// `RetireConnectionId` (§9.23).
    pub const RETIRE_CONNECTION_ID: u64 = 0x21;
    /// `Close`, transport (§9.24).
    pub const CLOSE: u64 = 0x22;
    /// `Close`, application (§9.24).
    pub const CLOSE_APPLICATION: u64 = 0x23;
    /// `HandshakeDone` (§9.25).
    pub const HANDSHAKE_DONE: u64 = 0x24;
    /// `Probe` (§9.26).
    pub const PROBE: u64 = 0x25;
    /// `RateEcho` (§9.27).
    pub const RATE_ECHO: u64 = 0x26;
    /// `Join` (§9.28).
    pub const JOIN: u64 = 0x27;
    /// `Leave` (§9.28).
    pub const LEAVE: u64 = 0x28;
    /// `AckFrequency` (§9.29).
    pub const ACK_FREQUENCY: u64 = 0x29;
    /// `Ack` with ECN counts (§9.3).
    pub const ACK_ECN: u64 = 0x2a;
    /// `PathStatus` (§9.30).
    pub const PATH_STATUS: u64 = 0x2b;
    /// `ProbeReport` (§9.31).
    pub const PROBE_REPORT: u64 = 0x2c;
}

use frame_type as ty;

/// A `Flow` frame (types 0x08..=0x0f, §9.8): bytes of an ordered flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowFrame<'a> {
    /// Flow ID (§10.1).
    pub flow_id: u64,
    /// Offset of `data` in the flow.
    pub offset: u64,
    /// Whether `data` ends the flow (its final size is `offset + data.len()`).
    pub fin: bool,
    /// The bytes.
    pub data: &'a [u8],
}

impl<'a> FlowFrame<'a> {
    fn decode_body(r: &mut Reader<'a>, ty: u64) -> Result<Self, DecodeError> {
        let flow_id = r.varint()?;
        let offset = if ty & ty::FLOW_OFF_BIT != 0 {
            r.varint()?
        } else {
            0
        };
        let data = if ty & ty::FLOW_LEN_BIT != 0 {
            let len = r.varint()?;
            let len = usize::try_from(len).map_err(|_| DecodeError::UnexpectedEnd)?;
            r.bytes(len)?
        } else {
            r.take_rest()
        };
        // §9.8: the end of the data must be a valid varint.
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > MAX)
        {
            return Err(DecodeError::InvalidValue("flow offset"));
        }
        Ok(FlowFrame {
            flow_id,
            offset,
            fin: ty & ty::FLOW_FIN_BIT != 0,
            data,
        })
    }

    /// Offset just past `data`.
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    /// Bytes of a `Flow` frame other than its data.
    pub fn overhead(flow_id: u64, offset: u64, data_len: usize, with_len: bool) -> usize {
        1 + varint_len(flow_id)
            + if offset != 0 { varint_len(offset) } else { 0 }
            + if with_len {
                varint_len(data_len as u64)
            } else {
                0
            }
    }

    /// The most data bytes a `Flow` frame for `flow_id` at `offset` can carry in `budget`
    /// bytes; `None` if not even an empty frame fits. Without the length field the frame must
    /// be the last in its packet.
    pub fn max_data_len(flow_id: u64, offset: u64, budget: usize, with_len: bool) -> Option<usize> {
        let avail = budget.checked_sub(Self::overhead(flow_id, offset, 0, false))?;
        let n = if with_len {
            // Largest n with varint_len(n) + n <= avail.
            [1, 2, 4, 8]
                .into_iter()
                .filter_map(|l| avail.checked_sub(l))
                .filter(|n| varint_len(*n as u64) <= avail - n)
                .max()?
        } else {
            avail
        };
        let room = MAX.saturating_sub(offset);
        Some(n.min(usize::try_from(room).unwrap_or(usize::MAX)))
    }

    /// Encoded length with the length field.
    pub fn encoded_len(&self) -> usize {
        self.encoded_len_with(true)
    }

    /// Encoded length, with or without the length field.
    pub fn encoded_len_with(&self, with_len: bool) -> usize {
        Self::overhead(self.flow_id, self.offset, self.data.len(), with_len) + self.data.len()
    }

    /// Writes the frame with the length field.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        self.encode_with(true, buf);
    }

    /// Writes the frame; without the length field (`with_len == false`) the data extends to
    /// the end of the packet, so the frame must be the packet's last.
    pub fn encode_with<B: BufMut + ?Sized>(&self, with_len: bool, buf: &mut B) {
        let mut t = ty::FLOW;
        if self.offset != 0 {
            t |= ty::FLOW_OFF_BIT;
        }
        if with_len {
            t |= ty::FLOW_LEN_BIT;
        }
        if self.fin {
            t |= ty::FLOW_FIN_BIT;
        }
        buf.put_varint(t);
        buf.put_varint(self.flow_id);
        if self.offset != 0 {
            buf.put_varint(self.offset);
        }
        if with_len {
            buf.put_varint(self.data.len() as u64);
        }
        buf.put_slice(self.data);
    }
}

/// `Message` frame flag: deliver in order with the flow's other ordered messages.
const MSG_ORDERED: u8 = 0x01;
/// `Message` frame flag: deadline field present.
const MSG_DEADLINE: u8 = 0x02;
/// `Message` frame flag: this fragment ends the message.
const MSG_LAST: u8 = 0x04;
/// Message flag: the message answers an earlier one (a Reply To field follows the deadline).
const MSG_REPLY: u8 = 0x08;

/// A `Message` frame (0x19, §9.17): one fragment of a framed message (F5, codec only for now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageFrame<'a> {
    /// Message ID, unique per connection and direction.
    pub msg_id: u64,
    /// Ordered delivery (flag 0x01).
    pub ordered: bool,
    /// Priority: higher leaves first.
    pub priority: u8,
    /// Length of the whole message.
    pub total_len: u64,
    /// Offset of this fragment in the message.
    pub offset: u64,
    /// Time left until the message's deadline when this fragment was sent, µs (flag 0x02).
    pub deadline_us: Option<u64>,
    /// The ID of the message this one answers (flag 0x08): request/response without a flow.
    pub reply_to: Option<u64>,
    /// Fragment bytes.
    pub data: &'a [u8],
}

impl<'a> MessageFrame<'a> {
    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let msg_id = r.varint()?;
        let flags = r.u8()?;
        if flags & !(MSG_ORDERED | MSG_DEADLINE | MSG_LAST | MSG_REPLY) != 0 {
            return Err(DecodeError::InvalidValue("message flags"));
        }
        let priority = r.u8()?;
        let total_len = r.varint()?;
        let offset = r.varint()?;
        let deadline_us = if flags & MSG_DEADLINE != 0 {
            Some(r.varint()?)
        } else {
            None
        };
        let reply_to = if flags & MSG_REPLY != 0 {
            Some(r.varint()?)
        } else {
            None
        };
        let data = r.len_prefixed(usize::MAX)?;
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|end| end > total_len) {
            return Err(DecodeError::InvalidValue("message offset"));
        }
        if (flags & MSG_LAST != 0) != (end == Some(total_len)) {
            return Err(DecodeError::InvalidValue("message last flag"));
        }
        Ok(MessageFrame {
            msg_id,
            ordered: flags & MSG_ORDERED != 0,
            priority,
            total_len,
            offset,
            deadline_us,
            reply_to,
            data,
        })
    }

    /// Whether this fragment ends the message (flag 0x04, derived from the lengths).
    pub fn is_last(&self) -> bool {
        self.offset.saturating_add(self.data.len() as u64) == self.total_len
    }

    fn flags(&self) -> u8 {
        let mut f = 0;
        if self.ordered {
            f |= MSG_ORDERED;
        }
        if self.deadline_us.is_some() {
            f |= MSG_DEADLINE;
        }
        if self.is_last() {
            f |= MSG_LAST;
        }
        if self.reply_to.is_some() {
            f |= MSG_REPLY;
        }
        f
    }

    fn overhead(&self, data_len: usize) -> usize {
        1 + varint_len(self.msg_id)
            + 2
            + varint_len(self.total_len)
            + varint_len(self.offset)
            + self.deadline_us.map_or(0, varint_len)
            + self.reply_to.map_or(0, varint_len)
            + varint_len(data_len as u64)
    }

    /// The most data bytes a fragment with this frame's other fields can carry in `budget`
    /// bytes (also capped by `total_len − offset`); `None` if not even an empty one fits.
    pub fn max_data_len(&self, budget: usize) -> Option<usize> {
        let avail = budget.checked_sub(self.overhead(0) - 1)?;
        let n = [1, 2, 4, 8]
            .into_iter()
            .filter_map(|l| avail.checked_sub(l))
            .filter(|n| varint_len(*n as u64) <= avail - n)
            .max()?;
        let room = self.total_len.saturating_sub(self.offset);
        Some(n.min(usize::try_from(room).unwrap_or(usize::MAX)))
    }

    /// Encoded length, type included.
    pub fn encoded_len(&self) -> usize {
        self.overhead(self.data.len()) + self.data.len()
    }

    /// Writes the frame (type included).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        debug_assert!(
            self.offset.saturating_add(self.data.len() as u64) <= self.total_len,
            "message fragment beyond total_len"
        );
        buf.put_varint(ty::MESSAGE);
        buf.put_varint(self.msg_id);
        buf.put_u8(self.flags());
        buf.put_u8(self.priority);
        buf.put_varint(self.total_len);
        buf.put_varint(self.offset);
        if let Some(d) = self.deadline_us {
            buf.put_varint(d);
        }
        if let Some(r) = self.reply_to {
            buf.put_varint(r);
        }
        buf.put_len_prefixed(self.data);
    }
}

/// A frame (§9). Frames are views into the packet payload; nothing is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame<'a> {
    /// 0x00: `len` zero bytes (a run of zeros decodes as one frame).
    Padding {
        /// Number of zero bytes (≥ 1 when decoded).
        len: usize,
    },
    /// 0x01: elicits an ACK.
    Ping,
    /// 0x02: acknowledged ranges of one path; 0x2a (ACK_ECN): the same with ECN counts.
    Ack(Ack<'a>),
    /// 0x03: missing packets of one path.
    Nack(Nack<'a>),
    /// 0x04: asks for an immediate ACK.
    AckRequest,
    /// 0x05: the sender abandons a flow.
    ResetFlow {
        /// Flow ID.
        flow_id: u64,
        /// Application error code.
        error_code: u64,
        /// Final size of the flow.
        final_size: u64,
    },
    /// 0x06: the receiver asks the sender to stop a flow.
    StopSending {
        /// Flow ID.
        flow_id: u64,
        /// Application error code.
        error_code: u64,
    },
    /// 0x08..=0x0f: flow data.
    Flow(FlowFrame<'a>),
    /// 0x10: connection credit.
    MaxData {
        /// Maximum total bytes the peer may send on all flows.
        max: u64,
    },
    /// 0x11: flow credit.
    MaxFlowData {
        /// Flow ID.
        flow_id: u64,
        /// Maximum offset the peer may send on this flow.
        max: u64,
    },
    /// 0x12 (bidi) / 0x13 (uni): flow-count credit.
    MaxFlows {
        /// Bidirectional (0x12) or unidirectional (0x13).
        bidi: bool,
        /// Cumulative number of flows of that kind the peer may open (≤ 2^60).
        max: u64,
    },
    /// 0x14: the sender is blocked by connection credit.
    DataBlocked {
        /// The connection limit it is blocked at.
        limit: u64,
    },
    /// 0x15: the sender is blocked by flow credit.
    FlowDataBlocked {
        /// Flow ID.
        flow_id: u64,
        /// The flow limit it is blocked at.
        limit: u64,
    },
    /// 0x16: the application closed its receive window (F7).
    WindowClose {
        /// Application-defined reason code.
        reason_code: u64,
        /// Reason phrase (≤ 1024 bytes).
        reason: &'a [u8],
    },
    /// 0x17: the application reopened its receive window (F7).
    WindowOpen,
    /// 0x18: the sender polls a closed window (F7).
    WindowStatus,
    /// 0x19: a message fragment (F5).
    Message(MessageFrame<'a>),
    /// 0x1a: the sender abandoned a message after its deadline (F5).
    MessageSkip {
        /// Abandoned message.
        msg_id: u64,
        /// Connection credit the sender counted for it (its whole size if it was started, 0
        /// if not), so that both ends account the same bytes even if none arrived.
        credit: u64,
    },
    /// 0x1b: an unreliable datagram (F6).
    Datagram {
        /// Datagram bytes.
        data: &'a [u8],
    },
    /// 0x1c: path validation challenge.
    PathChallenge {
        /// Unpredictable bytes to echo.
        data: [u8; 8],
    },
    /// 0x1d: path validation response.
    PathResponse {
        /// The challenge's bytes.
        data: [u8; 8],
    },
    /// 0x1e: advertises an address of the sender (F15/F17, codec only).
    AddAddress {
        /// Sequence number of the address.
        seq: u64,
        /// The address (IPv6 flow info and scope are not carried).
        addr: SocketAddr,
    },
    /// 0x1f: withdraws an advertised address (F15/F17, codec only).
    RemoveAddress {
        /// Sequence number of the address.
        seq: u64,
    },
    /// 0x20: a new connection ID for the peer to use.
    NewConnectionId {
        /// Sequence number of the ID.
        seq: u64,
        /// IDs with lower sequence numbers must be retired (≤ `seq`).
        retire_prior_to: u64,
        /// The ID (1..=20 bytes).
        cid: ConnectionId,
        /// Stateless reset token bound to the ID.
        reset_token: ResetToken,
    },
    /// 0x21: the sender will no longer use a connection ID.
    RetireConnectionId {
        /// Sequence number of the retired ID.
        seq: u64,
    },
    /// 0x22 (transport) / 0x23 (application): closes the connection.
    Close {
        /// Application close (0x23) or transport close (0x22).
        application: bool,
        /// Transport ([`TransportErrorCode`](super::TransportErrorCode)) or application code.
        error_code: u64,
        /// Transport close only: type of the frame that caused the error (`None`: unknown,
        /// sent as 0).
        frame_type: Option<u64>,
        /// Reason phrase (≤ 1024 bytes).
        reason: &'a [u8],
    },
    /// 0x24: the server confirms the handshake.
    HandshakeDone,
    /// 0x25: marks its packet as one of a probe train (packet-pair fast start, F11).
    Probe {
        /// Train number, increasing per path from 1.
        train: u64,
        /// Position of the packet in the train, 1..=`count`.
        index: u8,
        /// Packets in the train, 2..=[`MAX_PROBE_TRAIN`].
        count: u8,
    },
    /// 0x26: the receiver echoes a path's feedback rate (F12, codec only).
    RateEcho {
        /// Path the rate was measured on.
        path_id: u32,
        /// Minimum feedback rate seen recently, kbit/s.
        feedback_kbps: u32,
    },
    /// 0x27: join a multicast group (F18, codec only).
    Join {
        /// Group name (1..=255 bytes).
        group: &'a [u8],
    },
    /// 0x28: leave a multicast group (F18, codec only).
    Leave {
        /// Group name (1..=255 bytes).
        group: &'a [u8],
    },
    /// 0x29: the sender of a path's packets asks the receiver to acknowledge every
    /// `threshold` ack-eliciting packets instead of every 2 (§11.1).
    AckFrequency {
        /// Path whose packets this is about.
        path_id: u32,
        /// Increases with each new request; older ones are ignored.
        sequence: u64,
        /// Ack-eliciting packets per Ack, 1..=[`MAX_ACK_THRESHOLD`].
        threshold: u32,
    },
    /// 0x2b: the sender's wish for a path (§9.30): carry data, keep it in reserve, or drop it.
    PathStatus {
        /// The path this is about.
        path_id: u32,
        /// Increases with each new status of the path; older ones are ignored.
        sequence: u64,
        /// What the path is to be used for.
        status: PathStatusCode,
    },
    /// 0x2c: the receiver's measurement of a probe train (F11): the bottleneck rate seen in
    /// the spacing of its packets.
    ProbeReport {
        /// Path the train was sent on.
        path_id: u32,
        /// The train's number (its `Probe` frames' `train`).
        train: u64,
        /// Train packets received.
        received: u8,
        /// Estimated bottleneck rate in bytes per second; 0 = no estimate.
        rate: u64,
    },
}

/// The `Status` field of `PathStatus` (§9.30).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathStatusCode {
    /// 1: the path carries data.
    Active,
    /// 2: the path is used only while no active path works (handover, a metered link).
    Standby,
    /// 3: the sender stopped using the path for good (its address went away).
    Abandoned,
}

impl PathStatusCode {
    /// The wire value.
    pub fn to_wire(self) -> u64 {
        match self {
            PathStatusCode::Active => 1,
            PathStatusCode::Standby => 2,
            PathStatusCode::Abandoned => 3,
        }
    }

    /// The code of a wire value, if it is one.
    pub fn from_wire(v: u64) -> Option<Self> {
        match v {
            1 => Some(PathStatusCode::Active),
            2 => Some(PathStatusCode::Standby),
            3 => Some(PathStatusCode::Abandoned),
            _ => None,
        }
    }
}

/// Largest `AckFrequency` threshold (§9.29): beyond it the sender would lose its ACK clock.
pub const MAX_ACK_THRESHOLD: u32 = 64;

/// Most packets in a probe train (§9.26): bounds what a receiver records per train.
pub const MAX_PROBE_TRAIN: u8 = 64;

fn decode_group<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    let group = r.len_prefixed(MAX_GROUP_LEN)?;
    if group.is_empty() {
        return Err(DecodeError::InvalidValue("group"));
    }
    Ok(group)
}

/// Reads an address: family byte (4 or 6), IP bytes, port (§9.21, §8).
pub(crate) fn decode_addr(r: &mut Reader<'_>) -> Result<SocketAddr, DecodeError> {
    match r.u8()? {
        4 => {
            let ip = Ipv4Addr::from(r.array::<4>()?);
            Ok(SocketAddr::new(IpAddr::V4(ip), r.u16()?))
        }
        6 => {
            let ip = Ipv6Addr::from(r.array::<16>()?);
            Ok(SocketAddr::V6(SocketAddrV6::new(ip, r.u16()?, 0, 0)))
        }
        _ => Err(DecodeError::InvalidValue("address family")),
    }
}

/// Encoded length of an address.
pub(crate) fn addr_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2,
    }
}

/// Writes an address (IPv6 flow info and scope ID are dropped).
pub(crate) fn encode_addr<B: BufMut + ?Sized>(addr: &SocketAddr, buf: &mut B) {
    match addr {
        SocketAddr::V4(a) => {
            buf.put_u8(4);
            buf.put_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            buf.put_u8(6);
            buf.put_slice(&a.ip().octets());
        }
    }
    buf.put_u16(addr.port());
}

fn capped(bytes: &[u8], max: usize) -> &[u8] {
    debug_assert!(bytes.len() <= max, "field longer than {max} bytes");
    &bytes[..bytes.len().min(max)]
}

impl<'a> Frame<'a> {
    /// Decodes one frame. On error the reader's position is unspecified; the payload must be
    /// discarded (and the connection closed with [`DecodeError::code`]).
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let type_start = r.position();
        let t = r.varint()?;
        // RFC 9000 §12.4: frame types use the shortest encoding.
        if r.position() - type_start != varint_len(t) {
            return Err(DecodeError::InvalidValue("frame type encoding"));
        }
        let frame = match t {
            ty::PADDING => {
                let zeros = r.rest().iter().take_while(|b| **b == 0).count();
                r.skip(zeros)?;
                Frame::Padding { len: 1 + zeros }
            }
            ty::PING => Frame::Ping,
            ty::ACK => Frame::Ack(Ack::decode_body(r, false)?),
            ty::ACK_ECN => Frame::Ack(Ack::decode_body(r, true)?),
            ty::NACK => Frame::Nack(Nack::decode_body(r)?),
            ty::ACK_REQUEST => Frame::AckRequest,
            ty::RESET_FLOW => Frame::ResetFlow {
                flow_id: r.varint()?,
                error_code: r.varint()?,
                final_size: r.varint()?,
            },
            ty::STOP_SENDING => Frame::StopSending {
                flow_id: r.varint()?,
                error_code: r.varint()?,
            },
            0x08..=0x0f => Frame::Flow(FlowFrame::decode_body(r, t)?),
            ty::MAX_DATA => Frame::MaxData { max: r.varint()? },
            ty::MAX_FLOW_DATA => Frame::MaxFlowData {
                flow_id: r.varint()?,
                max: r.varint()?,
            },
            ty::MAX_FLOWS_BIDI | ty::MAX_FLOWS_UNI => {
                let max = r.varint()?;
                if max > MAX_FLOWS {
                    return Err(DecodeError::InvalidValue("max flows"));
                }
                Frame::MaxFlows {
                    bidi: t == ty::MAX_FLOWS_BIDI,
                    max,
                }
            }
            ty::DATA_BLOCKED => Frame::DataBlocked { limit: r.varint()? },
            ty::FLOW_DATA_BLOCKED => Frame::FlowDataBlocked {
                flow_id: r.varint()?,
                limit: r.varint()?,
            },
            ty::WINDOW_CLOSE => Frame::WindowClose {
                reason_code: r.varint()?,
                reason: r.len_prefixed(MAX_REASON_LEN)?,
            },
            ty::WINDOW_OPEN => Frame::WindowOpen,
            ty::WINDOW_STATUS => Frame::WindowStatus,
            ty::MESSAGE => Frame::Message(MessageFrame::decode_body(r)?),
            ty::MESSAGE_SKIP => Frame::MessageSkip {
                msg_id: r.varint()?,
                credit: r.varint()?,
            },
            ty::DATAGRAM => Frame::Datagram {
                data: r.len_prefixed(usize::MAX)?,
            },
            ty::PATH_CHALLENGE => Frame::PathChallenge { data: r.array()? },
            ty::PATH_RESPONSE => Frame::PathResponse { data: r.array()? },
            ty::ADD_ADDRESS => Frame::AddAddress {
                seq: r.varint()?,
                addr: decode_addr(r)?,
            },
            ty::REMOVE_ADDRESS => Frame::RemoveAddress { seq: r.varint()? },
            ty::NEW_CONNECTION_ID => {
                let seq = r.varint()?;
                let retire_prior_to = r.varint()?;
                if retire_prior_to > seq {
                    return Err(DecodeError::InvalidValue("retire prior to"));
                }
                let cid = ConnectionId::decode_len_prefixed(r)?;
                if cid.is_empty() {
                    return Err(DecodeError::InvalidValue("connection id length"));
                }
                Frame::NewConnectionId {
                    seq,
                    retire_prior_to,
                    cid,
                    reset_token: r.array()?,
                }
            }
            ty::RETIRE_CONNECTION_ID => Frame::RetireConnectionId { seq: r.varint()? },
            ty::CLOSE | ty::CLOSE_APPLICATION => {
                let application = t == ty::CLOSE_APPLICATION;
                let error_code = r.varint()?;
                let frame_type = if application {
                    None
                } else {
                    Some(r.varint()?).filter(|t| *t != 0)
                };
                Frame::Close {
                    application,
                    error_code,
                    frame_type,
                    reason: r.len_prefixed(MAX_REASON_LEN)?,
                }
            }
            ty::HANDSHAKE_DONE => Frame::HandshakeDone,
            ty::PROBE => {
                let train = r.varint()?;
                let index = r.u8()?;
                let count = r.u8()?;
                if !(2..=MAX_PROBE_TRAIN).contains(&count) {
                    return Err(DecodeError::InvalidValue("probe count"));
                }
                if !(1..=count).contains(&index) {
                    return Err(DecodeError::InvalidValue("probe index"));
                }
                Frame::Probe {
                    train,
                    index,
                    count,
                }
            }
            ty::RATE_ECHO => Frame::RateEcho {
                path_id: r.varint_u32("path id")?,
                feedback_kbps: r.u32()?,
            },
            ty::JOIN => Frame::Join {
                group: decode_group(r)?,
            },
            ty::LEAVE => Frame::Leave {
                group: decode_group(r)?,
            },
            ty::ACK_FREQUENCY => {
                let path_id = r.varint_u32("path id")?;
                let sequence = r.varint()?;
                let threshold = r.varint()?;
                if !(1..=u64::from(MAX_ACK_THRESHOLD)).contains(&threshold) {
                    return Err(DecodeError::InvalidValue("ack threshold"));
                }
                Frame::AckFrequency {
                    path_id,
                    sequence,
                    threshold: threshold as u32,
                }
            }
            ty::PATH_STATUS => {
                let path_id = r.varint_u32("path id")?;
                let sequence = r.varint()?;
                let status = PathStatusCode::from_wire(r.varint()?)
                    .ok_or(DecodeError::InvalidValue("path status"))?;
                Frame::PathStatus {
                    path_id,
                    sequence,
                    status,
                }
            }
            ty::PROBE_REPORT => {
                let path_id = r.varint_u32("path id")?;
                let train = r.varint()?;
                let received = r.u8()?;
                if received > MAX_PROBE_TRAIN {
                    return Err(DecodeError::InvalidValue("probe received"));
                }
                Frame::ProbeReport {
                    path_id,
                    train,
                    received,
                    rate: r.varint()?,
                }
            }
            other => return Err(DecodeError::UnknownFrameType(other)),
        };
        Ok(frame)
    }

    /// The wire type of this frame (for `Flow`, the type [`Frame::encode`] writes).
    pub fn frame_type(&self) -> u64 {
        match self {
            Frame::Padding { .. } => ty::PADDING,
            Frame::Ping => ty::PING,
            Frame::Ack(a) => a.frame_type(),
            Frame::Nack(_) => ty::NACK,
            Frame::AckRequest => ty::ACK_REQUEST,
            Frame::ResetFlow { .. } => ty::RESET_FLOW,
            Frame::StopSending { .. } => ty::STOP_SENDING,
            Frame::Flow(f) => {
                ty::FLOW
                    | ty::FLOW_LEN_BIT
                    | if f.offset != 0 { ty::FLOW_OFF_BIT } else { 0 }
                    | if f.fin { ty::FLOW_FIN_BIT } else { 0 }
            }
            Frame::MaxData { .. } => ty::MAX_DATA,
            Frame::MaxFlowData { .. } => ty::MAX_FLOW_DATA,
            Frame::MaxFlows { bidi: true, .. } => ty::MAX_FLOWS_BIDI,
            Frame::MaxFlows { bidi: false, .. } => ty::MAX_FLOWS_UNI,
            Frame::DataBlocked { .. } => ty::DATA_BLOCKED,
            Frame::FlowDataBlocked { .. } => ty::FLOW_DATA_BLOCKED,
            Frame::WindowClose { .. } => ty::WINDOW_CLOSE,
            Frame::WindowOpen => ty::WINDOW_OPEN,
            Frame::WindowStatus => ty::WINDOW_STATUS,
            Frame::Message(_) => ty::MESSAGE,
            Frame::MessageSkip { .. } => ty::MESSAGE_SKIP,
            Frame::Datagram { .. } => ty::DATAGRAM,
            Frame::PathChallenge { .. } => ty::PATH_CHALLENGE,
            Frame::PathResponse { .. } => ty::PATH_RESPONSE,
            Frame::AddAddress { .. } => ty::ADD_ADDRESS,
            Frame::RemoveAddress { .. } => ty::REMOVE_ADDRESS,
            Frame::NewConnectionId { .. } => ty::NEW_CONNECTION_ID,
            Frame::RetireConnectionId { .. } => ty::RETIRE_CONNECTION_ID,
            Frame::Close {
                application: false, ..
            } => ty::CLOSE,
            Frame::Close {
                application: true, ..
            } => ty::CLOSE_APPLICATION,
            Frame::HandshakeDone => ty::HANDSHAKE_DONE,
            Frame::Probe { .. } => ty::PROBE,
            Frame::RateEcho { .. } => ty::RATE_ECHO,
            Frame::Join { .. } => ty::JOIN,
            Frame::Leave { .. } => ty::LEAVE,
            Frame::AckFrequency { .. } => ty::ACK_FREQUENCY,
            Frame::PathStatus { .. } => ty::PATH_STATUS,
            Frame::ProbeReport { .. } => ty::PROBE_REPORT,
        }
    }

    /// Whether receiving this frame obliges the receiver to send an ACK (§11.1): every frame
    /// but `Padding`, `Ack`, `Nack`, `Close` and `RateEcho`.
    pub fn is_ack_eliciting(&self) -> bool {
        !matches!(
            self,
            Frame::Padding { .. }
                | Frame::Ack(_)
                | Frame::Nack(_)
                | Frame::Close { .. }
                | Frame::RateEcho { .. }
        )
    }

    /// Whether this frame may be sent on a path that is still being validated (§9.20):
    /// `PathChallenge`, `PathResponse`, `NewConnectionId`, `Padding` and `Probe`.
    pub fn is_path_probing(&self) -> bool {
        matches!(
            self,
            Frame::PathChallenge { .. }
                | Frame::PathResponse { .. }
                | Frame::NewConnectionId { .. }
                | Frame::Padding { .. }
                | Frame::Probe { .. }
        )
    }

    /// Encoded length in bytes (`Flow` frames with their length field).
    pub fn encoded_len(&self) -> usize {
        let vl = varint_len;
        // Every frame type of this version fits in one byte.
        1 + match self {
            Frame::Padding { len } => return *len,
            Frame::Ack(a) => return a.encoded_len(),
            Frame::Nack(n) => return n.encoded_len(),
            Frame::Flow(f) => return f.encoded_len(),
            Frame::Message(m) => return m.encoded_len(),
            Frame::Ping
            | Frame::AckRequest
            | Frame::WindowOpen
            | Frame::WindowStatus
            | Frame::HandshakeDone => 0,
            Frame::ResetFlow {
                flow_id,
                error_code,
                final_size,
            } => vl(*flow_id) + vl(*error_code) + vl(*final_size),
            Frame::StopSending {
                flow_id,
                error_code,
            } => vl(*flow_id) + vl(*error_code),
            Frame::MaxData { max } => vl(*max),
            Frame::MaxFlowData { flow_id, max } => vl(*flow_id) + vl(*max),
            Frame::MaxFlows { max, .. } => vl(*max),
            Frame::DataBlocked { limit } => vl(*limit),
            Frame::FlowDataBlocked { flow_id, limit } => vl(*flow_id) + vl(*limit),
            Frame::WindowClose {
                reason_code,
                reason,
            } => vl(*reason_code) + len_prefixed_len(reason.len().min(MAX_REASON_LEN)),
            Frame::MessageSkip { msg_id, credit } => vl(*msg_id) + vl(*credit),
            Frame::Datagram { data } => len_prefixed_len(data.len()),
            Frame::PathChallenge { .. } | Frame::PathResponse { .. } => 8,
            Frame::AddAddress { seq, addr } => vl(*seq) + addr_len(addr),
            Frame::RemoveAddress { seq } | Frame::RetireConnectionId { seq } => vl(*seq),
            Frame::NewConnectionId {
                seq,
                retire_prior_to,
                cid,
                ..
            } => vl(*seq) + vl(*retire_prior_to) + 1 + cid.len() + RESET_TOKEN_LEN,
            Frame::Close {
                application,
                error_code,
                frame_type,
                reason,
            } => {
                vl(*error_code)
                    + if *application {
                        0
                    } else {
                        vl(frame_type.unwrap_or(0))
                    }
                    + len_prefixed_len(reason.len().min(MAX_REASON_LEN))
            }
            Frame::Probe { train, .. } => vl(*train) + 2,
            Frame::RateEcho { path_id, .. } => vl(u64::from(*path_id)) + 4,
            Frame::Join { group } | Frame::Leave { group } => {
                len_prefixed_len(group.len().min(MAX_GROUP_LEN))
            }
            Frame::AckFrequency {
                path_id,
                sequence,
                threshold,
            } => vl(u64::from(*path_id)) + vl(*sequence) + vl(u64::from(*threshold)),
            Frame::PathStatus {
                path_id, sequence, ..
            } => vl(u64::from(*path_id)) + vl(*sequence) + 1,
            Frame::ProbeReport {
                path_id,
                train,
                rate,
                ..
            } => vl(u64::from(*path_id)) + vl(*train) + 1 + vl((*rate).min(MAX)),
        }
    }

    /// Writes the frame (`Flow` frames with their length field; use
    /// [`FlowFrame::encode_with`] to omit it in a packet's last frame).
    ///
    /// Fields the wire cannot carry are caller bugs, caught by `debug_assert!` and
    /// truncated/clamped in release builds: reasons over 1024 bytes, group names over 255.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        match self {
            Frame::Padding { len } => {
                buf.put_bytes(0, *len);
                return;
            }
            Frame::Ack(a) => return a.encode(buf),
            Frame::Nack(n) => return n.encode(buf),
            Frame::Flow(f) => return f.encode(buf),
            Frame::Message(m) => return m.encode(buf),
            _ => {}
        }
        buf.put_varint(self.frame_type());
        match self {
            Frame::Padding { .. }
            | Frame::Ack(_)
            | Frame::Nack(_)
            | Frame::Flow(_)
            | Frame::Message(_)
            | Frame::Ping
            | Frame::AckRequest
            | Frame::WindowOpen
            | Frame::WindowStatus
            | Frame::HandshakeDone => {}
            Frame::ResetFlow {
                flow_id,
                error_code,
                final_size,
            } => {
                buf.put_varint(*flow_id);
                buf.put_varint(*error_code);
                buf.put_varint(*final_size);
            }
            Frame::StopSending {
                flow_id,
                error_code,
            } => {
                buf.put_varint(*flow_id);
                buf.put_varint(*error_code);
            }
            Frame::MaxData { max } => buf.put_varint(*max),
            Frame::MaxFlowData { flow_id, max } => {
                buf.put_varint(*flow_id);
                buf.put_varint(*max);
            }
            Frame::MaxFlows { max, .. } => {
                debug_assert!(*max <= MAX_FLOWS, "max flows above 2^60");
                buf.put_varint(*max);
            }
            Frame::DataBlocked { limit } => buf.put_varint(*limit),
            Frame::FlowDataBlocked { flow_id, limit } => {
                buf.put_varint(*flow_id);
                buf.put_varint(*limit);
            }
            Frame::WindowClose {
                reason_code,
                reason,
            } => {
                buf.put_varint(*reason_code);
                buf.put_len_prefixed(capped(reason, MAX_REASON_LEN));
            }
            Frame::MessageSkip { msg_id, credit } => {
                buf.put_varint(*msg_id);
                buf.put_varint(*credit);
            }
            Frame::Datagram { data } => buf.put_len_prefixed(data),
            Frame::PathChallenge { data } | Frame::PathResponse { data } => buf.put_slice(data),
            Frame::AddAddress { seq, addr } => {
                buf.put_varint(*seq);
                encode_addr(addr, buf);
            }
            Frame::RemoveAddress { seq } | Frame::RetireConnectionId { seq } => {
                buf.put_varint(*seq)
            }
            Frame::NewConnectionId {
                seq,
                retire_prior_to,
                cid,
                reset_token,
            } => {
                debug_assert!(
                    (1..=MAX_CID_LEN).contains(&cid.len()),
                    "NewConnectionId needs a 1..=20 byte ID"
                );
                debug_assert!(retire_prior_to <= seq, "retire_prior_to above seq");
                buf.put_varint(*seq);
                buf.put_varint(*retire_prior_to);
                cid.encode_len_prefixed(buf);
                buf.put_slice(reset_token);
            }
            Frame::Close {
                application,
                error_code,
                frame_type,
                reason,
            } => {
                buf.put_varint(*error_code);
                if !*application {
                    buf.put_varint(frame_type.unwrap_or(0));
                }
                buf.put_len_prefixed(capped(reason, MAX_REASON_LEN));
            }
            Frame::Probe {
                train,
                index,
                count,
            } => {
                debug_assert!(
                    (2..=MAX_PROBE_TRAIN).contains(count) && (1..=*count).contains(index),
                    "probe index {index} of {count}"
                );
                buf.put_varint(*train);
                buf.put_u8(*index);
                buf.put_u8(*count);
            }
            Frame::RateEcho {
                path_id,
                feedback_kbps,
            } => {
                buf.put_varint(u64::from(*path_id));
                buf.put_u32(*feedback_kbps);
            }
            Frame::Join { group } | Frame::Leave { group } => {
                debug_assert!(!group.is_empty(), "empty group name");
                buf.put_len_prefixed(capped(group, MAX_GROUP_LEN));
            }
            Frame::AckFrequency {
                path_id,
                sequence,
                threshold,
            } => {
                debug_assert!((1..=MAX_ACK_THRESHOLD).contains(threshold), "ack threshold");
                buf.put_varint(u64::from(*path_id));
                buf.put_varint(*sequence);
                buf.put_varint(u64::from(*threshold));
            }
            Frame::PathStatus {
                path_id,
                sequence,
                status,
            } => {
                buf.put_varint(u64::from(*path_id));
                buf.put_varint(*sequence);
                buf.put_varint(status.to_wire());
            }
            Frame::ProbeReport {
                path_id,
                train,
                received,
                rate,
            } => {
                debug_assert!(*received <= MAX_PROBE_TRAIN, "probe received");
                buf.put_varint(u64::from(*path_id));
                buf.put_varint(*train);
                buf.put_u8((*received).min(MAX_PROBE_TRAIN));
                // Rates beyond 2^62 - 1 bytes/s are not physical: clamp.
                buf.put_varint((*rate).min(MAX));
            }
        }
    }
}

impl<'a> From<FlowFrame<'a>> for Frame<'a> {
    fn from(f: FlowFrame<'a>) -> Self {
        Frame::Flow(f)
    }
}

impl<'a> From<MessageFrame<'a>> for Frame<'a> {
    fn from(m: MessageFrame<'a>) -> Self {
        Frame::Message(m)
    }
}

impl<'a> From<Ack<'a>> for Frame<'a> {
    fn from(a: Ack<'a>) -> Self {
        Frame::Ack(a)
    }
}

impl<'a> From<Nack<'a>> for Frame<'a> {
    fn from(n: Nack<'a>) -> Self {
        Frame::Nack(n)
    }
}

/// Iterator over the frames of a decrypted payload.
///
/// Yields `Err` once and then stops at the first frame that fails to decode (frames have no
/// length, so nothing after it can be found).
#[derive(Debug, Clone)]
pub struct FrameIter<'a> {
    reader: Reader<'a>,
    failed: bool,
    current_type: Option<u64>,
}

impl<'a> FrameIter<'a> {
    /// Frames of `payload`.
    pub fn new(payload: &'a [u8]) -> Self {
        FrameIter {
            reader: Reader::new(payload),
            failed: false,
            current_type: None,
        }
    }

    /// The type of the frame last yielded, or of the one that failed (for a transport
    /// `Close`'s `frame_type`). `None` before the first frame or if the type itself was
    /// unreadable.
    pub fn current_frame_type(&self) -> Option<u64> {
        self.current_type
    }

    /// Bytes not yet decoded.
    pub fn remaining(&self) -> usize {
        self.reader.remaining()
    }
}

impl<'a> Iterator for FrameIter<'a> {
    type Item = Result<Frame<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.reader.is_empty() {
            return None;
        }
        self.current_type = self.reader.clone().varint().ok();
        let result = Frame::decode(&mut self.reader);
        if result.is_err() {
            self.failed = true;
        }
        Some(result)
    }
}

impl std::iter::FusedIterator for FrameIter<'_> {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::cid::tests::arb_cid;
    use crate::wire::{encode_ack, encode_nack};
    use proptest::prelude::*;
    use std::net::SocketAddrV4;

    fn decode_one(buf: &[u8]) -> Result<Frame<'_>, DecodeError> {
        let mut r = Reader::new(buf);
        let f = Frame::decode(&mut r)?;
        assert!(r.is_empty(), "trailing bytes after {f:?}");
        Ok(f)
    }

    fn encode(f: &Frame<'_>) -> Vec<u8> {
        let mut buf = Vec::new();
        f.encode(&mut buf);
        assert_eq!(buf.len(), f.encoded_len(), "{f:?}");
        buf
    }

    #[test]
    fn padding_collapses() {
        let payload = [0, 0, 0, 0x01, 0, 0];
        let frames: Vec<_> = FrameIter::new(&payload).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            frames,
            vec![
                Frame::Padding { len: 3 },
                Frame::Ping,
                Frame::Padding { len: 2 }
            ]
        );
        assert_eq!(encode(&frames[0]), [0, 0, 0]);
    }

    #[test]
    fn flow_frame_bits() {
        // OFF|LEN|FIN
        let buf = [0x0f, 4, 10, 3, b'a', b'b', b'c'];
        let f = decode_one(&buf).unwrap();
        let Frame::Flow(flow) = f else { panic!() };
        assert_eq!(
            flow,
            FlowFrame {
                flow_id: 4,
                offset: 10,
                fin: true,
                data: b"abc"
            }
        );
        assert_eq!(encode(&f), buf);
        // no OFF, no LEN: data to the end, offset 0
        let buf = [0x08, 4, b'x', b'y'];
        let Frame::Flow(flow) = decode_one(&buf).unwrap() else {
            panic!()
        };
        assert_eq!((flow.offset, flow.data, flow.fin), (0, &b"xy"[..], false));
        let mut again = Vec::new();
        flow.encode_with(false, &mut again);
        assert_eq!(again, buf);
        assert_eq!(flow.encoded_len_with(false), buf.len());
        // offset + len past 2^62 - 1
        let mut buf = vec![0x0e, 0];
        buf.put_varint(MAX);
        buf.extend_from_slice(&[1, 0]);
        assert_eq!(
            decode_one(&buf),
            Err(DecodeError::InvalidValue("flow offset"))
        );
        // length beyond the payload
        assert_eq!(
            decode_one(&[0x0a, 0, 5, 1]),
            Err(DecodeError::UnexpectedEnd)
        );
    }

    #[test]
    fn flow_max_data_len_fits_exactly() {
        for budget in 0..200usize {
            for (id, off) in [(0, 0), (1 << 20, 0), (3, 1 << 40)] {
                for with_len in [true, false] {
                    match FlowFrame::max_data_len(id, off, budget, with_len) {
                        None => assert!(FlowFrame::overhead(id, off, 0, with_len) > budget),
                        Some(n) => {
                            let total = FlowFrame::overhead(id, off, n, with_len) + n;
                            assert!(total <= budget, "{budget} {n}");
                            // one more byte would not fit
                            let more = FlowFrame::overhead(id, off, n + 1, with_len) + n + 1;
                            assert!(more > budget);
                        }
                    }
                }
            }
        }
        assert_eq!(FlowFrame::max_data_len(0, MAX - 3, 100, false), Some(3));
    }

    #[test]
    fn message_rules() {
        let m = MessageFrame {
            msg_id: 7,
            ordered: true,
            priority: 3,
            total_len: 10,
            offset: 6,
            deadline_us: Some(5000),
            reply_to: Some(3),
            data: b"wxyz",
        };
        assert!(m.is_last());
        let buf = encode(&m.into());
        assert_eq!(buf[2], 0x01 | 0x02 | 0x04 | 0x08, "flags");
        assert_eq!(decode_one(&buf), Ok(Frame::Message(m)));
        // last flag inconsistent with lengths
        let mut bad = buf.clone();
        bad[2] = 0x0b;
        assert_eq!(
            decode_one(&bad),
            Err(DecodeError::InvalidValue("message last flag"))
        );
        let mut bad = buf.clone();
        bad[2] |= 0x80;
        assert_eq!(
            decode_one(&bad),
            Err(DecodeError::InvalidValue("message flags"))
        );
        let long = MessageFrame { total_len: 9, ..m };
        let mut buf = Vec::new();
        // bypass the encoder's debug assertion by writing the fields by hand
        buf.put_varint(ty::MESSAGE);
        buf.put_varint(long.msg_id);
        buf.extend_from_slice(&[0x03, 3, 9, 6]);
        buf.put_varint(5000);
        buf.put_len_prefixed(b"wxyz");
        assert_eq!(
            decode_one(&buf),
            Err(DecodeError::InvalidValue("message offset"))
        );
        // planning
        let template = MessageFrame {
            data: &[],
            total_len: 1 << 20,
            offset: 0,
            ..m
        };
        for budget in 0..100 {
            if let Some(n) = template.max_data_len(budget) {
                let data = vec![0; n];
                let f = MessageFrame {
                    data: &data,
                    ..template
                };
                assert!(f.encoded_len() <= budget);
            }
        }
        assert_eq!(m.max_data_len(1000), Some(4));
    }

    #[test]
    fn field_rules() {
        let cases: &[(&[u8], DecodeError)] = &[
            (&[0x07], DecodeError::UnknownFrameType(0x07)),
            (&[0x2d], DecodeError::UnknownFrameType(0x2d)),
            (
                &[0x2c, 0, 1, 65, 0],
                DecodeError::InvalidValue("probe received"),
            ),
            (&[0x2c, 0, 1, 3], DecodeError::UnexpectedEnd),
            (
                &[0x2c, 0xc0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1],
                DecodeError::InvalidValue("path id"),
            ),
            (&[0x2b, 1, 1, 0], DecodeError::InvalidValue("path status")),
            (&[0x2b, 1, 1, 4], DecodeError::InvalidValue("path status")),
            (&[0x2b, 1, 1], DecodeError::UnexpectedEnd),
            (&[0x2a, 0, 5, 0, 0, 0, 1, 0], DecodeError::UnexpectedEnd),
            (&[0x29, 0, 1, 0], DecodeError::InvalidValue("ack threshold")),
            (
                &[0x29, 0, 1, 0x40, 65],
                DecodeError::InvalidValue("ack threshold"),
            ),
            (&[0x29, 0, 1], DecodeError::UnexpectedEnd),
            (
                &[0x40, 0x01],
                DecodeError::InvalidValue("frame type encoding"),
            ),
            (
                &[0x12, 0xd0, 0, 0, 0, 0, 0, 0, 1],
                DecodeError::InvalidValue("max flows"),
            ),
            (&[0x16, 0, 0x44, 0x01], DecodeError::TooLong),
            (
                &[0x20, 1, 2, 1, 9],
                DecodeError::InvalidValue("retire prior to"),
            ),
            (
                &[0x20, 1, 0, 0],
                DecodeError::InvalidValue("connection id length"),
            ),
            (&[0x20, 1, 0, 21], DecodeError::TooLong),
            (&[0x20, 1, 0, 1, 9, 0], DecodeError::UnexpectedEnd),
            (&[0x22, 0, 0, 0x44, 0x01], DecodeError::TooLong),
            (&[0x25, 0, 3, 2], DecodeError::InvalidValue("probe index")),
            (&[0x25, 0, 0, 2], DecodeError::InvalidValue("probe index")),
            (&[0x25, 0, 1, 1], DecodeError::InvalidValue("probe count")),
            (&[0x25, 0, 1, 65], DecodeError::InvalidValue("probe count")),
            (&[0x25, 0, 1], DecodeError::UnexpectedEnd),
            (&[0x27, 0], DecodeError::InvalidValue("group")),
            (&[0x28, 0x41, 0x00], DecodeError::TooLong),
            (
                &[0x1e, 0, 5, 1, 2, 3, 4, 0, 1],
                DecodeError::InvalidValue("address family"),
            ),
            (&[0x1c, 1, 2, 3], DecodeError::UnexpectedEnd),
            (
                &[0x26, 0xc0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
                DecodeError::InvalidValue("path id"),
            ),
        ];
        for (bytes, err) in cases {
            assert_eq!(decode_one(bytes).err(), Some(*err), "{bytes:02x?}");
        }
        // A transport close with frame type 0 means "unknown".
        assert_eq!(
            decode_one(&[0x22, 7, 0, 0]),
            Ok(Frame::Close {
                application: false,
                error_code: 7,
                frame_type: None,
                reason: &[]
            })
        );
    }

    #[test]
    fn frame_iter_stops_after_error_and_reports_type() {
        let payload = [0x01, 0x24, 0x25, 0, 9, 0x01];
        let mut it = FrameIter::new(&payload);
        assert_eq!(it.next(), Some(Ok(Frame::Ping)));
        assert_eq!(it.current_frame_type(), Some(ty::PING));
        assert_eq!(it.next(), Some(Ok(Frame::HandshakeDone)));
        assert_eq!(
            it.next(),
            Some(Err(DecodeError::InvalidValue("probe count")))
        );
        assert_eq!(it.current_frame_type(), Some(ty::PROBE));
        assert_eq!(it.next(), None);
        assert_eq!(FrameIter::new(&[]).next(), None);
    }

    #[test]
    fn ack_eliciting_and_probing() {
        assert!(Frame::Ping.is_ack_eliciting());
        assert!(Frame::AckRequest.is_ack_eliciting());
        assert!(!Frame::Padding { len: 1 }.is_ack_eliciting());
        assert!(!Frame::RateEcho {
            path_id: 0,
            feedback_kbps: 1
        }
        .is_ack_eliciting());
        let close = Frame::Close {
            application: true,
            error_code: 0,
            frame_type: None,
            reason: b"",
        };
        assert!(!close.is_ack_eliciting());
        assert!(Frame::PathChallenge { data: [0; 8] }.is_path_probing());
        assert!(!Frame::Ping.is_path_probing());
    }

    // ---- property tests ----------------------------------------------------------------

    fn v() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..64, 0u64..16384, 0..=MAX]
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(ip.into(), port))),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::V6(SocketAddrV6::new(ip.into(), port, 0, 0))),
        ]
    }

    /// Owned data for frames that borrow: the strategy yields a buffer, frames borrow it.
    #[derive(Debug, Clone)]
    pub(crate) struct FrameSpec {
        kind: u8,
        a: u64,
        b: u64,
        c: u64,
        flag: bool,
        small: u8,
        bytes: Vec<u8>,
        arr: [u8; 16],
        cid: ConnectionId,
        addr: SocketAddr,
        opt: Option<u64>,
        /// pre-encoded ACK or NACK frame
        encoded: Vec<u8>,
    }

    pub(crate) fn arb_frame_spec() -> impl Strategy<Value = FrameSpec> {
        (
            (0u8..37, v(), v(), v(), any::<bool>(), any::<u8>()),
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<[u8; 16]>(),
            arb_cid(1..=20),
            arb_addr(),
            proptest::option::of(v()),
            proptest::collection::btree_set(0..=MAX, 1..8),
        )
            .prop_map(
                |((kind, a, b, c, flag, small), bytes, arr, cid, addr, opt, set)| {
                    let mut encoded = Vec::new();
                    let sorted: Vec<u64> = set.into_iter().collect();
                    if kind % 2 == 0 {
                        let ranges = sorted.iter().rev().map(|pn| *pn..=*pn);
                        let ranges: Vec<_> = ranges.collect();
                        // adjacent singletons are not allowed; keep what the encoder accepts
                        let ecn = (kind % 4 == 0).then_some(crate::recovery::EcnCounts {
                            ect0: b,
                            ect1: a,
                            ce: b / 2,
                        });
                        encode_ack(a as u32, b, ranges, 64, 1000, ecn.as_ref(), &mut encoded)
                            .unwrap();
                    } else {
                        encode_nack(a as u32, sorted, 64, 1000, &mut encoded).unwrap();
                    }
                    FrameSpec {
                        kind,
                        a,
                        b,
                        c,
                        flag,
                        small,
                        bytes,
                        arr,
                        cid,
                        addr,
                        opt,
                        encoded,
                    }
                },
            )
    }

    impl FrameSpec {
        pub(crate) fn frame(&self) -> Frame<'_> {
            let (a, b, c) = (self.a, self.b, self.c);
            let bytes = &self.bytes[..];
            let reason = &bytes[..bytes.len().min(MAX_REASON_LEN)];
            let group = if bytes.is_empty() {
                &b"g"[..]
            } else {
                &bytes[..bytes.len().min(MAX_GROUP_LEN)]
            };
            let arr8 = [
                self.arr[0],
                self.arr[1],
                self.arr[2],
                self.arr[3],
                self.arr[4],
                self.arr[5],
                self.arr[6],
                self.arr[7],
            ];
            match self.kind {
                0 => Frame::Padding {
                    len: 1 + self.small as usize,
                },
                1 => Frame::Ping,
                2 | 3 => Frame::decode(&mut Reader::new(&self.encoded)).unwrap(),
                4 => Frame::AckRequest,
                5 => Frame::ResetFlow {
                    flow_id: a,
                    error_code: b,
                    final_size: c,
                },
                6 => Frame::StopSending {
                    flow_id: a,
                    error_code: b,
                },
                7 => Frame::Flow(FlowFrame {
                    flow_id: a,
                    offset: b.min(MAX - bytes.len() as u64),
                    fin: self.flag,
                    data: bytes,
                }),
                8 => Frame::MaxData { max: a },
                9 => Frame::MaxFlowData { flow_id: a, max: b },
                10 => Frame::MaxFlows {
                    bidi: self.flag,
                    max: a.min(MAX_FLOWS),
                },
                11 => Frame::DataBlocked { limit: a },
                12 => Frame::FlowDataBlocked {
                    flow_id: a,
                    limit: b,
                },
                13 => Frame::WindowClose {
                    reason_code: a,
                    reason,
                },
                14 => Frame::WindowOpen,
                15 => Frame::WindowStatus,
                16 => {
                    let total_len = c.max(b.saturating_add(bytes.len() as u64)).min(MAX);
                    let offset = b.min(total_len - bytes.len() as u64);
                    Frame::Message(MessageFrame {
                        msg_id: a,
                        ordered: self.flag,
                        priority: self.small,
                        total_len,
                        offset,
                        deadline_us: self.opt,
                        reply_to: self.opt.map(|d| d / 3),
                        data: bytes,
                    })
                }
                17 => Frame::MessageSkip {
                    msg_id: a,
                    credit: b,
                },
                18 => Frame::Datagram { data: bytes },
                19 => Frame::PathChallenge { data: arr8 },
                20 => Frame::PathResponse { data: arr8 },
                21 => Frame::AddAddress {
                    seq: a,
                    addr: self.addr,
                },
                22 => Frame::RemoveAddress { seq: a },
                23 => Frame::NewConnectionId {
                    seq: a.max(b),
                    retire_prior_to: a.min(b),
                    cid: self.cid,
                    reset_token: self.arr,
                },
                24 => Frame::RetireConnectionId { seq: a },
                25 => Frame::Close {
                    application: self.flag,
                    error_code: a,
                    frame_type: if self.flag {
                        None
                    } else {
                        self.opt.filter(|t| *t != 0)
                    },
                    reason,
                },
                26 => Frame::HandshakeDone,
                27 => {
                    let count = 2 + self.small % (MAX_PROBE_TRAIN - 1);
                    Frame::Probe {
                        train: a,
                        index: 1 + (c % u64::from(count)) as u8,
                        count,
                    }
                }
                36 => Frame::ProbeReport {
                    path_id: a as u32,
                    train: b,
                    received: self.small % (MAX_PROBE_TRAIN + 1),
                    rate: c,
                },
                28 => Frame::RateEcho {
                    path_id: a as u32,
                    feedback_kbps: b as u32,
                },
                29 => Frame::Join { group },
                30 => Frame::Leave { group },
                34 => Frame::AckFrequency {
                    path_id: a as u32,
                    sequence: b,
                    threshold: 1 + (c % u64::from(MAX_ACK_THRESHOLD)) as u32,
                },
                35 => Frame::PathStatus {
                    path_id: a as u32,
                    sequence: b,
                    status: PathStatusCode::from_wire(1 + c % 3).unwrap(),
                },
                31 => Frame::Flow(FlowFrame {
                    flow_id: a,
                    offset: 0,
                    fin: self.flag,
                    data: &[],
                }),
                _ => Frame::Message(MessageFrame {
                    msg_id: a,
                    ordered: false,
                    priority: 0,
                    total_len: 0,
                    offset: 0,
                    deadline_us: None,
                    reply_to: None,
                    data: &[],
                }),
            }
        }
    }

    proptest! {
        #[test]
        fn frame_round_trip(spec in arb_frame_spec()) {
            let frame = spec.frame();
            let buf = encode(&frame);
            let mut r = Reader::new(&buf);
            let decoded = Frame::decode(&mut r).unwrap();
            prop_assert!(r.is_empty());
            prop_assert_eq!(decoded, frame);
            prop_assert_eq!(decoded.frame_type(), frame.frame_type());
        }

        #[test]
        fn frame_sequence_round_trip(specs in proptest::collection::vec(arb_frame_spec(), 0..8)) {
            let frames: Vec<_> = specs.iter().map(FrameSpec::frame).collect();
            let mut buf = Vec::new();
            let mut expected: Vec<Frame<'_>> = Vec::new();
            for f in &frames {
                f.encode(&mut buf);
                // consecutive padding frames decode as one
                match (expected.last_mut(), f) {
                    (Some(Frame::Padding { len }), Frame::Padding { len: more }) => *len += more,
                    _ => expected.push(*f),
                }
            }
            let decoded: Vec<_> = FrameIter::new(&buf).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(decoded, expected);
        }

        #[test]
        fn flow_without_len_round_trip(spec in arb_frame_spec(), flow_id in v(), offset in v(), fin in any::<bool>()) {
            let data = &spec.bytes[..];
            let f = FlowFrame { flow_id, offset: offset.min(MAX - data.len() as u64), fin, data };
            let mut buf = Vec::new();
            f.encode_with(false, &mut buf);
            prop_assert_eq!(buf.len(), f.encoded_len_with(false));
            prop_assert_eq!(decode_one(&buf), Ok(Frame::Flow(f)));
        }

        #[test]
        fn arbitrary_payloads_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            crate::wire::fuzz::frames(&data);
        }

        #[test]
        fn arbitrary_typed_payloads_never_panic(t in 0u8..0x2d, data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut buf = vec![t];
            buf.extend_from_slice(&data);
            crate::wire::fuzz::frames(&buf);
        }
    }
}
