//! Small test nodes shared by the integration tests: a paced constant-bit-rate source that can
//! also act as a sink that acknowledges what it receives.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tern_sim::{Datagram, Node, Recorder};

pub const DATA: u8 = 0;
pub const ACK: u8 = 1;
pub const ACK_SIZE: usize = 40;

pub fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

pub fn addr(last: u8) -> SocketAddr {
    SocketAddr::new(ip(last), 4433)
}

/// Reads the sequence number a [`Peer`] wrote.
pub fn seq_of(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[1..9]);
    u64::from_be_bytes(b)
}

/// A host that sends `to_send` datagrams of `size` bytes to `dst`, one every `interval` from
/// `start`, and/or receives: it counts and optionally logs arrivals, and optionally answers each
/// data datagram with a 40-byte ack. Buffers received are reused for what it sends, so a long
/// run does not allocate per packet.
pub struct Peer {
    pub me: SocketAddr,
    pub dst: Option<SocketAddr>,
    pub interval: Duration,
    pub size: usize,
    pub to_send: u64,
    pub next_send: Option<Instant>,
    due: u64,
    pub next_seq: u64,
    pub ack: bool,
    acks: VecDeque<(SocketAddr, u64)>,
    pub log: bool,
    /// (arrival time, sequence number, length) of each data datagram, when `log`.
    pub arrivals: Vec<(Instant, u64, usize)>,
    pub received: u64,
    pub received_bytes: u64,
    pub acks_received: u64,
    /// Done once this many data datagrams arrived and (if sending) all acks came back.
    pub expect: u64,
    pub wait_for_acks: bool,
    pool: Vec<Vec<u8>>,
    /// Records bytes received per data datagram into this series, when set.
    pub recorder: Option<(Recorder, Instant, String)>,
}

impl Peer {
    pub fn sink(me: SocketAddr) -> Self {
        Self {
            me,
            dst: None,
            interval: Duration::ZERO,
            size: 0,
            to_send: 0,
            next_send: None,
            due: 0,
            next_seq: 0,
            ack: false,
            acks: VecDeque::new(),
            log: false,
            arrivals: Vec::new(),
            received: 0,
            received_bytes: 0,
            acks_received: 0,
            expect: 0,
            wait_for_acks: false,
            pool: Vec::new(),
            recorder: None,
        }
    }

    /// A source sending `count` datagrams of `size` bytes every `interval`, starting at `start`.
    pub fn source(
        me: SocketAddr,
        dst: SocketAddr,
        start: Instant,
        interval: Duration,
        size: usize,
        count: u64,
    ) -> Self {
        Self {
            dst: Some(dst),
            interval,
            size,
            to_send: count,
            next_send: (count > 0).then_some(start),
            ..Self::sink(me)
        }
    }

    /// The interval that sends `size`-byte datagrams at exactly `rate_bps`.
    pub fn interval_for(rate_bps: u64, size: usize) -> Duration {
        Duration::from_nanos((size as u64 * 8 * 1_000_000_000) / rate_bps)
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(len, 0);
        buf
    }
}

impl Node for Peer {
    fn handle(&mut self, now: Instant, dgram: Datagram) {
        match dgram.data.first() {
            Some(&DATA) => {
                let seq = seq_of(&dgram.data);
                self.received += 1;
                self.received_bytes += dgram.data.len() as u64;
                if self.log {
                    self.arrivals.push((now, seq, dgram.data.len()));
                }
                if let Some((rec, epoch, name)) = &self.recorder {
                    rec.record(name, now - *epoch, dgram.data.len() as f64);
                }
                if self.ack {
                    self.acks.push_back((dgram.src, seq));
                }
            }
            Some(&ACK) => self.acks_received += 1,
            _ => {}
        }
        if self.pool.len() < 64 {
            self.pool.push(dgram.data);
        }
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Datagram> {
        if let Some((to, seq)) = self.acks.pop_front() {
            let mut data = self.buffer(ACK_SIZE);
            data[0] = ACK;
            data[1..9].copy_from_slice(&seq.to_be_bytes());
            return Some(Datagram::new(self.me, to, data));
        }
        if self.due > 0 {
            let dst = self.dst?;
            self.due -= 1;
            let mut data = self.buffer(self.size.max(9));
            data[0] = DATA;
            data[1..9].copy_from_slice(&self.next_seq.to_be_bytes());
            self.next_seq += 1;
            return Some(Datagram::new(self.me, dst, data));
        }
        None
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.next_send
    }

    fn handle_timeout(&mut self, now: Instant) {
        while let Some(t) = self.next_send {
            if t > now || self.to_send == 0 {
                break;
            }
            self.due += 1;
            self.to_send -= 1;
            self.next_send = (self.to_send > 0).then(|| t + self.interval);
        }
    }

    fn is_done(&self) -> bool {
        let sent_all = self.to_send == 0 && self.due == 0;
        let acked = !self.wait_for_acks || self.acks_received >= self.next_seq;
        sent_all && acked && self.received >= self.expect
    }
}
