//! `router=ncr`: the F12 explicit-rate router (`tern_proto::router`, NC-TCP's rate computation)
//! on the raw IP packets of one emulated direction.
//!
//! Packets come from a TUN device, so this module finds the UDP payload itself: IPv4 (any IHL,
//! not a fragment) or IPv6 without extension headers, protocol UDP, lengths consistent with
//! the packet. Anything else — TCP, ICMP, fragments, truncated or malformed headers — is only
//! counted as load, never touched and never a panic. The router sees whole IP packets as load
//! (the payload through `on_datagram`, the IP and UDP headers through `on_other`), so its
//! capacity is in the same unit as the shaper's rate: IP bytes.
//!
//! Rewriting the four bytes of a Feedback Rate invalidates the UDP checksum, which covers the
//! payload; it is updated incrementally (RFC 1624, eqn. 3) over the 16-bit words that changed.
//! A zero IPv4 UDP checksum means "none" and stays zero.
//!
//! Only flows on which the router saw a tern handshake are stamped ([`TernFlows`]): QUIC's
//! short header has tern's shape (see `tern_proto::wire::is_tern_long_header`), and a stamp in
//! a QUIC packet breaks it. A tern path opened later on another address pair (migration,
//! multipath) carries no long header, so it goes unstamped and its sender keeps its
//! end-to-end controller there (partial deployment, PROTOCOL.md §13).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tern_proto::router::{Router, Stamp};

const UDP: u8 = 17;
const UDP_HEADER: usize = 8;
const IPV6_HEADER: usize = 40;

/// Where the UDP segment of an IP packet is: `(udp_start, udp_end, is_ipv6)`.
fn udp_segment(packet: &[u8]) -> Option<(usize, usize, bool)> {
    let first = *packet.first()?;
    let (start, end, v6) = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
            let flags_fragment = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]);
            // More-fragments or a non-zero offset: not a whole datagram.
            if ihl < 20 || total < ihl || total > packet.len() || flags_fragment & 0x3fff != 0 {
                return None;
            }
            if *packet.get(9)? != UDP {
                return None;
            }
            (ihl, total, false)
        }
        6 => {
            let payload = usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]));
            if *packet.get(6)? != UDP || IPV6_HEADER + payload > packet.len() {
                return None;
            }
            (IPV6_HEADER, IPV6_HEADER + payload, true)
        }
        _ => return None,
    };
    let udp = packet.get(start..end)?;
    let udp_len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    if udp_len < UDP_HEADER || udp_len > udp.len() {
        return None;
    }
    Some((start, start + udp_len, v6))
}

/// A UDP flow of one direction: source and destination address (IPv4 in the first four
/// bytes) and port.
type Tuple = ([u8; 16], [u8; 16], u16, u16);

/// The flow of the UDP datagram whose header starts at `udp`.
fn tuple(packet: &[u8], udp: usize, v6: bool) -> Option<Tuple> {
    let (mut src, mut dst) = ([0; 16], [0; 16]);
    if v6 {
        src.copy_from_slice(packet.get(8..24)?);
        dst.copy_from_slice(packet.get(24..40)?);
    } else {
        src[..4].copy_from_slice(packet.get(12..16)?);
        dst[..4].copy_from_slice(packet.get(16..20)?);
    }
    let port = |at: usize| Some(u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]));
    Some((src, dst, port(udp)?, port(udp + 2)?))
}

/// Flows learned at most (a flood of handshakes from random ports cannot grow memory without
/// bound: past it, new flows go unstamped until old ones expire).
pub const MAX_TERN_FLOWS: usize = 65_536;

/// A learned flow is forgotten after this long without a packet (tern's default idle
/// timeout is 30 s).
pub const TERN_FLOW_IDLE: Duration = Duration::from_secs(60);

/// The UDP flows of one direction on which a tern handshake was seen (a long header of tern's
/// version): only their short headers are tern packets.
#[derive(Debug, Default)]
pub struct TernFlows {
    last_seen: HashMap<Tuple, Instant>,
    /// When the table, full, was last swept of expired flows (at most once a second, so a
    /// flood of handshakes at a full table costs no scan per packet).
    swept_at: Option<Instant>,
}

impl TernFlows {
    fn learn(&mut self, flow: Tuple, now: Instant) {
        if self.last_seen.len() >= MAX_TERN_FLOWS && !self.last_seen.contains_key(&flow) {
            if self
                .swept_at
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1))
            {
                self.swept_at = Some(now);
                self.last_seen
                    .retain(|_, t| now.saturating_duration_since(*t) <= TERN_FLOW_IDLE);
            }
            if self.last_seen.len() >= MAX_TERN_FLOWS {
                return;
            }
        }
        self.last_seen.insert(flow, now);
    }

    /// Whether `flow` is a known tern flow at `now` (and keeps it alive if so).
    fn knows(&mut self, flow: &Tuple, now: Instant) -> bool {
        match self.last_seen.get_mut(flow) {
            Some(t) if now.saturating_duration_since(*t) <= TERN_FLOW_IDLE => {
                *t = now;
                true
            }
            Some(_) => {
                self.last_seen.remove(flow);
                false
            }
            None => false,
        }
    }
}

/// One's-complement sum update for a 16-bit word changing from `old` to `new` (RFC 1624
/// eqn. 3: `HC' = ~(~HC + ~m + m')`).
fn update_checksum(checksum: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!checksum) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Offers an IP packet to `router` at `now`: the UDP payload of a whole UDP datagram of a
/// tern flow (one `flows` saw a tern handshake on) to [`Router::on_datagram`] (its checksum
/// fixed if the router rewrote it), everything else to [`Router::on_other`]. Returns what the
/// router did.
pub fn offer(router: &mut Router, flows: &mut TernFlows, now: Instant, packet: &mut [u8]) -> Stamp {
    let Some((start, end, v6)) = udp_segment(packet) else {
        router.on_other(now, packet.len());
        return Stamp::Unrated;
    };
    let Some(flow) = tuple(packet, start, v6) else {
        router.on_other(now, packet.len());
        return Stamp::Unrated;
    };
    if tern_proto::wire::is_tern_long_header(&packet[start + UDP_HEADER..end]) {
        flows.learn(flow, now);
    }
    if !flows.knows(&flow, now) {
        router.on_other(now, packet.len());
        return Stamp::Unrated;
    }
    router.on_other(now, packet.len() - (end - start - UDP_HEADER));
    let payload_start = start + UDP_HEADER;
    let stamp = router.on_datagram(now, &mut packet[payload_start..end]);
    let Stamp::Lowered {
        from_kbps, to_kbps, ..
    } = stamp
    else {
        return stamp;
    };
    let cid_len = router.config().cid_len;
    let Some(field) = tern_proto::wire::feedback_rate_offset(&packet[payload_start..end], cid_len)
    else {
        return stamp; // unreachable: the router just rewrote this field
    };
    let csum_at = start + 6;
    let mut checksum = u16::from_be_bytes([packet[csum_at], packet[csum_at + 1]]);
    if checksum == 0 && !v6 {
        return stamp; // no checksum on this IPv4 datagram
    }
    // The 16-bit words covering the field, aligned on the UDP header's start (the field may
    // start at an odd offset: the connection ID's length is the deployment's).
    let field_at = payload_start + field;
    let (old, new) = (from_kbps.to_be_bytes(), to_kbps.to_be_bytes());
    let byte = |at: usize, field_bytes: &[u8; 4], packet: &[u8]| -> u8 {
        if (field_at..field_at + 4).contains(&at) {
            field_bytes[at - field_at]
        } else {
            packet.get(at).copied().filter(|_| at < end).unwrap_or(0)
        }
    };
    let mut word = start + ((field_at - start) & !1);
    while word < field_at + 4 {
        let o = u16::from_be_bytes([byte(word, &old, packet), byte(word + 1, &old, packet)]);
        let n = u16::from_be_bytes([byte(word, &new, packet), byte(word + 1, &new, packet)]);
        checksum = update_checksum(checksum, o, n);
        word += 2;
    }
    if checksum == 0 {
        checksum = 0xffff; // a computed zero is sent as all ones (RFC 768)
    }
    packet[csum_at..csum_at + 2].copy_from_slice(&checksum.to_be_bytes());
    stamp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(n: u32) -> Tuple {
        let mut src = [0; 16];
        src[..4].copy_from_slice(&n.to_be_bytes());
        (src, [0; 16], 4433, 5000)
    }

    #[test]
    fn the_flow_table_is_bounded_and_makes_room_as_flows_expire() {
        #[allow(clippy::disallowed_methods)] // an arbitrary origin; only differences are used
        let t0 = Instant::now();
        let mut flows = TernFlows::default();
        for n in 0..MAX_TERN_FLOWS as u32 {
            flows.learn(flow(n), t0);
        }
        // Full: a newcomer is not learned, a known flow still is refreshed.
        flows.learn(flow(u32::MAX), t0);
        assert!(!flows.knows(&flow(u32::MAX), t0));
        let later = t0 + TERN_FLOW_IDLE / 2;
        assert!(flows.knows(&flow(7), later));
        // Once the others have been silent for longer than the idle time, a sweep makes room.
        let much_later = t0 + TERN_FLOW_IDLE + Duration::from_secs(2);
        flows.learn(flow(u32::MAX), much_later);
        assert!(flows.knows(&flow(u32::MAX), much_later));
        assert!(
            flows.knows(&flow(7), much_later),
            "refreshed halfway, not expired"
        );
        assert!(!flows.knows(&flow(8), much_later));
        assert_eq!(flows.last_seen.len(), 2);
    }
}
