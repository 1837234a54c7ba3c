//! Messages (DESIGN.md F5, docs/PROTOCOL.md §9.17): framed payloads of any size up to a
//! negotiated limit, fragmented to the path MTU and delivered whole or not at all; ordered or
//! unordered; fully reliable or reliable until a deadline, after which the sender stops
//! resending and the receiver skips them; with a priority (higher leaves first, resends
//! included; equal priorities share round-robin).
//!
//! Message IDs carry their kind in bit 0 (0 ordered, 1 unordered); ordered messages are
//! numbered contiguously (`id >> 1`), which is what lets the receiver deliver them in order
//! and know what it is waiting for.

pub(crate) mod recv;
pub(crate) mod send;

use std::time::{Duration, Instant};

use bytes::Bytes;

pub(crate) use recv::MessageReceiver;
pub(crate) use send::MessageSender;

/// Connection credit a message costs on top of its payload (docs/PROTOCOL.md §10): the
/// receiver holds per-message state whatever the size, so without it a peer could make a
/// receiver hold any number of empty messages for the credit of none. Both ends count it.
pub const MESSAGE_CREDIT_OVERHEAD: u64 = 64;

/// The largest message a connection window of `window` bytes lets start whatever came
/// before it: half the window, less the overhead. A receiver raises its limit (MaxData) once
/// the application has consumed half a window since the last raise, so a sender whose peer
/// read everything may hold as little as half a window of credit, and a message is started
/// only when the credit covers all of it (§10.2): a larger one could wait for good.
pub(crate) fn max_message_for_window(window: u64) -> u64 {
    (window / 2).saturating_sub(MESSAGE_CREDIT_OVERHEAD)
}

/// The connection credit a message of `len` bytes takes.
pub(crate) fn credit_cost(len: u64) -> u64 {
    len.saturating_add(MESSAGE_CREDIT_OVERHEAD)
}

/// Number of priority levels; 0 is the lowest, 7 the highest.
pub const PRIORITIES: usize = 8;

/// Names a message within a connection and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub u64);

impl MessageId {
    pub(crate) fn new(ordered: bool, seq: u64) -> Self {
        Self((seq << 1) | u64::from(!ordered))
    }

    /// Whether the message is delivered in order with the other ordered messages.
    pub fn is_ordered(self) -> bool {
        self.0 & 1 == 0
    }

    /// Position among messages of the same kind.
    pub fn seq(self) -> u64 {
        self.0 >> 1
    }
}

/// How a message is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageOptions {
    /// Deliver in order with the other ordered messages (default) or as soon as complete.
    pub ordered: bool,
    /// Give up this long after `send_message` if not yet delivered: the sender stops
    /// resending and the receiver never delivers it late. `None`: fully reliable.
    pub deadline: Option<Duration>,
    /// 0 (lowest) to 7 (highest); default 3. Flows send after all messages.
    pub priority: u8,
    /// This message answers the peer's message with this ID (request/response).
    pub reply_to: Option<MessageId>,
    /// Send every fragment twice on its first transmission (the copies right after the
    /// message's last fragment): a single loss then costs nothing instead of a round trip
    /// or a probe timeout. For small urgent messages on lossy paths; it doubles their bytes.
    pub redundant: bool,
}

impl Default for MessageOptions {
    fn default() -> Self {
        Self {
            ordered: true,
            deadline: None,
            priority: 3,
            reply_to: None,
            redundant: false,
        }
    }
}

impl MessageOptions {
    /// Unordered delivery.
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }
    /// A deadline.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
    /// A priority (clamped to 0..=7).
    pub fn priority(mut self, p: u8) -> Self {
        self.priority = p.min(PRIORITIES as u8 - 1);
        self
    }
    /// Sends each fragment twice (see [`MessageOptions::redundant`]).
    pub fn redundant(mut self) -> Self {
        self.redundant = true;
        self
    }
    /// Marks the message as the answer to `request`.
    pub fn reply_to(mut self, request: MessageId) -> Self {
        self.reply_to = Some(request);
        self
    }
}

/// A message received whole.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// Its ID (answer it with `MessageOptions::reply_to`).
    pub id: MessageId,
    /// The payload.
    pub data: Bytes,
    /// The request it answers, if it is a reply.
    pub reply_to: Option<MessageId>,
    /// The sender's priority.
    pub priority: u8,
    /// When the sender's deadline passes, as estimated on arrival (time left when sent,
    /// less half an RTT), if it set one: a reply sent with the time left until then reaches
    /// the requester before it gives up.
    pub deadline: Option<Instant>,
}

/// Why a message could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendMessageError {
    /// Larger than the peer accepts.
    #[error("message of {size} bytes exceeds the peer's limit of {max}")]
    TooLarge {
        /// The message size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The connection is closed.
    #[error("connection closed")]
    ConnectionClosed,
}

/// Why a datagram could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// The peer does not accept datagrams.
    #[error("the peer does not accept datagrams")]
    Unsupported,
    /// Larger than one packet on this path can carry.
    #[error("datagram of {size} bytes exceeds the {max} bytes a packet can carry")]
    TooLarge {
        /// The datagram size.
        size: usize,
        /// The most a datagram may hold now.
        max: usize,
    },
    /// The connection is closed.
    #[error("connection closed")]
    ConnectionClosed,
}
