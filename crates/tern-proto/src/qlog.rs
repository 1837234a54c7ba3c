//! What a connection records for a qlog trace (draft-ietf-quic-qlog-main-schema and its
//! QUIC event definitions, so that qvis can draw a tern connection): packets sent, received
//! and lost, RTT and congestion-controller metrics, and congestion-state changes, per path.
//!
//! The core only records typed events with their time ([`QlogRecord`]) into a bounded
//! queue that the driver drains with [`Connection::poll_qlog`](crate::Connection::poll_qlog)
//! (sans-I/O: no file, no clock, no JSON here); the runtime writes them as JSON-SEQ. Off
//! unless [`ConnectionConfig::qlog`](crate::ConnectionConfig::qlog) is set, and then one
//! `Option` check per packet when off.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Records kept for the driver at most; older ones are dropped (and counted) when it falls
/// behind, so a connection never grows without bound because nobody reads its log.
pub const QLOG_QUEUE_LIMIT: usize = 1 << 16;

/// One qlog event of a connection.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum QlogEvent {
    /// `transport:packet_sent`.
    PacketSent {
        /// Path ID (tern's per-path packet number spaces).
        path: u32,
        /// Packet number; `None` for a handshake flight datagram.
        packet_number: Option<u64>,
        /// UDP payload bytes.
        size: usize,
    },
    /// `transport:packet_received` (authenticated short-header packets).
    PacketReceived {
        /// Path ID.
        path: u32,
        /// Packet number.
        packet_number: u64,
        /// UDP payload bytes.
        size: usize,
    },
    /// `recovery:packet_lost`.
    PacketLost {
        /// Path ID.
        path: u32,
        /// Packet number.
        packet_number: u64,
    },
    /// `recovery:metrics_updated`, after each ACK frame and each loss batch.
    MetricsUpdated {
        /// Path ID.
        path: u32,
        /// Lowest RTT seen.
        min_rtt: Duration,
        /// Smoothed RTT.
        smoothed_rtt: Duration,
        /// Latest RTT sample.
        latest_rtt: Duration,
        /// RTT variation.
        rtt_variance: Duration,
        /// Congestion window, bytes.
        congestion_window: u64,
        /// Bytes in flight.
        bytes_in_flight: u64,
        /// Pacing rate, bit/s (qlog's unit).
        pacing_rate_bps: u64,
        /// The latest router rate the peer echoed for the path (F12), bit/s; `None` when no
        /// router lowered it or no rate area is sent. A tern extension of the event.
        feedback_rate_bps: Option<u64>,
    },
    /// `security:key_updated`: a packet key moved to its next generation (PROTOCOL.md §6.4).
    KeyUpdated {
        /// The send key (else the receive key).
        send: bool,
        /// Its generation now (0 is the handshake's key).
        generation: u64,
        /// We started the update (else the peer did).
        local: bool,
    },
    /// `recovery:congestion_state_updated`.
    CongestionStateUpdated {
        /// Path ID.
        path: u32,
        /// The state before.
        old: CongestionState,
        /// The state now.
        new: CongestionState,
    },
}

/// The congestion states qlog names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CongestionState {
    /// Slow start, or a model-based controller's start-up.
    SlowStart,
    /// Congestion avoidance (steady state).
    CongestionAvoidance,
    /// Right after a congestion response (a window reduction).
    Recovery,
}

impl CongestionState {
    /// qlog's name for it.
    pub fn name(self) -> &'static str {
        match self {
            CongestionState::SlowStart => "slow_start",
            CongestionState::CongestionAvoidance => "congestion_avoidance",
            CongestionState::Recovery => "recovery",
        }
    }
}

/// An event and when it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct QlogRecord {
    /// The time passed to the call that produced it.
    pub time: Instant,
    /// The event.
    pub event: QlogEvent,
}

/// The bounded queue of a connection's records.
#[derive(Debug, Default)]
pub(crate) struct QlogQueue {
    records: VecDeque<QlogRecord>,
    /// Records dropped because the queue was full.
    pub(crate) dropped: u64,
}

impl QlogQueue {
    pub(crate) fn push(&mut self, time: Instant, event: QlogEvent) {
        if self.records.len() >= QLOG_QUEUE_LIMIT {
            self.records.pop_front();
            self.dropped += 1;
        }
        self.records.push_back(QlogRecord { time, event });
    }

    pub(crate) fn pop(&mut self) -> Option<QlogRecord> {
        self.records.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_keeps_the_newest_records_and_counts_the_rest() {
        let mut q = QlogQueue::default();
        #[allow(clippy::disallowed_methods)] // an arbitrary origin
        let t0 = Instant::now();
        for pn in 0..QLOG_QUEUE_LIMIT as u64 + 5 {
            q.push(
                t0,
                QlogEvent::PacketLost {
                    path: 0,
                    packet_number: pn,
                },
            );
        }
        assert_eq!(q.dropped, 5);
        assert_eq!(
            q.pop().map(|r| r.event),
            Some(QlogEvent::PacketLost {
                path: 0,
                packet_number: 5
            })
        );
    }
}
