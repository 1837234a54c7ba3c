//! What a whole connection costs through the runtime: connect (Noise IK, one round trip),
//! close, again and again, with the client and server in this process on two threads, each
//! with its own runtime. The latency of `connect` and the CPU per connection of the process.
//!
//! ```sh
//! cargo run --release -p tern --example connect_cost -- 3000
//! # both ends on one CPU, one thread each: the CPU cost without cross-CPU wake-ups
//! RUNTIME=current taskset -c 0 target/release/examples/connect_cost 3000
//! ```
//!
//! Argument: connections (default 3000). `RUNTIME`: `multi` (two worker threads per end, the
//! default) or `current` (one thread per end). tern-bench's `scale` is the comparison with
//! quinn and TCP + TLS; this is the tool for looking at tern alone (e.g. under `perf`).

use std::time::Duration;

use tern::{Endpoint, EndpointConfig, StaticKeypair};
use tokio::runtime::{Builder, Runtime};
use tokio::time::Instant;

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

/// A benchmark's configuration: no per-source handshake limit (every connection comes from
/// one address), first-flight timestamps trusted from the start (the key is new).
fn config() -> EndpointConfig {
    let mut cfg = EndpointConfig::new(StaticKeypair::generate(tern::entropy()), tern::entropy());
    cfg.first_flight.trust_start = true;
    cfg.handshakes_per_source = (f64::INFINITY, f64::INFINITY);
    cfg
}

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        secs(u.user_time()) + secs(u.system_time())
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = std::env::args().nth(1).map_or(Ok(3000), |s| s.parse())?;
    let multi = std::env::var("RUNTIME").as_deref() != Ok("current");

    let server_rt = runtime(multi)?;
    let server = server_rt.block_on(async {
        Endpoint::bind(
            "127.0.0.1:0".parse().expect("an address"),
            config().server(),
        )
    })?;
    let (addr, key) = (server.local_addr()?, server.public_key());
    let server_thread = std::thread::spawn(move || {
        server_rt.block_on(async move {
            // Hold each connection until the client closes it, as a server does.
            while let Some(conn) = server.accept().await {
                tokio::spawn(async move {
                    conn.closed().await;
                });
            }
        })
    });

    let client_rt = runtime(multi)?;
    let (latencies, elapsed, cpu) = client_rt.block_on(async move {
        let client = Endpoint::bind("127.0.0.1:0".parse().expect("an address"), config())?;
        for _ in 0..100 {
            client.connect(addr, Some(key)).await?.close(0, b""); // warm-up
        }
        let (start, cpu) = (Instant::now(), cpu_seconds());
        let mut latencies = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            let conn = client.connect(addr, Some(key)).await?;
            latencies.push(t.elapsed());
            conn.close(0, b"");
        }
        let (elapsed, cpu) = (start.elapsed(), cpu_seconds() - cpu);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, Box<dyn std::error::Error>>((latencies, elapsed, cpu))
    })?;
    drop(server_thread);

    let mut latencies = latencies;
    latencies.sort();
    println!(
        "{count} connections ({} runtime): {:.0} per second; connect median {:?}, p99 {:?}; \
         CPU of both ends {:.0} µs per connection",
        if multi {
            "multi-thread"
        } else {
            "current-thread"
        },
        count as f64 / elapsed.as_secs_f64(),
        latencies[count / 2],
        latencies[count * 99 / 100],
        cpu * 1e6 / count as f64,
    );
    Ok(())
}
