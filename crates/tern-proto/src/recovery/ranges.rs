//! A set of disjoint half-open `u64` ranges, used for received packet numbers (ACK ranges),
//! acknowledged flow bytes and retransmission queues.

use std::collections::BTreeMap;
use std::ops::Range;

/// Disjoint, non-adjacent half-open ranges, kept merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start → end (exclusive).
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: u64) -> bool {
        self.map
            .range(..=value)
            .next_back()
            .is_some_and(|(_, &end)| value < end)
    }

    /// Whether every value of `range` is in the set.
    pub fn contains_range(&self, range: Range<u64>) -> bool {
        if range.is_empty() {
            return true;
        }
        self.map
            .range(..=range.start)
            .next_back()
            .is_some_and(|(_, &end)| range.end <= end)
    }

    /// Adds `range`; returns true if anything new was added.
    pub fn insert(&mut self, range: Range<u64>) -> bool {
        if range.is_empty() {
            return false;
        }
        // The common case (packets and bytes arriving in order): extend the highest range.
        if let Some(mut last) = self.map.last_entry() {
            if *last.key() <= range.start && range.start <= *last.get() {
                if range.end <= *last.get() {
                    return false;
                }
                *last.get_mut() = range.end;
                return true;
            }
        }
        if self.contains_range(range.clone()) {
            return false;
        }
        let (mut start, mut end) = (range.start, range.end);
        // Merge with a range that starts before and touches us.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        // Absorb every range that starts inside [start, end].
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
        true
    }

    /// Removes `range` from the set.
    pub fn remove(&mut self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        // The common case (forgetting old packet numbers, acknowledged bytes): cut the front
        // of the lowest range.
        if let Some((&s, &e)) = self.map.first_key_value() {
            if range.start <= s && s < range.end && range.end < e {
                self.map.remove(&s);
                self.map.insert(range.end, e);
                return;
            }
        }
        // A range starting before `range.start` may need to be split.
        if let Some((&s, &e)) = self.map.range(..range.start).next_back() {
            if e > range.start {
                self.map.insert(s, range.start);
                if e > range.end {
                    self.map.insert(range.end, e);
                    return;
                }
            }
        }
        while let Some((&s, &e)) = self.map.range(range.start..range.end).next() {
            self.map.remove(&s);
            if e > range.end {
                self.map.insert(range.end, e);
                break;
            }
        }
    }

    /// The lowest range.
    pub fn first(&self) -> Option<Range<u64>> {
        self.map.iter().next().map(|(&s, &e)| s..e)
    }

    /// The highest range.
    pub fn last(&self) -> Option<Range<u64>> {
        self.map.iter().next_back().map(|(&s, &e)| s..e)
    }

    /// Removes and returns up to `max` values from the start of the lowest range.
    pub fn pop_front(&mut self, max: u64) -> Option<Range<u64>> {
        let (&s, &e) = self.map.iter().next()?;
        self.map.remove(&s);
        let take_end = e.min(s.saturating_add(max));
        if take_end < e {
            self.map.insert(take_end, e);
        }
        Some(s..take_end)
    }

    /// Drops the lowest ranges so that at most `max` remain.
    pub fn keep_highest(&mut self, max: usize) {
        while self.map.len() > max {
            let Some((&s, _)) = self.map.iter().next() else {
                break;
            };
            self.map.remove(&s);
        }
    }

    /// The parts of `range` not in the set, in order: what a receiver still lacks of a
    /// newly arrived chunk, so that duplicates never take memory twice.
    pub fn holes(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut cursor = range.start;
        // Start from the last range that begins at or before `range.start`.
        let from = self
            .map
            .range(..=range.start)
            .next_back()
            .map_or(range.start, |(&s, _)| s);
        for (&s, &e) in self.map.range(from..) {
            if e <= cursor {
                continue;
            }
            if s >= range.end {
                break;
            }
            if s > cursor {
                out.push(cursor..s);
            }
            cursor = cursor.max(e);
        }
        if cursor < range.end {
            out.push(cursor..range.end);
        }
        out
    }

    /// Ranges from highest to lowest.
    pub fn iter_rev(&self) -> impl Iterator<Item = Range<u64>> + Clone + '_ {
        self.map.iter().rev().map(|(&s, &e)| s..e)
    }

    /// Ranges from lowest to highest.
    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// Total count of values in the set.
    pub fn total(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn holes_are_what_is_missing() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        assert_eq!(s.holes(0..50), vec![0..10, 20..30, 40..50]);
        assert_eq!(s.holes(12..18), vec![]);
        assert_eq!(s.holes(15..35), vec![20..30]);
        assert_eq!(s.holes(5..5), vec![]);
    }

    #[test]
    fn merge_and_split() {
        let mut s = RangeSet::new();
        s.insert(0..5);
        s.insert(10..15);
        s.insert(5..10);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..15]);
        s.remove(3..7);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..3, 7..15]);
        assert_eq!(s.pop_front(2), Some(0..2));
        assert_eq!(s.first(), Some(2..3));
    }

    proptest! {
        #[test]
        fn matches_a_set_model(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..20), 1..100)) {
            let mut s = RangeSet::new();
            let mut model = BTreeSet::new();
            for (add, start, len) in ops {
                if add { s.insert(start..start + len); model.extend(start..start + len); }
                else { s.remove(start..start + len); for v in start..start + len { model.remove(&v); } }
                let flat: BTreeSet<u64> = s.iter().flatten().collect();
                prop_assert_eq!(&flat, &model);
                // Ranges stay disjoint and non-adjacent.
                let v: Vec<_> = s.iter().collect();
                for w in v.windows(2) { prop_assert!(w[0].end < w[1].start); }
            }
        }
    }
}
