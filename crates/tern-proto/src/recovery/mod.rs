//! Loss recovery (DESIGN.md F9, docs/PROTOCOL.md §11): per-path packet numbers, ACK ranges,
//! immediate NACKs, time- and packet-threshold loss detection and probe timeouts, in the
//! manner of RFC 9002 plus UDT's loss lists.

mod ranges;
pub mod rtt;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use ranges::RangeSet;
pub use rtt::RttEstimator;

use crate::flow::FlowId;

//= RFC 9002 §6.1.1: "The RECOMMENDED initial value for the packet reordering threshold
//# (kPacketThreshold) is 3"
/// Packets acknowledged after a packet, beyond which it is lost.
pub const PACKET_THRESHOLD: u64 = 3;

/// What a sent packet carried that must be resent (or refreshed) if it is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentFrame {
    Flow {
        id: FlowId,
        offset: u64,
        len: u32,
        fin: bool,
    },
    MaxData,
    MaxFlowData(FlowId),
    MaxFlows(usize),
    ResetFlow(FlowId),
    StopSending(FlowId),
    HandshakeDone,
    Message {
        id: crate::message::MessageId,
        offset: u64,
        len: u32,
    },
    MessageSkip(crate::message::MessageId, u64),
    /// A WindowClose or WindowOpen (the current state is resent if lost).
    WindowState,
    /// An AckFrequency (the current request is resent if lost).
    AckFrequency,
}

/// One packet in flight.
#[derive(Debug, Clone)]
pub(crate) struct SentPacket {
    pub(crate) time: Instant,
    pub(crate) size: u16,
    pub(crate) ack_eliciting: bool,
    /// Counts toward bytes in flight (ack-only packets do not).
    pub(crate) in_flight: bool,
    /// Nothing else was waiting to be sent: the window was not the limit.
    pub(crate) app_limited: bool,
    /// Most packets carry one or two retransmittable frames: kept inline, no allocation.
    pub(crate) frames: SentFrames,
}

/// The frames of one sent packet.
pub(crate) type SentFrames = smallvec::SmallVec<[SentFrame; 3]>;

/// The sender's record of one path's packet-number space.
#[derive(Debug, Default)]
pub(crate) struct SentPackets {
    pub(crate) packets: BTreeMap<u64, SentPacket>,
    pub(crate) next_pn: u64,
    pub(crate) largest_acked: Option<u64>,
    pub(crate) bytes_in_flight: u64,
    pub(crate) time_of_last_ack_eliciting: Option<Instant>,
    /// Earliest time a packet becomes lost by the time threshold.
    pub(crate) loss_time: Option<Instant>,
    /// Consecutive probe timeouts (exponential backoff).
    pub(crate) pto_count: u32,
    /// When the last probe timeout fired: the next one counts from here even if no probe
    /// could be sent (e.g. held back by the anti-amplification limit).
    pub(crate) last_pto: Option<Instant>,
}

/// The result of processing acknowledgements or loss reports.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) acked: Vec<(u64, SentPacket)>,
    pub(crate) lost: Vec<(u64, SentPacket)>,
    /// Send time of the newest newly acked packet, if it was the largest and ack-eliciting:
    /// an RTT sample.
    pub(crate) rtt_sample: Option<Duration>,
}

impl SentPackets {
    /// Allocates the next packet number.
    pub(crate) fn take_pn(&mut self) -> u64 {
        let pn = self.next_pn;
        self.next_pn += 1;
        pn
    }

    /// Records a sent packet. Only ack-eliciting packets are kept: an ACK-only packet is
    /// never acknowledged, carries nothing to resend and must not pile up.
    pub(crate) fn on_sent(&mut self, pn: u64, packet: SentPacket) {
        if !packet.ack_eliciting {
            return;
        }
        if packet.in_flight {
            self.bytes_in_flight += u64::from(packet.size);
        }
        self.time_of_last_ack_eliciting = Some(packet.time);
        self.packets.insert(pn, packet);
    }

    fn remove(&mut self, pn: u64) -> Option<SentPacket> {
        let p = self.packets.remove(&pn)?;
        Some(self.forget(p))
    }

    /// Takes a packet that left `packets` out of the bytes in flight.
    fn forget(&mut self, p: SentPacket) -> SentPacket {
        if p.in_flight {
            self.bytes_in_flight -= u64::from(p.size);
        }
        p
    }

    /// Applies an ACK's ranges (descending, inclusive). Returns an error string if the peer
    /// acknowledged a packet number never sent.
    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        ranges: impl Iterator<Item = std::ops::RangeInclusive<u64>>,
        largest: u64,
        ack_delay: Duration,
        rtt: &mut RttEstimator,
        out: &mut Outcome,
    ) -> Result<(), &'static str> {
        if largest >= self.next_pn {
            return Err("ACK of a packet never sent");
        }
        let mut largest_newly_acked = None;
        for range in ranges {
            // The common case: the range covers the oldest outstanding packets.
            if self
                .packets
                .first_key_value()
                .is_some_and(|(&pn, _)| *range.start() <= pn)
            {
                while let Some(entry) = self.packets.first_entry() {
                    if *entry.key() > *range.end() {
                        break;
                    }
                    let (pn, p) = entry.remove_entry();
                    let p = self.forget(p);
                    largest_newly_acked = largest_newly_acked.max(Some(pn));
                    out.acked.push((pn, p));
                }
                continue;
            }
            let keys: Vec<u64> = self.packets.range(range).map(|(&pn, _)| pn).collect();
            for pn in keys {
                if let Some(p) = self.remove(pn) {
                    largest_newly_acked = largest_newly_acked.max(Some(pn));
                    out.acked.push((pn, p));
                }
            }
        }
        if self.largest_acked.is_none_or(|l| largest > l) {
            self.largest_acked = Some(largest);
        }
        //= RFC 9002 §5.1: an RTT sample is taken when the largest acknowledged packet is newly
        //# acknowledged and at least one newly acknowledged packet was ack-eliciting.
        if largest_newly_acked == Some(largest) {
            if let Some((_, p)) = out.acked.iter().find(|(pn, _)| *pn == largest) {
                if out.acked.iter().any(|(_, p)| p.ack_eliciting) {
                    let sample = now.saturating_duration_since(p.time);
                    rtt.update(ack_delay, sample);
                    out.rtt_sample = Some(sample);
                }
            }
        }
        if !out.acked.is_empty() {
            self.pto_count = 0;
        }
        Ok(())
    }

    /// Packets the receiver reported missing (NACK): lost at once, as in UDT's loss list.
    pub(crate) fn on_nack(&mut self, missing: impl Iterator<Item = u64>, out: &mut Outcome) {
        for pn in missing {
            if pn >= self.next_pn {
                break;
            }
            if let Some(p) = self.remove(pn) {
                out.lost.push((pn, p));
            }
        }
    }

    /// RFC 9002 §6.1 loss detection against the largest acknowledged packet.
    pub(crate) fn detect_lost(&mut self, now: Instant, rtt: &RttEstimator, out: &mut Outcome) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let loss_delay = rtt.loss_delay();
        let lost_before = now.checked_sub(loss_delay);
        let mut lost = Vec::new();
        for (&pn, p) in self.packets.range(..largest) {
            let by_time = lost_before.is_some_and(|t| p.time <= t);
            if by_time || largest - pn >= PACKET_THRESHOLD {
                lost.push(pn);
            } else {
                let t = p.time + loss_delay;
                self.loss_time = Some(self.loss_time.map_or(t, |l| l.min(t)));
            }
        }
        for pn in lost {
            if let Some(p) = self.remove(pn) {
                out.lost.push((pn, p));
            }
        }
    }

    /// The oldest ack-eliciting packet still outstanding (for probe content).
    pub(crate) fn oldest_ack_eliciting(&self) -> Option<&SentPacket> {
        self.packets.values().next()
    }

    /// Whether ack-eliciting packets are outstanding (only those are kept).
    pub(crate) fn has_ack_eliciting_in_flight(&self) -> bool {
        !self.packets.is_empty()
    }
}

/// The receiver's record of one path's packet-number space: what to acknowledge and when.
#[derive(Debug, Default)]
pub(crate) struct AckTracker {
    pub(crate) received: RangeSet,
    pub(crate) largest: Option<(u64, Instant)>,
    /// Ack-eliciting packets received since the last ACK we sent.
    pub(crate) unacked_eliciting: u32,
    /// An ACK must go out now (gap, request, or frequency reached).
    pub(crate) immediate: bool,
    /// Deadline for a delayed ACK.
    pub(crate) deadline: Option<Instant>,
    /// Packet numbers to report missing at once (SLTP NACK / UDT NAK).
    pub(crate) nack: Vec<u64>,
    /// Something new arrived since the last ACK.
    pub(crate) dirty: bool,
    /// The peer's latest AckFrequency: (sequence, threshold).
    pub(crate) requested: Option<(u64, u32)>,
}

/// At most this many ACK ranges are remembered; older gaps are long repaired or given up.
pub(crate) const MAX_ACK_RANGES: usize = 32;
/// ACKs describe at most this many packet numbers below the largest received.
pub(crate) const ACK_HORIZON: u64 = 1024;
/// The received set is trimmed to the horizon once it reaches this far below it.
const ACK_TRIM_STEP: u64 = 64;
/// At most this many packet numbers go in one NACK.
pub(crate) const MAX_NACK: usize = 64;

impl AckTracker {
    /// The peer asked for an ACK every `threshold` ack-eliciting packets; requests arriving
    /// out of order are ignored.
    pub(crate) fn on_ack_frequency(&mut self, sequence: u64, threshold: u32) {
        if self.requested.is_none_or(|(s, _)| sequence > s) {
            self.requested = Some((sequence, threshold));
        }
    }

    /// Ack-eliciting packets per ACK: the peer's request, else our default.
    pub(crate) fn threshold(&self, default: u32) -> u32 {
        self.requested.map_or(default, |(_, t)| t)
    }

    /// Records a received, authenticated packet.
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        pn: u64,
        ack_eliciting: bool,
        frequency: u32,
        max_delay: Duration,
    ) {
        match self.largest {
            Some((largest, _)) if pn > largest + 1 => {
                // A gap: report the missing numbers now rather than waiting for the sender's
                // thresholds (SLTP NACK). Reordering may make this spurious; the sender then
                // resends a little early, which costs bandwidth but not correctness.
                for missing in largest + 1..pn {
                    if self.nack.len() >= MAX_NACK {
                        break;
                    }
                    self.nack.push(missing);
                }
                self.immediate = true;
            }
            Some((largest, _)) if pn < largest => {
                // A late arrival fills a gap: tell the sender soon so it stops resending.
                self.immediate = true;
            }
            _ => {}
        }
        if self.largest.is_none_or(|(l, _)| pn > l) {
            self.largest = Some((pn, now));
        }
        self.received.insert(pn..pn + 1);
        self.received.keep_highest(MAX_ACK_RANGES);
        // Gaps far below the newest packet were long reported (the sender declared them lost
        // and resent their data under new numbers); stop repeating them in every ACK. Trimmed
        // here in steps, not every packet; `reported` clips to the horizon exactly.
        if let Some((largest, _)) = self.largest {
            let floor = largest.saturating_sub(ACK_HORIZON);
            if self
                .received
                .first()
                .is_some_and(|r| r.start + ACK_TRIM_STEP < floor)
            {
                self.received.remove(0..floor);
            }
        }
        self.dirty = true;
        if ack_eliciting {
            self.unacked_eliciting += 1;
            if self.unacked_eliciting >= frequency {
                self.immediate = true;
            } else if self.deadline.is_none() {
                self.deadline = Some(now + max_delay);
            }
        }
    }

    /// The received ranges an ACK reports, highest first, inclusive: those within
    /// [`ACK_HORIZON`] of the largest.
    pub(crate) fn reported(
        &self,
    ) -> impl Iterator<Item = std::ops::RangeInclusive<u64>> + Clone + '_ {
        let floor = self
            .largest
            .map_or(0, |(l, _)| l.saturating_sub(ACK_HORIZON));
        self.received
            .iter_rev()
            .take_while(move |r| r.end > floor)
            .map(move |r| r.start.max(floor)..=r.end - 1)
    }

    /// Whether an ACK should be sent at `now`.
    pub(crate) fn wants_ack(&self, now: Instant) -> bool {
        self.dirty && (self.immediate || self.deadline.is_some_and(|d| d <= now))
    }

    /// An ACK was just written.
    pub(crate) fn on_ack_sent(&mut self) {
        self.unacked_eliciting = 0;
        self.immediate = false;
        self.deadline = None;
        self.dirty = false;
        self.nack.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(now: Instant) -> SentPacket {
        SentPacket {
            time: now,
            size: 1000,
            ack_eliciting: true,
            in_flight: true,
            app_limited: false,
            frames: SentFrames::new(),
        }
    }

    #[test]
    fn packet_threshold_loss() {
        let now = crate::cc::testing::epoch();
        let mut s = SentPackets::default();
        for _ in 0..5 {
            let pn = s.take_pn();
            s.on_sent(pn, pkt(now));
        }
        assert_eq!(s.bytes_in_flight, 5000);
        let mut rtt = RttEstimator::new(Duration::from_millis(100));
        let mut out = Outcome::default();
        s.on_ack(
            now,
            [4..=4].into_iter(),
            4,
            Duration::ZERO,
            &mut rtt,
            &mut out,
        )
        .unwrap();
        s.detect_lost(now, &rtt, &mut out);
        let lost: Vec<u64> = out.lost.iter().map(|(pn, _)| *pn).collect();
        assert_eq!(lost, vec![0, 1], "3 packets behind the largest acked");
        assert!(s.loss_time.is_some(), "2 and 3 wait for the time threshold");
        let mut out = Outcome::default();
        assert!(s
            .on_ack(
                now,
                [9..=9].into_iter(),
                9,
                Duration::ZERO,
                &mut rtt,
                &mut out
            )
            .is_err());
    }

    #[test]
    fn gaps_trigger_nack_and_immediate_ack() {
        let now = crate::cc::testing::epoch();
        let mut a = AckTracker::default();
        a.on_packet(now, 0, true, 2, Duration::from_millis(10));
        assert!(!a.wants_ack(now));
        a.on_packet(now, 3, true, 10, Duration::from_millis(10));
        assert_eq!(a.nack, vec![1, 2]);
        assert!(a.wants_ack(now));
    }

    #[test]
    fn ack_frequency_requests_apply_in_sequence_order() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        assert_eq!(a.threshold(2), 2);
        a.on_ack_frequency(2, 5);
        // An older request arriving late changes nothing.
        a.on_ack_frequency(1, 3);
        assert_eq!(a.threshold(2), 5);
        for pn in 0..4 {
            a.on_packet(now, pn, true, a.threshold(2), delay);
            assert!(!a.wants_ack(now), "ACK after {} packets", pn + 1);
        }
        a.on_packet(now, 4, true, a.threshold(2), delay);
        assert!(a.wants_ack(now));
        a.on_ack_sent();
        // Still delayed at most max_ack_delay, and a gap is still acknowledged at once.
        a.on_packet(now, 5, true, a.threshold(2), delay);
        assert!(a.wants_ack(now + delay));
        a.on_packet(now, 7, true, a.threshold(2), delay);
        assert!(a.wants_ack(now));
    }

    #[test]
    fn acks_report_only_the_horizon_below_the_largest() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        for pn in (0..2000).filter(|pn| *pn != 5 && *pn != 1500) {
            a.on_packet(now, pn, true, 2, delay);
            let floor = pn.saturating_sub(ACK_HORIZON);
            let reported: Vec<_> = a.reported().collect();
            assert!(
                reported.iter().all(|r| *r.start() >= floor),
                "{pn}: {reported:?}"
            );
            assert_eq!(reported.first().map(|r| *r.end()), Some(pn));
        }
        let reported: Vec<_> = a.reported().collect();
        assert_eq!(reported, vec![1501..=1999, 1999 - ACK_HORIZON..=1499]);
        // Trimmed, within a step of the horizon.
        assert!(a.received.first().unwrap().start + ACK_TRIM_STEP >= 1999 - ACK_HORIZON);
    }
}
