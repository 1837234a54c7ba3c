//! Sliding replay window (docs/PROTOCOL.md §6.6; SLTP's SYNC_NO done properly, as in IPsec).
//!
//! Each path keeps one. A packet number is accepted once; numbers older than the window are
//! rejected, since the receiver cannot tell whether it saw them.

/// Width of the window in packet numbers.
pub const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

/// Remembers which of the last 4 096 packet numbers (`WINDOW`) were seen.
#[derive(Debug, Clone, Default)]
pub struct ReplayWindow {
    /// Largest packet number accepted so far, if any.
    largest: Option<u64>,
    /// Bit `pn % WINDOW` is set when `pn` (within the window) was seen.
    bits: Bits,
}

/// Packet numbers below this are tracked in the window itself, without the 512-byte bitmap.
const SMALL: u64 = 128;

/// The window's bits. A path that has received only a few packets (an idle connection, a
/// short exchange) keeps them inline; the first packet number from [`SMALL`] on moves them to
/// the full bitmap. While every number seen is below `SMALL`, all of them are within
/// `WINDOW` of the largest, so the two forms accept exactly the same packets.
#[derive(Debug, Clone)]
enum Bits {
    /// Bit `pn` for `pn < SMALL`.
    Small([u64; (SMALL / 64) as usize]),
    /// Bit `pn % WINDOW`.
    Full(Box<[u64; WORDS]>),
}

impl Default for Bits {
    fn default() -> Self {
        Bits::Small([0; (SMALL / 64) as usize])
    }
}

impl Bits {
    /// The words: two while small, the whole bitmap once full (bit `pn % WINDOW` is in word
    /// `pn % WINDOW / 64` either way, since a small window only holds `pn < SMALL`).
    fn words(&self) -> &[u64] {
        match self {
            Bits::Small(words) => words,
            Bits::Full(words) => &words[..],
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match self {
            Bits::Small(words) => words,
            Bits::Full(words) => &mut words[..],
        }
    }

    fn make_full(&mut self) {
        if let Bits::Small(small) = self {
            let mut full = Box::new([0; WORDS]);
            full[..small.len()].copy_from_slice(small);
            *self = Bits::Full(full);
        }
    }
}

impl ReplayWindow {
    /// Whether `pn` would be accepted (not seen and not too old). Check before decrypting is
    /// cheap, but only [`ReplayWindow::insert`] after authentication may change the window,
    /// so forged packets cannot move it.
    pub fn is_fresh(&self, pn: u64) -> bool {
        match self.largest {
            None => true,
            Some(largest) if pn > largest => true,
            Some(largest) if largest - pn >= WINDOW => false,
            Some(_) => !self.get(pn),
        }
    }

    /// Records an authenticated packet number; returns false if it was a replay.
    pub fn insert(&mut self, pn: u64) -> bool {
        if !self.is_fresh(pn) {
            return false;
        }
        if pn >= SMALL {
            self.bits.make_full();
        }
        match self.largest {
            Some(largest) if pn <= largest => {}
            Some(largest) => {
                // Clear the bits that slide into the window.
                let advance = pn - largest;
                if advance >= WINDOW {
                    self.bits.words_mut().fill(0);
                } else {
                    for n in largest + 1..=pn {
                        self.clear(n);
                    }
                }
                self.largest = Some(pn);
            }
            None => {
                self.largest = Some(pn);
            }
        }
        self.set(pn);
        true
    }

    /// Whether the bitmap is allocated (tests, memory accounting).
    pub fn is_full(&self) -> bool {
        matches!(self.bits, Bits::Full(_))
    }

    fn get(&self, pn: u64) -> bool {
        let i = pn % WINDOW;
        self.bits
            .words()
            .get((i / 64) as usize)
            .is_some_and(|word| word & (1 << (i % 64)) != 0)
    }
    fn set(&mut self, pn: u64) {
        let i = pn % WINDOW;
        self.bits.words_mut()[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn clear(&mut self, pn: u64) {
        let i = pn % WINDOW;
        self.bits.words_mut()[(i / 64) as usize] &= !(1 << (i % 64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn duplicates_and_old_packets_rejected() {
        let mut w = ReplayWindow::default();
        assert!(w.insert(5));
        assert!(!w.insert(5));
        assert!(w.insert(3));
        assert!(w.insert(5000));
        assert!(!w.insert(3), "fell out of the window");
        assert!(w.insert(5000 - WINDOW + 1));
        assert!(!w.insert(5000 - WINDOW));
    }

    #[test]
    fn a_few_packets_need_no_bitmap_and_the_first_large_number_keeps_what_was_seen() {
        let mut w = ReplayWindow::default();
        for pn in (0..SMALL).rev().step_by(3) {
            assert!(w.insert(pn));
        }
        assert!(!w.is_full());
        assert!(w.insert(SMALL + 10));
        assert!(w.is_full());
        for pn in 0..SMALL {
            assert_eq!(w.insert(pn), (SMALL - 1 - pn) % 3 != 0, "pn {pn}");
        }
    }

    proptest! {
        #[test]
        fn matches_a_set_model_around_the_small_window(
            pns in proptest::collection::vec(0u64..(2 * SMALL), 1..300),
        ) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::BTreeSet::new();
            for pn in pns {
                let accepted = w.insert(pn);
                prop_assert_eq!(accepted, !seen.contains(&pn));
                if accepted { seen.insert(pn); }
                prop_assert_eq!(w.is_full(), seen.iter().any(|&p| p >= SMALL));
            }
        }

        #[test]
        fn matches_a_set_model(pns in proptest::collection::vec(0u64..20_000, 1..500)) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::BTreeSet::new();
            for pn in pns {
                let largest = seen.iter().next_back().copied();
                let accepted = w.insert(pn);
                let expected = !seen.contains(&pn)
                    && largest.is_none_or(|l| pn > l || l - pn < WINDOW);
                prop_assert_eq!(accepted, expected);
                if accepted { seen.insert(pn); }
            }
        }
    }
}
