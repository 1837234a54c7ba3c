//! Receiving: opening protected packets, the replay window, and frame processing.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::{Connection, State};
use crate::crypto::{OpenFailure, Opened};
use crate::error::ConnectionError;
use crate::event::{Event, Violation};
use crate::flow::{Dir, FlowError, FlowSet, RecvError};
use crate::recovery::ecn::EcnVerdict;
use crate::recovery::{EcnCodepoint, Outcome, PeerReport};
use crate::wire::{self, Frame, TransportErrorCode};
use crate::Side;

/// A frame-processing failure: the code for the peer and a reason for logs.
pub(crate) type FrameError = (TransportErrorCode, &'static str);

impl Connection {
    /// Queues a SecurityViolation event unless one of that kind still waits to be polled (a
    /// half-open connection's events wait for `accept`; a flood of forged packets must not
    /// grow its queue; the stats count every one).
    pub(crate) fn report_violation(&mut self, violation: Violation) {
        let bit = 1 << violation as u8;
        if self.violations_queued & bit == 0 {
            self.violations_queued |= bit;
            self.events.push_back(Event::SecurityViolation(violation));
        }
    }

    /// A short-header datagram arrived for this connection from `remote` to our `local`
    /// address (if known), with the ECN codepoint of its IP header. `data` is decrypted in
    /// place.
    pub(crate) fn handle_short(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        local: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        data: &mut [u8],
    ) {
        self.stats.datagrams_received += 1;
        self.stats.bytes_received += data.len() as u64;
        if let State::Handshake(hs) = &mut self.state {
            // A client without keys yet: a server's handshake probe train that overtook its
            // response (§11.10) is kept to be opened and timed after it; a few datagrams of at
            // most the size we accept.
            if self.side == Side::Client
                && remote == self.paths[0].remote
                && hs.early_packets.len() < super::handshake::MAX_EARLY_PACKETS
                && data.len() <= usize::from(self.config.max_recv_datagram_size)
            {
                hs.early_packets.push(super::handshake::EarlyPacket {
                    arrived: now,
                    remote,
                    local,
                    ecn,
                    data: data.to_vec(),
                });
            }
            return;
        }
        self.open_short(now, now, remote, local, ecn, data);
    }

    /// Opens and handles a short-header datagram, counted already (see `handle_short`), that
    /// arrived at `arrived` (earlier than `now` for one kept until the keys existed: probe
    /// trains are timed by it).
    pub(crate) fn open_short(
        &mut self,
        now: Instant,
        arrived: Instant,
        remote: SocketAddr,
        local: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        data: &mut [u8],
    ) {
        let datagram_len = data.len() as u64;
        if matches!(self.state, State::Drained) {
            return;
        }
        if self.keys.is_none() {
            return;
        }
        let Ok((header, header_len)) = wire::ShortHeader::decode(data, self.local_cid.len()) else {
            // A stateless reset need not parse as a header: its bytes are random.
            if self.is_stateless_reset(data) {
                self.enter_drained(ConnectionError::Reset);
            }
            return;
        };
        let known = self.path_index(u32::from(header.path_id));
        let largest = known.and_then(|i| self.paths[i].acks.largest.map(|(pn, _)| pn));
        let pn = wire::decode_pn(largest.unwrap_or(0), header.truncated_pn, header.pn_len);
        if known.is_some_and(|i| !self.paths[i].replay.is_fresh(pn)) {
            self.stats.replays += 1;
            self.report_violation(Violation::Replay);
            return;
        }
        // Associated data: the header with the router-writable feedback rate zeroed.
        let mut aad = [0u8; wire::MAX_SHORT_HEADER_LEN];
        aad[..header_len].copy_from_slice(&data[..header_len]);
        if let Some(offset) = header.feedback_rate_offset() {
            aad[offset..offset + 4].fill(0);
        }
        // A previous receive key is kept for 3 PTO after an update, for packets the update
        // overtook (§6.4); only a packet with the other key phase may cause one.
        let rotates = self.keys.as_ref().map(|k| k.recv_phase()) != Some(header.key_phase);
        let keep = if rotates {
            3 * self.pto()
        } else {
            Duration::ZERO
        };
        let (_, body) = data.split_at_mut(header_len);
        let Some(keys) = self.keys.as_mut() else {
            return;
        };
        let opened = keys.open(
            now,
            keep,
            u32::from(header.path_id),
            pn,
            header.key_phase,
            &aad[..header_len],
            body,
        );
        let len = match opened {
            Ok((len, opened)) => {
                self.on_opened(now, opened);
                len
            }
            Err(OpenFailure::UnknownPhase) => {
                self.stats.unknown_phase_dropped += 1;
                return;
            }
            Err(OpenFailure::Authentication) => {
                if self.is_stateless_reset(data) {
                    self.enter_drained(ConnectionError::Reset);
                    return;
                }
                self.stats.auth_failures += 1;
                self.report_violation(Violation::Authentication);
                if self.keys.as_mut().is_some_and(|k| k.on_auth_failure()) {
                    self.fail_aead_limit(
                        now,
                        "integrity limit: too many packets failed authentication",
                    );
                }
                return;
            }
        };
        let (_, body) = data.split_at_mut(header_len);
        let handshake_address = self.paths[0].remote;
        let newest = largest.is_none_or(|l| pn > l);
        let Some(index) =
            self.path_for_packet(now, u32::from(header.path_id), remote, local, newest)
        else {
            return;
        };
        let path = &mut self.paths[index];
        path.replay.insert(pn);
        if let Some(area) = header.rate {
            // Authenticated (the expected rate by the tag; the feedback is the routers').
            path.rate.on_area(area);
        }
        path.bytes_received += datagram_len;
        let path_id = path.id;
        self.qlog(now, |_| crate::qlog::QlogEvent::PacketReceived {
            path: path_id,
            packet_number: pn,
            size: datagram_len as usize,
        });
        // Every authenticated packet keeps the connection alive. On the first path during
        // the handshake it also proves the client's address (only the holder of the keys,
        // which came back to that address, could send it) — if it came from that address: a
        // copy sent from elsewhere proves nothing. Any other path is validated by a challenge.
        self.restart_idle_timer(now);
        if index == 0 && self.side == Side::Server && !self.confirmed && remote == handshake_address
        {
            if pn == 0 {
                self.on_response_answered(now);
            }
            self.on_address_validated();
        }
        if self.side == Side::Server && self.announce.is_unproven() {
            // Only the client that wrote the first flight has these keys: it is live, not a
            // replay. Its held early data goes first, before this packet's frames.
            self.on_client_proven(now);
        }
        if self.side == Side::Client && !self.confirmed {
            // XX: the server could only protect this after reading our msg3.
            self.confirmed = true;
            self.flight = None;
        }
        match &self.state {
            State::Closing { .. } => {
                // The peer's close answers ours: both ends are closed.
                if self.payload_has_close(&body[..len]) {
                    self.state = State::Drained;
                } else if let State::Closing { resends, deadline } = self.state {
                    if resends < 3 {
                        self.state = State::Closing {
                            deadline,
                            resends: resends + 1,
                        };
                        self.close_resend = true;
                    }
                }
                return;
            }
            State::Draining { .. } | State::Drained => return,
            _ => {}
        }
        self.probe_seen = None;
        let ack_eliciting = match self.process_frames(now, index, &body[..len]) {
            Ok(eliciting) => eliciting,
            Err((code, reason)) => {
                self.fail(now, code, reason);
                return;
            }
        };
        // Packet-pair fast start (F11): a train's packets are timed as they are handled; any
        // other packet on the path ends the train being recorded.
        if let Some(rx) = self.paths.get_mut(index).map(|p| &mut p.probe_rx) {
            match self.probe_seen.take() {
                Some((train, position, count)) => {
                    let size = u32::try_from(datagram_len).unwrap_or(u32::MAX);
                    rx.on_probe(arrived, train, position, count, size);
                }
                None => rx.on_other_packet(),
            }
        }
        let acks = &mut self.paths[index].acks;
        let freq = acks.threshold(self.config.ack_frequency);
        acks.on_packet(now, pn, ack_eliciting, ecn, freq, self.config.max_ack_delay);
        if ecn == Some(EcnCodepoint::Ce) {
            self.stats.ecn_ce_received += 1;
        }
    }

    /// Counts which key opened a packet; an update by the peer moved our send key too.
    fn on_opened(&mut self, now: Instant, opened: Opened) {
        match opened {
            Opened::Current => {}
            Opened::Previous => self.stats.previous_key_opened += 1,
            Opened::Rotated { peer_initiated } => {
                let Some(keys) = self.keys.as_ref() else {
                    return;
                };
                let (recv, send) = (keys.recv_generation(), keys.send_generation());
                self.on_key_updated(now, recv, false, !peer_initiated);
                if peer_initiated {
                    self.on_key_updated(now, send, true, false);
                }
            }
        }
    }

    /// Packets declared lost were acknowledged after all: free what they carried (a resend
    /// still queued is cancelled), count them, and undo the congestion response if every
    /// loss behind it was spurious.
    fn on_spurious(&mut self, index: usize, out: &mut Outcome) {
        if out.spurious.is_empty() {
            return;
        }
        // Packets rerouted off a silent or moved path were never judged lost.
        self.stats.spurious_losses += out.spurious.iter().filter(|l| !l.rerouted).count() as u64;
        for lost in std::mem::take(&mut out.spurious) {
            self.on_acked_frames(&lost.frames);
        }
        if out.undo {
            self.paths[index].cc.on_spurious_congestion_event();
        }
    }

    fn payload_has_close(&self, payload: &[u8]) -> bool {
        wire::FrameIter::new(payload).any(|f| matches!(f, Ok(Frame::Close { .. })))
    }

    fn is_stateless_reset(&self, data: &[u8]) -> bool {
        let Some(token) = self.peer_reset_token else {
            return false;
        };
        wire::is_stateless_reset(data, &token)
    }

    /// Processes the frames of one packet that arrived on path `index`; returns whether it
    /// was ack-eliciting.
    /// The largest message we accept: what we advertised (docs/PROTOCOL.md §8).
    pub(crate) fn max_message_in(&self) -> u64 {
        self.config
            .max_message_size
            .min(self.config.flows.connection_window)
    }

    pub(crate) fn process_frames(
        &mut self,
        now: Instant,
        index: usize,
        payload: &[u8],
    ) -> Result<bool, FrameError> {
        let mut ack_eliciting = false;
        let (mut ack_request, mut app_data, mut message) = (false, false, false);
        for frame in wire::FrameIter::new(payload) {
            let frame =
                frame.map_err(|_| (TransportErrorCode::FRAME_ENCODING_ERROR, "malformed frame"))?;
            ack_eliciting |= frame.is_ack_eliciting();
            match frame {
                Frame::AckRequest => ack_request = true,
                Frame::Message(_) => (app_data, message) = (true, true),
                Frame::Flow(_) | Frame::Datagram { .. } => app_data = true,
                _ => {}
            }
            // Any frame about a flow the peer has not used yet opens it (and the lower-numbered
            // ones): Flow data, but also a ResetFlow or StopSending that arrives first.
            // The announcement goes before the frame's own events (FlowReadable, …).
            let waiting = [self.flows.incoming[0].len(), self.flows.incoming[1].len()];
            let first_event = self.events.len();
            self.process_frame(now, index, frame)?;
            for d in [Dir::Uni, Dir::Bi] {
                let i = FlowSet::dir_index(d);
                if self.flows.incoming[i].len() > waiting[i] {
                    let at = first_event.min(self.events.len());
                    self.events.insert(at, Event::FlowOpened { dir: d });
                }
            }
            if self.is_closed() {
                break;
            }
        }
        if ack_request {
            let max_delay = self.config.max_ack_delay;
            if let Some(path) = self.paths.get_mut(index) {
                path.acks.on_ack_request(now, app_data, message, max_delay);
            }
        }
        Ok(ack_eliciting)
    }

    fn process_frame(
        &mut self,
        now: Instant,
        arrived_on: usize,
        frame: Frame<'_>,
    ) -> Result<(), FrameError> {
        match frame {
            Frame::Padding { .. } | Frame::Ping => {}
            Frame::Ack(ack) => {
                let (path_id, largest, ack_delay_us) =
                    (ack.path_id, ack.largest(), ack.ack_delay_us);
                let index = self.path_index(path_id).ok_or((
                    TransportErrorCode::PROTOCOL_VIOLATION,
                    "ACK for unknown path",
                ))?;
                let exponent_delay = Duration::from_micros(ack_delay_us);
                let mut out = Outcome::default();
                // A reported delay counts up to the peer's own max_ack_delay (RFC 9002 §5.3),
                // not a fixed 25 ms: the same bound the probe timeout adds.
                let max_ack_delay = self.peer_max_ack_delay();
                let path = &mut self.paths[index];
                path.rtt.set_max_ack_delay(max_ack_delay);
                path.sent
                    .on_ack(
                        now,
                        ack.ranges.iter(),
                        largest,
                        exponent_delay,
                        &mut path.rtt,
                        &mut out,
                    )
                    .map_err(|r| (TransportErrorCode::PROTOCOL_VIOLATION, r))?;
                path.sent.detect_lost(now, &path.rtt, &mut out);
                let marked = out.acked.iter().filter(|(_, p)| p.ecn).count() as u64;
                if let EcnVerdict::Congestion(ce) = path.ecn.on_ack(marked, ack.ecn) {
                    if let Some(sent) = out.acked.iter().map(|(_, p)| p.time).max() {
                        path.cc.on_ecn_ce(now, sent, ce, &path.rtt);
                    }
                }
                // A late ACK of packets taken off the path (declared lost, or rerouted when it
                // went silent) shows it delivers as well as a timely one.
                if !out.acked.is_empty() || !out.spurious.is_empty() {
                    self.on_path_answered(now, index);
                }
                let newest = out.acked.iter().map(|(pn, _)| *pn).max();
                if let (Some(keys), Some(pn)) = (self.keys.as_mut(), newest) {
                    // It may be a packet sealed with our send key: then updates may go on.
                    keys.on_acked(path_id, pn);
                }
                self.on_spurious(index, &mut out);
                self.on_acked(now, index, out.acked);
                self.on_lost(now, index, out.lost, PeerReport::Ack(ack.ranges));
                self.update_target_rate(now);
            }
            Frame::Nack(nack) => {
                let index = self.path_index(nack.path_id).ok_or((
                    TransportErrorCode::PROTOCOL_VIOLATION,
                    "NACK for unknown path",
                ))?;
                self.stats.nacks_received += 1;
                let mut out = Outcome::default();
                self.paths[index]
                    .sent
                    .on_nack(nack.missing.iter(), &mut out);
                self.on_lost(now, index, out.lost, PeerReport::Nack(nack.missing));
            }
            // Answered in `process_frames`, which knows whether the packet carried data.
            Frame::AckRequest => {}
            Frame::AckFrequency {
                path_id,
                sequence,
                threshold,
            } => {
                let index = self.path_index(path_id).ok_or((
                    TransportErrorCode::PROTOCOL_VIOLATION,
                    "ACK_FREQUENCY for unknown path",
                ))?;
                self.paths[index].acks.on_ack_frequency(sequence, threshold);
            }
            Frame::Flow(f) => self.on_flow_data(wire_flow(f.flow_id), f.offset, f.data, f.fin)?,
            Frame::ResetFlow {
                flow_id,
                error_code,
                final_size,
            } => {
                let id = wire_flow(flow_id);
                let state = self.flows.get_or_open_remote(id, true).map_err(flow_err)?;
                if let Some(recv) = state.and_then(|s| s.recv.as_mut()) {
                    if recv.final_size.is_some_and(|s| s != final_size) || recv.highest > final_size
                    {
                        return Err((TransportErrorCode::FINAL_SIZE_ERROR, "reset size"));
                    }
                    if final_size > recv.max_data {
                        return Err((
                            TransportErrorCode::FLOW_CONTROL_ERROR,
                            "reset beyond flow credit",
                        ));
                    }
                    if recv.reset.is_none() {
                        let grown = final_size.saturating_sub(recv.highest);
                        recv.highest = final_size;
                        recv.final_size = Some(final_size);
                        recv.reset = Some(error_code);
                        // Nobody reads a reset flow (reads report the reset): what it holds
                        // is dropped now and its connection credit, up to the final size,
                        // given back, or every reset would shrink the window for good.
                        let unread = recv.discard();
                        let stopped = recv.stop.is_some();
                        self.flows.data_received += grown;
                        if self.flows.data_received > self.flows.local_max_data {
                            return Err((
                                TransportErrorCode::FLOW_CONTROL_ERROR,
                                "reset beyond connection credit",
                            ));
                        }
                        self.flows.on_consumed(unread);
                        if stopped {
                            // A stopped flow is not read again (a reset one otherwise is, to
                            // learn its code): drop it now.
                            self.flows.reap(id);
                        } else {
                            self.events.push_back(Event::FlowReadable(id));
                        }
                    }
                }
            }
            Frame::StopSending {
                flow_id,
                error_code,
            } => {
                let id = wire_flow(flow_id);
                let state = self.flows.get_or_open_remote(id, false).map_err(flow_err)?;
                if let Some(send) = state.and_then(|s| s.send.as_mut()) {
                    if send.stop_requested.is_none() {
                        send.stop_requested = Some(error_code);
                        self.flows.reset_send(id, error_code);
                        self.flows.mark_ready(id);
                        self.events.push_back(Event::FlowStopped {
                            id,
                            code: error_code,
                        });
                    }
                }
            }
            Frame::MaxData { max } => {
                self.flows.peer_max_data = self.flows.peer_max_data.max(max);
            }
            Frame::MaxFlowData { flow_id, max } => {
                let id = wire_flow(flow_id);
                let state = self.flows.get_or_open_remote(id, false).map_err(flow_err)?;
                if let Some(send) = state.and_then(|s| s.send.as_mut()) {
                    if max > send.max_data {
                        send.max_data = max;
                        if send.has_pending() {
                            self.flows.mark_ready(id);
                        }
                    }
                }
            }
            Frame::MaxFlows { bidi, max } => {
                let d = FlowSet::dir_index(if bidi { Dir::Bi } else { Dir::Uni });
                if max > self.flows.peer_max[d] {
                    self.flows.peer_max[d] = max;
                    self.events.push_back(Event::FlowsAvailable(if bidi {
                        Dir::Bi
                    } else {
                        Dir::Uni
                    }));
                }
            }
            Frame::DataBlocked { .. } | Frame::FlowDataBlocked { .. } => {}
            Frame::PathChallenge { data } => {
                // Answered on the path it came on, which is what it tests. A few pending
                // answers are enough; a flood of challenges gets no more.
                let responses = &mut self.paths[arrived_on].responses;
                if responses.len() < 4 {
                    responses.push_back(data);
                }
            }
            Frame::PathResponse { data } => self.on_path_response(now, data),
            // Only servers advertise; a client's addresses are learned from its paths.
            Frame::AddAddress { seq, addr } if self.side == Side::Client => {
                self.on_add_address(now, seq, addr);
            }
            Frame::RemoveAddress { seq } if self.side == Side::Client => {
                self.on_remove_address(now, seq);
            }
            Frame::PathStatus {
                path_id,
                sequence,
                status,
            } => self.on_path_status(now, path_id, sequence, status),
            Frame::Close {
                application,
                error_code,
                reason,
                ..
            } => {
                let reason = String::from_utf8_lossy(reason).into_owned();
                let error = if application {
                    ConnectionError::ApplicationClosed {
                        code: error_code,
                        reason,
                    }
                } else {
                    ConnectionError::TransportError {
                        code: TransportErrorCode::from(error_code),
                        reason,
                    }
                };
                self.set_error(error);
                // Answer once (SLTP END/END), then wait out stragglers briefly.
                self.close = Some(super::PendingClose {
                    application: false,
                    code: 0,
                    reason: bytes::Bytes::new(),
                });
                self.close_resend = true;
                self.state = State::Draining {
                    deadline: now + self.pto(),
                };
            }
            Frame::HandshakeDone => {
                if self.side == Side::Server {
                    return Err((
                        TransportErrorCode::PROTOCOL_VIOLATION,
                        "HANDSHAKE_DONE from a client",
                    ));
                }
                self.confirmed = true;
                self.flight = None;
            }
            Frame::Message(m) => self.on_message_fragment(now, arrived_on, m)?,
            Frame::MessageSkip { msg_id, credit } => {
                // The credit is what the sender counted for the message: at most one
                // message's cost, and within the window we gave (§9.18, §10.2). Unchecked, it
                // would grant the peer credit it never had (we release what it counts).
                if credit > crate::message::credit_cost(self.max_message_in()) {
                    return Err((
                        TransportErrorCode::FLOW_CONTROL_ERROR,
                        "message skip counts more than a message",
                    ));
                }
                let id = crate::message::MessageId(msg_id);
                let ranges_before = self.messages_in.ranges();
                let ready_before = self.messages_in.ready.len();
                if let Some(s) = self.messages_in.on_skip(id, credit) {
                    if self.flows.data_received.saturating_add(s.counted)
                        > self.flows.local_max_data
                    {
                        return Err((
                            TransportErrorCode::FLOW_CONTROL_ERROR,
                            "message skip beyond credit",
                        ));
                    }
                    self.on_message_skipped(s);
                    self.on_messages_ready(now, ready_before);
                }
                if self.messages_in.ranges() > ranges_before {
                    self.check_recv_ranges()?;
                }
            }
            Frame::Datagram { data } => {
                if data.len() as u64 > self.config.max_datagram_size_in {
                    return Err((
                        TransportErrorCode::PROTOCOL_VIOLATION,
                        "datagram not accepted",
                    ));
                }
                self.queue_datagram(data);
            }
            Frame::WindowClose {
                reason_code,
                reason,
            } if !self.window.peer_closed => {
                self.window.peer_closed = true;
                self.window.status_step = 0;
                let wait = self.paths[self.primary()]
                    .rtt
                    .smoothed()
                    .max(Duration::from_millis(50));
                self.window.status_at = Some(now + wait);
                self.events.push_back(Event::WindowClosed {
                    local: false,
                    code: reason_code,
                    reason: String::from_utf8_lossy(reason).into_owned(),
                });
            }
            Frame::WindowOpen if self.window.peer_closed => {
                self.window.peer_closed = false;
                self.window.status_at = None;
                self.window.status_pending = false;
                self.events.push_back(Event::WindowOpened { local: false });
            }
            Frame::WindowStatus => {
                // The peer asks whether our window is still closed: say it again.
                self.window.update_pending = true;
            }
            Frame::Probe {
                train,
                index,
                count,
            } => self.probe_seen = Some((train, index, count)),
            Frame::ProbeReport {
                path_id,
                train,
                received,
                rate,
            } => self.on_probe_report(now, path_id, train, received, rate),
            Frame::RateEcho {
                path_id,
                feedback_kbps,
            } => self.on_rate_echo(now, path_id, feedback_kbps),
            // Codec-only frames of features not built yet (F18, connection ID rotation) are
            // accepted and ignored, so a newer peer does not break an older one.
            _ => {}
        }
        Ok(())
    }

    /// Keeps a received datagram for the application within `datagram_queue` datagrams and
    /// `datagram_queue_bytes` bytes. When full, the oldest go: datagrams carry what is
    /// worth sending unreliably, whose value fades with age (media, state updates), so an
    /// application catching up wants the newest (quinn does the same). One larger than the
    /// whole byte bound is dropped itself.
    fn queue_datagram(&mut self, data: &[u8]) {
        let len = data.len() as u64;
        let max_bytes = self.config.datagram_queue_bytes;
        let max_count = self.config.datagram_queue;
        if len > max_bytes || max_count == 0 {
            self.stats.datagrams_dropped += 1;
            self.stats.datagrams_recv_dropped += 1;
            return;
        }
        while self.datagrams_in.len() >= max_count || self.datagrams_in_bytes + len > max_bytes {
            let Some(old) = self.datagrams_in.pop_front() else {
                break;
            };
            self.datagrams_in_bytes -= old.len() as u64;
            self.stats.datagrams_dropped += 1;
            self.stats.datagrams_recv_dropped += 1;
        }
        self.datagrams_in
            .push_back(bytes::Bytes::copy_from_slice(data));
        self.datagrams_in_bytes += len;
        self.events.push_back(Event::DatagramReceived);
    }

    /// Fails when the peer made us hold more disjoint ranges of received data than
    /// `max_recv_ranges` (see there: bytes are bounded by credit, per-range overhead by this).
    fn check_recv_ranges(&self) -> Result<(), FrameError> {
        let held = self.flows.recv_ranges() + self.messages_in.ranges();
        if held > self.config.max_recv_ranges {
            return Err((
                TransportErrorCode::PROTOCOL_VIOLATION,
                "too many out-of-order fragments",
            ));
        }
        Ok(())
    }

    /// The peer measured one of our probe trains (F11): hand the rate, bounded, to the path's
    /// controller. Reports on a train we no longer wait for (a resent report, an old train),
    /// on unknown paths, or without an estimate change nothing.
    fn on_probe_report(&mut self, now: Instant, path_id: u32, train: u64, received: u8, rate: u64) {
        let Some(index) = self.path_index(path_id) else {
            return;
        };
        let path = &mut self.paths[index];
        if !path.probe_tx.take_report(train) {
            return;
        }
        if rate == 0 {
            // No estimate: a train sent with the handshake's response leaves the path's first
            // train to come with its first data.
            path.probe_tx.no_estimate();
            return;
        }
        path.probe_tx.during_handshake = false;
        // Bound (PROTOCOL.md §11.10): once the path has left its first slow start, its
        // delivery rate is about window / smoothed RTT; a train may show at most 4× that (the
        // link may have grown idle, not quadrupled).
        let mut rate = rate;
        // (A loss-based controller has left it once it has a slow-start threshold; BBR, Copa
        // and UDT keep none, and say whether they are in it.)
        let m = path.cc.metrics();
        if (m.ssthresh.is_some() || !m.in_slow_start) && path.rtt.has_sample() {
            let nanos = path.rtt.smoothed().as_nanos().max(1);
            let delivery = u128::from(path.cc.window()) * 1_000_000_000 / nanos;
            let cap = u64::try_from(delivery.saturating_mul(4)).unwrap_or(u64::MAX);
            rate = rate.min(cap.max(1));
        }
        tracing::debug!(
            path = path_id,
            train,
            received,
            rate,
            "probe train estimate"
        );
        path.cc.on_rate_estimate(now, rate, &path.rtt);
        path.probe_tx.estimate = Some((rate, now));
        self.stats.rate_estimates += 1;
        self.events.push_back(Event::RateEstimate {
            path: path_id,
            bytes_per_second: rate,
        });
    }

    fn on_message_fragment(
        &mut self,
        now: Instant,
        arrived_on: usize,
        m: wire::MessageFrame<'_>,
    ) -> Result<(), FrameError> {
        if m.ordered != crate::message::MessageId(m.msg_id).is_ordered() {
            return Err((
                TransportErrorCode::PROTOCOL_VIOLATION,
                "message ordered flag contradicts its ID",
            ));
        }
        // The receiver's deadline: the time left when the fragment was sent, less the
        // one-way trip it has made (estimated as half the smoothed RTT). It errs early,
        // never late, on symmetric paths.
        let one_way = self.paths[arrived_on].rtt.smoothed() / 2;
        let deadline = m.deadline_us.map(|us| {
            (now + Duration::from_micros(us))
                .checked_sub(one_way)
                .unwrap_or(now)
        });
        // Credit is checked before the fragment is taken: the receiver reserves a new
        // message's whole size. (A message over the size limit is refused as such below.)
        let counting = self
            .messages_in
            .would_count(crate::message::MessageId(m.msg_id), m.total_len);
        if m.total_len <= self.max_message_in()
            && self.flows.data_received.saturating_add(counting) > self.flows.local_max_data
        {
            return Err((
                TransportErrorCode::FLOW_CONTROL_ERROR,
                "message data beyond credit",
            ));
        }
        let ranges_before = self.messages_in.ranges();
        let ready_before = self.messages_in.ready.len();
        let new = self
            .messages_in
            .on_fragment(
                crate::message::MessageId(m.msg_id),
                m.total_len,
                m.offset,
                m.data,
                deadline,
                m.reply_to.map(crate::message::MessageId),
                m.priority,
                self.max_message_in(),
            )
            .map_err(|e| match e {
                crate::message::recv::MessageRecvError::TooLarge => (
                    TransportErrorCode::MESSAGE_TOO_LARGE,
                    "message larger than allowed",
                ),
                crate::message::recv::MessageRecvError::Inconsistent => (
                    TransportErrorCode::PROTOCOL_VIOLATION,
                    "message fragments disagree on its size",
                ),
            })?;
        debug_assert_eq!(new, counting, "on_fragment counts what would_count said");
        self.flows.data_received += new;
        if self.messages_in.ranges() > ranges_before {
            self.check_recv_ranges()?;
        }
        self.on_messages_ready(now, ready_before);
        Ok(())
    }

    fn on_flow_data(
        &mut self,
        id: crate::flow::FlowId,
        offset: u64,
        data: &[u8],
        fin: bool,
    ) -> Result<(), FrameError> {
        let state = self.flows.get_or_open_remote(id, true).map_err(flow_err)?;
        let Some(recv) = state.and_then(|s| s.recv.as_mut()) else {
            return Ok(());
        };
        let was_readable = recv.readable() > 0 || recv.is_finished();
        let ranges_before = recv.ranges();
        let grown = recv.insert(offset, data, fin).map_err(|e| match e {
            RecvError::FlowControl => (
                TransportErrorCode::FLOW_CONTROL_ERROR,
                "flow data beyond credit",
            ),
            RecvError::FinalSize => (
                TransportErrorCode::FINAL_SIZE_ERROR,
                "data beyond final size",
            ),
        })?;
        let readable = recv.readable() > 0 || recv.final_size == Some(recv.read);
        let stopped = recv.stop.is_some();
        let new_range = recv.ranges() > ranges_before;
        self.flows.data_received += grown;
        if self.flows.data_received > self.flows.local_max_data {
            return Err((
                TransportErrorCode::FLOW_CONTROL_ERROR,
                "connection data beyond credit",
            ));
        }
        if stopped {
            // Nobody reads a stopped flow: what arrives is consumed at once (after the credit
            // check: consuming may raise the limit).
            self.flows.on_consumed(grown);
        }
        if new_range {
            self.check_recv_ranges()?;
        }
        if readable && !was_readable {
            self.events.push_back(Event::FlowReadable(id));
        }
        if stopped {
            // Once its final size is known a stopped flow is dropped (if its other half is
            // done), so that the peer may open another.
            self.flows.reap(id);
        }
        Ok(())
    }
}

fn wire_flow(id: u64) -> crate::flow::FlowId {
    crate::flow::FlowId(id)
}

fn flow_err(e: FlowError) -> FrameError {
    match e {
        FlowError::Limit => (TransportErrorCode::FLOW_LIMIT_ERROR, "too many flows"),
        FlowError::State => (
            TransportErrorCode::FLOW_STATE_ERROR,
            "frame not allowed on this flow",
        ),
    }
}
