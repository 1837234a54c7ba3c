//! The built-in socket when the kernel refuses a send for a full buffer. It is registered
//! with the runtime for reading only (see `tern::socket::UdpSocket`), so this is the one path
//! where it must register for writing and wait: on loopback the buffer never fills (each
//! datagram's memory is returned as it is handed over), so the test puts a slow token-bucket
//! qdisc on the loopback of a network namespace of its own, which holds the datagrams
//! against the sender's buffer.
//!
//! Needs root and `ip netns`/`tc`; says SKIPPED otherwise.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tern::socket::{AsyncUdpSocket, Transmit, UdpSocket};

/// A network namespace removed when dropped.
struct Netns(String);

impl Netns {
    fn create() -> Option<Self> {
        let name = format!("tern-sndbuf-{}", std::process::id());
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !ok(&["netns", "add", &name]) {
            return None;
        }
        let ns = Self(name);
        ok(&["-n", &ns.0, "link", "set", "lo", "up"]).then_some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn a_full_send_buffer_waits_for_room_and_loses_nothing() {
    let Some(ns) = Netns::create() else {
        eprintln!("SKIPPED: cannot create a network namespace (not root?)");
        return;
    };
    let path = format!("/run/netns/{}", ns.0);
    let result = std::thread::spawn(move || {
        // This thread, and the sockets it makes, live in the namespace.
        let file = std::fs::File::open(&path).expect("the namespace's file");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(run())
    })
    .join();
    let (sent, received, waits) = match result {
        Ok(Some(r)) => r,
        Ok(None) => {
            eprintln!("SKIPPED: cannot shape the namespace's loopback (no tc?)");
            return;
        }
        Err(e) => std::panic::resume_unwind(e),
    };
    drop(ns);
    println!("sent {sent} datagrams, received {received}, send-buffer waits {waits}");
    assert!(
        waits > 0,
        "the send buffer never filled: the test tested nothing"
    );
    assert_eq!(received, sent, "datagrams lost");
}

/// Sends three send buffers' worth of 8 kB datagrams through the shaped loopback as fast as
/// the socket takes them; returns (sent, received, waits), or `None` if shaping failed.
async fn run() -> Option<(u64, u64, u64)> {
    const SIZE: usize = 8_000;
    let a = UdpSocket::bind("127.0.0.1:0".parse().expect("an address")).expect("bind");
    let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to: SocketAddr = b.local_addr().expect("an address");
    let count = (3 * a.send_buffer() / SIZE).max(100) as u64;
    // Drains in about a second.
    let mbit = (count * SIZE as u64 * 8 / 1_000_000).max(1);
    if !shape(mbit) {
        return None;
    }
    b.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        let mut n = 0u64;
        while let Ok(k) = b.recv(&mut buf) {
            assert_eq!(k, SIZE);
            n += 1;
        }
        n
    });
    let segments = a.max_transmit_segments().clamp(1, 8);
    let batch = vec![0x5a_u8; SIZE * segments];
    let mut sent = 0u64;
    while sent < count {
        let k = segments.min((count - sent) as usize);
        let t = Transmit {
            destination: to,
            src_ip: None,
            ecn: None,
            contents: &batch[..k * SIZE],
            segment_size: (k > 1).then_some(SIZE),
        };
        // A socket that waited for room without asking to be told of it would stall here.
        let send = std::future::poll_fn(|cx| a.poll_send(cx, &t));
        tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .expect("the send stalled: no wake-up when the buffer had room")
            .expect("a send");
        sent += k as u64;
    }
    let received = tokio::task::spawn_blocking(move || reader.join().expect("the reader"))
        .await
        .expect("join");
    Some((sent, received, a.send_buffer_waits()))
}

/// Puts a token bucket of `mbit` Mbit/s with a deep queue on this thread's namespace's
/// loopback (through `nsenter` on the thread's namespace file).
fn shape(mbit: u64) -> bool {
    let ns = format!(
        "/proc/{}/task/{}/ns/net",
        std::process::id(),
        nix::unistd::gettid()
    );
    Command::new("nsenter")
        .arg(format!("--net={ns}"))
        .args(["tc", "qdisc", "add", "dev", "lo", "root", "tbf"])
        .args([
            "rate",
            &format!("{mbit}mbit"),
            "burst",
            "64kb",
            "limit",
            "100mb",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}
