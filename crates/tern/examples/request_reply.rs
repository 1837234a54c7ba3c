//! Request/reply with deadlines over one connection, the MAR pattern: 30 "frames" a second
//! to an edge server, each to be answered within 100 ms or given up.
//!
//! ```sh
//! cargo run --release -p tern --example request_reply
//! ```
//!
//! No flow per request: each request is a message with a deadline and a priority, matched to
//! its reply. The server sees how long the requester will still wait (`Message::deadline`)
//! and answers with the time left; a reply that comes too late is dropped, and the client
//! gets `RequestError::Expired` instead.

use std::time::Duration;

use bytes::Bytes;
use tern::{Endpoint, MessageOptions, RequestError, StaticKeypair};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Endpoint::server(
        "127.0.0.1:0".parse()?,
        StaticKeypair::generate(tern::entropy()),
    )?;
    let (addr, key) = (server.local_addr()?, server.public_key());
    tokio::spawn(async move {
        let Some(conn) = server.accept().await else {
            return;
        };
        while let Ok(request) = conn.recv_message().await {
            // Every tenth "frame" takes too long to process.
            let slow = request.data.first() == Some(&9);
            let conn = conn.clone();
            tokio::spawn(async move {
                if slow {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                let boxes = Bytes::from_static(b"3 bounding boxes");
                // Answer within what the requester still waits, when it said.
                let mut opts = MessageOptions::default().priority(6);
                if let Some(deadline) = request.deadline {
                    let left =
                        deadline.saturating_duration_since(tokio::time::Instant::now().into());
                    opts = opts.deadline(left);
                }
                let _ = conn.reply(request.id, boxes, opts);
            });
        }
    });

    let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
    let conn = client.connect(addr, Some(key)).await?;
    let opts = MessageOptions::default()
        .unordered()
        .priority(6)
        .deadline(Duration::from_millis(100));
    let (mut answered, mut expired) = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_millis(33));
    for i in 0..30u8 {
        tick.tick().await;
        let frame = Bytes::from(vec![i % 10; 4_500 + usize::from(i) * 1_000]);
        match conn.request(frame, opts).await {
            Ok(reply) => {
                answered += 1;
                assert_eq!(&reply.data[..], b"3 bounding boxes");
            }
            Err(RequestError::Expired) => expired += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!("{answered} frames answered within 100 ms, {expired} given up at their deadline");
    conn.close(0, b"");
    conn.closed().await;
    Ok(())
}
