//! The sending half of a flow: buffered bytes, what is unsent, what must be resent, what is
//! acknowledged (docs/PROTOCOL.md §10).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::recovery::RangeSet;

/// Buffers of acknowledged flow data kept for the next copies `Connection::write` makes.
///
/// A bulk sender that copies each write allocates a buffer per write and frees one per
/// acknowledgement. glibc's allocator answers that steady churn of 64 KiB blocks by giving
/// the top of its heap back to the kernel and faulting it in again (zeroed) on the next
/// writes: a fifth of the sender's CPU in `tern-bench run bulk`. A few buffers reused in
/// turn allocate nothing once the transfer runs. Emptied when a flow's buffer drains, so an
/// idle connection keeps none, and when a flow is reset (its data may never drain).
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    spare: Vec<BytesMut>,
}

impl BufferPool {
    /// Buffers kept at most.
    const KEPT: usize = 4;
    /// Larger buffers are not kept (one huge write should not pin its size).
    const MAX_KEPT_CAPACITY: usize = 256 * 1024;

    /// `data` in a buffer of its own, reused if one fits.
    pub(crate) fn copy(&mut self, data: &[u8]) -> Bytes {
        let mut buf = match self.spare.pop() {
            Some(b) if b.capacity() >= data.len() => b,
            _ => BytesMut::with_capacity(data.len()),
        };
        buf.clear();
        buf.extend_from_slice(data);
        buf.freeze()
    }

    /// Keeps `data`'s buffer for a later copy if nothing else holds it.
    pub(crate) fn recycle(&mut self, data: Bytes) {
        if self.spare.len() >= Self::KEPT {
            return;
        }
        if let Ok(buf) = data.try_into_mut() {
            if buf.capacity() <= Self::MAX_KEPT_CAPACITY {
                self.spare.push(buf);
            }
        }
    }

    /// Frees every kept buffer.
    pub(crate) fn clear(&mut self) {
        self.spare = Vec::new();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.spare.len()
    }
}

/// Sending state of one flow.
#[derive(Debug, Default)]
pub(crate) struct SendFlow {
    /// Buffered chunks with the flow offset of their first byte; the front is the oldest
    /// unacknowledged data. `true` marks a buffer the pool made (`Connection::write`'s
    /// copies), the only ones it takes back: an application's own `Bytes` may be a slice of
    /// a much larger allocation.
    chunks: VecDeque<(u64, Bytes, bool)>,
    /// Bytes written by the application (the next write's offset).
    pub(crate) written: u64,
    /// Next offset never sent before.
    pub(crate) unsent: u64,
    /// Ranges declared lost and waiting to be resent.
    pub(crate) retransmit: RangeSet,
    /// Acknowledged ranges (at or above the front of `chunks`).
    acked: RangeSet,
    /// Flow-control limit the peer granted (MaxFlowData).
    pub(crate) max_data: u64,
    /// The application finished the flow; FIN goes with offset `written`.
    pub(crate) fin: bool,
    /// FIN is in flight or must be (re)sent.
    pub(crate) fin_pending: bool,
    /// FIN was acknowledged, so the flow is fully delivered once all bytes are.
    pub(crate) fin_acked: bool,
    /// The flow was reset with this code; nothing more is sent but the ResetFlow frame.
    pub(crate) reset: Option<u64>,
    /// A ResetFlow frame must be (re)sent.
    pub(crate) reset_pending: bool,
    /// The ResetFlow frame was acknowledged: only then may the flow be dropped (a lost one
    /// is resent from the flow's state).
    pub(crate) reset_acked: bool,
    /// The peer asked us to stop with this code.
    pub(crate) stop_requested: Option<u64>,
    /// A FlowDataBlocked frame should be sent (we have data but no credit).
    pub(crate) blocked_pending: bool,
}

impl SendFlow {
    pub(crate) fn new(max_data: u64) -> Self {
        Self {
            max_data,
            ..Self::default()
        }
    }

    /// Bytes written but not yet acknowledged: what the send buffer holds.
    pub(crate) fn buffered(&self) -> u64 {
        self.written - self.chunks.front().map_or(self.written, |c| c.0)
    }

    /// Appends application data.
    /// Queues an application's `data` (tests; the connection says whether the pool made it).
    #[cfg(test)]
    pub(crate) fn write(&mut self, data: Bytes) {
        self.write_chunk(data, false);
    }

    /// Queues `data`; `pooled` if [`BufferPool::copy`] made it.
    pub(crate) fn write_chunk(&mut self, data: Bytes, pooled: bool) {
        if data.is_empty() {
            return;
        }
        let len = data.len() as u64;
        self.chunks.push_back((self.written, data, pooled));
        self.written += len;
    }

    /// Whether anything (data, resent data, FIN or RESET) is waiting to be sent.
    pub(crate) fn has_pending(&self) -> bool {
        if self.reset.is_some() {
            return self.reset_pending;
        }
        !self.retransmit.is_empty()
            || (self.unsent < self.written && self.unsent < self.max_data)
            || (self.fin_pending && self.unsent == self.written)
    }

    /// Whether new data is blocked only by flow-control credit.
    pub(crate) fn is_credit_blocked(&self) -> bool {
        self.reset.is_none() && self.unsent < self.written && self.unsent >= self.max_data
    }

    /// Picks the next range to send, at most `max` bytes and within `conn_credit` new bytes:
    /// resent data first, then new data. Returns (offset, len, fin, is_new).
    pub(crate) fn next_range(&mut self, max: u64, conn_credit: u64) -> Option<(u64, u64, bool)> {
        if self.reset.is_some() {
            return None;
        }
        if let Some(range) = self.retransmit.pop_front(max) {
            let fin = self.fin && range.end == self.written && self.fin_pending;
            return Some((range.start, range.end - range.start, fin));
        }
        let limit = self.written.min(self.max_data);
        let len = (limit.saturating_sub(self.unsent))
            .min(max)
            .min(conn_credit);
        let fin = self.fin && self.fin_pending && self.unsent + len == self.written;
        if len == 0 && !fin {
            return None;
        }
        let offset = self.unsent;
        self.unsent += len;
        Some((offset, len, fin))
    }

    /// Copies `[offset, offset + len)` of the buffered data into `out`.
    pub(crate) fn copy_range(&self, offset: u64, len: u64, out: &mut Vec<u8>) {
        let mut want = offset..offset + len;
        // Chunks are sorted by offset: find the first one that may hold `offset`.
        let idx = self
            .chunks
            .partition_point(|(start, data, _)| start + data.len() as u64 <= want.start);
        for (start, data, _) in self.chunks.range(idx..) {
            if want.is_empty() || *start >= want.end {
                break;
            }
            let from = (want.start - start) as usize;
            let to = ((want.end - start) as usize).min(data.len());
            out.extend_from_slice(&data[from..to]);
            want.start = start + to as u64;
        }
    }

    /// A sent range was acknowledged; frees buffered data that is now contiguous, its
    /// buffers into `pool`.
    pub(crate) fn ack(&mut self, offset: u64, len: u64, fin: bool, pool: &mut BufferPool) {
        if fin {
            self.fin_acked = true;
            self.fin_pending = false;
        }
        if len == 0 {
            return;
        }
        self.acked.insert(offset..offset + len);
        self.retransmit.remove(offset..offset + len);
        while let Some((start, data, _)) = self.chunks.front() {
            let end = start + data.len() as u64;
            if self.acked.contains_range(*start..end) {
                if let Some((_, data, true)) = self.chunks.pop_front() {
                    pool.recycle(data);
                }
            } else {
                break;
            }
        }
        // Forget acknowledged ranges below the buffer; they can never be asked for again.
        let front = self.chunks.front().map_or(self.written, |c| c.0);
        self.acked.remove(0..front);
    }

    /// A sent range was lost: queue what of it is still unacknowledged.
    pub(crate) fn lost(&mut self, offset: u64, len: u64, fin: bool) {
        if self.reset.is_some() {
            return;
        }
        if fin && !self.fin_acked {
            self.fin_pending = true;
        }
        let front = self.chunks.front().map_or(self.written, |c| c.0);
        let start = offset.max(front);
        let end = offset + len;
        if start >= end {
            return;
        }
        // Only the parts not acknowledged meanwhile (by a later copy): a walk over this
        // range's acknowledged ranges, not over every range the flow has.
        for hole in self.acked.holes(start..end) {
            self.retransmit.insert(hole);
        }
    }

    /// Everything, FIN included, was acknowledged.
    pub(crate) fn is_done(&self) -> bool {
        self.fin_acked && self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_ack_lose_resend() {
        let mut f = SendFlow::new(100);
        f.write(Bytes::from_static(b"hello world"));
        f.fin = true;
        f.fin_pending = true;
        let (o, l, fin) = f.next_range(5, u64::MAX).unwrap();
        assert_eq!((o, l, fin), (0, 5, false));
        let (o2, l2, fin2) = f.next_range(100, u64::MAX).unwrap();
        assert_eq!((o2, l2, fin2), (5, 6, true));
        f.lost(0, 5, false);
        let mut out = Vec::new();
        let (o3, l3, _) = f.next_range(100, u64::MAX).unwrap();
        f.copy_range(o3, l3, &mut out);
        assert_eq!(out, b"hello");
        let mut pool = BufferPool::default();
        f.ack(0, 5, false, &mut pool);
        f.ack(5, 6, true, &mut pool);
        assert!(f.is_done());
        assert_eq!(f.buffered(), 0);
    }

    #[test]
    fn credit_limits_new_data() {
        let mut f = SendFlow::new(4);
        f.write(Bytes::from_static(b"abcdefgh"));
        assert_eq!(f.next_range(100, u64::MAX), Some((0, 4, false)));
        assert!(f.next_range(100, u64::MAX).is_none());
        assert!(f.is_credit_blocked());
        f.max_data = 8;
        assert_eq!(
            f.next_range(100, 2),
            Some((4, 2, false)),
            "connection credit"
        );
    }

    #[test]
    fn acknowledged_copies_are_reused_and_shared_or_huge_buffers_are_not() {
        let mut pool = BufferPool::default();
        let mut f = SendFlow::new(u64::MAX);
        let first = pool.copy(&[7u8; 1000]);
        let first_ptr = first.as_ptr();
        f.write_chunk(first, true);
        f.write_chunk(pool.copy(&[8u8; 1000]), true);
        // An application's own buffer is never taken: it may be a slice of a larger one.
        f.write(Bytes::from(vec![6u8; 1000]));
        let (o, l, _) = f.next_range(3000, u64::MAX).unwrap();
        f.ack(o, l, false, &mut pool);
        assert_eq!(f.buffered(), 0);
        assert_eq!(pool.len(), 2);
        // The next copy lands in a kept buffer (the last one kept, then the first).
        let again = pool.copy(&[9u8; 500]);
        let again2 = pool.copy(&[9u8; 900]);
        assert!(again.as_ptr() == first_ptr || again2.as_ptr() == first_ptr);
        assert_eq!(&again[..], &[9u8; 500][..]);
        assert_eq!(pool.len(), 0);
        // A buffer someone else still holds is not taken back.
        let held = pool.copy(&[1u8; 10]);
        let clone = held.clone();
        pool.recycle(held);
        assert_eq!(pool.len(), 0);
        assert_eq!(&clone[..], &[1u8; 10][..]);
        // Nor is a huge one; and never more than KEPT.
        pool.recycle(Bytes::from(vec![0u8; BufferPool::MAX_KEPT_CAPACITY + 1]));
        assert_eq!(pool.len(), 0);
        for _ in 0..10 {
            pool.recycle(Bytes::from(vec![0u8; 100]));
        }
        assert_eq!(pool.len(), BufferPool::KEPT);
        pool.clear();
        assert_eq!(pool.len(), 0);
    }
}
