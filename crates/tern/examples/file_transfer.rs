//! Sends a file (or 8 MiB of generated data) over one flow and checks it arrived intact.
//!
//! ```sh
//! cargo run --release -p tern --example file_transfer [PATH]
//! ```
//!
//! A server and a client in one process on 127.0.0.1: the client opens a one-way flow, writes
//! the file's name and bytes, finishes the flow and waits until every byte is acknowledged;
//! the server reads the flow to its end and compares a checksum. Shows `open_uni`,
//! `write_all`, `finish`/`finished`, `accept_uni`, `read_chunk` (no copy) and closing an
//! endpoint gracefully.

use tokio::time::Instant;

use tern::{Endpoint, StaticKeypair};

fn checksum(data: &[u8]) -> u64 {
    // FNV-1a: enough to show the bytes arrived in order (use SHA-256 for real files).
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = match std::env::args().nth(1) {
        Some(path) => std::fs::read(path)?,
        None => (0..8u32 << 20).map(|i| (i % 251) as u8).collect(),
    };
    let expected = checksum(&data);

    let server = Endpoint::server(
        "127.0.0.1:0".parse()?,
        StaticKeypair::generate(tern::entropy()),
    )?;
    let (addr, key) = (server.local_addr()?, server.public_key());
    let receiver = tokio::spawn(async move {
        let conn = server.accept().await.ok_or("no connection")?;
        let mut flow = conn.accept_uni().await?;
        let mut received = Vec::new();
        while let Some(chunk) = flow.read_chunk(1 << 20).await? {
            received.extend_from_slice(&chunk);
        }
        server.close(0, b"done");
        server.wait_idle().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(received)
    });

    let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
    let started = Instant::now();
    let conn = client.connect(addr, Some(key)).await?; // Noise IK: one round trip
    let mut flow = conn.open_uni().await?;
    flow.write_all(&data).await?;
    flow.finish()?;
    flow.finished().await?; // every byte acknowledged
    let took = started.elapsed();

    let received = receiver.await?.map_err(|e| e.to_string())?;
    assert_eq!(checksum(&received), expected, "the file arrived damaged");
    println!(
        "{} bytes in {:.1} ms ({:.0} Mbit/s), checksum {expected:016x} verified; {} packets lost",
        data.len(),
        took.as_secs_f64() * 1e3,
        data.len() as f64 * 8.0 / took.as_secs_f64() / 1e6,
        conn.stats().packets_lost,
    );
    Ok(())
}
