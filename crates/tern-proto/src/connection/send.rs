//! Sending: choosing what goes in the next packet, protecting it, and handling what the peer
//! acknowledged or lost.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Connection, State};
use crate::crypto::TAG_LEN;
use crate::event::Event;
use crate::recovery::{EcnCodepoint, SentFrame, SentPacket};
use crate::wire::{self, Frame};

/// A datagram ready to send: its bytes are in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: SocketAddr,
    /// Bytes written to the buffer.
    pub size: usize,
    /// ECN codepoint for the IP header (`None`: Not-ECT).
    pub ecn: Option<EcnCodepoint>,
}

/// Flow frame overhead: type, flow ID, offset and length varints.
const FLOW_FRAME_OVERHEAD: usize = 1 + 8 + 8 + 4;

impl Connection {
    /// Writes the next datagram into `buf` (appending) and says where it goes, or returns
    /// `None` when nothing may be sent now (see `poll_timeout`).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let start = buf.len();
        if matches!(self.state, State::Drained) {
            return None;
        }
        if let Some(size) = self.poll_flight(now, buf) {
            return Some(self.sent_datagram(size, None));
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
                let (size, ecn) = self.build_packet(now, buf, true)?;
                debug_assert_eq!(buf.len() - start, size);
                return Some(self.sent_datagram(size, ecn));
            }
            State::Handshake(_) | State::Drained => return None,
            State::Established => {}
        }
        let (size, ecn) = self.build_packet(now, buf, false)?;
        Some(self.sent_datagram(size, ecn))
    }

    fn sent_datagram(&mut self, size: usize, ecn: Option<EcnCodepoint>) -> Transmit {
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += size as u64;
        self.paths[0].bytes_sent += size as u64;
        Transmit {
            destination: self.paths[0].remote,
            size,
            ecn,
        }
    }

    /// Builds one protected short-header packet; `close_only` sends just the Close frame.
    /// Returns its size and the ECN codepoint it leaves with.
    fn build_packet(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        close_only: bool,
    ) -> Option<(usize, Option<EcnCodepoint>)> {
        let mtu = usize::from(self.paths[0].mtu);
        let budget = self.paths[0].amplification_budget();
        if (budget as usize) < mtu.min(super::MIN_PACKET_BUDGET as usize) {
            return None;
        }
        let mtu = mtu.min(budget as usize);
        let wants_ack = self.paths[0].acks.wants_ack(now) || !self.paths[0].acks.nack.is_empty();
        let probing = self.probes > 0;
        let mut data_allowed = !close_only && self.has_sendable_data();
        if data_allowed && !probing {
            let path = &mut self.paths[0];
            // Congestion window, then pacing.
            if path.cwnd_room() < mtu as u64 {
                data_allowed = false;
            } else {
                let rate = path.cc.pacing_rate(&path.rtt);
                if let Some(at) = path.pacer.delay(
                    now,
                    mtu as u64,
                    path.cc.window(),
                    rate,
                    path.rtt.smoothed(),
                    path.mtu,
                ) {
                    if at > now {
                        path.pacing_until = Some(at);
                        data_allowed = false;
                    }
                }
            }
        }
        if !close_only && !wants_ack && !data_allowed {
            return None;
        }
        let start = buf.len();
        let path = &mut self.paths[0];
        let pn = path.sent.take_pn();
        let header =
            wire::ShortHeader::new(self.remote_cid, 0, false, pn, path.sent.largest_acked, None);
        header.encode(buf);
        let header_len = buf.len() - start;
        let max_payload = mtu - header_len - TAG_LEN;
        let payload_start = buf.len();
        let mut frames = crate::recovery::SentFrames::new();
        let mut ack_eliciting = false;

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
            if wants_ack || data_allowed {
                if let Some((floor, largest)) = self.write_ack(now, buf, max_payload) {
                    frames.push(SentFrame::Ack { floor, largest });
                }
            }
            if data_allowed {
                let limit = payload_start + max_payload;
                ack_eliciting |= self.write_control_frames(now, buf, limit, &mut frames);
                if self.data_allowed_by_window() {
                    ack_eliciting |= self.write_datagrams(buf, limit);
                    let before = frames.len();
                    self.write_message_frames(now, buf, limit, &mut frames);
                    let room = limit.saturating_sub(buf.len());
                    self.write_flow_frames(buf, room, &mut frames);
                    ack_eliciting |= frames.len() > before;
                }
                if self.ping_pending || (probing && !ack_eliciting) {
                    Frame::Ping.encode(buf);
                    self.ping_pending = false;
                    ack_eliciting = true;
                }
                if probing {
                    // A probe asks for an immediate answer (SLTP REPLY_REQ): each probe then
                    // gets its own ACK, which doubles the chances through a loss burst.
                    Frame::AckRequest.encode(buf);
                }
            }
        }
        let carries_ack = frames.iter().any(|f| matches!(f, SentFrame::Ack { .. }));
        if carries_ack && !ack_eliciting && self.wants_ack_of_ack(now) {
            // An ACK-only packet is never acknowledged, so a receiver that only receives
            // would repeat its old gaps forever: once per RTT, ask for an acknowledgement.
            Frame::Ping.encode(buf);
            ack_eliciting = true;
        }
        let app_limited = !self.has_sendable_data();
        if data_allowed
            && !probing
            && ack_eliciting
            && app_limited
            && self.paths[0].ack_request.threshold > 2
        {
            // The last packet before we fall silent: with a high AckFrequency threshold its
            // ACK would wait for max_ack_delay.
            Frame::AckRequest.encode(buf);
        }
        if buf.len() == payload_start {
            // Nothing to say after all: give the packet number back.
            self.paths[0].sent.next_pn -= 1;
            buf.truncate(start);
            return None;
        }
        // Short payloads are padded so that every packet is longer than a stateless reset.
        while buf.len() - payload_start < 4 {
            buf.push(0);
        }
        let keys = self.keys.as_ref()?;
        let (head, body) = buf[start..].split_at_mut(header_len);
        let tag = keys.0.seal_in_place(self.paths[0].id, pn, head, body)?;
        buf.extend_from_slice(&tag);
        let size = buf.len() - start;
        if self.probes > 0 && ack_eliciting {
            self.probes -= 1;
        }
        if !ack_eliciting && !close_only {
            self.stats.ack_only_sent += 1;
        }
        let path = &mut self.paths[0];
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
                overtaken: None,
                frames,
            },
        );
        Some((size, ecn))
    }

    /// Whether an ACK-only packet should carry a Ping: our ACKs repeat gaps the peer may
    /// already know of, and nothing ack-eliciting went out for a round trip.
    fn wants_ack_of_ack(&self, now: Instant) -> bool {
        let path = &self.paths[0];
        path.acks.received.len() > 1
            && path
                .sent
                .time_of_last_ack_eliciting
                .is_none_or(|t| now.saturating_duration_since(t) >= path.rtt.smoothed())
    }

    /// Writes the path's ACK (and NACK). Returns the numbers the ACK described completely,
    /// `(floor, largest)`: once the peer acknowledges this packet, it knows of them.
    fn write_ack(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        max_payload: usize,
    ) -> Option<(u64, u64)> {
        let acks = &mut self.paths[0].acks;
        let (_, received_at) = acks.largest?;
        if !acks.dirty && acks.nack.is_empty() {
            return None;
        }
        let delay = now.saturating_duration_since(received_at);
        let budget = max_payload / 2;
        let ecn = acks.ecn.any().then_some(acks.ecn);
        let plan = wire::encode_ack(
            0,
            delay.as_micros() as u64,
            acks.reported(),
            crate::recovery::MAX_ACK_RANGES,
            budget,
            ecn.as_ref(),
            buf,
        );
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
            wire::encode_nack(0, nack.iter().copied(), nack.len(), budget / 2, buf);
            self.stats.nacks_sent += 1;
        }
        acks.on_ack_sent();
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
            let base = self.paths[0].rtt.smoothed().max(Duration::from_millis(50));
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
        let request = &mut self.paths[0].ack_request;
        if request.pending && room(buf) {
            Frame::AckFrequency {
                path_id: 0,
                sequence: request.sequence,
                threshold: request.threshold,
            }
            .encode(buf);
            frames.push(SentFrame::AckFrequency);
            request.pending = false;
        }
        if self.handshake_done_pending && room(buf) {
            Frame::HandshakeDone.encode(buf);
            frames.push(SentFrame::HandshakeDone);
            self.handshake_done_pending = false;
        }
        while room(buf) {
            let Some(data) = self.path_responses.pop_front() else {
                break;
            };
            Frame::PathResponse { data }.encode(buf);
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
        while let Some(d) = self.datagrams_out.front() {
            if limit.saturating_sub(buf.len()) < d.len() + 4 {
                break;
            }
            Frame::Datagram { data: d }.encode(buf);
            self.datagrams_out.pop_front();
            wrote = true;
        }
        wrote
    }

    /// Message fragments, highest priority first.
    fn write_message_frames(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        limit: usize,
        frames: &mut crate::recovery::SentFrames,
    ) {
        // Frame overhead: type, ID, flags, priority, lengths, offset, deadline, reply-to.
        const OVERHEAD: usize = 1 + 8 + 2 + 8 + 8 + 8 + 8 + 4;
        // The path does not change while one packet is built.
        let path = self.paths[0].message_estimate();
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
        }
        self.report_hopeless_messages();
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
            if let Some(recv) = state.recv.as_mut() {
                if recv.stop_pending {
                    Frame::StopSending {
                        flow_id: id.0,
                        error_code: recv.stop.unwrap_or(0),
                    }
                    .encode(buf);
                    recv.stop_pending = false;
                    frames.push(SentFrame::StopSending(id));
                }
            }
            let mut more = false;
            if let Some(send) = state.send.as_mut() {
                if let Some(code) = send.reset.filter(|_| send.reset_pending) {
                    Frame::ResetFlow {
                        flow_id: id.0,
                        error_code: code,
                        final_size: send.unsent,
                    }
                    .encode(buf);
                    send.reset_pending = false;
                    frames.push(SentFrame::ResetFlow(id));
                } else {
                    let max = room.saturating_sub(FLOW_FRAME_OVERHEAD) as u64;
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
                        more = send.has_pending();
                    }
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
        self.probes = 0;
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
                let Some(send) = self.flows.flows.get_mut(&id).and_then(|s| s.send.as_mut()) else {
                    continue;
                };
                send.ack(offset, u64::from(len), fin);
                if send.is_done() {
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
                self.flows.reap(id);
            } else if let SentFrame::Message { id, offset, len } = *f {
                self.messages_out.on_acked(id, offset, u64::from(len));
            } else if let SentFrame::Ack { floor, largest } = *f {
                self.paths[0].acks.on_ack_acknowledged(floor, largest);
            }
        }
    }

    /// Packets lost: resend what they carried and tell the controller.
    pub(crate) fn on_lost(&mut self, now: Instant, path_id: usize, lost: Vec<(u64, SentPacket)>) {
        if lost.is_empty() {
            return;
        }
        self.stats.packets_lost += lost.len() as u64;
        let mut lost_bytes = 0;
        let mut newest = None;
        let (mut first_time, mut last_time) = (None::<Instant>, None::<Instant>);
        for (_, p) in &lost {
            if p.in_flight {
                lost_bytes += u64::from(p.size);
                newest = newest.max(Some(p.time));
                first_time = Some(first_time.map_or(p.time, |t| t.min(p.time)));
                last_time = Some(last_time.map_or(p.time, |t| t.max(p.time)));
            }
            self.requeue(&p.frames, false);
        }
        let path = &mut self.paths[path_id];
        let mut reduced = false;
        if let Some(newest) = newest {
            //= RFC 9002 §7.6.1: persistent congestion when the lost packets span more than
            //# (smoothed_rtt + max(4*rttvar, kGranularity) + max_ack_delay) *
            //# kPersistentCongestionThreshold, with an RTT sample taken before.
            let span = last_time
                .zip(first_time)
                .map(|(l, f)| l.saturating_duration_since(f))
                .unwrap_or_default();
            let persistent = path.rtt.has_sample() && span > path.rtt.pto_base() * 3;
            let before = path.cc.metrics().congestion_events;
            path.cc
                .on_congestion_event(now, newest, lost_bytes, persistent, &path.rtt);
            reduced = path.cc.metrics().congestion_events != before;
        }
        path.ecn
            .on_lost(lost.iter().filter(|(_, p)| p.ecn).count() as u64);
        path.sent.record_losses(now, &lost, reduced, &path.rtt);
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
                SentFrame::AckFrequency => self.paths[0].ack_request.pending = true,
                // The ACK state is current at every send; nothing to resend.
                SentFrame::Ack { .. } => {}
            }
        }
        let _ = probe;
    }
}
