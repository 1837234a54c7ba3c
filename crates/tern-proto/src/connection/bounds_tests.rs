//! What a peer can make a receiver hold (issue 13, PROTOCOL.md §10): flows beyond the
//! limit, fragments and gaps beyond `max_recv_ranges`, datagrams beyond the queue, and
//! messages an application does not read, which flow control must stop.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

use crate::flow::FlowId;
use crate::message::{credit_cost, MessageOptions};
use crate::wire::{FlowFrame, Frame, MessageFrame, TransportErrorCode};
use crate::{ConnectionHandle, Dir, Endpoint, EndpointConfig, Side, StaticKeypair};

const CLIENT: &str = "127.0.0.1:5000";
const SERVER: &str = "127.0.0.1:4433";

/// Two endpoints and the datagrams between them (lossless, instant, time moves on demand).
struct Pair {
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    c: ConnectionHandle,
    s: ConnectionHandle,
}

impl Pair {
    /// A connected pair whose server connections use `server_conn`'s settings.
    fn new(server_conn: impl FnOnce(&mut crate::ConnectionConfig)) -> Self {
        let now = crate::cc::testing::epoch();
        let mut client = EndpointConfig::new(StaticKeypair::generate([1; 32]), [2; 32]);
        let mut server = EndpointConfig::new(StaticKeypair::generate([3; 32]), [4; 32]).server();
        server_conn(&mut server.connection);
        // The server announces the connection at the first flight, proven fresh by its
        // timestamp (PROTOCOL.md §7.6), whatever the client makes of the answer: these tests
        // feed the server's connection frames directly.
        let wall = std::time::Duration::from_secs(1_700_000_000);
        client.wall_clock = Some(wall);
        server.wall_clock = Some(wall);
        server.first_flight.trust_start = true;
        server.early_accept = true;
        let mut client = Endpoint::new(client, now);
        let server = Endpoint::new(server, now);
        let key = server.public_key();
        let c = client
            .connect(now, SERVER.parse().unwrap(), Some(key))
            .unwrap();
        let mut pair = Self {
            now,
            client,
            server,
            c,
            s: c,
        };
        pair.exchange();
        pair.s = pair.server.accept().expect("server accepted");
        pair.exchange();
        pair
    }

    fn exchange(&mut self) {
        let (c, s): (SocketAddr, SocketAddr) = (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
        loop {
            let mut progress = false;
            let mut buf = Vec::new();
            while let Some(t) = self.client.poll_transmit(self.now, &mut buf) {
                let mut d = buf[buf.len() - t.size..].to_vec();
                self.server.handle(self.now, c, None, &mut d);
                progress = true;
            }
            buf.clear();
            while let Some(t) = self.server.poll_transmit(self.now, &mut buf) {
                let mut d = buf[buf.len() - t.size..].to_vec();
                self.client.handle(self.now, s, None, &mut d);
                progress = true;
            }
            if !progress {
                return;
            }
        }
    }

    /// Runs timers less than a second away (pacing, delayed ACKs) and exchanges, up to
    /// `rounds` times.
    fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.exchange();
            let next = [self.client.poll_timeout(), self.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            // Only the near timers (pacing, ACK delay, loss): not the idle timeout of a
            // connection stalled on purpose.
            let Some(t) = next.filter(|t| *t <= self.now + std::time::Duration::from_secs(1))
            else {
                break;
            };
            self.now = self.now.max(t);
            self.client.handle_timeout(self.now);
            self.server.handle_timeout(self.now);
        }
        self.exchange();
    }

    fn server_conn(&mut self) -> &mut super::Connection {
        self.server.connection_mut(self.s).unwrap()
    }

    /// Hands `frames` to the server's connection as if one packet had carried them.
    fn inject(&mut self, frames: &[Frame<'_>]) -> Result<bool, super::recv::FrameError> {
        let mut payload = Vec::new();
        for f in frames {
            f.encode(&mut payload);
        }
        let now = self.now;
        self.server_conn().process_frames(now, 0, &payload)
    }
}

fn flow_frame(id: FlowId, offset: u64, data: &[u8]) -> Frame<'_> {
    Frame::Flow(FlowFrame {
        flow_id: id.0,
        offset,
        fin: false,
        data,
    })
}

#[test]
fn a_peer_opening_flows_beyond_the_limit_gets_flow_limit_error() {
    let mut p = Pair::new(|c| {
        c.flows.max_concurrent_uni = 4;
        c.flows.max_concurrent_bidi = 2;
    });
    let uni = |i| FlowId::new(Side::Client, Dir::Uni, i);
    let bidi = |i| FlowId::new(Side::Client, Dir::Bi, i);
    assert!(p.inject(&[flow_frame(uni(3), 0, b"ok")]).is_ok());
    assert!(p.inject(&[flow_frame(bidi(1), 0, b"ok")]).is_ok());
    for id in [uni(4), bidi(2), uni(1 << 40)] {
        let err = p.inject(&[flow_frame(id, 0, b"x")]).unwrap_err();
        assert_eq!(err.0, TransportErrorCode::FLOW_LIMIT_ERROR, "{id:?}");
    }
    // A reset or a credit frame opens flows as well, and is refused the same way.
    let reset = Frame::ResetFlow {
        flow_id: uni(9).0,
        error_code: 0,
        final_size: 0,
    };
    assert_eq!(
        p.inject(&[reset]).unwrap_err().0,
        TransportErrorCode::FLOW_LIMIT_ERROR
    );
}

#[test]
fn frames_about_a_flow_of_ours_never_opened_are_a_flow_state_error() {
    // Found by an outside read: they were dropped without a word.
    let mut p = Pair::new(|_| {});
    let ours = FlowId::new(Side::Server, Dir::Bi, 0);
    let stop = Frame::StopSending {
        flow_id: ours.0,
        error_code: 1,
    };
    let credit = Frame::MaxFlowData {
        flow_id: ours.0,
        max: 1 << 20,
    };
    for frame in [flow_frame(ours, 0, b"x"), stop, credit] {
        let err = p.inject(&[frame]).unwrap_err();
        assert_eq!(err.0, TransportErrorCode::FLOW_STATE_ERROR);
    }
    // Once opened (and even after it is gone), the same frames are fine.
    let opened = p.server_conn().open_flow(Dir::Bi).unwrap();
    assert_eq!(opened, ours);
    assert!(p.inject(&[flow_frame(ours, 0, b"x")]).is_ok());
}

#[test]
fn one_byte_flow_fragments_with_gaps_are_bounded() {
    let mut p = Pair::new(|c| c.max_recv_ranges = 100);
    let id = FlowId::new(Side::Client, Dir::Uni, 0);
    // In order, one byte per frame: one range, however many frames.
    for i in 0..1000 {
        p.inject(&[flow_frame(id, i, b"a")]).unwrap();
    }
    assert_eq!(p.server_conn().stats().recv_ranges, 1);
    // Every other byte: a range each, up to the limit...
    for k in 0..99 {
        p.inject(&[flow_frame(id, 2000 + 2 * k, b"b")]).unwrap();
    }
    let stats = p.server_conn().stats();
    assert_eq!(stats.recv_ranges, 100);
    assert_eq!(stats.flow_bytes_buffered, 1099);
    // ...and one more closes: the peer could otherwise make us hold ~100× its credit.
    let err = p.inject(&[flow_frame(id, 5000, b"c")]).unwrap_err();
    assert_eq!(err.0, TransportErrorCode::PROTOCOL_VIOLATION);
    // Duplicates and overlaps of what is held make no new range.
    let mut p = Pair::new(|c| c.max_recv_ranges = 3);
    for _ in 0..100 {
        p.inject(&[flow_frame(id, 10, &[1; 50]), flow_frame(id, 0, &[1; 30])])
            .unwrap();
    }
    assert_eq!(p.server_conn().stats().flow_bytes_buffered, 60);
}

#[test]
fn a_reset_flow_frees_what_it_held_and_its_credit() {
    let mut p = Pair::new(|_| {});
    let id = FlowId::new(Side::Client, Dir::Uni, 0);
    p.inject(&[
        flow_frame(id, 0, &[1; 100]),
        flow_frame(id, 1000, &[2; 100]),
    ])
    .unwrap();
    let stats = p.server_conn().stats();
    assert_eq!(
        (
            stats.flow_bytes_buffered,
            stats.recv_credit_used,
            stats.recv_ranges
        ),
        (200, 1100, 2)
    );
    let reset = Frame::ResetFlow {
        flow_id: id.0,
        error_code: 7,
        final_size: 5000,
    };
    p.inject(&[reset]).unwrap();
    let stats = p.server_conn().stats();
    assert_eq!(
        (
            stats.flow_bytes_buffered,
            stats.recv_credit_used,
            stats.recv_ranges
        ),
        (0, 0, 0)
    );
    let mut buf = [0; 10];
    assert_eq!(
        p.server_conn().read(id, &mut buf),
        Err(crate::ReadError::Reset(7))
    );
}

#[test]
fn one_byte_message_fragments_with_gaps_are_bounded() {
    let mut p = Pair::new(|c| c.max_recv_ranges = 50);
    let frag = |offset, data| {
        Frame::Message(MessageFrame {
            msg_id: 1, // unordered, seq 0
            ordered: false,
            priority: 3,
            total_len: 10_000,
            offset,
            deadline_us: None,
            reply_to: None,
            data,
        })
    };
    for k in 0..50 {
        p.inject(&[frag(2 * k, b"x")]).unwrap();
    }
    assert_eq!(p.server_conn().stats().recv_ranges, 50);
    let err = p.inject(&[frag(500, b"x")]).unwrap_err();
    assert_eq!(err.0, TransportErrorCode::PROTOCOL_VIOLATION);
}

#[test]
fn sparse_message_ids_are_bounded() {
    // Each message skipped above a gap is remembered as a range of finished IDs; a peer
    // skipping every other ID (for no credit) runs into the same bound.
    let mut p = Pair::new(|c| c.max_recv_ranges = 20);
    let mut result = Ok(true);
    for seq in 0..40u64 {
        let skip = Frame::MessageSkip {
            msg_id: ((2 * seq + 1) << 1) | 1,
            credit: 0,
        };
        result = p.inject(&[skip]);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(
        result.unwrap_err().0,
        TransportErrorCode::PROTOCOL_VIOLATION
    );
}

#[test]
fn a_message_skip_cannot_grant_the_peer_credit_it_never_had() {
    // What a skip counts is released at once (both ends agree on credit): unchecked, four
    // maximal skips would wrap the counters, and one would raise our window without limit.
    let mut p = Pair::new(|_| {});
    let max_data = p.server_conn().flows.local_max_data;
    let huge = Frame::MessageSkip {
        msg_id: (1 << 1) | 1,
        credit: (1 << 62) - 1,
    };
    assert_eq!(
        p.inject(&[huge]).unwrap_err().0,
        TransportErrorCode::FLOW_CONTROL_ERROR
    );
    assert_eq!(p.server_conn().flows.local_max_data, max_data);
    // A skip that counts more than is left of the window we gave (here: the peer's data
    // already fills all but 10 bytes of it) is refused too.
    let mut p = Pair::new(|_| {});
    let conn = p.server_conn();
    conn.flows.data_received = conn.flows.local_max_data - 10;
    let skip = Frame::MessageSkip {
        msg_id: (1 << 1) | 1,
        credit: credit_cost(100),
    };
    assert_eq!(
        p.inject(&[skip]).unwrap_err().0,
        TransportErrorCode::FLOW_CONTROL_ERROR
    );
    // One that fits is taken, and its credit given back.
    let mut p = Pair::new(|_| {});
    let skip = Frame::MessageSkip {
        msg_id: (1 << 1) | 1,
        credit: credit_cost(100),
    };
    assert!(p.inject(&[skip]).is_ok());
    assert_eq!(p.server_conn().flows.data_received, credit_cost(100));
}

/// A datagram of the largest size the connection offers is sent; one queued at that size
/// before the path's MTU fell (a PMTU fall-back, a move) is dropped and counted, and does not
/// hold back the ones behind it (found by an outside read: it blocked the queue for good).
#[test]
fn a_datagram_too_large_after_the_mtu_fell_is_dropped_not_blocking_the_queue() {
    let mut p = Pair::new(|_| {});
    let conn = p.client.connection_mut(p.c).unwrap();
    let largest = conn.max_datagram_payload().unwrap();
    conn.send_datagram(vec![1; largest].into()).unwrap();
    p.exchange();
    let got = p.server_conn().recv_datagram().map(|d| d.len());
    assert_eq!(got, Some(largest), "the largest offered is sent");
    let conn = p.client.connection_mut(p.c).unwrap();
    conn.send_datagram(vec![2; largest].into()).unwrap();
    conn.send_datagram(vec![3; 100].into()).unwrap();
    conn.paths[0].mtu = 1200;
    assert!(conn.max_datagram_payload().unwrap() < largest);
    p.exchange();
    let got: Vec<u8> = std::iter::from_fn(|| p.server_conn().recv_datagram())
        .map(|d| d[0])
        .collect();
    assert_eq!(got, vec![3], "the small one behind it arrived");
    let stats = p.client.connection(p.c).unwrap().stats();
    assert_eq!(stats.datagrams_dropped, 1, "{stats:?}");
}

#[test]
fn received_datagrams_are_bounded_in_count_and_bytes_dropping_the_oldest() {
    let mut p = Pair::new(|c| {
        c.datagram_queue = 4;
        c.datagram_queue_bytes = 1000;
    });
    for i in 0..10u8 {
        p.inject(&[Frame::Datagram { data: &[i; 300] }]).unwrap();
    }
    let stats = p.server_conn().stats();
    assert_eq!(stats.datagrams_buffered, 3, "1000 bytes hold three of 300");
    assert_eq!(stats.datagram_bytes_buffered, 900);
    assert_eq!(stats.datagrams_recv_dropped, 7);
    assert_eq!(stats.datagrams_dropped, 7);
    let kept: Vec<u8> = std::iter::from_fn(|| p.server_conn().recv_datagram())
        .map(|d| d[0])
        .collect();
    assert_eq!(kept, vec![7, 8, 9], "the newest are kept");
    for i in 0..10u8 {
        p.inject(&[Frame::Datagram { data: &[i; 10] }]).unwrap();
    }
    assert_eq!(
        p.server_conn().stats().datagrams_buffered,
        4,
        "the count bound"
    );
    // One larger than the whole byte bound is dropped itself.
    p.inject(&[Frame::Datagram { data: &[0; 1001] }]).unwrap();
    assert_eq!(p.server_conn().stats().datagrams_recv_dropped, 7 + 6 + 1);
}

#[test]
fn unread_messages_stop_the_sender_at_the_connection_window() {
    const WINDOW: u64 = 64 * 1024;
    const COUNT: usize = 300;
    let mut p = Pair::new(|c| c.flows.connection_window = WINDOW);
    // Each message names its index in its first bytes.
    let body = |i: usize| {
        let mut b = vec![(i % 251) as u8; 1000 + i % 7];
        b[..8].copy_from_slice(&(i as u64).to_be_bytes());
        Bytes::from(b)
    };
    for i in 0..COUNT {
        let now = p.now;
        let c = p.client.connection_mut(p.c).unwrap();
        let opts = if i % 3 == 0 {
            MessageOptions::default().unordered()
        } else {
            MessageOptions::default()
        };
        c.send_message(now, body(i), opts).unwrap();
    }
    p.run(200);
    let stats = p.server_conn().stats();
    assert!(stats.recv_credit_used <= WINDOW, "{stats:?}");
    assert!(
        stats.message_bytes_buffered
            + stats.messages_buffered * crate::message::MESSAGE_CREDIT_OVERHEAD
            <= WINDOW
    );
    assert!(stats.messages_buffered > 10, "the window filled: {stats:?}");
    let outstanding = p.client.connection(p.c).unwrap().outstanding_messages();
    assert!(
        outstanding >= COUNT - WINDOW as usize / credit_cost(1000) as usize,
        "the sender is held back by flow control: {outstanding} outstanding"
    );
    // The application reads: everything arrives, ordered ones in order.
    let mut got = Vec::new();
    for _ in 0..1000 {
        while let Some(m) = p.server_conn().recv_message() {
            got.push(m);
        }
        if got.len() == COUNT {
            break;
        }
        p.run(5);
        let stats = p.server_conn().stats();
        assert!(stats.recv_credit_used <= WINDOW, "{stats:?}");
    }
    assert_eq!(got.len(), COUNT);
    let ordered: Vec<u64> = got
        .iter()
        .filter(|m| m.id.is_ordered())
        .map(|m| m.id.seq())
        .collect();
    assert!(ordered.windows(2).all(|w| w[0] + 1 == w[1]), "{ordered:?}");
    let mut seen = vec![false; COUNT];
    for m in &got {
        let i = u64::from_be_bytes(m.data[..8].try_into().unwrap()) as usize;
        assert_eq!(m.data, body(i), "message {i} intact");
        assert!(!std::mem::replace(&mut seen[i], true), "message {i} twice");
    }
    assert_eq!(p.server_conn().stats().recv_credit_used, 0);
}

#[test]
fn a_message_beyond_the_credit_left_is_refused_before_anything_is_held() {
    // The receiver reserves a new message's whole size at its first fragment, so the
    // credit is checked first: a one-byte fragment of a message that does not fit is refused.
    let mut p = Pair::new(|_| {});
    let conn = p.server_conn();
    conn.flows.data_received = conn.flows.local_max_data - 10;
    let first = first_byte_of_a_message(1_000);
    assert_eq!(
        p.inject(&[first]).unwrap_err().0,
        TransportErrorCode::FLOW_CONTROL_ERROR
    );
    assert_eq!(p.server_conn().stats().messages_buffered, 0);
}

#[test]
fn a_message_over_the_size_limit_is_refused_as_too_large_not_as_beyond_credit() {
    let mut p = Pair::new(|_| {});
    let first = first_byte_of_a_message(p.server_conn().max_message_in() + 1);
    assert_eq!(
        p.inject(&[first]).unwrap_err().0,
        TransportErrorCode::MESSAGE_TOO_LARGE
    );
}

/// The first byte of unordered message 0, which says the message is `total_len` bytes.
fn first_byte_of_a_message(total_len: u64) -> Frame<'static> {
    Frame::Message(MessageFrame {
        msg_id: 1,
        ordered: false,
        priority: 3,
        total_len,
        offset: 0,
        deadline_us: None,
        reply_to: None,
        data: b"x",
    })
}
