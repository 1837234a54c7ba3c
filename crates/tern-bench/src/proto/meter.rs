//! The receiver's meter of a long transfer ([`crate::spec::Work::Transfer`]): bytes per bin
//! of time, first and last byte, and the longest gap in delivery (the stall a handover
//! causes). Shared by every driver, so each protocol is measured the same way. Also the
//! watcher of the client's local addresses (a move the transport may need to be told of).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Instant;

use crate::results::TransferSample;
use crate::spec::TransferPlan;

/// Meters deliveries.
#[derive(Debug)]
pub struct Meter {
    epoch: Instant,
    event: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    sample: TransferSample,
}

fn ms(epoch: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(epoch).as_secs_f64() * 1e3
}

impl Meter {
    /// A meter for `plan`; times are ms since `epoch` (the client's start).
    pub fn new(plan: &TransferPlan, epoch: Instant) -> Self {
        Self {
            epoch,
            event: plan
                .event_at_ms
                .map(|ms| epoch + std::time::Duration::from_millis(ms)),
            first: None,
            last: None,
            sample: TransferSample {
                size: plan.size,
                start_ms: ms(epoch, Instant::now()),
                bin_ms: plan.bin_ms.max(1),
                connections: 1,
                ..TransferSample::default()
            },
        }
    }

    /// `n` bytes were delivered now.
    pub fn delivered(&mut self, n: usize) {
        self.delivered_at(n, Instant::now());
    }

    /// `n` bytes were delivered at `now`.
    pub fn delivered_at(&mut self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        if let Some(last) = self.last {
            self.gap(last, now);
        } else {
            self.first = Some(now);
            self.sample.first_byte_ms = Some(ms(self.epoch, now));
        }
        self.last = Some(now);
        self.sample.last_byte_ms = Some(ms(self.epoch, now));
        self.sample.received += n as u64;
        if self.sample.connections == 1 {
            self.sample.first_connection_bytes += n as u64;
        }
        let bin = (ms(self.epoch, now) / self.sample.bin_ms as f64) as usize;
        if self.sample.bins.len() <= bin {
            self.sample.bins.resize(bin + 1, 0);
        }
        self.sample.bins[bin] += n as u64;
    }

    fn gap(&mut self, from: Instant, to: Instant) {
        let gap = to.saturating_duration_since(from).as_secs_f64() * 1e3;
        if gap > self.sample.max_gap_ms {
            self.sample.max_gap_ms = gap;
            self.sample.max_gap_at_ms = ms(self.epoch, from);
        }
        if self.event.is_some_and(|e| to >= e) && gap > self.sample.event_gap_ms.unwrap_or(-1.0) {
            self.sample.event_gap_ms = Some(gap);
            self.sample.event_gap_at_ms = Some(ms(self.epoch, from));
        }
    }

    /// Bytes delivered so far.
    pub fn received(&self) -> u64 {
        self.sample.received
    }

    /// When the last byte arrived.
    pub fn last(&self) -> Option<Instant> {
        self.last
    }

    /// The client gave its connection up and opens a new one.
    pub fn reconnecting(&mut self) {
        self.sample.connections += 1;
    }

    /// The first byte after reconnecting arrived, `ms` after giving the old one up.
    pub fn reconnected(&mut self, ms: f64) {
        self.sample.reconnect_ms.get_or_insert(ms);
    }

    /// The first delivery after the receive window was opened again, `ms` after.
    pub fn window_resumed(&mut self, ms: f64) {
        self.sample.window_resume_ms.get_or_insert(ms);
    }

    /// The transport was told the address changed.
    pub fn rebound(&mut self) {
        self.sample.rebinds += 1;
    }

    /// The finished sample. An unfinished transfer's time since its last byte counts as a
    /// gap (it never resumed).
    pub fn finish(&mut self, completed: bool) -> TransferSample {
        if !completed {
            if let Some(last) = self.last {
                self.gap(last, Instant::now());
            }
        }
        self.sample.completed = completed;
        self.sample.clone()
    }
}

/// The IPv4 addresses of this namespace's interfaces (loopback left out).
pub fn local_addresses() -> BTreeSet<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return BTreeSet::new();
    };
    addrs
        .filter_map(|a| {
            let ip = IpAddr::V4(a.address?.as_sockaddr_in()?.ip());
            (!ip.is_loopback()).then_some(ip)
        })
        .collect()
}

/// Pairs the addresses that went away with those that appeared (`old` → `new`): one in the
/// same /24 if there is one, else in order.
pub fn address_changes(
    before: &BTreeSet<IpAddr>,
    after: &BTreeSet<IpAddr>,
) -> Vec<(IpAddr, IpAddr)> {
    let gone: Vec<IpAddr> = before.difference(after).copied().collect();
    let mut new: Vec<IpAddr> = after.difference(before).copied().collect();
    let net = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            Some([o[0], o[1], o[2]])
        }
        IpAddr::V6(_) => None,
    };
    let mut out = Vec::new();
    for old in gone {
        if new.is_empty() {
            break;
        }
        let i = new
            .iter()
            .position(|n| net(n).is_some() && net(n) == net(&old))
            .unwrap_or(0);
        out.push((old, new.remove(i)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn plan() -> TransferPlan {
        TransferPlan {
            size: 1000,
            duration_ms: None,
            timeout_ms: 1000,
            multipath: false,
            window_ms: None,
            follow_address: false,
            resume_after_ms: None,
            bin_ms: 100,
            event_at_ms: None,
            video: None,
        }
    }

    #[test]
    fn the_longest_gap_and_the_timeline() {
        let t0 = Instant::now();
        let mut m = Meter::new(&plan(), t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        m.delivered_at(100, at(10));
        m.delivered_at(100, at(20));
        m.delivered_at(0, at(500)); // nothing delivered: no event
        m.delivered_at(300, at(420));
        m.delivered_at(500, at(450));
        let s = m.finish(true);
        assert_eq!(s.received, 1000);
        assert!(s.completed);
        assert_eq!(s.first_byte_ms, Some(10.0));
        assert_eq!(s.last_byte_ms, Some(450.0));
        assert!((s.max_gap_ms - 400.0).abs() < 1e-9, "{s:?}");
        assert!((s.max_gap_at_ms - 20.0).abs() < 1e-9);
        assert_eq!(s.bins, vec![200, 0, 0, 0, 800]);
        assert_eq!(s.connections, 1);
        assert_eq!(s.first_connection_bytes, 1000);
    }

    #[test]
    fn the_events_gap_is_not_the_start_ups() {
        let t0 = Instant::now();
        let mut p = plan();
        p.event_at_ms = Some(1_000);
        let mut m = Meter::new(&p, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        m.delivered_at(10, at(10));
        m.delivered_at(10, at(500)); // a long gap at the start
        m.delivered_at(10, at(990));
        m.delivered_at(10, at(1_200)); // the event's
        m.delivered_at(10, at(1_210));
        let s = m.finish(true);
        assert!((s.max_gap_ms - 490.0).abs() < 1e-9);
        assert_eq!(s.event_gap_ms, Some(210.0));
        assert_eq!(s.event_gap_at_ms, Some(990.0));
        assert_eq!(Meter::new(&plan(), t0).finish(true).event_gap_ms, None);
    }

    #[test]
    fn moves_pair_old_and_new_addresses_by_subnet() {
        let set = |v: &[[u8; 4]]| v.iter().map(|a| IpAddr::from(*a)).collect::<BTreeSet<_>>();
        let before = set(&[[10, 77, 1, 1], [10, 77, 3, 1]]);
        let after = set(&[[10, 77, 3, 77], [10, 77, 1, 77]]);
        assert_eq!(
            address_changes(&before, &after),
            vec![
                (IpAddr::from([10, 77, 1, 1]), IpAddr::from([10, 77, 1, 77])),
                (IpAddr::from([10, 77, 3, 1]), IpAddr::from([10, 77, 3, 77])),
            ]
        );
        // A new network: paired in order.
        let moved = address_changes(&set(&[[10, 77, 1, 1]]), &set(&[[10, 77, 5, 1]]));
        assert_eq!(
            moved,
            vec![(IpAddr::from([10, 77, 1, 1]), IpAddr::from([10, 77, 5, 1]))]
        );
        // Only one of two moved; an address only added pairs with nothing.
        let one = address_changes(&before, &set(&[[10, 77, 1, 1], [10, 77, 3, 9]]));
        assert_eq!(
            one,
            vec![(IpAddr::from([10, 77, 3, 1]), IpAddr::from([10, 77, 3, 9]))]
        );
        assert!(address_changes(&set(&[[10, 77, 1, 1]]), &before).is_empty());
    }

    #[test]
    fn bytes_after_a_reconnect_are_not_the_first_connections() {
        let t0 = Instant::now();
        let mut m = Meter::new(&plan(), t0);
        m.delivered_at(100, t0);
        m.reconnecting();
        m.delivered_at(50, t0 + Duration::from_millis(5));
        let s = m.finish(false);
        assert_eq!(s.connections, 2);
        assert_eq!(s.first_connection_bytes, 100);
        assert_eq!(s.received, 150);
        assert!(!s.completed);
    }
}
