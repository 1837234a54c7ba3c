//! Paths (DESIGN.md F15): one per (local address, remote address) pair, each with its own
//! packet numbers, RTT, loss recovery, congestion controller and pacer. Version 1 of the core
//! drives one path; the structures are per path so that multipath adds paths, not rewrites.

use std::net::SocketAddr;
use std::time::Instant;

use crate::cc::{Controller, ControllerFactory, Pacer, PathInfo};
use crate::crypto::ReplayWindow;
use crate::recovery::ecn::EcnSender;
use crate::recovery::{AckTracker, RttEstimator, SentPackets};

/// Sending and receiving state of one path.
#[derive(Debug)]
pub(crate) struct Path {
    pub(crate) id: u32,
    pub(crate) remote: SocketAddr,
    pub(crate) rtt: RttEstimator,
    pub(crate) cc: Box<dyn Controller>,
    pub(crate) pacer: Pacer,
    pub(crate) sent: SentPackets,
    pub(crate) acks: AckTracker,
    pub(crate) replay: ReplayWindow,
    pub(crate) mtu: u16,
    /// The peer proved it receives at `remote` (before that, the 3× limit applies).
    pub(crate) validated: bool,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    /// Earliest time the pacer lets the next packet go, when it is holding one back.
    pub(crate) pacing_until: Option<Instant>,
    /// What we asked the peer about acknowledging this path's packets (AckFrequency).
    pub(crate) ack_request: AckThresholdRequest,
    /// Whether our ECN marks survive this path.
    pub(crate) ecn: EcnSender,
}

/// The sender's side of AckFrequency (PROTOCOL.md §11.1): the threshold it last asked for.
#[derive(Debug)]
pub(crate) struct AckThresholdRequest {
    /// Ack-eliciting packets per ACK asked for (2, the default, until we ask otherwise).
    pub(crate) threshold: u32,
    /// Sequence number of the last request.
    pub(crate) sequence: u64,
    /// The current request still has to be sent (new, or its packet was lost).
    pub(crate) pending: bool,
    /// When the threshold was last reconsidered (at most once per smoothed RTT).
    pub(crate) checked_at: Option<Instant>,
}

impl Default for AckThresholdRequest {
    fn default() -> Self {
        Self {
            threshold: 2,
            sequence: 0,
            pending: false,
            checked_at: None,
        }
    }
}

impl Path {
    /// Reconsiders how often the peer should acknowledge: once per eighth of the congestion
    /// window (so ACKs keep clocking the sender several times per round trip), between 2 and
    /// `max`. At most once per smoothed RTT, so the window's sawtooth does not make a frame
    /// per ACK.
    pub(crate) fn update_ack_threshold(&mut self, now: Instant, max: u32) {
        if max <= 2 {
            return;
        }
        let r = &mut self.ack_request;
        if r.checked_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.rtt.smoothed())
        {
            return;
        }
        r.checked_at = Some(now);
        let packets = self.cc.window() / u64::from(self.mtu.max(1));
        let want =
            (packets / 8).clamp(2, u64::from(max.min(crate::wire::MAX_ACK_THRESHOLD))) as u32;
        if want != r.threshold {
            r.threshold = want;
            r.sequence += 1;
            r.pending = true;
        }
    }

    /// What message scheduling needs to know of this path (see `PathEstimate`).
    pub(crate) fn message_estimate(&self) -> crate::message::send::PathEstimate {
        let m = self.cc.metrics();
        crate::message::send::PathEstimate {
            // Before the first sample the RTT is a guess: assume nothing rather than give
            // messages up on it.
            one_way: self.rtt.min().unwrap_or_default() / 2,
            rtt: if self.rtt.has_sample() {
                self.rtt.smoothed()
            } else {
                std::time::Duration::ZERO
            },
            window: m.window,
            slow_start: m.in_slow_start,
        }
    }

    pub(crate) fn new(
        now: Instant,
        id: u32,
        remote: SocketAddr,
        mtu: u16,
        config: &crate::config::ConnectionConfig,
        factory: &dyn ControllerFactory,
    ) -> Self {
        let info = PathInfo::new(mtu, config.initial_rtt, id);
        let cc = factory.build(now, &info);
        let pacer = Pacer::new(now, cc.window(), mtu)
            .with_burst_limits(crate::cc::pacer::DEFAULT_MIN_BURST, config.max_pacing_burst);
        Self {
            id,
            remote,
            rtt: RttEstimator::new(config.initial_rtt),
            cc,
            pacer,
            sent: SentPackets::default(),
            acks: AckTracker::default(),
            replay: ReplayWindow::default(),
            mtu,
            validated: false,
            bytes_received: 0,
            bytes_sent: 0,
            pacing_until: None,
            ack_request: AckThresholdRequest::default(),
            ecn: if config.ecn {
                EcnSender::default()
            } else {
                EcnSender::disabled()
            },
        }
    }

    /// Bytes we may still send before the peer's address is validated (3× what it sent).
    pub(crate) fn amplification_budget(&self) -> u64 {
        if self.validated {
            u64::MAX
        } else {
            (3 * self.bytes_received).saturating_sub(self.bytes_sent)
        }
    }

    /// Congestion window room left.
    pub(crate) fn cwnd_room(&self) -> u64 {
        self.cc.window().saturating_sub(self.sent.bytes_in_flight)
    }
}
