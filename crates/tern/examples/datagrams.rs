//! Unreliable datagrams (F6) for RTP-like media: congestion-controlled, never retransmitted,
//! delivered in whatever order they arrive, beside reliable flows on the same connection.
//!
//! ```sh
//! cargo run --release -p tern --example datagrams
//! ```

use std::time::Duration;

use bytes::Bytes;
use tern::{DatagramError, Endpoint, StaticKeypair};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Endpoint::server(
        "127.0.0.1:0".parse()?,
        StaticKeypair::generate(tern::entropy()),
    )?;
    let (addr, key) = (server.local_addr()?, server.public_key());
    let receiver = tokio::spawn(async move {
        let conn = server.accept().await.expect("a client");
        let mut got = Vec::new();
        // Stop when nothing came for 200 ms: datagrams may be lost, so never wait for all.
        while let Ok(Ok(d)) =
            tokio::time::timeout(Duration::from_millis(200), conn.recv_datagram()).await
        {
            got.push(u32::from_be_bytes(
                d[..4].try_into().expect("4-byte sequence"),
            ));
        }
        got
    });

    let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
    let conn = client.connect(addr, Some(key)).await?;
    let max = conn
        .max_datagram_payload()
        .ok_or("the peer does not take datagrams")?;
    println!("largest datagram this path carries: {max} bytes");
    // A datagram larger than the path carries is refused, not fragmented.
    match conn.send_datagram(Bytes::from(vec![0u8; max + 1])) {
        Err(DatagramError::TooLarge { .. }) => println!("an oversized datagram is refused"),
        other => println!("unexpected: {other:?}"),
    }
    for seq in 0..200u32 {
        let mut packet = seq.to_be_bytes().to_vec();
        packet.resize(1_000, 0); // a 1 kB media packet
        if let Err(e) = conn.send_datagram(Bytes::from(packet)) {
            // A full send queue drops the oldest datagram: that is what media wants.
            println!("datagram {seq}: {e}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let got = receiver.await?;
    let in_order = got.windows(2).filter(|w| w[0] < w[1]).count() + 1;
    println!(
        "{} of 200 datagrams arrived ({in_order} in order); stats: {} sent, {} dropped from the queue",
        got.len(),
        conn.stats().datagrams_sent,
        conn.stats().datagrams_dropped
    );
    Ok(())
}
