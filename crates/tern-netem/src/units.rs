//! Parsers for the quantities on the command line and in link specs: durations (`20ms`),
//! rates (`10mbit`), probabilities (`1%`) and queue limits (`100kB`, `64pkt`, `50ms`).

use std::time::Duration;

use crate::Error;

fn bad(what: &str, value: &str, hint: &str) -> Error {
    Error::Parse(format!("bad {what} {value:?}: {hint}"))
}

/// Splits `"12.5ms"` into `(12.5, "ms")`.
fn split_number(value: &str) -> Option<(f64, &str)> {
    let v = value.trim();
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '-'))
        .unwrap_or(v.len());
    // "1e3" is a number but "1ms" must not eat the 'e' of nothing; numbers here never use
    // exponents with a unit, so only accept the exponent form when the whole string is numeric.
    let (num, unit) = v.split_at(end);
    let num: f64 = num.parse().ok()?;
    if !num.is_finite() || num < 0.0 {
        return None;
    }
    Some((num, unit.trim()))
}

/// A duration: `20ms`, `1.5s`, `250us`, `100ns`, `0`. A bare number is milliseconds.
pub fn parse_duration(value: &str) -> Result<Duration, Error> {
    let hint = "use e.g. 20ms, 1.5s, 250us";
    let (n, unit) = split_number(value).ok_or_else(|| bad("duration", value, hint))?;
    let secs = match unit.to_ascii_lowercase().as_str() {
        "" | "ms" => n / 1e3,
        "s" | "sec" => n,
        "us" | "µs" => n / 1e6,
        "ns" => n / 1e9,
        "m" | "min" => n * 60.0,
        _ => return Err(bad("duration", value, hint)),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad("duration", value, hint))
}

/// A rate in bit/s: `10mbit`, `660kbit`, `1.5gbit`, `9600bit`, also with `/s` or `bps`
/// spelled out (`10Mbit/s`, `10Mbps` = megabits). Bytes per second are not accepted, to avoid
/// the `tc` trap where `mbps` means megabytes.
pub fn parse_rate(value: &str) -> Result<u64, Error> {
    let hint = "use e.g. 10mbit, 660kbit, 1gbit (bits per second)";
    let (n, unit) = split_number(value).ok_or_else(|| bad("rate", value, hint))?;
    let unit = unit.trim_end_matches("/s").to_ascii_lowercase();
    let mult = match unit.as_str() {
        "" | "bit" | "bps" | "b" => 1.0,
        "k" | "kbit" | "kbps" | "kb" => 1e3,
        "m" | "mbit" | "mbps" | "mb" => 1e6,
        "g" | "gbit" | "gbps" | "gb" => 1e9,
        _ => return Err(bad("rate", value, hint)),
    };
    let bps = (n * mult).round();
    if bps > u64::MAX as f64 {
        return Err(bad("rate", value, hint));
    }
    Ok(bps as u64)
}

/// A probability: `1%`, `0.5%`, or a fraction `0.01`.
pub fn parse_probability(value: &str) -> Result<f64, Error> {
    let hint = "use e.g. 1% or 0.01";
    let v = value.trim();
    let p = match v.strip_suffix('%') {
        Some(pct) => {
            pct.trim()
                .parse::<f64>()
                .map_err(|_| bad("probability", value, hint))?
                / 100.0
        }
        None => v
            .parse::<f64>()
            .map_err(|_| bad("probability", value, hint))?,
    };
    if !(0.0..=1.0).contains(&p) {
        return Err(bad("probability", value, "must be between 0 and 100 %"));
    }
    Ok(p)
}

/// A drop-tail queue limit as written by the user.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum QueueSpec {
    /// 100 ms at the link's (mean) rate, at least 10 full-size packets.
    #[default]
    Default,
    /// No limit.
    Unlimited,
    /// At most this many bytes (IP packets, headers included) waiting or being sent.
    Bytes(usize),
    /// At most this many packets waiting or being sent.
    Packets(usize),
    /// This much time at the link's (mean) rate, converted to bytes.
    Time(Duration),
}

/// A queue limit: `100kB` (1000-based), `64KiB`, `150000B`, `64pkt` (or `64p`, `64packets`),
/// `50ms` (time at the link rate), `unlimited`, `default`.
pub fn parse_queue(value: &str) -> Result<QueueSpec, Error> {
    let hint = "use e.g. 100kB, 64KiB, 64pkt, 50ms or unlimited";
    let v = value.trim();
    match v.to_ascii_lowercase().as_str() {
        "unlimited" | "inf" | "none" => return Ok(QueueSpec::Unlimited),
        "default" => return Ok(QueueSpec::Default),
        _ => {}
    }
    let (n, unit) = split_number(v).ok_or_else(|| bad("queue", value, hint))?;
    let bytes = |mult: f64| QueueSpec::Bytes((n * mult).round() as usize);
    Ok(match unit {
        "B" | "b" | "" => bytes(1.0),
        "kB" | "KB" | "kb" | "k" => bytes(1e3),
        "KiB" | "kiB" | "Ki" => bytes(1024.0),
        "MB" | "mB" | "M" => bytes(1e6),
        "MiB" => bytes(1024.0 * 1024.0),
        "pkt" | "pkts" | "p" | "packets" | "packet" => QueueSpec::Packets(n.round() as usize),
        _ => QueueSpec::Time(parse_duration(v).map_err(|_| bad("queue", value, hint))?),
    })
}

/// Formats a rate in the largest unit that keeps it readable (`10.00 Mbit/s`).
pub fn format_rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.2} Mbit/s", bps / 1e6)
    } else if bps >= 1e3 {
        format!("{:.1} kbit/s", bps / 1e3)
    } else {
        format!("{bps:.0} bit/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_and_milliseconds_without_one() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("7").unwrap(), Duration::from_millis(7));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-3ms").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn rates_are_bits_per_second_with_si_prefixes() {
        assert_eq!(parse_rate("10mbit").unwrap(), 10_000_000);
        assert_eq!(parse_rate("10Mbit/s").unwrap(), 10_000_000);
        assert_eq!(parse_rate("660kbit").unwrap(), 660_000);
        assert_eq!(parse_rate("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("9600").unwrap(), 9600);
        assert!(parse_rate("10MB/s").is_ok()); // "mb" is megabits here, documented
        assert!(parse_rate("10 furlongs").is_err());
    }

    #[test]
    fn probabilities() {
        assert_eq!(parse_probability("1%").unwrap(), 0.01);
        assert_eq!(parse_probability("0.02").unwrap(), 0.02);
        assert!(parse_probability("101%").is_err());
        assert!(parse_probability("x").is_err());
    }

    #[test]
    fn queues_are_bytes_packets_time_or_unlimited() {
        assert_eq!(parse_queue("100kB").unwrap(), QueueSpec::Bytes(100_000));
        assert_eq!(parse_queue("64KiB").unwrap(), QueueSpec::Bytes(65_536));
        assert_eq!(parse_queue("64pkt").unwrap(), QueueSpec::Packets(64));
        assert_eq!(parse_queue("1500").unwrap(), QueueSpec::Bytes(1500));
        assert_eq!(
            parse_queue("50ms").unwrap(),
            QueueSpec::Time(Duration::from_millis(50))
        );
        assert_eq!(parse_queue("unlimited").unwrap(), QueueSpec::Unlimited);
        assert!(parse_queue("many").is_err());
    }
}
