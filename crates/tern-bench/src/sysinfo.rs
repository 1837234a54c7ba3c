//! What a results file records about where and with what it ran.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::results::Machine;

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The machine.
pub fn machine() -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let mem_kb: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|s| s.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    Machine {
        kernel: read("/proc/sys/kernel/osrelease"),
        hostname: read("/proc/sys/kernel/hostname"),
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        os,
        load_avg_start: read("/proc/loadavg")
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0),
    }
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Versions of everything under test.
pub fn versions() -> BTreeMap<String, String> {
    let mut v = BTreeMap::new();
    v.insert("tern-bench".into(), env!("CARGO_PKG_VERSION").into());
    v.insert(
        "tern (as built)".into(),
        env!("TERN_BENCH_BUILD_GIT").into(),
    );
    for pair in env!("TERN_BENCH_DEP_VERSIONS")
        .split(';')
        .filter(|s| !s.is_empty())
    {
        if let Some((k, ver)) = pair.split_once('=') {
            v.insert(k.into(), ver.into());
        }
    }
    v.insert("rustc".into(), env!("TERN_BENCH_RUSTC").into());
    v.insert("kernel".into(), read("/proc/sys/kernel/osrelease"));
    for (name, pkg) in [
        ("libudt", "libudt0"),
        ("libsrt", "libsrt1.5-openssl"),
        ("iproute2", "iproute2"),
    ] {
        if let Some(ver) = output(Command::new("dpkg-query").args(["-W", "-f", "${Version}", pkg]))
        {
            v.insert(name.into(), ver);
        }
    }
    v
}

/// Now, UTC, RFC 3339 (seconds).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    rfc3339(secs)
}

/// Seconds since the epoch as RFC 3339 UTC.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
