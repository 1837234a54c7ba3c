//! Explicit rate on the connection (DESIGN.md F12, F13; docs/PROTOCOL.md §4.8, §9.27, §13):
//! the rate area on outgoing packets of paths whose controller asks for it, the lowest
//! feedback rate seen per path and its RateEcho, echoed rates handed to the controller, and
//! the target rate for the application's encoder.

use std::time::{Duration, Instant};

use super::Connection;
use crate::event::Event;
use crate::wire::{self, Frame, RateArea, NO_RATE_LIMIT};

/// The rate the application should produce data at (DESIGN.md F13), from
/// [`Connection::target_rate`] and [`Event::TargetRate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TargetRate {
    /// Application bytes per second, summed over the active paths, after packet overheads.
    pub bytes_per_second: u64,
    /// What set it.
    pub source: RateSource,
}

/// Where a [`TargetRate`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateSource {
    /// A tern router's explicit rate (F12) sets it on every path it covers.
    Router,
    /// The congestion controllers' own estimate sets it on at least one path (no router, or
    /// the sender's own bound is below the router's rate).
    Controller,
}

/// Bytes of frame headers assumed per packet when converting a path's rate into application
/// bytes: a Flow frame's type, flow ID, offset and length varints at typical sizes (1 + 2 + 4
/// + 2), plus room for an ACK or a RateEcho riding along.
pub(crate) const TARGET_FRAME_OVERHEAD: u64 = 16;

/// A new target rate is reported when it moved by more than this fraction of the last one
/// reported (1/10: an encoder need not re-tune for less).
const TARGET_CHANGE: (u64, u64) = (1, 10);

/// kbit/s on the wire to bytes per second (`None`: "no limit").
pub(crate) fn kbps_to_rate(kbps: u32) -> Option<u64> {
    (kbps != NO_RATE_LIMIT).then_some(u64::from(kbps) * 125)
}

/// Bytes per second to kbit/s on the wire, rounded up (a sender never declares less than it
/// wants) and below [`NO_RATE_LIMIT`], which means "unset".
pub(crate) fn rate_to_kbps(rate: Option<u64>) -> u32 {
    match rate {
        None => NO_RATE_LIMIT,
        Some(r) => {
            let kbps = r.div_ceil(125);
            u32::try_from(kbps)
                .unwrap_or(NO_RATE_LIMIT - 1)
                .min(NO_RATE_LIMIT - 1)
        }
    }
}

/// One path's explicit-rate state, both as receiver (echoing) and as sender (echoed).
#[derive(Debug, Default)]
pub(crate) struct PathRate {
    /// Receiver: the lowest Feedback Rate (kbit/s) of this path's packets since our last
    /// RateEcho for it (`None`: no packet with a rate area since).
    pub(crate) lowest_seen: Option<u32>,
    /// Sender: the latest feedback rate the peer echoed for this path (kbit/s, raw) and when.
    pub(crate) echoed: Option<(u32, Instant)>,
    /// The application's expected rate, as handed to this path's controller.
    pub(crate) expected: Option<u64>,
    /// RateEcho frames sent about this path, and received about it.
    pub(crate) echoes_sent: u64,
    pub(crate) echoes_received: u64,
}

impl PathRate {
    /// A packet with a rate area arrived on the path (authenticated).
    pub(crate) fn on_area(&mut self, area: RateArea) {
        let low = self
            .lowest_seen
            .map_or(area.feedback_kbps, |l| l.min(area.feedback_kbps));
        self.lowest_seen = Some(low);
    }

    /// The latest echoed router rate in bytes per second, if a router lowered it.
    pub(crate) fn stamped(&self) -> Option<u64> {
        self.echoed.and_then(|(kbps, _)| kbps_to_rate(kbps))
    }
}

impl Connection {
    /// Sets the rate the application expects to produce, in bytes per second (`None`: unset,
    /// the default). It is declared, authenticated, in the explicit-rate area of every packet
    /// (PROTOCOL.md §4.8) on paths whose controller sends the area, so that routers weight
    /// their shares by it (F12); the explicit-rate controller never paces above it.
    /// Controllers that ignore it are not limited by it.
    pub fn set_expected_rate(&mut self, bytes_per_second: Option<u64>) {
        self.expected_rate = bytes_per_second;
        for path in &mut self.paths {
            path.set_expected_rate(bytes_per_second);
        }
    }

    /// The expected rate set with [`set_expected_rate`](Self::set_expected_rate).
    pub fn expected_rate(&self) -> Option<u64> {
        self.expected_rate
    }

    /// The rate the application should produce data at now (DESIGN.md F13), or `None` before
    /// the connection is established or while no active path has an RTT sample.
    ///
    /// Per active, usable path: the router's echoed rate where a router stamps (and the
    /// path's controller sends the rate area), bounded by the controller's own estimate,
    /// else the controller's estimate (the smaller of its pacing rate and window / smoothed
    /// RTT); times `min_rtt / smoothed_rtt`, so that an encoder whose data queues up (the RTT
    /// grows) is asked for less and drains the queue; minus the packet overheads (short
    /// header with the rate area if sent, AEAD tag, 16 bytes of frame headers) at the path's
    /// datagram size. Summed over the paths. Flows have no priorities in this version, so
    /// there is no per-flow share: the application divides the total among its flows.
    ///
    /// `source` is [`RateSource::Router`] when the router's rate sets the figure on every
    /// path summed, [`RateSource::Controller`] otherwise.
    pub fn target_rate(&self) -> Option<TargetRate> {
        if !self.is_established() {
            return None;
        }
        let mut total = 0u64;
        let mut any = false;
        let mut all_router = true;
        for p in self.paths.iter().filter(|p| {
            p.usable() && p.state == crate::path::PathState::Active && p.rtt.has_sample()
        }) {
            let srtt = p.rtt.smoothed().max(Duration::from_micros(1));
            let min = p.rtt.min().unwrap_or(srtt).min(srtt);
            let window_rate = u128::from(p.cc.window()) * 1_000_000_000 / srtt.as_nanos();
            let window_rate = u64::try_from(window_rate).unwrap_or(u64::MAX);
            let controller =
                p.cc.pacing_rate(&p.rtt)
                    .map_or(window_rate, |r| r.min(window_rate));
            let (rate, router) = match p.rate.stamped().filter(|_| p.cc.wants_rate_area()) {
                Some(stamped) if stamped <= controller => (stamped, true),
                _ => (controller, false),
            };
            all_router &= router;
            // F13: × RTT_min / RTT.
            let rate = u128::from(rate) * min.as_nanos() / srtt.as_nanos();
            // Overheads per datagram of the path's size.
            let mtu = u128::from(p.mtu.max(1));
            let area = if p.cc.wants_rate_area() {
                wire::RATE_AREA_LEN
            } else {
                0
            };
            let header = (1 + self.remote_cid.len() + 1 + 4 + area) as u128;
            let overhead =
                header + crate::crypto::TAG_LEN as u128 + u128::from(TARGET_FRAME_OVERHEAD);
            let rate = rate * mtu.saturating_sub(overhead) / mtu;
            total = total.saturating_add(u64::try_from(rate).unwrap_or(u64::MAX));
            any = true;
        }
        any.then_some(TargetRate {
            bytes_per_second: total,
            source: if all_router {
                RateSource::Router
            } else {
                RateSource::Controller
            },
        })
    }

    /// Queues [`Event::TargetRate`] if the target rate is known for the first time, or moved
    /// by more than 10 % (or changed source) since the last one reported, at most once per
    /// smoothed RTT of the primary path.
    pub(crate) fn update_target_rate(&mut self, now: Instant) {
        let Some(target) = self.target_rate() else {
            return;
        };
        if let Some((at, last)) = self.target_reported {
            let srtt = self.paths[self.primary()].rtt.smoothed();
            if now.saturating_duration_since(at) < srtt {
                return;
            }
            let (num, den) = TARGET_CHANGE;
            let moved = target.bytes_per_second.abs_diff(last.bytes_per_second);
            let threshold = u128::from(last.bytes_per_second) * u128::from(num) / u128::from(den);
            if u128::from(moved) <= threshold && target.source == last.source {
                return;
            }
        }
        self.target_reported = Some((now, target));
        self.events.push_back(Event::TargetRate(target));
    }

    /// The rate area for the next packet on path `index`: present when the path's controller
    /// wants it (PROTOCOL.md §4.8), with our expected rate and Feedback Rate "no limit".
    pub(crate) fn rate_area(&self, index: usize) -> Option<RateArea> {
        let path = self.paths.get(index)?;
        path.cc.wants_rate_area().then(|| RateArea {
            expected_kbps: rate_to_kbps(self.expected_rate),
            feedback_kbps: NO_RATE_LIMIT,
        })
    }

    /// Writes a RateEcho for path `index` (PROTOCOL.md §9.27) if packets with a rate area
    /// arrived on it since the last one and `room` allows; called right after the path's
    /// Ack, so that every ACK carries the path's latest feedback (well over the "once per
    /// RTT while it changes" the spec asks for, at 6 to 10 bytes per ACK).
    pub(crate) fn write_rate_echo(&mut self, index: usize, buf: &mut Vec<u8>, room: usize) {
        let path = &mut self.paths[index];
        let Some(lowest) = path.rate.lowest_seen else {
            return;
        };
        let frame = Frame::RateEcho {
            path_id: path.id,
            feedback_kbps: lowest,
        };
        if frame.encoded_len() > room {
            return;
        }
        frame.encode(buf);
        path.rate.lowest_seen = None;
        path.rate.echoes_sent += 1;
        self.stats.rate_echoes_sent += 1;
    }

    /// The peer echoed the lowest feedback rate of our packets on path `path_id` (§9.27):
    /// recorded and handed to the path's controller. An echo about a path we do not know (it
    /// may have been abandoned meanwhile) or about which we sent no rate area is ignored:
    /// the frame is informational and never worth closing the connection over.
    pub(crate) fn on_rate_echo(&mut self, now: Instant, path_id: u32, feedback_kbps: u32) {
        self.stats.rate_echoes_received += 1;
        let Some(index) = self.path_index(path_id) else {
            return;
        };
        let path = &mut self.paths[index];
        path.rate.echoes_received += 1;
        if !path.cc.wants_rate_area() {
            return;
        }
        path.rate.echoed = Some((feedback_kbps, now));
        let rate = kbps_to_rate(feedback_kbps);
        tracing::trace!(path = path_id, feedback_kbps, "rate echo");
        path.cc.on_feedback_rate(now, rate, &path.rtt);
        self.update_target_rate(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_convert_between_bytes_and_kbit() {
        assert_eq!(kbps_to_rate(NO_RATE_LIMIT), None);
        assert_eq!(kbps_to_rate(10_000), Some(1_250_000));
        assert_eq!(rate_to_kbps(None), NO_RATE_LIMIT);
        assert_eq!(rate_to_kbps(Some(1_250_000)), 10_000);
        // Rounded up: never declare less than wanted.
        assert_eq!(rate_to_kbps(Some(1)), 1);
        assert_eq!(rate_to_kbps(Some(0)), 0);
        // Huge rates saturate below "unset".
        assert_eq!(rate_to_kbps(Some(u64::MAX)), NO_RATE_LIMIT - 1);
    }

    #[test]
    fn the_lowest_feedback_since_the_last_echo_is_kept() {
        let mut r = PathRate::default();
        for kbps in [5_000, 3_000, 4_000] {
            r.on_area(RateArea {
                expected_kbps: NO_RATE_LIMIT,
                feedback_kbps: kbps,
            });
        }
        assert_eq!(r.lowest_seen, Some(3_000));
    }
}
