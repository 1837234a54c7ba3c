//! What packet protection costs on this CPU with each AES-256-GCM implementation tern links
//! (ring's and aws-lc-rs's): sealing and opening in place, one core, at the datagram sizes
//! tern sends (the 1 200-byte floor, a 1 500-byte MTU's 1 452, loopback's 8 972), and which
//! one this process picked (`crypto::packet_cipher`).
//! `cargo run --release -p tern-proto --example aead_cost -- [SECONDS_PER_CASE]`.

// The core never reads the clock; this example times it from outside.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use tern_proto::crypto::{packet_cipher, Cipher, PacketKey};

/// GB/s of plaintext that `op` gets through in `span`, called on one `size`-byte payload.
fn rate(span: Duration, size: usize, mut op: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < span {
        for _ in 0..64 {
            op(n);
            n += 1;
        }
    }
    n as f64 * size as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.5);
    let span = Duration::from_secs_f64(seconds);
    let header = [0x40u8; 20];
    println!("this process protects packets with {}", packet_cipher());
    println!("size     cipher      seal GB/s  open GB/s");
    for size in [1200usize, 1452, 8972] {
        for cipher in [Cipher::Ring, Cipher::AwsLc] {
            let key = PacketKey::with_cipher(cipher, &[7; 32]);
            let mut buf = vec![0x5au8; size];
            let seal = rate(span, size, |pn| {
                key.seal_in_place(0, pn, &header, &mut buf)
                    .expect("sealing works");
            });
            // One sealed packet, opened again and again from a fresh copy (the copy is counted:
            // a receiver's datagram arrives in a buffer too).
            let mut sealed = vec![0x5au8; size];
            let tag = key
                .seal_in_place(0, 1, &header, &mut sealed)
                .expect("sealing works");
            sealed.extend_from_slice(&tag);
            let mut work = sealed.clone();
            let open = rate(span, size, |_| {
                work.copy_from_slice(&sealed);
                let len = key.open(0, 1, &header, &mut work);
                assert_eq!(len, Some(size), "a sealed packet opens");
            });
            println!("{size:<8} {:<11} {seal:>9.2}  {open:>9.2}", cipher.name());
        }
    }
}
