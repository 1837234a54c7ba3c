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
    /// Redundant messages: ranges sent once whose copy is still to go.
    copies: RangeSet,
    redundant: bool,
    /// Connection credit for the whole message was taken when its first fragment left, so
    /// that every started message can finish: interleaved messages can never exhaust the
    /// receiver's credit with halves that wait for each other.
    reserved: bool,
}

impl OutMessage {
    fn total(&self) -> u64 {
        self.data.len() as u64
    }

    /// Data not yet sent, or lost and to be sent again (redundant copies aside).
    fn has_data_to_send(&self) -> bool {
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
    /// The fragment is the planned copy of a redundant message.
    pub(crate) copy: bool,
}

/// What the sender knows of its path, to tell whether a message can still arrive in time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathEstimate {
    /// The shortest one-way trip: half the minimum RTT (a queue on the way back, common on
    /// an asymmetric link, must not make a message look hopeless).
    pub(crate) one_way: Duration,
    /// Smoothed round trip (with the window, the rate at which the path carries data).
    pub(crate) rtt: Duration,
    /// Congestion window in bytes.
    pub(crate) window: u64,
    /// The window still doubles every round trip.
    pub(crate) slow_start: bool,
}

impl PathEstimate {
    /// At the earliest, when `bytes` sent from now would have arrived: the one-way trip,
    /// plus the time the window needs to carry them once the window measures the path. In
    /// slow start it does not (it is still growing, or small because the sender was idle):
    /// counting it would give up messages that would have arrived, and the window, never
    /// used, would never grow.
    pub(crate) fn delivery_time(&self, bytes: u64) -> Duration {
        let transmit = if self.slow_start {
            Duration::ZERO
        } else {
            self.rtt.mul_f64(bytes as f64 / self.window.max(1) as f64)
        };
        self.one_way + transmit
    }
}

/// Messages of one priority that may be sending at once (a message stops counting when its
/// last byte has left, not when it is acknowledged, so this never limits the messages per
/// round trip). Equal priorities share the link among these; the rest wait their turn,
/// which bounds both the credit reserved by started messages and the latency of each.
pub(crate) const ACTIVE_PER_PRIORITY: usize = 4;

/// A queue of message IDs per priority, allocated when first written: a connection that
/// sends no message (most of 100 000 idle ones) carries a pointer, not 8 empty queues.
#[derive(Debug, Default)]
struct PerPriority(Option<Box<[VecDeque<MessageId>; PRIORITIES]>>);

static EMPTY_QUEUE: VecDeque<MessageId> = VecDeque::new();

impl PerPriority {
    fn iter(&self) -> impl Iterator<Item = &VecDeque<MessageId>> {
        self.0.iter().flat_map(|q| q.iter())
    }
}

impl std::ops::Index<usize> for PerPriority {
    type Output = VecDeque<MessageId>;
    fn index(&self, p: usize) -> &VecDeque<MessageId> {
        self.0.as_ref().map_or(&EMPTY_QUEUE, |q| &q[p])
    }
}

impl std::ops::IndexMut<usize> for PerPriority {
    fn index_mut(&mut self, p: usize) -> &mut VecDeque<MessageId> {
        &mut self.0.get_or_insert_with(Default::default)[p]
    }
}

/// All messages being sent on a connection.
#[derive(Debug, Default)]
pub(crate) struct MessageSender {
    msgs: BTreeMap<MessageId, OutMessage>,
    /// Started messages with something to send, per priority: those with a deadline go
    /// earliest deadline first, the others round-robin.
    ready: PerPriority,
    /// Redundant messages with copies still to send (sent only when nothing else waits).
    copy_ready: PerPriority,
    /// Messages not started yet, in order, per priority.
    queued: PerPriority,
    next_seq: [u64; 2],
    /// Abandoned messages whose MessageSkip must be (re)sent, with the credit counted for
    /// each (its size if it was started, else 0).
    pub(crate) skips: VecDeque<(MessageId, u64)>,
    /// Messages given up before they started because they could no longer arrive by their
    /// deadline, for the connection to report.
    pub(crate) hopeless: Vec<MessageId>,
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
                copies: RangeSet::new(),
                redundant: opts.redundant,
                reserved: false,
            },
        );
        self.queued[usize::from(priority)].push_back(id);
        id
    }

    /// Message bytes never sent yet (resends not counted): whether a probe train (F11) would
    /// carry data or padding.
    pub(crate) fn unsent_bytes(&self) -> u64 {
        self.msgs
            .values()
            .map(|m| (m.data.len() as u64).saturating_sub(m.unsent))
            .fold(0u64, u64::saturating_add)
    }

    /// Whether any fragment or skip is waiting.
    pub(crate) fn has_pending(&self) -> bool {
        !self.skips.is_empty()
            || self.ready.iter().any(|q| !q.is_empty())
            || self.copy_ready.iter().any(|q| !q.is_empty())
            || self.queued.iter().any(|q| !q.is_empty())
    }

    /// The next fragment, highest priority first, at most `max` data bytes. A message starts
    /// only when `credit` covers all of it (its credit is then reserved and reported in
    /// `new_bytes` of that first fragment). Within a priority, the message with the earliest
    /// deadline goes first (a late message is worthless, and sharing the link among several
    /// would make them all late); messages without a deadline take turns.
    ///
    /// A message with a deadline that could not arrive in time even if it left now (by
    /// `path`) is given up instead of started: sending it would only make the messages
    /// behind it late too. It is listed in `hopeless` and skipped like an expired one.
    pub(crate) fn next_fragment(
        &mut self,
        now: Instant,
        max: u64,
        credit: u64,
        path: &PathEstimate,
    ) -> Option<Fragment> {
        // Called for every packet built, flows-only connections included.
        if self.msgs.is_empty() {
            return None;
        }
        for p in (0..PRIORITIES).rev() {
            self.admit(p, now, path);
            if let Some(f) = self.fragment_from(p, false, now, max, credit) {
                return Some(f);
            }
        }
        // Room to spare: the copies of redundant messages, by priority and deadline.
        for p in (0..PRIORITIES).rev() {
            if let Some(f) = self.fragment_from(p, true, now, max, credit) {
                return Some(f);
            }
        }
        None
    }

    /// Starts waiting messages of priority `p` while fewer than the limit are sending;
    /// gives up those that could not arrive in time.
    fn admit(&mut self, p: usize, now: Instant, path: &PathEstimate) {
        while self.ready[p].len() < ACTIVE_PER_PRIORITY {
            let Some(id) = self.queued[p].pop_front() else {
                break;
            };
            let hopeless = self.msgs.get(&id).is_some_and(|m| {
                m.deadline
                    .is_some_and(|d| now + path.delivery_time(m.total()) > d)
            });
            if hopeless {
                self.msgs.remove(&id);
                self.skips.push_back((id, 0));
                self.hopeless.push(id);
                continue;
            }
            self.ready[p].push_back(id);
        }
    }

    /// The next fragment of priority `p`: from messages with data to send, or (`copies`)
    /// from redundant messages with copies to send. Earliest deadline first, then turns.
    fn fragment_from(
        &mut self,
        p: usize,
        copies: bool,
        now: Instant,
        max: u64,
        credit: u64,
    ) -> Option<Fragment> {
        let list = if copies {
            &self.copy_ready[p]
        } else {
            &self.ready[p]
        };
        if list.is_empty() {
            return None;
        }
        let can_go = |m: &OutMessage| m.reserved || super::credit_cost(m.total()) <= credit;
        let earliest = list
            .iter()
            .enumerate()
            .filter_map(|(i, id)| {
                let m = self.msgs.get(id)?;
                Some((m.deadline?, i)).filter(|_| can_go(m))
            })
            .min();
        let i = match earliest {
            Some((_, i)) => i,
            None => list
                .iter()
                .position(|id| self.msgs.get(id).is_some_and(can_go))?,
        };
        let id = if copies {
            self.copy_ready[p].remove(i)?
        } else {
            self.ready[p].remove(i)?
        };
        let m = self.msgs.get_mut(&id)?;
        let mut new_bytes = 0;
        if !m.reserved {
            m.reserved = true;
            new_bytes = super::credit_cost(m.total());
        }
        let (offset, len, resend, copy) = if copies {
            let r = m.copies.pop_front(max)?;
            (r.start, r.end - r.start, false, true)
        } else if let Some(r) = m.retransmit.pop_front(max) {
            (r.start, r.end - r.start, true, false)
        } else {
            let len = (m.total() - m.unsent).min(max);
            let off = m.unsent;
            m.unsent += len;
            if m.redundant && len > 0 {
                m.copies.insert(off..off + len);
            }
            (off, len, false, false)
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
            copy,
        };
        if !copies && m.has_data_to_send() {
            self.ready[p].push_back(id);
        }
        if !m.copies.is_empty() && !self.copy_ready[p].contains(&id) {
            self.copy_ready[p].push_back(id);
        }
        Some(frag)
    }

    /// A fragment was acknowledged; returns true when the whole message is.
    pub(crate) fn on_acked(&mut self, id: MessageId, offset: u64, len: u64) -> bool {
        let Some(m) = self.msgs.get_mut(&id) else {
            return false;
        };
        m.acked.insert(offset..offset + len.max(1));
        m.retransmit.remove(offset..offset + len);
        m.copies.remove(offset..offset + len);
        let done = m.acked.contains_range(0..m.total().max(1));
        if done {
            let p = usize::from(m.priority);
            self.msgs.remove(&id);
            self.ready[p].retain(|x| *x != id);
            self.copy_ready[p].retain(|x| *x != id);
        }
        done
    }

    /// A fragment was lost: queue it again (unless the message was given up).
    pub(crate) fn on_lost(&mut self, id: MessageId, offset: u64, len: u64) {
        let Some(m) = self.msgs.get_mut(&id) else {
            return;
        };
        let was_pending = m.has_data_to_send();
        if m.total() == 0 {
            m.unsent = 0;
        } else {
            m.retransmit.insert(offset..offset + len);
            for a in m.acked.iter().collect::<Vec<_>>() {
                m.retransmit.remove(a);
            }
        }
        if !was_pending && m.has_data_to_send() {
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
            self.ready[p].retain(|x| x != id);
            self.copy_ready[p].retain(|x| x != id);
            self.queued[p].retain(|x| x != id);
            // Even a message never sent needs a skip: the receiver expects its number (ordered).
            let credit = if m.reserved {
                super::credit_cost(m.total())
            } else {
                0
            };
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

    /// The earliest deadline among messages with data waiting to leave (what the next packet
    /// will carry), and the highest priority among them.
    pub(crate) fn waiting_urgency(&self) -> (Option<Instant>, Option<u8>) {
        let mut deadline = None::<Instant>;
        let mut priority = None::<u8>;
        for m in self.msgs.values().filter(|m| m.has_data_to_send()) {
            if let Some(d) = m.deadline {
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
            }
            priority = priority.max(Some(m.priority));
        }
        (deadline, priority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        crate::cc::testing::epoch()
    }

    /// A path on which everything arrives at once.
    fn fast() -> PathEstimate {
        PathEstimate {
            one_way: Duration::ZERO,
            rtt: Duration::ZERO,
            window: u64::MAX,
            slow_start: false,
        }
    }

    #[test]
    fn a_message_that_cannot_arrive_in_time_is_not_started() {
        let t = now();
        let ms = Duration::from_millis;
        // 40 ms round trip, 100 kB window: 1 MB takes 20 ms + 400 ms.
        let path = PathEstimate {
            one_way: ms(20),
            rtt: ms(40),
            window: 100_000,
            slow_start: false,
        };
        assert_eq!(path.delivery_time(1_000_000), ms(420));
        // In slow start the window says nothing of the path: only the one-way trip counts.
        let ss = PathEstimate {
            slow_start: true,
            ..path
        };
        assert_eq!(ss.delivery_time(1_000_000), ms(20));
        let mut s = MessageSender::default();
        let doomed = s.push(
            t,
            Bytes::from(vec![0; 1_000_000]),
            MessageOptions::default().deadline(ms(300)),
        );
        let fine = s.push(
            t,
            Bytes::from(vec![0; 1000]),
            MessageOptions::default().deadline(ms(300)),
        );
        let f = s.next_fragment(t, 1200, u64::MAX, &path).unwrap();
        assert_eq!(f.id, fine);
        assert_eq!(s.hopeless, [doomed]);
        assert_eq!(s.skips.front(), Some(&(doomed, 0)));
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
        let order: Vec<MessageId> =
            std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX, &fast()))
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
        let f = s.next_fragment(t, 1000, u64::MAX, &fast()).unwrap();
        assert_eq!(f.id, hi);
        let _ = s.next_fragment(t, 1000, u64::MAX, &fast()).unwrap();
        s.on_lost(hi, 0, 500);
        assert_eq!(s.next_fragment(t, 1000, u64::MAX, &fast()).unwrap().id, hi);
        assert_eq!(s.next_fragment(t, 1000, u64::MAX, &fast()).unwrap().id, low);
    }

    #[test]
    fn earliest_deadline_first_within_a_priority() {
        let t = now();
        let mut s = MessageSender::default();
        let ms = Duration::from_millis;
        let undated = s.push(t, Bytes::from(vec![0; 2000]), MessageOptions::default());
        let late = s.push(
            t,
            Bytes::from(vec![1; 2000]),
            MessageOptions::default().deadline(ms(100)),
        );
        let soon = s.push(
            t,
            Bytes::from(vec![2; 2000]),
            MessageOptions::default().deadline(ms(50)),
        );
        let order: Vec<MessageId> =
            std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX, &fast()))
                .map(|f| f.id)
                .collect();
        assert_eq!(order, [soon, soon, late, late, undated, undated]);
    }

    #[test]
    fn a_redundant_message_sends_each_fragment_twice() {
        let t = now();
        let mut s = MessageSender::default();
        s.push(
            t,
            Bytes::from(vec![7; 2500]),
            MessageOptions::default().redundant(),
        );
        let frags: Vec<(u64, usize, bool)> =
            std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX, &fast()))
                .map(|f| (f.offset, f.data.len(), f.copy))
                .collect();
        assert_eq!(
            frags,
            [
                (0, 1000, false),
                (1000, 1000, false),
                (2000, 500, false),
                (0, 1000, true),
                (1000, 1000, true),
                (2000, 500, true)
            ]
        );
        // An original acknowledged before its copy left needs no copy.
        let mut s = MessageSender::default();
        let id2 = s.push(
            t,
            Bytes::from(vec![7; 2000]),
            MessageOptions::default().redundant(),
        );
        let _ = s.next_fragment(t, 1000, u64::MAX, &fast());
        assert!(!s.on_acked(id2, 0, 1000));
        let rest: Vec<(u64, bool)> =
            std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX, &fast()))
                .map(|f| (f.offset, f.copy))
                .collect();
        assert_eq!(rest, [(1000, false), (1000, true)]);
    }

    #[test]
    fn many_messages_leave_without_waiting_for_acks() {
        // The sending limit counts messages with data left, not unacknowledged ones: ten
        // small messages all leave in one go (one round trip, not three).
        let t = now();
        let mut s = MessageSender::default();
        let ids: Vec<MessageId> = (0..10)
            .map(|i| s.push(t, Bytes::from(vec![i; 100]), MessageOptions::default()))
            .collect();
        let sent: Vec<MessageId> =
            std::iter::from_fn(|| s.next_fragment(t, 1000, u64::MAX, &fast()))
                .map(|f| f.id)
                .collect();
        assert_eq!(sent, ids);
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
        assert!(s.next_fragment(t, 1000, u64::MAX, &fast()).is_none());
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
        let f = s.next_fragment(t, 1000, u64::MAX, &fast()).unwrap();
        assert_eq!(f.data.len(), 0);
        assert!(s.on_acked(f.id, 0, 0));
    }
}
