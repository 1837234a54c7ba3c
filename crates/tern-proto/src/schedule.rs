//! Which of an endpoint's connections have work, so that polling an endpoint costs what is
//! active, not what is open: 100 000 idle connections must not be scanned on every datagram.
//!
//! A connection changes only when the endpoint hands it a datagram, runs its timer, or gives
//! it to the application (`Endpoint::connection_mut`); each of these *touches* it. A touched
//! connection is queued for `poll_transmit` and `poll_event` (and leaves each queue when it
//! has nothing more), and its timer is re-read before the next `poll_timeout`; so is the
//! timer of a connection asked for a datagram, whether it had one or not. Timers live in
//! a binary heap with lazy deletion: an entry is live only while it matches the deadline
//! recorded for its slot, and the heap is rebuilt when stale entries outnumber live ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

/// A FIFO of connection slots, each at most once.
#[derive(Debug, Default)]
struct SlotQueue {
    queue: VecDeque<usize>,
    queued: Vec<bool>,
}

impl SlotQueue {
    fn push(&mut self, idx: usize) {
        if self.queued.len() <= idx {
            self.queued.resize(idx + 1, false);
        }
        if !self.queued[idx] {
            self.queued[idx] = true;
            self.queue.push_back(idx);
        }
    }

    fn front(&self) -> Option<usize> {
        self.queue.front().copied()
    }

    /// Removes the front slot (it has nothing more to give) and returns it.
    fn pop(&mut self) -> Option<usize> {
        let idx = self.queue.pop_front()?;
        self.queued[idx] = false;
        Some(idx)
    }

    /// Moves the front slot to the back (round robin).
    fn rotate(&mut self) {
        if let Some(idx) = self.queue.pop_front() {
            self.queue.push_back(idx);
        }
    }

    /// The queued slots, front first, if there are at most `n`.
    fn if_at_most(&self, n: usize) -> Option<impl Iterator<Item = usize> + '_> {
        (self.queue.len() <= n).then(|| self.queue.iter().copied())
    }

    fn take_all(&mut self) -> impl Iterator<Item = usize> + '_ {
        let queued = &mut self.queued;
        self.queue.drain(..).inspect(move |&i| queued[i] = false)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len()
    }
}

/// The endpoint's work queues and timer heap (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    transmit: SlotQueue,
    events: SlotQueue,
    /// Touched since their timer was last read.
    stale: SlotQueue,
    /// The deadline each slot's live heap entry holds.
    armed: Vec<Option<Instant>>,
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
    /// How many slots are armed (live heap entries).
    live: usize,
}

impl Schedule {
    /// A connection in `idx` may have something to send, an event, or a new deadline.
    pub(crate) fn touch(&mut self, idx: usize) {
        self.transmit.push(idx);
        self.events.push(idx);
        self.stale.push(idx);
    }

    /// Its deadline may have moved (it sent), but nothing else changed.
    pub(crate) fn touch_timer(&mut self, idx: usize) {
        self.stale.push(idx);
    }

    /// A new connection takes slot `idx` (which may have held an older one).
    pub(crate) fn occupy(&mut self, idx: usize) {
        if self.armed.len() <= idx {
            self.armed.resize(idx + 1, None);
        }
        self.disarm(idx);
        self.touch(idx);
    }

    /// The slot is empty now: its heap entry, if any, is dead.
    pub(crate) fn vacate(&mut self, idx: usize) {
        self.disarm(idx);
    }

    fn disarm(&mut self, idx: usize) {
        if let Some(a) = self.armed.get_mut(idx) {
            if a.take().is_some() {
                self.live -= 1;
            }
        }
    }

    /// The slot to ask for a datagram next (round robin between those with work).
    pub(crate) fn next_transmit(&self) -> Option<usize> {
        self.transmit.front()
    }

    /// The slot from `next_transmit` sent a datagram: it goes to the back of the queue.
    pub(crate) fn transmitted(&mut self, idx: usize) {
        self.transmit.rotate();
        self.touch_timer(idx);
    }

    /// The slot from `next_transmit` has nothing to send until touched again. Asking it may
    /// have moved its deadline all the same (a pacer that refused a packet sets when it may
    /// leave), so its timer is re-read: otherwise a sender with nothing in flight, whose pacer
    /// said "not yet", would sleep until its idle timeout.
    pub(crate) fn transmit_idle(&mut self) {
        if let Some(idx) = self.transmit.pop() {
            self.stale.push(idx);
        }
    }

    /// The slot to ask for an event next.
    pub(crate) fn next_event(&self) -> Option<usize> {
        self.events.front()
    }

    /// The slots that may have an event, if there are at most `n` of them (`None`: more).
    pub(crate) fn event_candidates(&self, n: usize) -> Option<impl Iterator<Item = usize> + '_> {
        self.events.if_at_most(n)
    }

    /// The slot from `next_event` has no event until touched again.
    pub(crate) fn events_idle(&mut self) {
        self.events.pop();
    }

    /// Re-reads the deadline of every slot touched since the last call, with `deadline`
    /// giving a slot's current one.
    pub(crate) fn refresh(&mut self, mut deadline: impl FnMut(usize) -> Option<Instant>) {
        let Self {
            stale,
            armed,
            heap,
            live,
            ..
        } = self;
        for idx in stale.take_all() {
            if armed.len() <= idx {
                armed.resize(idx + 1, None);
            }
            let t = deadline(idx);
            if t != armed[idx] {
                match (armed[idx], t) {
                    (None, Some(_)) => *live += 1,
                    (Some(_), None) => *live -= 1,
                    _ => {}
                }
                armed[idx] = t;
                if let Some(t) = t {
                    heap.push(Reverse((t, idx)));
                }
            }
        }
        self.compact();
    }

    /// The earliest live deadline (after [`Schedule::refresh`]).
    pub(crate) fn earliest(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, idx))) = self.heap.peek() {
            if self.armed.get(idx) == Some(&Some(t)) {
                return Some(t);
            }
            self.heap.pop();
        }
        None
    }

    /// Takes the next slot whose deadline is at or before `now` (after `refresh`); its
    /// deadline is disarmed and it is touched, so it is read again at the next refresh.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Option<usize> {
        let t = self.earliest()?;
        if t > now {
            return None;
        }
        let Reverse((_, idx)) = self.heap.pop()?;
        self.disarm(idx);
        self.touch(idx);
        Some(idx)
    }

    /// Rebuilds the heap from the live deadlines once dead entries outnumber them: every
    /// datagram sent can move a loss timer, and each move leaves an entry behind.
    fn compact(&mut self) {
        if self.heap.len() <= 2 * self.live + 1024 {
            return;
        }
        self.heap = self
            .armed
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.map(|t| Reverse((t, i))))
            .collect();
    }

    /// Slots queued for `poll_transmit` (for tests and stats).
    #[cfg(test)]
    fn transmit_len(&self) -> usize {
        self.transmit.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An arbitrary instant: only offsets from it matter.
    fn epoch() -> Instant {
        #[allow(clippy::disallowed_methods)]
        Instant::now()
    }

    #[test]
    fn touched_slots_are_polled_round_robin_once_each() {
        let mut s = Schedule::default();
        for i in [3, 1, 3, 2] {
            s.touch(i);
        }
        assert_eq!(s.transmit_len(), 3);
        // 3 sends, then 1 sends, then 2 is idle, then 3 again.
        assert_eq!(s.next_transmit(), Some(3));
        s.transmitted(3);
        assert_eq!(s.next_transmit(), Some(1));
        s.transmitted(1);
        assert_eq!(s.next_transmit(), Some(2));
        s.transmit_idle();
        assert_eq!(s.next_transmit(), Some(3));
        s.transmit_idle();
        s.transmit_idle();
        assert_eq!(s.next_transmit(), None);
        s.touch(2);
        assert_eq!(s.next_transmit(), Some(2));
    }

    #[test]
    fn a_slot_asked_in_vain_has_its_timer_read_again() {
        // Asking a connection for a datagram can move its deadline even when it sends
        // nothing (its pacer sets when the next packet may leave).
        let t0 = epoch();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut deadline = Some(ms(30_000));
        let mut s = Schedule::default();
        s.occupy(0);
        s.refresh(|_| deadline);
        assert_eq!(s.next_transmit(), Some(0));
        deadline = Some(ms(2));
        s.transmit_idle();
        s.refresh(|_| deadline);
        assert_eq!(s.earliest(), Some(ms(2)));
    }

    #[test]
    fn timers_fire_in_order_and_moved_deadlines_leave_no_live_entry() {
        let t0 = epoch();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut deadlines = [Some(ms(30)), Some(ms(10)), None, Some(ms(20))];
        let mut s = Schedule::default();
        for i in 0..4 {
            s.occupy(i);
        }
        s.refresh(|i| deadlines[i]);
        assert_eq!(s.earliest(), Some(ms(10)));
        // Slot 1's deadline moves later; slot 3's is cancelled.
        deadlines[1] = Some(ms(40));
        deadlines[3] = None;
        s.touch_timer(1);
        s.touch_timer(3);
        s.refresh(|i| deadlines[i]);
        assert_eq!(s.earliest(), Some(ms(30)));
        assert_eq!(s.pop_expired(ms(29)), None);
        assert_eq!(s.pop_expired(ms(35)), Some(0));
        assert_eq!(s.pop_expired(ms(35)), None);
        deadlines[0] = None;
        s.refresh(|i| deadlines[i]);
        assert_eq!(s.pop_expired(ms(100)), Some(1));
        assert_eq!(s.pop_expired(ms(100)), None);
    }

    #[test]
    fn a_reused_slot_does_not_inherit_the_old_deadline() {
        let t0 = epoch();
        let mut s = Schedule::default();
        s.occupy(0);
        s.refresh(|_| Some(t0));
        s.vacate(0);
        assert_eq!(s.earliest(), None);
        s.occupy(0);
        s.refresh(|_| None);
        assert_eq!(s.pop_expired(t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn the_heap_stays_bounded_when_one_deadline_moves_on_every_send() {
        let t0 = epoch();
        let mut s = Schedule::default();
        s.occupy(0);
        for n in 0..100_000u64 {
            s.touch_timer(0);
            s.refresh(|_| Some(t0 + Duration::from_micros(n)));
        }
        assert!(s.heap.len() <= 1024 + 3, "heap grew to {}", s.heap.len());
        assert_eq!(s.earliest(), Some(t0 + Duration::from_micros(99_999)));
    }
}
