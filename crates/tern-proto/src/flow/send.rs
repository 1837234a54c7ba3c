//! The sending half of a flow: buffered bytes, what is unsent, what must be resent, what is
//! acknowledged (docs/PROTOCOL.md §10).

use std::collections::VecDeque;

use bytes::Bytes;

use crate::recovery::RangeSet;

/// Sending state of one flow.
#[derive(Debug, Default)]
pub(crate) struct SendFlow {
    /// Buffered chunks with the flow offset of their first byte; the front is the oldest
    /// unacknowledged data.
    chunks: VecDeque<(u64, Bytes)>,
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
    pub(crate) fn write(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let len = data.len() as u64;
        self.chunks.push_back((self.written, data));
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
            .partition_point(|(start, data)| start + data.len() as u64 <= want.start);
        for (start, data) in self.chunks.range(idx..) {
            if want.is_empty() || *start >= want.end {
                break;
            }
            let from = (want.start - start) as usize;
            let to = ((want.end - start) as usize).min(data.len());
            out.extend_from_slice(&data[from..to]);
            want.start = start + to as u64;
        }
    }

    /// A sent range was acknowledged; frees buffered data that is now contiguous.
    pub(crate) fn ack(&mut self, offset: u64, len: u64, fin: bool) {
        if fin {
            self.fin_acked = true;
            self.fin_pending = false;
        }
        if len == 0 {
            return;
        }
        self.acked.insert(offset..offset + len);
        self.retransmit.remove(offset..offset + len);
        while let Some((start, data)) = self.chunks.front() {
            let end = start + data.len() as u64;
            if self.acked.contains_range(*start..end) {
                self.chunks.pop_front();
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
        self.retransmit.insert(start..end);
        for acked in self.acked.iter().collect::<Vec<_>>() {
            self.retransmit.remove(acked);
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
        f.ack(0, 5, false);
        f.ack(5, 6, true);
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
}
