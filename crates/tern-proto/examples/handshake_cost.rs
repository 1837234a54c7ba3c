//! What a handshake costs each end in CPU, without sockets or a runtime: the Noise IK
//! messages alone, then whole connections through two core `Endpoint`s (connect, the two
//! flights, accept, close, release), without and with `Endpoint::prepare_handshake` called
//! (untimed) between connections, as a driver does while a message is in flight.
//! `cargo run --release -p tern-proto --example handshake_cost -- 2000`.

// The core never reads the clock; this example times it from outside.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tern_proto::crypto::{Handshake, HandshakePattern};
use tern_proto::{Endpoint, EndpointConfig, RetryPolicy, StaticKeypair};

fn per(d: Duration, n: u32) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(n)
}

fn noise(n: u32) {
    let server_key = StaticKeypair::generate([1; 32]);
    let client_key = StaticKeypair::generate([2; 32]);
    let known = server_key.public();
    let (mut client_t, mut server_t) = (Duration::ZERO, Duration::ZERO);
    for i in 0..n {
        let mut seed = [0u8; 32];
        seed[..4].copy_from_slice(&i.to_le_bytes());
        let (mut m, mut p) = (Vec::new(), Vec::new());
        let t = Instant::now();
        let mut client =
            Handshake::initiator(&client_key, Some(&known), b"p", seed).expect("initiator");
        client.write(b"hello", &mut m).expect("first message");
        client_t += t.elapsed();
        let t = Instant::now();
        seed[31] = 1;
        let mut server =
            Handshake::responder(&server_key, HandshakePattern::IK, b"p", seed).expect("responder");
        server.read(&m, &mut p).expect("first message read");
        m.clear();
        server.write(b"world", &mut m).expect("second message");
        let _ = server.split();
        server_t += t.elapsed();
        let t = Instant::now();
        client.read(&m, &mut p).expect("second message read");
        let _ = client.split();
        client_t += t.elapsed();
    }
    println!(
        "Noise IK alone: initiator {:.1} µs, responder {:.1} µs",
        per(client_t, n),
        per(server_t, n)
    );
}

fn endpoints(n: u32, prepare: bool) {
    let client_cfg = EndpointConfig::new(StaticKeypair::generate([1; 32]), [2; 32]);
    let mut server_cfg = EndpointConfig::new(StaticKeypair::generate([3; 32]), [4; 32]).server();
    server_cfg.retry = RetryPolicy::Never;
    server_cfg.handshakes_per_source = (f64::INFINITY, f64::INFINITY);
    let start = Instant::now();
    let mut client = Endpoint::new(client_cfg, start);
    let mut server = Endpoint::new(server_cfg, start);
    let (c, s): (SocketAddr, SocketAddr) = (
        "10.0.0.1:5000".parse().expect("addr"),
        "10.0.0.2:443".parse().expect("addr"),
    );
    let key = server.public_key();
    let (mut client_t, mut server_t) = (Duration::ZERO, Duration::ZERO);
    let mut buf = Vec::new();
    let mut datagrams = 0u64;
    let (mut client_ahead, mut server_ahead) = (Duration::ZERO, Duration::ZERO);
    for i in 0..n {
        let now = start + Duration::from_millis(u64::from(i));
        if prepare {
            let t = Instant::now();
            client.prepare_handshake();
            client_ahead += t.elapsed();
            let t = Instant::now();
            server.prepare_handshake();
            server_ahead += t.elapsed();
        }
        let t = Instant::now();
        let handle = client.connect(now, s, Some(key)).expect("connect");
        client_t += t.elapsed();
        let mut closed = false;
        loop {
            let mut progress = false;
            let t = Instant::now();
            buf.clear();
            let mut out = Vec::new();
            while let Some(tx) = client.poll_transmit(now, &mut buf) {
                out.push(buf[buf.len() - tx.size..].to_vec());
            }
            let mut established = false;
            while let Some((_, e)) = client.poll_event() {
                established |= matches!(e, tern_proto::Event::Connected);
            }
            if established && !closed {
                if let Some(conn) = client.connection_mut(handle) {
                    conn.close(now, 0, b"");
                }
                closed = true;
                progress = true;
            }
            client_t += t.elapsed();
            let t = Instant::now();
            for mut d in out.drain(..) {
                datagrams += 1;
                server.handle(now, c, None, &mut d);
                progress = true;
            }
            while let Some(h) = server.accept() {
                let _ = h;
            }
            while server.poll_event().is_some() {}
            buf.clear();
            while let Some(tx) = server.poll_transmit(now, &mut buf) {
                out.push(buf[buf.len() - tx.size..].to_vec());
            }
            server_t += t.elapsed();
            let t = Instant::now();
            for mut d in out.drain(..) {
                datagrams += 1;
                client.handle(now, s, None, &mut d);
                progress = true;
            }
            client_t += t.elapsed();
            if !progress {
                break;
            }
        }
        // Let both ends forget the connection (drain timers).
        let later = now + Duration::from_secs(5);
        let t = Instant::now();
        client.handle_timeout(later);
        while client.poll_event().is_some() {}
        client.release(handle);
        client_t += t.elapsed();
        let t = Instant::now();
        server.handle_timeout(later);
        while server.poll_event().is_some() {}
        server_t += t.elapsed();
    }
    println!(
        "Core endpoints, connect to close{}: client {:.1} µs, server {:.1} µs (prepared ahead: {:.1} / {:.1} µs), {:.2} datagrams; {} / {} connections left",
        if prepare { ", prepared ahead" } else { "" },
        per(client_t, n),
        per(server_t, n),
        per(client_ahead, n),
        per(server_ahead, n),
        datagrams as f64 / f64::from(n),
        client.connection_count(),
        server.connection_count(),
    );
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    noise(n);
    endpoints(n, false);
    endpoints(n, true);
}
