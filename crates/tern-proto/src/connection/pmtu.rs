//! Path MTU discovery, the connection's side (PROTOCOL.md §5.5): sending probes and applying
//! what the path's `Pmtud` (`path/pmtu.rs`) concludes from acknowledgements and losses.

use std::time::Instant;

use super::{Connection, State};
use crate::crypto::TAG_LEN;
use crate::event::Event;
use crate::path::pmtu::{Pmtud, BASE_PLPMTU};
use crate::recovery::{SentFrame, SentPacket};
use crate::wire::{self, Frame};

impl Connection {
    /// Sets up discovery on path `index`, starting from `mtu` (the negotiated size), up to
    /// the configured `max_pmtu` and the peer's `max_datagram_size`.
    pub(crate) fn init_pmtu(&mut self, index: usize, mtu: u16) {
        let peer = self.peer_params.as_ref().map_or(u16::MAX, |p| {
            p.max_datagram_size.min(u64::from(u16::MAX)) as u16
        });
        let max = self.config.max_pmtu.min(peer);
        self.paths[index].pmtu = Pmtud::new(
            self.config.pmtu_discovery,
            mtu,
            max,
            self.config.pmtu_research_interval,
        );
    }

    /// Writes a PMTU probe into `buf` for the first path that owes one: a Ping, an
    /// AckRequest and padding up to the probe size. It is ack-eliciting but not in flight
    /// (the congestion window does not hold it back beyond the one probe a path may have out,
    /// and its loss is no congestion signal), and nothing in it is ever resent. Returns the
    /// path index and the datagram size.
    pub(super) fn build_pmtu_probe(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
    ) -> Option<(usize, usize)> {
        if !self.confirmed || !matches!(self.state, State::Established) || self.close.is_some() {
            return None;
        }
        use crate::path::PathState;
        let active = self
            .paths
            .iter()
            .any(|p| p.usable() && p.state == PathState::Active);
        let mut due = None;
        for (i, p) in self.paths.iter_mut().enumerate() {
            // A path owing probe-timeout probes sends those first. A path that has carried no
            // data is not searched, nor one kept in standby while another is active (a
            // reserve, perhaps metered, is not spent on probes; it searches once it takes
            // over).
            let reserve = p.state == PathState::Standby && active;
            if !p.usable() || p.probes > 0 || !p.carried_data || reserve {
                continue;
            }
            if let Some(size) = p.pmtu.poll_probe(now) {
                due = Some((i, size));
                break;
            }
        }
        let (index, size) = due?;
        let rate = self.rate_area(index);
        let key_phase = self.keys.as_ref().is_some_and(|k| k.send_phase());
        let path = &mut self.paths[index];
        let path_id = path.id;
        let start = buf.len();
        let pn = path.sent.take_pn();
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
        Frame::Ping.encode(buf);
        Frame::AckRequest.encode(buf);
        // Padding frames (0x00) up to the probe size.
        buf.resize(start + usize::from(size) - TAG_LEN, 0);
        let sealed = self.keys.as_mut().and_then(|keys| {
            let (head, body) = buf[start..].split_at_mut(header_len);
            let mut scratch = [0u8; wire::MAX_SHORT_HEADER_LEN];
            let aad = wire::short_header_aad(head, header.feedback_rate_offset(), &mut scratch);
            keys.seal_in_place(path_id, pn, aad, body)
        });
        let path = &mut self.paths[index];
        let Some(tag) = sealed else {
            path.sent.next_pn -= 1;
            buf.truncate(start);
            return None;
        };
        buf.extend_from_slice(&tag);
        let len = buf.len() - start;
        path.sent.on_sent(
            pn,
            SentPacket {
                time: now,
                size: len as u16,
                ack_eliciting: true,
                in_flight: false,
                app_limited: true,
                ecn: false,
                copy: false,
                overtaken: None,
                frames: std::iter::once(SentFrame::PmtuProbe(size)).collect(),
            },
        );
        path.pmtu.on_probe_sent(pn, size);
        self.stats.pmtu_probes_sent += 1;
        tracing::trace!(path = path_id, size, "PMTU probe");
        Some((index, len))
    }

    /// Acknowledged packets of path `index`: a probe raises the path's datagram size; every
    /// packet's size feeds black-hole detection.
    pub(crate) fn pmtu_on_acked(&mut self, index: usize, acked: &[(u64, SentPacket)]) {
        for (pn, p) in acked {
            let path = &mut self.paths[index];
            match p.frames.first() {
                Some(&SentFrame::PmtuProbe(size)) => {
                    if let Some(mtu) = path.pmtu.on_probe_acked(*pn, size) {
                        self.set_path_mtu(index, mtu);
                    }
                }
                _ => path.pmtu.on_packet_acked(p.size, p.time),
            }
        }
        // A small packet got through after full-size ones were lost (a path that went silent
        // and answers its Pings again, see `pmtu_on_abandoned`).
        self.check_black_hole(index);
    }

    /// Packets taken off path `index` because it went silent (their data moves to other
    /// paths): full-size ones count as lost for black-hole detection, so that a path whose
    /// MTU shrank does not come back at its old size after its Pings are answered.
    pub(crate) fn pmtu_on_abandoned(&mut self, index: usize, moved: &[(u64, SentPacket)]) {
        let pmtu = &mut self.paths[index].pmtu;
        for (_, p) in moved {
            if p.in_flight && !matches!(p.frames.first(), Some(SentFrame::PmtuProbe(_))) {
                pmtu.on_packet_lost(p.size, p.time);
            }
        }
    }

    fn check_black_hole(&mut self, index: usize) {
        let path = &mut self.paths[index];
        if path.pmtu.black_hole() {
            let id = path.id;
            let mtu = path.pmtu.fall_back();
            self.stats.pmtu_black_holes += 1;
            tracing::debug!(path = id, "PMTU black hole: back to {BASE_PLPMTU}");
            self.set_path_mtu(index, mtu);
        }
    }

    /// Lost packets of path `index`: takes the probes out (counted, never resent, never
    /// congestion) and returns the rest; falls back to the base size on a black hole.
    pub(crate) fn pmtu_on_lost(
        &mut self,
        index: usize,
        lost: Vec<(u64, SentPacket)>,
    ) -> Vec<(u64, SentPacket)> {
        let path = &mut self.paths[index];
        if matches!(path.pmtu.state, crate::path::pmtu::PmtuState::Disabled)
            && !lost
                .iter()
                .any(|(_, p)| matches!(p.frames.first(), Some(SentFrame::PmtuProbe(_))))
        {
            return lost;
        }
        let mut rest = Vec::with_capacity(lost.len());
        for (pn, p) in lost {
            if let Some(&SentFrame::PmtuProbe(size)) = p.frames.first() {
                path.pmtu.on_probe_lost(pn, size);
                self.stats.pmtu_probes_lost += 1;
            } else {
                if p.in_flight {
                    path.pmtu.on_packet_lost(p.size, p.time);
                }
                rest.push((pn, p));
            }
        }
        self.check_black_hole(index);
        rest
    }

    /// A probe timeout on path `index` with nothing but PMTU probes outstanding: they are
    /// lost (a probe needs no probe timeout, and must not make the path look silent).
    /// Returns whether that was the case.
    pub(crate) fn pmtu_probe_timeout(&mut self, index: usize) -> bool {
        let probes = self.paths[index].sent.take_if_only_pmtu_probes();
        if probes.is_empty() {
            return false;
        }
        let rest = self.pmtu_on_lost(index, probes);
        debug_assert!(rest.is_empty());
        true
    }

    fn set_path_mtu(&mut self, index: usize, mtu: u16) {
        let path = &mut self.paths[index];
        if path.mtu == mtu {
            return;
        }
        path.mtu = mtu;
        path.cc.on_mtu_update(mtu);
        let id = path.id;
        tracing::debug!(path = id, mtu, "path MTU");
        self.events
            .push_back(Event::PathMtuChanged { id, size: mtu });
    }
}
