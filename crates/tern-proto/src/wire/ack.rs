//! ACK ranges and NACK lists (PROTOCOL.md §9.3, §9.4, §11).
//!
//! Both are decoded as borrowed views over their encoded bytes: decoding validates every range
//! once (no underflow, no overflow) and the iterators then walk the bytes again without
//! allocating. Encoders take iterators and a budget, so an ACK can be cut to fit a packet.

use std::fmt;
use std::ops::RangeInclusive;

use bytes::BufMut;

use super::{frame_type, varint_len, DecodeError, Reader, VarInt, WriteExt};
use crate::recovery::EcnCounts;

const MAX: u64 = VarInt::MAX.into_inner();

// =============================================================================================
// ACK

/// The acknowledged ranges of an ACK frame, borrowed from the packet (RFC 9000 §19.3.1
/// semantics): a first range ending at `largest`, then (gap, length) pairs going down.
///
/// Equality compares the encoded bytes, so two encodings of the same ranges may differ.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AckRanges<'a> {
    largest: u64,
    first_range: u64,
    pairs: u64,
    smallest: u64,
    raw: &'a [u8],
}

impl<'a> AckRanges<'a> {
    /// Reads `pairs` (gap, length) pairs after a first range of `first_range` below `largest`,
    /// rejecting any range that would go below packet number 0.
    fn decode(
        r: &mut Reader<'a>,
        largest: u64,
        pairs: u64,
        first_range: u64,
    ) -> Result<Self, DecodeError> {
        const ERR: DecodeError = DecodeError::InvalidValue("ack range");
        let mut smallest = largest.checked_sub(first_range).ok_or(ERR)?;
        let start = r.position();
        // Each pair takes at least 2 bytes, so a huge count fails on the input's end quickly.
        for _ in 0..pairs {
            let gap = r.varint()?;
            let len = r.varint()?;
            // RFC 9000 §19.3.1: largest_i = smallest_{i-1} - gap - 2.
            let next_largest = smallest
                .checked_sub(gap)
                .and_then(|v| v.checked_sub(2))
                .ok_or(ERR)?;
            smallest = next_largest.checked_sub(len).ok_or(ERR)?;
        }
        let raw = r.input().get(start..r.position()).unwrap_or_default();
        Ok(AckRanges {
            largest,
            first_range,
            pairs,
            smallest,
            raw,
        })
    }

    /// Largest acknowledged packet number.
    pub fn largest(&self) -> u64 {
        self.largest
    }

    /// Smallest acknowledged packet number.
    pub fn smallest(&self) -> u64 {
        self.smallest
    }

    /// Number of ranges (at least 1).
    pub fn len(&self) -> u64 {
        self.pairs + 1
    }

    /// Always false: an ACK acknowledges at least one packet.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The ranges, from the largest down.
    pub fn iter(&self) -> AckRangeIter<'a> {
        AckRangeIter {
            reader: Reader::new(self.raw),
            pairs_left: self.pairs,
            next: Some(self.largest - self.first_range..=self.largest),
        }
    }

    /// Whether `pn` is acknowledged.
    pub fn contains(&self, pn: u64) -> bool {
        pn >= self.smallest && pn <= self.largest && self.iter().any(|r| r.contains(&pn))
    }

    fn encoded_len(&self) -> usize {
        varint_len(self.largest)
            + varint_len(self.pairs)
            + varint_len(self.first_range)
            + self.raw.len()
    }
}

impl<'a> IntoIterator for &AckRanges<'a> {
    type Item = RangeInclusive<u64>;
    type IntoIter = AckRangeIter<'a>;
    fn into_iter(self) -> AckRangeIter<'a> {
        self.iter()
    }
}

impl fmt::Debug for AckRanges<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over [`AckRanges`], largest first.
#[derive(Debug, Clone)]
pub struct AckRangeIter<'a> {
    reader: Reader<'a>,
    pairs_left: u64,
    next: Option<RangeInclusive<u64>>,
}

impl Iterator for AckRangeIter<'_> {
    type Item = RangeInclusive<u64>;

    fn next(&mut self) -> Option<Self::Item> {
        let current = self.next.take()?;
        if self.pairs_left > 0 {
            self.pairs_left -= 1;
            // Validated by `AckRanges::decode`; the checks only keep this panic-free.
            self.next = next_range(&mut self.reader, *current.start());
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.pairs_left)
            .unwrap_or(usize::MAX)
            .saturating_add(usize::from(self.next.is_some()));
        (0, Some(n))
    }
}

impl std::iter::FusedIterator for AckRangeIter<'_> {}

/// The range below one starting at `start`, from the next (gap, length) pair.
fn next_range(reader: &mut Reader<'_>, start: u64) -> Option<RangeInclusive<u64>> {
    let gap = reader.varint().ok()?;
    let len = reader.varint().ok()?;
    let largest = start.checked_sub(gap)?.checked_sub(2)?;
    Some(largest.checked_sub(len)?..=largest)
}

/// An ACK frame (type 0x02, §9.3): acknowledges packets of path `path_id` (which may differ
/// from the path the frame travels on). Type 0x2a (ACK_ECN) adds the ECN counts of that path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack<'a> {
    /// Path whose packet-number space the ranges refer to (fits in 32 bits).
    pub path_id: u32,
    /// Time between receiving the largest acknowledged packet and sending this ACK, in µs.
    pub ack_delay_us: u64,
    /// Acknowledged ranges; [`AckRanges::largest`] is the largest acknowledged.
    pub ranges: AckRanges<'a>,
    /// Packets received on the path with each ECN codepoint (ACK_ECN only).
    pub ecn: Option<EcnCounts>,
}

impl<'a> Ack<'a> {
    /// Reads the frame body (after the type); `ecn` for type ACK_ECN.
    pub(crate) fn decode_body(r: &mut Reader<'a>, ecn: bool) -> Result<Self, DecodeError> {
        let path_id = r.varint_u32("path id")?;
        let largest = r.varint()?;
        let ack_delay_us = r.varint()?;
        let pairs = r.varint()?;
        let first_range = r.varint()?;
        let ranges = AckRanges::decode(r, largest, pairs, first_range)?;
        let ecn = if ecn {
            Some(EcnCounts {
                ect0: r.varint()?,
                ect1: r.varint()?,
                ce: r.varint()?,
            })
        } else {
            None
        };
        Ok(Ack {
            path_id,
            ack_delay_us,
            ranges,
            ecn,
        })
    }

    /// The wire type: ACK, or ACK_ECN with counts.
    pub fn frame_type(&self) -> u64 {
        if self.ecn.is_some() {
            frame_type::ACK_ECN
        } else {
            frame_type::ACK
        }
    }

    /// Largest acknowledged packet number.
    pub fn largest(&self) -> u64 {
        self.ranges.largest
    }

    /// Encoded length, including the type.
    pub fn encoded_len(&self) -> usize {
        varint_len(self.frame_type())
            + varint_len(u64::from(self.path_id))
            + varint_len(self.ack_delay_us)
            + self.ranges.encoded_len()
            + self.ecn.map_or(0, |c| ecn_len(&c))
    }

    /// Writes the frame (type included), re-emitting the ranges' bytes.
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        buf.put_varint(self.frame_type());
        buf.put_varint(u64::from(self.path_id));
        buf.put_varint(self.ranges.largest);
        buf.put_varint(self.ack_delay_us);
        buf.put_varint(self.ranges.pairs);
        buf.put_varint(self.ranges.first_range);
        buf.put_slice(self.ranges.raw);
        if let Some(c) = self.ecn {
            put_ecn(buf, &c);
        }
    }
}

fn ecn_len(c: &EcnCounts) -> usize {
    varint_len(c.ect0) + varint_len(c.ect1) + varint_len(c.ce)
}

fn put_ecn<B: BufMut + ?Sized>(buf: &mut B, c: &EcnCounts) {
    buf.put_varint(c.ect0.min(MAX));
    buf.put_varint(c.ect1.min(MAX));
    buf.put_varint(c.ce.min(MAX));
}

/// What an ACK encoder wrote or would write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckPlan {
    /// Ranges included (the largest ones).
    pub ranges: usize,
    /// Encoded frame length, type included.
    pub len: usize,
}

/// One step of a checked descending range sequence.
struct AckStep {
    start: u64,
    end: u64,
    /// Encoded gap to the previous range (`None` for the first).
    gap: Option<u64>,
}

/// Yields ranges while they are well formed: non-empty, at most 2^62 − 1, strictly descending
/// with at least one missing packet between neighbours. Stops at the first one that is not.
struct CheckedRanges<I> {
    inner: I,
    prev_start: Option<u64>,
    done: bool,
}

impl<I: Iterator<Item = RangeInclusive<u64>>> Iterator for CheckedRanges<I> {
    type Item = AckStep;
    fn next(&mut self) -> Option<AckStep> {
        if self.done {
            return None;
        }
        let r = self.inner.next()?;
        let (start, end) = (*r.start(), *r.end());
        let gap = match self.prev_start {
            _ if start > end || end > MAX => None,
            None => Some(None),
            Some(prev) => prev
                .checked_sub(2)
                .and_then(|p| p.checked_sub(end))
                .map(Some),
        };
        match gap {
            Some(gap) => {
                self.prev_start = Some(start);
                Some(AckStep { start, end, gap })
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

/// How many of `ranges` (descending, largest first) an ACK frame can carry within
/// `max_ranges` ranges and `budget` bytes, and its length (with `ecn`, an ACK_ECN frame).
/// `None` if not even the first range fits or `ranges` is empty. Ranges after the first
/// malformed one (overlapping, adjacent, ascending, empty, above 2^62 − 1) are ignored.
pub fn plan_ack<I>(
    path_id: u32,
    ack_delay_us: u64,
    ranges: I,
    max_ranges: usize,
    budget: usize,
    ecn: Option<&EcnCounts>,
) -> Option<AckPlan>
where
    I: IntoIterator<Item = RangeInclusive<u64>>,
{
    let mut steps = CheckedRanges {
        inner: ranges.into_iter(),
        prev_start: None,
        done: false,
    };
    let first = steps.next()?;
    let ty = if ecn.is_some() {
        frame_type::ACK_ECN
    } else {
        frame_type::ACK
    };
    let fixed = varint_len(ty)
        + ecn.map_or(0, ecn_len)
        + varint_len(u64::from(path_id))
        + varint_len(first.end)
        + varint_len(ack_delay_us)
        + varint_len(first.end - first.start);
    let mut plan = AckPlan {
        ranges: 1,
        len: fixed + 1,
    };
    if max_ranges == 0 || plan.len > budget {
        return None;
    }
    let mut pairs_len = 0;
    for step in steps {
        if plan.ranges >= max_ranges {
            break;
        }
        pairs_len += varint_len(step.gap.unwrap_or(0)) + varint_len(step.end - step.start);
        let len = fixed + varint_len(plan.ranges as u64) + pairs_len;
        if len > budget {
            break;
        }
        plan = AckPlan {
            ranges: plan.ranges + 1,
            len,
        };
    }
    Some(plan)
}

/// Writes an ACK frame for path `path_id` (ACK_ECN with `ecn`) with as many of `ranges`
/// (descending) as fit in `max_ranges` and `budget` bytes (see [`plan_ack`]). Returns what
/// was written, or `None` (nothing written) if not even the first range fits.
pub fn encode_ack<B, I>(
    path_id: u32,
    ack_delay_us: u64,
    ranges: I,
    max_ranges: usize,
    budget: usize,
    ecn: Option<&EcnCounts>,
    buf: &mut B,
) -> Option<AckPlan>
where
    B: BufMut + ?Sized,
    I: IntoIterator<Item = RangeInclusive<u64>>,
    I::IntoIter: Clone,
{
    let ranges = ranges.into_iter();
    let plan = plan_ack(
        path_id,
        ack_delay_us,
        ranges.clone(),
        max_ranges,
        budget,
        ecn,
    )?;
    let mut steps = CheckedRanges {
        inner: ranges,
        prev_start: None,
        done: false,
    }
    .take(plan.ranges);
    let first = steps.next()?;
    buf.put_varint(if ecn.is_some() {
        frame_type::ACK_ECN
    } else {
        frame_type::ACK
    });
    buf.put_varint(u64::from(path_id));
    buf.put_varint(first.end);
    buf.put_varint(ack_delay_us);
    buf.put_varint(plan.ranges as u64 - 1);
    buf.put_varint(first.end - first.start);
    for step in steps {
        buf.put_varint(step.gap.unwrap_or(0));
        buf.put_varint(step.end - step.start);
    }
    if let Some(c) = ecn {
        put_ecn(buf, c);
    }
    Some(plan)
}

// =============================================================================================
// NACK

/// The missing packet numbers of a NACK frame, borrowed from the packet: ascending, encoded as
/// the first number, then the deltas `pn_i − pn_{i−1} − 1`.
///
/// Equality compares the encoded bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NackList<'a> {
    count: u64,
    first: u64,
    last: u64,
    raw: &'a [u8],
}

impl<'a> NackList<'a> {
    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        const ERR: DecodeError = DecodeError::InvalidValue("nack list");
        let count = r.varint()?;
        if count == 0 {
            return Err(ERR);
        }
        let first = r.varint()?;
        let start = r.position();
        let mut last = first;
        for _ in 1..count {
            let delta = r.varint()?;
            last = last
                .checked_add(delta)
                .and_then(|v| v.checked_add(1))
                .filter(|v| *v <= MAX)
                .ok_or(ERR)?;
        }
        let raw = r.input().get(start..r.position()).unwrap_or_default();
        Ok(NackList {
            count,
            first,
            last,
            raw,
        })
    }

    /// Number of missing packet numbers (at least 1).
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Smallest missing packet number.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Largest missing packet number.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The missing packet numbers, ascending.
    pub fn iter(&self) -> NackIter<'a> {
        NackIter {
            reader: Reader::new(self.raw),
            left: self.count,
            prev: None,
            first: self.first,
        }
    }

    fn encoded_len(&self) -> usize {
        varint_len(self.count) + varint_len(self.first) + self.raw.len()
    }
}

impl<'a> IntoIterator for &NackList<'a> {
    type Item = u64;
    type IntoIter = NackIter<'a>;
    fn into_iter(self) -> NackIter<'a> {
        self.iter()
    }
}

impl fmt::Debug for NackList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over a [`NackList`], ascending.
#[derive(Debug, Clone)]
pub struct NackIter<'a> {
    reader: Reader<'a>,
    left: u64,
    prev: Option<u64>,
    first: u64,
}

impl Iterator for NackIter<'_> {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let pn = match self.prev {
            None => self.first,
            // Validated by `NackList::decode`; the checks only keep this panic-free.
            Some(prev) => {
                let delta = self.reader.varint().ok();
                match delta.and_then(|d| prev.checked_add(d)?.checked_add(1)) {
                    Some(pn) => pn,
                    None => {
                        self.left = 0;
                        return None;
                    }
                }
            }
        };
        self.prev = Some(pn);
        Some(pn)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(usize::try_from(self.left).unwrap_or(usize::MAX)))
    }
}

impl std::iter::FusedIterator for NackIter<'_> {}

/// A NACK frame (type 0x03, §9.4): packets of path `path_id` the receiver found missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nack<'a> {
    /// Path whose packet-number space the numbers refer to.
    pub path_id: u32,
    /// Missing packet numbers.
    pub missing: NackList<'a>,
}

impl<'a> Nack<'a> {
    pub(crate) fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let path_id = r.varint_u32("path id")?;
        let missing = NackList::decode(r)?;
        Ok(Nack { path_id, missing })
    }

    /// Encoded length, including the type.
    pub fn encoded_len(&self) -> usize {
        1 + varint_len(u64::from(self.path_id)) + self.missing.encoded_len()
    }

    /// Writes the frame (type included).
    pub fn encode<B: BufMut + ?Sized>(&self, buf: &mut B) {
        buf.put_varint(frame_type::NACK);
        buf.put_varint(u64::from(self.path_id));
        buf.put_varint(self.missing.count);
        buf.put_varint(self.missing.first);
        buf.put_slice(self.missing.raw);
    }
}

/// What a NACK encoder wrote or would write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NackPlan {
    /// Packet numbers included (the smallest ones).
    pub count: usize,
    /// Encoded frame length, type included.
    pub len: usize,
}

/// Yields (pn, delta) while the numbers are strictly ascending and at most 2^62 − 1.
fn checked_missing<I>(inner: I) -> impl Iterator<Item = (u64, u64)> + Clone
where
    I: Iterator<Item = u64> + Clone,
{
    inner
        .scan(None::<u64>, |prev, pn| {
            let delta = match *prev {
                _ if pn > MAX => return None,
                None => 0,
                Some(p) => pn.checked_sub(p)?.checked_sub(1)?,
            };
            *prev = Some(pn);
            Some((pn, delta))
        })
        .fuse()
}

/// How many of `missing` (ascending) a NACK frame can carry within `max_count` numbers and
/// `budget` bytes. `None` if not even one fits or `missing` is empty. Numbers after the first
/// one out of order (or above 2^62 − 1) are ignored.
pub fn plan_nack<I>(path_id: u32, missing: I, max_count: usize, budget: usize) -> Option<NackPlan>
where
    I: IntoIterator<Item = u64>,
    I::IntoIter: Clone,
{
    let mut it = checked_missing(missing.into_iter());
    let (first, _) = it.next()?;
    let fixed = 1 + varint_len(u64::from(path_id)) + varint_len(first);
    let mut plan = NackPlan {
        count: 1,
        len: fixed + 1,
    };
    if max_count == 0 || plan.len > budget {
        return None;
    }
    let mut deltas_len = 0;
    for (_, delta) in it {
        if plan.count >= max_count {
            break;
        }
        deltas_len += varint_len(delta);
        let len = fixed + varint_len(plan.count as u64 + 1) + deltas_len;
        if len > budget {
            break;
        }
        plan = NackPlan {
            count: plan.count + 1,
            len,
        };
    }
    Some(plan)
}

/// Writes a NACK frame with as many of `missing` (ascending) as fit (see [`plan_nack`]).
/// Returns what was written, or `None` (nothing written).
pub fn encode_nack<B, I>(
    path_id: u32,
    missing: I,
    max_count: usize,
    budget: usize,
    buf: &mut B,
) -> Option<NackPlan>
where
    B: BufMut + ?Sized,
    I: IntoIterator<Item = u64>,
    I::IntoIter: Clone,
{
    let missing = missing.into_iter();
    let plan = plan_nack(path_id, missing.clone(), max_count, budget)?;
    let mut it = checked_missing(missing).take(plan.count);
    let (first, _) = it.next()?;
    buf.put_varint(frame_type::NACK);
    buf.put_varint(u64::from(path_id));
    buf.put_varint(plan.count as u64);
    buf.put_varint(first);
    for (_, delta) in it {
        buf.put_varint(delta);
    }
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Frame;
    use proptest::prelude::*;

    fn decode_ack(buf: &[u8]) -> Ack<'_> {
        let mut r = Reader::new(buf);
        match Frame::decode(&mut r).unwrap() {
            Frame::Ack(a) => {
                assert!(r.is_empty());
                a
            }
            f => panic!("not an ack: {f:?}"),
        }
    }

    #[test]
    fn ack_layout() {
        let mut buf = Vec::new();
        let plan = encode_ack(1, 25, [10..=12, 5..=7, 0..=2], 10, 100, None, &mut buf).unwrap();
        // type, path, largest, delay, count, first range, (gap, len), (gap, len)
        assert_eq!(buf, [0x02, 1, 12, 25, 2, 2, 1, 2, 1, 2]);
        assert_eq!(plan, AckPlan { ranges: 3, len: 10 });
        let ack = decode_ack(&buf);
        assert_eq!(ack.largest(), 12);
        assert_eq!(ack.ranges.smallest(), 0);
        assert_eq!(ack.ranges.len(), 3);
        assert_eq!(
            ack.ranges.iter().collect::<Vec<_>>(),
            vec![10..=12, 5..=7, 0..=2]
        );
        assert!(ack.ranges.contains(6));
        assert!(!ack.ranges.contains(8));
        assert_eq!(ack.encoded_len(), buf.len());
        assert_eq!(format!("{:?}", ack.ranges), "[10..=12, 5..=7, 0..=2]");
    }

    #[test]
    fn ack_budget_and_cap() {
        let ranges = [100..=100, 90..=95, 80..=80, 70..=70];
        let full = plan_ack(0, 0, ranges.clone(), usize::MAX, usize::MAX, None).unwrap();
        assert_eq!(full.ranges, 4);
        let capped = plan_ack(0, 0, ranges.clone(), 2, usize::MAX, None).unwrap();
        assert_eq!(capped.ranges, 2);
        let tight = plan_ack(0, 0, ranges.clone(), usize::MAX, full.len - 1, None).unwrap();
        assert_eq!(tight.ranges, 3);
        assert!(plan_ack(0, 0, ranges.clone(), usize::MAX, 5, None).is_none());
        assert!(plan_ack(0, 0, ranges.clone(), 0, 100, None).is_none());
        assert!(plan_ack(0, 0, std::iter::empty(), 10, 100, None).is_none());
        let mut buf = Vec::new();
        assert!(encode_ack(0, 0, ranges.clone(), 10, 5, None, &mut buf).is_none());
        assert!(buf.is_empty());
        let plan = encode_ack(0, 0, ranges.clone(), 10, tight.len, None, &mut buf).unwrap();
        assert_eq!(plan, tight);
        assert_eq!(buf.len(), tight.len);
        assert_eq!(decode_ack(&buf).ranges.iter().count(), 3);
    }

    #[test]
    fn ack_ecn_layout() {
        let mut buf = Vec::new();
        let counts = EcnCounts {
            ect0: 7,
            ect1: 0,
            ce: 2,
        };
        let plan = encode_ack(0, 25, [3..=9], 10, 100, Some(&counts), &mut buf).unwrap();
        // type, path, largest, delay, count, first range, ect0, ect1, ce
        assert_eq!(buf, [0x2a, 0, 9, 25, 0, 6, 7, 0, 2]);
        assert_eq!(plan.len, buf.len());
        let ack = decode_ack(&buf);
        assert_eq!(ack.ecn, Some(counts));
        assert_eq!(ack.encoded_len(), buf.len());
        // Counts cut short are an error, not a plain ACK.
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf[..8])),
            Err(DecodeError::UnexpectedEnd)
        );
    }

    #[test]
    fn ack_encoder_stops_at_malformed_ranges() {
        for bad in [
            vec![10..=12, 11..=11],                   // overlapping
            vec![10..=12, 9..=9],                     // adjacent (no gap)
            vec![10..=12, 20..=21],                   // ascending
            vec![10..=12, RangeInclusive::new(5, 4)], // empty
            vec![10..=12, 0..=(MAX + 1)],             // too large
        ] {
            let plan = plan_ack(0, 0, bad.clone(), 10, 100, None).unwrap();
            assert_eq!(plan.ranges, 1, "{bad:?}");
        }
        assert!(plan_ack(0, 0, [0..=(MAX + 1)], 10, 100, None).is_none());
        let mut buf = Vec::new();
        encode_ack(0, 0, [MAX..=MAX, 0..=0], 10, 100, None, &mut buf).unwrap();
        assert_eq!(
            decode_ack(&buf).ranges.iter().collect::<Vec<_>>(),
            vec![MAX..=MAX, 0..=0]
        );
    }

    #[test]
    fn ack_decode_rejects_underflow() {
        // first range larger than largest
        let buf = [0x02, 0, 5, 0, 0, 6];
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue("ack range"))
        );
        // gap below zero: largest 5, first 0 → smallest 5; gap 4 → 5-4-2 < 0
        let buf = [0x02, 0, 5, 0, 1, 0, 4, 0];
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue("ack range"))
        );
        // gap 3 → largest 0, len 1 → below zero
        let buf = [0x02, 0, 5, 0, 1, 0, 3, 1];
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue("ack range"))
        );
        let buf = [0x02, 0, 5, 0, 1, 0, 3, 0];
        assert_eq!(
            decode_ack(&buf).ranges.iter().collect::<Vec<_>>(),
            vec![5..=5, 0..=0]
        );
        // a count far beyond the input
        let buf = [0x02, 0, 5, 0, 0xbf, 0xff, 0xff, 0xff, 0];
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::UnexpectedEnd)
        );
        // path id above u32
        let mut buf = vec![0x02];
        buf.put_varint(1 << 32);
        buf.extend_from_slice(&[5, 0, 0, 0]);
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue("path id"))
        );
    }

    fn decode_nack(buf: &[u8]) -> Nack<'_> {
        let mut r = Reader::new(buf);
        match Frame::decode(&mut r).unwrap() {
            Frame::Nack(n) => {
                assert!(r.is_empty());
                n
            }
            f => panic!("not a nack: {f:?}"),
        }
    }

    #[test]
    fn nack_layout_and_rules() {
        let mut buf = Vec::new();
        let plan = encode_nack(2, [3, 4, 10], 10, 100, &mut buf).unwrap();
        assert_eq!(buf, [0x03, 2, 3, 3, 0, 5]);
        assert_eq!(plan, NackPlan { count: 3, len: 6 });
        let nack = decode_nack(&buf);
        assert_eq!(nack.missing.iter().collect::<Vec<_>>(), vec![3, 4, 10]);
        assert_eq!((nack.missing.first(), nack.missing.last()), (3, 10));
        assert_eq!(nack.encoded_len(), buf.len());

        assert_eq!(plan_nack(0, [5, 5, 6], 10, 100).unwrap().count, 1);
        assert_eq!(plan_nack(0, [5, 4], 10, 100).unwrap().count, 1);
        assert_eq!(plan_nack(0, [1, 2, 3, 4], 2, 100).unwrap().count, 2);
        assert_eq!(plan_nack(0, [1, 2, 3, 4], 10, 5).unwrap().count, 2);
        assert_eq!(plan_nack(0, [1, 2, 3, 4], 10, 6).unwrap().count, 3);
        assert!(plan_nack(0, [1], 10, 3).is_none());
        assert!(plan_nack(0, [MAX + 1], 10, 100).is_none());

        // count 0
        assert_eq!(
            Frame::decode(&mut Reader::new(&[0x03, 0, 0])),
            Err(DecodeError::InvalidValue("nack list"))
        );
        // overflow past 2^62 - 1
        let mut buf = vec![0x03, 0, 2];
        buf.put_varint(MAX);
        buf.put_varint(0);
        assert_eq!(
            Frame::decode(&mut Reader::new(&buf)),
            Err(DecodeError::InvalidValue("nack list"))
        );
    }

    fn arb_ack_ranges() -> impl Strategy<Value = Vec<RangeInclusive<u64>>> {
        // Build descending ranges from (gap, len) pairs below a random largest.
        (
            0..=MAX,
            proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20), 0..20),
        )
            .prop_map(|(largest, steps)| {
                let mut out = Vec::new();
                let mut top = largest;
                let mut first = true;
                for (gap, len) in steps {
                    if !first {
                        match top.checked_sub(gap + 2) {
                            Some(t) => top = t,
                            None => break,
                        }
                    }
                    let start = top.saturating_sub(len);
                    out.push(start..=top);
                    first = false;
                    top = start;
                }
                if out.is_empty() {
                    out.push(largest..=largest);
                }
                out
            })
    }

    proptest! {
        #[test]
        fn ack_round_trip(
            path_id in any::<u32>(),
            delay in 0..=MAX,
            ranges in arb_ack_ranges(),
            max_ranges in 1usize..30,
            budget in 0usize..200,
            ecn in proptest::option::of((0..=MAX, 0..=MAX, 0..=MAX)),
        ) {
            let ecn = ecn.map(|(ect0, ect1, ce)| EcnCounts { ect0, ect1, ce });
            let mut buf = Vec::new();
            let plan = encode_ack(
                path_id, delay, ranges.clone(), max_ranges, budget, ecn.as_ref(), &mut buf,
            );
            prop_assert_eq!(
                plan,
                plan_ack(path_id, delay, ranges.clone(), max_ranges, budget, ecn.as_ref())
            );
            let Some(plan) = plan else {
                prop_assert!(buf.is_empty());
                return Ok(());
            };
            prop_assert!(plan.len <= budget);
            prop_assert_eq!(plan.len, buf.len());
            let ack = decode_ack(&buf);
            prop_assert_eq!(ack.path_id, path_id);
            prop_assert_eq!(ack.ack_delay_us, delay);
            prop_assert_eq!(ack.ecn, ecn);
            prop_assert_eq!(ack.encoded_len(), buf.len());
            let got: Vec<_> = ack.ranges.iter().collect();
            prop_assert_eq!(&got[..], &ranges[..plan.ranges]);
            prop_assert_eq!(ack.ranges.smallest(), *got.last().unwrap().start());
            let mut again = Vec::new();
            ack.encode(&mut again);
            prop_assert_eq!(again, buf);
        }

        #[test]
        fn nack_round_trip(
            path_id in any::<u32>(),
            mut missing in proptest::collection::btree_set(0..=MAX, 1..40),
            max_count in 1usize..50,
            budget in 0usize..300,
        ) {
            let missing: Vec<u64> = std::mem::take(&mut missing).into_iter().collect();
            let mut buf = Vec::new();
            let plan = encode_nack(path_id, missing.iter().copied(), max_count, budget, &mut buf);
            prop_assert_eq!(plan, plan_nack(path_id, missing.iter().copied(), max_count, budget));
            let Some(plan) = plan else {
                prop_assert!(buf.is_empty());
                return Ok(());
            };
            prop_assert!(plan.len <= budget);
            prop_assert_eq!(plan.len, buf.len());
            let nack = decode_nack(&buf);
            prop_assert_eq!(nack.path_id, path_id);
            let got: Vec<_> = nack.missing.iter().collect();
            prop_assert_eq!(&got[..], &missing[..plan.count]);
            let mut again = Vec::new();
            nack.encode(&mut again);
            prop_assert_eq!(again, buf);
        }
    }
}
