//! ECN on emulated links: an IP packet's ECN field read and rewritten in place (RFC 3168), for
//! a bottleneck that marks CE instead of dropping (a step AQM, like DCTCP's `K`) and for
//! middleboxes that bleach or rewrite the bits.

use crate::shaper::QueueLimit;

/// What a link direction does to the ECN field of the packets it carries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum EcnRule {
    /// Leaves it alone.
    #[default]
    Pass,
    /// Marks ECN-capable packets CE when, on arrival, the queue holds at least this much.
    Mark(crate::units::QueueSpec),
    /// Rewrites every packet's ECN field to these two bits (`0`: bleach; `0b01`: ECT(1)).
    Rewrite(u8),
}

/// The two ECN bits of an IPv4 or IPv6 packet; `None` if it is neither.
pub fn get(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        4 => Some(packet.get(1)? & 0b11),
        6 => Some((packet.get(1)? >> 4) & 0b11),
        _ => None,
    }
}

/// Sets the two ECN bits of an IPv4 or IPv6 packet (the IPv4 header checksum is updated);
/// returns false, changing nothing, if it is neither or too short.
pub fn set(packet: &mut [u8], bits: u8) -> bool {
    let bits = bits & 0b11;
    match packet.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            if ihl < 20 || packet.len() < ihl {
                return false;
            }
            packet[1] = (packet[1] & !0b11) | bits;
            packet[10] = 0;
            packet[11] = 0;
            let sum = checksum(&packet[..ihl]);
            packet[10..12].copy_from_slice(&sum.to_be_bytes());
            true
        }
        Some(6) if packet.len() >= 40 => {
            packet[1] = (packet[1] & 0b1100_1111) | (bits << 4);
            true
        }
        _ => false,
    }
}

/// The Internet checksum (RFC 1071) of an IPv4 header whose checksum field is zero.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Applies `rule` to a packet arriving at a queue holding `queued = (bytes, packets)` with
/// `limit` the rule's threshold resolved for the link's rate. Returns whether it was marked CE.
pub fn apply(rule: EcnRule, limit: QueueLimit, queued: (usize, usize), packet: &mut [u8]) -> bool {
    match rule {
        EcnRule::Pass => false,
        EcnRule::Rewrite(bits) => {
            set(packet, bits);
            false
        }
        EcnRule::Mark(_) => {
            let ect = matches!(get(packet), Some(0b10 | 0b01));
            let over = limit.bytes.is_some_and(|b| queued.0 >= b)
                || limit.packets.is_some_and(|p| queued.1 >= p);
            ect && over && set(packet, 0b11)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::QueueSpec;

    /// A minimal IPv4 header (20 bytes) with a valid checksum, then 8 payload bytes.
    fn ipv4(tos: u8) -> Vec<u8> {
        let mut p = vec![
            0x45, tos, 0, 28, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let sum = checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&[0; 8]);
        p
    }

    #[test]
    fn ipv4_marks_keep_the_header_checksum_valid() {
        let mut p = ipv4(0xb8 | 0b10);
        assert_eq!(get(&p), Some(0b10));
        assert!(set(&mut p, 0b11));
        assert_eq!(get(&p), Some(0b11));
        assert_eq!(p[1] & !0b11, 0xb8, "DSCP untouched");
        assert_eq!(checksum(&p[..20]), 0, "a valid header sums to 0xffff");
    }

    #[test]
    fn ipv6_traffic_class_ecn_bits() {
        let mut p = vec![0u8; 48];
        p[0] = 0x60 | 0x0b; // version 6, traffic class high nibble 0xb
        p[1] = 0x80 | 0x05; // traffic class low nibble 0x8 (ECN 0b00), flow label bits
        assert_eq!(get(&p), Some(0));
        assert!(set(&mut p, 0b10));
        assert_eq!(get(&p), Some(0b10));
        assert_eq!(p[1] & 0x0f, 0x05, "flow label untouched");
        assert_eq!(p[1] >> 6, 0b10, "DSCP low bits untouched");
    }

    #[test]
    fn only_ect_packets_over_the_threshold_are_marked() {
        let rule = EcnRule::Mark(QueueSpec::Bytes(3000));
        let limit = QueueLimit::resolve(QueueSpec::Bytes(3000), None);
        let mut p = ipv4(0b10);
        assert!(!apply(rule, limit, (2999, 2), &mut p));
        assert!(apply(rule, limit, (3000, 2), &mut p));
        assert_eq!(get(&p), Some(0b11));
        let mut not_ect = ipv4(0);
        assert!(!apply(rule, limit, (9000, 6), &mut not_ect));
        assert_eq!(get(&not_ect), Some(0));
        let mut bleached = ipv4(0b10);
        apply(EcnRule::Rewrite(0), limit, (0, 0), &mut bleached);
        assert_eq!(get(&bleached), Some(0));
        assert_eq!(checksum(&bleached[..20]), 0);
        assert!(!set(&mut [0x45, 0, 0], 0b11), "truncated header left alone");
    }
}
