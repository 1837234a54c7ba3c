//! Loss recovery (DESIGN.md F9, docs/PROTOCOL.md §11): per-path packet numbers, ACK ranges,
//! immediate NACKs, time- and packet-threshold loss detection and probe timeouts, in the
//! manner of RFC 9002 plus UDT's loss lists; a reordering allowance that adapts to what the
//! path does (RFC 8985's RACK), spurious-loss detection, and ECN (`ecn`).
//!
//! A packet is declared lost only on evidence: later packets were acknowledged and it is
//! later than the path's reordering allows, in packets (`ReorderAllowance::packet_threshold`)
//! or in time (`ReorderAllowance::window` beyond the RTT). A NACK is a verdict only until
//! the path has been seen to reorder; after that it is a hint the thresholds confirm. Lost
//! packets are remembered for a few round trips: an acknowledgement that arrives for one
//! after all marks the loss spurious, widens the allowance, and undoes the congestion
//! response once every loss behind it proves spurious.

pub mod ecn;
mod ranges;
pub mod rtt;

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

pub use ecn::{EcnCodepoint, EcnCounts, EcnState};
pub use ranges::RangeSet;
pub use rtt::RttEstimator;

use crate::flow::FlowId;
use crate::wire::{AckRanges, NackList};

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
    /// An AckFrequency for this path (the current request is resent if lost).
    AckFrequency(u32),
    /// An ACK that described everything received in `floor..=largest`: once the peer has it
    /// (this packet is acknowledged), those numbers need never be reported again.
    Ack {
        path: u32,
        floor: u64,
        largest: u64,
    },
    /// A PathChallenge on this path (a new one is sent if it is lost and the path is still
    /// unvalidated).
    PathChallenge(u32),
    /// AddAddress frames (our advertised addresses are resent if lost).
    AddAddress,
    /// A RemoveAddress with this sequence number (resent if lost).
    RemoveAddress(u64),
    /// A PathStatus for this path (the current status is resent if lost).
    PathStatus(u32),
    /// A ProbeReport on train `train` of path `path` (resent if lost and still the latest).
    ProbeReport {
        path: u32,
        train: u64,
    },
    /// A PMTU probe of this size (Ping and padding: nothing is resent, and its loss is not
    /// congestion).
    PmtuProbe(u16),
}

impl SentFrame {
    /// Application data: flow or message bytes (datagrams are not recorded, never resent).
    pub(crate) fn is_data(&self) -> bool {
        matches!(self, SentFrame::Flow { .. } | SentFrame::Message { .. })
    }
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
    /// Left marked ECT(0).
    pub(crate) ecn: bool,
    /// A redundant copy of data sent on another path: acknowledging it counts, losing it
    /// resends nothing (the original's loss does).
    pub(crate) copy: bool,
    /// When a packet sent after this one was first acknowledged while this one was not: from
    /// then on it is late, and the reordering window counts from here.
    pub(crate) overtaken: Option<Instant>,
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
    /// The number of the packet the last tail-loss probe resent (not the probe's own).
    pub(crate) tail_probed: Option<u64>,
    /// How late a packet may be before it counts as lost.
    pub(crate) reorder: ReorderAllowance,
    /// Packets declared lost, kept a few round trips to recognise a late acknowledgement.
    declared_lost: BTreeMap<u64, LostPacket>,
    /// The losses behind the controller's latest reduction, while it can still be undone.
    episode: Option<LossEpisode>,
    /// Numbers the loss episodes (a record names the one it belongs to).
    next_episode: u64,
    /// When the path's first RTT sample was taken: packets sent before it take no part in
    /// persistent congestion (RFC 9002 §7.6.2).
    pub(crate) first_rtt_sample: Option<Instant>,
    /// Packets numbered below this give no RTT sample (Karn): a server's packets sent before
    /// it resent its handshake response can be opened only once a copy of the response
    /// arrived, and which one did is unknown.
    pub(crate) no_rtt_sample_below: u64,
}

/// A packet declared lost, remembered so that its late acknowledgement is recognised.
#[derive(Debug, Clone)]
pub(crate) struct LostPacket {
    pub(crate) sent: Instant,
    /// See [`SentPacket::overtaken`].
    overtaken: Option<Instant>,
    /// What it carried: a late acknowledgement still frees it (and cancels a resend that has
    /// not left yet).
    pub(crate) frames: SentFrames,
    /// The loss episode it belongs to, if it counted toward one.
    episode: Option<u64>,
    /// Taken off its path unanswered (`abandon`: the path went silent or moved), not found
    /// lost: a late acknowledgement says nothing about reordering or a congestion episode.
    pub(crate) rerouted: bool,
}

/// Losses that led to one congestion response, and how many of them are not yet known to be
/// spurious. At zero, the response is undone.
#[derive(Debug, Clone, Copy)]
struct LossEpisode {
    id: u64,
    outstanding: u64,
}

/// At most this many lost packets are remembered per path; the oldest go first.
const MAX_DECLARED_LOST: usize = 4096;

/// How much reordering the path has shown: the packet and time thresholds of loss detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReorderAllowance {
    /// A packet is lost once a packet this many numbers after it was acknowledged.
    pub(crate) packet_threshold: u64,
    /// A packet is lost no sooner than this long after a later packet was acknowledged
    /// (and, as in RFC 9002, no sooner than 9/8 RTT after it was sent).
    pub(crate) window: Duration,
    /// When reordering was last observed (the allowance shrinks after a quiet spell).
    last_seen: Option<Instant>,
}

impl Default for ReorderAllowance {
    fn default() -> Self {
        Self {
            packet_threshold: PACKET_THRESHOLD,
            window: Duration::ZERO,
            last_seen: None,
        }
    }
}

/// The largest packet threshold reordering can raise (beyond it, time decides alone).
pub(crate) const MAX_PACKET_THRESHOLD: u64 = 1 << 16;
/// Round trips without reordering after which the allowance halves.
const REORDER_QUIET_RTTS: u32 = 16;

impl ReorderAllowance {
    /// Whether this path has been seen to reorder (then a NACK alone convicts no packet).
    pub(crate) fn seen(&self) -> bool {
        self.last_seen.is_some()
    }

    /// A packet was acknowledged `distance` numbers below the largest acknowledged before it,
    /// `late` after a packet sent after it was: it was overtaken. Grow the allowance to let
    /// such a packet through next time, with a quarter to spare; twice as much if the packet
    /// had been declared lost (`spurious`): the allowance was already behind, typically
    /// because the sending rate (and with it the distance) keeps growing. RFC 8985 grows its
    /// window in steps of min_rtt/4 on each spurious retransmission for the same purpose.
    /// Lateness is measured between acknowledgements, not against the RTT, so a queue that
    /// fills or drains meanwhile does not count as reordering.
    fn observe(
        &mut self,
        now: Instant,
        distance: u64,
        late: Duration,
        spurious: bool,
        rtt: &RttEstimator,
    ) {
        let (distance, late) = if spurious {
            (distance.saturating_mul(2), late.saturating_mul(2))
        } else {
            (
                distance.saturating_add(distance / 4),
                late.saturating_add(late / 4),
            )
        };
        self.packet_threshold = self
            .packet_threshold
            .max(distance.saturating_add(1))
            .min(MAX_PACKET_THRESHOLD);
        let cap = rtt.smoothed().saturating_mul(4).max(MIN_REORDER_WINDOW_CAP);
        self.window = self.window.max(late).min(cap);
        self.last_seen = Some(now);
    }

    /// Halves the allowance after a long spell without reordering, back to RFC 9002's
    /// defaults: a path that reordered once during a handover is not penalised forever.
    fn decay(&mut self, now: Instant, rtt: &RttEstimator) {
        let Some(seen) = self.last_seen else {
            return;
        };
        let quiet = rtt
            .smoothed()
            .saturating_mul(REORDER_QUIET_RTTS)
            .max(MIN_QUIET);
        if now.saturating_duration_since(seen) < quiet {
            return;
        }
        self.packet_threshold = (self.packet_threshold / 2).max(PACKET_THRESHOLD);
        self.window /= 2;
        self.last_seen = if self.packet_threshold == PACKET_THRESHOLD
            && self.window < crate::recovery::rtt::GRANULARITY
        {
            self.window = Duration::ZERO;
            None
        } else {
            Some(now)
        };
    }

    /// When a packet sent at `sent` and overtaken at `overtaken` counts as lost by time:
    /// RFC 9002's `9/8 · max(srtt, latest_rtt)` after it was sent, and no sooner than the
    /// reordering window after it was overtaken.
    pub(crate) fn lost_at(&self, sent: Instant, overtaken: Instant, rtt: &RttEstimator) -> Instant {
        (sent + rtt.loss_delay()).max(overtaken + self.window)
    }
}

/// The reordering window may always reach this much, however short the RTT (scheduling on a
/// loaded host delays single packets by milliseconds).
const MIN_REORDER_WINDOW_CAP: Duration = Duration::from_millis(4);
/// The shortest quiet spell after which the allowance shrinks.
const MIN_QUIET: Duration = Duration::from_millis(100);

/// The result of processing acknowledgements or loss reports.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) acked: Vec<(u64, SentPacket)>,
    pub(crate) lost: Vec<(u64, SentPacket)>,
    /// Packets declared lost earlier and acknowledged now: they were only late.
    pub(crate) spurious: Vec<LostPacket>,
    /// Every loss behind the latest congestion response turned out spurious: undo it.
    pub(crate) undo: bool,
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
        ranges: impl Iterator<Item = std::ops::RangeInclusive<u64>> + Clone,
        largest: u64,
        ack_delay: Duration,
        rtt: &mut RttEstimator,
        out: &mut Outcome,
    ) -> Result<(), &'static str> {
        if largest >= self.next_pn {
            return Err("ACK of a packet never sent");
        }
        let previous_largest = self.largest_acked;
        let first_new = out.acked.len();
        let mut largest_newly_acked = None;
        for range in ranges.clone() {
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
        // Not from an ACK whose largest is below one acknowledged before (the receiver
        // forgot ranges an acknowledged ACK covered, then a straggler came): its ACK delay is
        // measured from another packet's arrival.
        let straggler = previous_largest.is_some_and(|l| largest < l);
        if largest_newly_acked == Some(largest) && !straggler && largest >= self.no_rtt_sample_below
        {
            if let Some((_, p)) = out.acked.iter().find(|(pn, _)| *pn == largest) {
                if out.acked.iter().any(|(_, p)| p.ack_eliciting) {
                    let sample = now.saturating_duration_since(p.time);
                    rtt.update(ack_delay, sample);
                    out.rtt_sample = Some(sample);
                    self.first_rtt_sample.get_or_insert(now);
                }
            }
        }
        // Packets acknowledged below a number acknowledged by an earlier ACK arrived after
        // it: the path reorders (every ACK reports all that was received, so nothing else
        // explains it). Measure by how much, in numbers and in time.
        if let Some(previous) = previous_largest {
            for (pn, p) in &out.acked[first_new..] {
                if *pn < previous {
                    let late = p
                        .overtaken
                        .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                    self.reorder.observe(now, previous - pn, late, false, rtt);
                }
            }
        }
        if !self.declared_lost.is_empty() {
            self.find_spurious(now, ranges, rtt, out);
            self.forget_old_losses(now, rtt);
        }
        self.reorder.decay(now, rtt);
        if out.acked.len() > first_new || !out.spurious.is_empty() {
            self.pto_count = 0;
        }
        if self.packets.is_empty() {
            // An emptied map keeps its root node (1.4 kB): an idle connection gives it back.
            self.packets = BTreeMap::new();
        }
        Ok(())
    }

    /// Lost packets the ACK acknowledges: they were late, not lost. Each widens the
    /// reordering allowance; if they were the last of the losses behind the congestion
    /// response, that response is undone.
    fn find_spurious(
        &mut self,
        now: Instant,
        ranges: impl Iterator<Item = std::ops::RangeInclusive<u64>>,
        rtt: &RttEstimator,
        out: &mut Outcome,
    ) {
        let largest = self.largest_acked.unwrap_or_default();
        for range in ranges {
            let found: Vec<u64> = self.declared_lost.range(range).map(|(&pn, _)| pn).collect();
            for pn in found {
                let Some(lost) = self.declared_lost.remove(&pn) else {
                    continue;
                };
                let late = lost
                    .overtaken
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                if !lost.rerouted {
                    self.reorder
                        .observe(now, largest.saturating_sub(pn), late, true, rtt);
                }
                if let (Some(e), Some(id)) = (self.episode.as_mut(), lost.episode) {
                    if e.id == id {
                        e.outstanding = e.outstanding.saturating_sub(1);
                        if e.outstanding == 0 {
                            self.episode = None;
                            out.undo = true;
                        }
                    }
                }
                out.spurious.push(lost);
            }
        }
    }

    /// Packets the receiver reported missing (NACK, UDT's loss list). On a path that has not
    /// been seen to reorder, a gap means loss and the packets are lost at once; once it has,
    /// a gap may be reordering and the packet and time thresholds decide (the ACK that came
    /// with the NACK has already run them).
    pub(crate) fn on_nack(&mut self, missing: impl Iterator<Item = u64>, out: &mut Outcome) {
        if self.reorder.seen() {
            return;
        }
        for pn in missing {
            if pn >= self.next_pn {
                break;
            }
            if let Some(p) = self.remove(pn) {
                out.lost.push((pn, p));
            }
        }
    }

    /// RFC 9002 §6.1 loss detection against the largest acknowledged packet, with the
    /// thresholds of the path's reordering allowance.
    pub(crate) fn detect_lost(&mut self, now: Instant, rtt: &RttEstimator, out: &mut Outcome) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let threshold = self.reorder.packet_threshold;
        let mut lost = Vec::new();
        for (&pn, p) in self.packets.range_mut(..largest) {
            let overtaken = *p.overtaken.get_or_insert(now);
            let at = self.reorder.lost_at(p.time, overtaken, rtt);
            if at <= now || largest - pn >= threshold {
                lost.push(pn);
            } else {
                self.loss_time = Some(self.loss_time.map_or(at, |l| l.min(at)));
            }
        }
        for pn in lost {
            if let Some(p) = self.remove(pn) {
                out.lost.push((pn, p));
            }
        }
    }

    /// Remembers packets just declared lost. `reduced` = the controller reduced its window
    /// for them: they open a new loss episode. Otherwise they join the open episode (a real
    /// loss among them means the response was right), if any.
    pub(crate) fn record_losses(
        &mut self,
        now: Instant,
        lost: &[(u64, SentPacket)],
        reduced: bool,
        rtt: &RttEstimator,
    ) {
        self.record(now, lost, reduced, false, rtt);
    }

    /// [`record_losses`](Self::record_losses), or with `rerouted` the packets `abandon` took
    /// off the path (no episode).
    fn record(
        &mut self,
        now: Instant,
        lost: &[(u64, SentPacket)],
        reduced: bool,
        rerouted: bool,
        rtt: &RttEstimator,
    ) {
        if reduced {
            self.next_episode += 1;
            self.episode = Some(LossEpisode {
                id: self.next_episode,
                outstanding: 0,
            });
        }
        let episode = self.episode.map(|e| e.id);
        for (pn, p) in lost {
            let record = LostPacket {
                sent: p.time,
                overtaken: p.overtaken,
                frames: p.frames.clone(),
                episode: episode.filter(|_| p.in_flight && !rerouted),
                rerouted,
            };
            if record.episode.is_some() {
                if let Some(e) = self.episode.as_mut() {
                    e.outstanding += 1;
                }
            }
            self.declared_lost.insert(*pn, record);
        }
        self.forget_old_losses(now, rtt);
    }

    /// Drops lost-packet records too old for a late acknowledgement to be plausible (three
    /// probe timeouts plus the reordering window after they were sent), and the oldest past
    /// [`MAX_DECLARED_LOST`]. A dropped record of the open episode was a real loss, as far as
    /// anyone will know: the episode can no longer be undone.
    fn forget_old_losses(&mut self, now: Instant, rtt: &RttEstimator) {
        let horizon = rtt
            .pto_base()
            .saturating_mul(3)
            .saturating_add(self.reorder.window);
        let mut len = self.declared_lost.len();
        while let Some(entry) = self.declared_lost.first_entry() {
            let too_old = now.saturating_duration_since(entry.get().sent) > horizon;
            if !too_old && len <= MAX_DECLARED_LOST {
                break;
            }
            let lost = entry.remove();
            len -= 1;
            if lost.episode.is_some() && lost.episode == self.episode.map(|e| e.id) {
                self.episode = None;
            }
        }
    }

    /// Lost packets still remembered (for tests and stats).
    #[cfg(test)]
    pub(crate) fn remembered_losses(&self) -> usize {
        self.declared_lost.len()
    }

    /// The path moved to another network path: what recovery learnt on the old one (probe
    /// backoff, the reordering allowance, the first RTT sample's time that persistent
    /// congestion counts from) does not describe the new one.
    pub(crate) fn on_new_network_path(&mut self) {
        self.pto_count = 0;
        self.last_pto = None;
        self.tail_probed = None;
        self.reorder = ReorderAllowance::default();
        self.first_rtt_sample = None;
    }

    /// Takes every outstanding packet off this path (it stopped answering): their frames go
    /// to other paths. They are remembered as losses, so that a late acknowledgement marks
    /// them spurious instead of being refused.
    pub(crate) fn abandon(&mut self, now: Instant, rtt: &RttEstimator) -> Vec<(u64, SentPacket)> {
        let all: Vec<(u64, SentPacket)> = std::mem::take(&mut self.packets).into_iter().collect();
        self.bytes_in_flight = 0;
        self.loss_time = None;
        self.record(now, &all, false, true, rtt);
        all
    }

    /// Takes the outstanding packets off if they are all PMTU probes (a probe timeout with
    /// nothing but probes out declares them lost instead of probing).
    pub(crate) fn take_if_only_pmtu_probes(&mut self) -> Vec<(u64, SentPacket)> {
        let only = !self.packets.is_empty()
            && self
                .packets
                .values()
                .all(|p| matches!(p.frames.first(), Some(SentFrame::PmtuProbe(_))));
        if !only {
            return Vec::new();
        }
        self.loss_time = None;
        let all: Vec<(u64, SentPacket)> = std::mem::take(&mut self.packets).into_iter().collect();
        for (_, p) in &all {
            if p.in_flight {
                self.bytes_in_flight -= u64::from(p.size);
            }
        }
        all
    }

    /// The oldest ack-eliciting packet still outstanding (for probe content).
    pub(crate) fn oldest_ack_eliciting(&self) -> Option<&SentPacket> {
        self.packets.values().next()
    }

    /// The oldest outstanding packet a tail-loss probe may resend, and its number: newer than
    /// the last one probed, neither a redundant copy (its loss resends nothing) nor a PMTU
    /// probe (whose loss is not a loss of data, §5.5).
    pub(crate) fn tail_probe_candidate(&self) -> Option<(u64, &SentPacket)> {
        let from = self.tail_probed.map_or(0, |t| t.saturating_add(1));
        self.packets
            .range(from..)
            .find(|(_, p)| !p.copy && !matches!(p.frames.first(), Some(SentFrame::PmtuProbe(_))))
            .map(|(&pn, p)| (pn, p))
    }

    /// Whether ack-eliciting packets are outstanding (only those are kept).
    pub(crate) fn has_ack_eliciting_in_flight(&self) -> bool {
        !self.packets.is_empty()
    }
}

/// What the peer said it received, in the frame that revealed a batch of losses: the
/// evidence [`persistent_congestion`] needs that nothing between two lost packets arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PeerReport<'a> {
    /// An ACK. It reports every number received above the peer's floor (§11.1: numbers are
    /// dropped only once the peer knows we saw them), so at and above its smallest number it
    /// is complete; below, we do not know.
    Ack(AckRanges<'a>),
    /// A NACK: the numbers between two listed ones were received.
    Nack(NackList<'a>),
    /// Nothing new (losses by the time threshold): no batch of them establishes persistent
    /// congestion; the ACK that ended a blackout has already declared its packets lost.
    Nothing,
}

impl PeerReport<'_> {
    /// Lowest number the report covers.
    fn known_from(&self) -> u64 {
        match self {
            PeerReport::Ack(ranges) => ranges.smallest(),
            PeerReport::Nack(list) => list.first(),
            PeerReport::Nothing => u64::MAX,
        }
    }

    /// The received ranges the report shows, from the largest down.
    fn received(&self) -> Vec<RangeInclusive<u64>> {
        match self {
            PeerReport::Ack(ranges) => ranges.iter().collect(),
            PeerReport::Nack(list) => {
                let mut gaps = Vec::new();
                let mut prev: Option<u64> = None;
                for pn in list.iter() {
                    if let Some(p) = prev.filter(|p| pn > p + 1) {
                        gaps.push(p + 1..=pn - 1);
                    }
                    prev = Some(pn);
                }
                gaps.reverse();
                gaps
            }
            PeerReport::Nothing => Vec::new(),
        }
    }
}

/// RFC 9002 §7.6.2: whether one batch of `lost` packets (any order) establishes persistent
/// congestion: two of them, ack-eliciting and in flight, both sent after the path's first RTT
/// sample, sent more than `period` apart, with no packet sent between them acknowledged as
/// far as `report` shows. A packet below what the report covers takes no part (whether
/// something next to it arrived is unknown), so a doubt never collapses the window.
pub(crate) fn persistent_congestion(
    lost: &[(u64, SentPacket)],
    first_rtt_sample: Option<Instant>,
    period: Duration,
    report: &PeerReport<'_>,
) -> bool {
    let Some(first_sample) = first_rtt_sample else {
        return false;
    };
    let known_from = report.known_from();
    let mut candidates: Vec<(u64, Instant)> = lost
        .iter()
        .filter(|(pn, p)| {
            *pn >= known_from && p.ack_eliciting && p.in_flight && p.time > first_sample
        })
        .map(|(pn, p)| (*pn, p.time))
        .collect();
    if candidates.len() < 2 {
        return false;
    }
    candidates.sort_unstable_by_key(|&(pn, _)| std::cmp::Reverse(pn));
    let received = report.received();
    let mut received = received.iter().peekable();
    // From the newest down: a run of lost packets ends where a received number lies between
    // two neighbours; within a run, its newest and oldest packet are compared.
    let (mut newest, mut above) = (candidates[0].1, candidates[0].0);
    for &(pn, time) in &candidates[1..] {
        while received.peek().is_some_and(|r| *r.start() >= above) {
            received.next();
        }
        // A lost number is in no received range: a range starting below `above` and ending
        // above `pn` lies between them.
        if received.peek().is_some_and(|r| *r.end() > pn) {
            newest = time;
        } else if newest.saturating_duration_since(time) > period {
            return true;
        }
        above = pn;
    }
    false
}

/// The receiver's record of one path's packet-number space: what to acknowledge and when.
///
/// Every received number is reported in every ACK until the peer acknowledges a packet that
/// carried an ACK covering it (RFC 9000 §13.2.4): then the peer knows, and those numbers are
/// dropped. So an ACK never forgets a packet the peer might still be waiting on, however many
/// arrive between two ACKs.
#[derive(Debug, Default)]
pub(crate) struct AckTracker {
    pub(crate) received: RangeSet,
    pub(crate) largest: Option<(u64, Instant)>,
    /// Ack-eliciting packets received since the last ACK we sent.
    pub(crate) unacked_eliciting: u32,
    /// An ACK must go out now (gap, late arrival, request without data, CE mark).
    pub(crate) immediate: bool,
    /// `threshold` ack-eliciting packets are unacknowledged: an ACK goes now unless the
    /// sender said it fell silent (`answer_awaited`).
    pub(crate) count_reached: bool,
    /// The latest ack-eliciting packet carried an AckRequest with a message: its sender has
    /// nothing more to send, so no window waits on this ACK's clock, and the answer it is
    /// likely to get can carry the ACK within [`RESPONSE_WINDOW`].
    pub(crate) answer_awaited: bool,
    /// The packet being processed carried such a request (set before `on_packet`).
    request_on_this_packet: bool,
    /// Deadline for a delayed ACK.
    pub(crate) deadline: Option<Instant>,
    /// Packet numbers to report missing at once (SLTP NACK / UDT NAK).
    pub(crate) nack: Vec<u64>,
    /// Something new arrived since the last ACK.
    pub(crate) dirty: bool,
    /// The peer's latest AckFrequency: (sequence, threshold).
    pub(crate) requested: Option<(u64, u32)>,
    /// ECN codepoints of the packets received (echoed in ACK_ECN frames).
    pub(crate) ecn: EcnCounts,
}

/// At most this many ACK ranges are remembered: with acknowledged ACKs trimmed away, more
/// gaps than this means packets far older than any reordering the path shows, long
/// declared lost by the sender (who resent their data under new numbers).
pub(crate) const MAX_ACK_RANGES: usize = 64;
/// At most this many packet numbers go in one NACK.
pub(crate) const MAX_NACK: usize = 64;
/// How long an ACK asked for by an AckRequest on a data-carrying packet may wait for the
/// application's answer to carry it (a request's reply, an echo). Without it, every request
/// and every reply cost an ACK-only datagram and a wake-up of the other end.
pub(crate) const RESPONSE_WINDOW: Duration = Duration::from_millis(1);

impl AckTracker {
    /// The peer asked for an ACK every `threshold` ack-eliciting packets; requests arriving
    /// out of order are ignored.
    pub(crate) fn on_ack_frequency(&mut self, sequence: u64, threshold: u32) {
        if self.requested.is_none_or(|(s, _)| sequence > s) {
            self.requested = Some((sequence, threshold));
        }
    }

    /// The packet being processed carried an AckRequest (§9.5). Without application data
    /// (a PTO or PMTU probe) the ACK goes at once; with data it may wait
    /// [`RESPONSE_WINDOW`] (at most `max_delay`) for the application's answer, and with a
    /// message (`message`: a request the application may answer) even past the ACK
    /// threshold. A flow's sender that falls silent may be waiting on this very ACK to free
    /// its send buffer, so flows keep the threshold. Called before `on_packet` for the same
    /// packet, which keeps the earlier deadline.
    pub(crate) fn on_ack_request(
        &mut self,
        now: Instant,
        app_data: bool,
        message: bool,
        max_delay: Duration,
    ) {
        if app_data {
            let soon = now + max_delay.min(RESPONSE_WINDOW);
            self.deadline = Some(self.deadline.map_or(soon, |d| d.min(soon)));
            self.request_on_this_packet = message;
        } else {
            self.immediate = true;
        }
    }

    /// Ack-eliciting packets per ACK: the peer's request, else our default.
    pub(crate) fn threshold(&self, default: u32) -> u32 {
        self.requested.map_or(default, |(_, t)| t)
    }

    /// Records a received, authenticated packet and the ECN codepoint it arrived with.
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        pn: u64,
        ack_eliciting: bool,
        ecn: Option<EcnCodepoint>,
        frequency: u32,
        max_delay: Duration,
    ) {
        match self.largest {
            Some((largest, _)) if pn > largest + 1 => {
                // A gap: report the missing numbers now rather than waiting for the sender's
                // thresholds (SLTP NACK). The sender convicts on it only while the path has
                // not been seen to reorder.
                for missing in largest + 1..pn {
                    if self.nack.len() >= MAX_NACK {
                        break;
                    }
                    self.nack.push(missing);
                }
                self.immediate = true;
            }
            Some((largest, _)) if pn < largest => {
                // A late arrival fills a gap: tell the sender soon so it stops resending
                // (and learns the loss it may have declared was spurious).
                self.immediate = true;
            }
            _ => {}
        }
        if self.largest.is_none_or(|(l, _)| pn > l) {
            self.largest = Some((pn, now));
        }
        self.received.insert(pn..pn + 1);
        self.received.keep_highest(MAX_ACK_RANGES);
        self.ecn.on_packet(ecn);
        //= RFC 9000 §13.2.1: "an endpoint SHOULD immediately acknowledge all packets
        //# [...] when the packet has ECN-CE"
        if ecn == Some(EcnCodepoint::Ce) {
            self.immediate = true;
        }
        self.dirty = true;
        let answer_awaited = std::mem::take(&mut self.request_on_this_packet);
        if ack_eliciting {
            self.answer_awaited = answer_awaited;
            self.unacked_eliciting += 1;
            if self.unacked_eliciting >= frequency {
                self.count_reached = true;
            } else if self.deadline.is_none() {
                self.deadline = Some(now + max_delay);
            }
        }
    }

    /// The received ranges an ACK reports, highest first, inclusive.
    pub(crate) fn reported(
        &self,
    ) -> impl Iterator<Item = std::ops::RangeInclusive<u64>> + Clone + '_ {
        self.received.iter_rev().map(|r| r.start..=r.end - 1)
    }

    /// The peer acknowledged a packet carrying an ACK that described all we had received in
    /// `floor..=largest`: it need not hear of those numbers again.
    pub(crate) fn on_ack_acknowledged(&mut self, floor: u64, largest: u64) {
        self.received.remove(floor..largest.saturating_add(1));
    }

    /// Whether an ACK should be sent at `now`.
    pub(crate) fn wants_ack(&self, now: Instant) -> bool {
        self.dirty
            && (self.immediate
                || (self.count_reached && !self.answer_awaited)
                || self.deadline.is_some_and(|d| d <= now))
    }

    /// An ACK was just written.
    pub(crate) fn on_ack_sent(&mut self) {
        self.unacked_eliciting = 0;
        self.immediate = false;
        self.count_reached = false;
        self.answer_awaited = false;
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
            ecn: false,
            copy: false,
            overtaken: None,
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
        a.on_packet(now, 0, true, None, 2, Duration::from_millis(10));
        assert!(!a.wants_ack(now));
        a.on_packet(now, 3, true, None, 10, Duration::from_millis(10));
        assert_eq!(a.nack, vec![1, 2]);
        assert!(a.wants_ack(now));
    }

    #[test]
    fn an_ack_request_with_data_waits_for_the_answer_without_data_not() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        // A request's last packet: the ACK may wait a little for the reply to carry it.
        a.on_ack_request(now, true, true, delay);
        a.on_packet(now, 0, true, None, 10, delay);
        assert!(!a.wants_ack(now));
        assert_eq!(a.deadline, Some(now + RESPONSE_WINDOW));
        assert!(a.wants_ack(now + RESPONSE_WINDOW));
        a.on_ack_sent();
        // A probe (Ping + AckRequest, no data) is answered at once.
        a.on_ack_request(now, false, false, delay);
        a.on_packet(now, 1, true, None, 10, delay);
        assert!(a.wants_ack(now));
        a.on_ack_sent();
        // Never later than the advertised max_ack_delay.
        let short = Duration::from_micros(300);
        a.on_ack_request(now, true, true, short);
        a.on_packet(now, 2, true, None, 10, short);
        assert_eq!(a.deadline, Some(now + Duration::from_micros(300)));
    }

    #[test]
    fn a_silent_sender_gets_its_ack_on_the_answer_even_past_the_threshold() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        // Three packets of a request, the last one asking: the threshold of 2 is passed,
        // but the sender has fallen silent, so the ACK waits for the reply.
        a.on_packet(now, 0, true, None, 2, delay);
        a.on_packet(now, 1, true, None, 2, delay);
        a.on_ack_request(now, true, true, delay);
        a.on_packet(now, 2, true, None, 2, delay);
        assert!(!a.wants_ack(now));
        assert!(a.wants_ack(now + RESPONSE_WINDOW));
        // More data after it without a request: the sender is sending again, and its window
        // waits on the ACK clock.
        a.on_packet(now, 3, true, None, 2, delay);
        assert!(a.wants_ack(now));
        a.on_ack_sent();
        // A gap is still reported at once, request or not.
        a.on_ack_request(now, true, true, delay);
        a.on_packet(now, 5, true, None, 2, delay);
        assert!(a.wants_ack(now));
        a.on_ack_sent();
        // A flow's last packet keeps the threshold: its sender may be waiting on this ACK to
        // free its send buffer, and no answer is expected.
        a.on_packet(now, 6, true, None, 2, delay);
        a.on_ack_request(now, true, false, delay);
        a.on_packet(now, 7, true, None, 2, delay);
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
            a.on_packet(now, pn, true, None, a.threshold(2), delay);
            assert!(!a.wants_ack(now), "ACK after {} packets", pn + 1);
        }
        a.on_packet(now, 4, true, None, a.threshold(2), delay);
        assert!(a.wants_ack(now));
        a.on_ack_sent();
        // Still delayed at most max_ack_delay, and a gap is still acknowledged at once.
        a.on_packet(now, 5, true, None, a.threshold(2), delay);
        assert!(a.wants_ack(now + delay));
        a.on_packet(now, 7, true, None, a.threshold(2), delay);
        assert!(a.wants_ack(now));
    }

    #[test]
    fn acks_report_every_packet_until_an_acknowledged_ack_covers_it() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        // Thousands of packets between two ACKs (a large receive batch): none is forgotten.
        for pn in (0..5000).filter(|pn| *pn != 5 && *pn != 1500) {
            a.on_packet(now, pn, true, None, 64, delay);
        }
        let reported: Vec<_> = a.reported().collect();
        assert_eq!(reported, vec![1501..=4999, 6..=1499, 0..=4]);
        // The peer acknowledged a packet whose ACK covered up to 3000 completely.
        a.on_ack_acknowledged(0, 3000);
        a.on_packet(now, 5000, true, None, 64, delay);
        let reported: Vec<_> = a.reported().collect();
        assert_eq!(reported, vec![3001..=5000]);
        // A straggler below the trimmed part is still reported (the sender may be waiting).
        a.on_packet(now, 5, true, None, 64, delay);
        assert_eq!(a.reported().last(), Some(5..=5));
        assert!(a.wants_ack(now), "a late arrival is acknowledged at once");
    }

    #[test]
    fn ce_marks_are_counted_and_acknowledged_at_once() {
        let now = crate::cc::testing::epoch();
        let delay = Duration::from_millis(10);
        let mut a = AckTracker::default();
        a.on_packet(now, 0, true, Some(EcnCodepoint::Ect0), 10, delay);
        assert!(!a.wants_ack(now));
        a.on_packet(now, 1, true, Some(EcnCodepoint::Ce), 10, delay);
        assert!(a.wants_ack(now));
        assert_eq!(
            a.ecn,
            EcnCounts {
                ect0: 1,
                ect1: 0,
                ce: 1
            }
        );
    }

    /// Sends `n` packets at 1 ms intervals from `start`.
    fn send(s: &mut SentPackets, start: Instant, n: u64) {
        for i in 0..n {
            let pn = s.take_pn();
            s.on_sent(pn, pkt(start + Duration::from_millis(i)));
        }
    }

    /// A path with a 20 ms RTT estimate and `n` packets sent 1 ms apart from the returned
    /// start.
    fn sent(n: u64) -> (Instant, RttEstimator, SentPackets) {
        let t0 = crate::cc::testing::epoch();
        let mut s = SentPackets::default();
        send(&mut s, t0, n);
        (t0, RttEstimator::new(Duration::from_millis(20)), s)
    }

    fn ack(
        s: &mut SentPackets,
        now: Instant,
        ranges: &[std::ops::RangeInclusive<u64>],
        rtt: &mut RttEstimator,
    ) -> Outcome {
        let mut out = Outcome::default();
        let largest = *ranges[0].end();
        s.on_ack(
            now,
            ranges.iter().cloned(),
            largest,
            Duration::ZERO,
            rtt,
            &mut out,
        )
        .unwrap();
        s.detect_lost(now, rtt, &mut out);
        out
    }

    #[test]
    fn an_ack_whose_largest_went_back_gives_no_rtt_sample() {
        let ms = Duration::from_millis;
        let (t0, mut rtt, mut s) = sent(10);
        let out = ack(&mut s, t0 + ms(20), &[6..=6], &mut rtt);
        assert!(out.rtt_sample.is_some());
        // The receiver forgot 6 (an acknowledged ACK covered it); 5 straggles in and is
        // acknowledged alone.
        let out = ack(&mut s, t0 + ms(21), &[5..=5], &mut rtt);
        assert_eq!(out.acked.len(), 1);
        assert_eq!(out.rtt_sample, None, "its delay is another packet's");
    }

    #[test]
    fn a_late_ack_of_packets_taken_off_a_silent_path_is_no_reordering() {
        let ms = Duration::from_millis;
        let (t0, mut rtt, mut s) = sent(10);
        ack(&mut s, t0 + ms(21), &[0..=1], &mut rtt);
        // The path goes silent (or moves): everything outstanding goes elsewhere.
        assert_eq!(s.abandon(t0 + ms(100), &rtt).len(), 8);
        // It had arrived after all: the frames are freed, but nothing was reordered.
        let out = ack(&mut s, t0 + ms(120), &[0..=9], &mut rtt);
        assert_eq!(out.spurious.len(), 8);
        assert!(out.spurious.iter().all(|l| l.rerouted));
        assert!(!out.undo);
        assert!(
            !s.reorder.seen(),
            "threshold {}",
            s.reorder.packet_threshold
        );
    }

    #[test]
    fn a_late_packet_is_a_spurious_loss_and_widens_the_allowance() {
        let ms = Duration::from_millis;
        let (t0, mut rtt, mut s) = sent(10);
        // 0..=1 and 3..=9 arrive; 2 is held back 15 ms on the way.
        ack(&mut s, t0 + ms(21), &[0..=1], &mut rtt);
        let out = ack(&mut s, t0 + ms(29), &[3..=9, 0..=1], &mut rtt);
        let lost: Vec<u64> = out.lost.iter().map(|(pn, _)| *pn).collect();
        assert_eq!(
            lost,
            vec![2],
            "7 packets overtook it: lost by the packet threshold"
        );
        s.record_losses(t0 + ms(29), &out.lost, true, &rtt);
        assert_eq!(s.remembered_losses(), 1);
        // Then it arrives after all.
        let out = ack(&mut s, t0 + ms(37), &[2..=9, 0..=1], &mut rtt);
        assert_eq!(out.spurious.len(), 1);
        assert!(out.undo, "the only loss of the episode was spurious");
        assert_eq!(s.remembered_losses(), 0);
        assert_eq!(
            s.reorder.packet_threshold, 15,
            "overtaken by 7 while declared lost: twice"
        );
        // 8 ms after 3..=9 were acknowledged, twice over.
        assert_eq!(s.reorder.window, ms(16));
        assert!(s.reorder.seen());

        // The same reordering again: no loss declared this time.
        send(&mut s, t0 + ms(40), 10);
        let out = ack(&mut s, t0 + ms(62), &[13..=19, 0..=11], &mut rtt);
        assert!(out.lost.is_empty(), "{:?}", out.lost);
        assert!(s.loss_time.is_some());
        assert_eq!(s.loss_time, Some(t0 + ms(78)));
        let out = ack(&mut s, t0 + ms(70), &[0..=19], &mut rtt);
        assert!(out.lost.is_empty() && out.spurious.is_empty());
    }

    #[test]
    fn a_real_loss_is_still_declared_within_rtt_plus_the_window() {
        let t0 = crate::cc::testing::epoch();
        let ms = Duration::from_millis;
        let mut rtt = RttEstimator::new(ms(20));
        let mut s = SentPackets::default();
        s.reorder.observe(t0, 100, ms(10), false, &rtt);
        send(&mut s, t0, 10);
        ack(&mut s, t0 + ms(20), &[0..=1], &mut rtt);
        let out = ack(&mut s, t0 + ms(29), &[3..=9, 0..=1], &mut rtt);
        assert!(out.lost.is_empty(), "within the allowance");
        let deadline = s.loss_time.expect("loss timer armed");
        // One reordering window after a later packet's acknowledgement showed it missing
        // (3..=9, at 29 ms): about an RTT plus the window after it was sent.
        assert_eq!(deadline, t0 + ms(29) + s.reorder.window);
        let mut out = Outcome::default();
        s.detect_lost(deadline, &rtt, &mut out);
        assert_eq!(out.lost.len(), 1, "declared at the timer");
    }

    #[test]
    fn nacks_convict_only_until_the_path_reorders() {
        let t0 = crate::cc::testing::epoch();
        let mut s = SentPackets::default();
        send(&mut s, t0, 4);
        let mut out = Outcome::default();
        s.on_nack([1].into_iter(), &mut out);
        assert_eq!(out.lost.len(), 1);
        let rtt = RttEstimator::new(Duration::from_millis(20));
        s.reorder.observe(t0, 2, Duration::ZERO, false, &rtt);
        let mut out = Outcome::default();
        s.on_nack([2].into_iter(), &mut out);
        assert!(out.lost.is_empty(), "a hint now, not a verdict");
    }

    #[test]
    fn an_episode_with_one_real_loss_is_not_undone() {
        let ms = Duration::from_millis;
        let (t0, mut rtt, mut s) = sent(12);
        let out = ack(&mut s, t0 + ms(30), &[5..=11, 0..=0], &mut rtt);
        let lost: Vec<u64> = out.lost.iter().map(|(pn, _)| *pn).collect();
        assert_eq!(lost, vec![1, 2, 3, 4]);
        s.record_losses(t0 + ms(30), &out.lost, true, &rtt);
        // 1, 2 and 3 were late; 4 is really gone.
        let out = ack(&mut s, t0 + ms(40), &[5..=11, 0..=3], &mut rtt);
        assert_eq!(out.spurious.len(), 3);
        assert!(!out.undo);
        // Long after, the record of 4 is forgotten and with it any chance of undoing.
        send(&mut s, t0 + ms(500), 1);
        let out = ack(&mut s, t0 + ms(520), &[12..=12], &mut rtt);
        assert!(!out.undo);
        assert_eq!(s.remembered_losses(), 0);
    }

    #[test]
    fn the_allowance_decays_after_a_quiet_spell() {
        let t0 = crate::cc::testing::epoch();
        let ms = Duration::from_millis;
        let rtt = RttEstimator::new(ms(10));
        let mut r = ReorderAllowance::default();
        r.observe(t0, 40, ms(8), false, &rtt);
        assert_eq!(r.packet_threshold, 51);
        r.decay(t0 + ms(50), &rtt);
        assert_eq!(r.packet_threshold, 51, "not quiet long enough");
        let mut t = t0;
        for _ in 0..10 {
            t += ms(200);
            r.decay(t, &rtt);
        }
        assert_eq!(r, ReorderAllowance::default());
    }

    /// Persistent congestion: packets 1–10 sent 100 ms apart (900 ms span) after the first RTT
    /// sample (packet 0), all lost; the period is 500 ms.
    mod persistent {
        use super::*;
        use crate::wire::{encode_ack, encode_nack, Frame, Reader};

        const PERIOD: Duration = Duration::from_millis(500);

        fn lost_train(t0: Instant) -> Vec<(u64, SentPacket)> {
            (1..=10u64)
                .map(|pn| (pn, pkt(t0 + Duration::from_millis(100 * pn))))
                .collect()
        }

        fn judge_ack(
            lost: &[(u64, SentPacket)],
            sample: Option<Instant>,
            ranges: &[RangeInclusive<u64>],
        ) -> bool {
            let mut buf = Vec::new();
            encode_ack(0, 0, ranges.iter().cloned(), 64, 1000, None, &mut buf).unwrap();
            let Ok(Frame::Ack(ack)) = Frame::decode(&mut Reader::new(&buf)) else {
                panic!("an ACK");
            };
            persistent_congestion(lost, sample, PERIOD, &PeerReport::Ack(ack.ranges))
        }

        fn judge_nack(lost: &[(u64, SentPacket)], sample: Instant, missing: &[u64]) -> bool {
            let mut buf = Vec::new();
            encode_nack(0, missing.iter().copied(), 64, 1000, &mut buf).unwrap();
            let Ok(Frame::Nack(nack)) = Frame::decode(&mut Reader::new(&buf)) else {
                panic!("a NACK");
            };
            persistent_congestion(lost, Some(sample), PERIOD, &PeerReport::Nack(nack.missing))
        }

        #[test]
        fn a_blackout_longer_than_the_period_is_persistent_congestion() {
            let t0 = crate::cc::testing::epoch();
            let lost = lost_train(t0);
            // The ACK of a probe (11) after the blackout, with 0 acknowledged before.
            assert!(judge_ack(&lost, Some(t0), &[11..=11, 0..=0]));
            // Any order of the batch.
            let mut reversed = lost.clone();
            reversed.reverse();
            assert!(judge_ack(&reversed, Some(t0), &[11..=11, 0..=0]));
            // The same batch revealed by a NACK listing 1–10.
            assert!(judge_nack(&lost, t0, &(1..=10).collect::<Vec<_>>()));
        }

        #[test]
        fn a_packet_acknowledged_between_the_losses_breaks_the_period() {
            let t0 = crate::cc::testing::epoch();
            let lost: Vec<_> = lost_train(t0)
                .into_iter()
                .filter(|(pn, _)| *pn != 5)
                .collect();
            // 5 arrived: 1–4 span 300 ms and 6–10 400 ms, each under the period.
            assert!(!judge_ack(&lost, Some(t0), &[11..=11, 5..=5, 0..=0]));
            assert!(!judge_nack(&lost, t0, &[1, 2, 3, 4, 6, 7, 8, 9, 10]));
            // 5 missing too (say an ACK-only packet, never tracked, that was lost): the run
            // is whole.
            assert!(judge_ack(&lost, Some(t0), &[11..=11, 0..=0]));
        }

        #[test]
        fn packets_sent_before_the_first_rtt_sample_take_no_part() {
            let t0 = crate::cc::testing::epoch();
            let lost = lost_train(t0);
            assert!(!judge_ack(&lost, None, &[11..=11, 0..=0]));
            // A sample taken at 450 ms leaves 5–10 (500 ms): not more than the period.
            assert!(!judge_ack(
                &lost,
                Some(t0 + Duration::from_millis(450)),
                &[11..=11, 0..=0]
            ));
            assert!(judge_ack(
                &lost,
                Some(t0 + Duration::from_millis(350)),
                &[11..=11, 0..=0]
            ));
        }

        #[test]
        fn packets_below_what_the_report_covers_take_no_part() {
            let t0 = crate::cc::testing::epoch();
            let lost = lost_train(t0);
            // The ACK reports from 6 up: whether something between 1 and 6 arrived is unknown.
            assert!(!judge_ack(&lost, Some(t0), &[11..=11]));
            // With the timer, nothing new is known.
            assert!(!persistent_congestion(
                &lost,
                Some(t0),
                PERIOD,
                &PeerReport::Nothing
            ));
        }

        #[test]
        fn only_ack_eliciting_packets_in_flight_count() {
            let t0 = crate::cc::testing::epoch();
            let mut lost = lost_train(t0);
            for (pn, p) in &mut lost {
                if *pn == 1 || *pn == 10 {
                    p.in_flight = false;
                }
            }
            // 2–9 span 700 ms.
            assert!(judge_ack(&lost, Some(t0), &[11..=11, 0..=0]));
            for (pn, p) in &mut lost {
                if (2..=4).contains(pn) || *pn == 9 {
                    p.in_flight = false;
                }
            }
            // 5–8 span 300 ms.
            assert!(!judge_ack(&lost, Some(t0), &[11..=11, 0..=0]));
        }
    }
}
