//! `tern send` / `tern recv` / `tern demo`: file transfer over one two-way flow, verified
//! end to end with SHA-256, resumable.
//!
//! Protocol on the flow (big-endian):
//! 1. sender → receiver: `TERNFIL1`, u16 name length, name (a bare file name), u64 size.
//! 2. receiver → sender: u64 offset to resume from (bytes of `NAME.part` already held), or
//!    `u64::MAX` followed by u16 length and an error message.
//! 3. sender → receiver: the bytes from the offset to the end, then 32 bytes SHA-256 of the
//!    whole file, then the end of the flow.
//! 4. receiver → sender: status byte (0 ok, 1 error), u16 length, message; end of flow.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use ring::digest;
use tokio::fs;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::util;
use crate::{ClientArgs, ServerArgs};

const MAGIC: &[u8; 8] = b"TERNFIL1";
const CHUNK: usize = 256 * 1024;

fn progress(total: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// Sends `path` to `args.addr`.
pub(crate) async fn send(path: &Path, args: &ClientArgs) -> Result<()> {
    // Check everything local before touching the network.
    let meta = fs::metadata(path)
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if path.file_name().and_then(|n| n.to_str()).is_none() {
        bail!("{} has no usable file name", path.display());
    }
    fs::File::open(path)
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    let addr = util::resolve(&args.addr)?;
    let (_ep, conn) = util::connect(addr, args.server_key.as_deref(), &args.paths).await?;
    let report = send_over(&conn, path, false).await;
    if let Ok((_, took)) = &report {
        util::print_paths(&conn, *took);
    }
    conn.close(0, b"bye");
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.closed()).await;
    let (bytes, took) = report?;
    println!(
        "sent {} ({} bytes) in {:.2} s, {}; verified by the receiver (SHA-256)",
        path.display(),
        bytes,
        took.as_secs_f64(),
        util::rate(bytes, took)
    );
    Ok(())
}

/// Sends one file on a new flow of `conn`; returns (bytes sent, time).
pub(crate) async fn send_over(
    conn: &tern::Connection,
    path: &Path,
    quiet: bool,
) -> Result<(u64, Duration)> {
    let mut file = fs::File::open(path)
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata().await?.len();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no usable file name", path.display()))?;
    let (mut tx, mut rx) = conn.open_bi().await?;
    let mut header = Vec::with_capacity(64);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&(name.len() as u16).to_be_bytes());
    header.extend_from_slice(name.as_bytes());
    header.extend_from_slice(&size.to_be_bytes());
    tx.write_all(&header).await?;
    let offset = rx.read_u64().await.context("the receiver did not answer")?;
    if offset == u64::MAX {
        // A status as at the end (failure flag, then the reason). Reading the reason without
        // the flag garbled every refusal into "flow ended after N bytes".
        let _failed = rx.read_u8().await?;
        let msg = read_message(&mut rx).await?;
        bail!("the receiver refused the file: {msg}");
    }
    if offset > size {
        bail!("the receiver holds more than the file ({offset} > {size} bytes)");
    }
    // Hash the part the receiver already has, then stream the rest while hashing it.
    let mut hash = digest::Context::new(&digest::SHA256);
    let mut buf = vec![0u8; CHUNK];
    let mut hashed = 0;
    while hashed < offset {
        let n = file
            .read(&mut buf[..CHUNK.min((offset - hashed) as usize)])
            .await?;
        if n == 0 {
            bail!("{} shrank while being sent", path.display());
        }
        hash.update(&buf[..n]);
        hashed += n as u64;
    }
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    if offset > 0 && !quiet {
        eprintln!("resuming at byte {offset} of {size}");
    }
    let bar = progress(size, quiet);
    bar.set_position(offset);
    let start = Instant::now();
    let mut sent = offset;
    let result: Result<()> = async {
        while sent < size {
            let n = file.read(&mut buf).await?;
            if n == 0 {
                bail!("{} shrank while being sent", path.display());
            }
            hash.update(&buf[..n]);
            tx.write_all(&buf[..n]).await?;
            sent += n as u64;
            bar.set_position(sent);
        }
        tx.write_all(hash.finish().as_ref()).await?;
        tx.finish()?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        // The receiver may have said why (disk full, …), or that it verified the whole file
        // before our last write returned (its status and close can overtake this task).
        match tokio::time::timeout(Duration::from_secs(2), read_status(&mut rx)).await {
            Ok(Ok((true, _))) => {
                bar.finish_and_clear();
                return Ok((size - offset, start.elapsed()));
            }
            Ok(Ok((false, msg))) => {
                bar.abandon();
                bail!("the receiver failed: {msg}");
            }
            _ => {
                bar.abandon();
                bail!(
                    "transfer interrupted after {sent} of {size} bytes ({e}); run the same command again to resume"
                );
            }
        }
    }
    let status = read_status(&mut rx).await.map_err(|e| {
        anyhow!("no confirmation from the receiver ({e}); run the same command again to resume")
    });
    bar.finish_and_clear();
    if let (false, msg) = status? {
        bail!("the receiver failed: {msg}");
    }
    Ok((size - offset, start.elapsed()))
}

/// Reads the receiver's final status: (verified, message).
async fn read_status(rx: &mut tern::RecvFlow) -> Result<(bool, String)> {
    let status = rx.read_u8().await?;
    let msg = read_message(rx).await?;
    Ok((status == 0, msg))
}

async fn read_message(rx: &mut tern::RecvFlow) -> Result<String> {
    let len = rx.read_u16().await? as usize;
    let mut text = vec![0u8; len];
    rx.read_exact(&mut text).await?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

async fn write_status(tx: &mut tern::SendFlow, ok: bool, msg: &str) -> Result<()> {
    let msg = &msg.as_bytes()[..msg.len().min(1000)];
    tx.write_u8(u8::from(!ok)).await?;
    tx.write_u16(msg.len() as u16).await?;
    tx.write_all(msg).await?;
    tx.finish()?;
    Ok(())
}

/// Serves `tern send` clients, writing files into `dir`.
pub(crate) async fn recv(args: &ServerArgs, dir: &Path, once: bool) -> Result<()> {
    fs::create_dir_all(dir)
        .await
        .with_context(|| format!("cannot use directory {}", dir.display()))?;
    let ep = util::bind_server(args, "tern recv")?;
    while let Some(conn) = ep.accept().await {
        let dir = dir.to_path_buf();
        let handle = tokio::spawn(async move {
            while let Ok((tx, rx)) = conn.accept_bi().await {
                let result = receive_file(tx, rx, &dir, false).await;
                match &result {
                    Ok((path, bytes)) => eprintln!(
                        "received {} ({bytes} bytes, SHA-256 verified)",
                        path.display()
                    ),
                    Err(e) => eprintln!("transfer failed: {e:#}"),
                }
                if once {
                    // The client closes once it has read the status: closing first could
                    // discard the status (and the acknowledgement of the client's last
                    // bytes) while still in flight, and the client would report a transfer
                    // that arrived as interrupted.
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
                    conn.close(0, b"done");
                    return result.map(|_| ());
                }
            }
            if once {
                // The one connection ended without sending a file: not a success.
                bail!("the connection ended without a file");
            }
            Ok(())
        });
        if once {
            return handle.await?;
        }
    }
    Ok(())
}

/// Receives one file from a flow; returns its final path and size.
pub(crate) async fn receive_file(
    mut tx: tern::SendFlow,
    mut rx: tern::RecvFlow,
    dir: &Path,
    quiet: bool,
) -> Result<(PathBuf, u64)> {
    let mut magic = [0u8; 8];
    rx.read_exact(&mut magic).await?;
    if &magic != MAGIC {
        bail!("not a tern file transfer");
    }
    let len = rx.read_u16().await? as usize;
    let mut name = vec![0u8; len];
    rx.read_exact(&mut name).await?;
    let size = rx.read_u64().await?;
    let name = String::from_utf8_lossy(&name).into_owned();
    // Only a bare name is accepted: no directories, no way out of `dir`.
    let bare = Path::new(&name)
        .file_name()
        .map(|n| n == name.as_str())
        .unwrap_or(false);
    if !bare || name.starts_with('.') {
        return refuse(
            &mut tx,
            "file name must be a bare name",
            anyhow!("refused file name {name:?}"),
        )
        .await;
    }
    let final_path = dir.join(&name);
    // One transfer per name at a time: two would append to one `.part` file, and the first
    // to finish would rename or delete it under the other (found by an outside read).
    let Some(_busy) = InProgress::claim(&final_path) else {
        let why = format!("{name} is being received from another sender; try again later");
        return refuse(
            &mut tx,
            &why,
            anyhow!("refused {name}: already in progress"),
        )
        .await;
    };
    if fs::symlink_metadata(&final_path).await.is_ok() {
        // Never replace what is there (a key file, another transfer's result): the sender
        // must rename, or the user move it away first (found by an outside read).
        let why = format!("{name} exists on the receiver; it is not replaced");
        return refuse(&mut tx, &why, anyhow!("refused {name}: it exists")).await;
    }
    let part = dir.join(format!("{name}.part"));
    let have = fs::metadata(&part)
        .await
        .map(|m| m.len())
        .unwrap_or(0)
        .min(size);
    let opened = async {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&part)
            .await
            .with_context(|| format!("cannot write {}", part.display()))?;
        out.set_len(have).await?;
        Ok::<_, anyhow::Error>(out)
    }
    .await;
    let mut out = match opened {
        Ok(out) => out,
        // The sender hears why, not an early end of stream.
        Err(e) => return refuse(&mut tx, &format!("{e:#}"), e).await,
    };
    tx.write_u64(have).await?;
    let bar = progress(size, quiet);
    bar.set_position(have);
    let mut got = have;
    let mut buf = vec![0u8; CHUNK];
    let result: Result<()> = async {
        while got < size {
            let want = CHUNK.min((size - got) as usize);
            let Some(n) = rx.read(&mut buf[..want]).await? else {
                bail!(
                    "the sender stopped after {got} of {size} bytes; the part is kept for resuming"
                );
            };
            out.write_all(&buf[..n])
                .await
                .with_context(|| format!("cannot write {}", part.display()))?;
            got += n as u64;
            bar.set_position(got);
        }
        out.flush().await?;
        out.sync_all().await?;
        Ok(())
    }
    .await;
    bar.finish_and_clear();
    if let Err(e) = result {
        let _ = rx.stop(1);
        // Tell the sender why, and wait until it has heard (or give up after a while).
        if write_status(&mut tx, false, &format!("{e:#}"))
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(Duration::from_secs(5), tx.finished()).await;
        }
        return Err(e);
    }
    let mut expected = [0u8; 32];
    rx.read_exact(&mut expected).await?;
    // Hash what is on disk: it is what the user gets, resumed parts included.
    let digest = hash_file(&part).await?;
    if digest.as_ref() != expected {
        let _ = fs::remove_file(&part).await;
        write_status(
            &mut tx,
            false,
            "SHA-256 mismatch: the file was corrupted; send it again",
        )
        .await?;
        let _ = tokio::time::timeout(Duration::from_secs(5), tx.finished()).await;
        bail!("SHA-256 mismatch for {name}");
    }
    fs::rename(&part, &final_path).await?;
    write_status(&mut tx, true, "verified").await?;
    let _ = tx.finished().await;
    Ok((final_path, size))
}

/// Refuses a file before any byte of it is taken: the offset `u64::MAX` and `why` for the
/// sender, `error` for this side.
async fn refuse(
    tx: &mut tern::SendFlow,
    why: &str,
    error: anyhow::Error,
) -> Result<(PathBuf, u64)> {
    tx.write_u64(u64::MAX).await?;
    write_status(tx, false, why).await?;
    let _ = tokio::time::timeout(Duration::from_secs(5), tx.finished()).await;
    Err(error)
}

async fn hash_file(path: &Path) -> Result<digest::Digest> {
    let mut f = fs::File::open(path).await?;
    let mut ctx = digest::Context::new(&digest::SHA256);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf).await?;
        if n == 0 {
            return Ok(ctx.finish());
        }
        ctx.update(&buf[..n]);
    }
}

/// The loopback demo: a server and a client in this process; a 64 MB file is sent and
/// verified, then a few round trips are timed.
pub(crate) async fn demo() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tern-demo-{}", std::process::id()));
    fs::create_dir_all(dir.join("in")).await?;
    // Removed however the demo ends: done, failed, or dropped by Ctrl-C (64–128 MB of files
    // were left behind on an interrupt; found by an outside read).
    let _cleanup = RemoveOnDrop(dir.clone());
    demo_in(&dir).await
}

/// A file name being received by this process, released when dropped.
struct InProgress(PathBuf);

impl InProgress {
    fn names() -> &'static std::sync::Mutex<std::collections::HashSet<PathBuf>> {
        static NAMES: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<PathBuf>>> =
            std::sync::OnceLock::new();
        NAMES.get_or_init(Default::default)
    }

    /// Claims `path`, unless another transfer holds it.
    fn claim(path: &Path) -> Option<Self> {
        let mut names = Self::names().lock().unwrap_or_else(|e| e.into_inner());
        names
            .insert(path.to_path_buf())
            .then(|| Self(path.to_path_buf()))
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut names = Self::names().lock().unwrap_or_else(|e| e.into_inner());
        names.remove(&self.0);
    }
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn demo_in(dir: &Path) -> Result<()> {
    let source = dir.join("payload.bin");
    let size = 64 << 20;
    {
        let mut data = vec![0u8; size];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for chunk in data.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = chunk.len();
            chunk.copy_from_slice(&x.to_le_bytes()[..n]);
        }
        fs::write(&source, &data).await?;
    }
    println!("tern demo: a server and a client on loopback (UDP), Noise IK, AES-256-GCM\n");
    let server = crate::util::loopback_server()?;
    let addr = server.local_addr()?;
    let key = tern::keys::encode_public(&server.public_key());
    println!("server on {addr}, key {key}");
    let inbox = dir.join("in");
    let srv = tokio::spawn({
        let server = server.clone();
        async move {
            let conn = server
                .accept()
                .await
                .ok_or_else(|| anyhow!("no connection"))?;
            let (tx, rx) = conn.accept_bi().await?;
            let got = receive_file(tx, rx, &inbox, true).await?;
            // Then echo round trips.
            while let Ok((mut tx, mut rx)) = conn.accept_bi().await {
                let m = rx.read_to_end(1 << 20).await?;
                tx.write_all(&m).await?;
                tx.finish()?;
            }
            anyhow::Ok(got)
        }
    });
    let setup = Instant::now();
    let (_ep, conn) = util::connect(addr, Some(&key), &crate::PathArgs::default()).await?;
    println!("handshake: {}", util::ms(setup.elapsed()));
    let cpu = util::cpu_time();
    let (bytes, took) = send_over(&conn, &source, false).await?;
    let cpu = util::cpu_time() - cpu;
    let stats = conn.stats();
    println!(
        "file: {} MB in {:.2} s = {}, SHA-256 verified by the receiver",
        bytes >> 20,
        took.as_secs_f64(),
        util::rate(bytes, took)
    );
    println!(
        "      CPU {:.2} s for both ends, {} datagrams sent, {} lost, rtt {}",
        cpu.as_secs_f64(),
        stats.datagrams_sent,
        stats.packets_lost,
        util::ms(stats.rtt)
    );
    for size in [64usize, 4096, 65536] {
        let mut rtts = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            let (mut tx, mut rx) = conn.open_bi().await?;
            tx.write_all(&vec![7u8; size]).await?;
            tx.finish()?;
            let back = rx.read_to_end(size).await?;
            if back.len() != size {
                bail!("echo returned {} bytes, sent {size}", back.len());
            }
            rtts.push(t.elapsed());
        }
        let (min, med, p99, _) = util::summary(&mut rtts);
        println!(
            "echo {size:>6} B: min {} median {} p99 {}",
            util::ms(min),
            util::ms(med),
            util::ms(p99)
        );
    }
    conn.close(0, b"demo done");
    conn.closed().await;
    let (path, n) = srv.await??;
    let same = hash_file(&path).await?.as_ref() == hash_file(&source).await?.as_ref();
    if !same || n != size as u64 {
        bail!("received file differs");
    }
    println!("\nclosed cleanly; received file identical ({n} bytes)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_transfer_per_name_at_a_time() {
        let path = Path::new("/inbox/one_transfer_per_name_at_a_time.bin");
        let first = InProgress::claim(path).expect("free");
        assert!(InProgress::claim(path).is_none(), "held by the first");
        drop(first);
        assert!(InProgress::claim(path).is_some(), "released");
    }
}
