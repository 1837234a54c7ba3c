//! Small measurement tools run inside the namespaces (as `tern-netem probe …`) to check the
//! emulator with real sockets: UDP echo and ping (round-trip time), a paced UDP sender and a
//! counting receiver (loss, one-way delay, delivered rate), and a TCP sender and sink
//! (goodput). Every tool has a bounded lifetime and prints one line of `key=value` pairs.
//!
//! One-way delays use the wall clock in both processes; that is sound here because sender and
//! receiver run on the same machine (network namespaces share the clock).

// Measurement tools read the real clock by design.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::socket::{setsockopt, sockopt};

/// A tool's result: named figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report(pub BTreeMap<String, f64>);

impl Report {
    fn set(&mut self, key: &str, value: f64) {
        self.0.insert(key.to_owned(), value);
    }

    /// A figure, if present.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.get(key).copied()
    }

    /// Parses the `key=value …` line printed by [`Report::line`].
    pub fn parse(line: &str) -> Self {
        Self(
            line.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
                .collect(),
        )
    }

    /// `key=value …` on one line.
    pub fn line(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.0 {
            if !s.is_empty() {
                s.push(' ');
            }
            if v.fract() == 0.0 && v.abs() < 1e15 {
                let _ = write!(s, "{k}={v:.0}");
            } else {
                let _ = write!(s, "{k}={v:.4}");
            }
        }
        s
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Adds min, mean, p50, p99 and max of `samples_ms` under `prefix_*_ms`.
fn summarize(report: &mut Report, prefix: &str, samples_ms: &mut [f64]) {
    if samples_ms.is_empty() {
        return;
    }
    samples_ms.sort_by(f64::total_cmp);
    let n = samples_ms.len();
    let pct = |p: f64| samples_ms[((n as f64 - 1.0) * p).round() as usize];
    report.set(&format!("{prefix}_min_ms"), samples_ms[0]);
    report.set(
        &format!("{prefix}_mean_ms"),
        samples_ms.iter().sum::<f64>() / n as f64,
    );
    report.set(&format!("{prefix}_p50_ms"), pct(0.5));
    report.set(&format!("{prefix}_p99_ms"), pct(0.99));
    report.set(&format!("{prefix}_max_ms"), samples_ms[n - 1]);
}

/// Tells the parent the socket is bound.
fn ready() {
    println!("ready");
    let _ = io::stdout().flush();
}

/// Echoes every UDP datagram back to its sender until `max` has passed.
pub fn udp_echo(bind: SocketAddr, max: Duration) -> io::Result<Report> {
    let sock = UdpSocket::bind(bind)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    ready();
    let start = Instant::now();
    let mut buf = vec![0u8; 65_536];
    let mut echoed = 0u64;
    while start.elapsed() < max {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                sock.send_to(&buf[..n], from)?;
                echoed += 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut r = Report::default();
    r.set("echoed", echoed as f64);
    Ok(r)
}

/// Sends `count` datagrams of `size` bytes every `interval` to an echo server and measures
/// round-trip times; waits up to `timeout` after the last for stragglers.
pub fn udp_ping(
    to: SocketAddr,
    count: u64,
    interval: Duration,
    size: usize,
    timeout: Duration,
) -> io::Result<Report> {
    let sock = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    sock.connect(to)?;
    let size = size.max(8);
    let mut sent_at: Vec<Option<Instant>> = vec![None; count as usize];
    let mut rtts = Vec::new();
    let mut buf = vec![0u8; 65_536];
    let mut payload = vec![0u8; size];
    let start = Instant::now();
    let mut receive_until = |deadline: Instant,
                             rtts: &mut Vec<f64>,
                             sent_at: &mut [Option<Instant>]|
     -> io::Result<()> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            sock.set_read_timeout(Some(deadline - now))?;
            match sock.recv(&mut buf) {
                Ok(n) if n >= 8 => {
                    let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or([0; 8]));
                    if let Some(Some(t)) = sent_at.get_mut(seq as usize).map(Option::take) {
                        rtts.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                // An ICMP error from an earlier datagram: keep going.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::NetworkUnreachable
                            | io::ErrorKind::HostUnreachable
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    };
    let mut send_errors = 0u64;
    for seq in 0..count {
        payload[..8].copy_from_slice(&seq.to_be_bytes());
        sent_at[seq as usize] = Some(Instant::now());
        // A failed send (no route, e.g. while the host's address changes) counts as lost.
        if sock.send(&payload).is_err() {
            send_errors += 1;
        }
        receive_until(start + interval * (seq as u32 + 1), &mut rtts, &mut sent_at)?;
    }
    let deadline = Instant::now() + timeout;
    while rtts.len() < count as usize && Instant::now() < deadline {
        receive_until(
            (Instant::now() + Duration::from_millis(50)).min(deadline),
            &mut rtts,
            &mut sent_at,
        )?;
    }
    let mut r = Report::default();
    r.set("sent", count as f64);
    r.set("send_errors", send_errors as f64);
    r.set("received", rtts.len() as f64);
    summarize(&mut r, "rtt", &mut rtts);
    Ok(r)
}

/// Sends `count` datagrams of `size` bytes (at least 16: sequence number and send time) at
/// `pps` packets per second (0 = as fast as possible), from `from` if given (which picks the
/// path on a multihomed host).
pub fn udp_send(
    to: SocketAddr,
    from: Option<SocketAddr>,
    count: u64,
    size: usize,
    pps: f64,
) -> io::Result<Report> {
    let sock = UdpSocket::bind(from.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))))?;
    sock.connect(to)?;
    let _ = setsockopt(&sock, sockopt::SndBuf, &(4 << 20));
    let mut payload = vec![0u8; size.max(16)];
    let start = Instant::now();
    let mut sent = 0u64;
    let mut errors = 0u64;
    for seq in 0..count {
        if pps > 0.0 {
            let due = start + Duration::from_secs_f64(seq as f64 / pps);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        payload[..8].copy_from_slice(&seq.to_be_bytes());
        payload[8..16].copy_from_slice(&unix_ns().to_be_bytes());
        match sock.send(&payload) {
            Ok(_) => sent += 1,
            // Local queue full or an ICMP error: count and carry on.
            Err(_) => errors += 1,
        }
    }
    let mut r = Report::default();
    r.set("sent", sent as f64);
    r.set("errors", errors as f64);
    r.set("secs", start.elapsed().as_secs_f64());
    Ok(r)
}

/// Counts the datagrams of [`udp_send`]: stops `idle` after the last one (once one has
/// arrived) or after `max`. Reports counts, delivered bytes (UDP payload and IP), the receive
/// window, one-way delays, and `reordered`: datagrams that arrived after one with a higher
/// sequence number.
pub fn udp_recv(bind: SocketAddr, max: Duration, idle: Duration) -> io::Result<Report> {
    let sock = UdpSocket::bind(bind)?;
    let _ = setsockopt(&sock, sockopt::RcvBuf, &(8 << 20));
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    ready();
    let start = Instant::now();
    let mut buf = vec![0u8; 65_536];
    let (mut received, mut bytes, mut max_seq, mut reordered) = (0u64, 0u64, 0u64, 0u64);
    let (mut first, mut last) = (0u64, 0u64);
    let mut last_at = None::<Instant>;
    let mut owd = Vec::new();
    loop {
        if start.elapsed() > max || last_at.is_some_and(|t| t.elapsed() > idle) {
            break;
        }
        match sock.recv(&mut buf) {
            Ok(n) => {
                let now_ns = unix_ns();
                last_at = Some(Instant::now());
                received += 1;
                bytes += n as u64;
                if first == 0 {
                    first = now_ns;
                }
                last = now_ns;
                if n >= 16 {
                    let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or([0; 8]));
                    let sent = u64::from_be_bytes(buf[8..16].try_into().unwrap_or([0; 8]));
                    if received > 1 && seq < max_seq {
                        reordered += 1;
                    }
                    max_seq = max_seq.max(seq);
                    owd.push(now_ns.saturating_sub(sent) as f64 / 1e6);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut r = Report::default();
    r.set("received", received as f64);
    r.set("bytes", bytes as f64);
    r.set("ip_bytes", (bytes + 28 * received) as f64);
    r.set("max_seq", max_seq as f64);
    r.set("reordered", reordered as f64);
    r.set("first_unix_ms", first as f64 / 1e6);
    r.set("last_unix_ms", last as f64 / 1e6);
    r.set("secs", last.saturating_sub(first) as f64 / 1e9);
    summarize(&mut r, "owd", &mut owd);
    Ok(r)
}

/// Accepts one TCP connection and reads until EOF or `max`. Reports bytes, the time from first
/// to last byte, goodput over that time, and `steady_mbit`: goodput after the first `warmup`.
pub fn tcp_sink(bind: SocketAddr, max: Duration, warmup: Duration) -> io::Result<Report> {
    let listener = TcpListener::bind(bind)?;
    ready();
    let start = Instant::now();
    listener.set_nonblocking(true)?;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if start.elapsed() > max {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no connection"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    let mut first = None::<Instant>;
    let mut last = None::<Instant>;
    let mut at_warmup = None::<(Instant, u64)>;
    while start.elapsed() < max {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let now = Instant::now();
                let f = *first.get_or_insert(now);
                if at_warmup.is_none() && now - f >= warmup {
                    at_warmup = Some((now, bytes));
                }
                bytes += n as u64;
                last = Some(now);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut r = Report::default();
    r.set("bytes", bytes as f64);
    if let (Some(f), Some(l)) = (first, last) {
        let secs = (l - f).as_secs_f64();
        r.set("secs", secs);
        if secs > 0.0 {
            r.set("goodput_mbit", bytes as f64 * 8.0 / secs / 1e6);
        }
        if let Some((t, b)) = at_warmup {
            let s = (l - t).as_secs_f64();
            if s > 0.0 {
                r.set("steady_mbit", (bytes - b) as f64 * 8.0 / s / 1e6);
                r.set("steady_secs", s);
            }
        }
    }
    Ok(r)
}

/// Connects and writes as fast as TCP allows for `secs`, then closes. `cc` picks the
/// congestion controller (`cubic`, `bbr`, `reno`), else the system default.
pub fn tcp_send(to: SocketAddr, secs: Duration, cc: Option<&str>) -> io::Result<Report> {
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
    if let Some(cc) = cc {
        setsockopt(&stream, sockopt::TcpCongestion, &cc.into())
            .map_err(|e| io::Error::other(format!("congestion control {cc}: {e}")))?;
    }
    let chunk = vec![0x5au8; 64 * 1024];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < secs {
        stream.write_all(&chunk)?;
        bytes += chunk.len() as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    // Wait for the peer to close so every byte is delivered before we report.
    let mut sink = [0u8; 64];
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = stream.read(&mut sink);
    let mut r = Report::default();
    r.set("bytes", bytes as f64);
    r.set("secs", start.elapsed().as_secs_f64());
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips() {
        let mut r = Report::default();
        r.set("sent", 100.0);
        r.set("rtt_mean_ms", 40.125);
        let line = r.line();
        assert_eq!(line, "rtt_mean_ms=40.1250 sent=100");
        assert_eq!(Report::parse(&line), r);
    }

    #[test]
    fn loopback_udp_send_and_receive() {
        let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let probe = UdpSocket::bind(bind).unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let rx = std::thread::spawn(move || {
            udp_recv(addr, Duration::from_secs(5), Duration::from_millis(300)).unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        let tx = udp_send(addr, None, 200, 100, 10_000.0).unwrap();
        let got = rx.join().unwrap();
        assert_eq!(tx.get("sent"), Some(200.0));
        assert_eq!(got.get("received"), Some(200.0));
        assert_eq!(got.get("max_seq"), Some(199.0));
    }
}
