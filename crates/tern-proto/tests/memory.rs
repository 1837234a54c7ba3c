//! What an idle connection costs in memory on each end: heap bytes counted by a global
//! allocator around 2 000 handshakes (deterministic, no timing). DESIGN.md §4 `scale`
//! asks ≤ 8 KiB per idle connection, runtime included (measured as RSS by
//! `tern-bench run scale`); the core's share must stay under 7 KiB per end. What it was and
//! what took it there: 20 kB per end before (a whole `Connection` per table slot with the
//! table doubling, a copied configuration, a 2 kB scratch buffer, the Noise state, the
//! next and previous AES-GCM keys expanded in advance, eight empty message queues per
//! priority kind, an emptied sent-packet map's root node, a ChaCha generator per
//! connection).
//!
//! The global allocator sees Rust's allocations only; where packets are protected by
//! aws-lc-rs (crypto/packet.rs picks it or ring per CPU) the keys live in C (an AES-256-GCM
//! packet key is about 630 B of RSS, and a connection holds two), where by ring they are
//! boxed on the Rust heap (about the same size). On glibc the
//! test also reads malloc's own counters (`mallinfo2`), which see both and each
//! allocation's header, and holds that figure to 6.75 KiB per end (7.2 kB at first; 6.4 kB
//! since the counters-only statistics and the replay bitmap made on a path's 128th packet
//! number), so that the runtime's few hundred bytes still fit in the goal's 8 KiB.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use tern_proto::{Endpoint, EndpointConfig, RetryPolicy, StaticKeypair};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Bytes malloc has handed out and not taken back, C allocations included (glibc).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_in_use() -> Option<isize> {
    // SAFETY: mallinfo2 reads allocator statistics; it takes no arguments and has no
    // preconditions.
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    Some((info.uordblks + info.hblkhd) as isize)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_in_use() -> Option<isize> {
    None
}

#[test]
fn an_idle_connection_holds_little_memory_on_each_end() {
    let client_cfg = EndpointConfig::new(StaticKeypair::generate([1; 32]), [2; 32]);
    let mut server_cfg = EndpointConfig::new(StaticKeypair::generate([3; 32]), [4; 32]).server();
    server_cfg.retry = RetryPolicy::Never;
    server_cfg.handshakes_per_source = (f64::INFINITY, f64::INFINITY);
    #[allow(clippy::disallowed_methods)] // An arbitrary epoch: only offsets matter.
    let now = Instant::now();
    let mut client = Endpoint::new(client_cfg, now);
    let mut server = Endpoint::new(server_cfg, now);
    let (c, s): (SocketAddr, SocketAddr) = (
        "10.0.0.1:5000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    let key = server.public_key();
    let mut buf = Vec::new();
    let mut run = |client: &mut Endpoint, server: &mut Endpoint| loop {
        let mut progress = false;
        buf.clear();
        while let Some(t) = client.poll_transmit(now, &mut buf) {
            let mut d = buf[buf.len() - t.size..].to_vec();
            server.handle(now, c, None, &mut d);
            progress = true;
        }
        buf.clear();
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            let mut d = buf[buf.len() - t.size..].to_vec();
            client.handle(now, s, None, &mut d);
            progress = true;
        }
        while client.poll_event().is_some() {}
        while server.poll_event().is_some() {}
        while server.accept().is_some() {}
        if !progress {
            break;
        }
    };
    // Warm up the endpoints' own tables, then count.
    for _ in 0..100 {
        client.connect(now, s, Some(key)).unwrap();
        run(&mut client, &mut server);
    }
    const N: usize = 2000;
    let before = live();
    let malloc_before = malloc_in_use();
    for _ in 0..N {
        client.connect(now, s, Some(key)).unwrap();
        run(&mut client, &mut server);
    }
    // A second later: delayed ACKs have gone out, nothing is in flight.
    let later = now + std::time::Duration::from_secs(1);
    for _ in 0..10 {
        client.handle_timeout(later);
        server.handle_timeout(later);
        let mut out = Vec::new();
        while let Some(t) = client.poll_transmit(later, &mut out) {
            let mut d = out[out.len() - t.size..].to_vec();
            server.handle(later, c, None, &mut d);
        }
        out.clear();
        while let Some(t) = server.poll_transmit(later, &mut out) {
            let mut d = out[out.len() - t.size..].to_vec();
            client.handle(later, s, None, &mut d);
        }
        while client.poll_event().is_some() {}
        while server.poll_event().is_some() {}
    }
    let per_pair = (live() - before) as f64 / N as f64;
    let malloc_per_pair = malloc_before
        .zip(malloc_in_use())
        .map(|(b, a)| (a - b) as f64 / N as f64);
    assert_eq!(server.connection_count(), N + 100);
    eprintln!(
        "heap per idle connection, client + server: {per_pair:.0} B (Rust), {malloc_per_pair:.0?} B (malloc, C included); `Connection` is {} B",
        std::mem::size_of::<tern_proto::Connection>()
    );
    assert!(
        per_pair / 2.0 <= 7.0 * 1024.0,
        "{:.0} B per end, {per_pair:.0} B for both",
        per_pair / 2.0
    );
    if let Some(m) = malloc_per_pair {
        assert!(
            m >= per_pair,
            "malloc counts what Rust allocates: {m:.0} < {per_pair:.0} B"
        );
        assert!(
            m / 2.0 <= 6.75 * 1024.0,
            "{:.0} B per end by malloc's count, {m:.0} B for both",
            m / 2.0
        );
    }
}
