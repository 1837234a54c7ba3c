//! Sending: choosing what goes in the next packet, protecting it, and handling what the peer
//! acknowledged or lost.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::{Connection, State};
use crate::crypto::TAG_LEN;
use crate::event::Event;
use crate::recovery::{persistent_congestion, EcnCodepoint, PeerReport, SentFrame, SentPacket};
use crate::wire::{self, Frame};

/// A datagram ready to send: its bytes are in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// The local address to send it from (`None`: the socket's default). Each path of a
    /// multipath connection has its own.
    pub source: Option<IpAddr>,
    /// Bytes written to the buffer.
    pub size: usize,
    /// ECN codepoint for the IP header (`None`: Not-ECT).
    pub ecn: Option<EcnCodepoint>,
    /// A path MTU probe (PROTOCOL.md §5.5): larger than anything else the path carries, and
    /// possibly larger than the local interface takes. Send it in a system call of its own,
    /// so that a refusal (`EMSGSIZE`) or a drop costs no other datagram.
    pub pmtu_probe: bool,
}

/// Flow frame overhead: type, flow ID, offset and length varints.
const FLOW_FRAME_OVERHEAD: usize = 1 + 8 + 8 + 4;

/// Datagrams that carry a path challenge or response are padded to this size (when the
/// amplification limit allows), so that validating a path also proves it carries them.
const PATH_PROBE_SIZE: usize = 1200;

/// The least anti-amplification budget a packet carrying only a path challenge or response
/// is sent within: the largest header, the tag, one such frame and its trailer, with a few
/// bytes to spare; below [`super::MIN_PACKET_BUDGET`], which other packets need.
const MIN_CHALLENGE_BUDGET: u64 = 64;

/// A PathChallenge or PathResponse frame: type and 8 bytes.
const VALIDATION_FRAME_LEN: usize = 9;

/// Frames a packet may end with after its ACKs and data, one byte each: a Ping (owed, a
/// probe's, or asking for an ACK of ACKs; one at most, since each makes the packet
/// ack-eliciting) and an AckRequest (a probe's, or the last packet's before a pause).
const TRAILER_LEN: usize = 2;

const _: () = assert!(
    wire::MAX_SHORT_HEADER_LEN + TAG_LEN + VALIDATION_FRAME_LEN + TRAILER_LEN
        <= MIN_CHALLENGE_BUDGET as usize
);

/// Bytes an ACK gets at least when the packet has them: enough for an ACK_ECN frame with a
/// few ranges. With less room (a packet that a redundant copy fills) an ACK that does not fit
/// stays due.
const ACK_ROOM: usize = 64;

/// Whether `path` can send its own ACK-only packets (not abandoned, budget for a packet):
/// those of a path that cannot ride on another path's.
fn sends_own_acks(path: &crate::path::Path) -> bool {
    !path.abandoned() && path.amplification_budget() >= super::MIN_PACKET_BUDGET
}

/// Most redundant copies waiting for their paths; the oldest are dropped beyond (a copy that
/// waits long has lost its point: the original has arrived or been resent).
const MAX_PENDING_COPIES: usize = 64;

/// A copy of a data packet's frames for another path (redundant scheduling, or a message at
/// or above `ConnectionConfig::redundant_priority`).
#[derive(Debug)]
pub(crate) struct PendingCopy {
    /// Index of the path it goes on.
    pub(crate) path: usize,
    /// The frames, encoded (each carries its own length).
    pub(crate) payload: Vec<u8>,
    /// What they are, for acknowledgement.
    pub(crate) frames: crate::recovery::SentFrames,
}

/// What a packet being built is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The Close frame only.
    Close,
    /// What this path owes: a challenge, responses, probes after a timeout.
    PathWork,
    /// Data, on the path the scheduler chose (its window and pacer have room).
    Data,
    /// ACKs only.
    Acks,
    /// A redundant copy of data sent on another path.
    Copy,
}

impl Connection {
    /// Writes the next datagram into `buf` (appending) and says where it goes, or returns
    /// `None` when nothing may be sent now (see `poll_timeout`).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        if matches!(self.state, State::Drained) {
            return None;
        }
        if let Some(size) = self.poll_flight(now, buf) {
            return Some(self.sent_datagram(now, 0, size, None, true));
        }
        if let Some(size) = self.poll_first_flight_padding(buf) {
            return Some(self.sent_datagram(now, 0, size, None, true));
        }
        self.keys.as_ref()?;
        match self.state {
            State::Closing { .. } | State::Draining { .. } => {
                if !self.close_resend {
                    return None;
                }
                self.close_resend = false;
                if let State::Closing { resends, .. } = self.state {
                    if resends < 3 {
                        self.close_resend_at = Some(now + self.pto());
                    }
                }
                let index = self.primary();
                let (size, ecn) = self.build_packet(now, buf, index, Purpose::Close, None)?;
                return Some(self.sent_datagram(now, index, size, ecn, false));
            }
            State::Handshake(_) | State::Drained => return None,
            State::Established => {
                if !self.check_send_key(now) {
                    // The key is at its limit: what goes out now is the Close.
                    return self.poll_transmit(now, buf);
                }
            }
        }
        if !self.paths_opened && self.side == crate::Side::Client {
            // Right after the handshake: every other (local, peer) address pair at once.
            self.open_paths(now);
        }
        if self.side == crate::Side::Server && !self.confirmed {
            // A train right behind the handshake's response, if the client asked for one.
            self.start_handshake_train();
        }
        // 0. A probe train under way (F11) leaves back to back, before anything else on any
        // path, so that nothing of ours falls between its packets.
        if let Some(index) = self.paths.iter().position(|p| p.probe_tx.sending.is_some()) {
            if let Some(t) = self.send_train_packet(now, buf, index) {
                return Some(t);
            }
        }
        // 1. What a particular path owes: challenges, responses, probes.
        for index in 0..self.paths.len() {
            let p = &self.paths[index];
            if p.challenge_pending || !p.responses.is_empty() || p.probes > 0 {
                if let Some((size, ecn)) =
                    self.build_packet(now, buf, index, Purpose::PathWork, None)
                {
                    return Some(self.sent_datagram(now, index, size, ecn, false));
                }
            }
        }
        // 1b. A path MTU probe (PROTOCOL.md §5.5), at most one in flight per path.
        if let Some((index, size)) = self.build_pmtu_probe(now, buf) {
            let t = self.sent_datagram(now, index, size, None, false);
            return Some(Transmit {
                pmtu_probe: true,
                ..t
            });
        }
        // 2. Redundant copies of data already sent on another path, where there is room.
        if let Some(k) = (0..self.copies.len()).find(|&k| self.copy_fits(now, k)) {
            let copy = self.copies.remove(k);
            let index = copy.as_ref().map_or(0, |c| c.path);
            if let Some((size, ecn)) = self.build_packet(now, buf, index, Purpose::Copy, copy) {
                return Some(self.sent_datagram(now, index, size, ecn, false));
            }
        }
        // 3. Data, on the path the scheduler picks among those with room: a probe train
        // (F11) if that path starts, or starts again after an idle spell.
        if self.has_sendable_data() {
            if let Some(index) = self.schedule(now) {
                if let Some(count) = self.wants_train(now, index) {
                    self.paths[index].probe_tx.start(count);
                    self.stats.probe_trains_sent += 1;
                    if let Some(t) = self.send_train_packet(now, buf, index) {
                        return Some(t);
                    }
                }
                if let Some((size, ecn)) = self.build_packet(now, buf, index, Purpose::Data, None) {
                    return Some(self.sent_datagram(now, index, size, ecn, false));
                }
            }
        }
        // 4. ACKs due on any path, on the primary path (they name the path they acknowledge).
        if self
            .paths
            .iter()
            .any(|p| p.acks.wants_ack(now) || !p.acks.nack.is_empty())
        {
            let index = self.ack_path(now);
            let (size, ecn) = self.build_packet(now, buf, index, Purpose::Acks, None)?;
            return Some(self.sent_datagram(now, index, size, ecn, false));
        }
        None
    }

    /// Counts a datagram about to leave on path `index` (and records it for qlog: a
    /// `handshake` flight has no packet number of the path's space).
    fn sent_datagram(
        &mut self,
        now: Instant,
        index: usize,
        size: usize,
        ecn: Option<EcnCodepoint>,
        handshake: bool,
    ) -> Transmit {
        let p = &self.paths[index];
        let (path, pn) = (p.id, p.sent.next_pn.checked_sub(1));
        self.qlog(now, |_| crate::qlog::QlogEvent::PacketSent {
            path,
            packet_number: pn.filter(|_| !handshake),
            size,
        });
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += size as u64;
        let path = &mut self.paths[index];
        path.bytes_sent += size as u64;
        Transmit {
            destination: path.remote,
            source: path.source.or(path.local.filter(|_| path.id != 0)),
            size,
            ecn,
            pmtu_probe: false,
        }
    }

    /// The next packet of the probe train under way on path `index`, ignoring the pacer (the
    /// train's spacing is what the peer measures); the train ends short if the path has no
    /// window or amplification room left for a full packet.
    fn send_train_packet(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        index: usize,
    ) -> Option<Transmit> {
        let path = &self.paths[index];
        let mtu = u64::from(path.mtu);
        // A handshake train goes before the client's address is proven, within the limit.
        let usable = path.usable() || path.probe_tx.during_handshake;
        if usable && path.cwnd_room() >= mtu && path.amplification_budget() >= mtu {
            if let Some((size, ecn)) = self.build_packet(now, buf, index, Purpose::Data, None) {
                return Some(self.sent_datagram(now, index, size, ecn, false));
            }
        }
        self.paths[index].probe_tx.abort(now);
        None
    }

    /// Server, IK (the only handshake that leaves it established before the client is
    /// proven), with `handshake_train`: the first path's first probe train, sent right behind
    /// the response (PROTOCOL.md §11.10), so that the client's first packets report the rate
    /// and the server's first reply starts at it rather than a round trip later. Before the
    /// client's address is proven the whole train, full-size packets, and a further copy of
    /// the response must fit in three times what the client sent: a client asks for a train
    /// by padding its first flight (§4.3), and a train starts once its padding has arrived.
    /// A shorter train is not sent: three or four packets are timed too roughly
    /// (BENCHMARKS.md, "A probe train with the handshake's response").
    fn start_handshake_train(&mut self) {
        let Some(flight) = self.flight.as_ref() else {
            return;
        };
        let path = &self.paths[0];
        let due = self.config.fast_start
            && self.config.handshake_train
            && self.handshake_train_asked
            && path.probe_tx.last_train == 0
            && flight.sends > 0
            && !path.validated
            && path.state == crate::path::PathState::Active
            && matches!(self.state, State::Established)
            && self.keys.is_some();
        if !due {
            return;
        }
        let mtu = u64::from(path.mtu.max(1));
        let count = self.handshake_train_len();
        if count < u64::from(crate::path::probe::MIN_TRAIN_LEN) {
            return;
        }
        let train = count * mtu;
        let room = path
            .amplification_budget()
            .saturating_sub(flight.datagram.len() as u64);
        if room < train || path.cwnd_room() < train {
            return;
        }
        self.paths[0].probe_tx.start_during_handshake(count as u8);
        self.stats.probe_trains_sent += 1;
    }

    /// How many packets of probe train path `index`, which the scheduler picked for data,
    /// should send now (F11, PROTOCOL.md §11.10), if any: fast start on, the handshake
    /// confirmed (an XX client waits for HandshakeDone), the path active and validated, no
    /// train of its own under way or awaiting its report, room in its congestion window for
    /// a train of [`MIN_TRAIN_LEN`] packets, and either
    /// - (a) it has not probed since it started (or moved to another network path) and is
    ///   still in its first slow start, or
    /// - (b) it has been idle (nothing in flight, nothing ack-eliciting sent) for at least a
    ///   smoothed RTT, and its latest estimate is older than that (a handshake train's
    ///   report arrives just before the first data),
    ///
    /// and enough application data waits to fill at least half of the train. A first train
    /// is padded to its full length (the first estimate is worth it); a restart train is as
    /// long as the data waiting, rounded up to whole packets, so that requests and replies
    /// on a short path, idle before every exchange, do not each pay for padding.
    ///
    /// Trains go only where the scheduler sends data, so a backup path is not probed while
    /// it carries nothing.
    ///
    /// [`MIN_TRAIN_LEN`]: crate::path::probe::MIN_TRAIN_LEN
    fn wants_train(&mut self, now: Instant, index: usize) -> Option<u8> {
        use crate::path::probe::MIN_TRAIN_LEN;
        if !self.config.fast_start || !self.confirmed || !self.data_allowed_by_window() {
            return None;
        }
        let p = &mut self.paths[index];
        p.probe_tx.expire(now, p.rtt.smoothed());
        if !p.usable() || p.state != crate::path::PathState::Active {
            return None;
        }
        if p.probe_tx.sending.is_some() || p.probe_tx.awaiting.is_some() {
            return None;
        }
        let first = !p.probe_tx.probed && p.cc.metrics().ssthresh.is_none();
        let srtt = p.rtt.smoothed();
        let idle = p.sent.bytes_in_flight == 0
            && p.sent
                .time_of_last_ack_eliciting
                .is_some_and(|t| now.saturating_duration_since(t) >= srtt)
            && p.probe_tx
                .estimate
                .is_none_or(|(_, at)| now.saturating_duration_since(at) >= srtt);
        if !(first || idle) {
            return None;
        }
        let mtu = u64::from(p.mtu.max(1));
        if p.cwnd_room() / mtu < u64::from(MIN_TRAIN_LEN)
            || p.amplification_budget() < u64::from(MIN_TRAIN_LEN) * mtu
        {
            return None;
        }
        let count = self.train_len(index);
        let unsent = self.unsent_app_bytes();
        if unsent < u64::from(count) * mtu / 2 {
            return None;
        }
        if first {
            return Some(count);
        }
        // Whole packets' worth of data, rounded up: at most the last packet is padded.
        let data_packets = unsent.div_ceil(mtu).min(u64::from(count)) as u8;
        (data_packets >= MIN_TRAIN_LEN.min(count)).then_some(data_packets)
    }

    /// Packets in a train on path `index`: the configured length, within the window's room.
    fn train_len(&self, index: usize) -> u8 {
        let p = &self.paths[index];
        let room = p.cwnd_room() / u64::from(p.mtu.max(1));
        room.min(self.configured_train_len()) as u8
    }

    /// `probe_train_len`, within what the Probe frame can number.
    fn configured_train_len(&self) -> u64 {
        u64::from(
            self.config
                .probe_train_len
                .clamp(2, crate::wire::MAX_PROBE_TRAIN),
        )
    }

    /// The length of a train with the handshake: no longer than a client keeps before it has
    /// keys.
    pub(crate) fn handshake_train_len(&self) -> u64 {
        self.configured_train_len()
            .min(super::handshake::MAX_EARLY_PACKETS as u64)
    }

    /// Application bytes never sent yet that the peer's credit lets go (flow data, messages,
    /// datagrams).
    fn unsent_app_bytes(&self) -> u64 {
        let mut flows = 0u64;
        for id in &self.flows.ready {
            if let Some(send) = self.flows.flows.get(id).and_then(|f| f.send.as_ref()) {
                if send.reset.is_none() {
                    flows += send.written.min(send.max_data).saturating_sub(send.unsent);
                }
            }
        }
        let datagrams: u64 = self.datagrams_out.iter().map(|d| d.len() as u64).sum();
        (flows + self.messages_out.unsent_bytes()).min(self.flows.conn_credit()) + datagrams
    }

    /// The path for the next data packet: the scheduler's pick among the paths that may carry
    /// data, told which have room now. Standby paths are offered only when no active path is
    /// usable; a path still being validated only when no path is (the peer moved: its new
    /// address is used within the 3× amplification limit until it answers).
    fn schedule(&mut self, now: Instant) -> Option<usize> {
        use crate::path::scheduler::{Candidate, Context};
        use crate::path::PathState;
        let any_active = self
            .paths
            .iter()
            .any(|p| p.usable() && p.state == PathState::Active);
        let any_usable = self.paths.iter().any(|p| p.usable());
        let total_cwnd: u64 = self
            .paths
            .iter()
            .filter(|p| p.usable())
            .map(|p| p.cc.window())
            .sum();
        let mut candidates = [Candidate {
            index: 0,
            ready: false,
            rtt: Duration::ZERO,
            cwnd: 0,
            in_flight: 0,
            last_ack: None,
        }; crate::path::MAX_PATHS];
        let mut count = 0;
        let mut any_ready = false;
        for index in 0..self.paths.len() {
            let p = &self.paths[index];
            let eligible = if any_usable {
                p.usable() && (p.state == PathState::Active || !any_active)
            } else {
                p.state != PathState::Dead && !p.abandoned() && p.challenge.is_some()
            };
            if !eligible {
                continue;
            }
            let ready = self.can_send_data(now, index, total_cwnd);
            any_ready |= ready;
            let p = &self.paths[index];
            candidates[count] = Candidate {
                index,
                ready,
                rtt: p.rank_rtt(),
                cwnd: p.cc.window(),
                in_flight: p.sent.bytes_in_flight,
                last_ack: p.last_ack,
            };
            count += 1;
            if count == candidates.len() {
                break;
            }
        }
        if !any_ready {
            return None;
        }
        let ctx = Context {
            deadline: if self.config.scheduler == crate::SchedulerKind::Deadline {
                self.messages_out
                    .waiting_urgency()
                    .0
                    .map(|d| d.saturating_duration_since(now))
            } else {
                None
            },
            packet_size: u64::from(self.paths[candidates[0].index].mtu),
        };
        let pick = self.scheduler.pick(&candidates[..count], &ctx)?;
        // A scheduler returns one of the ready paths it was offered; anything else is a bug in
        // a user-supplied scheduler, answered by sending nothing rather than breaking a limit.
        candidates[..count]
            .iter()
            .any(|c| c.index == pick && c.ready)
            .then_some(pick)
    }

    /// Whether the pending copy `k` can go now: its path still carries data and has window
    /// and pacer room for it.
    fn copy_fits(&mut self, now: Instant, k: usize) -> bool {
        let copy = &self.copies[k];
        let Some(path) = self.paths.get_mut(copy.path) else {
            return false;
        };
        let size = (copy.payload.len() + 64) as u64;
        if !path.usable() || path.cwnd_room() < size || path.amplification_budget() < size {
            return false;
        }
        path.pacer_allows(now, size)
    }

    /// After a data packet on path `index`: queues a copy of its message and flow frames
    /// (`payload`, `frames`) for every other active path.
    fn queue_copies(&mut self, index: usize, payload: &[u8], frames: &[SentFrame]) {
        use crate::path::PathState;
        if payload.is_empty() {
            return;
        }
        for j in 0..self.paths.len() {
            let p = &self.paths[j];
            if j == index || !p.usable() || p.state != PathState::Active {
                continue;
            }
            if self.copies.len() >= MAX_PENDING_COPIES {
                self.copies.pop_front();
                self.stats.copies_dropped += 1;
            }
            self.copies.push_back(PendingCopy {
                path: j,
                payload: payload.to_vec(),
                frames: frames.iter().copied().collect(),
            });
        }
    }

    /// Whether path `index` has room for a full data packet now: amplification budget,
    /// congestion window, its share of the peer's receive window (decoupled flow control,
    /// DESIGN.md F16: a path holds at most cwnd/Σcwnd of it unacknowledged, so a slow or
    /// dying path cannot hold the connection's window), then the pacer.
    fn can_send_data(&mut self, now: Instant, index: usize, total_cwnd: u64) -> bool {
        let window = self.flows.peer_connection_window();
        let several = self.paths.iter().filter(|p| p.usable()).count() > 1;
        let path = &mut self.paths[index];
        let budget = path.amplification_budget();
        let mtu = u64::from(path.mtu).min(budget);
        if mtu < super::MIN_PACKET_BUDGET || path.cwnd_room() < mtu {
            return false;
        }
        if several && total_cwnd > 0 {
            let share =
                (u128::from(window) * u128::from(path.cc.window()) / u128::from(total_cwnd)) as u64;
            if path.sent.bytes_in_flight + mtu > share.max(2 * mtu) {
                return false;
            }
        }
        path.pacer_allows(now, mtu)
    }

    /// The path an ACK-only packet takes: the path whose packets it acknowledges, so that a
    /// path broken in either direction shows as that path's silence and never hides the
    /// other paths' acknowledgements (ACKs on data packets still cover every path). When that
    /// path cannot send (abandoned, or out of amplification budget): the primary one, or any
    /// with budget.
    fn ack_path(&self, now: Instant) -> usize {
        let own = self
            .paths
            .iter()
            .position(|p| (p.acks.wants_ack(now) || !p.acks.nack.is_empty()) && sends_own_acks(p));
        if let Some(i) = own {
            return i;
        }
        let primary = self.primary();
        if self.paths[primary].amplification_budget() >= super::MIN_PACKET_BUDGET {
            return primary;
        }
        self.paths
            .iter()
            .position(|p| p.amplification_budget() >= super::MIN_PACKET_BUDGET)
            .unwrap_or(primary)
    }

    /// Builds one protected short-header packet on path `index` for `purpose`. Returns its
    /// size and the ECN codepoint it leaves with.
    fn build_packet(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        index: usize,
        purpose: Purpose,
        copy: Option<PendingCopy>,
    ) -> Option<(usize, Option<EcnCodepoint>)> {
        let close_only = purpose == Purpose::Close;
        let path = &self.paths[index];
        let mtu = usize::from(path.mtu);
        let budget = path.amplification_budget();
        // A challenge or response goes within a smaller budget, unpadded (RFC 9000 §8.2.1):
        // a client whose NAT rebound announces its new port with an ACK of some 40 bytes,
        // and a receiver with nothing in flight says nothing more until it hears from us.
        let owes_validation = purpose == Purpose::PathWork
            && ((path.challenge_pending && path.challenge.is_some()) || !path.responses.is_empty());
        let floor = if owes_validation {
            MIN_CHALLENGE_BUDGET
        } else {
            super::MIN_PACKET_BUDGET
        };
        if (budget as usize) < mtu.min(floor as usize) {
            return None;
        }
        let mtu = mtu.min(budget as usize);
        let path_work = purpose == Purpose::PathWork;
        let probing = path_work && path.probes > 0;
        // The second probe timeout in a row probes at the base size: if it gets through while
        // full-size packets do not, PMTU discovery sees a black hole (PROTOCOL.md §5.5).
        let mtu = if probing && path.sent.pto_count >= 2 && path.pmtu.detects_black_holes() {
            mtu.min(usize::from(crate::path::pmtu::BASE_PLPMTU))
        } else {
            mtu
        };
        let wants_ack = self
            .paths
            .iter()
            .any(|p| p.acks.wants_ack(now) || !p.acks.nack.is_empty());
        let data_allowed = match purpose {
            Purpose::Data => true,
            Purpose::PathWork => probing && path.usable() && self.has_sendable_data(),
            Purpose::Close | Purpose::Acks | Purpose::Copy => false,
        };
        let path_id = path.id;
        let start = buf.len();
        let rate = self.rate_area(index);
        let key_phase = self.keys.as_ref().is_some_and(|k| k.send_phase());
        let path = &mut self.paths[index];
        let pn = path.sent.take_pn();
        // With the explicit-rate area (F12) the header grows by 8 bytes; the payload budget
        // below follows from the encoded header, so every limit stays within the MTU.
        let header = wire::ShortHeader::new(
            self.remote_cid,
            path_id as u8,
            key_phase,
            pn,
            path.sent.largest_acked,
            rate,
        );
        header.encode(buf);
        let header_len = buf.len() - start;
        let max_payload = mtu - header_len - TAG_LEN;
        let payload_start = buf.len();
        let mut frames = crate::recovery::SentFrames::new();
        let mut ack_eliciting = false;
        let mut pad_to = 0;
        // Frames recorded before the Probe frame of a train packet (to tell padding-only ones).
        let mut probe_frames = None;

        if close_only {
            if let Some(close) = &self.close {
                let reason = &close.reason[..close.reason.len().min(max_payload - 32)];
                Frame::Close {
                    application: close.application,
                    error_code: close.code,
                    frame_type: (!close.application).then_some(0),
                    reason,
                }
                .encode(buf);
            }
        } else {
            if path_work {
                // Each challenge or response only if it fits, with room left for the Ping and
                // AckRequest a probe ends with: within a small budget (down to
                // MIN_CHALLENGE_BUDGET) one frame may be all that fits; the rest wait.
                let fits = |buf: &Vec<u8>| {
                    buf.len() - payload_start + VALIDATION_FRAME_LEN + TRAILER_LEN <= max_payload
                };
                let path = &mut self.paths[index];
                if let Some(data) = path
                    .challenge
                    .filter(|_| path.challenge_pending && fits(buf))
                {
                    Frame::PathChallenge { data }.encode(buf);
                    frames.push(SentFrame::PathChallenge(path_id));
                    path.challenge_pending = false;
                    path.challenges_sent += 1;
                    path.challenge_sent_at = Some(now);
                    ack_eliciting = true;
                    pad_to = PATH_PROBE_SIZE;
                }
                while fits(buf) {
                    let Some(data) = path.responses.pop_front() else {
                        break;
                    };
                    Frame::PathResponse { data }.encode(buf);
                    ack_eliciting = true;
                    pad_to = PATH_PROBE_SIZE;
                }
            }
            let copy_len = copy.as_ref().map_or(0, |c| c.payload.len());
            if wants_ack || data_allowed {
                let used = buf.len() - payload_start + copy_len + TRAILER_LEN;
                let room = max_payload.saturating_sub(used);
                let only = (purpose == Purpose::Acks).then_some(index);
                self.write_acks(now, buf, room, only, &mut frames);
            }
            if let Some(copy) =
                copy.filter(|c| buf.len() - payload_start + c.payload.len() <= max_payload)
            {
                buf.extend_from_slice(&copy.payload);
                frames.extend(copy.frames.iter().copied());
                self.stats.bytes_redundant += copy.payload.len() as u64;
                ack_eliciting = true;
            }
            if data_allowed {
                let limit = payload_start + max_payload - TRAILER_LEN;
                if purpose == Purpose::Data {
                    if let Some((train, position, count)) =
                        self.paths[index].probe_tx.next_packet(now)
                    {
                        // One of a probe train: full size, data or not, so that every
                        // packet of the train takes the same time through the bottleneck.
                        Frame::Probe {
                            train,
                            index: position,
                            count,
                        }
                        .encode(buf);
                        ack_eliciting = true;
                        pad_to = mtu;
                        probe_frames = Some(frames.len());
                    }
                }
                ack_eliciting |= self.write_control_frames(now, buf, limit, &mut frames);
                if self.data_allowed_by_window() {
                    let datagrams = self.write_datagrams(buf, limit);
                    let before = frames.len();
                    let data_start = buf.len();
                    let top = self.write_message_frames(now, index, buf, limit, &mut frames);
                    let room = limit.saturating_sub(buf.len());
                    self.write_flow_frames(buf, room, &mut frames);
                    ack_eliciting |= datagrams || frames.len() > before;
                    let path = &mut self.paths[index];
                    if !path.carried_data {
                        path.carried_data =
                            datagrams || frames[before..].iter().any(SentFrame::is_data);
                    }
                    let urgent = top.is_some_and(|p| {
                        self.config.redundant_priority.is_some_and(|min| p >= min)
                    });
                    if (urgent || self.scheduler.duplicates()) && frames.len() > before {
                        let payload = buf[data_start..].to_vec();
                        let sent: Vec<SentFrame> = frames[before..].to_vec();
                        self.queue_copies(index, &payload, &sent);
                    }
                }
                if self.ping_pending {
                    Frame::Ping.encode(buf);
                    self.ping_pending = false;
                    ack_eliciting = true;
                }
            }
            if probing {
                if !ack_eliciting {
                    Frame::Ping.encode(buf);
                    ack_eliciting = true;
                }
                // A probe asks for an immediate answer (SLTP REPLY_REQ): each probe then
                // gets its own ACK, which doubles the chances through a loss burst.
                Frame::AckRequest.encode(buf);
            }
        }
        if let Some(before) = probe_frames {
            if !frames[before..].iter().any(SentFrame::is_data) {
                self.stats.probe_padding_packets += 1;
            }
        }
        let carries_ack = frames.iter().any(|f| matches!(f, SentFrame::Ack { .. }));
        if carries_ack && !ack_eliciting && self.wants_ack_of_ack(now, index) {
            // An ACK-only packet is never acknowledged, so a receiver that only receives
            // would repeat its old gaps forever: once per RTT, ask for an acknowledgement.
            Frame::Ping.encode(buf);
            ack_eliciting = true;
        }
        let app_limited = !self.has_sendable_data();
        if ack_eliciting {
            self.paths[index].ack_request.burst += 1;
        }
        let request = &self.paths[index].ack_request;
        if data_allowed
            && !probing
            && ack_eliciting
            && app_limited
            && (request.threshold > 2 || request.burst >= request.threshold)
        {
            // The last packet before we fall silent. With a high AckFrequency threshold its
            // ACK would wait for max_ack_delay; after a burst of `threshold` packets or more
            // the peer would send an ACK-only datagram at once, where the peer's answer (a
            // reply) can carry it (§9.5). A lone packet below the threshold needs neither.
            Frame::AckRequest.encode(buf);
        }
        if app_limited {
            self.paths[index].ack_request.burst = 0;
        }
        if buf.len() == payload_start {
            // Nothing to say after all: give the packet number back.
            self.paths[index].sent.next_pn -= 1;
            buf.truncate(start);
            return None;
        }
        // Short payloads are padded so that every packet is longer than a stateless reset;
        // path validation packets to the probe size.
        let pad_to = (pad_to.min(mtu).saturating_sub(header_len + TAG_LEN)).max(4);
        while buf.len() - payload_start < pad_to {
            buf.push(0);
        }
        // Sealing can be refused (no keys, the confidentiality limit): the packet is given up
        // and the caller's buffer left as it was (the runtime writes into a GSO batch).
        let sealed = self.keys.as_mut().and_then(|keys| {
            let (head, body) = buf[start..].split_at_mut(header_len);
            // Associated data: the header with the router-writable feedback rate zeroed (§6.3).
            let mut scratch = [0u8; wire::MAX_SHORT_HEADER_LEN];
            let aad = wire::short_header_aad(head, header.feedback_rate_offset(), &mut scratch);
            keys.seal_in_place(path_id, pn, aad, body)
        });
        let Some(tag) = sealed else {
            buf.truncate(start);
            return None;
        };
        buf.extend_from_slice(&tag);
        let size = buf.len() - start;
        let path = &mut self.paths[index];
        if probing && ack_eliciting {
            path.probes -= 1;
        }
        if !ack_eliciting && !close_only {
            self.stats.ack_only_sent += 1;
        }
        let ecn = path.ecn.mark();
        path.ecn.on_sent(ecn);
        let in_flight = ack_eliciting;
        if in_flight {
            path.pacer.on_sent(size as u64);
            path.cc
                .on_sent(now, size as u64, path.sent.bytes_in_flight + size as u64);
        }
        path.sent.on_sent(
            pn,
            SentPacket {
                time: now,
                size: size as u16,
                ack_eliciting,
                in_flight,
                app_limited,
                ecn: ecn.is_some(),
                copy: purpose == Purpose::Copy,
                overtaken: None,
                frames,
            },
        );
        Some((size, ecn))
    }

    /// Whether an ACK-only packet should carry a Ping: our ACKs repeat gaps the peer may
    /// already know of, and nothing ack-eliciting went out for a round trip.
    fn wants_ack_of_ack(&self, now: Instant, index: usize) -> bool {
        let path = &self.paths[index];
        self.paths.iter().any(|p| p.acks.received.len() > 1)
            && path
                .sent
                .time_of_last_ack_eliciting
                .is_none_or(|t| now.saturating_duration_since(t) >= path.rtt.smoothed())
    }

    /// Writes the ACK (and NACK) of every path that has something to acknowledge, each
    /// naming its path, within `room` bytes. Records for each the numbers it described
    /// completely, `(floor, largest)`: once the peer acknowledges this packet, it knows of them.
    fn write_acks(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        room: usize,
        only: Option<usize>,
        frames: &mut crate::recovery::SentFrames,
    ) {
        // An ACK-only packet on path `only` carries that path's ACK, and those of paths that
        // cannot send their own: were `only` broken in our direction, the others' ACKs would
        // be lost with it and their senders left waiting (PROTOCOL.md §5.4).
        let wanted = |i: usize, p: &crate::path::Path| {
            p.has_ack_to_send() && only.is_none_or(|o| o == i || !sends_own_acks(p))
        };
        let due = (0..self.paths.len())
            .filter(|&i| wanted(i, &self.paths[i]))
            .count();
        if due == 0 {
            return;
        }
        // Half the packet for acknowledgements, shared among the paths that need one.
        let budget = (room / 2 / due).max(ACK_ROOM.min(room));
        for index in 0..self.paths.len() {
            let path = &self.paths[index];
            if !wanted(index, path) {
                continue;
            }
            let id = path.id;
            if let Some((floor, largest)) = self.write_ack(now, index, buf, budget) {
                frames.push(SentFrame::Ack {
                    path: id,
                    floor,
                    largest,
                });
            }
        }
    }

    /// Writes one path's ACK (and NACK) in at most `budget` bytes.
    fn write_ack(
        &mut self,
        now: Instant,
        index: usize,
        buf: &mut Vec<u8>,
        budget: usize,
    ) -> Option<(u64, u64)> {
        let before = buf.len();
        let path = &mut self.paths[index];
        let id = path.id;
        let acks = &mut path.acks;
        let (_, received_at) = acks.largest?;
        let delay = now.saturating_duration_since(received_at);
        let ecn = acks.ecn.any().then_some(acks.ecn);
        let plan = wire::encode_ack(
            id,
            delay.as_micros() as u64,
            acks.reported(),
            crate::recovery::MAX_ACK_RANGES,
            budget,
            ecn.as_ref(),
            buf,
        );
        if plan.is_none() && budget < ACK_ROOM {
            // No room in this packet (a redundant copy fills it): the ACK stays due for the
            // next packet, rather than being marked sent unwritten.
            return None;
        }
        let described = plan.and_then(|plan| {
            let largest = *acks.reported().next()?.end();
            let floor = if plan.ranges >= acks.received.len() {
                0
            } else {
                *acks.reported().nth(plan.ranges - 1)?.start()
            };
            Some((floor, largest))
        });
        if !acks.nack.is_empty() {
            let nack = &acks.nack;
            wire::encode_nack(id, nack.iter().copied(), nack.len(), budget / 2, buf);
            self.stats.nacks_sent += 1;
        }
        acks.on_ack_sent();
        // The path's lowest feedback rate rides with its ACK (F12, §9.27), within the budget.
        let room = budget.saturating_sub(buf.len() - before);
        self.write_rate_echo(index, buf, room);
        described
    }

    /// Control frames (credit, flow resets, handshake done, path responses). Returns whether
    /// any was written.
    fn write_control_frames(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        limit: usize,
        frames: &mut crate::recovery::SentFrames,
    ) -> bool {
        let start = buf.len();
        let room = |buf: &Vec<u8>| limit.saturating_sub(buf.len()) >= 32;
        if self.window.update_pending && limit.saturating_sub(buf.len()) >= 64 {
            match &self.window.local_closed {
                Some((code, reason)) => Frame::WindowClose {
                    reason_code: *code,
                    reason: &reason[..reason.len().min(limit - buf.len() - 32)],
                }
                .encode(buf),
                None => Frame::WindowOpen.encode(buf),
            }
            frames.push(SentFrame::WindowState);
            self.window.update_pending = false;
        }
        if self.window.status_pending && room(buf) {
            Frame::WindowStatus.encode(buf);
            self.window.status_pending = false;
            self.stats.window_probes += 1;
            // Poll again later, backing off from one RTT to a second while it stays closed.
            let base = self.paths[self.primary()]
                .rtt
                .smoothed()
                .max(Duration::from_millis(50));
            let step = self.window.status_step.min(5);
            let wait = (base * (1 << step)).min(Duration::from_secs(1));
            self.window.status_step += 1;
            self.window.status_at = Some(now + wait);
        }
        while room(buf) {
            let Some((id, credit)) = self.messages_out.skips.pop_front() else {
                break;
            };
            Frame::MessageSkip {
                msg_id: id.0,
                credit,
            }
            .encode(buf);
            frames.push(SentFrame::MessageSkip(id, credit));
        }
        for path in &mut self.paths {
            if path.status_pending && room(buf) {
                let status = match path.wanted {
                    crate::path::PathState::Standby => wire::PathStatusCode::Standby,
                    crate::path::PathState::Abandoned => wire::PathStatusCode::Abandoned,
                    _ => wire::PathStatusCode::Active,
                };
                Frame::PathStatus {
                    path_id: path.id,
                    sequence: path.status_sequence,
                    status,
                }
                .encode(buf);
                frames.push(SentFrame::PathStatus(path.id));
                path.status_pending = false;
            }
        }
        while room(buf) {
            let Some(seq) = self.remove_pending.pop() else {
                break;
            };
            Frame::RemoveAddress { seq }.encode(buf);
            frames.push(SentFrame::RemoveAddress(seq));
        }
        for path in &mut self.paths {
            let request = &mut path.ack_request;
            if request.pending && room(buf) {
                Frame::AckFrequency {
                    path_id: path.id,
                    sequence: request.sequence,
                    threshold: request.threshold,
                }
                .encode(buf);
                frames.push(SentFrame::AckFrequency(path.id));
                request.pending = false;
            }
        }
        for path in &mut self.paths {
            if room(buf) {
                if let Some(r) = path.probe_rx.pending.take() {
                    Frame::ProbeReport {
                        path_id: path.id,
                        train: r.train,
                        received: r.received,
                        rate: r.rate,
                    }
                    .encode(buf);
                    frames.push(SentFrame::ProbeReport {
                        path: path.id,
                        train: r.train,
                    });
                }
            }
        }
        if self.advertise_pending
            && limit.saturating_sub(buf.len()) >= 32 * self.config.advertise.len()
        {
            for (seq, addr) in self.config.advertise.iter().enumerate() {
                Frame::AddAddress {
                    seq: seq as u64,
                    addr: *addr,
                }
                .encode(buf);
            }
            frames.push(SentFrame::AddAddress);
            self.advertise_pending = false;
        }
        if self.handshake_done_pending && room(buf) {
            Frame::HandshakeDone.encode(buf);
            frames.push(SentFrame::HandshakeDone);
            self.handshake_done_pending = false;
        }
        if self.flows.max_data_pending && room(buf) {
            Frame::MaxData {
                max: self.flows.local_max_data,
            }
            .encode(buf);
            frames.push(SentFrame::MaxData);
            self.flows.max_data_pending = false;
        }
        for d in 0..2 {
            if self.flows.max_flows_pending[d] && room(buf) {
                Frame::MaxFlows {
                    bidi: d == 0,
                    max: self.flows.local_max[d],
                }
                .encode(buf);
                frames.push(SentFrame::MaxFlows(d));
                self.flows.max_flows_pending[d] = false;
                self.flows.advertised_max[d] = self.flows.local_max[d];
            }
        }
        while room(buf) {
            let Some(id) = self.flows.credit_pending.pop() else {
                break;
            };
            if let Some(recv) = self.flows.flows.get(&id).and_then(|f| f.recv.as_ref()) {
                Frame::MaxFlowData {
                    flow_id: id.0,
                    max: recv.max_data,
                }
                .encode(buf);
                frames.push(SentFrame::MaxFlowData(id));
            }
        }
        buf.len() > start
    }

    /// Queued datagrams that fit (never resent). Returns whether any was written.
    fn write_datagrams(&mut self, buf: &mut Vec<u8>, limit: usize) -> bool {
        let mut wrote = false;
        if self.datagrams_out.is_empty() {
            return false;
        }
        let max = self.datagram_payload(true).unwrap_or(0);
        while let Some(d) = self.datagrams_out.front() {
            if d.len() > max {
                // Queued when the paths carried more: after a PMTU fall-back or a move no
                // usable path carries it, and waiting would hold back every datagram behind
                // it. Dropped and counted, as a datagram from a full queue is. (One that only
                // this packet's path cannot carry waits for a path that can.)
                self.datagrams_out.pop_front();
                self.stats.datagrams_dropped += 1;
                continue;
            }
            let frame = Frame::Datagram { data: d };
            if limit.saturating_sub(buf.len()) < frame.encoded_len() {
                break;
            }
            frame.encode(buf);
            self.datagrams_out.pop_front();
            wrote = true;
        }
        wrote
    }

    /// Message fragments, highest priority first.
    fn write_message_frames(
        &mut self,
        now: Instant,
        index: usize,
        buf: &mut Vec<u8>,
        limit: usize,
        frames: &mut crate::recovery::SentFrames,
    ) -> Option<u8> {
        // Frame overhead: type, ID, flags, priority, lengths, offset, deadline, reply-to.
        const OVERHEAD: usize = 1 + 8 + 2 + 8 + 8 + 8 + 8 + 4;
        // The path does not change while one packet is built.
        let path = self.paths[index].message_estimate();
        let mut top = None;
        while limit.saturating_sub(buf.len()) > OVERHEAD {
            let max = (limit - buf.len() - OVERHEAD) as u64;
            let credit = self.flows.conn_credit();
            let Some(f) = self.messages_out.next_fragment(now, max, credit, &path) else {
                break;
            };
            crate::wire::MessageFrame {
                msg_id: f.id.0,
                ordered: f.id.is_ordered(),
                priority: f.priority,
                total_len: f.total,
                offset: f.offset,
                deadline_us: f.deadline_left.map(|d| d.as_micros() as u64),
                reply_to: f.reply_to.map(|r| r.0),
                data: &f.data,
            }
            .encode(buf);
            self.flows.data_sent += f.new_bytes;
            if f.resend {
                self.stats.bytes_retransmitted += f.data.len() as u64;
            }
            if f.copy {
                self.stats.bytes_redundant += f.data.len() as u64;
            }
            frames.push(SentFrame::Message {
                id: f.id,
                offset: f.offset,
                len: f.data.len() as u32,
            });
            top = top.max(Some(f.priority));
        }
        self.report_hopeless_messages();
        top
    }

    /// Flow frames (resets, stop requests, data) round-robin over ready flows, so that one
    /// flow's backlog never blocks another (F4).
    pub(crate) fn write_flow_frames(
        &mut self,
        buf: &mut Vec<u8>,
        mut room: usize,
        frames: &mut crate::recovery::SentFrames,
    ) {
        let mut visited = 0;
        let count = self.flows.ready.len();
        while room > FLOW_FRAME_OVERHEAD + 1 && visited < count {
            let Some(id) = self.flows.ready.pop_front() else {
                break;
            };
            visited += 1;
            let conn_credit = self.flows.conn_credit();
            let Some(state) = self.flows.flows.get_mut(&id) else {
                continue;
            };
            let before = buf.len();
            // What is left of `room` after this flow's frames so far: each control frame
            // goes only if it fits, and the data is sized from what is left.
            let left = |buf: &Vec<u8>| room.saturating_sub(buf.len() - before);
            let mut more = false;
            if let Some(recv) = state.recv.as_mut() {
                if recv.stop_pending {
                    let frame = Frame::StopSending {
                        flow_id: id.0,
                        error_code: recv.stop.unwrap_or(0),
                    };
                    if frame.encoded_len() <= left(buf) {
                        frame.encode(buf);
                        recv.stop_pending = false;
                        frames.push(SentFrame::StopSending(id));
                    } else {
                        more = true;
                    }
                }
            }
            if let Some(send) = state.send.as_mut() {
                if let Some(code) = send.reset.filter(|_| send.reset_pending) {
                    let frame = Frame::ResetFlow {
                        flow_id: id.0,
                        error_code: code,
                        final_size: send.unsent,
                    };
                    if frame.encoded_len() <= left(buf) {
                        frame.encode(buf);
                        send.reset_pending = false;
                        frames.push(SentFrame::ResetFlow(id));
                    } else {
                        more = true;
                    }
                } else if left(buf) > FLOW_FRAME_OVERHEAD {
                    let max = left(buf).saturating_sub(FLOW_FRAME_OVERHEAD) as u64;
                    let was_new = send.unsent;
                    if let Some((offset, len, fin)) = send.next_range(max, conn_credit) {
                        let new_bytes = send.unsent - was_new;
                        wire::encode_flow_header(buf, id.0, offset, len, fin);
                        send.copy_range(offset, len, buf);
                        if fin {
                            send.fin_pending = false;
                        }
                        if new_bytes == 0 && len > 0 {
                            self.stats.bytes_retransmitted += len;
                        }
                        self.flows.data_sent += new_bytes;
                        frames.push(SentFrame::Flow {
                            id,
                            offset,
                            len: len as u32,
                            fin,
                        });
                    }
                    let send = self.flows.flows.get_mut(&id).and_then(|s| s.send.as_mut());
                    if let Some(send) = send {
                        if send.is_credit_blocked() {
                            send.blocked_pending = true;
                        }
                        more |= send.has_pending();
                    }
                } else {
                    more = true;
                }
            }
            room = room.saturating_sub(buf.len() - before);
            if more {
                self.flows.ready.push_back(id);
            }
        }
    }

    /// Packets acknowledged: free what they carried and feed the controller.
    pub(crate) fn on_acked(&mut self, now: Instant, path_id: usize, acked: Vec<(u64, SentPacket)>) {
        if acked.is_empty() {
            return;
        }
        // The path answers: probes still owed from a timeout are no longer needed.
        self.paths[path_id].probes = 0;
        self.pmtu_on_acked(path_id, &acked);
        self.paths[path_id].last_ack = Some(now);
        for (_, p) in &acked {
            let path = &mut self.paths[path_id];
            if p.in_flight {
                path.cc
                    .on_ack(now, p.time, u64::from(p.size), p.app_limited, &path.rtt);
            }
            self.on_acked_frames(&p.frames);
        }
        let path = &mut self.paths[path_id];
        let largest_sent = acked.iter().map(|(_, p)| p.time).max();
        let app_limited = acked.iter().all(|(_, p)| p.app_limited);
        path.cc
            .on_end_acks(now, path.sent.bytes_in_flight, app_limited, largest_sent);
        path.update_ack_threshold(now, self.config.max_ack_threshold);
        self.qlog_metrics(now, path_id, false);
    }

    pub(crate) fn on_acked_frames(&mut self, frames: &[SentFrame]) {
        for f in frames {
            if let SentFrame::Flow {
                id,
                offset,
                len,
                fin,
            } = *f
            {
                let flows = &mut self.flows;
                let Some(send) = flows.flows.get_mut(&id).and_then(|s| s.send.as_mut()) else {
                    continue;
                };
                let was_done = send.is_done();
                send.ack(offset, u64::from(len), fin, &mut flows.buffers);
                if send.buffered() == 0 {
                    flows.buffers.clear();
                }
                // Once, when the last of it is acknowledged (a copy or a spurious resend may be
                // acknowledged again later).
                if send.is_done() && !was_done {
                    self.events.push_back(Event::FlowFinished(id));
                    self.flows.reap(id);
                }
                if let Some(i) = self.write_blocked.iter().position(|b| *b == id) {
                    let room = self
                        .flows
                        .flows
                        .get(&id)
                        .and_then(|s| s.send.as_ref())
                        .is_some_and(|s| s.buffered() < self.flows.send_buffer);
                    if room {
                        self.write_blocked.swap_remove(i);
                        self.events.push_back(Event::FlowWritable(id));
                    }
                }
            } else if let SentFrame::ResetFlow(id) = *f {
                if let Some(send) = self.flows.flows.get_mut(&id).and_then(|s| s.send.as_mut()) {
                    send.reset_acked = true;
                }
                self.flows.reap(id);
            } else if let SentFrame::Message { id, offset, len } = *f {
                self.messages_out.on_acked(id, offset, u64::from(len));
            } else if let SentFrame::Ack {
                path,
                floor,
                largest,
            } = *f
            {
                if let Some(i) = self.path_index(path) {
                    self.paths[i].acks.on_ack_acknowledged(floor, largest);
                }
            }
        }
    }

    /// Packets lost: resend what they carried and tell the controller. `report` is what the
    /// peer said it received in the frame that revealed them (for persistent congestion).
    pub(crate) fn on_lost(
        &mut self,
        now: Instant,
        path_id: usize,
        lost: Vec<(u64, SentPacket)>,
        report: PeerReport<'_>,
    ) {
        if lost.is_empty() {
            return;
        }
        // PMTU probes are no data and no congestion signal: counted apart, never resent.
        let lost = self.pmtu_on_lost(path_id, lost);
        if lost.is_empty() {
            return;
        }
        self.stats.packets_lost += lost.len() as u64;
        let mut lost_bytes = 0;
        let mut newest = None;
        for (_, p) in &lost {
            if p.in_flight {
                lost_bytes += u64::from(p.size);
                newest = newest.max(Some(p.time));
            }
            if !p.copy {
                self.requeue(&p.frames, false);
            }
        }
        let max_ack_delay = self.peer_max_ack_delay();
        let path = &mut self.paths[path_id];
        let mut reduced = false;
        if let Some(newest) = newest {
            //= RFC 9002 §7.6.1: the persistent congestion duration is
            //# (smoothed_rtt + max(4*rttvar, kGranularity) + max_ack_delay) *
            //# kPersistentCongestionThreshold.
            let period = (path.rtt.pto_base() + max_ack_delay) * 3;
            let persistent =
                persistent_congestion(&lost, path.sent.first_rtt_sample, period, &report);
            let before = path.cc.metrics().congestion_events;
            path.cc
                .on_congestion_event(now, newest, lost_bytes, persistent, &path.rtt);
            reduced = path.cc.metrics().congestion_events != before;
        }
        path.ecn
            .on_lost(lost.iter().filter(|(_, p)| p.ecn).count() as u64);
        path.sent.record_losses(now, &lost, reduced, &path.rtt);
        if self.qlog.is_some() {
            let id = path.id;
            for (pn, _) in &lost {
                let packet_number = *pn;
                self.qlog(now, |_| crate::qlog::QlogEvent::PacketLost {
                    path: id,
                    packet_number,
                });
            }
            self.qlog_metrics(now, path_id, reduced);
        }
    }

    /// Puts what lost (or probed) packets carried back in the send queues.
    pub(crate) fn requeue(&mut self, frames: &[SentFrame], probe: bool) {
        for f in frames {
            match *f {
                SentFrame::Flow {
                    id,
                    offset,
                    len,
                    fin,
                } => {
                    if let Some(send) = self.flows.flows.get_mut(&id).and_then(|s| s.send.as_mut())
                    {
                        send.lost(offset, u64::from(len), fin);
                        if send.has_pending() {
                            self.flows.mark_ready(id);
                        }
                    }
                }
                SentFrame::MaxData => self.flows.max_data_pending = true,
                SentFrame::MaxFlowData(id) => {
                    let live = self
                        .flows
                        .flows
                        .get(&id)
                        .and_then(|s| s.recv.as_ref())
                        .is_some_and(|r| r.final_size.is_none() && r.reset.is_none());
                    if live && !self.flows.credit_pending.contains(&id) {
                        self.flows.credit_pending.push(id);
                    }
                }
                SentFrame::MaxFlows(d) => self.flows.max_flows_pending[d] = true,
                SentFrame::ResetFlow(id) => {
                    if let Some(send) = self.flows.flows.get_mut(&id).and_then(|s| s.send.as_mut())
                    {
                        send.reset_pending = true;
                        self.flows.mark_ready(id);
                    }
                }
                SentFrame::StopSending(id) => {
                    if let Some(recv) = self.flows.flows.get_mut(&id).and_then(|s| s.recv.as_mut())
                    {
                        if !recv.is_finished() {
                            recv.stop_pending = true;
                            self.flows.mark_ready(id);
                        }
                    }
                }
                SentFrame::HandshakeDone => self.handshake_done_pending = true,
                SentFrame::Message { id, offset, len } => {
                    self.messages_out.on_lost(id, offset, u64::from(len));
                }
                SentFrame::MessageSkip(id, credit) => {
                    self.messages_out.skips.push_back((id, credit))
                }
                SentFrame::WindowState => self.window.update_pending = true,
                SentFrame::AckFrequency(path) => {
                    if let Some(i) = self.path_index(path) {
                        self.paths[i].ack_request.pending = true;
                    }
                }
                SentFrame::AddAddress => self.advertise_pending = true,
                SentFrame::RemoveAddress(seq) => {
                    if !self.remove_pending.contains(&seq) {
                        self.remove_pending.push(seq);
                    }
                }
                SentFrame::PathStatus(path) => {
                    // Resent with the current status (a newer one may have replaced it).
                    if let Some(i) = self.path_index(path) {
                        self.paths[i].status_pending = true;
                    }
                }
                SentFrame::PathChallenge(path) => {
                    if let Some(p) = self.path_index(path).map(|i| &mut self.paths[i]) {
                        if !p.validated && p.challenge.is_some() {
                            p.challenge_pending = true;
                        }
                    }
                }
                SentFrame::ProbeReport { path, train } => {
                    if let Some(i) = self.path_index(path) {
                        self.paths[i].probe_rx.on_report_lost(train);
                    }
                }
                // The ACK state is current at every send; nothing to resend. A PMTU probe is
                // never resent.
                SentFrame::Ack { .. } | SentFrame::PmtuProbe(_) => {}
            }
        }
        let _ = probe;
    }
}
