//! `tern echo`: round trips of N-byte messages over one connection, one two-way flow per
//! message (SLTP's message-size experiment). `--compare-tcp` measures kernel TCP in the same
//! run, with length-prefixed messages on one TCP_NODELAY connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::util;
use crate::ServerArgs;

/// The largest message the echo server takes and sends back (the client sends up to 1 MiB).
const MAX_ECHO: usize = 16 << 20;

/// Serves echo clients until interrupted.
pub(crate) async fn serve(args: &ServerArgs) -> Result<()> {
    let ep = util::bind_server(args, "tern echo")?;
    serve_on(ep).await;
    Ok(())
}

async fn serve_on(ep: tern::Endpoint) {
    while let Some(conn) = ep.accept().await {
        tokio::spawn(async move {
            while let Ok((mut tx, mut rx)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    if let Ok(m) = rx.read_to_end(MAX_ECHO).await {
                        let _ = tx.write_all(&m).await;
                        let _ = tx.finish();
                    }
                });
            }
        });
    }
}

async fn tern_round_trips(
    conn: &tern::Connection,
    size: usize,
    count: usize,
) -> Result<Vec<Duration>> {
    let msg = vec![0x5au8; size];
    let mut rtts = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        let (mut tx, mut rx) = conn.open_bi().await?;
        let writer = async {
            tx.write_all(&msg).await?;
            tx.finish()
        };
        let reader = rx.read_to_end(MAX_ECHO);
        let (w, r) = tokio::join!(writer, reader);
        w?;
        let back = r?;
        rtts.push(t.elapsed());
        if back.len() != size {
            bail!("echo returned {} bytes, sent {size}", back.len());
        }
    }
    Ok(rtts)
}

fn print_row(proto: &str, size: usize, rtts: &mut [Duration]) {
    let (min, med, p99, mean) = util::summary(rtts);
    println!(
        "{proto:<5} {size:>8} B  min {:>11}  median {:>11}  p99 {:>11}  mean {:>11}",
        util::ms(min),
        util::ms(med),
        util::ms(p99),
        util::ms(mean)
    );
}

/// Echo client against a remote `tern echo --server`.
pub(crate) async fn client(
    addr: SocketAddr,
    key: Option<&str>,
    sizes: &[usize],
    count: usize,
) -> Result<()> {
    let (_ep, conn) = util::connect(addr, key, &crate::PathArgs::default()).await?;
    for &size in sizes {
        let mut rtts = tern_round_trips(&conn, size, count).await?;
        print_row("tern", size, &mut rtts);
    }
    conn.close(0, b"");
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.closed()).await;
    Ok(())
}

/// tern and kernel TCP side by side on loopback, in this process.
pub(crate) async fn compare_local(sizes: &[usize], count: usize) -> Result<()> {
    let server = crate::util::loopback_server()?;
    let addr = server.local_addr()?;
    let key = tern::keys::encode_public(&server.public_key());
    tokio::spawn(serve_on(server));
    let tcp = TcpListener::bind("127.0.0.1:0").await?;
    let tcp_addr = tcp.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Ok(len) = s.read_u32().await else { return };
                    buf.resize(len as usize, 0);
                    if s.read_exact(&mut buf).await.is_err()
                        || s.write_u32(len).await.is_err()
                        || s.write_all(&buf).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let (_ep, conn) = util::connect(addr, Some(&key), &crate::PathArgs::default()).await?;
    let mut stream = TcpStream::connect(tcp_addr).await?;
    stream.set_nodelay(true)?;
    println!("round trips on loopback, {count} per size, same process and run\n");
    for &size in sizes {
        // Warm up both once.
        tern_round_trips(&conn, size, 3).await?;
        let mut t = tern_round_trips(&conn, size, count).await?;
        let msg = vec![0x5au8; size];
        let mut back = vec![0u8; size];
        let mut k = Vec::with_capacity(count);
        for i in 0..count + 3 {
            let t0 = Instant::now();
            let (mut r, mut w) = stream.split();
            let writer = async {
                w.write_u32(size as u32).await?;
                w.write_all(&msg).await
            };
            let reader = async {
                let len = r.read_u32().await?;
                r.read_exact(&mut back[..len as usize]).await.map(|_| ())
            };
            let (a, b) = tokio::join!(writer, reader);
            a?;
            b?;
            if i >= 3 {
                k.push(t0.elapsed());
            }
        }
        print_row("tern", size, &mut t);
        print_row("tcp", size, &mut k);
    }
    conn.close(0, b"");
    Ok(())
}
