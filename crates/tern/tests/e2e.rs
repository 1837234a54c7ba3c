//! End to end over real loopback UDP sockets: handshakes, concurrent flows with random
//! payloads checked byte for byte, graceful close, a wrong key, a vanished peer, events and
//! up-calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use tern::{ConnectionError, Endpoint, EndpointConfig, Event, StaticKeypair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn server() -> Endpoint {
    Endpoint::server(
        "127.0.0.1:0".parse().unwrap(),
        StaticKeypair::generate(tern::entropy()),
    )
    .unwrap()
}

fn client() -> Endpoint {
    Endpoint::client(StaticKeypair::generate(tern::entropy())).unwrap()
}

/// A connection from `client` to `server`: the client's end and the server's.
async fn connected(server: &Endpoint, client: &Endpoint) -> (tern::Connection, tern::Connection) {
    let accepted = tokio::spawn({
        let server = server.clone();
        async move { server.accept().await.unwrap() }
    });
    let addr = server.local_addr().unwrap();
    let conn = client
        .connect(addr, Some(server.public_key()))
        .await
        .unwrap();
    (conn, accepted.await.unwrap())
}

/// Each flow carries a random payload; the server echoes a SHA-like digest back on the same
/// (two-way) flow: here simply the bytes' sum and length, checked against the sender's.
async fn concurrent_flows(ik: bool) {
    let server = server();
    let client = client();
    let addr = server.local_addr().unwrap();
    let key = ik.then(|| server.public_key());
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (mut send, mut recv) = conn.accept_bi().await.unwrap();
            tasks.push(tokio::spawn(async move {
                // Through tokio's AsyncRead and AsyncWrite, as generic code would.
                let mut data = Vec::new();
                AsyncReadExt::read_to_end(&mut recv, &mut data)
                    .await
                    .unwrap();
                // Echo everything back.
                AsyncWriteExt::write_all(&mut send, &data).await.unwrap();
                send.finish().unwrap();
                send.finished().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        conn.closed().await
    });
    let conn = client.connect(addr, key).await.unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let size = rng.random_range(1..400_000usize) + i;
        let mut payload = vec![0u8; size];
        rng.fill_bytes(&mut payload);
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let writer = async {
                send.write_all(&payload).await.unwrap();
                send.finish().unwrap();
                payload
            };
            let reader = async { recv.read_to_end(1 << 20).await.unwrap() };
            let (sent, back) = tokio::join!(writer, reader);
            assert_eq!(sent, back, "flow {i} came back different");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Loopback keeps the IP header's ECN bits: our ECT(0) marks came back counted.
    let stats = conn.stats();
    assert_eq!(stats.ecn, tern::EcnState::Capable, "{stats:?}");
    assert!(stats.max_datagram_size >= 1200, "{stats:?}");
    // Every datagram the connection sent went through the endpoint's socket, in batches.
    let io = client.io_stats();
    assert!(
        io.send_calls > 0 && io.datagrams_sent >= io.send_calls,
        "{io:?}"
    );
    assert!(
        io.datagrams_sent >= stats.datagrams_sent,
        "{io:?} {stats:?}"
    );
    assert_eq!(io.send_errors, 0);
    conn.close(0, b"done");
    let reason = conn.closed().await;
    assert_eq!(reason, ConnectionError::LocallyClosed { code: 0 });
    let server_reason = tokio::time::timeout(Duration::from_secs(5), srv)
        .await
        .expect("server saw the close")
        .unwrap();
    assert_eq!(
        server_reason,
        ConnectionError::ApplicationClosed {
            code: 0,
            reason: "done".into()
        }
    );
}

#[tokio::test]
async fn ik_concurrent_flows_and_graceful_close() {
    concurrent_flows(true).await;
}

#[tokio::test]
async fn xx_concurrent_flows_and_graceful_close() {
    concurrent_flows(false).await;
}

#[tokio::test]
async fn xx_reveals_the_server_key() {
    let server = server();
    let key = server.public_key();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        if let Some(c) = server.accept().await {
            c.closed().await;
        }
    });
    let conn = client().connect(addr, None).await.unwrap();
    assert_eq!(conn.peer_key(), Some(key));
}

#[tokio::test]
async fn wrong_server_key_is_rejected_with_a_clear_error() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let wrong = StaticKeypair::generate(tern::entropy()).public();
    let err = tokio::time::timeout(Duration::from_secs(10), client().connect(addr, Some(wrong)))
        .await
        .expect("fails fast, not by timeout")
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("wrong server public key"), "{text}");
    assert_eq!(server.connection_count(), 0);
}

#[tokio::test]
async fn a_vanished_peer_is_detected_by_idle_timeout() {
    let mut cfg = EndpointConfig::new(StaticKeypair::generate(tern::entropy()), tern::entropy());
    cfg.connection.idle_timeout = Duration::from_secs(1);
    let client = Endpoint::bind("127.0.0.1:0".parse().unwrap(), cfg).unwrap();
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let accepted = tokio::spawn({
        let server = server.clone();
        async move { server.accept().await.unwrap() }
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let _server_conn = accepted.await.unwrap();
    server.abort(); // the server "crashes": no close, no more packets
    let start = tokio::time::Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("detected");
    assert_eq!(reason, ConnectionError::TimedOut);
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
}

/// `connect` sends the first handshake message from the caller's task: on a current-thread
/// runtime, one poll of the future (without yielding, so no driver can run) has sent it.
#[tokio::test]
async fn a_connect_sends_its_first_message_from_the_callers_task() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let client = client();
    let before = client.io_stats().datagrams_sent;
    let mut connecting = std::pin::pin!(client.connect(addr, Some(key)));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::future::Future::poll(connecting.as_mut(), &mut cx).is_pending());
    assert_eq!(client.io_stats().datagrams_sent - before, 1);
    let conn = connecting.await.unwrap();
    assert!(server.accept().await.is_some());
    conn.close(0, b"");
}

/// A filtered subscription gets only what its test accepts; an unfiltered one beside it
/// gets the per-packet readiness events as well.
#[tokio::test]
async fn a_filtered_event_stream_gets_only_the_events_it_asked_for() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        recv.read_to_end(64).await.unwrap();
        send.write_all(&vec![7u8; 256 << 10]).await.unwrap();
        send.finish().unwrap();
        conn.closed().await
    });
    let conn = client().connect(addr, Some(key)).await.unwrap();
    let mut all = conn.events();
    let mut ends = conn.events_where(|e| matches!(e, Event::Closed(_) | Event::Drained));
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"go").await.unwrap();
    send.finish().unwrap();
    let reply = recv.read_to_end(1 << 20).await.unwrap();
    assert_eq!(reply.len(), 256 << 10);
    conn.close(0, b"done");
    tokio::time::timeout(Duration::from_secs(5), srv)
        .await
        .unwrap()
        .unwrap();
    let mut got = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), ends.next()).await {
        got.push(e);
    }
    assert!(
        matches!(
            got.first(),
            Some(Event::Closed(ConnectionError::LocallyClosed { .. }))
        ),
        "{got:?}"
    );
    assert!(
        got.iter()
            .all(|e| matches!(e, Event::Closed(_) | Event::Drained)),
        "{got:?}"
    );
    let mut readable = 0;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(100), all.next()).await {
        readable += usize::from(matches!(e, Event::FlowReadable(_)));
    }
    assert!(readable > 0, "the unfiltered stream saw the data arrive");
    assert_eq!((ends.lagged(), all.lagged()), (0, 0));
}

#[tokio::test]
async fn events_stream_and_upcalls_see_the_connection_life() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink = seen.clone();
    server.on_event(move |_, e| sink.lock().unwrap().push(e.clone()));
    let srv = tokio::spawn({
        let server = server.clone();
        async move {
            let conn = server.accept().await.unwrap();
            let mut events = conn.events();
            let mut flow = conn.accept_uni().await.unwrap();
            let data = flow.read_to_end(1 << 20).await.unwrap();
            let mut closed = None;
            while let Some(e) = events.next().await {
                if let Event::Closed(reason) = e {
                    closed = Some(reason);
                    break;
                }
            }
            (data, closed)
        }
    });
    let conn = client()
        .connect(addr, Some(server.public_key()))
        .await
        .unwrap();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(b"event me").await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    conn.close(5, b"bye");
    conn.closed().await;
    let (data, closed) = tokio::time::timeout(Duration::from_secs(5), srv)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(data, b"event me");
    assert!(matches!(
        closed,
        Some(ConnectionError::ApplicationClosed { code: 5, .. })
    ));
    let seen = seen.lock().unwrap();
    assert!(seen.contains(&Event::Connected), "{seen:?}");
    assert!(
        seen.iter().any(|e| matches!(e, Event::FlowReadable(_))),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|e| matches!(e, Event::Closed(_))),
        "{seen:?}"
    );
}

#[tokio::test]
async fn requests_get_their_replies_over_one_connection() {
    use bytes::Bytes;
    use tern::MessageOptions;
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        // Answer every request with 100 bytes naming its size (the MAR pattern).
        while let Ok(m) = conn.recv_message().await {
            let answer = format!("{:0100}", m.data.len());
            conn.reply(
                m.id,
                Bytes::from(answer),
                MessageOptions::default().unordered(),
            )
            .unwrap();
        }
    });
    let conn = client().connect(addr, Some(key)).await.unwrap();
    let sizes = [4_500usize, 20_000, 151_200, 64];
    let mut tasks = Vec::new();
    for &size in &sizes {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let opts = MessageOptions::default()
                .unordered()
                .deadline(Duration::from_secs(5));
            let reply = conn
                .request(Bytes::from(vec![7u8; size]), opts)
                .await
                .expect("a reply before the deadline");
            assert_eq!(reply.data.len(), 100);
            assert_eq!(
                String::from_utf8_lossy(&reply.data).trim_start_matches('0'),
                size.to_string()
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A request's deadline travels with it: the server sees when the requester will give up
/// and can answer in time or not at all; a reply after the deadline is dropped (never shows
/// up in `recv_message`); a request larger than the peer accepts is refused at once.
#[tokio::test]
async fn request_deadlines_reach_the_server_and_late_replies_are_dropped() {
    use bytes::Bytes;
    use tern::{MessageOptions, RequestError, SendMessageError};
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let (left_tx, mut left_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        while let Ok(m) = conn.recv_message().await {
            let left = m
                .deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now().into_std()));
            left_tx.send(left).unwrap();
            // "slow" requests are answered after their deadline, fully reliably.
            if &m.data[..] == b"slow" {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            conn.reply(m.id, m.data.clone(), MessageOptions::default().unordered())
                .unwrap();
        }
    });
    let conn = client().connect(addr, Some(key)).await.unwrap();
    let opts = MessageOptions::default()
        .unordered()
        .deadline(Duration::from_millis(200));

    let fast = conn
        .request(Bytes::from_static(b"fast"), opts)
        .await
        .expect("answered in time");
    assert_eq!(&fast.data[..], b"fast");
    let left = left_rx.recv().await.unwrap().expect("the deadline arrived");
    // 200 ms less half a loopback RTT and the scheduling on the way.
    assert!(
        left > Duration::from_millis(100) && left <= Duration::from_millis(200),
        "{left:?}"
    );

    let slow = conn.request(Bytes::from_static(b"slow"), opts).await;
    assert_eq!(
        slow.unwrap_err(),
        tern::RequestError::Expired,
        "the reply came after the deadline"
    );
    // The late reply arrives ~200 ms later and is dropped: the inbox stays empty.
    let inbox = tokio::time::timeout(Duration::from_millis(600), conn.recv_message()).await;
    assert!(inbox.is_err(), "a late reply reached the inbox");

    // Without a deadline the server sees none.
    let plain = conn
        .request(Bytes::from_static(b"plain"), MessageOptions::default())
        .await
        .expect("a request without a deadline gets its reply, not an Option");
    assert_eq!(&plain.data[..], b"plain");
    let mut last = None;
    while let Ok(l) = left_rx.try_recv() {
        last = Some(l);
    }
    assert_eq!(last, Some(None));

    // Above the peer's limit (at most 16 MiB, and no more than its connection window).
    let huge = Bytes::from(vec![0u8; (16 << 20) + 1]);
    let err = conn
        .request(huge, MessageOptions::default())
        .await
        .map(|m| m.data.len())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RequestError::NotSent(SendMessageError::TooLarge { .. })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn datagrams_arrive_and_oversized_ones_are_refused() {
    use bytes::Bytes;
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        conn.recv_datagram().await.unwrap()
    });
    let conn = client().connect(addr, Some(key)).await.unwrap();
    let max = conn
        .max_datagram_payload()
        .expect("the server accepts datagrams");
    assert!(max >= 1100, "{max}");
    let err = conn
        .send_datagram(Bytes::from(vec![0u8; max + 1]))
        .unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
    // Datagrams are unreliable; loopback does not lose them, so one is enough.
    conn.send_datagram(Bytes::from_static(b"media frame"))
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), srv)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], b"media frame");
}

/// F7 over real sockets: the receiver closes its window for 2 s mid-transfer (a handover);
/// the transfer completes byte for byte; the sender sees the window events.
#[tokio::test]
async fn window_close_handover_over_real_sockets() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let size = 20 << 20;
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let mut got = Vec::with_capacity(size);
        let mut buf = vec![0u8; 1 << 16];
        let mut closed_at = None;
        loop {
            let Some(n) = flow.read(&mut buf).await.unwrap() else {
                break;
            };
            got.extend_from_slice(&buf[..n]);
            if closed_at.is_none() && got.len() > size / 4 {
                conn.close_window(1, b"handover");
                closed_at = Some(got.len());
                tokio::time::sleep(Duration::from_secs(2)).await;
                conn.open_window();
            }
        }
        got
    });
    let conn = client().connect(addr, Some(key)).await.unwrap();
    let mut events = conn.events();
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut flow = conn.open_uni().await.unwrap();
    let start = tokio::time::Instant::now();
    flow.write_all(&data).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "the transfer waited for the window"
    );
    let got = tokio::time::timeout(Duration::from_secs(20), srv)
        .await
        .unwrap()
        .unwrap();
    assert!(got == data, "every byte arrived in order");
    let mut saw_close = false;
    let mut saw_open = false;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(100), events.next()).await {
        match e {
            Event::WindowClosed { local: false, .. } => saw_close = true,
            Event::WindowOpened { local: false } => saw_open = true,
            _ => {}
        }
    }
    assert!(saw_close && saw_open, "close {saw_close} open {saw_open}");
    let probes = conn.stats().window_probes;
    assert!((1..=12).contains(&probes), "{probes} polls while closed");
}

#[tokio::test]
async fn endpoint_close_reaches_every_peer_and_wait_idle_returns() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let client = client();
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(client.connect(addr, Some(key)).await.unwrap());
        let accepted = server.accept().await.expect("accepted");
        // The server keeps its handles: closing must not depend on the application dropping them.
        std::mem::forget(accepted);
    }
    server.close(7, b"maintenance");
    assert!(
        server.accept().await.is_none(),
        "a closing endpoint accepts nothing"
    );
    tokio::time::timeout(Duration::from_secs(10), server.wait_idle())
        .await
        .expect("every close delivered");
    for conn in &conns {
        let reason = tokio::time::timeout(Duration::from_secs(10), conn.closed())
            .await
            .expect("the client learns of the close");
        assert_eq!(
            reason,
            ConnectionError::ApplicationClosed {
                code: 7,
                reason: "maintenance".into()
            }
        );
    }
    // A client that arrives after the close is closed with the same code.
    let late = client.connect(addr, Some(key)).await;
    match late {
        Ok(conn) => {
            let reason = tokio::time::timeout(Duration::from_secs(10), conn.closed())
                .await
                .expect("closed");
            assert!(matches!(
                reason,
                ConnectionError::ApplicationClosed { code: 7, .. }
            ));
        }
        Err(e) => assert!(e.to_string().contains('7'), "{e}"),
    }
    client.close(0, b"");
    tokio::time::timeout(Duration::from_secs(10), client.wait_idle())
        .await
        .expect("client idle");
}

#[tokio::test]
async fn dropped_flows_finish_or_stop_and_errors_say_which() {
    use tern::{ReadError, WriteError};
    let server = server();
    let addr = server.local_addr().unwrap();
    let client = client();
    let conn = client
        .connect(addr, Some(server.public_key()))
        .await
        .unwrap();
    let peer = server.accept().await.unwrap();

    // A send half dropped without `finish` (an early return) finishes: the peer's read ends.
    {
        let mut flow = conn.open_uni().await.unwrap();
        flow.write_all(b"ten bytes!").await.unwrap();
    }
    let mut incoming = peer.accept_uni().await.unwrap();
    assert_eq!(incoming.read_to_end(100).await.unwrap(), b"ten bytes!");

    // A receive half dropped before the end stops the flow: the writer learns the code.
    let (mut tx, _rx) = conn.open_bi().await.unwrap();
    tx.write_all(b"hello").await.unwrap();
    let (_peer_tx, peer_rx) = peer.accept_bi().await.unwrap();
    drop(peer_rx);

    let code = tokio::time::timeout(Duration::from_secs(5), tx.stopped())
        .await
        .expect("StopSending arrives");
    assert_eq!(code, Ok(0));
    assert_eq!(tx.write(b"more").await, Err(WriteError::Stopped(0)));

    // A reset and a closed connection are different errors, without downcasting.
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(b"partial").await.unwrap();
    flow.reset(5).unwrap();
    let mut incoming = peer.accept_uni().await.unwrap();
    let mut buf = [0u8; 64];
    let err = loop {
        match incoming.read(&mut buf).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a reset flow must not end cleanly"),
            Err(e) => break e,
        }
    };
    assert_eq!(err, ReadError::Reset(5));
    let io: std::io::Error = err.into();
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);

    let mut open = conn.open_uni().await.unwrap();
    open.write_all(b"x").await.unwrap();
    let mut waiting = peer.accept_uni().await.unwrap();
    assert_eq!(waiting.read(&mut buf).await, Ok(Some(1)));
    conn.close(9, b"bye");
    let err = waiting.read(&mut buf).await.unwrap_err();
    assert_eq!(
        err,
        ReadError::ConnectionLost(ConnectionError::ApplicationClosed {
            code: 9,
            reason: "bye".into()
        })
    );
    assert!(matches!(
        open.write(b"y").await,
        Err(WriteError::ConnectionLost(ConnectionError::LocallyClosed {
            code: 9
        }))
    ));
}

#[tokio::test]
async fn the_builder_binds_ipv6_takes_a_socket_and_turns_gso_off() {
    // A server on a socket the application bound itself.
    let std_socket = std::net::UdpSocket::bind("[::1]:0").unwrap();
    let addr = std_socket.local_addr().unwrap();
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .socket(std_socket)
        .server()
        .build()
        .unwrap();
    assert_eq!(server.local_addr().unwrap(), addr);
    // A client on IPv6 loopback, one datagram per sendmsg, small buffers.
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("[::1]:0".parse().unwrap())
        .gso(false)
        .recv_buffer(1 << 20)
        .send_buffer(1 << 20)
        .configure(|c| c.connection.idle_timeout = Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(client.local_addr().unwrap().is_ipv6());
    assert_eq!(client.gso_segments(), 1);
    let key = server.public_key();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        flow.read_to_end(1 << 20).await.unwrap().len()
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&[9u8; 300_000]).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    assert_eq!(srv.await.unwrap(), 300_000);
    let io = client.io_stats();
    assert_eq!(io.datagrams_sent, io.send_calls, "GSO off: {io:?}");
    // 300 kB is over 30 datagrams even at loopback's 8 972-byte PMTU.
    assert!(io.send_calls > 30, "{io:?}");
}

/// What [`LossySocket`] saw, shared with the test.
#[derive(Debug, Default)]
struct SocketCounters {
    offered: std::sync::atomic::AtomicU64,
    dropped: std::sync::atomic::AtomicU64,
    received: std::sync::atomic::AtomicU64,
}

/// A socket of the application's own: the built-in one, wrapped to count what passes and to
/// drop every `drop_every`-th datagram it is asked to send. It offers no GSO, so tern hands it
/// one datagram at a time.
#[derive(Debug)]
struct LossySocket {
    inner: tern::socket::UdpSocket,
    drop_every: u64,
    counters: Arc<SocketCounters>,
}

impl tern::socket::AsyncUdpSocket for LossySocket {
    fn poll_send(
        &self,
        cx: &mut std::task::Context<'_>,
        t: &tern::socket::Transmit<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::sync::atomic::Ordering::Relaxed;
        assert!(t.segment_size.is_none(), "a batch for a socket without GSO");
        // Count a datagram once it is sent or dropped, not on a `Pending` that is retried.
        let n = self.counters.offered.load(Relaxed) + 1;
        if n % self.drop_every == 0 {
            self.counters.offered.store(n, Relaxed);
            self.counters.dropped.fetch_add(1, Relaxed);
            return std::task::Poll::Ready(Ok(()));
        }
        let sent = self.inner.poll_send(cx, t);
        if sent.is_ready() {
            self.counters.offered.store(n, Relaxed);
        }
        sent
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [tern::socket::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = self.inner.poll_recv(cx, bufs, meta);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            let datagrams: usize = meta[..*n]
                .iter()
                .map(|m| m.len.div_ceil(m.stride.max(1)))
                .sum();
            self.counters
                .received
                .fetch_add(datagrams as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

#[tokio::test]
async fn an_application_socket_carries_the_connection_and_its_losses_are_recovered() {
    use std::sync::atomic::Ordering::Relaxed;
    let server = server();
    let counters = Arc::new(SocketCounters::default());
    let inner = tern::socket::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let local = tern::socket::AsyncUdpSocket::local_addr(&inner).unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .async_socket(LossySocket {
            inner,
            drop_every: 20,
            counters: counters.clone(),
        })
        .build()
        .unwrap();
    assert_eq!(client.local_addr().unwrap(), local);
    assert_eq!(client.gso_segments(), 1, "the socket's own segment limit");

    let key = server.public_key();
    let addr = server.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let data = flow.read_to_end(4 << 20).await.unwrap();
        conn.closed().await;
        data
    });
    let mut payload = vec![0u8; 1_000_000];
    rand_chacha::ChaCha8Rng::seed_from_u64(7).fill_bytes(&mut payload);
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&payload).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    let stats = conn.stats();
    conn.close(0, b"done");
    conn.closed().await;
    assert_eq!(srv.await.unwrap(), payload, "every byte, in order");

    // Everything went through the application's socket, and what it dropped was re-sent.
    let io = client.io_stats();
    assert_eq!(counters.offered.load(Relaxed), io.datagrams_sent, "{io:?}");
    // One in 20 of over 110 datagrams (1 MB at up to 8 972 bytes each).
    assert!(counters.dropped.load(Relaxed) >= 5, "{io:?}");
    assert!(counters.received.load(Relaxed) > 0);
    assert_eq!(counters.received.load(Relaxed), io.datagrams_received);
    assert!(
        stats.packets_lost >= counters.dropped.load(Relaxed) / 2,
        "the dropped datagrams were declared lost: {stats:?}"
    );
}

/// Requests sent from the application's task wake the driver only when they move its timer
/// earlier. A request sent after a pause moves it from the idle timer to the loss timer, and
/// a lost request or reply datagram is a tail loss that only the loss timer recovers: every
/// request still gets its reply.
#[tokio::test]
async fn requests_lost_on_the_way_out_are_recovered_by_the_drivers_timer() {
    use bytes::Bytes;
    use std::sync::atomic::Ordering::Relaxed;
    use tern::MessageOptions;
    let server = server();
    let counters = Arc::new(SocketCounters::default());
    let inner = tern::socket::UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .async_socket(LossySocket {
            inner,
            drop_every: 7,
            counters: counters.clone(),
        })
        .build()
        .unwrap();
    let key = server.public_key();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        while let Ok(m) = conn.recv_message().await {
            if conn.reply(m.id, m.data, MessageOptions::default()).is_err() {
                break;
            }
        }
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    for i in 0..40u32 {
        // Past the delayed-ACK timer: the driver sleeps on nothing nearer than the idle and
        // keep-alive timers when the request goes out.
        tokio::time::sleep(Duration::from_millis(40)).await;
        let body = Bytes::from(i.to_be_bytes().to_vec());
        let reply = tokio::time::timeout(
            Duration::from_secs(10),
            conn.request(body.clone(), MessageOptions::default()),
        )
        .await
        .unwrap_or_else(|_| panic!("request {i} stalled: {:?}", conn.stats()))
        .unwrap();
        assert_eq!(reply.data, body);
    }
    // (Checked against a driver never woken by inline senders: request 4 stalls.)
    assert!(counters.dropped.load(Relaxed) >= 5, "{:?}", conn.stats());
}

#[tokio::test]
async fn multipath_over_real_sockets_opens_and_uses_a_second_path() {
    // Both ends on wildcard sockets; the client opens a second path from 127.0.0.2 and the
    // server advertises 127.0.0.3 (every 127/8 address is local on Linux loopback).
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    let advertised: std::net::SocketAddr = ([127, 0, 0, 3], port).into();
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .socket(socket)
        .server()
        .configure(|c| c.connection.advertise = vec![advertised])
        .build()
        .unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .configure(|c| c.connection.local_ips = vec![[127, 0, 0, 2].into()])
        .build()
        .unwrap();
    let key = server.public_key();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let data = flow.read_to_end(32 << 20).await.unwrap();
        (data.len(), conn.paths())
    });
    let conn = client
        .connect(([127, 0, 0, 1], port).into(), Some(key))
        .await
        .unwrap();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&vec![5u8; 8 << 20]).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    let paths = conn.paths();
    let (received, server_paths) = srv.await.unwrap();
    assert_eq!(received, 8 << 20);
    // (127.0.0.1 → .1), (.2 → .1), (.1 → .3), (.2 → .3): a path per pair, all validated.
    assert_eq!(paths.len(), 4, "{paths:#?}");
    assert!(paths.iter().all(|p| p.validated), "{paths:#?}");
    let used = paths.iter().filter(|p| p.bytes_sent > 100_000).count();
    assert!(used >= 2, "data went over more than one path: {paths:#?}");
    assert_eq!(server_paths.len(), 4, "{server_paths:#?}");
    assert!(server_paths
        .iter()
        .any(|p| p.remote.ip() == std::net::IpAddr::from([127, 0, 0, 2])));
}

/// The client's socket with a switch that cuts one of its interfaces: once `cut` is set,
/// every datagram that would leave from `interface` is dropped (the uplink of that path
/// is gone, as when a vehicle drives out of a Wi-Fi cell).
#[derive(Debug)]
struct CuttableSocket {
    inner: tern::socket::UdpSocket,
    interface: std::net::IpAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl tern::socket::AsyncUdpSocket for CuttableSocket {
    fn poll_send(
        &self,
        cx: &mut std::task::Context<'_>,
        t: &tern::socket::Transmit<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.cut.load(std::sync::atomic::Ordering::Relaxed) && t.src_ip == Some(self.interface) {
            return std::task::Poll::Ready(Ok(()));
        }
        self.inner.poll_send(cx, t)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [tern::socket::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

#[tokio::test]
async fn a_two_path_transfer_survives_losing_a_path_midway() {
    use std::sync::atomic::Ordering::Relaxed;
    let second: std::net::IpAddr = [127, 0, 0, 2].into();
    let server = server();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inner = tern::socket::UdpSocket::bind("0.0.0.0:0".parse().unwrap()).unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .async_socket(CuttableSocket {
            inner,
            interface: second,
            cut: cut.clone(),
        })
        .configure(|c| c.connection.local_ips = vec![second])
        .build()
        .unwrap();
    let key = server.public_key();
    let addr = server.local_addr().unwrap();
    let mut payload = vec![0u8; 12 << 20];
    rand_chacha::ChaCha8Rng::seed_from_u64(9).fill_bytes(&mut payload);
    let expected = payload.clone();
    let cutter = cut.clone();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let mut data = Vec::new();
        while let Some(chunk) = flow.read_chunk(1 << 20).await.unwrap() {
            data.extend_from_slice(&chunk);
            if data.len() >= 3 << 20 {
                // A quarter through: the client's second interface goes dark.
                cutter.store(true, Relaxed);
            }
        }
        data
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut events = conn.events();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&payload).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    let paths = conn.paths();
    let stats = conn.stats();
    conn.close(0, b"done");
    assert!(srv.await.unwrap() == expected, "every byte, in order");
    assert!(cut.load(Relaxed));
    assert_eq!(paths.len(), 2, "{paths:#?}");
    let cut_path = paths.iter().find(|p| p.local == Some(second)).unwrap();
    assert_eq!(cut_path.state, tern::PathState::Dead, "{paths:#?}");
    assert!(stats.packets_rerouted > 0, "its data moved: {stats:?}");
    // The application saw it happen.
    let mut saw_dead = false;
    while let Ok(Some(e)) =
        tokio::time::timeout(std::time::Duration::from_millis(50), events.next()).await
    {
        saw_dead |= matches!(e, tern::Event::PathDead { id } if id == cut_path.id);
    }
    assert!(saw_dead, "a PathDead event");
}

#[tokio::test]
async fn the_target_rate_and_its_events_reach_the_application() {
    // No router on loopback: the explicit-rate controller runs its fallback (CUBIC), and the
    // target rate comes from it (F13).
    let server = server();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .configure(|c| c.connection.congestion = tern::cc::Algorithm::Explicit.factory())
        .build()
        .unwrap();
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let mut data = Vec::new();
        AsyncReadExt::read_to_end(&mut flow, &mut data)
            .await
            .unwrap();
        // The connection handle goes back with the figures: dropping the last one would
        // close the connection under the client's checks below.
        (data.len(), conn.stats(), conn)
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut events = conn.events();
    conn.set_expected_rate(Some(50_000_000));
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&vec![1u8; 2_000_000]).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    let (len, server_stats, _server_conn) = srv.await.unwrap();
    assert_eq!(len, 2_000_000);
    // The server echoed the (unlowered) feedback of our rate area.
    assert!(server_stats.rate_echoes_sent > 0, "{server_stats:?}");
    let stats = conn.stats();
    assert!(stats.rate_echoes_received > 0);
    assert_eq!(stats.feedback_rate, None);
    let target = conn.target_rate().expect("known after a transfer");
    assert_eq!(target.source, tern::RateSource::Controller);
    assert!(target.bytes_per_second > 0);
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.next().await {
                Some(Event::TargetRate(t)) => return Some(t),
                Some(_) => {}
                None => return None,
            }
        }
    })
    .await
    .expect("a TargetRate event");
    assert!(first.is_some_and(|t| t.bytes_per_second > 0));
    conn.close(0, b"done");
    conn.closed().await;
}

#[tokio::test]
async fn an_event_subscriber_that_never_reads_holds_a_bounded_queue() {
    let server = server();
    let addr = server.local_addr().unwrap();
    let srv = tokio::spawn({
        let server = server.clone();
        async move {
            let conn = server.accept().await.unwrap();
            for i in 0..3 * tern::EVENT_QUEUE {
                while conn
                    .send_datagram(bytes::Bytes::from(vec![i as u8; 1100]))
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            conn
        }
    });
    let conn = client()
        .connect(addr, Some(server.public_key()))
        .await
        .unwrap();
    let mut events = conn.events();
    let _server_conn = srv.await.unwrap();
    // Wait (bounded) until far more events happened than the queue holds.
    for _ in 0..500 {
        if conn.stats().datagrams_received as usize > 2 * tern::EVENT_QUEUE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(conn.stats().datagrams_received as usize > 2 * tern::EVENT_QUEUE);
    assert_eq!(
        events.pending(),
        tern::EVENT_QUEUE,
        "the queue is full, not more"
    );
    assert!(
        events.lagged() > 0,
        "the events beyond the queue were counted"
    );
    assert!(
        events.next().await.is_some(),
        "what it holds is still readable"
    );
}

/// `handshake_train` at both ends over real sockets: the client's padding reaches the server
/// with its Initial, the server sends its first probe train with its response (before any
/// data), and a download over the connection arrives intact.
#[tokio::test]
async fn a_handshake_train_goes_with_the_response_over_real_sockets() {
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .configure(|c| c.connection.handshake_train = true)
        .build()
        .unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .configure(|c| c.connection.handshake_train = true)
        .build()
        .unwrap();
    let (addr, key) = (server.local_addr().unwrap(), server.public_key());
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        // The Initial and its four padding datagrams, and the client's first packet.
        let at_accept = conn.stats();
        let mut flow = conn.open_uni().await.unwrap();
        flow.write_all(&[7u8; 1 << 20]).await.unwrap();
        flow.finish().unwrap();
        flow.finished().await.unwrap();
        (at_accept, conn.stats())
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut flow = conn.accept_uni().await.unwrap();
    let data = flow.read_to_end(2 << 20).await.unwrap();
    assert!(data.len() == 1 << 20 && data.iter().all(|&b| b == 7));
    let (at_accept, after) = srv.await.unwrap();
    assert!(at_accept.datagrams_received >= 6, "{at_accept:?}");
    assert!(
        at_accept.probe_trains_sent == 1,
        "a train before any data: {at_accept:?}"
    );
    assert!(after.probe_trains_sent >= 1, "{after:?}");
}

/// After `abort`, every task waiting on the endpoint's connections gets an error that names
/// the stop instead of waiting for good, its event streams end, and its connections take
/// no more writes (before, a waiting read, message or datagram task hung).
#[tokio::test]
async fn an_aborted_endpoint_fails_every_waiting_task() {
    let (server, client) = (server(), client());
    let (conn, _server_conn) = connected(&server, &client).await;
    let mut flow = conn.open_uni().await.unwrap();
    let mut events = conn.events();
    let stopped = |e: &ConnectionError| matches!(e, ConnectionError::EndpointStopped { .. });
    let message = tokio::spawn({
        let conn = conn.clone();
        async move { conn.recv_message().await }
    });
    let datagram = tokio::spawn({
        let conn = conn.clone();
        async move { conn.recv_datagram().await }
    });
    let incoming = tokio::spawn({
        let conn = conn.clone();
        async move { conn.accept_uni().await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.abort();
    let within = Duration::from_secs(2);
    let e = tokio::time::timeout(within, message).await.expect("woken");
    assert!(stopped(&e.unwrap().unwrap_err()));
    let e = tokio::time::timeout(within, datagram).await.expect("woken");
    assert!(stopped(&e.unwrap().unwrap_err()));
    let e = tokio::time::timeout(within, incoming).await.expect("woken");
    assert!(stopped(&e.unwrap().unwrap_err()));
    match flow.write_all(b"after the stop").await {
        Err(tern::WriteError::ConnectionLost(e)) => assert!(stopped(&e), "{e}"),
        other => panic!("a write after abort: {other:?}"),
    }
    assert!(stopped(&conn.closed().await));
    let end = tokio::time::timeout(within, async { while events.next().await.is_some() {} });
    end.await.expect("the event stream ends");
}

/// An endpoint whose handles are all gone ends its task and frees its port (before, the task
/// slept on with the socket until a datagram happened to arrive).
#[tokio::test]
async fn an_endpoint_whose_handles_are_gone_frees_its_port() {
    let server = server();
    let addr = server.local_addr().unwrap();
    drop(server);
    for _ in 0..200 {
        if std::net::UdpSocket::bind(addr).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{addr} is still bound");
}

/// Dropping every handle of a live connection closes it (code 0, as quinn does): before, it
/// lived on until its idle timeout without anyone able to use it, and the peer was not told.
#[tokio::test]
async fn a_connection_whose_handles_are_gone_is_closed() {
    let (server, client) = (server(), client());
    let (conn, server_conn) = connected(&server, &client).await;
    let events = conn.events();
    drop(conn);
    let reason = tokio::time::timeout(Duration::from_secs(2), server_conn.closed())
        .await
        .expect("the peer is told");
    assert!(
        matches!(reason, ConnectionError::ApplicationClosed { code: 0, .. }),
        "{reason}"
    );
    drop(events);
    // Both ends free the connection once it drained.
    tokio::time::timeout(Duration::from_secs(5), client.wait_idle())
        .await
        .expect("the client's connection drains");
    assert_eq!(client.connection_count(), 0);
}

/// The peer stops our sending half of a two-way flow before we accept the flow: `stopped()`
/// on the accepted half still sees its code (the event passed while no handle held the
/// flow; found by an outside read of this session's change).
#[tokio::test]
async fn a_flow_stopped_before_it_is_accepted_reports_the_stop() {
    let (server, client) = (server(), client());
    let (conn, server_conn) = connected(&server, &client).await;
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    tx.write_all(b"opens the flow").await.unwrap();
    rx.stop(7).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut their_tx, _their_rx) = server_conn.accept_bi().await.unwrap();
    let code = tokio::time::timeout(Duration::from_secs(2), their_tx.stopped())
        .await
        .expect("the stop is known");
    assert_eq!(code.unwrap(), 7);
}

/// A server endpoint dropped without `close` closes the connections nobody accepted (they
/// were never handed to anyone who could close them; before, they lived until the idle
/// timeout, and the endpoint's task and port with them).
#[tokio::test]
async fn a_dropped_server_closes_the_connections_nobody_accepted() {
    let (server, client) = (server(), client());
    let addr = server.local_addr().unwrap();
    let conn = client
        .connect(addr, Some(server.public_key()))
        .await
        .unwrap();
    drop(server);
    let reason = tokio::time::timeout(Duration::from_secs(2), conn.closed())
        .await
        .expect("the client is told");
    assert!(
        matches!(reason, ConnectionError::ApplicationClosed { code: 0, .. }),
        "{reason}"
    );
}

/// After its end a flow reads as ended again, through `read` and through `AsyncRead`, and an
/// empty buffer reads at once (found by an outside read: the freed flow read as an error, and
/// an empty read waited for the next packet).
#[tokio::test]
async fn a_flow_reads_its_end_again_and_an_empty_read_returns_at_once() {
    let (server, client) = (server(), client());
    let (conn, accepted) = connected(&server, &client).await;
    let mut send = conn.open_uni().await.unwrap();
    send.write_all(b"abc").await.unwrap();
    let mut recv = accepted.accept_uni().await.unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        recv.read(&mut []).await,
        Ok(Some(0)),
        "an empty read waits for nothing"
    );
    send.finish().unwrap();
    let mut got = Vec::new();
    while let Some(n) = recv.read(&mut buf).await.unwrap() {
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"abc");
    assert_eq!(recv.read(&mut buf).await, Ok(None), "the end, again");
    assert_eq!(AsyncReadExt::read(&mut recv, &mut buf).await.unwrap(), 0);
    assert_eq!(AsyncReadExt::read(&mut recv, &mut buf).await.unwrap(), 0);
}
