//! Paths ("channels", DESIGN.md F15): one per (local address, remote address) pair, each with
//! its own packet numbers, replay window, RTT, loss recovery, congestion controller and pacer.
//! The connection keeps only what the paths share (flows, messages, credit, keys); which path
//! the next packet takes is the scheduler's choice (`scheduler.rs`).

pub(crate) mod pmtu;
pub(crate) mod probe;
pub(crate) mod scheduler;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::cc::{Controller, ControllerFactory, Pacer, PathInfo};
use crate::crypto::ReplayWindow;
use crate::recovery::ecn::EcnSender;
use crate::recovery::{AckTracker, RttEstimator, SentPackets};

/// Most paths one connection holds (PROTOCOL.md §13).
pub const MAX_PATHS: usize = 8;

/// Challenges sent on a path before it is given up as unreachable.
pub(crate) const MAX_CHALLENGES: u32 = 4;

/// What a path may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// Carries data (once validated).
    Active,
    /// Used only when no active path works (handover, a metered link kept in reserve).
    Standby,
    /// Stopped answering, or never answered its challenge: nothing but probes is sent on it
    /// until it answers again (then it is active again).
    Dead,
    /// Given up for good by either end (its address went away, or the application dropped
    /// it): nothing is sent on it again.
    Abandoned,
}

/// Sending and receiving state of one path.
#[derive(Debug)]
pub(crate) struct Path {
    pub(crate) id: u32,
    /// The congestion state last written to the qlog trace.
    pub(crate) qlog_state: Option<crate::qlog::CongestionState>,
    pub(crate) remote: SocketAddr,
    /// Our address on this path, if known (learned from arriving datagrams, or chosen when
    /// the path was opened from a given local address).
    pub(crate) local: Option<IpAddr>,
    /// The address datagrams of this path must leave from: set for paths opened from a
    /// chosen local address; `None` lets the host pick (and follow its own address changes).
    pub(crate) source: Option<IpAddr>,
    pub(crate) state: PathState,
    /// The state the application (or peer) asked for; `state` falls back to it when a dead
    /// path answers again.
    pub(crate) wanted: PathState,
    /// The peer abandoned this path (PathStatus, or RemoveAddress of its address) while it
    /// was the last that could carry data: it is abandoned once another path can.
    pub(crate) abandon_deferred: bool,
    /// Our outstanding challenge on this path and how many were sent.
    pub(crate) challenge: Option<[u8; 8]>,
    pub(crate) challenges_sent: u32,
    /// A challenge must go out on this path.
    pub(crate) challenge_pending: bool,
    /// When the last challenge left: without a response by a probe timeout later (the
    /// challenge may have been acknowledged while its response was lost), another goes.
    pub(crate) challenge_sent_at: Option<Instant>,
    /// Responses owed to the peer's challenges, sent on this path.
    pub(crate) responses: VecDeque<[u8; 8]>,
    /// Probe packets owed after a probe timeout of this path (sent regardless of its window).
    pub(crate) probes: u32,
    /// A PathStatus for this path must be (re)sent.
    pub(crate) status_pending: bool,
    /// Sequence number of our latest PathStatus for this path (0: none sent).
    pub(crate) status_sequence: u64,
    /// Highest sequence number of the peer's PathStatus frames for this path.
    pub(crate) peer_status_sequence: u64,
    /// When an acknowledgement last arrived for this path's packets (ACK-clocked scheduling).
    pub(crate) last_ack: Option<Instant>,
    pub(crate) rtt: RttEstimator,
    pub(crate) cc: Box<dyn Controller>,
    pub(crate) pacer: Pacer,
    pub(crate) sent: SentPackets,
    pub(crate) acks: AckTracker,
    pub(crate) replay: ReplayWindow,
    pub(crate) mtu: u16,
    /// Path MTU discovery: what moves `mtu` (DESIGN.md F14).
    pub(crate) pmtu: pmtu::Pmtud,
    /// The peer proved it receives at `remote` (before that, the 3× limit applies).
    pub(crate) validated: bool,
    /// We learned this path's remote address from a datagram (the peer opened the path or
    /// moved): until it is validated, we send at most 3× what arrived from it. A path we
    /// opened ourselves to an address we chose is not limited.
    pub(crate) limited: bool,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    /// Flow, message or datagram data has left on this path: only then is its MTU searched (a path
    /// kept in reserve, perhaps a metered cellular one, is not spent on probes).
    pub(crate) carried_data: bool,
    /// Earliest time the pacer lets the next packet go, when it is holding one back.
    pub(crate) pacing_until: Option<Instant>,
    /// What we asked the peer about acknowledging this path's packets (AckFrequency).
    pub(crate) ack_request: AckThresholdRequest,
    /// Whether our ECN marks survive this path.
    pub(crate) ecn: EcnSender,
    /// Probe trains we send on this path (packet-pair fast start, F11).
    pub(crate) probe_tx: probe::ProbeSender,
    /// Probe trains the peer sends on this path, and our reports on them.
    pub(crate) probe_rx: probe::ProbeReceiver,
    /// Explicit rate (F12): feedback seen and echoed on this path.
    pub(crate) rate: crate::connection::rate::PathRate,
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
    /// Ack-eliciting packets sent since we last fell silent (the current burst).
    pub(crate) burst: u32,
}

impl Default for AckThresholdRequest {
    fn default() -> Self {
        Self {
            threshold: 2,
            sequence: 0,
            pending: false,
            burst: 0,
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
            qlog_state: None,
            remote,
            local: None,
            source: None,
            state: PathState::Active,
            wanted: PathState::Active,
            abandon_deferred: false,
            challenge: None,
            challenges_sent: 0,
            challenge_pending: false,
            challenge_sent_at: None,
            responses: VecDeque::new(),
            probes: 0,
            status_pending: false,
            status_sequence: 0,
            peer_status_sequence: 0,
            last_ack: None,
            rtt: RttEstimator::new(config.initial_rtt),
            cc,
            pacer,
            sent: SentPackets::default(),
            acks: AckTracker::default(),
            replay: ReplayWindow::default(),
            mtu,
            pmtu: pmtu::Pmtud::disabled(mtu),
            validated: false,
            limited: true,
            bytes_received: 0,
            bytes_sent: 0,
            carried_data: false,
            pacing_until: None,
            ack_request: AckThresholdRequest::default(),
            ecn: if config.ecn {
                EcnSender::default()
            } else {
                EcnSender::disabled()
            },
            probe_tx: probe::ProbeSender::default(),
            probe_rx: probe::ProbeReceiver::default(),
            rate: Default::default(),
        }
    }

    /// Hands the application's expected rate to the path's controller (and keeps it for a
    /// controller built afresh).
    pub(crate) fn set_expected_rate(&mut self, bytes_per_second: Option<u64>) {
        self.rate.expected = bytes_per_second;
        self.cc.on_expected_rate(bytes_per_second);
    }

    /// The path now runs over another network path (an address of either end changed):
    /// RTT estimate, controller, pacer, ECN validation (with its counts carried on) and the
    /// loss-recovery state learnt on the old one (probe backoff, reordering allowance) start
    /// afresh. Packet numbers, the replay window and what is in flight stay.
    pub(crate) fn restart_network_state(
        &mut self,
        now: Instant,
        config: &crate::config::ConnectionConfig,
    ) {
        self.mtu = self.pmtu.restart();
        let fresh = Path::new(
            now,
            self.id,
            self.remote,
            self.mtu,
            config,
            config.congestion.as_ref(),
        );
        self.rtt = fresh.rtt;
        self.cc = fresh.cc;
        self.cc.on_expected_rate(self.rate.expected);
        // Echoes of the old network path's routers say nothing about the new one.
        self.rate.echoed = None;
        self.pacer = fresh.pacer;
        self.ecn.restart();
        self.sent.on_new_network_path();
        self.pacing_until = None;
        // The old estimate described the old network path: probe afresh (train numbers keep
        // increasing, so the peer never mistakes a new train for an old one).
        let last_train = self.probe_tx.last_train;
        self.probe_tx = probe::ProbeSender {
            last_train,
            reported: true,
            ..Default::default()
        };
    }

    /// Bytes we may still send before the peer's address is validated (3× what it sent).
    pub(crate) fn amplification_budget(&self) -> u64 {
        if self.validated || !self.limited {
            u64::MAX
        } else {
            (3 * self.bytes_received).saturating_sub(self.bytes_sent)
        }
    }

    /// Whether the pacer lets `size` bytes go now; if not, remembers when it will.
    pub(crate) fn pacer_allows(&mut self, now: Instant, size: u64) -> bool {
        let rate = self.cc.pacing_rate(&self.rtt);
        match self.pacer.delay(
            now,
            size,
            self.cc.window(),
            rate,
            self.rtt.smoothed(),
            self.mtu,
        ) {
            Some(at) if at > now => {
                self.pacing_until = Some(at);
                false
            }
            _ => true,
        }
    }

    /// Congestion window room left.
    pub(crate) fn cwnd_room(&self) -> u64 {
        self.cc.window().saturating_sub(self.sent.bytes_in_flight)
    }

    /// Whether an ACK of this path would say something new (new numbers, or missing ones).
    pub(crate) fn has_ack_to_send(&self) -> bool {
        self.acks.largest.is_some() && (self.acks.dirty || !self.acks.nack.is_empty())
    }

    /// Whether the scheduler may put data on this path: validated, neither dead nor abandoned.
    pub(crate) fn usable(&self) -> bool {
        self.validated && matches!(self.state, PathState::Active | PathState::Standby)
    }

    /// Whether the path was given up for good.
    pub(crate) fn abandoned(&self) -> bool {
        self.state == PathState::Abandoned
    }

    /// The RTT the scheduler ranks paths by: the smoothed estimate, or the configured initial
    /// RTT before the first sample.
    pub(crate) fn rank_rtt(&self) -> std::time::Duration {
        self.rtt.smoothed()
    }

    /// This path's figures for the application.
    pub(crate) fn stats(&self) -> PathStats {
        PathStats {
            id: self.id,
            remote: self.remote,
            local: self.local,
            state: self.state,
            validated: self.validated,
            rtt: self.rtt.smoothed(),
            min_rtt: self.rtt.min().unwrap_or_default(),
            cwnd: self.cc.window(),
            bytes_in_flight: self.sent.bytes_in_flight,
            max_datagram_size: self.mtu,
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
            packets_sent: self.sent.next_pn,
            rate_estimate: self.probe_tx.estimate.map(|e| e.0),
            rate_estimate_at: self.probe_tx.estimate.map(|e| e.1),
            feedback_rate: self.rate.stamped(),
            feedback_rate_at: self.rate.echoed.map(|e| e.1),
            rate_echoes_sent: self.rate.echoes_sent,
            rate_echoes_received: self.rate.echoes_received,
        }
    }
}

/// One path's figures (see [`Connection::path_stats`](crate::Connection::path_stats)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStats {
    /// The path's ID (in the short header and the ACK frames).
    pub id: u32,
    /// The peer's address on this path.
    pub remote: SocketAddr,
    /// Our address on this path, if known.
    pub local: Option<IpAddr>,
    /// Active, standby, dead or abandoned.
    pub state: PathState,
    /// The peer proved it receives on this path.
    pub validated: bool,
    /// Smoothed RTT.
    pub rtt: std::time::Duration,
    /// Lowest RTT seen.
    pub min_rtt: std::time::Duration,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes sent and not yet acknowledged or lost.
    pub bytes_in_flight: u64,
    /// The datagram size the path uses now: the largest UDP payload it sends (its MTU).
    pub max_datagram_size: u16,
    /// Datagram bytes sent and received on the path.
    pub bytes_sent: u64,
    /// Datagram bytes received on the path.
    pub bytes_received: u64,
    /// Packets sent (packet numbers used).
    pub packets_sent: u64,
    /// The latest bottleneck-rate estimate from a probe train on this path (packet-pair fast
    /// start, F11), bytes per second, as applied (bounded) to the controller.
    pub rate_estimate: Option<u64>,
    /// When that estimate arrived.
    pub rate_estimate_at: Option<std::time::Instant>,
    /// The latest router rate the peer echoed for this path (explicit rate, F12), bytes per
    /// second; `None` when no router lowered it or no rate area is sent.
    pub feedback_rate: Option<u64>,
    /// When the latest RateEcho for this path arrived (stamped or not).
    pub feedback_rate_at: Option<std::time::Instant>,
    /// RateEcho frames we sent about this path (echoing the peer's packets).
    pub rate_echoes_sent: u64,
    /// RateEcho frames the peer sent about this path (echoing ours).
    pub rate_echoes_received: u64,
}
