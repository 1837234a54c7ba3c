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

/// The CPU flags a results file records: what AES-GCM's speed, and so tern's choice of
/// implementation, depends on.
const CRYPTO_FLAGS: [&str; 9] = [
    "aes",
    "pclmulqdq",
    "avx2",
    "vaes",
    "vpclmulqdq",
    "avx512f",
    "avx512dq",
    "avx512bw",
    "avx512vl",
];

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
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags"))
        .map(|r| {
            r.trim_start_matches([' ', '\t', ':'])
                .split_whitespace()
                .collect()
        })
        .unwrap_or_default();
    let cpu_flags = CRYPTO_FLAGS
        .iter()
        .filter(|f| flags.contains(f))
        .map(|f| f.to_string())
        .collect();
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
        cpu_flags,
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
    // tern picks its AES-GCM implementation by CPU; its speed depends on which.
    v.insert(
        "tern packet cipher".into(),
        tern_proto::crypto::packet_cipher().into(),
    );
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

/// The kernel's count of UDP datagrams dropped for a full socket receive buffer in one
/// network namespace: `RcvbufErrors` of the `Udp:` lines of its `/proc/net/snmp` text plus
/// `Udp6RcvbufErrors` of its `/proc/net/snmp6` text (pass `""` when IPv6 is off). `None` if
/// the IPv4 counter is not there.
pub fn udp_rcvbuf_errors(snmp: &str, snmp6: &str) -> Option<u64> {
    udp_counters(snmp, snmp6).map(|c| c.rcvbuf_errors)
}

/// The kernel's UDP error counters of one network namespace, IPv4 (`/proc/net/snmp`, `Udp:`
/// lines) and IPv6 (`/proc/net/snmp6`, `Udp6…`) added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpCounters {
    /// `RcvbufErrors`: datagrams dropped for a full socket receive buffer.
    pub rcvbuf_errors: u64,
    /// `SndbufErrors`: sends that failed for a full socket send buffer (or device queue).
    pub sndbuf_errors: u64,
    /// `InErrors`: datagrams received and dropped for any reason (it includes
    /// `RcvbufErrors` and checksum errors).
    pub in_errors: u64,
}

impl UdpCounters {
    /// `self − before`, counter by counter (0 if one went backwards).
    pub fn since(&self, before: &UdpCounters) -> UdpCounters {
        UdpCounters {
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(before.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(before.sndbuf_errors),
            in_errors: self.in_errors.saturating_sub(before.in_errors),
        }
    }

    /// Counter by counter.
    pub fn add(&self, o: &UdpCounters) -> UdpCounters {
        UdpCounters {
            rcvbuf_errors: self.rcvbuf_errors + o.rcvbuf_errors,
            sndbuf_errors: self.sndbuf_errors + o.sndbuf_errors,
            in_errors: self.in_errors + o.in_errors,
        }
    }
}

/// [`UdpCounters`] from the texts of `/proc/net/snmp` and `/proc/net/snmp6` (pass `""` when
/// IPv6 is off). `None` if the IPv4 `Udp:` lines are not there.
pub fn udp_counters(snmp: &str, snmp6: &str) -> Option<UdpCounters> {
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let header: Vec<&str> = udp.next()?.split_whitespace().collect();
    let values: Vec<&str> = udp.next()?.split_whitespace().collect();
    let v4 = |name: &str| -> Option<u64> {
        let column = header.iter().position(|h| *h == name)?;
        values.get(column)?.parse().ok()
    };
    let v6 = |name: &str| -> u64 {
        snmp6
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == name).then(|| f.next()?.parse::<u64>().ok())?
            })
            .unwrap_or(0)
    };
    Some(UdpCounters {
        rcvbuf_errors: v4("RcvbufErrors")? + v6("Udp6RcvbufErrors"),
        sndbuf_errors: v4("SndbufErrors").unwrap_or(0) + v6("Udp6SndbufErrors"),
        in_errors: v4("InErrors").unwrap_or(0) + v6("Udp6InErrors"),
    })
}

/// Datagrams the kernel dropped at the UDP sockets bound to local port `port` (the `drops`
/// column, the last, of `/proc/net/udp` and `/proc/net/udp6` texts: full receive buffer,
/// mostly). `None` if no socket has that port.
pub fn udp_socket_drops(tables: &[&str], port: u16) -> Option<u64> {
    let mut found = None;
    for table in tables {
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port != Some(port) || f.len() < 13 {
                continue;
            }
            if let Some(drops) = f.last().and_then(|d| d.parse::<u64>().ok()) {
                *found.get_or_insert(0) += drops;
            }
        }
    }
    found
}

/// [`udp_socket_drops`] of the namespace of process `pid` (`"self"` for this one), read from
/// `/proc/<pid>/net/udp` and `udp6`.
pub fn udp_socket_drops_of(pid: &str, port: u16) -> Option<u64> {
    let v4 = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).unwrap_or_default();
    let v6 = std::fs::read_to_string(format!("/proc/{pid}/net/udp6")).unwrap_or_default();
    udp_socket_drops(&[&v4, &v6], port)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rcvbuf_errors_are_read_from_the_udp_lines() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    Udp: 100 2 7 90 5 0\n\
                    UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    UdpLite: 0 0 0 0 9 0\n";
        let snmp6 = "Udp6InDatagrams                 \t40\n\
                     Udp6RcvbufErrors                \t3\n\
                     UdpLite6RcvbufErrors            \t8\n";
        assert_eq!(super::udp_rcvbuf_errors(snmp, ""), Some(5));
        assert_eq!(super::udp_rcvbuf_errors(snmp, snmp6), Some(8));
        assert_eq!(super::udp_rcvbuf_errors("Ip: 1\n", snmp6), None);
        let c = super::udp_counters(snmp, "Udp6InErrors \t2\nUdp6SndbufErrors 1\n").unwrap();
        assert_eq!(
            c,
            super::UdpCounters {
                rcvbuf_errors: 5,
                sndbuf_errors: 1,
                in_errors: 9
            }
        );
    }

    #[test]
    fn socket_drops_are_read_by_port() {
        let v4 = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  \x20 12: 0100007F:A1B2 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n\
                  \x20 13: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 4\n";
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  \x20 40: 00000000000000000000000001000000:A1B2 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4244 2 0000000000000000 1\n";
        assert_eq!(super::udp_socket_drops(&[v4, v6], 0xA1B2), Some(18));
        assert_eq!(super::udp_socket_drops(&[v4], 53), Some(4));
        assert_eq!(super::udp_socket_drops(&[v4, v6], 4433), None);
        // This process has no UDP socket on port 1.
        assert_eq!(super::udp_socket_drops_of("self", 1), None);
    }

    #[test]
    fn dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
