//! What one small request and its reply cost: round-trip time, CPU and datagrams each way,
//! client and server in this process on two threads, each with its own runtime.
//!
//! ```sh
//! cargo run --release -p tern --example request_cost -- 64 5000
//! # the CPU cost alone, without the host's cross-CPU wake-ups: one CPU, one thread each
//! RUNTIME=current taskset -c 0 target/release/examples/request_cost 64 5000
//! ```
//!
//! Arguments: request size in bytes (default 64), round trips (default 5000). `RUNTIME`:
//! `multi` (two worker threads per end, the default) or `current` (one thread per end).
//! tern-bench's `echo-sizes` is the comparison with TCP and QUIC; this is the tool for
//! looking at tern alone (e.g. under `perf`).

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use tern::{Endpoint, MessageOptions, StaticKeypair};
use tokio::runtime::{Builder, Runtime};

fn runtime(multi: bool) -> std::io::Result<Runtime> {
    if multi {
        Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        Builder::new_current_thread().enable_all().build()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let count: usize = args.next().map_or(Ok(5000), |s| s.parse())?;
    let multi = std::env::var("RUNTIME").as_deref() != Ok("current");

    let server_rt = runtime(multi)?;
    let server = server_rt.block_on(async {
        Endpoint::server(
            "127.0.0.1:0".parse().expect("an address"),
            StaticKeypair::generate(tern::entropy()),
        )
    })?;
    let (addr, key) = (server.local_addr()?, server.public_key());
    let server_thread = std::thread::spawn(move || {
        server_rt.block_on(async move {
            let conn = server.accept().await?;
            // Echo every request back as its reply, from the connection's own task.
            while let Ok(m) = conn.recv_message().await {
                let opts = MessageOptions::default().unordered();
                if conn.reply(m.id, m.data, opts).is_err() {
                    break;
                }
            }
            Some(conn.stats())
        })
    });

    let client_rt = runtime(multi)?;
    let (rtts, sent, received, elapsed) = client_rt.block_on(async move {
        let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
        let conn = client.connect(addr, Some(key)).await?;
        let msg = Bytes::from(vec![0x5a; size]);
        let opts = MessageOptions::default().unordered();
        for _ in 0..100 {
            conn.request(msg.clone(), opts).await?; // warm-up: window, RTT, ACK frequency
        }
        let before = conn.stats();
        let start = Instant::now();
        let mut rtts = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            conn.request(msg.clone(), opts).await?;
            rtts.push(t.elapsed());
        }
        let elapsed = start.elapsed();
        let after = conn.stats();
        conn.close(0, b"done");
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, Box<dyn std::error::Error>>((
            rtts,
            after.datagrams_sent - before.datagrams_sent,
            after.datagrams_received - before.datagrams_received,
            elapsed,
        ))
    })?;
    let _ = server_thread.join();

    let mut rtts = rtts;
    rtts.sort();
    let per = |n: u64| n as f64 / count as f64;
    println!(
        "{size} B × {count} ({} runtime): median {:?}, p99 {:?}, mean {:?}; \
         datagrams per round trip: {:.2} out, {:.2} back",
        if multi {
            "multi-thread"
        } else {
            "current-thread"
        },
        rtts[count / 2],
        rtts[count * 99 / 100],
        elapsed / count as u32,
        per(sent),
        per(received),
    );
    Ok(())
}
