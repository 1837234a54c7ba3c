//! The receiving side of messages: reassembly, ordered delivery, skipping what expired.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{credit_cost, Message, MessageId};
use crate::flow::recv::store_coalesced;
use crate::recovery::RangeSet;

#[derive(Debug)]
struct InMessage {
    total: u64,
    received: RangeSet,
    /// Bytes `0..prefix.len()`: those that arrived in order (the common case) are copied
    /// here once, and the buffer becomes the message. Its capacity is the message's size
    /// (counted against connection credit at the first fragment); memory is touched only as
    /// bytes arrive.
    prefix: Vec<u8>,
    /// Bytes beyond a gap, keyed by offset, moved into `prefix` when the gap before them fills.
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

/// What a receiver holds for messages the application has not taken yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Buffered {
    /// Messages: partial, complete and waiting for an earlier ordered one, and ready.
    pub(crate) count: u64,
    /// Their payload bytes.
    pub(crate) bytes: u64,
}

/// All messages being received on a connection.
#[derive(Debug, Default)]
pub(crate) struct MessageReceiver {
    partial: HashMap<MessageId, InMessage>,
    /// Messages finished (delivered or skipped), to drop late duplicates.
    finished: [RangeSet; 2],
    /// Ordered messages complete, waiting for earlier ones. (Skipped ones are only in
    /// `finished`: a flood of skips costs ranges there, which are bounded, not entries here.)
    ordered_done: BTreeMap<u64, Message>,
    next_ordered: u64,
    /// Ready for the application.
    pub(crate) ready: VecDeque<Message>,
    /// Bytes held in `partial` and `ordered_done` (counted against connection credit).
    pub(crate) held: u64,
    /// Disjoint received ranges of the partial messages: each costs a map node whatever
    /// its size, so the connection bounds their number (with its flows' and the message IDs'
    /// out-of-order ranges, see `ranges`).
    partial_ranges: usize,
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

    /// Disjoint ranges held that a peer could multiply with tiny or sparse fragments and
    /// message IDs: partial messages' received ranges, and finished message IDs above a gap.
    pub(crate) fn ranges(&self) -> usize {
        self.partial_ranges + self.finished[0].len() + self.finished[1].len()
    }

    /// Messages and bytes held for the application (see [`Buffered`]).
    pub(crate) fn buffered(&self) -> Buffered {
        let waiting = self.ordered_done.len();
        let ready_bytes: u64 = self.ready.iter().map(|m| m.data.len() as u64).sum();
        Buffered {
            count: (self.partial.len() + waiting + self.ready.len()) as u64,
            bytes: self.held + ready_bytes,
        }
    }

    /// The connection credit a fragment of message `id` of `total` bytes would newly count
    /// (what [`on_fragment`](Self::on_fragment) would return): checked before the fragment
    /// is taken, so that no buffer is reserved for a message beyond the credit given.
    pub(crate) fn would_count(&self, id: MessageId, total: u64) -> u64 {
        if self.is_finished(id) || self.partial.contains_key(&id) {
            0
        } else {
            credit_cost(total)
        }
    }

    /// Takes one fragment. Returns the connection credit newly counted: a message's whole
    /// cost ([`credit_cost`]: its size plus a fixed overhead) when its first fragment arrives
    /// (the sender counted it whole when it started it), then nothing. `deadline` is the
    /// receiver's estimate of the message's deadline.
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
        let first = !self.partial.contains_key(&id);
        let counted = if first { credit_cost(total) } else { 0 };
        if first && offset == 0 && data.len() as u64 == total {
            // The whole message in one fragment (most requests and replies): one copy, no
            // reassembly state.
            self.held += total;
            self.complete(Message {
                id,
                data: Bytes::copy_from_slice(data),
                reply_to,
                priority,
                deadline,
            });
            return Ok(counted);
        }
        let m = self.partial.entry(id).or_insert_with(|| InMessage {
            total,
            received: RangeSet::new(),
            prefix: Vec::with_capacity(total as usize),
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
        let ranges_before = m.received.len();
        for hole in m.received.holes(offset..end) {
            let (s, e) = (hole.start, hole.end);
            let bytes = &data[(s - offset) as usize..(e - offset) as usize];
            if s == m.prefix.len() as u64 {
                m.prefix.extend_from_slice(bytes);
                // The gap before the next chunks may be filled now.
                while let Some(chunk) = m.chunks.remove(&(m.prefix.len() as u64)) {
                    m.prefix.extend_from_slice(&chunk);
                }
            } else {
                store_coalesced(&mut m.chunks, s, bytes);
            }
            m.received.insert(s..e);
            new += e - s;
        }
        self.partial_ranges = self.partial_ranges - ranges_before + m.received.len();
        self.held += new;
        let complete = m.received.contains_range(0..m.total) || m.total == 0;
        if complete {
            if let Some(m) = self.partial.remove(&id) {
                self.partial_ranges -= m.received.len();
                // Every byte is in the prefix once all are received (the chunks join it as
                // gaps fill); never hand over a message that is not whole.
                if !m.chunks.is_empty() || m.prefix.len() as u64 != m.total {
                    debug_assert!(false, "a complete message with chunks left");
                    return Err(MessageRecvError::Inconsistent);
                }
                self.complete(Message {
                    id,
                    data: Bytes::from(m.prefix),
                    reply_to: m.reply_to,
                    priority: m.priority,
                    deadline: m.deadline,
                });
            }
        }
        Ok(counted)
    }

    /// A message whose bytes are all here (counted in `held`): to the application, or to
    /// wait for an earlier ordered one.
    fn complete(&mut self, msg: Message) {
        let id = msg.id;
        self.mark_finished(id);
        if id.is_ordered() {
            self.ordered_done.insert(id.seq(), msg);
            self.release_ordered();
        } else {
            self.held -= msg.data.len() as u64;
            self.ready.push_back(msg);
        }
    }

    /// Delivers the ordered messages that no longer wait for an earlier one, stepping over
    /// the skipped ones (a whole range of finished IDs at once: the work is per message held,
    /// not per ID skipped).
    fn release_ordered(&mut self) {
        let Some(done) = self.finished[0].first() else {
            return;
        };
        if done.start <= self.next_ordered && self.next_ordered < done.end {
            while let Some(entry) = self.ordered_done.first_entry() {
                if *entry.key() >= done.end {
                    break;
                }
                let msg = entry.remove();
                self.held -= msg.data.len() as u64;
                self.ready.push_back(msg);
            }
            self.next_ordered = done.end;
        }
        // What is below `next_ordered` is finished by definition: keep no range for it.
        self.finished[0].remove(0..self.next_ordered);
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
            Some(m) => {
                self.partial_ranges -= m.received.len();
                (m.received.total(), m.total)
            }
            None if id.is_ordered() => match self.ordered_done.remove(&id.seq()) {
                Some(msg) => (msg.data.len() as u64, msg.data.len() as u64),
                None => return None,
            },
            None => return None,
        };
        self.held -= bytes;
        self.mark_finished(id);
        if id.is_ordered() {
            self.release_ordered();
        }
        Some(Skipped {
            id,
            late_by,
            counted: 0,
            release: credit_cost(total),
        })
    }

    /// Skips messages whose deadline passed: incomplete ones, and complete ordered ones still
    /// waiting for an earlier one.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Skipped> {
        let mut out = Vec::new();
        // First a complete ordered message still waiting for an earlier one at its deadline:
        // it can no longer be delivered in order and on time, so it is dropped. (Earlier
        // messages are never skipped on the receiver's own account: one without a deadline
        // must arrive.) Before the incomplete ones: dropping one of those releases the
        // complete ones behind it, which would then be delivered late.
        let waiting_due: Vec<(u64, Instant)> = self
            .ordered_done
            .iter()
            .filter_map(|(seq, m)| {
                let d = m.deadline?;
                (d <= now).then_some((*seq, d))
            })
            .collect();
        for (seq, d) in waiting_due {
            out.extend(self.drop_message(MessageId::new(true, seq), now - d));
        }
        let mut due: Vec<(MessageId, Instant)> = self
            .partial
            .iter()
            .filter_map(|(id, m)| m.deadline.filter(|d| *d <= now).map(|d| (*id, d)))
            .collect();
        // In ID order, not the map's: the MessageExpired events come out the same in every
        // process, so seeded simulations stay reproducible.
        due.sort_unstable_by_key(|(id, _)| *id);
        for (id, d) in due {
            out.extend(self.drop_message(id, now - d));
        }
        out
    }

    /// Drops the messages made ready from index `from` on whose deadline had already passed:
    /// they became whole, or their turn in order came, in a datagram read before the expiry
    /// timer fired. The timer would have dropped them (PROTOCOL.md §9.17); the order in
    /// which a runtime reads datagrams and fires timers must not decide delivery.
    pub(crate) fn drop_late(&mut self, from: usize, now: Instant) -> Vec<Skipped> {
        let mut out = Vec::new();
        let mut i = from;
        while i < self.ready.len() {
            let late = self.ready[i].deadline.filter(|d| *d < now);
            match late.and_then(|d| Some((d, self.ready.remove(i)?))) {
                Some((d, m)) => out.push(Skipped {
                    id: m.id,
                    late_by: now - d,
                    counted: 0,
                    release: credit_cost(m.data.len() as u64),
                }),
                None => i += 1,
            }
        }
        out
    }

    /// The earliest receiver-side deadline (of incomplete messages, and of complete ordered
    /// ones waiting for earlier ones).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let waiting = self.ordered_done.values().filter_map(|m| m.deadline);
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
        let s = r.on_skip(o0, credit_cost(10)).unwrap();
        assert_eq!(
            (s.counted, s.release),
            (0, credit_cost(10)),
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
    fn messages_expiring_together_are_reported_in_id_order() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let d = t + Duration::from_millis(30);
        // Enough incomplete messages that a hash map's order would differ from theirs.
        let ids: Vec<MessageId> = (0..32).rev().map(|n| MessageId::new(false, n)).collect();
        for id in &ids {
            r.on_fragment(*id, 10, 0, b"abc", Some(d), None, 3, 100)
                .unwrap();
        }
        let gone: Vec<MessageId> = r.expire(d).iter().map(|s| s.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(gone, sorted);
    }

    #[test]
    fn a_complete_ordered_message_is_never_delivered_late() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let (o0, o1) = (MessageId::new(true, 0), MessageId::new(true, 1));
        let d = t + Duration::from_millis(20);
        assert_eq!(
            r.on_fragment(o1, 2, 0, b"ok", Some(d), None, 3, 100),
            Ok(credit_cost(2))
        );
        assert!(r.ready.is_empty(), "waits for o0");
        assert_eq!(r.next_deadline(), Some(d));
        let skipped = r.expire(d);
        assert_eq!(
            skipped
                .iter()
                .map(|s| (s.id, s.release))
                .collect::<Vec<_>>(),
            vec![(o1, credit_cost(2))]
        );
        // o0 (no deadline) still arrives and is delivered; o1 never is.
        r.on_fragment(o0, 1, 0, b"x", None, None, 3, 100).unwrap();
        assert_eq!(r.ready.iter().map(|m| m.id).collect::<Vec<_>>(), vec![o0]);
        assert_eq!(r.held, 0);
    }

    #[test]
    fn an_expired_gap_does_not_release_a_message_expired_behind_it() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let (o0, o1) = (MessageId::new(true, 0), MessageId::new(true, 1));
        let d = t + Duration::from_millis(20);
        // o0 half here, o1 complete behind it; both due at d.
        r.on_fragment(o0, 4, 0, b"ab", Some(d), None, 3, 100)
            .unwrap();
        r.on_fragment(o1, 2, 0, b"ok", Some(d), None, 3, 100)
            .unwrap();
        let gone = r.expire(d);
        assert_eq!(gone.len(), 2, "both expire");
        assert!(r.ready.is_empty(), "o1 is not delivered late");
        assert_eq!(r.held, 0);
    }

    #[test]
    fn messages_made_ready_after_their_deadline_are_dropped() {
        let t = t0();
        let mut r = MessageReceiver::default();
        let (o0, o1, o2) = (
            MessageId::new(true, 0),
            MessageId::new(true, 1),
            MessageId::new(true, 2),
        );
        let d = t + Duration::from_millis(20);
        // o1 (due at d) and o2 (no deadline) wait behind o0, which completes after d with
        // no expiry run in between.
        r.on_fragment(o1, 2, 0, b"ok", Some(d), None, 3, 100)
            .unwrap();
        r.on_fragment(o2, 2, 0, b"no", None, None, 3, 100).unwrap();
        r.on_fragment(o0, 1, 0, b"x", None, None, 3, 100).unwrap();
        assert_eq!(r.ready.len(), 3);
        let late = r.drop_late(0, d + Duration::from_millis(5));
        assert_eq!(
            late.iter()
                .map(|s| (s.id, s.late_by, s.release))
                .collect::<Vec<_>>(),
            vec![(o1, Duration::from_millis(5), credit_cost(2))]
        );
        assert_eq!(
            r.ready.iter().map(|m| m.id).collect::<Vec<_>>(),
            vec![o0, o2]
        );
        // At its deadline exactly a message is still on time; only those from `from` on are
        // looked at.
        r.on_fragment(MessageId::new(false, 0), 1, 0, b"u", Some(d), None, 3, 100)
            .unwrap();
        assert!(r.drop_late(0, d).is_empty());
        let later = d + Duration::from_millis(1);
        assert!(r.drop_late(3, later).is_empty());
        assert_eq!(r.drop_late(2, later).len(), 1);
        assert_eq!(r.ready.len(), 2);
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
    fn empty_messages_still_cost_credit() {
        // Without the overhead, empty ordered messages waiting for a missing first one
        // would each hold an entry for no credit at all.
        let mut r = MessageReceiver::default();
        for seq in 1..100 {
            let got = r.on_fragment(MessageId::new(true, seq), 0, 0, b"", None, None, 3, 100);
            assert_eq!(got, Ok(crate::message::MESSAGE_CREDIT_OVERHEAD));
        }
        assert_eq!(r.buffered().count, 99);
    }

    #[test]
    fn skips_for_unseen_messages_hold_no_entries() {
        // A flood of skips for messages never seen, above a missing first one: what they
        // cost is ranges of finished IDs (bounded by the connection), not map entries.
        let mut r = MessageReceiver::default();
        for seq in 1..1000 {
            r.on_skip(MessageId::new(true, seq), 0);
        }
        assert_eq!(r.buffered().count, 0);
        assert_eq!(r.ranges(), 1, "contiguous skips are one range");
        for seq in (2000..4000).step_by(2) {
            r.on_skip(MessageId::new(false, seq), 0);
        }
        assert_eq!(r.ranges(), 1001, "sparse ones are one range each");
        // The first ordered one arrives: everything below is released, one range left.
        r.on_fragment(MessageId::new(true, 0), 1, 0, b"x", None, None, 3, 100)
            .unwrap();
        assert_eq!(r.ranges(), 1000);
        assert_eq!(r.ready.len(), 1);
    }

    #[test]
    fn tiny_fragments_in_descending_order_are_coalesced() {
        // The first byte withheld, the others last to first: few chunks, not one per byte.
        let mut r = MessageReceiver::default();
        let id = MessageId::new(false, 0);
        for i in (1..4000u64).rev() {
            r.on_fragment(id, 4000, i, &[i as u8], None, None, 3, 10_000)
                .unwrap();
        }
        assert_eq!(r.ranges(), 1);
        let chunks = r.partial.get(&id).map_or(0, |m| m.chunks.len());
        assert!(
            chunks <= 4000 / crate::flow::recv::COALESCE_BELOW + 2,
            "{chunks}"
        );
        r.on_fragment(id, 4000, 0, &[0], None, None, 3, 10_000)
            .unwrap();
        let m = r.ready.pop_front().expect("complete");
        assert!(m.data.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn tiny_fragments_are_coalesced_and_gaps_counted() {
        let mut r = MessageReceiver::default();
        let id = MessageId::new(false, 0);
        // One byte at a time, in order: one range, few chunks.
        for i in 0..1000u64 {
            r.on_fragment(id, 4000, i, b"a", None, None, 3, 10_000)
                .unwrap();
        }
        assert_eq!(r.ranges(), 1, "one range");
        let chunks = r.partial.get(&id).map_or(0, |m| m.chunks.len());
        assert!(
            chunks <= 1000 / crate::flow::recv::COALESCE_BELOW + 1,
            "{chunks}"
        );
        // Every other byte: a range each, which the connection counts and bounds.
        for i in (2000..3000u64).step_by(2) {
            r.on_fragment(id, 4000, i, b"b", None, None, 3, 10_000)
                .unwrap();
        }
        assert_eq!(r.ranges(), 1 + 500);
        assert_eq!(r.held, 1500);
        // Complete and taken: nothing left.
        r.on_fragment(id, 4000, 0, &[b'c'; 4000], None, None, 3, 10_000)
            .unwrap();
        assert_eq!(r.ranges(), 1, "only the finished ID's");
        let m = r.ready.pop_front().unwrap();
        assert_eq!(&m.data[..1000], &[b'a'; 1000][..]);
        assert_eq!(m.data[2000], b'b');
        assert_eq!(m.data[2001], b'c');
        assert_eq!(r.buffered(), Buffered::default());
    }

    proptest::proptest! {
        /// Fragments of a few messages in any order, duplicated and overlapping: every
        /// message arrives intact, ordered ones in order, and the counters of what is held
        /// (bytes, ranges) match the state and come back to nothing.
        #[test]
        fn any_fragment_order_reassembles_and_accounts(
            sizes in proptest::collection::vec(0usize..3000, 1..6),
            cuts in proptest::collection::vec((0usize..6, 0usize..3000, 1usize..700), 1..80),
        ) {
            let msgs: Vec<(MessageId, Vec<u8>)> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let id = MessageId::new(i % 2 == 0, (i / 2) as u64);
                    (id, (0..n).map(|b| (b * 7 + i) as u8).collect())
                })
                .collect();
            let mut r = MessageReceiver::default();
            let mut pieces: Vec<(usize, usize, usize)> = cuts
                .iter()
                .map(|&(m, s, l)| {
                    let m = m % msgs.len();
                    let n = msgs[m].1.len();
                    let s = if n == 0 { 0 } else { s % n };
                    (m, s, (s + l).min(n))
                })
                .collect();
            // Everything is covered at least once, at the end.
            pieces.extend((0..msgs.len()).map(|m| (m, 0, msgs[m].1.len())));
            let mut credit = 0;
            for (m, s, e) in pieces {
                let (id, data) = &msgs[m];
                credit += r
                    .on_fragment(*id, data.len() as u64, s as u64, &data[s..e], None, None, 3, 1 << 20)
                    .unwrap();
                let partial: usize = r.partial.values().map(|p| p.received.len()).sum();
                proptest::prop_assert_eq!(r.partial_ranges, partial);
                let held: u64 = r.partial.values().map(|p| p.received.total()).sum::<u64>()
                    + r.ordered_done.values().map(|m| m.data.len() as u64).sum::<u64>();
                proptest::prop_assert_eq!(r.held, held);
            }
            let total: u64 = msgs.iter().map(|(_, d)| credit_cost(d.len() as u64)).sum();
            proptest::prop_assert_eq!(credit, total, "each message counted once, whole");
            proptest::prop_assert_eq!(r.ready.len(), msgs.len());
            let mut last_ordered = None;
            for m in &r.ready {
                let data = &msgs.iter().find(|(id, _)| *id == m.id).unwrap().1;
                proptest::prop_assert_eq!(&m.data[..], &data[..]);
                if m.id.is_ordered() {
                    proptest::prop_assert!(last_ordered < Some(m.id.seq()));
                    last_ordered = Some(m.id.seq());
                }
            }
            proptest::prop_assert_eq!(r.held, 0);
            proptest::prop_assert_eq!(r.partial_ranges, 0);
        }
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
