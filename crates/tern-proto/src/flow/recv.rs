//! The receiving half of a flow: out-of-order reassembly bounded by the credit we granted
//! (docs/PROTOCOL.md §10).

use std::collections::BTreeMap;

use bytes::{Buf, Bytes, BytesMut};

use crate::recovery::RangeSet;

/// Why received flow data was refused; each maps to a transport error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvError {
    /// Data beyond the credit we granted.
    FlowControl,
    /// Data beyond a final size, or a final size that contradicts an earlier one.
    FinalSize,
}

/// Chunks below this size take adjacent new bytes into themselves instead of a new map
/// entry: a peer sending one byte per frame would otherwise cost us a node (~100 bytes) per
/// byte of credit. Merging copies at most this much (plus the frame) per frame.
pub(crate) const COALESCE_BELOW: usize = 512;

/// Stores `bytes` (new, starting at `at`) in `chunks`, joined with the chunk that ends at
/// `at` and with the one that starts right after them when those are small. Both sides
/// matter: bytes arriving in descending order (never the first) each touch only the chunk
/// after them, and would otherwise cost a map entry per frame however small.
pub(crate) fn store_coalesced(chunks: &mut BTreeMap<u64, Bytes>, at: u64, bytes: &[u8]) {
    let end = at + bytes.len() as u64;
    let prev = chunks
        .range(..at)
        .next_back()
        .filter(|(&start, c)| start + c.len() as u64 == at && c.len() < COALESCE_BELOW)
        .map(|(&start, _)| start);
    let next = chunks
        .get(&end)
        .is_some_and(|c| c.len() < COALESCE_BELOW)
        .then_some(end);
    match (prev, next) {
        (None, None) => {
            chunks.insert(at, Bytes::copy_from_slice(bytes));
        }
        // The common case after a loss (each packet continues the one before): in place.
        (Some(start), None) => {
            if let Some(c) = chunks.get_mut(&start) {
                *c = concat(&[c, bytes]);
            }
        }
        _ => {
            let before = prev.and_then(|p| chunks.remove(&p)).unwrap_or_default();
            let after = next.and_then(|n| chunks.remove(&n)).unwrap_or_default();
            chunks.insert(prev.unwrap_or(at), concat(&[&before, bytes, &after]));
        }
    }
}

/// The parts, one after the other, in one new buffer.
fn concat(parts: &[&[u8]]) -> Bytes {
    let mut joined = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        joined.extend_from_slice(part);
    }
    Bytes::from(joined)
}

/// First block of a flow's run buffer ([`RecvFlow::run`]); each new block doubles, up to
/// [`RUN_BLOCK_MAX`]: a flow that receives a few bytes costs little, a bulk flow allocates once
/// per ~45 datagrams.
const RUN_BLOCK_MIN: usize = 2 << 10;

/// Largest run buffer block (bytes' `BytesMut` keeps this as its original capacity).
const RUN_BLOCK_MAX: usize = 64 << 10;

/// Receiving state of one flow.
#[derive(Debug, Default)]
pub(crate) struct RecvFlow {
    /// The run: bytes at `run_at..run_at + run.len()`, which arrived each right after the
    /// last (the common case). Appending copies into a block shared with the chunks already
    /// handed to the application, so a datagram in order costs no allocation and no map node.
    run: BytesMut,
    run_at: u64,
    /// Capacity of the run's next block.
    run_block: usize,
    /// Other data (arrived out of order) keyed by offset. The run and the chunks never overlap
    /// and are never below `read`: only bytes not held before are stored.
    chunks: BTreeMap<u64, Bytes>,
    /// Ranges received (at or above `read`).
    received: RangeSet,
    /// Next offset the application will read.
    pub(crate) read: u64,
    /// Highest offset received + 1.
    pub(crate) highest: u64,
    /// Final size, once FIN (or a reset) told us.
    pub(crate) final_size: Option<u64>,
    /// Credit granted to the peer (MaxFlowData).
    pub(crate) max_data: u64,
    /// Window the credit is refreshed to.
    pub(crate) window: u64,
    /// The peer reset the flow with this code.
    pub(crate) reset: Option<u64>,
    /// The application stopped reading with this code; a StopSending frame is pending.
    pub(crate) stop: Option<u64>,
    pub(crate) stop_pending: bool,
}

impl RecvFlow {
    pub(crate) fn new(window: u64) -> Self {
        Self {
            max_data: window,
            window,
            ..Self::default()
        }
    }

    /// Takes a Flow frame's payload; returns how many bytes were new beyond `highest` (for
    /// connection-level accounting).
    pub(crate) fn insert(&mut self, offset: u64, data: &[u8], fin: bool) -> Result<u64, RecvError> {
        let end = offset + data.len() as u64;
        if end > self.max_data {
            return Err(RecvError::FlowControl);
        }
        if let Some(size) = self.final_size {
            if end > size || (fin && end != size) {
                return Err(RecvError::FinalSize);
            }
        }
        if fin {
            if end < self.highest {
                return Err(RecvError::FinalSize);
            }
            self.final_size = Some(end);
        }
        let new_highest = end.saturating_sub(self.highest);
        self.highest = self.highest.max(end);
        if self.stop.is_some() {
            // Stopped: everything received counts as read (and consumed, see `discard`).
            self.read = self.highest;
            return Ok(new_highest);
        }
        if self.reset.is_some() {
            return Ok(new_highest);
        }
        // Store only the parts not already held, so duplicates cannot grow memory.
        let start = offset.max(self.read);
        if start >= end {
            return Ok(new_highest);
        }
        // In order, or beyond everything held (the common cases): all of it is new, and the
        // hole search (an allocation) is not needed.
        if self.received.last().is_none_or(|r| r.end <= start) {
            self.store(start, &data[(start - offset) as usize..]);
            return Ok(new_highest);
        }
        for hole in self.received.holes(start..end) {
            let bytes = &data[(hole.start - offset) as usize..(hole.end - offset) as usize];
            self.store(hole.start, bytes);
        }
        Ok(new_highest)
    }

    /// Keeps `bytes`, which start at flow offset `at` and were not held before: on the run if
    /// they continue it (or it is empty), else in the map.
    fn store(&mut self, at: u64, bytes: &[u8]) {
        self.received.insert(at..at + bytes.len() as u64);
        if self.run.is_empty() {
            self.run_at = at;
        } else if self.run_at + self.run.len() as u64 != at {
            store_coalesced(&mut self.chunks, at, bytes);
            return;
        }
        if self.run.capacity() - self.run.len() < bytes.len() {
            // A new block (the old one stays alive in the chunks handed out): at least as
            // large as this payload, the blocks doubling up to RUN_BLOCK_MAX.
            self.run_block = (self.run_block * 2).clamp(RUN_BLOCK_MIN, RUN_BLOCK_MAX);
            self.run.reserve(bytes.len().max(self.run_block));
        }
        self.run.extend_from_slice(bytes);
    }

    /// Lets go of an emptied run's block, so that an idle flow holds no buffer (the chunks
    /// handed out keep their part alive until the application drops them).
    fn release_empty_run(&mut self) {
        if self.run.is_empty() {
            self.run = BytesMut::new();
        }
    }

    /// Whether the run holds the next byte to read.
    fn run_is_next(&self) -> bool {
        !self.run.is_empty() && self.run_at == self.read
    }

    /// Disjoint ranges held (each one costs map nodes whatever its size; the connection
    /// bounds their number, `ConnectionConfig::max_recv_ranges`).
    pub(crate) fn ranges(&self) -> usize {
        self.received.len()
    }

    /// The application stopped the flow: drops what is buffered and counts everything received
    /// so far as read. Returns how many bytes that newly counts as read, for the connection's
    /// credit (data nobody will read must not keep its share of the connection window).
    pub(crate) fn discard(&mut self) -> u64 {
        let newly = self.highest.saturating_sub(self.read);
        self.chunks.clear();
        self.run = BytesMut::new();
        self.received = RangeSet::new();
        self.read = self.highest;
        newly
    }

    /// Every byte up to the final size has arrived (whether read or not).
    pub(crate) fn fully_received(&self) -> bool {
        self.final_size
            .is_some_and(|f| f == self.read || self.received.contains_range(self.read..f))
    }

    /// Bytes readable in order right now.
    pub(crate) fn readable(&self) -> u64 {
        match self.received.first() {
            Some(r) if r.start == self.read => r.end - r.start,
            _ => 0,
        }
    }

    /// Whether all data up to FIN was read.
    pub(crate) fn is_finished(&self) -> bool {
        self.final_size == Some(self.read)
    }

    /// Reads in-order data into `buf`; returns bytes copied.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut copied = 0;
        while copied < buf.len() {
            if self.run_is_next() {
                let n = self.run.len().min(buf.len() - copied);
                buf[copied..copied + n].copy_from_slice(&self.run[..n]);
                self.run.advance(n);
                self.run_at += n as u64;
                copied += n;
                self.read += n as u64;
                self.release_empty_run();
                continue;
            }
            let Some(mut entry) = self.chunks.first_entry() else {
                break;
            };
            if *entry.key() != self.read {
                break;
            }
            let chunk = entry.get_mut();
            let n = chunk.len().min(buf.len() - copied);
            buf[copied..copied + n].copy_from_slice(&chunk[..n]);
            copied += n;
            self.read += n as u64;
            if n == chunk.len() {
                entry.remove();
            } else {
                let rest = chunk.slice(n..);
                entry.remove();
                self.chunks.insert(self.read, rest);
            }
        }
        self.received.remove(0..self.read);
        copied
    }

    /// Reads the next in-order chunk without copying.
    pub(crate) fn read_chunk(&mut self, max: usize) -> Option<Bytes> {
        let out = if self.run_is_next() {
            let n = self.run.len().min(max);
            self.run_at += n as u64;
            let out = self.run.split_to(n).freeze();
            self.release_empty_run();
            out
        } else {
            let mut entry = self.chunks.first_entry()?;
            if *entry.key() != self.read {
                return None;
            }
            let chunk = entry.get_mut();
            if chunk.len() <= max {
                entry.remove()
            } else {
                let head = chunk.split_to(max);
                let rest = entry.remove();
                self.chunks.insert(self.read + head.len() as u64, rest);
                head
            }
        };
        self.read += out.len() as u64;
        self.received.remove(0..self.read);
        Some(out)
    }

    /// Bytes held (out of order or unread): bounded by the window.
    pub(crate) fn buffered(&self) -> u64 {
        self.received.total()
    }

    /// A new credit limit to advertise, when the application consumed half the window.
    pub(crate) fn credit_update(&mut self) -> Option<u64> {
        if self.final_size.is_some() || self.reset.is_some() {
            return None;
        }
        let target = self.read + self.window;
        if target - self.max_data >= self.window / 2 {
            self.max_data = target;
            Some(target)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reassembles_out_of_order() {
        let mut r = RecvFlow::new(100);
        r.insert(5, b"world", true).unwrap();
        assert_eq!(r.readable(), 0);
        r.insert(0, b"hello", false).unwrap();
        let mut buf = [0; 20];
        let n = r.read(&mut buf);
        assert_eq!(&buf[..n], b"helloworld");
        assert!(r.is_finished());
    }

    #[test]
    fn limits_enforced() {
        let mut r = RecvFlow::new(10);
        assert_eq!(r.insert(5, b"abcdef", false), Err(RecvError::FlowControl));
        r.insert(0, b"ab", true).unwrap();
        assert_eq!(r.insert(2, b"c", false), Err(RecvError::FinalSize));
    }

    #[test]
    fn duplicates_and_overlaps_hold_nothing_twice() {
        let mut r = RecvFlow::new(100);
        for _ in 0..50 {
            r.insert(10, &[1; 20], false).unwrap();
            r.insert(5, &[1; 30], false).unwrap();
        }
        assert_eq!(r.buffered(), 30);
        assert_eq!(r.ranges(), 1);
        let held: usize = r.chunks.values().map(|c| c.len()).sum::<usize>() + r.run.len();
        assert_eq!(held, 30, "stored bytes never exceed the bytes received");
    }

    #[test]
    fn one_byte_frames_are_coalesced() {
        // In order and unread: one range, and chunks of at least COALESCE_BELOW bytes,
        // not a map node per byte.
        let mut r = RecvFlow::new(1 << 20);
        for i in 0..10_000u64 {
            r.insert(i, &[i as u8], false).unwrap();
        }
        assert_eq!(r.ranges(), 1);
        assert!(
            r.chunks.len() <= 10_000 / COALESCE_BELOW + 1,
            "{}",
            r.chunks.len()
        );
        // Out of order with gaps: a range per fragment (what max_recv_ranges bounds).
        for i in (20_000..21_000u64).step_by(2) {
            r.insert(i, b"x", false).unwrap();
        }
        assert_eq!(r.ranges(), 1 + 500);
        let mut out = vec![0; 20_000];
        assert_eq!(r.read(&mut out), 10_000);
        assert!(out[..10_000].iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn one_byte_frames_in_descending_order_are_coalesced() {
        // Found by an outside read: bytes sent last to first, the first withheld, each joined
        // only the chunk before it, so every byte took a map entry while the ranges merged
        // into one (max_recv_ranges never fired): about 100 bytes of memory per byte of credit.
        let mut r = RecvFlow::new(1 << 20);
        for i in (1..10_000u64).rev() {
            r.insert(i, &[i as u8], false).unwrap();
        }
        assert_eq!(r.ranges(), 1);
        assert!(
            r.chunks.len() <= 10_000 / COALESCE_BELOW + 2,
            "{} chunks for 10 000 bytes",
            r.chunks.len()
        );
        r.insert(0, &[0], false).unwrap();
        let mut out = vec![0; 10_000];
        assert_eq!(r.read(&mut out), 10_000);
        assert!(out.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    proptest! {
        #[test]
        fn any_arrival_order_reassembles(data in proptest::collection::vec(any::<u8>(), 1..2000),
                                         cuts in proptest::collection::vec((0usize..2000, 1usize..300), 1..60),
                                         seed in any::<u64>()) {
            let mut r = RecvFlow::new(4096);
            let mut pieces: Vec<(usize, usize)> = cuts.iter().map(|&(s, l)| {
                let s = s % data.len();
                (s, (s + l).min(data.len()))
            }).collect();
            // Make sure everything is covered at least once.
            pieces.push((0, data.len()));
            let n = pieces.len();
            for i in 0..n { pieces.swap(i, (seed as usize).wrapping_mul(31).wrapping_add(i * 7) % n); }
            let mut out = Vec::new();
            for (s, e) in pieces {
                r.insert(s as u64, &data[s..e], e == data.len()).unwrap();
                prop_assert!(r.buffered() <= 4096);
                if seed % 2 == 0 {
                    let mut buf = [0u8; 97];
                    loop { let k = r.read(&mut buf); if k == 0 { break; } out.extend_from_slice(&buf[..k]); }
                } else {
                    while let Some(c) = r.read_chunk(1 + seed as usize % 300) { out.extend_from_slice(&c); }
                }
            }
            prop_assert_eq!(out, data);
            prop_assert!(r.is_finished());
        }
    }
}
