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
    /// Connection credit newly counted for it (a message never seen, skipped by the sender).
    pub(crate) counted: u64,
    /// Connection credit to give back now.
    pub(crate) release: u64,
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
    /// Ordered messages complete (Some) or skipped (None), waiting for earlier ones.
    ordered_done: BTreeMap<u64, Option<Message>>,
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

    /// Takes one fragment. Returns the connection credit newly counted: a message's whole
    /// size when its first fragment arrives (the sender counted it whole when it started it),
    /// then nothing. `deadline` is the receiver's estimate of the message's deadline.
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
        let counted = if self.partial.contains_key(&id) {
            0
        } else {
            total
        };
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
        if end > m.total {
            return Err(MessageRecvError::Inconsistent);
        }
        let mut new = 0;
        for hole in m.received.holes(offset..end) {
            let (s, e) = (hole.start, hole.end);
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
                    deadline: m.deadline,
                };
                self.mark_finished(id);
                if id.is_ordered() {
                    self.ordered_done.insert(id.seq(), Some(msg));
                    self.release_ordered();
                } else {
                    self.held -= m.total;
                    self.ready.push_back(msg);
                }
            }
        }
        Ok(counted)
    }

    fn release_ordered(&mut self) {
        while let Some(entry) = self.ordered_done.first_entry() {
            if *entry.key() != self.next_ordered {
                break;
            }
            let done = entry.remove();
            self.next_ordered += 1;
            if let Some(msg) = done {
                self.held -= msg.data.len() as u64;
                self.ready.push_back(msg);
            }
        }
    }

    /// The sender gave a message up (MessageSkip carrying the credit it counted for it).
    pub(crate) fn on_skip(&mut self, id: MessageId, credit: u64) -> Option<Skipped> {
        if self.is_finished(id) {
            return None;
        }
        if self.partial.contains_key(&id) {
            return self.drop_message(id, Duration::ZERO);
        }
        // Never seen: count and release what the sender counted, so both ends agree.
        self.mark_finished(id);
        if id.is_ordered() {
            self.ordered_done.insert(id.seq(), None);
            self.release_ordered();
        }
        Some(Skipped {
            id,
            late_by: Duration::ZERO,
            counted: credit,
            release: credit,
        })
    }

    /// Drops a message that was seen (partial, or complete and waiting in order).
    fn drop_message(&mut self, id: MessageId, late_by: Duration) -> Option<Skipped> {
        let (bytes, total) = match self.partial.remove(&id) {
            Some(m) => (m.received.total(), m.total),
            None => match self.ordered_done.get(&id.seq()) {
                Some(Some(msg)) => (msg.data.len() as u64, msg.data.len() as u64),
                _ => (0, 0),
            },
        };
        self.held -= bytes;
        self.mark_finished(id);
        if id.is_ordered() {
            self.ordered_done.insert(id.seq(), None);
            self.release_ordered();
        }
        Some(Skipped {
            id,
            late_by,
            counted: 0,
            release: total,
        })
    }

    /// Skips messages whose deadline passed: incomplete ones, and complete ordered ones still
    /// waiting for an earlier one.
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
        // A complete ordered message still waiting for an earlier one at its deadline can
        // no longer be delivered in order and on time: it is dropped. (Earlier messages are
        // never skipped on the receiver's own account: one without a deadline must arrive.)
        let waiting_due: Vec<(u64, Instant)> = self
            .ordered_done
            .iter()
            .filter_map(|(seq, m)| {
                let d = m.as_ref()?.deadline?;
                (d <= now).then_some((*seq, d))
            })
            .collect();
        for (seq, d) in waiting_due {
            out.extend(self.drop_message(MessageId::new(true, seq), now - d));
        }
        out
    }

    /// The earliest receiver-side deadline (of incomplete messages, and of complete ordered
    /// ones waiting for earlier ones).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let waiting = self
            .ordered_done
            .values()
            .filter_map(|m| m.as_ref().and_then(|m| m.deadline));
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
        let s = r.on_skip(o0, 10).unwrap();
        assert_eq!(
            (s.counted, s.release),
            (0, 10),
            "seen: counted at its first fragment"
        );
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
    fn a_complete_ordered_message_is_never_delivered_late() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let (o0, o1) = (MessageId::new(true, 0), MessageId::new(true, 1));
        let d = t + Duration::from_millis(20);
        assert_eq!(r.on_fragment(o1, 2, 0, b"ok", Some(d), None, 3, 100), Ok(2));
        assert!(r.ready.is_empty(), "waits for o0");
        assert_eq!(r.next_deadline(), Some(d));
        let skipped = r.expire(d);
        assert_eq!(
            skipped
                .iter()
                .map(|s| (s.id, s.release))
                .collect::<Vec<_>>(),
            vec![(o1, 2)]
        );
        // o0 (no deadline) still arrives and is delivered; o1 never is.
        r.on_fragment(o0, 1, 0, b"x", None, None, 3, 100).unwrap();
        assert_eq!(r.ready.iter().map(|m| m.id).collect::<Vec<_>>(), vec![o0]);
        assert_eq!(r.held, 0);
    }

    #[test]
    fn a_skip_for_an_unseen_message_accounts_its_credit() {
        let mut r = MessageReceiver::default();
        let s = r.on_skip(MessageId::new(false, 4), 700).unwrap();
        assert_eq!((s.counted, s.release), (700, 700));
        assert!(
            r.on_skip(MessageId::new(false, 4), 700).is_none(),
            "only once"
        );
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
