//! Unreliable baselines: raw UDP and RTP over UDP. A request is cut into datagrams; the
//! server answers once every byte of it has arrived, so a request with one lost datagram
//! gets no reply (counted as lost, not retried). No congestion control, no pacing: a
//! 151 kB request leaves as one burst of datagrams, as a naive application would send it.
//!
//! Raw UDP datagrams carry a 16-byte header `[kind u8, 0, 0, 0][id u32][total u32][reply
//! u32]`. RTP datagrams are made by the `rtp` crate's packetizer (G.7xx-style payloader: plain
//! MTU-sized chunks, marker on the last, sequence numbers, one timestamp per request); the
//! request's total and reply size ride in an RFC 8285 one-byte header extension.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtp::packetizer::Packetizer;
use socket2::{Domain, Socket, Type};
use webrtc_util::marshal::{Marshal, Unmarshal};

use super::stream::sleep_until;
use crate::results::{FlowSample, RpcSample};
use crate::spec::{payload, FlowPlan, RpcPlan};

/// Application bytes per datagram (both framings stay under 1 400 B of UDP payload).
pub const CHUNK: usize = 1360;
const HDR: usize = 16;
const RTP_PT: u8 = 96;
const EXT_ID: u8 = 1;

/// Which framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Our 16-byte header.
    Plain,
    /// RTP (rtp crate).
    Rtp,
}

/// A decoded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    kind: u8,
    id: u32,
    total: u32,
    reply: u32,
    len: usize,
}

fn socket(bind: SocketAddr) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(bind), Type::DGRAM, None)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&bind.into())?;
    Ok(s.into())
}

fn encode_plain(kind: u8, id: u32, total: u32, reply: u32, data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut chunks: Vec<&[u8]> = data.chunks(CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for c in chunks {
        let mut d = Vec::with_capacity(HDR + c.len());
        d.extend([kind, 0, 0, 0]);
        d.extend(id.to_be_bytes());
        d.extend(total.to_be_bytes());
        d.extend(reply.to_be_bytes());
        d.extend_from_slice(c);
        out.push(d);
    }
    out
}

fn decode_plain(d: &[u8]) -> Option<Piece> {
    if d.len() < HDR {
        return None;
    }
    let u = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
    Some(Piece {
        kind: d[0],
        id: u(4),
        total: u(8),
        reply: u(12),
        len: d.len() - HDR,
    })
}

fn size_ext(total: u32, reply: u32) -> Bytes {
    let mut e = Vec::with_capacity(8);
    e.extend(total.to_be_bytes());
    e.extend(reply.to_be_bytes());
    Bytes::from(e)
}

fn finish_rtp(mut p: rtp::packet::Packet, total: u32, reply: u32) -> io::Result<Vec<u8>> {
    p.header.extension = true;
    p.header.extension_profile = 0xBEDE;
    p.header
        .set_extension(EXT_ID, size_ext(total, reply))
        .map_err(io::Error::other)?;
    Ok(p.marshal().map_err(io::Error::other)?.to_vec())
}

/// Request packets from the `rtp` crate's packetizer; the packetizer's timestamp advances
/// by one per request, so the timestamp identifies the request.
fn encode_rtp(
    pk: &mut dyn Packetizer,
    total: u32,
    reply: u32,
    data: &Bytes,
) -> io::Result<Vec<Vec<u8>>> {
    let packets = pk
        .packetize(data, 1)
        .map_err(|e| io::Error::other(e.to_string()))?;
    packets
        .into_iter()
        .map(|p| finish_rtp(p, total, reply))
        .collect()
}

/// Reply packets with the request's timestamp (built by hand: the packetizer owns its
/// timestamp).
fn encode_rtp_reply(ssrc: u32, seq: &mut u16, ts: u32, data: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let mut chunks: Vec<&[u8]> = data.chunks(CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let n = chunks.len();
    let total = data.len() as u32;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            *seq = seq.wrapping_add(1);
            let p = rtp::packet::Packet {
                header: rtp::header::Header {
                    version: 2,
                    marker: i + 1 == n,
                    payload_type: RTP_PT,
                    sequence_number: *seq,
                    timestamp: ts,
                    ssrc,
                    ..Default::default()
                },
                payload: Bytes::copy_from_slice(c),
            };
            finish_rtp(p, total, 0)
        })
        .collect()
}

fn decode_rtp(d: &[u8]) -> Option<(Piece, u32)> {
    let mut b = Bytes::copy_from_slice(d);
    let p = rtp::packet::Packet::unmarshal(&mut b).ok()?;
    let e = p.header.get_extension(EXT_ID)?;
    if e.len() < 8 {
        return None;
    }
    Some((
        Piece {
            kind: b'R',
            id: p.header.timestamp,
            total: u32::from_be_bytes([e[0], e[1], e[2], e[3]]),
            reply: u32::from_be_bytes([e[4], e[5], e[6], e[7]]),
            len: p.payload.len(),
        },
        p.header.ssrc,
    ))
}

/// Serves until the process is killed.
pub fn serve(
    addr: SocketAddr,
    framing: Framing,
) -> io::Result<(SocketAddr, thread::JoinHandle<()>)> {
    let sock = socket(addr)?;
    let local = sock.local_addr()?;
    let h = thread::spawn(move || {
        let mut pending: HashMap<(SocketAddr, u32), u64> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        let data = payload(16 << 20);
        let mut seq: u16 = 0;
        let ssrc = rand::random::<u32>();
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let piece = match framing {
                Framing::Plain => decode_plain(&buf[..n]),
                Framing::Rtp => decode_rtp(&buf[..n]).map(|(p, _)| p),
            };
            let Some(p) = piece else { continue };
            if p.kind == b'F' {
                let Ok(s) = sock.try_clone() else { continue };
                thread::spawn(move || {
                    blast(&s, from, u64::from(p.total) * u64::from(p.reply.max(1)))
                });
                continue;
            }
            let got = pending.entry((from, p.id)).or_insert(0);
            *got += p.len as u64;
            if *got >= u64::from(p.total) {
                pending.remove(&(from, p.id));
                if pending.len() > 100_000 {
                    pending.clear();
                }
                let reply = &data[..(p.reply as usize).min(data.len())];
                let dgrams = match framing {
                    Framing::Plain => encode_plain(b'A', p.id, p.reply, 0, reply),
                    Framing::Rtp => {
                        encode_rtp_reply(ssrc, &mut seq, p.id, reply).unwrap_or_default()
                    }
                };
                for d in dgrams {
                    let _ = sock.send_to(&d, from);
                }
            }
        }
    });
    Ok((local, h))
}

/// Sends `n` bytes to `to` as fast as the socket takes them, then end markers.
fn blast(s: &UdpSocket, to: SocketAddr, n: u64) {
    let chunk = payload(CHUNK);
    let mut d = vec![b'D', 0, 0, 0];
    d.extend([0u8; 12]);
    d.extend_from_slice(&chunk);
    let mut left = n;
    while left > 0 {
        let k = (CHUNK as u64).min(left) as usize;
        if s.send_to(&d[..HDR + k], to).is_err() {
            thread::sleep(Duration::from_micros(50));
            continue;
        }
        left -= k as u64;
    }
    for _ in 0..5 {
        let _ = s.send_to(&[b'E', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], to);
        thread::sleep(Duration::from_millis(2));
    }
}

fn ms_since(epoch: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(epoch).as_secs_f64() * 1e3
}

/// Runs a request/response plan over UDP or RTP, one socket per request size.
pub fn rpc_client(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    plan: &RpcPlan,
    framing: Framing,
    epoch: Instant,
) -> (Vec<RpcSample>, Option<String>) {
    let mut out = Vec::new();
    let mut error = None;
    let local = SocketAddr::new(bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0);
    for &size in &plan.sizes {
        let reply = plan.reply.unwrap_or(size);
        let n = plan.per_size as usize;
        let sock = match socket(local).and_then(|s| s.connect(addr).map(|()| s)) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                error.get_or_insert(format!("socket: {e}"));
                continue;
            }
        };
        // Every request of a phase, as datagrams, and its id.
        let data = Bytes::from(payload(size as usize));
        let mut requests: Vec<(u32, Vec<Vec<u8>>)> = Vec::with_capacity(n);
        let mut pk = rtp::packetizer::new_packetizer(
            CHUNK + 12,
            RTP_PT,
            rand::random(),
            Box::new(rtp::codecs::g7xx::G7xxPayloader),
            Box::new(rtp::sequence::new_random_sequencer()),
            90_000,
        );
        for i in 0..n {
            let r = match framing {
                Framing::Plain => Ok((i as u32, encode_plain(b'R', i as u32, size, reply, &data))),
                Framing::Rtp => encode_rtp(&mut pk, size, reply, &data).map(|d| {
                    let ts = decode_rtp(&d[0]).map_or(0, |(p, _)| p.id);
                    (ts, d)
                }),
            };
            match r {
                Ok(x) => requests.push(x),
                Err(e) => {
                    error.get_or_insert(format!("packetize: {e}"));
                    break;
                }
            }
        }
        let index: HashMap<u32, usize> = requests
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (*id, i))
            .collect();
        let start = Instant::now() + Duration::from_millis(5);
        let sched: Vec<Instant> = match plan.interval_ms {
            Some(iv) => (0..n)
                .map(|i| start + Duration::from_secs_f64(i as f64 * iv / 1e3))
                .collect(),
            None => Vec::new(),
        };
        let rtt: Vec<Option<f64>> = if plan.interval_ms.is_some() {
            let sender = {
                let sock = sock.clone();
                let sched = sched.clone();
                let dgrams: Vec<Vec<Vec<u8>>> = requests.iter().map(|r| r.1.clone()).collect();
                thread::spawn(move || {
                    for (at, ds) in sched.into_iter().zip(dgrams) {
                        sleep_until(at);
                        for d in ds {
                            let _ = sock.send(&d);
                        }
                    }
                })
            };
            let end = sched.last().copied().unwrap_or(start) + Duration::from_millis(plan.drain_ms);
            let r = receive_replies(&sock, &index, framing, n, end, |i| sched[i]);
            let _ = sender.join();
            r
        } else {
            let mut rtt = vec![None; n];
            let starts = Arc::new(Mutex::new(vec![start; n]));
            for (i, (_, ds)) in requests.iter().enumerate() {
                let t0 = Instant::now();
                starts.lock().unwrap()[i] = t0;
                for d in ds {
                    let _ = sock.send(d);
                }
                let end = t0 + Duration::from_millis(plan.drain_ms.max(200));
                let one: HashMap<u32, usize> = [(requests[i].0, 0usize)].into();
                rtt[i] = receive_replies(&sock, &one, framing, 1, end, |_| t0)[0];
            }
            let s = starts.lock().unwrap().clone();
            out.extend((0..n).map(|i| RpcSample {
                seq: i as u32,
                size,
                reply,
                t_ms: ms_since(epoch, s[i]),
                rtt_ms: rtt[i],
            }));
            continue;
        };
        out.extend((0..n).map(|i| RpcSample {
            seq: i as u32,
            size,
            reply,
            t_ms: ms_since(epoch, sched[i]),
            rtt_ms: rtt[i],
        }));
    }
    (out, error)
}

fn receive_replies(
    sock: &UdpSocket,
    index: &HashMap<u32, usize>,
    framing: Framing,
    n: usize,
    end: Instant,
    sent_at: impl Fn(usize) -> Instant,
) -> Vec<Option<f64>> {
    let mut rtt = vec![None; n];
    let mut got: HashMap<u32, u64> = HashMap::new();
    let mut done = 0;
    let mut buf = vec![0u8; 65536];
    let _ = sock.set_read_timeout(Some(Duration::from_millis(20)));
    while done < n && Instant::now() < end {
        let Ok(k) = sock.recv(&mut buf) else { continue };
        let piece = match framing {
            Framing::Plain => decode_plain(&buf[..k]).filter(|p| p.kind == b'A'),
            Framing::Rtp => decode_rtp(&buf[..k]).map(|(p, _)| p),
        };
        let Some(p) = piece else { continue };
        let Some(&i) = index.get(&p.id) else { continue };
        if rtt[i].is_some() {
            continue;
        }
        let g = got.entry(p.id).or_insert(0);
        *g += p.len as u64;
        if *g >= u64::from(p.total) {
            rtt[i] = Some(
                Instant::now()
                    .saturating_duration_since(sent_at(i))
                    .as_secs_f64()
                    * 1e3,
            );
            done += 1;
        }
    }
    rtt
}

/// Flows over raw UDP: the server sends the bytes unpaced; the client counts what arrives.
/// Only meaningful as a ceiling (bulk on loopback).
pub fn flows_client(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    plan: &FlowPlan,
    epoch: Instant,
) -> (Vec<FlowSample>, Option<String>) {
    let local = SocketAddr::new(bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0);
    let mut out = Vec::new();
    let mut error = None;
    for (ti, sizes) in plan.sizes.iter().enumerate() {
        for (i, &size) in sizes.iter().enumerate() {
            let t0 = Instant::now();
            let r = (|| -> io::Result<(u64, Option<Instant>)> {
                let s = socket(local)?;
                s.connect(addr)?;
                // total × reply = size (both u32).
                let (a, b) = split_u64(size);
                s.send(&encode_plain(b'F', 0, a, b, &[])[0])?;
                s.set_read_timeout(Some(Duration::from_millis(500)))?;
                let mut buf = vec![0u8; 65536];
                let mut got = 0u64;
                let mut last = None;
                let deadline = t0 + Duration::from_millis(plan.flow_timeout_ms);
                while Instant::now() < deadline {
                    let Ok(k) = s.recv(&mut buf) else { break };
                    match buf.first() {
                        Some(b'D') => {
                            got += (k - HDR) as u64;
                            last = Some(Instant::now());
                        }
                        Some(b'E') => break,
                        _ => {}
                    }
                }
                Ok((got, last))
            })();
            let (received, last) = r.unwrap_or_else(|e| {
                error.get_or_insert(e.to_string());
                (0, None)
            });
            out.push(FlowSample {
                thread: ti as u32,
                index: i as u32,
                size,
                start_ms: ms_since(epoch, t0),
                fct_ms: last.map(|l| l.saturating_duration_since(t0).as_secs_f64() * 1e3),
                received,
            });
        }
    }
    (out, error)
}

fn split_u64(n: u64) -> (u32, u32) {
    // Find a factorisation into two u32 (exact for sizes that are multiples of 1 MiB or
    // below 4 GiB).
    if n <= u64::from(u32::MAX) {
        (n as u32, 1)
    } else {
        ((n >> 20) as u32, 1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtp_round_trip() {
        let mut pk = rtp::packetizer::new_packetizer(
            CHUNK + 12,
            RTP_PT,
            7,
            Box::new(rtp::codecs::g7xx::G7xxPayloader),
            Box::new(rtp::sequence::new_random_sequencer()),
            90_000,
        );
        let data = Bytes::from(payload(4500));
        let d = encode_rtp(&mut pk, 4500, 100, &data).unwrap();
        assert_eq!(d.len(), 4);
        let pieces: Vec<Piece> = d.iter().map(|x| decode_rtp(x).unwrap().0).collect();
        assert_eq!(pieces.iter().map(|p| p.len).sum::<usize>(), 4500);
        assert!(pieces
            .iter()
            .all(|p| p.total == 4500 && p.reply == 100 && p.id == pieces[0].id));
        assert!(d.iter().all(|x| x.len() <= 1400));
        let d2 = encode_rtp(&mut pk, 4500, 100, &data).unwrap();
        assert_eq!(
            decode_rtp(&d2[0]).unwrap().0.id,
            pieces[0].id.wrapping_add(1)
        );
        let p = decode_plain(&encode_plain(b'R', 3, 10, 20, &[1; 10])[0]).unwrap();
        assert_eq!(
            (p.kind, p.id, p.total, p.reply, p.len),
            (b'R', 3, 10, 20, 10)
        );
    }
}
