//! The driver for connection-oriented byte-stream transports (kernel TCP and MPTCP, UDT,
//! SRT): blocking sockets, one thread per connection. A transport only supplies
//! [`Transport::listen`] and [`Transport::connect`]; the workload code is shared, so every
//! stream protocol runs exactly the same requests and flows.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::meter::Meter;
use super::video;
use crate::results::{FlowSample, RpcSample, TransferSample};
use crate::spec::{parse_rpc_header, payload, rpc_header, FlowPlan, RpcPlan, TransferPlan};

/// A connected byte stream, usable from two threads at once (one reading, one writing).
pub trait Conn: Send + Sync {
    /// Reads some bytes; `Ok(0)` at end of stream. A read timeout gives `WouldBlock` or
    /// `TimedOut`.
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes some bytes.
    fn send(&self, buf: &[u8]) -> io::Result<usize>;
    /// Bounds blocking reads.
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Unblocks and ends everything (both directions).
    fn shutdown(&self);
    /// The rate a video encoder on this connection should produce, bytes per second
    /// (`None`: not known yet, or the transport does not say).
    fn rate_hint(&self) -> Option<u64> {
        None
    }
    /// Bounds what the transport holds unacknowledged (the video sender,
    /// [`video::SEND_BUFFER`]); a transport without the knob keeps its own.
    fn limit_send_buffer(&self, _bytes: u32) {}
}

/// A listening socket.
pub trait Listener: Send + Sync {
    /// Waits for the next connection.
    fn accept(&self) -> io::Result<Box<dyn Conn>>;
    /// The bound address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// A stream protocol.
pub trait Transport: Send + Sync {
    /// Binds and listens.
    fn listen(&self, addr: SocketAddr) -> io::Result<Box<dyn Listener>>;
    /// Connects, from `bind` if given.
    fn connect(&self, addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<Box<dyn Conn>>;
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Writes all of `buf`.
pub fn send_all(c: &dyn Conn, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match c.send(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes (no read timeout must be set).
pub fn recv_exact(c: &dyn Conn, buf: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match c.recv(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and discards `n` bytes.
fn discard(c: &dyn Conn, mut n: u64, scratch: &mut [u8]) -> io::Result<()> {
    while n > 0 {
        let want = scratch.len().min(n as usize);
        let got = c.recv(&mut scratch[..want])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        n -= got as u64;
    }
    Ok(())
}

/// Sends `n` pattern bytes (`u64::MAX`: until the peer goes away).
fn send_bytes(c: &dyn Conn, mut n: u64, chunk: &[u8]) -> io::Result<()> {
    while n > 0 {
        let k = chunk.len().min(n as usize);
        send_all(c, &chunk[..k])?;
        if n != u64::MAX {
            n -= k as u64;
        }
    }
    Ok(())
}

/// Serves connections until the process is killed.
pub fn serve(listener: Box<dyn Listener>) -> io::Result<()> {
    loop {
        let conn = listener.accept()?;
        thread::spawn(move || {
            let _ = handle(conn.as_ref());
            conn.shutdown();
        });
    }
}

fn handle(c: &dyn Conn) -> io::Result<()> {
    let mut kind = [0u8; 1];
    recv_exact(c, &mut kind)?;
    let chunk = payload(64 << 10);
    let mut scratch = vec![0u8; 64 << 10];
    match kind[0] {
        b'R' => loop {
            let mut h = [0u8; 8];
            if recv_exact(c, &mut h).is_err() {
                return Ok(());
            }
            let (len, reply) = parse_rpc_header(&h);
            discard(c, u64::from(len), &mut scratch)?;
            send_bytes(c, u64::from(reply), &chunk)?;
        },
        b'F' => {
            let mut s = [0u8; 8];
            recv_exact(c, &mut s)?;
            send_bytes(c, u64::from_be_bytes(s), &chunk)?;
            // Wait for the client to close first, so the close never races the data.
            c.set_read_timeout(Some(Duration::from_secs(30)))?;
            let _ = c.recv(&mut scratch);
            Ok(())
        }
        b'V' => {
            let mut b = [0u8; 12];
            recv_exact(c, &mut b)?;
            let (frames, fps, playout_ms) = video::parse_request(&b);
            c.limit_send_buffer(video::SEND_BUFFER);
            send_video(c, frames, fps, playout_ms)?;
            c.set_read_timeout(Some(Duration::from_secs(30)))?;
            let _ = c.recv(&mut scratch);
            Ok(())
        }
        other => Err(io::Error::other(format!("unknown request kind {other}"))),
    }
}

/// The video sender (`proto::video`): an encoder thread produces `frames` frames at `fps`,
/// each sized by [`video::Encoder`] from the connection's rate hint and whether frames
/// still wait to be written; this thread writes them in order (blocking while the
/// transport's bounded buffer is full), skipping those already past their playout
/// ([`video::stale`]).
fn send_video(c: &dyn Conn, frames: u32, fps: u32, playout_ms: u32) -> io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let pending = AtomicU64::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    thread::scope(|s| {
        let pending = &pending;
        s.spawn(move || {
            let mut enc = video::Encoder::new(fps);
            let iv = Duration::from_secs_f64(1.0 / f64::from(fps.max(1)));
            let start = Instant::now();
            for i in 0..frames {
                sleep_until(start + iv * i);
                let size = enc.next_size(
                    c.rate_hint().map(video::RateHint::estimated),
                    pending.load(Relaxed) > 0,
                );
                let f = video::frame(i, size, video::monotonic_ns());
                pending.fetch_add(f.len() as u64, Relaxed);
                if tx.send(f).is_err() {
                    return; // the writer failed
                }
            }
        });
        // Ends when the encoder is done (its sender dropped) or on a write error (which
        // drops the receiver, and so stops the encoder).
        for f in rx {
            let late = video::sent_ns_of(&f)
                .is_some_and(|t| video::stale(t, video::monotonic_ns(), playout_ms));
            if !late {
                send_all(c, &f)?;
            }
            pending.fetch_sub(f.len() as u64, Relaxed);
        }
        Ok(())
    })
}

/// Sleeps until `t`.
pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

fn ms_since(epoch: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(epoch).as_secs_f64() * 1e3
}

/// Runs a request/response plan, one connection per request size.
pub fn rpc_client(
    t: &dyn Transport,
    addr: SocketAddr,
    bind: Option<IpAddr>,
    plan: &RpcPlan,
    epoch: Instant,
) -> (Vec<RpcSample>, Option<String>) {
    let mut out = Vec::new();
    let mut error = None;
    for &size in &plan.sizes {
        let reply = plan.reply.unwrap_or(size);
        let conn: Arc<dyn Conn> = match t.connect(addr, bind) {
            Ok(c) => Arc::from(c),
            Err(e) => {
                error.get_or_insert(format!("connect: {e}"));
                push_lost(&mut out, plan, size, reply, epoch);
                continue;
            }
        };
        if let Err(e) = send_all(conn.as_ref(), b"R") {
            error.get_or_insert(format!("send: {e}"));
        }
        let r = match plan.interval_ms {
            Some(iv) => open_loop(&conn, plan, size, reply, iv, epoch),
            None => closed_loop(conn.as_ref(), plan, size, reply, epoch),
        };
        conn.shutdown();
        if let Err(e) = &r.1 {
            error.get_or_insert(format!("size {size}: {e}"));
        }
        out.extend(r.0);
    }
    (out, error)
}

fn push_lost(out: &mut Vec<RpcSample>, plan: &RpcPlan, size: u32, reply: u32, epoch: Instant) {
    let t_ms = ms_since(epoch, Instant::now());
    out.extend((0..plan.per_size).map(|seq| RpcSample {
        seq,
        size,
        reply,
        t_ms,
        rtt_ms: None,
    }));
}

type PhaseResult = (Vec<RpcSample>, io::Result<()>);

fn open_loop(
    conn: &Arc<dyn Conn>,
    plan: &RpcPlan,
    size: u32,
    reply: u32,
    interval_ms: f64,
    epoch: Instant,
) -> PhaseResult {
    let n = plan.per_size as usize;
    let start = Instant::now() + Duration::from_millis(5);
    let sched: Vec<Instant> = (0..n)
        .map(|i| start + Duration::from_secs_f64(i as f64 * interval_ms / 1e3))
        .collect();
    let end = sched.last().copied().unwrap_or(start) + Duration::from_millis(plan.drain_ms);
    let writer_error = Arc::new(Mutex::new(None));
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let conn = conn.clone();
        let sched = sched.clone();
        let writer_error = writer_error.clone();
        let stopped = stopped.clone();
        thread::spawn(move || {
            let mut msg = rpc_header(size, reply).to_vec();
            msg.extend(payload(size as usize));
            for at in sched {
                sleep_until(at);
                if let Err(e) = send_all(conn.as_ref(), &msg) {
                    // A write cut off by our own shutdown at the end of the phase is not an
                    // error: the requests it carried are simply unanswered.
                    if !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        *writer_error.lock().unwrap() = Some(e);
                    }
                    return;
                }
            }
        })
    };
    let mut rtt: Vec<Option<f64>> = vec![None; n];
    let mut buf = vec![0u8; 64 << 10];
    let mut got: u64 = 0;
    let mut done = 0usize;
    let mut result = Ok(());
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    while done < n && Instant::now() < end {
        match conn.recv(&mut buf) {
            Ok(0) => {
                result = Err(io::ErrorKind::UnexpectedEof.into());
                break;
            }
            Ok(k) => {
                let now = Instant::now();
                got += k as u64;
                while done < n && got >= (done as u64 + 1) * u64::from(reply.max(1)) {
                    rtt[done] =
                        Some(now.saturating_duration_since(sched[done]).as_secs_f64() * 1e3);
                    done += 1;
                }
            }
            Err(e) if timed_out(&e) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    stopped.store(true, std::sync::atomic::Ordering::Relaxed);
    conn.shutdown();
    let _ = writer.join();
    if let Some(e) = writer_error.lock().unwrap().take() {
        if result.is_ok() && done < n {
            result = Err(e);
        }
    }
    let samples = (0..n)
        .map(|i| RpcSample {
            seq: i as u32,
            size,
            reply,
            t_ms: ms_since(epoch, sched[i]),
            rtt_ms: rtt[i],
        })
        .collect();
    (samples, result)
}

fn closed_loop(c: &dyn Conn, plan: &RpcPlan, size: u32, reply: u32, epoch: Instant) -> PhaseResult {
    let mut msg = rpc_header(size, reply).to_vec();
    msg.extend(payload(size as usize));
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::new();
    let mut result = Ok(());
    for seq in 0..plan.per_size {
        let t0 = Instant::now();
        let r = send_all(c, &msg).and_then(|()| discard(c, u64::from(reply), &mut buf));
        let rtt_ms = match r {
            Ok(()) => Some(t0.elapsed().as_secs_f64() * 1e3),
            Err(e) => {
                result = Err(e);
                None
            }
        };
        out.push(RpcSample {
            seq,
            size,
            reply,
            t_ms: ms_since(epoch, t0),
            rtt_ms,
        });
        if result.is_err() {
            break;
        }
    }
    (out, result)
}

/// Runs a flow plan: one thread per entry of `plan.sizes`, each flow on a new connection.
pub fn flows_client(
    t: &(dyn Transport + 'static),
    addr: SocketAddr,
    bind: Option<IpAddr>,
    plan: &FlowPlan,
    epoch: Instant,
) -> (Vec<FlowSample>, Option<String>) {
    let results: Vec<(Vec<FlowSample>, Option<String>)> = thread::scope(|s| {
        let handles: Vec<_> = plan
            .sizes
            .iter()
            .enumerate()
            .map(|(ti, sizes)| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut err = None;
                    for (i, &size) in sizes.iter().enumerate() {
                        let t0 = Instant::now();
                        let deadline = t0 + Duration::from_millis(plan.flow_timeout_ms);
                        let (received, e) = one_flow(t, addr, bind, size, deadline);
                        let done = received >= size;
                        if let Some(e) = e {
                            err.get_or_insert(format!("flow {ti}/{i}: {e}"));
                        }
                        out.push(FlowSample {
                            thread: ti as u32,
                            index: i as u32,
                            size,
                            start_ms: ms_since(epoch, t0),
                            fct_ms: done.then(|| t0.elapsed().as_secs_f64() * 1e3),
                            received,
                        });
                    }
                    (out, err)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut out = Vec::new();
    let mut err = None;
    for (f, e) in results {
        out.extend(f);
        if err.is_none() {
            err = e;
        }
    }
    (out, err)
}

fn one_flow(
    t: &dyn Transport,
    addr: SocketAddr,
    bind: Option<IpAddr>,
    size: u64,
    deadline: Instant,
) -> (u64, Option<String>) {
    let c = match t.connect(addr, bind) {
        Ok(c) => c,
        Err(e) => return (0, Some(format!("connect: {e}"))),
    };
    let mut req = vec![b'F'];
    req.extend(size.to_be_bytes());
    if let Err(e) = send_all(c.as_ref(), &req) {
        return (0, Some(format!("send: {e}")));
    }
    let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 256 << 10];
    let mut got = 0u64;
    let mut err = None;
    while got < size {
        if Instant::now() >= deadline {
            err = Some("timed out".to_string());
            break;
        }
        match c.recv(&mut buf) {
            Ok(0) => {
                err = Some("closed early".into());
                break;
            }
            Ok(k) => got += k as u64,
            Err(e) if timed_out(&e) => {}
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    c.shutdown();
    (got, err)
}

/// Runs one metered transfer ([`TransferPlan`]). With `resume_after_ms`, a connection that
/// delivers nothing for that long is given up and the rest asked for on a new one (what an
/// application on a transport that cannot survive the change has to do); the sample then
/// shows more than one connection and the time reconnecting took.
pub fn transfer_client(
    t: &dyn Transport,
    addr: SocketAddr,
    bind: Option<IpAddr>,
    plan: &TransferPlan,
    epoch: Instant,
) -> (TransferSample, Option<String>) {
    let mut meter = Meter::new(plan, epoch);
    let start = Instant::now();
    let deadline = start + Duration::from_millis(plan.timeout_ms);
    let (stop_at, due) = video::reading_bounds(plan, start);
    let mut deframer = video::Deframer::default();
    let mut buf = vec![0u8; 256 << 10];
    let mut error: Option<String> = None;
    let mut gave_up: Option<Instant> = None;
    let completed = 'conns: loop {
        let want = if plan.size == u64::MAX {
            u64::MAX
        } else {
            plan.size - meter.received()
        };
        let c = loop {
            match t.connect(addr, bind) {
                Ok(c) => break c,
                Err(e) if gave_up.is_some() && Instant::now() < deadline => {
                    // Reconnecting: the new address may not be usable yet.
                    let _ = e;
                    thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    error.get_or_insert(format!("connect: {e}"));
                    break 'conns false;
                }
            }
        };
        let req = video::request_for(plan, want);
        if let Err(e) = send_all(c.as_ref(), &req) {
            error.get_or_insert(format!("send: {e}"));
            break false;
        }
        let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
        let mut got = 0u64;
        let mut silent_since = Instant::now();
        let done = loop {
            let now = Instant::now();
            if stop_at.is_some_and(|s| now >= s) {
                break Some(true);
            }
            if now >= deadline {
                error.get_or_insert("timed out".into());
                break Some(false);
            }
            if let (Some(after), Some(_)) = (plan.resume_after_ms, meter.last()) {
                if now.saturating_duration_since(silent_since) >= Duration::from_millis(after) {
                    // Silent too long: give this connection up and reconnect.
                    break None;
                }
            }
            match c.recv(&mut buf) {
                Ok(0) => {
                    // A video flow ends when the sender has sent its last frame.
                    if due.is_some() {
                        break Some(true);
                    }
                    if got < want {
                        error.get_or_insert("closed early".into());
                    }
                    break Some(got >= want);
                }
                Ok(k) => {
                    let now = Instant::now();
                    if got == 0 {
                        if let Some(g) = gave_up {
                            meter.reconnected(now.saturating_duration_since(g).as_secs_f64() * 1e3);
                        }
                    }
                    meter.delivered_at(k, now);
                    got += k as u64;
                    silent_since = now;
                    if want != u64::MAX && got >= want {
                        break Some(true);
                    }
                    if let Some(due) = due {
                        if let Err(e) = deframer.push(&buf[..k], video::monotonic_ns()) {
                            error.get_or_insert(e);
                            break Some(false);
                        }
                        if deframer.frames.len() >= due as usize {
                            break Some(true);
                        }
                    }
                }
                Err(e) if timed_out(&e) => {}
                Err(e) => {
                    if plan.resume_after_ms.is_some() {
                        // Broken (reset, unreachable): reconnect at once.
                        error.get_or_insert(format!("connection broke: {e}"));
                        break None;
                    }
                    error.get_or_insert(e.to_string());
                    break Some(false);
                }
            }
        };
        c.shutdown();
        match done {
            Some(ok) => break ok,
            None => {
                error.get_or_insert(format!(
                    "connection silent for {} ms: reconnected",
                    plan.resume_after_ms.unwrap_or(0)
                ));
                gave_up = Some(Instant::now());
                meter.reconnecting();
            }
        }
    };
    let mut sample = meter.finish(completed);
    sample.video = video::sample(plan, due, deframer);
    (sample, error)
}
