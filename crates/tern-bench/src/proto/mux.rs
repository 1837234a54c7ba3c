//! The driver for multiplexing protocols (quinn, tern): async, one bidirectional stream (flow)
//! per request or transfer. A protocol supplies [`Mux`]; the workload code is shared, so
//! quinn and tern run exactly the same requests and flows.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::meter::{address_changes, local_addresses, Meter};
use super::video;
use crate::results::{FlowSample, RpcSample, TransferSample};
use crate::spec::{payload, FlowPlan, RpcPlan, TransferPlan};

/// A multiplexing protocol's client side.
pub trait Mux: Send + Sync + Sized + 'static {
    /// A connection handle.
    type Conn: Clone + Send + Sync + 'static;
    /// Sending half of a stream.
    type W: AsyncWrite + Unpin + Send + 'static;
    /// Receiving half of a stream.
    type R: AsyncRead + Unpin + Send + 'static;
    /// Opens a new connection to the server.
    fn connect(&self) -> impl Future<Output = io::Result<Self::Conn>> + Send;
    /// Opens a bidirectional stream.
    fn open_bi(conn: &Self::Conn) -> impl Future<Output = io::Result<(Self::W, Self::R)>> + Send;
    /// One request/response exchange: sends `msg` (kind `R`, reply size, payload) and reads
    /// the reply of `reply` bytes. `Ok(false)`: the protocol gave the request up at its
    /// deadline (no reply, by design). The default opens a stream per request.
    fn request(
        conn: &Self::Conn,
        msg: Arc<[u8]>,
        reply: u32,
    ) -> impl Future<Output = io::Result<bool>> + Send {
        async move { one_request::<Self>(conn, &msg, reply).await.map(|()| true) }
    }
    /// Closes a connection (no waiting).
    fn close(conn: &Self::Conn);
    /// Statistics worth keeping.
    fn stats(conn: &Self::Conn) -> Value;
    /// Whether the receiver can close its window (F7, [`Mux::close_window`]).
    const HAS_WINDOW: bool = false;
    /// Closes the receive window.
    fn close_window(_conn: &Self::Conn) {}
    /// Opens it again.
    fn open_window(_conn: &Self::Conn) {}
    /// Whether the client is an encoder that picks each request's size from the
    /// transport's rate ([`Mux::rate_hint`]) instead of cycling through the plan's sizes
    /// (tern's `adaptive:MS` mode, [`rpc_client`]).
    fn adaptive(&self) -> bool {
        false
    }
    /// The rate an encoder on this connection should produce, bytes per second (`None`: no
    /// estimate yet, or the protocol gives none).
    fn rate_hint(_conn: &Self::Conn) -> Option<u64> {
        None
    }
    /// The client's local addresses changed (`(old, new)` pairs): tell the protocol if it
    /// can be told (quinn: `Endpoint::rebind` on a new socket; tern:
    /// `Endpoint::local_ip_changed`). `Ok(false)`: it has no way to be told.
    fn rebind(&self, _changes: &[(IpAddr, IpAddr)]) -> io::Result<bool> {
        Ok(false)
    }
}

/// A stream's sending half that can take an owned buffer without copying it (quinn's and
/// tern's `write_chunk`): the bulk and reply data a server sends is one pattern buffer,
/// handed over by reference each time, as an application that owns its data would.
pub trait ChunkWrite: AsyncWrite + Unpin + Send {
    /// Queues `data`, waiting for room in the send buffer.
    fn write_owned(&mut self, data: bytes::Bytes) -> impl Future<Output = io::Result<()>> + Send;
}

/// Serves one stream: `R` request, `F` flow (see [`crate::spec`]), `V` video frames sized
/// from the connection's rate (`hint`, [`send_video`]), or `S`: the serving connection's
/// statistics as JSON (`stats`), so that a client can report the sender's losses.
pub async fn serve_stream<W, R>(
    mut w: W,
    mut r: R,
    stats: impl FnOnce() -> Value,
    hint: impl Fn() -> Option<video::RateHint> + Send + 'static,
) -> io::Result<()>
where
    W: ChunkWrite,
    R: AsyncRead + Unpin,
{
    let kind = r.read_u8().await?;
    match kind {
        b'R' => {
            let reply = r.read_u32().await?;
            let mut buf = vec![0u8; 64 << 10];
            while r.read(&mut buf).await? > 0 {}
            write_pattern(&mut w, u64::from(reply)).await?;
            w.shutdown().await?;
        }
        b'F' => {
            let size = r.read_u64().await?;
            write_pattern(&mut w, size).await?;
            w.shutdown().await?;
        }
        b'V' => {
            let frames = r.read_u32().await?;
            let fps = r.read_u32().await?;
            let playout_ms = r.read_u32().await?;
            send_video(&mut w, frames, fps, playout_ms, hint).await?;
            w.shutdown().await?;
        }
        b'S' => {
            let text = serde_json::to_vec(&stats()).map_err(io::Error::other)?;
            w.write_all(&text).await?;
            w.shutdown().await?;
        }
        other => return Err(io::Error::other(format!("unknown request kind {other}"))),
    }
    Ok(())
}

/// The video sender (`proto::video`): an encoder task produces `frames` frames at `fps`,
/// each sized by [`video::Encoder`] from `hint` and whether frames still wait to be
/// written; this task writes them in order (waiting while the transport's bounded send
/// buffer is full), skipping those already past their playout ([`video::stale`]).
async fn send_video<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: u32,
    fps: u32,
    playout_ms: u32,
    hint: impl Fn() -> Option<video::RateHint> + Send + 'static,
) -> io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let pending = Arc::new(AtomicU64::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let encoder = {
        let pending = pending.clone();
        tokio::spawn(async move {
            let mut enc = video::Encoder::new(fps);
            let iv = Duration::from_secs_f64(1.0 / f64::from(fps.max(1)));
            let start = tokio::time::Instant::now();
            for i in 0..frames {
                tokio::time::sleep_until(start + iv * i).await;
                let size = enc.next_size(hint(), pending.load(Relaxed) > 0);
                let f = video::frame(i, size, video::monotonic_ns());
                pending.fetch_add(f.len() as u64, Relaxed);
                if tx.send(f).is_err() {
                    return;
                }
            }
        })
    };
    let written = async {
        while let Some(f) = rx.recv().await {
            let late = video::sent_ns_of(&f)
                .is_some_and(|t| video::stale(t, video::monotonic_ns(), playout_ms));
            if !late {
                w.write_all(&f).await?;
            }
            pending.fetch_sub(f.len() as u64, Relaxed);
        }
        Ok(())
    }
    .await;
    encoder.abort();
    written
}

async fn write_pattern<W: ChunkWrite>(w: &mut W, mut n: u64) -> io::Result<()> {
    let chunk = bytes::Bytes::from(payload(64 << 10));
    while n > 0 {
        let k = chunk.len().min(n as usize);
        w.write_owned(chunk.slice(..k)).await?;
        if n != u64::MAX {
            n -= k as u64;
        }
    }
    Ok(())
}

async fn read_all<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf).await?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
    }
}

/// A request on a new two-way stream: the request and FIN, then the whole reply.
pub(crate) async fn one_request<M: Mux>(conn: &M::Conn, msg: &[u8], reply: u32) -> io::Result<()> {
    let (mut w, mut r) = M::open_bi(conn).await?;
    w.write_all(msg).await?;
    w.shutdown().await?;
    let got = read_all(&mut r).await?;
    if got != u64::from(reply) {
        return Err(io::Error::other(format!(
            "reply of {got} bytes, expected {reply}"
        )));
    }
    Ok(())
}

/// Where one timed request of a paced request load records its outcome: its round trip (ms,
/// from its scheduled time `at`) into slot `i` of `rtt`, or the load's first error.
struct Timed {
    i: usize,
    at: Instant,
    rtt: Arc<Mutex<Vec<Option<f64>>>>,
    first_error: Arc<Mutex<Option<String>>>,
    /// Cleared when the request ends (answered, given up or failed); `None`: not tracked.
    pending: Option<Arc<Mutex<Vec<bool>>>>,
}

impl Timed {
    /// Makes the request and records what came of it (nothing when the protocol gave it up at
    /// its deadline).
    async fn request<M: Mux>(self, conn: M::Conn, msg: Arc<[u8]>, reply: u32) {
        match M::request(&conn, msg, reply).await {
            Ok(true) => self.rtt.lock().unwrap()[self.i] = Some(ms_since(self.at, Instant::now())),
            Ok(false) => {}
            Err(e) => {
                self.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert(e.to_string());
            }
        }
        if let Some(pending) = &self.pending {
            pending.lock().unwrap()[self.i] = false;
        }
    }
}

/// Waits until every request task has ended or `drain_ms` has passed, whichever is first, and
/// aborts what is left.
async fn drain(tasks: &mut tokio::task::JoinSet<()>, drain_ms: u64) {
    let deadline = tokio::time::sleep(Duration::from_millis(drain_ms));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            r = tasks.join_next() => if r.is_none() { break },
            () = &mut deadline => break,
        }
    }
    tasks.abort_all();
}

fn ms_since(epoch: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(epoch).as_secs_f64() * 1e3
}

/// Runs a request/response plan, one connection per request size, one stream per request;
/// an adaptive client ([`Mux::adaptive`]) runs [`adaptive_client`] instead.
pub async fn rpc_client<M: Mux>(
    m: Arc<M>,
    plan: &RpcPlan,
    epoch: Instant,
) -> (Vec<RpcSample>, Option<String>, Value) {
    if let (true, Some(iv)) = (m.adaptive(), plan.interval_ms) {
        return adaptive_client(m, plan, iv, epoch).await;
    }
    let mut out = Vec::new();
    let mut error: Option<String> = None;
    let mut stats = Vec::new();
    for &size in &plan.sizes {
        let reply = plan.reply.unwrap_or(size);
        let mut msg = vec![b'R'];
        msg.extend(reply.to_be_bytes());
        msg.extend(payload(size as usize));
        let msg: Arc<[u8]> = msg.into();
        let n = plan.per_size as usize;
        let conn = match m.connect().await {
            Ok(c) => c,
            Err(e) => {
                error.get_or_insert(format!("connect: {e}"));
                let t_ms = ms_since(epoch, Instant::now());
                out.extend((0..n).map(|i| RpcSample {
                    seq: i as u32,
                    size,
                    reply,
                    t_ms,
                    rtt_ms: None,
                }));
                continue;
            }
        };
        let start = Instant::now() + Duration::from_millis(5);
        let mut sched = Vec::with_capacity(n);
        let rtt: Arc<Mutex<Vec<Option<f64>>>> = Arc::new(Mutex::new(vec![None; n]));
        let first_error: Arc<Mutex<Option<String>>> = Arc::default();
        match plan.interval_ms {
            Some(iv) => {
                let mut tasks = tokio::task::JoinSet::new();
                for i in 0..n {
                    let at = start + Duration::from_secs_f64(i as f64 * iv / 1e3);
                    sched.push(at);
                    tokio::time::sleep_until(at.into()).await;
                    let timed = Timed {
                        i,
                        at: dispatched(at),
                        rtt: rtt.clone(),
                        first_error: first_error.clone(),
                        pending: None,
                    };
                    tasks.spawn(timed.request::<M>(conn.clone(), msg.clone(), reply));
                }
                drain(&mut tasks, plan.drain_ms).await;
            }
            None => {
                for _ in 0..n {
                    let t0 = Instant::now();
                    sched.push(t0);
                    let i = sched.len() - 1;
                    match M::request(&conn, msg.clone(), reply).await {
                        Ok(true) => rtt.lock().unwrap()[i] = Some(ms_since(t0, Instant::now())),
                        Ok(false) => {}
                        Err(e) => {
                            first_error.lock().unwrap().get_or_insert(e.to_string());
                            break;
                        }
                    }
                }
            }
        }
        stats.push(M::stats(&conn));
        M::close(&conn);
        if let Some(e) = first_error.lock().unwrap().take() {
            error.get_or_insert(format!("size {size}: {e}"));
        }
        let rtt = rtt.lock().unwrap().clone();
        for (i, rtt_ms) in rtt.into_iter().enumerate() {
            out.push(RpcSample {
                seq: i as u32,
                size,
                reply,
                t_ms: sched
                    .get(i)
                    .or(sched.last())
                    .map_or(0.0, |t| ms_since(epoch, *t)),
                rtt_ms,
            });
        }
    }
    (out, error, Value::Array(stats))
}

/// The plan's load with the client as an encoder: as many open-loop requests (frames) as
/// the plan has in all (`per_size` × sizes), one every `interval_ms`, on one connection;
/// each frame's size is the largest plan size the transport's rate allows per interval,
/// less a pushback while earlier frames are late ([`crate::scenario::MarEncoder`]), read
/// when the frame is due. Samples carry the
/// frame number as `seq` and the size chosen.
pub async fn adaptive_client<M: Mux>(
    m: Arc<M>,
    plan: &RpcPlan,
    interval_ms: f64,
    epoch: Instant,
) -> (Vec<RpcSample>, Option<String>, Value) {
    let n = plan.per_size as usize * plan.sizes.len();
    let mut sizes = plan.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let reply_of = |size: u32| plan.reply.unwrap_or(size);
    // One prepared message per size: `R`, reply size, payload.
    let msgs: Vec<Arc<[u8]>> = sizes
        .iter()
        .map(|&size| {
            let mut msg = vec![b'R'];
            msg.extend(reply_of(size).to_be_bytes());
            msg.extend(payload(size as usize));
            msg.into()
        })
        .collect();
    let conn = match m.connect().await {
        Ok(c) => c,
        Err(e) => {
            let t_ms = ms_since(epoch, Instant::now());
            let size = sizes.first().copied().unwrap_or(0);
            let lost = (0..n).map(|i| RpcSample {
                seq: i as u32,
                size,
                reply: reply_of(size),
                t_ms,
                rtt_ms: None,
            });
            return (lost.collect(), Some(format!("connect: {e}")), Value::Null);
        }
    };
    let start = Instant::now() + Duration::from_millis(5);
    let mut sched = Vec::with_capacity(n);
    let mut chosen = Vec::with_capacity(n);
    let rtt: Arc<Mutex<Vec<Option<f64>>>> = Arc::new(Mutex::new(vec![None; n]));
    let pending = Arc::new(Mutex::new(vec![false; n]));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut encoder = crate::scenario::MarEncoder::default();
    for i in 0..n {
        let at = start + Duration::from_secs_f64(i as f64 * interval_ms / 1e3);
        sched.push(at);
        tokio::time::sleep_until(at.into()).await;
        let late = any_late(
            &sched,
            &pending.lock().unwrap(),
            &rtt.lock().unwrap(),
            interval_ms,
        );
        let size = encoder.next_size(M::rate_hint(&conn), interval_ms / 1e3, &sizes, late);
        chosen.push(size);
        let k = sizes.iter().position(|&s| s == size).unwrap_or(0);
        pending.lock().unwrap()[i] = true;
        let timed = Timed {
            i,
            at: dispatched(at),
            rtt: rtt.clone(),
            first_error: first_error.clone(),
            pending: Some(pending.clone()),
        };
        tasks.spawn(timed.request::<M>(conn.clone(), msgs[k].clone(), reply_of(size)));
    }
    drain(&mut tasks, plan.drain_ms).await;
    let stats = M::stats(&conn);
    M::close(&conn);
    let error = first_error.lock().unwrap().take();
    let rtt = rtt.lock().unwrap().clone();
    let out = rtt
        .into_iter()
        .zip(sched.iter().zip(&chosen))
        .enumerate()
        .map(|(i, (rtt_ms, (at, &size)))| RpcSample {
            seq: i as u32,
            size,
            reply: reply_of(size),
            t_ms: ms_since(epoch, *at),
            rtt_ms,
        })
        .collect();
    (out, error, Value::Array(vec![stats]))
}

/// Before the first answer, how long a frame may wait before it counts as late: a frame
/// unanswered this long on a fresh connection is queued behind a rate the link does not
/// have (the first answer on the drive traces comes after 40-60 ms).
const FIRST_ANSWER_PATIENCE_MS: f64 = 100.0;

/// Whether a frame still waiting for its answer is late ([`crate::scenario::MarEncoder`]):
/// sent more than the least round trip seen so far plus one frame interval ago, or
/// [`FIRST_ANSWER_PATIENCE_MS`] before any answer (a controller in slow start offers its
/// fastest-growing rate exactly then).
fn any_late(sched: &[Instant], pending: &[bool], rtt: &[Option<f64>], interval_ms: f64) -> bool {
    let patience_ms = rtt
        .iter()
        .flatten()
        .copied()
        .reduce(f64::min)
        .map_or(FIRST_ANSWER_PATIENCE_MS, |min_rtt| min_rtt + interval_ms);
    let now = Instant::now();
    let patience = Duration::from_secs_f64(patience_ms / 1e3);
    sched
        .iter()
        .zip(pending)
        .any(|(at, &waiting)| waiting && now.saturating_duration_since(*at) > patience)
}

/// Runs a flow plan: one task per thread, each flow on a new connection.
pub async fn flows_client<M: Mux>(
    m: Arc<M>,
    plan: &FlowPlan,
    epoch: Instant,
) -> (Vec<FlowSample>, Option<String>, Value) {
    let mut tasks = tokio::task::JoinSet::new();
    for (ti, sizes) in plan.sizes.iter().cloned().enumerate() {
        let m = m.clone();
        let timeout = Duration::from_millis(plan.flow_timeout_ms);
        tasks.spawn(async move {
            let mut out = Vec::new();
            let mut err = None;
            let mut stats = Value::Null;
            let count = sizes.len();
            for (i, size) in sizes.into_iter().enumerate() {
                let t0 = Instant::now();
                let got = Arc::new(Mutex::new(0u64));
                // The last flow of a thread also asks for the sender's statistics.
                let ask = i + 1 == count;
                let r = tokio::time::timeout(timeout, one_flow(&*m, size, got.clone(), ask)).await;
                let received = *got.lock().unwrap();
                let mut fct = t0.elapsed().as_secs_f64() * 1e3;
                let ok = match r {
                    Ok(Ok((s, done))) => {
                        stats = s;
                        fct = done.saturating_duration_since(t0).as_secs_f64() * 1e3;
                        received >= size
                    }
                    Ok(Err(e)) => {
                        err.get_or_insert(format!("flow {ti}/{i}: {e}"));
                        false
                    }
                    Err(_) => {
                        err.get_or_insert(format!("flow {ti}/{i}: timed out"));
                        false
                    }
                };
                out.push(FlowSample {
                    thread: ti as u32,
                    index: i as u32,
                    size,
                    start_ms: ms_since(epoch, t0),
                    fct_ms: ok.then_some(fct),
                    received,
                });
            }
            (out, err, stats)
        });
    }
    let mut out = Vec::new();
    let mut error = None;
    let mut stats = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok((f, e, s)) = r {
            out.extend(f);
            if error.is_none() {
                error = e;
            }
            stats.push(s);
        }
    }
    out.sort_by_key(|f| (f.thread, f.index));
    (out, error, Value::Array(stats))
}

/// Asks the server for a flow of `size` bytes (`F` + size on a new two-way flow, then FIN);
/// returns the flow's reading half.
async fn request_flow<M: Mux>(conn: &M::Conn, size: u64) -> io::Result<M::R> {
    let mut req = vec![b'F'];
    req.extend(size.to_be_bytes());
    request_stream::<M>(conn, &req).await
}

/// Sends `req` on a new two-way flow, then FIN; returns the flow's reading half.
async fn request_stream<M: Mux>(conn: &M::Conn, req: &[u8]) -> io::Result<M::R> {
    let (mut w, r) = M::open_bi(conn).await?;
    w.write_all(req).await?;
    w.shutdown().await?;
    Ok(r)
}

/// One flow on a new connection. Returns the statistics (`{"client": …}`, and with
/// `sender_stats` also `"server"`: the sending side's, asked for after the flow) and when
/// the last byte arrived.
async fn one_flow<M: Mux>(
    m: &M,
    size: u64,
    got: Arc<Mutex<u64>>,
    sender_stats: bool,
) -> io::Result<(Value, Instant)> {
    let conn = m.connect().await?;
    let result = async {
        let mut r = request_flow::<M>(&conn, size).await?;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let k = r.read(&mut buf).await?;
            if k == 0 {
                break;
            }
            *got.lock().unwrap() += k as u64;
        }
        let done = Instant::now();
        let mut stats = serde_json::json!({ "client": M::stats(&conn) });
        if sender_stats {
            // The flow is done: a statistics request that fails loses the statistics, not
            // the flow (it was counted failed; found by an outside read).
            match ask_stats::<M>(&conn).await {
                Ok(s) => stats["server"] = s,
                Err(e) => stats["server_error"] = e.to_string().into(),
            }
        }
        Ok::<_, io::Error>((stats, done))
    }
    .await;
    M::close(&conn);
    result
}

/// The server's statistics of this connection (an `S` stream).
async fn ask_stats<M: Mux>(conn: &M::Conn) -> io::Result<Value> {
    let (mut w, mut r) = M::open_bi(conn).await?;
    w.write_all(b"S").await?;
    w.shutdown().await?;
    let mut text = Vec::new();
    r.read_to_end(&mut text).await?;
    serde_json::from_slice(&text).map_err(io::Error::other)
}

/// Runs one metered transfer ([`TransferPlan`]) on one connection: asks for `size` bytes
/// (or reads for `duration_ms`), meters every delivery, closes and reopens the receive
/// window when told to, and tells the transport when the local addresses change if told to
/// follow them. Returns the sample, the first error and the statistics of both ends.
pub async fn transfer_client<M: Mux>(
    m: Arc<M>,
    plan: &TransferPlan,
    epoch: Instant,
) -> (TransferSample, Option<String>, Value) {
    let meter = Arc::new(Mutex::new(Meter::new(plan, epoch)));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(plan.timeout_ms);
    let (stop_at, due) = video::reading_bounds(plan, start);
    let deframer: Arc<Mutex<video::Deframer>> = Arc::default();
    let conn = match tokio::time::timeout_at(deadline.into(), m.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let s = meter.lock().unwrap().finish(false);
            return (s, Some(format!("connect: {e}")), Value::Null);
        }
        Err(_) => {
            let s = meter.lock().unwrap().finish(false);
            return (s, Some("connect: timed out".into()), Value::Null);
        }
    };
    let opened: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut side = tokio::task::JoinSet::new();
    let mut notes: Vec<String> = Vec::new();
    if let Some((close_ms, open_ms)) = plan.window_ms {
        if M::HAS_WINDOW {
            let (conn, opened) = (conn.clone(), opened.clone());
            side.spawn(async move {
                tokio::time::sleep_until((epoch + Duration::from_millis(close_ms)).into()).await;
                M::close_window(&conn);
                tokio::time::sleep_until((epoch + Duration::from_millis(open_ms)).into()).await;
                M::open_window(&conn);
                *opened.lock().unwrap() = Some(Instant::now());
            });
        } else {
            notes.push("no receive window to close".into());
        }
    }
    if plan.follow_address {
        let (m, meter) = (m.clone(), meter.clone());
        side.spawn(async move {
            let mut known = local_addresses();
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = local_addresses();
                if now != known && !now.is_empty() {
                    let changes = address_changes(&known, &now);
                    known = now;
                    if let Ok(true) = m.rebind(&changes) {
                        meter.lock().unwrap().rebound();
                    }
                }
            }
        });
    }
    let size = plan.size;
    let req = video::request_for(plan, size);
    let reading = {
        let (conn, meter, opened) = (conn.clone(), meter.clone(), opened.clone());
        let deframer = deframer.clone();
        async move {
            let mut r = request_stream::<M>(&conn, &req).await?;
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let k = match stop_at {
                    Some(stop) => {
                        match tokio::time::timeout_at(stop.into(), r.read(&mut buf)).await {
                            Ok(k) => k?,
                            Err(_) => return Ok::<_, io::Error>(true),
                        }
                    }
                    None => r.read(&mut buf).await?,
                };
                if k == 0 {
                    // A video sender ends its stream after its last frame (frames it
                    // skipped never come): that is the flow's normal end.
                    if due.is_some() {
                        return Ok(true);
                    }
                    break;
                }
                let now = Instant::now();
                let mut mt = meter.lock().unwrap();
                mt.delivered_at(k, now);
                if let Some(o) = opened.lock().unwrap().take() {
                    mt.window_resumed(now.saturating_duration_since(o).as_secs_f64() * 1e3);
                }
                if size != u64::MAX && mt.received() >= size {
                    break;
                }
                if let Some(due) = due {
                    let mut d = deframer.lock().unwrap();
                    d.push(&buf[..k], video::monotonic_ns())
                        .map_err(io::Error::other)?;
                    if d.frames.len() >= due as usize {
                        return Ok(true);
                    }
                }
            }
            Ok(meter.lock().unwrap().received() >= size)
        }
    };
    let (completed, mut error) = match tokio::time::timeout_at(deadline.into(), reading).await {
        Ok(Ok(done)) => (done, None),
        Ok(Err(e)) => (false, Some(format!("transfer: {e}"))),
        Err(_) => (false, Some("transfer: timed out".to_string())),
    };
    side.abort_all();
    if !completed && error.is_none() {
        error = Some("transfer: stream ended early".into());
    }
    let mut stats = serde_json::json!({ "client": M::stats(&conn) });
    if completed {
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(3), ask_stats::<M>(&conn)).await
        {
            stats["server"] = s;
        }
    }
    if !notes.is_empty() {
        stats["notes"] = Value::from(notes);
    }
    M::close(&conn);
    let mut sample = meter.lock().unwrap().finish(completed);
    let frames = std::mem::take(&mut *deframer.lock().unwrap());
    sample.video = video::sample(plan, due, frames);
    (sample, error, Value::Array(vec![stats]))
}

/// When a request planned for `at` is dispatched: now. tokio's timer rounds a deadline up to
/// the next millisecond, so the request leaves up to 1 ms after `at`; that lag is the
/// harness's, not the protocol's, and the thread-based drivers (TCP, UDP, UDT, SRT), whose
/// `thread::sleep` is accurate to microseconds, have none. Round trips are timed from here
/// (found by an outside read: tern's and quinn's MAR round trips carried 0.5–1 ms the others
/// did not).
fn dispatched(at: Instant) -> Instant {
    Instant::now().max(at)
}
