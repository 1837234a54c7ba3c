//! The sending side of messages: fragments by priority, resends, deadlines.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{MessageId, MessageOptions, PRIORITIES};
use crate::recovery::RangeSet;

#[derive(Debug)]
struct OutMessage {
    data: Bytes,
    priority: u8,
    deadline: Option<Instant>,
    reply_to: Option<MessageId>,
    /// Next offset never sent.
    unsent: u64,
    retransmit: RangeSet,
    acked: RangeSet,
    /// Connection credit for the whole message was taken when its first fragment left, so
    /// that every started message can finish: interleaved messages can never exhaust the
    /// receiver's credit with halves that wait for each other.
    reserved: bool,
}

impl OutMessage {
    fn total(&self) -> u64 {
        self.data.len() as u64
    }

    fn has_pending(&self) -> bool {
        !self.retransmit.is_empty()
            || self.unsent < self.total()
            || self.total() == 0 && self.unsent == 0
    }
}

/// One fragment to put in a packet.
#[derive(Debug, Clone)]
pub(crate) struct Fragment {
    pub(crate) id: MessageId,
    pub(crate) priority: u8,
    pub(crate) total: u64,
    pub(crate) offset: u64,
    pub(crate) data: Bytes,
    pub(crate) deadline_left: Option<Duration>,
    pub(crate) reply_to: Option<MessageId>,
    /// Credit taken by this fragment (the whole message, on its first fragment).
    pub(crate) new_bytes: u64,
    /// The fragment is a resend.
    pub(crate) resend: bool,
}

/// Messages of one priority that may be in progress at once. Equal priorities share the
/// link among these; the rest wait their turn, which bounds both the credit reserved by
/// started messages and the latency of each.
pub(crate) const ACTIVE_PER_PRIORITY: usize = 4;

/// All messages being sent on a connection.
#[derive(Debug, Default)]
pub(crate) struct MessageSender {
    msgs: BTreeMap<MessageId, OutMessage>,
    /// Started messages with something to send, round-robin within each priority.
    ready: [VecDeque<MessageId>; PRIORITIES],
    /// Messages not started yet, in order, per priority.
    queued: [VecDeque<MessageId>; PRIORITIES],
    /// Started messages not yet acknowledged or given up, per priority.
    active: [usize; PRIORITIES],
    next_seq: [u64; 2],
    /// Abandoned messages whose MessageSkip must be (re)sent, with the credit counted for
    /// each (its size if it was started, else 0).
    pub(crate) skips: VecDeque<(MessageId, u64)>,
}

impl MessageSender {
    /// Queues a message.
    pub(crate) fn push(&mut self, now: Instant, data: Bytes, opts: MessageOptions) -> MessageId {
        let kind = usize::from(!opts.ordered);
        let id = MessageId::new(opts.ordered, self.next_seq[kind]);
        self.next_seq[kind] += 1;
        let priority = opts.priority.min(PRIORITIES as u8 - 1);
        self.msgs.insert(
            id,
            OutMessage {
                data,
                priority,
                deadline: opts.deadline.map(|d| now + d),
                reply_to: opts.reply_to,
                unsent: 0,
                retransmit: RangeSet::new(),
                acked: RangeSet::new(),
                reserved: false,
            },
        );
        self.queued[usize::from(priority)].push_back(id);
        id
    }

    /// Whether any fragment or skip is waiting.
    pub(crate) fn has_pending(&self) -> bool {
        !self.skips.is_empty()
            || self.ready.iter().any(|q| !q.is_empty())
            || self.queued.iter().any(|q| !q.is_empty())
    }

    /// The next fragment, highest priority first, at most `max` data bytes. A message starts
    /// only when `credit` covers all of it (its credit is then reserved and reported in
    /// `new_bytes` of that first fragment). Equal priorities take turns.
    pub(crate) fn next_fragment(
        &mut self,
        now: Instant,
        max: u64,
        credit: u64,
    ) -> Option<Fragment> {
        for p in (0..PRIORITIES).rev() {
            // Start waiting messages while fewer than the limit are in progress.
            while self.active[p] < ACTIVE_PER_PRIORITY {
                let Some(id) = self.queued[p].pop_front() else {
                    break;
                };
                self.active[p] += 1;
                self.ready[p].push_back(id);
            }
            let mut tries = self.ready[p].len();
            while tries > 0 {
                tries -= 1;
                let id = self.ready[p].pop_front()?;
                let Some(m) = self.msgs.get_mut(&id) else {
                    continue;
                };
                let mut new_bytes = 0;
                if !m.reserved {
                    if m.total() > credit {
                        // Not enough credit to finish it: let others go, try again later.
                        self.ready[p].push_back(id);
                        continue;
                    }
                    m.reserved = true;
                    new_bytes = m.total();
                }
                let (offset, len, resend) = if let Some(r) = m.retransmit.pop_front(max) {
                    (r.start, r.end - r.start, true)
                } else {
                    let len = (m.total() - m.unsent).min(max);
                    let off = m.unsent;
                    m.unsent += len;
                    (off, len, false)
                };
                // An empty message is one empty fragment.
                if m.total() == 0 {
                    m.unsent = 1;
                }
                let frag = Fragment {
                    id,
                    priority: m.priority,
                    total: m.total(),
                    offset,
                    data: m.data.slice(offset as usize..(offset + len) as usize),
                    deadline_left: m.deadline.map(|d| d.saturating_duration_since(now)),
                    reply_to: m.reply_to,
                    new_bytes,
                    resend,
                };
                if m.has_pending() {
                    self.ready[p].push_back(id);
                }
                return Some(frag);
            }
        }
        None
    }

    /// A fragment was acknowledged; returns true when the whole message is.
    pub(crate) fn on_acked(&mut self, id: MessageId, offset: u64, len: u64) -> bool {
        let Some(m) = self.msgs.get_mut(&id) else {
            return false;
        };
        m.acked.insert(offset..offset + len.max(1));
        m.retransmit.remove(offset..offset + len);
        let done = m.acked.contains_range(0..m.total().max(1));
        if done {
            let p = usize::from(m.priority);
            self.msgs.remove(&id);
            self.ready[p].retain(|x| *x != id);
            self.active[p] = self.active[p].saturating_sub(1);
        }
        done
    }

    /// A fragment was lost: queue it again (unless the message was given up).
    pub(crate) fn on_lost(&mut self, id: MessageId, offset: u64, len: u64) {
        let Some(m) = self.msgs.get_mut(&id) else {
            return;
        };
        let was_pending = m.has_pending();
        if m.total() == 0 {
            m.unsent = 0;
        } else {
            m.retransmit.insert(offset..offset + len);
            for a in m.acked.iter().collect::<Vec<_>>() {
                m.retransmit.remove(a);
            }
        }
        if !was_pending && m.has_pending() {
            self.ready[usize::from(m.priority)].push_back(id);
        }
    }

    /// Gives up messages whose deadline passed; returns them with how late they are.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<(MessageId, Duration)> {
        let expired: Vec<(MessageId, Duration)> = self
            .msgs
            .iter()
            .filter_map(|(id, m)| {
                let d = m.deadline?;
                (d <= now).then(|| (*id, now - d))
            })
            .collect();
        for (id, _) in &expired {
            let Some(m) = self.msgs.remove(id) else {
                continue;
            };
            let p = usize::from(m.priority);
            let started = !self.queued[p].contains(id);
            self.ready[p].retain(|x| x != id);
            self.queued[p].retain(|x| x != id);
            if started {
                self.active[p] = self.active[p].saturating_sub(1);
            }
            // Even a message never sent needs a skip: the receiver expects its number (ordered).
            let credit = if m.reserved { m.total() } else { 0 };
            self.skips.push_back((*id, credit));
        }
        expired
    }

    /// Messages not yet acknowledged in full nor given up.
    pub(crate) fn outstanding(&self) -> usize {
        self.msgs.len()
    }

    /// The earliest deadline among messages still being sent.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.msgs.values().filter_map(|m| m.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        crate::cc::testing::epoch()
    }

    #[test]
    fn higher_priority_leaves_first_and_equal_ones_share() {
        let t = now();
        let mut s = MessageSender::default();
        let low = s.push(
            t,
            Bytes::from(vec![0; 3000]),
            MessageOptions::default().priority(1),
        );
        let a = s.push(
            t,
            Bytes::from(vec![1; 3000]),
            MessageOptions::default().priority(5),
        );
        let b = s.push(
            t,
            Bytes::from(vec![2; 3000]),
            MessageOptions::default().priority(5),
        );
        let order: Vec<MessageId> = std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX))
            .map(|f| f.id)
            .collect();
        assert_eq!(&order[..6], &[a, b, a, b, a, b]);
        assert!(order[6..].iter().all(|id| *id == low));
        // A lost high-priority fragment is resent before low-priority data.
        let mut s = MessageSender::default();
        let low = s.push(
            t,
            Bytes::from(vec![0; 5000]),
            MessageOptions::default().priority(0),
        );
        let hi = s.push(
            t,
            Bytes::from(vec![1; 500]),
            MessageOptions::default().priority(7),
        );
        let f = s.next_fragment(t, 1000, u64::MAX).unwrap();
        assert_eq!(f.id, hi);
        let _ = s.next_fragment(t, 1000, u64::MAX).unwrap();
        s.on_lost(hi, 0, 500);
        assert_eq!(s.next_fragment(t, 1000, u64::MAX).unwrap().id, hi);
        assert_eq!(s.next_fragment(t, 1000, u64::MAX).unwrap().id, low);
    }

    #[test]
    fn deadlines_expire_and_queue_a_skip() {
        let t = now();
        let mut s = MessageSender::default();
        let id = s.push(
            t,
            Bytes::from(vec![0; 100]),
            MessageOptions::default().deadline(Duration::from_millis(50)),
        );
        assert_eq!(s.next_deadline(), Some(t + Duration::from_millis(50)));
        assert!(s.expire(t + Duration::from_millis(10)).is_empty());
        let gone = s.expire(t + Duration::from_millis(60));
        assert_eq!(gone, vec![(id, Duration::from_millis(10))]);
        assert_eq!(
            s.skips.front(),
            Some(&(id, 0)),
            "never started: no credit taken"
        );
        assert!(s.next_fragment(t, 1000, u64::MAX).is_none());
    }

    #[test]
    fn ids_number_ordered_and_unordered_separately() {
        let t = now();
        let mut s = MessageSender::default();
        let a = s.push(t, Bytes::new(), MessageOptions::default());
        let b = s.push(t, Bytes::new(), MessageOptions::default().unordered());
        let c = s.push(t, Bytes::new(), MessageOptions::default());
        assert!(a.is_ordered() && !b.is_ordered() && c.is_ordered());
        assert_eq!((a.seq(), b.seq(), c.seq()), (0, 0, 1));
        // Empty messages still send one fragment and complete on its ACK.
        let f = s.next_fragment(t, 1000, u64::MAX).unwrap();
        assert_eq!(f.data.len(), 0);
        assert!(s.on_acked(f.id, 0, 0));
    }
}
