//! `tern perf`: bulk throughput of one encrypted connection. `--compare-tcp` runs tern and
//! kernel TCP over loopback in the same process and run.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::util;
use crate::{PathArgs, ServerArgs};

/// Serves perf clients: reads every flow to the end and discards it.
pub(crate) async fn serve(args: &ServerArgs) -> Result<()> {
    let ep = util::bind_server(args, "tern perf")?;
    serve_on(ep, true).await;
    Ok(())
}

async fn serve_on(ep: tern::Endpoint, verbose: bool) {
    while let Some(conn) = ep.accept().await {
        tokio::spawn(async move {
            while let Ok(mut rx) = conn.accept_uni().await {
                let start = Instant::now();
                let mut total = 0u64;
                while let Ok(Some(chunk)) = rx.read_chunk(usize::MAX).await {
                    total += chunk.len() as u64;
                }
                if verbose {
                    let took = start.elapsed();
                    eprintln!(
                        "received {total} bytes in {:.2} s, {}",
                        took.as_secs_f64(),
                        util::rate(total, took)
                    );
                }
            }
        });
    }
}

/// Sends `bytes` (or for `time` seconds) on one flow; returns (bytes, elapsed).
async fn push(conn: &tern::Connection, bytes: u64, time: Option<f64>) -> Result<(u64, Duration)> {
    let block = Bytes::from(vec![0xa5u8; 1 << 20]);
    let mut flow = conn.open_uni().await?;
    let start = Instant::now();
    let deadline = time.map(|t| start + Duration::from_secs_f64(t));
    let mut sent = 0u64;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || (deadline.is_none() && sent >= bytes) {
            break;
        }
        let n = if deadline.is_some() {
            block.len() as u64
        } else {
            (bytes - sent).min(block.len() as u64)
        };
        flow.write_chunk(block.slice(..n as usize)).await?;
        sent += n;
    }
    flow.finish()?;
    flow.finished().await?;
    Ok((sent, start.elapsed()))
}

fn report(label: &str, bytes: u64, took: Duration, cpu: Duration, extra: &str) {
    let gb = bytes as f64 / 1e9;
    println!(
        "{label:<10} {:>8.1} MB in {:>6.2} s  goodput {:>13}  CPU {:>6.2} s ({:.2} s/GB){extra}",
        bytes as f64 / 1e6,
        took.as_secs_f64(),
        util::rate(bytes, took),
        cpu.as_secs_f64(),
        cpu.as_secs_f64() / gb.max(1e-9),
    );
}

/// Perf client against a remote `tern perf --server`.
pub(crate) async fn client(
    addr: SocketAddr,
    key: Option<&str>,
    paths: &PathArgs,
    bytes: u64,
    time: Option<f64>,
) -> Result<()> {
    let (ep, conn) = util::connect(addr, key, paths).await?;
    let cpu = util::cpu_time();
    let (sent, took) = push(&conn, bytes, time).await?;
    let cpu = util::cpu_time() - cpu;
    let s = conn.stats();
    report(
        "tern",
        sent,
        took,
        cpu,
        &(format!(
            "  lost {} pkts ({} spurious), resent {} B, rtt {}, ECN {}, {:.1} datagrams/sendmsg, AES-GCM by {}",
            s.packets_lost,
            s.spurious_losses,
            s.bytes_retransmitted,
            util::ms(s.rtt),
            s.ecn,
            {
                let io = ep.io_stats();
                io.datagrams_sent as f64 / io.send_calls.max(1) as f64
            },
            tern::packet_cipher(),
        ) + &match s.feedback_rate {
            // An explicit-rate router on the path stamped this rate (F12, `--cc explicit`).
            Some(rate) => format!(", router rate {}", util::rate(rate, Duration::from_secs(1))),
            None => String::new(),
        }),
    );
    util::print_paths(&conn, took);
    conn.close(0, b"");
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.closed()).await;
    Ok(())
}

/// tern and kernel TCP over loopback, side by side in one run. CPU time is the whole
/// process (sender and receiver), for both.
pub(crate) async fn compare_local(bytes: u64, time: Option<f64>) -> Result<()> {
    let server = crate::util::loopback_server()?;
    let addr = server.local_addr()?;
    let key = tern::keys::encode_public(&server.public_key());
    tokio::spawn(serve_on(server, false));
    let (ep, conn) = util::connect(addr, Some(&key), &PathArgs::default()).await?;
    println!("one connection over loopback, same process, same run (CPU = both ends)\n");
    let cpu = util::cpu_time();
    let (sent, took) = push(&conn, bytes, time).await?;
    let cpu = util::cpu_time() - cpu;
    let s = conn.stats();
    report(
        "tern",
        sent,
        took,
        cpu,
        &format!(
            "  (encrypted; cc {}{}; lost {} pkts, {} spurious; ECN {}; GSO {} segments/send, GRO {} \
             segments/receive)",
            util::controller(),
            if util::strict_losses() {
                " without loss tolerance"
            } else {
                ""
            },
            s.packets_lost,
            s.spurious_losses,
            s.ecn,
            ep.gso_segments(),
            ep.gro_segments()
        ),
    );
    conn.close(0, b"");

    // Kernel TCP, plain (no encryption): the same byte count or time.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let tcp_addr = listener.local_addr()?;
    let sink = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        s.write_all(b"k").await?;
        anyhow::Ok(total)
    });
    let mut stream = TcpStream::connect(tcp_addr).await?;
    let block = vec![0xa5u8; 1 << 20];
    let cpu = util::cpu_time();
    let start = Instant::now();
    let deadline = time.map(|t| start + Duration::from_secs_f64(t));
    let mut sent = 0u64;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || (deadline.is_none() && sent >= bytes) {
            break;
        }
        let n = if deadline.is_some() {
            block.len()
        } else {
            (bytes - sent).min(block.len() as u64) as usize
        };
        stream.write_all(&block[..n]).await?;
        sent += n as u64;
    }
    stream.shutdown().await?;
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await?;
    let took = start.elapsed();
    let cpu = util::cpu_time() - cpu;
    let received = sink.await??;
    report(
        "kernel TCP",
        received,
        took,
        cpu,
        "  (plain, no encryption)",
    );
    Ok(())
}
