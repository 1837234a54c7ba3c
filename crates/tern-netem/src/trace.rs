//! mahimahi link traces: one millisecond timestamp per line, each line one delivery opportunity
//! for [`OPPORTUNITY_BYTES`] bytes; the last timestamp is the period with which the trace loops.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;

/// Bytes that may leave the queue at one delivery opportunity (mahimahi's `PACKET_SIZE`).
pub const OPPORTUNITY_BYTES: usize = 1500;

/// A parsed mahimahi trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Delivery opportunities, milliseconds from the start of a period, never decreasing.
    opportunities_ms: Vec<u64>,
    /// Where it was read from, for messages.
    source: Option<PathBuf>,
}

impl Trace {
    /// Parses a trace from text. Blank lines are skipped; anything else must be a
    /// non-negative integer, timestamps must never decrease, and the last one (the period)
    /// must be positive.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut opportunities_ms = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let t: u64 = line.parse().map_err(|_| {
                Error::Parse(format!(
                    "trace line {}: {line:?} is not a millisecond timestamp",
                    i + 1
                ))
            })?;
            if let Some(&last) = opportunities_ms.last() {
                if t < last {
                    return Err(Error::Parse(format!(
                        "trace line {}: timestamp {t} is before the previous one ({last})",
                        i + 1
                    )));
                }
            }
            opportunities_ms.push(t);
        }
        match opportunities_ms.last() {
            None => Err(Error::Parse("trace is empty".into())),
            Some(0) => Err(Error::Parse(
                "trace's last timestamp (its period) must be > 0".into(),
            )),
            Some(_) => Ok(Self {
                opportunities_ms,
                source: None,
            }),
        }
    }

    /// Reads and parses a trace file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Parse(format!("cannot read trace {}: {e}", path.display())))?;
        let mut trace =
            Self::parse(&text).map_err(|e| Error::Parse(format!("{}: {e}", path.display())))?;
        trace.source = Some(path.to_owned());
        Ok(trace)
    }

    /// From a list of timestamps (must satisfy the same rules as [`Trace::parse`]).
    pub fn from_opportunities(opportunities_ms: Vec<u64>) -> Result<Self, Error> {
        let text: String = opportunities_ms.iter().map(|t| format!("{t}\n")).collect();
        Self::parse(&text)
    }

    /// The file it was loaded from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// The opportunities of one period, in milliseconds.
    pub fn opportunities_ms(&self) -> &[u64] {
        &self.opportunities_ms
    }

    /// The loop period (the last timestamp), in milliseconds.
    pub fn period_ms(&self) -> u64 {
        *self.opportunities_ms.last().unwrap_or(&1)
    }

    /// The loop period.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms())
    }

    /// Mean capacity over one period, in bit/s: `lines × 1500 × 8 / period`.
    pub fn mean_rate_bps(&self) -> f64 {
        self.opportunities_ms.len() as f64 * (OPPORTUNITY_BYTES * 8) as f64
            / (self.period_ms() as f64 / 1e3)
    }

    /// Number of opportunities at times in the half-open window `(from, to]` (time since the
    /// start of replay, looping), matching the replay rule that an opportunity at exactly the
    /// arrival time of a packet is not usable by it.
    pub fn opportunities_between(&self, from: Duration, to: Duration) -> u64 {
        if to <= from {
            return 0;
        }
        self.opportunities_up_to(to) - self.opportunities_up_to(from)
    }

    /// Capacity in bytes offered in `(from, to]`.
    pub fn capacity_bytes_between(&self, from: Duration, to: Duration) -> u64 {
        self.opportunities_between(from, to) * OPPORTUNITY_BYTES as u64
    }

    /// Opportunities at times `<= t` since the start, counting loops.
    fn opportunities_up_to(&self, t: Duration) -> u64 {
        let period_ns = u128::from(self.period_ms()) * 1_000_000;
        let t_ns = t.as_nanos();
        let loops = t_ns / period_ns;
        let offset_ns = t_ns % period_ns;
        let within = self
            .opportunities_ms
            .partition_point(|&ms| u128::from(ms) * 1_000_000 <= offset_ns);
        u64::try_from(loops).unwrap_or(u64::MAX) * self.opportunities_ms.len() as u64
            + within as u64
    }

    /// Index (counting loops: `loop × len + i`) of the first opportunity strictly after `t`.
    pub(crate) fn first_after(&self, t: Duration) -> u64 {
        self.opportunities_up_to(t)
    }

    /// Time since the start of replay of opportunity `index` (counting loops).
    pub(crate) fn time_of(&self, index: u64) -> Duration {
        let len = self.opportunities_ms.len() as u64;
        let loops = index / len;
        let i = (index % len) as usize;
        Duration::from_millis(loops * self.period_ms() + self.opportunities_ms[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let t = Trace::parse("1\n1\n\n5\n10\n").unwrap();
        assert_eq!(t.opportunities_ms(), &[1, 1, 5, 10]);
        assert_eq!(t.period_ms(), 10);
        // 4 × 1500 B per 10 ms = 4.8 Mbit/s.
        assert!((t.mean_rate_bps() - 4.8e6).abs() < 1.0);
        assert!(Trace::parse("").is_err());
        assert!(Trace::parse("0\n0\n").is_err());
        assert!(Trace::parse("5\n3\n").is_err());
        assert!(Trace::parse("5\nx\n").is_err());
    }

    #[test]
    fn counting_and_indexing_loop() {
        let t = Trace::parse("0\n2\n2\n10\n").unwrap();
        let ms = Duration::from_millis;
        // (0, 10]: 2, 2, 10, and the second loop's 0, which is also at 10 ms (0 itself is at
        // time 0, not after it).
        assert_eq!(t.opportunities_between(ms(0), ms(10)), 4);
        // Then 12, 12, 20, 20: four per period.
        assert_eq!(t.opportunities_between(ms(0), ms(20)), 8);
        assert_eq!(t.first_after(ms(0)), 1);
        assert_eq!(t.time_of(1), ms(2));
        assert_eq!(t.first_after(ms(2)), 3);
        assert_eq!(t.time_of(3), ms(10));
        assert_eq!(t.time_of(4), ms(10));
        assert_eq!(t.time_of(5), ms(12));
        assert_eq!(t.first_after(ms(10)), 5);
    }

    #[test]
    fn shared_traces_have_the_documented_means() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
        let file = dir.join("Verizon-LTE-short.down");
        if !file.exists() {
            eprintln!("skipped: {} not found", file.display());
            return;
        }
        let t = Trace::load(&file).unwrap();
        assert_eq!(t.period_ms(), 140_000);
        assert!((t.mean_rate_bps() / 1e6 - 5.03).abs() < 0.01);
    }
}
