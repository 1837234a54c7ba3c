//! Explicit Congestion Notification (RFC 3168, used as RFC 9000 §13.4 uses it; PROTOCOL.md
//! §11.5): packets leave marked ECT(0), the receiver counts the codepoints it sees and echoes
//! the counts in ACK_ECN frames, and the sender validates that its marks survive the path
//! before it takes a CE count as a congestion signal. A path that bleaches, rewrites or
//! drops marked packets falls back to unmarked sending, so ECN can only help.

use std::fmt;

/// The two ECN bits of the IP header, when not `Not-ECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EcnCodepoint {
    /// ECT(0), `0b10`: ECN-capable transport; what tern sends.
    Ect0,
    /// ECT(1), `0b01`: ECN-capable transport (L4S); tern never sends it.
    Ect1,
    /// CE, `0b11`: congestion experienced, set by a router instead of dropping.
    Ce,
}

impl EcnCodepoint {
    /// From the low two bits of the IP TOS / traffic-class byte; `None` for Not-ECT.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits & 0b11 {
            0b10 => Some(Self::Ect0),
            0b01 => Some(Self::Ect1),
            0b11 => Some(Self::Ce),
            _ => None,
        }
    }

    /// The two bits for the IP header.
    pub fn bits(self) -> u8 {
        match self {
            Self::Ect0 => 0b10,
            Self::Ect1 => 0b01,
            Self::Ce => 0b11,
        }
    }
}

/// Packets received with each ECN codepoint on one path (the ACK_ECN frame's counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EcnCounts {
    /// ECT(0)-marked packets.
    pub ect0: u64,
    /// ECT(1)-marked packets.
    pub ect1: u64,
    /// CE-marked packets.
    pub ce: u64,
}

impl EcnCounts {
    /// Counts one received packet.
    pub(crate) fn on_packet(&mut self, ecn: Option<EcnCodepoint>) {
        match ecn {
            Some(EcnCodepoint::Ect0) => self.ect0 += 1,
            Some(EcnCodepoint::Ect1) => self.ect1 += 1,
            Some(EcnCodepoint::Ce) => self.ce += 1,
            None => {}
        }
    }

    /// Whether anything was counted (only then does an ACK carry the counts).
    pub(crate) fn any(&self) -> bool {
        self.ect0 | self.ect1 | self.ce != 0
    }
}

/// Where a path's ECN validation stands (RFC 9000 §13.4.2, Appendix A.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EcnState {
    /// Marking, not yet confirmed: the first ACK of marked packets decides.
    #[default]
    Testing,
    /// The peer's counts account for our marks: CE counts are congestion signals.
    Capable,
    /// The path or the peer bleached, rewrote or dropped our marks: we send unmarked.
    Failed,
    /// Turned off by configuration.
    Disabled,
}

impl fmt::Display for EcnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Testing => "testing",
            Self::Capable => "capable",
            Self::Failed => "failed",
            Self::Disabled => "disabled",
        })
    }
}

/// How many marked packets may be lost, with none acknowledged, before the path is taken for
/// one that drops ECT packets (RFC 9000 §13.4.2.1 suggests sending ten marked packets).
const MARKED_LOSSES_BEFORE_FAILURE: u64 = 10;

/// What an ACK's ECN counts said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EcnVerdict {
    /// Nothing new.
    Quiet,
    /// The CE count grew by this much: the path signalled congestion.
    Congestion(u64),
}

/// The sender's ECN state for one path.
#[derive(Debug, Clone, Default)]
pub(crate) struct EcnSender {
    pub(crate) state: EcnState,
    /// ECT(0)-marked packets sent, ACK-only ones included (the peer counts those too).
    sent: u64,
    /// The largest counts the peer reported.
    peer: EcnCounts,
    /// Marked packets declared lost while none was acknowledged with counts yet.
    lost_unconfirmed: u64,
    /// CE marks the peer reported in total.
    pub(crate) ce_reported: u64,
}

impl EcnSender {
    /// A sender that never marks.
    pub(crate) fn disabled() -> Self {
        Self {
            state: EcnState::Disabled,
            ..Self::default()
        }
    }

    /// The codepoint for the next packet.
    pub(crate) fn mark(&self) -> Option<EcnCodepoint> {
        matches!(self.state, EcnState::Testing | EcnState::Capable).then_some(EcnCodepoint::Ect0)
    }

    /// The path moved to another network path (§11.9): validation starts again, unless it
    /// failed for good or ECN is off. The counts carry on: the peer's are per path and
    /// cumulative, so a fresh baseline would read its next report as more marks than we sent.
    pub(crate) fn restart(&mut self) {
        if self.state == EcnState::Capable {
            self.state = EcnState::Testing;
        }
        self.lost_unconfirmed = 0;
    }

    /// A packet left with `mark`.
    pub(crate) fn on_sent(&mut self, mark: Option<EcnCodepoint>) {
        if mark.is_some() {
            self.sent += 1;
        }
    }

    /// Marked packets were declared lost. If the first ten marked packets all vanish, marked
    /// packets are probably being dropped (a firewall that drops ECT): stop marking.
    pub(crate) fn on_lost(&mut self, marked: u64) {
        if self.state == EcnState::Testing {
            self.lost_unconfirmed += marked;
            if self.lost_unconfirmed >= MARKED_LOSSES_BEFORE_FAILURE {
                self.fail("marked packets lost");
            }
        }
    }

    /// Checks an ACK against what we sent (RFC 9000 §13.4.2.1). `newly_acked_marked` counts
    /// the ack-eliciting ECT(0) packets the ACK newly acknowledged; `counts` are the ACK's
    /// ECN counts, `None` for a plain ACK.
    pub(crate) fn on_ack(
        &mut self,
        newly_acked_marked: u64,
        counts: Option<EcnCounts>,
    ) -> EcnVerdict {
        if matches!(self.state, EcnState::Failed | EcnState::Disabled) {
            return EcnVerdict::Quiet;
        }
        let Some(counts) = counts else {
            if newly_acked_marked > 0 {
                // Our marked packets arrived but the peer saw no mark: bleached on the way
                // (or the peer cannot read the bits).
                self.fail("marked packets acknowledged without ECN counts");
            }
            return EcnVerdict::Quiet;
        };
        if counts.ect0 < self.peer.ect0 || counts.ect1 < self.peer.ect1 || counts.ce < self.peer.ce
        {
            // ACKs can arrive out of order: older counts are simply older, not wrong. Use
            // only the newest.
            return EcnVerdict::Quiet;
        }
        let d_ect0 = counts.ect0 - self.peer.ect0;
        let d_ect1 = counts.ect1 - self.peer.ect1;
        let d_ce = counts.ce - self.peer.ce;
        self.peer = counts;
        if d_ect1 > 0 {
            self.fail("ECT(1) reported, never sent");
            return EcnVerdict::Quiet;
        }
        if counts.ect0.saturating_add(counts.ce) > self.sent {
            self.fail("more marked packets reported than sent");
            return EcnVerdict::Quiet;
        }
        if d_ect0 + d_ce < newly_acked_marked {
            self.fail("fewer marks reported than marked packets acknowledged");
            return EcnVerdict::Quiet;
        }
        if newly_acked_marked > 0 && self.state == EcnState::Testing {
            tracing::debug!("ECN validated");
            self.state = EcnState::Capable;
        }
        if d_ce > 0 {
            self.ce_reported += d_ce;
            if self.state == EcnState::Capable {
                return EcnVerdict::Congestion(d_ce);
            }
        }
        EcnVerdict::Quiet
    }

    fn fail(&mut self, why: &'static str) {
        tracing::debug!(why, "ECN validation failed: sending unmarked");
        self.state = EcnState::Failed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(ect0: u64, ect1: u64, ce: u64) -> Option<EcnCounts> {
        Some(EcnCounts { ect0, ect1, ce })
    }

    fn sender(sent: u64) -> EcnSender {
        let mut s = EcnSender::default();
        for _ in 0..sent {
            s.on_sent(s.mark());
        }
        s
    }

    #[test]
    fn validation_restarts_on_a_new_network_path_with_the_counts_carried_on() {
        let mut s = sender(100);
        assert_eq!(s.on_ack(100, counts(100, 0, 0)), EcnVerdict::Quiet);
        assert_eq!(s.state, EcnState::Capable);
        s.restart();
        assert_eq!(s.state, EcnState::Testing);
        for _ in 0..5 {
            s.on_sent(s.mark());
        }
        // The peer's counts go on from 100: the new path's five marks validate it again.
        s.on_ack(5, counts(105, 0, 0));
        assert_eq!(s.state, EcnState::Capable);
        // A path that failed stays failed.
        let mut failed = sender(3);
        failed.on_ack(3, None);
        failed.restart();
        assert_eq!(failed.state, EcnState::Failed);
    }

    #[test]
    fn codepoints_round_trip_through_the_tos_bits() {
        for cp in [EcnCodepoint::Ect0, EcnCodepoint::Ect1, EcnCodepoint::Ce] {
            assert_eq!(EcnCodepoint::from_bits(cp.bits() | 0xb8), Some(cp));
        }
        assert_eq!(EcnCodepoint::from_bits(0xb8), None);
    }

    #[test]
    fn counts_that_match_the_marks_validate_and_ce_is_congestion() {
        let mut s = sender(10);
        assert_eq!(s.mark(), Some(EcnCodepoint::Ect0));
        assert_eq!(s.on_ack(4, counts(4, 0, 0)), EcnVerdict::Quiet);
        assert_eq!(s.state, EcnState::Capable);
        assert_eq!(s.on_ack(3, counts(6, 0, 1)), EcnVerdict::Congestion(1));
        assert_eq!(s.ce_reported, 1);
        // An older ACK arriving late is ignored, not a failure.
        assert_eq!(s.on_ack(0, counts(5, 0, 1)), EcnVerdict::Quiet);
        assert_eq!(s.state, EcnState::Capable);
    }

    #[test]
    fn a_bleaching_path_fails_validation() {
        let mut s = sender(10);
        s.on_ack(3, None);
        assert_eq!(s.state, EcnState::Failed);
        assert_eq!(s.mark(), None);
        // Once failed, nothing comes back on.
        assert_eq!(s.on_ack(3, counts(3, 0, 3)), EcnVerdict::Quiet);
        assert_eq!(s.state, EcnState::Failed);
    }

    #[test]
    fn partial_bleaching_and_mangling_fail_validation() {
        let mut s = sender(10);
        s.on_ack(4, counts(2, 0, 0));
        assert_eq!(s.state, EcnState::Failed, "two of four marks removed");

        let mut s = sender(10);
        s.on_ack(4, counts(0, 4, 0));
        assert_eq!(s.state, EcnState::Failed, "ECT(0) rewritten as ECT(1)");

        let mut s = sender(2);
        s.on_ack(2, counts(5, 0, 0));
        assert_eq!(s.state, EcnState::Failed, "more marks than packets sent");
    }

    #[test]
    fn ce_before_validation_is_not_yet_a_signal_and_all_ce_is_fine() {
        // A path that marks every packet CE still validates: CE counts as a surviving mark.
        let mut s = sender(4);
        assert_eq!(s.on_ack(4, counts(0, 0, 4)), EcnVerdict::Congestion(4));
        assert_eq!(s.state, EcnState::Capable);
    }

    #[test]
    fn ten_lost_marked_packets_before_any_ack_fail() {
        let mut s = sender(12);
        s.on_lost(9);
        assert_eq!(s.state, EcnState::Testing);
        s.on_lost(1);
        assert_eq!(s.state, EcnState::Failed);
        assert_eq!(EcnSender::disabled().mark(), None);
    }
}
