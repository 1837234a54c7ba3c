//! The event interface (F8), both ways: a stream of one connection's events, and up-calls an
//! endpoint runs for every event of every connection (SLTP's style, for servers that react
//! rather than await). Also the application-closed receive window of a handover (F7).
//!
//! ```sh
//! cargo run --release -p tern --example events
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tern::{Endpoint, Event, StaticKeypair};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Endpoint::server(
        "127.0.0.1:0".parse()?,
        StaticKeypair::generate(tern::entropy()),
    )?;
    let (addr, key) = (server.local_addr()?, server.public_key());

    // Up-calls: run on the endpoint's task, so they must be quick and must not block.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    server.on_event(move |conn, event| {
        if let Ok(mut log) = log.lock() {
            log.push(format!("{conn:?}: {event:?}"));
        }
    });

    let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
    let conn = client.connect(addr, Some(key)).await?;
    let mut events = conn.events(); // this connection's events, from now on
    let peer = server.accept().await.ok_or("no connection")?;

    // A handover: the server closes its receive window, the client's writes pause (nothing is
    // lost), and resume when the window reopens.
    peer.close_window(1, b"handover");
    let mut flow = conn.open_uni().await?;
    flow.write_all(b"sent while the window was closed").await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    peer.open_window();
    flow.finish()?;
    let mut incoming = peer.accept_uni().await?;
    let text = incoming.read_to_end(1 << 10).await?;
    println!("server read {:?}", String::from_utf8_lossy(&text));

    conn.close(0, b"bye");
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(2), events.next()).await {
        println!("client event: {event:?}");
        if matches!(event, Event::Drained) {
            break;
        }
    }
    server.wait_idle().await;
    for line in seen.lock().map_err(|_| "poisoned")?.iter() {
        println!("server up-call: {line}");
    }
    Ok(())
}
