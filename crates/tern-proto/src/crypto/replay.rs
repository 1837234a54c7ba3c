//! Sliding replay window (docs/PROTOCOL.md §6.6; SLTP's SYNC_NO done properly, as in IPsec).
//!
//! Each path keeps one. A packet number is accepted once; numbers older than the window are
//! rejected, since the receiver cannot tell whether it saw them.

/// Width of the window in packet numbers.
pub const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

/// Remembers which of the last 4 096 packet numbers (`WINDOW`) were seen.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// Largest packet number accepted so far, if any.
    largest: Option<u64>,
    /// Bit `pn % WINDOW` is set when `pn` (within the window) was seen.
    bits: Box<[u64; WORDS]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self {
            largest: None,
            bits: Box::new([0; WORDS]),
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
        match self.largest {
            Some(largest) if pn <= largest => {}
            Some(largest) => {
                // Clear the bits that slide into the window.
                let advance = pn - largest;
                if advance >= WINDOW {
                    self.bits.fill(0);
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

    fn get(&self, pn: u64) -> bool {
        let i = pn % WINDOW;
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, pn: u64) {
        let i = pn % WINDOW;
        self.bits[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn clear(&mut self, pn: u64) {
        let i = pn % WINDOW;
        self.bits[(i / 64) as usize] &= !(1 << (i % 64));
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

    proptest! {
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
