//! Per-source handshake rate (docs/PROTOCOL.md §7.5): a token bucket per client IP address,
//! so that one host cannot spend the server's handshake work (two X25519 operations and a
//! connection each) on its own. Spoofed sources are the Retry's job; this is for the hosts
//! that can answer one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Token buckets, one per source address, in a bounded table.
#[derive(Debug)]
pub(crate) struct HandshakeRate {
    /// Handshakes per second a source earns.
    rate: f64,
    /// Handshakes a source may start at once.
    burst: f64,
    /// Most sources tracked; a full table forgets the sources whose buckets are full again
    /// (they are indistinguishable from new ones).
    capacity: usize,
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

impl HandshakeRate {
    pub(crate) fn new(rate: f64, burst: f64, capacity: usize) -> Self {
        Self {
            rate,
            burst: burst.max(1.0),
            capacity: capacity.max(1),
            buckets: HashMap::new(),
        }
    }

    /// Takes one handshake from `source`'s bucket; false if it is empty.
    pub(crate) fn allow(&mut self, now: Instant, source: IpAddr) -> bool {
        if !self.buckets.contains_key(&source) && self.buckets.len() >= self.capacity {
            let (rate, burst) = (self.rate, self.burst);
            self.buckets
                .retain(|_, (tokens, at)| refill(*tokens, *at, now, rate, burst) < burst);
            if self.buckets.len() >= self.capacity {
                // Every tracked source is busy: a new one waits until one calms down.
                return false;
            }
        }
        let (rate, burst) = (self.rate, self.burst);
        let (tokens, at) = self.buckets.entry(source).or_insert((burst, now));
        let available = refill(*tokens, *at, now, rate, burst);
        *at = now;
        if available >= 1.0 {
            *tokens = available - 1.0;
            true
        } else {
            *tokens = available;
            false
        }
    }
}

/// One token bucket: an endpoint-wide budget (stateless resets per second).
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Option<Instant>,
}

impl TokenBucket {
    pub(crate) fn new(rate: f64, burst: f64) -> Self {
        let burst = burst.max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
            at: None,
        }
    }

    /// Takes one token; false if there is none.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let at = *self.at.get_or_insert(now);
        self.tokens = refill(self.tokens, at, now, self.rate, self.burst);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

fn refill(tokens: f64, at: Instant, now: Instant, rate: f64, burst: f64) -> f64 {
    (tokens + now.saturating_duration_since(at).as_secs_f64() * rate).min(burst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[allow(clippy::disallowed_methods)] // An arbitrary epoch; only offsets matter.
    fn epoch() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let t0 = epoch();
        let mut r = HandshakeRate::new(10.0, 5.0, 100);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!((0..8).filter(|_| r.allow(t0, a)).count(), 5);
        assert!(r.allow(t0, b), "another source is not affected");
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!((0..8).filter(|_| r.allow(t1, a)).count(), 5);
    }

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let t0 = epoch();
        let mut b = TokenBucket::new(100.0, 10.0);
        assert_eq!((0..20).filter(|_| b.take(t0)).count(), 10);
        let t1 = t0 + Duration::from_millis(50);
        assert_eq!((0..20).filter(|_| b.take(t1)).count(), 5);
    }

    #[test]
    fn the_table_is_bounded_and_forgets_calm_sources() {
        let t0 = epoch();
        let mut r = HandshakeRate::new(1.0, 2.0, 2);
        let ip = |i: u8| IpAddr::from([10, 0, 0, i]);
        assert!(r.allow(t0, ip(1)));
        assert!(r.allow(t0, ip(2)));
        assert!(!r.allow(t0, ip(3)), "full of busy sources");
        assert!(
            r.allow(t0 + Duration::from_secs(2), ip(3)),
            "calm ones forgotten"
        );
        assert!(r.buckets.len() <= 2);
    }
}
