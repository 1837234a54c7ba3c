//! The receiving side of messages: reassembly, ordered delivery, skipping what expired.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::{Message, MessageId};
use crate::recovery::RangeSet;

#[derive(Debug)]
struct InMessage {
    total: u64,
    received: RangeSet,
    chunks: BTreeMap<u64, Bytes>,
    deadline: Option<Instant>,
    reply_to: Option<MessageId>,
    priority: u8,
}

/// What the receiver did with a message that will never be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub(crate) id: MessageId,
    /// How far past its deadline it was when skipped (zero when the sender gave it up).
    pub(crate) late_by: Duration,
    /// Bytes of it that had been received (credit to give back).
    pub(crate) bytes: u64,
}

/// Why a fragment was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MessageRecvError {
    TooLarge,
    Inconsistent,
}

/// All messages being received on a connection.
#[derive(Debug, Default)]
pub(crate) struct MessageReceiver {
    partial: HashMap<MessageId, InMessage>,
    /// Messages finished (delivered or skipped), to drop late duplicates.
    finished: [RangeSet; 2],
    /// Ordered messages complete (Some, with their deadline) or skipped (None), waiting for
    /// earlier ones.
    ordered_done: BTreeMap<u64, Option<(Message, Option<Instant>)>>,
    next_ordered: u64,
    /// Ready for the application.
    pub(crate) ready: VecDeque<Message>,
    /// Bytes held in `partial` and `ordered_done` (counted against connection credit).
    pub(crate) held: u64,
}

impl MessageReceiver {
    fn is_finished(&self, id: MessageId) -> bool {
        let kind = usize::from(!id.is_ordered());
        self.finished[kind].contains(id.seq()) || (id.is_ordered() && id.seq() < self.next_ordered)
    }

    fn mark_finished(&mut self, id: MessageId) {
        let kind = usize::from(!id.is_ordered());
        self.finished[kind].insert(id.seq()..id.seq() + 1);
    }

    /// Takes one fragment. Returns the bytes newly held (for connection credit). `deadline`
    /// is the receiver's estimate of the message's deadline.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_fragment(
        &mut self,
        id: MessageId,
        total: u64,
        offset: u64,
        data: &[u8],
        deadline: Option<Instant>,
        reply_to: Option<MessageId>,
        priority: u8,
        max_size: u64,
    ) -> Result<u64, MessageRecvError> {
        if total > max_size {
            return Err(MessageRecvError::TooLarge);
        }
        if self.is_finished(id) {
            return Ok(0);
        }
        let m = self.partial.entry(id).or_insert_with(|| InMessage {
            total,
            received: RangeSet::new(),
            chunks: BTreeMap::new(),
            deadline,
            reply_to,
            priority,
        });
        if m.total != total {
            return Err(MessageRecvError::Inconsistent);
        }
        // The earliest estimate wins: never deliver later than any fragment allows.
        if let Some(d) = deadline {
            m.deadline = Some(m.deadline.map_or(d, |old| old.min(d)));
        }
        let end = offset + data.len() as u64;
        let mut new = 0;
        let mut cursor = offset;
        let holes: Vec<(u64, u64)> = {
            let mut v = Vec::new();
            for r in m.received.iter() {
                if r.end <= cursor {
                    continue;
                }
                if r.start >= end {
                    break;
                }
                if r.start > cursor {
                    v.push((cursor, r.start));
                }
                cursor = cursor.max(r.end);
            }
            if cursor < end {
                v.push((cursor, end));
            }
            v
        };
        for (s, e) in holes {
            m.chunks.insert(
                s,
                Bytes::copy_from_slice(&data[(s - offset) as usize..(e - offset) as usize]),
            );
            m.received.insert(s..e);
            new += e - s;
        }
        self.held += new;
        let complete = m.received.contains_range(0..m.total) || m.total == 0;
        if complete {
            if let Some(m) = self.partial.remove(&id) {
                let mut data = BytesMut::with_capacity(m.total as usize);
                for chunk in m.chunks.values() {
                    data.extend_from_slice(chunk);
                }
                let msg = Message {
                    id,
                    data: data.freeze(),
                    reply_to: m.reply_to,
                    priority: m.priority,
                };
                self.mark_finished(id);
                if id.is_ordered() {
                    self.ordered_done.insert(id.seq(), Some((msg, m.deadline)));
                    self.release_ordered();
                } else {
                    self.held -= m.total;
                    self.ready.push_back(msg);
                }
            }
        }
        Ok(new)
    }

    fn release_ordered(&mut self) {
        while let Some(entry) = self.ordered_done.first_entry() {
            if *entry.key() != self.next_ordered {
                break;
            }
            let done = entry.remove();
            self.next_ordered += 1;
            if let Some((msg, _)) = done {
                self.held -= msg.data.len() as u64;
                self.ready.push_back(msg);
            }
        }
    }

    /// The sender gave a message up (MessageSkip).
    pub(crate) fn on_skip(&mut self, id: MessageId) -> Option<Skipped> {
        if self.is_finished(id) {
            return None;
        }
        self.drop_message(id, Duration::ZERO)
    }

    fn drop_message(&mut self, id: MessageId, late_by: Duration) -> Option<Skipped> {
        let bytes = self.partial.remove(&id).map_or(0, |m| m.received.total());
        self.held -= bytes;
        self.mark_finished(id);
        if id.is_ordered() {
            self.ordered_done.insert(id.seq(), None);
            self.release_ordered();
        }
        Some(Skipped { id, late_by, bytes })
    }

    /// Skips messages whose deadline passed: incomplete ones, and complete ordered ones held
    /// back by an earlier gap, which are delivered now rather than late (the gap is skipped).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Skipped> {
        let mut out = Vec::new();
        let due: Vec<(MessageId, Instant)> = self
            .partial
            .iter()
            .filter_map(|(id, m)| m.deadline.filter(|d| *d <= now).map(|d| (*id, d)))
            .collect();
        for (id, d) in due {
            out.extend(self.drop_message(id, now - d));
        }
        // A complete ordered message waiting for earlier ones: deliver it before it is late
        // by giving up the gap before it.
        let waiting_due = self
            .ordered_done
            .iter()
            .filter(|(_, m)| m.as_ref().is_some_and(|(_, d)| d.is_some_and(|d| d <= now)))
            .map(|(seq, _)| *seq)
            .next_back();
        if let Some(seq) = waiting_due {
            for gap in self.next_ordered..seq {
                if self.ordered_done.contains_key(&gap) {
                    continue;
                }
                let id = MessageId::new(true, gap);
                out.extend(self.drop_message(id, Duration::ZERO));
            }
            self.release_ordered();
        }
        out
    }

    /// The earliest receiver-side deadline (of incomplete messages, and of complete ordered
    /// ones waiting for earlier ones).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let waiting = self
            .ordered_done
            .values()
            .filter_map(|m| m.as_ref().and_then(|(_, d)| *d));
        self.partial
            .values()
            .filter_map(|m| m.deadline)
            .chain(waiting)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        crate::cc::testing::epoch()
    }

    #[test]
    fn ordered_waits_unordered_does_not() {
        let mut r = MessageReceiver::default();
        let (o0, o1, u0) = (
            MessageId::new(true, 0),
            MessageId::new(true, 1),
            MessageId::new(false, 0),
        );
        r.on_fragment(o1, 3, 0, b"two", None, None, 3, 100).unwrap();
        r.on_fragment(u0, 1, 0, b"u", None, None, 3, 100).unwrap();
        assert_eq!(
            r.ready.len(),
            1,
            "the unordered one is ready; o1 waits for o0"
        );
        assert_eq!(r.ready[0].id, u0);
        r.on_fragment(o0, 6, 3, b"one", None, None, 3, 100).unwrap();
        r.on_fragment(o0, 6, 0, b"one", None, None, 3, 100).unwrap();
        let ids: Vec<_> = r.ready.iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![u0, o0, o1]);
        assert_eq!(r.ready[1].data, Bytes::from_static(b"oneone"));
        assert_eq!(r.held, 0);
    }

    #[test]
    fn a_skip_unblocks_later_ordered_messages() {
        let mut r = MessageReceiver::default();
        let (o0, o1) = (MessageId::new(true, 0), MessageId::new(true, 1));
        r.on_fragment(o0, 10, 0, b"half!", None, None, 3, 100)
            .unwrap();
        r.on_fragment(o1, 2, 0, b"ok", None, None, 3, 100).unwrap();
        assert!(r.ready.is_empty());
        let s = r.on_skip(o0).unwrap();
        assert_eq!(s.bytes, 5);
        assert_eq!(r.ready.len(), 1);
        assert_eq!(r.ready[0].id, o1);
        // Late fragments of a skipped message are ignored.
        assert_eq!(
            r.on_fragment(o0, 10, 5, b"more!", None, None, 3, 100),
            Ok(0)
        );
        assert_eq!(r.held, 0);
    }

    #[test]
    fn incomplete_messages_expire_at_their_deadline() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let id = MessageId::new(false, 0);
        let d = t + Duration::from_millis(30);
        r.on_fragment(id, 10, 0, b"abc", Some(d), None, 3, 100)
            .unwrap();
        assert!(r.expire(t + Duration::from_millis(10)).is_empty());
        let gone = r.expire(t + Duration::from_millis(35));
        assert_eq!(gone[0].id, id);
        assert_eq!(gone[0].late_by, Duration::from_millis(5));
        // Completing it now delivers nothing.
        r.on_fragment(id, 10, 3, b"defghij", Some(d), None, 3, 100)
            .unwrap();
        assert!(r.ready.is_empty());
    }

    #[test]
    fn a_complete_ordered_message_is_not_held_past_its_deadline() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let (o0, o1) = (MessageId::new(true, 0), MessageId::new(true, 1));
        let d = t + Duration::from_millis(20);
        r.on_fragment(o1, 2, 0, b"ok", Some(d), None, 3, 100)
            .unwrap();
        assert!(r.ready.is_empty(), "waits for o0");
        assert_eq!(r.next_deadline(), Some(d));
        let skipped = r.expire(d);
        assert_eq!(skipped.iter().map(|s| s.id).collect::<Vec<_>>(), vec![o0]);
        assert_eq!(r.ready.len(), 1, "delivered at its deadline, not after");
        assert_eq!(r.ready[0].id, o1);
        // o0 arriving now is ignored.
        assert_eq!(r.on_fragment(o0, 1, 0, b"x", None, None, 3, 100), Ok(0));
    }

    #[test]
    fn oversized_messages_are_refused() {
        let mut r = MessageReceiver::default();
        assert_eq!(
            r.on_fragment(MessageId::new(true, 0), 1000, 0, b"x", None, None, 3, 100),
            Err(MessageRecvError::TooLarge)
        );
    }
}
