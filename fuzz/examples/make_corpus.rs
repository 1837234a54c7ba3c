//! Writes the seed corpora in `fuzz/corpus/<target>/`: valid encodings made with tern-proto's
//! public encoders and real endpoints, so the fuzzer starts from inputs that decode.
//!
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --example make_corpus`
//!
//! Deterministic: the same tern-proto gives the same files. Existing seeds of the same names
//! are overwritten; other files are left alone.

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;

use tern_proto::wire::{
    encode_ack, encode_nack, encode_stateless_reset, ConnectionId, FlowFrame, Frame,
    HandshakeHeader, InitialHeader, LongHeaderInvariants, MessageFrame, PathStatusCode, RateArea,
    RetryHeader, ShortHeader, TransportParams, VersionNegotiation, SUPPORTED_VERSIONS, VERSION_1,
};
use tern_proto::Endpoint;
use tern_proto_fuzz::script::{self, fate};
use tern_proto_fuzz::{client_config, drain_transmits, epoch, recv, server_config, SERVER};

struct Corpus {
    dir: PathBuf,
    total: usize,
}

impl Corpus {
    fn new() -> Self {
        Corpus {
            dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus"),
            total: 0,
        }
    }

    fn put(&mut self, target: &str, name: &str, data: &[u8]) {
        let dir = self.dir.join(target);
        fs::create_dir_all(&dir).expect("create corpus dir");
        fs::write(dir.join(name), data).expect("write seed");
        self.total += data.len();
    }
}

/// The datagrams of a real IK (or XX) handshake and a short exchange after it: the client
/// sends `payload` on a flow, the server echoes it, and timers run until both are quiet.
fn real_datagrams(ik: bool, payload: &[u8]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut now = epoch();
    let mut client = Endpoint::new(client_config(), now);
    let mut server = Endpoint::new(server_config(), now);
    let key = ik.then(|| server.public_key());
    let c = client.connect(now, SERVER, key).expect("connect");
    let conn = client.connection_mut(c).expect("client connection");
    let flow = conn.open_flow(tern_proto::Dir::Bi).expect("open");
    conn.write(flow, payload).expect("write");
    conn.finish(flow).expect("finish");
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    let mut echoed = false;
    for _ in 0..40 {
        let mut c2s = Vec::new();
        drain_transmits(&mut client, now, |_, d| c2s.push(d.to_vec()));
        let mut s2c = Vec::new();
        drain_transmits(&mut server, now, |_, d| s2c.push(d.to_vec()));
        if c2s.is_empty() && s2c.is_empty() {
            let next = [client.poll_timeout(), server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t < epoch() + std::time::Duration::from_secs(1) => {
                    now = now.max(t);
                    client.handle_timeout(now);
                    server.handle_timeout(now);
                    continue;
                }
                _ => break,
            }
        }
        for d in &c2s {
            server.handle(now, tern_proto_fuzz::CLIENT, None, &mut d.clone());
        }
        for d in &s2c {
            client.handle(now, SERVER, None, &mut d.clone());
        }
        from_client.extend(c2s);
        from_server.extend(s2c);
        if !echoed {
            if let Some(s) = server.accept() {
                let conn = server.connection_mut(s).expect("server connection");
                if let Some(id) = conn.accept_flow(tern_proto::Dir::Bi) {
                    let _ = conn.write(id, b"echo");
                    let _ = conn.finish(id);
                    echoed = true;
                }
            }
        }
    }
    (from_client, from_server)
}

fn headers(corpus: &mut Corpus) {
    let t = "header";
    let (ik_client, ik_server) = real_datagrams(true, b"hello tern");
    let (xx_client, xx_server) = real_datagrams(false, b"hello tern");
    corpus.put(t, "ik-initial", &ik_client[0]);
    corpus.put(t, "xx-initial", &xx_client[0]);
    if let Some(d) = ik_server.first() {
        corpus.put(t, "ik-response", d);
    }
    if let Some(d) = xx_server.first() {
        corpus.put(t, "xx-response", d);
    }
    if let Some(d) = xx_client.get(1) {
        corpus.put(t, "xx-msg3", d);
    }
    for (i, d) in ik_client.iter().skip(1).take(2).enumerate() {
        corpus.put(t, &format!("ik-client-short-{i}"), d);
    }
    for (i, d) in ik_server.iter().skip(1).take(2).enumerate() {
        corpus.put(t, &format!("ik-server-short-{i}"), d);
    }

    let a = ConnectionId::from_array([0xa1; 8]);
    let b = ConnectionId::from_array([0xb2, 0xb3, 0xb4, 0xb5]);
    let mut buf = Vec::new();
    InitialHeader {
        version: VERSION_1,
        dcid: a,
        scid: b,
        token: b"token",
    }
    .encode(5, &mut buf);
    buf.extend_from_slice(b"hello");
    corpus.put(t, "initial-token", &buf);

    // An Initial and a short-header packet coalesced in one datagram.
    let short = ShortHeader::new(a, 0, false, 1000, Some(990), None);
    short.encode(&mut buf);
    buf.extend_from_slice(&[0xee; 24]);
    corpus.put(t, "initial-then-short", &buf);

    buf.clear();
    HandshakeHeader {
        version: VERSION_1,
        dcid: b,
        scid: a,
    }
    .encode(3, &mut buf);
    buf.extend_from_slice(b"msg");
    corpus.put(t, "handshake", &buf);

    buf.clear();
    RetryHeader {
        version: VERSION_1,
        dcid: b,
        scid: a,
        token: &[0x42; 40],
    }
    .encode(&mut buf);
    corpus.put(t, "retry", &buf);

    buf.clear();
    let client_hdr = LongHeaderInvariants {
        version: 0x1a2a_3a4a,
        dcid: a.as_bytes(),
        scid: b.as_bytes(),
    };
    VersionNegotiation::encode_reply(&client_hdr, SUPPORTED_VERSIONS, &mut buf);
    corpus.put(t, "version-negotiation", &buf);

    buf.clear();
    let rate = RateArea {
        expected_kbps: 50_000,
        feedback_kbps: 40_000,
    };
    ShortHeader::new(a, 3, true, 70_000, Some(69_000), Some(rate)).encode(&mut buf);
    buf.extend_from_slice(&[0x5c; 32]);
    corpus.put(t, "short-rate-area", &buf);

    buf.clear();
    encode_stateless_reset(&[0x41, 1, 2, 3, 4, 5, 6, 7], &[0x77; 16], &mut buf);
    corpus.put(t, "stateless-reset", &buf);
}

fn frames(corpus: &mut Corpus) {
    let t = "frames";
    let cid = ConnectionId::from_array([9; 8]);
    let addr: SocketAddr = "192.0.2.7:4433".parse().expect("addr");
    let addr6: SocketAddr = "[2001:db8::1]:443".parse().expect("addr");
    let list: Vec<(&str, Frame<'_>)> = vec![
        ("padding", Frame::Padding { len: 3 }),
        ("ping", Frame::Ping),
        ("ack-request", Frame::AckRequest),
        (
            "reset-flow",
            Frame::ResetFlow {
                flow_id: 4,
                error_code: 7,
                final_size: 100_000,
            },
        ),
        (
            "stop-sending",
            Frame::StopSending {
                flow_id: 8,
                error_code: 1,
            },
        ),
        (
            "flow",
            Frame::Flow(FlowFrame {
                flow_id: 0,
                offset: 0,
                fin: false,
                data: b"hello",
            }),
        ),
        (
            "flow-offset-fin",
            Frame::Flow(FlowFrame {
                flow_id: 6,
                offset: 70_000,
                fin: true,
                data: b"bye",
            }),
        ),
        ("max-data", Frame::MaxData { max: 1 << 24 }),
        (
            "max-flow-data",
            Frame::MaxFlowData {
                flow_id: 4,
                max: 1 << 22,
            },
        ),
        (
            "max-flows",
            Frame::MaxFlows {
                bidi: true,
                max: 200,
            },
        ),
        ("data-blocked", Frame::DataBlocked { limit: 1 << 20 }),
        (
            "flow-data-blocked",
            Frame::FlowDataBlocked {
                flow_id: 2,
                limit: 65_536,
            },
        ),
        (
            "window-close",
            Frame::WindowClose {
                reason_code: 3,
                reason: b"busy",
            },
        ),
        ("window-open", Frame::WindowOpen),
        ("window-status", Frame::WindowStatus),
        (
            "message",
            Frame::Message(MessageFrame {
                msg_id: 5,
                ordered: true,
                priority: 2,
                total_len: 10,
                offset: 4,
                deadline_us: Some(250_000),
                reply_to: Some(3),
                data: b"msg!",
            }),
        ),
        (
            "message-skip",
            Frame::MessageSkip {
                msg_id: 6,
                credit: 1200,
            },
        ),
        ("datagram", Frame::Datagram { data: b"dgram" }),
        ("path-challenge", Frame::PathChallenge { data: [1; 8] }),
        ("path-response", Frame::PathResponse { data: [2; 8] }),
        ("add-address-v4", Frame::AddAddress { seq: 1, addr }),
        (
            "add-address-v6",
            Frame::AddAddress {
                seq: 2,
                addr: addr6,
            },
        ),
        ("remove-address", Frame::RemoveAddress { seq: 1 }),
        (
            "new-connection-id",
            Frame::NewConnectionId {
                seq: 3,
                retire_prior_to: 1,
                cid,
                reset_token: [0x3c; 16],
            },
        ),
        ("retire-connection-id", Frame::RetireConnectionId { seq: 2 }),
        (
            "close-transport",
            Frame::Close {
                application: false,
                error_code: 0x0a,
                frame_type: Some(0x08),
                reason: b"flow limit",
            },
        ),
        (
            "close-application",
            Frame::Close {
                application: true,
                error_code: 42,
                frame_type: None,
                reason: b"bye",
            },
        ),
        ("handshake-done", Frame::HandshakeDone),
        (
            "probe",
            Frame::Probe {
                train: 9,
                index: 2,
                count: 10,
            },
        ),
        (
            "rate-echo",
            Frame::RateEcho {
                path_id: 1,
                feedback_kbps: 12_000,
            },
        ),
        ("join", Frame::Join { group: b"news" }),
        ("leave", Frame::Leave { group: b"news" }),
        (
            "ack-frequency",
            Frame::AckFrequency {
                path_id: 0,
                sequence: 3,
                threshold: 10,
            },
        ),
        (
            "path-status-standby",
            Frame::PathStatus {
                path_id: 1,
                sequence: 2,
                status: PathStatusCode::Standby,
            },
        ),
        (
            "path-status-abandoned",
            Frame::PathStatus {
                path_id: 3,
                sequence: 1,
                status: PathStatusCode::Abandoned,
            },
        ),
        (
            "probe-report",
            Frame::ProbeReport {
                path_id: 0,
                train: 9,
                received: 10,
                rate: 6_250_000,
            },
        ),
    ];
    let mut all = Vec::new();
    for (name, frame) in &list {
        let mut buf = Vec::new();
        frame.encode(&mut buf);
        corpus.put(t, name, &buf);
        all.extend_from_slice(&buf);
    }
    corpus.put(t, "all-frames", &all);

    let mut buf = Vec::new();
    encode_ack(
        0,
        1_000,
        [900..=1_000, 500..=800, 3..=10],
        16,
        200,
        None,
        &mut buf,
    )
    .expect("ack fits");
    corpus.put(t, "ack", &buf);
    let mut ecn = Vec::new();
    let counts = tern_proto::recovery::EcnCounts {
        ect0: 900,
        ect1: 0,
        ce: 12,
    };
    encode_ack(0, 250, [40..=90, 3..=10], 16, 200, Some(&counts), &mut ecn).expect("ack fits");
    corpus.put(t, "ack-ecn", &ecn);
    let mut both = buf.clone();
    buf.clear();
    encode_nack(2, [5, 6, 9, 70, 1_000], 16, 200, &mut buf).expect("nack fits");
    corpus.put(t, "nack", &buf);
    both.extend_from_slice(&buf);
    Frame::Ping.encode(&mut both);
    corpus.put(t, "ack-nack-ping", &both);
}

fn transport_params(corpus: &mut Corpus) {
    let t = "transport_params";
    let mut buf = Vec::new();
    let mut p = TransportParams::default();
    p.initial_max_data = 16 << 20;
    p.initial_max_flow_data_bidi_local = 4 << 20;
    p.initial_max_flow_data_bidi_remote = 4 << 20;
    p.initial_max_flow_data_uni = 4 << 20;
    p.idle_timeout_ms = 10_000;
    p.max_ack_delay_ms = 10;
    p.max_datagram_size = 1500;
    p.stateless_reset_token = Some([0x11; 16]);
    corpus.put(t, "server-like", &{
        p.encode(&mut buf);
        buf.clone()
    });
    p.max_message_size = 0;
    p.max_datagram_frame_size = 1200;
    p.active_connection_id_limit = 4;
    p.initial_max_flows_bidi = 1 << 20;
    p.initial_max_flows_uni = 0;
    p.addresses = vec![
        "192.0.2.1:4433".parse().expect("addr"),
        "[2001:db8::2]:4433".parse().expect("addr"),
    ];
    buf.clear();
    p.encode(&mut buf);
    corpus.put(t, "everything", &buf);
    buf.clear();
    TransportParams::default().encode(&mut buf);
    corpus.put(t, "defaults", &buf);
}

fn endpoint_recv(corpus: &mut Corpus) {
    let t = "endpoint_recv";
    let (ik, _) = real_datagrams(true, b"hello tern");
    let (xx, _) = real_datagrams(false, b"hello tern");
    corpus.put(t, "ik-initial", &ik[0]);
    corpus.put(t, "xx-initial", &xx[0]);
    // A short-header datagram for a connection the server does not have: stateless reset.
    let mut buf = Vec::new();
    ShortHeader::new(ConnectionId::from_array([0xd4; 8]), 0, false, 7, None, None).encode(&mut buf);
    buf.extend_from_slice(&[0x99; 40]);
    corpus.put(t, "unknown-cid", &buf);
    // An Initial of an unknown version, padded: Version Negotiation.
    let mut vn = ik[0].clone();
    vn[1..5].copy_from_slice(&0x1a2a_3a4au32.to_be_bytes());
    corpus.put(t, "unknown-version", &vn);
    // Too short to be answered.
    corpus.put(t, "short-initial", &ik[0][..600]);
    // Several datagrams: Initial, a duplicate after a timer, a damaged copy, timers.
    let mut damaged = ik[0].clone();
    damaged[200] ^= 0x10;
    let items = [
        recv::Item::Datagram(&ik[0]),
        recv::Item::Timer,
        recv::Item::Datagram(&ik[0]),
        recv::Item::Datagram(&damaged),
        recv::Item::Datagram(&buf),
        recv::Item::Timer,
        recv::Item::Timer,
    ];
    corpus.put(t, "multi-ik", &recv::encode(&items));
    let items = [
        recv::Item::Datagram(&xx[0]),
        recv::Item::Datagram(&xx[0][..1100]),
        recv::Item::Timer,
        recv::Item::Datagram(&vn),
    ];
    corpus.put(t, "multi-xx", &recv::encode(&items));
}

/// Script helpers: each returns the bytes of one operation.
mod op {
    use super::script::*;

    pub fn raw(to_client: bool, d: &[u8]) -> Vec<u8> {
        let mut v = vec![if to_client {
            RAW_TO_CLIENT
        } else {
            RAW_TO_SERVER
        }];
        v.extend_from_slice(&u16::try_from(d.len()).expect("short").to_be_bytes());
        v.extend_from_slice(d);
        v
    }
    pub fn open(server: bool, uni: bool) -> Vec<u8> {
        vec![OPEN, u8::from(server), u8::from(uni)]
    }
    pub fn write(server: bool, flow: u8, len: u16) -> Vec<u8> {
        let l = len.to_be_bytes();
        vec![WRITE, u8::from(server), flow, l[0], l[1]]
    }
    pub fn finish(server: bool, flow: u8) -> Vec<u8> {
        vec![FINISH, u8::from(server), flow]
    }
    pub fn reset(server: bool, flow: u8, code: u8) -> Vec<u8> {
        vec![RESET, u8::from(server), flow, code]
    }
    pub fn stop(server: bool, flow: u8, code: u8) -> Vec<u8> {
        vec![STOP, u8::from(server), flow, code]
    }
    pub fn pump() -> Vec<u8> {
        vec![PUMP]
    }
    pub fn deliver(to_client: bool, fate: u8, arg: u16) -> Vec<u8> {
        let a = arg.to_be_bytes();
        vec![DELIVER, u8::from(to_client), fate, a[0], a[1]]
    }
    pub fn advance(ms4: u8) -> Vec<u8> {
        vec![ADVANCE, ms4]
    }
    pub fn close(server: bool, code: u8) -> Vec<u8> {
        vec![CLOSE, u8::from(server), code]
    }
    pub fn exchange() -> Vec<u8> {
        vec![EXCHANGE]
    }
    pub fn path_state(server: bool, path: u8, state: u8) -> Vec<u8> {
        vec![PATH_STATE, u8::from(server), path, state]
    }
    pub fn withdraw() -> Vec<u8> {
        vec![WITHDRAW]
    }
    pub fn replay(to_client: bool, index: u16) -> Vec<u8> {
        let i = index.to_be_bytes();
        vec![REPLAY, u8::from(to_client), i[0], i[1]]
    }
    pub fn replay_initial(wait_100ms: u8, rebound: bool) -> Vec<u8> {
        vec![REPLAY_INITIAL, wait_100ms, u8::from(rebound)]
    }
}

fn endpoint_handshake(corpus: &mut Corpus) {
    let t = "endpoint_handshake";
    let seeds: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("idle", vec![]),
        (
            "echo",
            vec![
                op::open(false, false),
                op::write(false, 0, 3000),
                op::finish(false, 0),
                op::exchange(),
                op::advance(5),
                op::exchange(),
                op::write(true, 0, 2000),
                op::finish(true, 0),
                op::exchange(),
                op::advance(5),
                op::exchange(),
                op::close(false, 0),
                op::exchange(),
            ],
        ),
        (
            "lossy-uni",
            vec![
                op::open(false, true),
                op::write(false, 0, 20_000),
                op::pump(),
                op::deliver(false, fate::DROP, 0),
                op::deliver(false, fate::DUPLICATE, 0),
                op::deliver(false, fate::FLIP, 300),
                op::deliver(false, fate::REORDER, 0),
                op::deliver(false, fate::TRUNCATE, 40),
                op::deliver(false, fate::DELIVER, 0),
                op::pump(),
                op::deliver(true, fate::DROP, 0),
                op::advance(0),
                op::exchange(),
                op::advance(0),
                op::exchange(),
            ],
        ),
        (
            "rebind",
            vec![
                op::open(false, false),
                op::write(false, 0, 5000),
                op::pump(),
                op::deliver(false, fate::REBIND, 0),
                op::exchange(),
                op::write(true, 0, 5000),
                op::exchange(),
                op::advance(50),
                op::exchange(),
            ],
        ),
        (
            "reset-stop",
            vec![
                op::open(false, false),
                op::open(true, true),
                op::write(false, 0, 4000),
                op::write(true, 0, 4000),
                op::exchange(),
                op::reset(false, 0, 9),
                op::stop(false, 1, 3),
                op::stop(true, 0, 4),
                op::exchange(),
                op::close(true, 7),
                op::exchange(),
            ],
        ),
        (
            "multipath-states",
            vec![
                op::open(false, true),
                op::write(false, 0, 16_000),
                op::exchange(),
                op::path_state(false, 1, 1),
                op::write(false, 0, 16_000),
                op::pump(),
                op::deliver(false, fate::DROP, 0),
                op::exchange(),
                op::path_state(true, 2, 2),
                op::write(false, 0, 16_000),
                op::exchange(),
                op::advance(0),
                op::exchange(),
                op::path_state(false, 1, 0),
                op::finish(false, 0),
                op::exchange(),
            ],
        ),
        (
            "multipath-withdraw",
            vec![
                op::open(true, false),
                op::write(true, 0, 16_000),
                op::exchange(),
                op::withdraw(),
                op::write(true, 0, 16_000),
                op::pump(),
                op::deliver(true, fate::REORDER, 0),
                op::deliver(true, fate::DROP, 0),
                op::exchange(),
                op::advance(0),
                op::exchange(),
            ],
        ),
        (
            "replay",
            vec![
                op::open(false, false),
                op::write(false, 0, 6000),
                op::pump(),
                op::deliver(false, fate::DELIVER, 0),
                op::deliver(false, fate::DUPLICATE, 0),
                op::exchange(),
                op::replay(false, 0),
                op::replay(false, 3),
                op::replay(true, 1),
                op::write(true, 0, 3000),
                op::exchange(),
                op::replay(true, 0),
                op::replay(false, 7),
                op::exchange(),
            ],
        ),
        (
            "replay-initial",
            vec![
                op::replay_initial(0, false),
                op::exchange(),
                op::replay_initial(20, true),
                op::exchange(),
                op::open(false, true),
                op::write(false, 0, 2000),
                op::exchange(),
                op::replay_initial(250, false),
                op::exchange(),
                op::advance(0),
                op::exchange(),
            ],
        ),
        (
            "raw-junk",
            vec![
                op::raw(false, &[0x40; 60]),
                op::raw(true, &[0x41; 60]),
                op::raw(false, &[0xc0, 0x74, 0x65, 0x72, 0x01, 8, 1, 2, 3]),
                op::advance(255),
                op::advance(255),
                op::exchange(),
            ],
        ),
    ];
    for (name, ops) in seeds {
        let input = ops.concat();
        // Each seed does what it is named for: show it.
        let outcome = script::run_traced(&input);
        println!("{t}/{name}: {outcome:?}");
        corpus.put(t, name, &input);
    }
    // No seed injects a datagram captured from a real run: keys are deterministic, so it
    // would authenticate and carry bytes that are not in the harness's model of what was written.
}

fn main() {
    let mut corpus = Corpus::new();
    headers(&mut corpus);
    frames(&mut corpus);
    transport_params(&mut corpus);
    endpoint_recv(&mut corpus);
    endpoint_handshake(&mut corpus);
    println!(
        "wrote {} bytes of seeds under {}",
        corpus.total,
        corpus.dir.display()
    );
}
