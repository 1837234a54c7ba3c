//! Counters a user can read at any time (`Connection::stats`).

use std::time::Duration;

/// Connection statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// UDP datagrams and bytes sent.
    pub datagrams_sent: u64,
    /// See `datagrams_sent`.
    pub bytes_sent: u64,
    /// UDP datagrams and bytes received (authenticated or not).
    pub datagrams_received: u64,
    /// See `datagrams_received`.
    pub bytes_received: u64,
    /// Packets declared lost (spurious ones included: see `spurious_losses`).
    pub packets_lost: u64,
    /// Packets declared lost that the peer acknowledged afterwards: they were only late
    /// (reordering, a delay spike). Each one widened the reordering allowance.
    pub spurious_losses: u64,
    /// Congestion responses undone because every loss behind them turned out spurious.
    pub congestion_events_undone: u64,
    /// Packets acknowledged after `reorder_threshold` - 1 later ones had been: how many later
    /// packets a packet must trail before it counts as lost on the primary path (3 until
    /// reordering is seen, RFC 9002 §6.1.1).
    pub reorder_threshold: u64,
    /// Extra time a packet may be late beyond the RTT before it counts as lost (RFC 8985's
    /// reordering window), on the primary path.
    pub reorder_window: Duration,
    /// ECN on the primary path: whether our ECT(0) marks survive it (RFC 9000 §13.4.2).
    pub ecn: crate::recovery::EcnState,
    /// Packets of ours the peer reported CE-marked (explicit congestion signals received).
    pub ecn_ce_reported: u64,
    /// Packets we received CE-marked (reported back to the peer in ACK_ECN frames).
    pub ecn_ce_received: u64,
    /// Flow and message bytes resent.
    pub bytes_retransmitted: u64,
    /// Bytes sent a second time on purpose: redundant messages, and the copies a redundant
    /// scheduler (or `redundant_priority`) puts on other paths.
    pub bytes_redundant: u64,
    /// Redundant copies dropped before their path had room (too many waiting).
    pub copies_dropped: u64,
    /// Packets that failed authentication (dropped).
    pub auth_failures: u64,
    /// Replayed packets (dropped).
    pub replays: u64,
    /// Key updates (PROTOCOL.md §6.4) we started (at half the confidentiality limit or by
    /// `Connection::initiate_key_update`) and that the peer started (our send key followed).
    pub key_updates_initiated: u64,
    /// See `key_updates_initiated`.
    pub key_updates_received: u64,
    /// Packets of a previous key phase that arrived after its key was discarded (dropped).
    pub unknown_phase_dropped: u64,
    /// Packets opened with the previous receive key (overtaken by the update).
    pub previous_key_opened: u64,
    /// Generation of the send key (0: the handshake's; one more per update).
    pub key_generation: u64,
    /// Packets sealed with the current send key.
    pub packets_sealed_current_key: u64,
    /// Packets sent that carried only acknowledgements (Ack, Nack, padding).
    pub ack_only_sent: u64,
    /// Ack-eliciting packets per ACK we use: what the peer asked for with AckFrequency, else
    /// our configured `ack_frequency`.
    pub ack_threshold: u32,
    /// What we asked the peer for (2, the default, until we ask).
    pub ack_threshold_requested: u32,
    /// NACK frames sent and received.
    pub nacks_sent: u64,
    /// See `nacks_sent`.
    pub nacks_received: u64,
    /// Probe timeouts.
    pub ptos: u64,
    /// Tail-loss probes: the oldest packet still out went a probe timeout unanswered while
    /// later packets had put the probe timeout off and nothing waited to be sent
    /// (PROTOCOL.md §11.6).
    pub tail_probes: u64,
    /// Datagrams dropped from a full send or receive queue.
    pub datagrams_dropped: u64,
    /// Of `datagrams_dropped`, those received and dropped (the oldest first) because the
    /// application had `datagram_queue` datagrams or `datagram_queue_bytes` bytes unread.
    pub datagrams_recv_dropped: u64,
    /// Received datagrams waiting for the application, and their bytes.
    pub datagrams_buffered: u64,
    /// See `datagrams_buffered`.
    pub datagram_bytes_buffered: u64,
    /// Received messages held (partial, complete waiting for an earlier ordered one, or ready
    /// for the application), and their payload bytes. Bounded by the connection window: each
    /// costs its size plus `MESSAGE_CREDIT_OVERHEAD` until the application takes it.
    pub messages_buffered: u64,
    /// See `messages_buffered`.
    pub message_bytes_buffered: u64,
    /// Flow bytes held (out of order, or in order and unread), every flow.
    pub flow_bytes_buffered: u64,
    /// Connection credit in use: received (flows and messages) but not yet taken by the
    /// application. Never above the connection window.
    pub recv_credit_used: u64,
    /// Disjoint received ranges held (see `ConnectionConfig::max_recv_ranges`).
    pub recv_ranges: u64,
    /// Messages given up at their deadline (sent by us / sent to us).
    pub messages_expired_sent: u64,
    /// See `messages_expired_sent`.
    pub messages_expired_received: u64,
    /// WindowStatus polls sent while the peer's window was closed.
    pub window_probes: u64,
    /// Smoothed RTT, RTT variation and minimum RTT of the primary path.
    pub rtt: Duration,
    /// See `rtt`.
    pub rtt_var: Duration,
    /// See `rtt`.
    pub min_rtt: Duration,
    /// Largest UDP payload the primary path sends now (its datagram size, moved by PMTU
    /// discovery, F14).
    pub max_datagram_size: u16,
    /// PMTU probes sent and lost, every path (PROTOCOL.md §5.5; lost probes are not in
    /// `packets_lost`).
    pub pmtu_probes_sent: u64,
    /// See `pmtu_probes_sent`.
    pub pmtu_probes_lost: u64,
    /// PMTU black holes detected (a path fell back to 1 200 bytes), every path.
    pub pmtu_black_holes: u64,
    /// Congestion window and bytes in flight of the primary path.
    pub cwnd: u64,
    /// See `cwnd`.
    pub bytes_in_flight: u64,
    /// Pacing rate of the primary path, bytes per second.
    pub pacing_rate: u64,
    /// Congestion events and losses the controller judged non-congestive.
    pub congestion_events: u64,
    /// See `congestion_events`.
    pub non_congestive_losses: u64,
    /// Persistent congestion on the primary path (PROTOCOL.md §11.7): losses over more than
    /// three probe timeouts with nothing acknowledged between them, each collapsing the window.
    pub persistent_congestion_events: u64,
    /// Paths the connection holds (every state).
    pub paths: usize,
    /// Packets moved off a path that stopped answering, to be re-sent on the others.
    pub packets_rerouted: u64,
    /// Probe trains sent (packet-pair fast start, F11), on every path.
    pub probe_trains_sent: u64,
    /// Probe packets among them that carried no application data (padding only).
    pub probe_padding_packets: u64,
    /// ProbeReport frames received with an estimate, on every path.
    pub rate_estimates: u64,
    /// The latest bottleneck-rate estimate on the primary path, bytes per second (0: none),
    /// and when it arrived.
    pub rate_estimate: u64,
    /// See `rate_estimate`.
    pub rate_estimate_at: Option<std::time::Instant>,
    /// The latest router rate the peer echoed for the primary path (explicit rate, F12),
    /// bytes per second; `None` when no router lowered it or no rate area is sent.
    pub feedback_rate: Option<u64>,
    /// RateEcho frames sent (we echo routers' rates on the peer's packets) and received
    /// (the peer echoes them on ours), every path.
    pub rate_echoes_sent: u64,
    /// See `rate_echoes_sent`.
    pub rate_echoes_received: u64,
}

/// Declares [`Counters`] with the named fields of [`ConnectionStats`] (each a `u64`, documented
/// there) and the conversion that copies them.
macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// What a connection counts as it runs: the fields of [`ConnectionStats`] that no
        /// path, buffer or key holds. [`Connection::stats`](super::Connection::stats) adds
        /// the rest (RTTs, window, buffered bytes, …) when it is called, so that every idle
        /// connection does not store them twice (272 bytes here against 544 for the whole
        /// [`ConnectionStats`]).
        #[derive(Debug, Clone, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: u64,)*
        }

        impl Counters {
            /// The statistics with these counters and every other field at its default,
            /// for [`Connection::stats`](super::Connection::stats) to fill.
            pub(crate) fn to_stats(&self) -> ConnectionStats {
                ConnectionStats {
                    $($name: self.$name,)*
                    ..ConnectionStats::default()
                }
            }
        }
    };
}

counters!(
    datagrams_sent,
    bytes_sent,
    datagrams_received,
    bytes_received,
    packets_lost,
    spurious_losses,
    ecn_ce_received,
    bytes_retransmitted,
    bytes_redundant,
    copies_dropped,
    auth_failures,
    replays,
    key_updates_initiated,
    key_updates_received,
    unknown_phase_dropped,
    previous_key_opened,
    ack_only_sent,
    nacks_sent,
    nacks_received,
    ptos,
    tail_probes,
    datagrams_dropped,
    datagrams_recv_dropped,
    messages_expired_sent,
    messages_expired_received,
    window_probes,
    pmtu_probes_sent,
    pmtu_probes_lost,
    pmtu_black_holes,
    packets_rerouted,
    probe_trains_sent,
    probe_padding_packets,
    rate_estimates,
    rate_echoes_sent,
    rate_echoes_received,
);
