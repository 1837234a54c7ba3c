//! What a peer can make the runtime hold for an application that does not read (issue 13),
//! over real loopback UDP sockets: messages wait in the protocol core, holding their share of
//! the connection window, so the sender is stopped by flow control instead of the receiver
//! buffering whatever it sends; replies still reach their requests past unread messages.

use std::time::Duration;

use bytes::Bytes;
use tern::{Endpoint, MessageOptions, StaticKeypair, MESSAGE_CREDIT_OVERHEAD};

const WINDOW: u64 = 256 * 1024;
const COUNT: usize = 1000;
const SIZE: usize = 2000;

/// Message `i`: its index in the first 8 bytes, then a pattern of it.
fn body(i: usize) -> Bytes {
    let mut b = vec![(i % 251) as u8; SIZE + i % 13];
    b[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(b)
}

#[tokio::test]
async fn an_application_that_does_not_read_stops_the_sender_by_flow_control() {
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .configure(|c| c.connection.flows.connection_window = WINDOW)
        .build()
        .unwrap();
    let client = Endpoint::client(StaticKeypair::generate(tern::entropy())).unwrap();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let accept = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        (server, conn)
    });
    let client_conn = client.connect(addr, Some(key)).await.unwrap();
    let (_server, conn) = accept.await.unwrap();

    // 1. A few messages the server does not read yet, then a request of the server's: its
    //    reply comes after them and still reaches the request.
    for i in 0..3 {
        client_conn
            .send_message(Bytes::from(format!("hello {i}")), MessageOptions::default())
            .unwrap();
    }
    let answering = client_conn.clone();
    let answerer = tokio::spawn(async move {
        let m = answering.recv_message().await.unwrap();
        answering
            .reply(m.id, Bytes::from_static(b"pong"), MessageOptions::default())
            .unwrap();
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while conn.stats().messages_buffered < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the three messages arrive");
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        conn.request(Bytes::from_static(b"ping"), MessageOptions::default()),
    )
    .await
    .expect("the reply passes the unread messages")
    .unwrap();
    assert_eq!(&reply.data[..], b"pong");
    answerer.await.unwrap();
    assert_eq!(
        conn.stats().messages_buffered,
        3,
        "the reply is not among them"
    );

    // 2. A flood far larger than the window, which the server does not read.
    for i in 0..COUNT {
        client_conn
            .send_message(body(i), MessageOptions::default())
            .unwrap();
    }
    let cost = SIZE as u64 + 13 + MESSAGE_CREDIT_OVERHEAD;
    tokio::time::timeout(Duration::from_secs(20), async {
        // Filled: less than one more message's credit left.
        while conn.stats().recv_credit_used + cost <= WINDOW {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the window fills");
    // Give the sender time to (wrongly) send more, then check nothing went past the window.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = conn.stats();
    assert!(stats.recv_credit_used <= WINDOW, "{stats:?}");
    assert!(
        stats.message_bytes_buffered + stats.messages_buffered * MESSAGE_CREDIT_OVERHEAD <= WINDOW,
        "{stats:?}"
    );
    let held = stats.messages_buffered as usize;
    assert!(held < COUNT / 4, "{held} messages held");
    let outstanding = client_conn.outstanding_messages();
    assert!(
        outstanding >= COUNT + 3 - held,
        "the sender is held back: {outstanding} outstanding, {held} held"
    );

    // 3. The application reads: everything arrives intact and in order.
    for i in 0..3 {
        let m = conn.recv_message().await.unwrap();
        assert_eq!(m.data, Bytes::from(format!("hello {i}")));
    }
    for i in 0..COUNT {
        let m = tokio::time::timeout(Duration::from_secs(20), conn.recv_message())
            .await
            .unwrap_or_else(|_| panic!("message {i} never came"))
            .unwrap();
        assert_eq!(m.data, body(i), "message {i}");
        assert!(conn.stats().recv_credit_used <= WINDOW);
    }
    assert_eq!(conn.stats().messages_buffered, 0);
}
