//! A server spread over worker sockets on one port (`EndpointBuilder::build_workers`), over
//! real loopback sockets: the kernel spreads clients over the workers, and when a client's
//! address changes (a NAT rebinding, emulated by a relay that takes a new port) its
//! datagrams may reach another worker, which passes them to the owner by the server ID in
//! the connection ID.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tern::lb::QuicLb;
use tern::{Endpoint, StaticKeypair, Workers};
use tokio::net::UdpSocket;
use tokio::sync::Notify;

/// The destination connection IDs of the short-header datagrams a relay passed to the
/// server.
type Seen = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// A relay between one client and the server, logging what it passes to the server;
/// `rebind` makes it talk to the server from a new port from then on, as a NAT that lost
/// its mapping would.
async fn relay(server: SocketAddr) -> (SocketAddr, Arc<Notify>, Seen) {
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = front.local_addr().unwrap();
    let rebind = Arc::new(Notify::new());
    let signal = rebind.clone();
    let seen = Seen::default();
    let log = seen.clone();
    tokio::spawn(async move {
        let mut back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut client: Option<SocketAddr> = None;
        let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
        loop {
            tokio::select! {
                r = front.recv_from(&mut a) => {
                    let Ok((n, from)) = r else { return };
                    client = Some(from);
                    if n > 9 && a[0] & 0x80 == 0 {
                        log.lock().unwrap().push(a[1..9].to_vec());
                    }
                    let _ = back.send_to(&a[..n], server).await;
                }
                r = back.recv_from(&mut b) => {
                    let Ok((n, _)) = r else { return };
                    if let Some(c) = client {
                        let _ = front.send_to(&b[..n], c).await;
                    }
                }
                _ = signal.notified() => {
                    back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
                }
            }
        }
    });
    (addr, rebind, seen)
}

fn workers(n: usize) -> Workers {
    Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .configure(|c| c.handshakes_per_source = (f64::INFINITY, f64::INFINITY))
        .build_workers(n)
        .unwrap()
}

/// Serves: each bidirectional flow is read to its end and its length written back.
fn serve(server: Workers) {
    tokio::spawn(async move {
        while let Some(conn) = server.accept().await {
            tokio::spawn(async move {
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        let data = recv.read_to_end(64 << 20).await.unwrap();
                        send.write_all(&(data.len() as u64).to_be_bytes())
                            .await
                            .unwrap();
                        send.finish().unwrap();
                    });
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_workers_and_survive_rebinding_to_another_worker() {
    let server = workers(2);
    let addr = server.local_addr();
    let key = server.public_key();
    let eps: Vec<Endpoint> = server.endpoints().to_vec();
    serve(server);
    const CLIENTS: usize = 16;
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let (via, rebind, _) = relay(addr).await;
            let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
                .bind("127.0.0.1:0".parse().unwrap())
                .build()
                .unwrap();
            let conn = client.connect(via, Some(key)).await.unwrap();
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            let chunk = vec![i as u8; 64 << 10];
            for k in 0..16 {
                if k == 8 {
                    // Halfway, the client's address (as the server sees it) changes.
                    rebind.notify_one();
                }
                send.write_all(&chunk).await.unwrap();
            }
            send.finish().unwrap();
            let back = tokio::time::timeout(Duration::from_secs(30), recv.read_to_end(8))
                .await
                .expect("reply within 30 s")
                .unwrap();
            assert_eq!(back, (16u64 * (64 << 10)).to_be_bytes(), "client {i}");
            conn.close(0, b"done");
            conn.closed().await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let accepted: Vec<u64> = eps.iter().map(|e| e.stats().accepted).collect();
    assert!(
        accepted.iter().all(|&a| a > 0),
        "the kernel spread {CLIENTS} clients over both workers: {accepted:?}"
    );
    let forwarded: u64 = eps.iter().map(|e| e.io_stats().datagrams_forwarded).sum();
    assert!(
        forwarded > 0,
        "16 rebinds: some reached the other worker and were passed on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancers_configuration_reads_the_server_id_of_every_worker() {
    let lb = QuicLb::new(1, 2, 5, Some([0x42; 16])).unwrap();
    let ids = vec![vec![0x10, 0x00], vec![0x10, 0x01]];
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .routable_cids(lb.clone(), ids.clone())
        .build_workers(2)
        .unwrap();
    let addr = server.local_addr();
    let key = server.public_key();
    serve(server.clone());
    // The relay reads the DCID of every datagram to the server.
    let (via, _, dcids) = relay(addr).await;
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let conn = client.connect(via, Some(key)).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"route me").await.unwrap();
    send.finish().unwrap();
    recv.read_to_end(8).await.unwrap();
    let dcids = dcids.lock().unwrap().clone();
    assert!(!dcids.is_empty());
    let sid = lb.server_id(&dcids[0]).expect("a routable ID");
    assert!(ids.contains(&sid), "{sid:?} is one of this server's");
    assert!(dcids.iter().all(|d| lb.server_id(d) == Some(sid.clone())));
    // The worker that owns it is the one whose ID it carries.
    let owner = ids.iter().position(|i| *i == sid).unwrap();
    assert_eq!(server.endpoints()[owner].connection_count(), 1);
}

#[tokio::test]
async fn too_few_server_ids_or_a_taken_socket_are_refused() {
    let lb = QuicLb::new(0, 3, 4, None).unwrap();
    let err = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .routable_cids(lb, vec![vec![1, 2, 3]])
        .build_workers(2)
        .unwrap_err();
    assert!(
        err.to_string().contains("1 server IDs for 2 workers"),
        "{err}"
    );
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .socket(sock)
        .server()
        .build_workers(2)
        .unwrap_err();
    assert!(err.to_string().contains("binds its own sockets"), "{err}");
}
