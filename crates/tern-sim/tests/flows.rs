//! No head-of-line blocking between flows (F4): a packet lost on one flow does not delay
//! delivery on another. Measured in the simulator: two flows carry a 1 200-byte record every
//! 10 ms each over a lossy 40 ms link; we record each record's one-way delivery latency.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tern_proto::{ConnectionHandle, Dir, Endpoint, Event, FlowId, PublicKey};
use tern_sim::tern::{endpoint_config, established, App, PairHost, TernNode};
use tern_sim::{LinkConfig, LossModel, Simulation};

const RECORD: usize = 1200;
const RECORDS: u64 = 300;
const INTERVAL: Duration = Duration::from_millis(10);

/// Writes one record on each of two flows every 10 ms; the first 8 bytes are the send time.
struct Writer {
    server: SocketAddr,
    key: PublicKey,
    conn: Option<ConnectionHandle>,
    flows: Vec<FlowId>,
    start: Option<Instant>,
    sent: u64,
    epoch: Instant,
}

impl App for Writer {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let Some(conn) = established(&mut self.conn, ep, now, self.server, self.key) else {
            return;
        };
        if self.flows.is_empty() {
            self.flows = (0..2).map(|_| conn.open_flow(Dir::Uni).unwrap()).collect();
            self.start = Some(now);
        }
        let start = self.start.unwrap();
        while self.sent < RECORDS && start + INTERVAL * self.sent as u32 <= now {
            let at = start + INTERVAL * self.sent as u32;
            let stamp = (at - self.epoch).as_nanos() as u64;
            for &f in &self.flows {
                let mut rec = vec![0u8; RECORD];
                rec[..8].copy_from_slice(&stamp.to_be_bytes());
                assert_eq!(conn.write(f, &rec).unwrap(), RECORD);
            }
            self.sent += 1;
        }
    }
    fn on_event(&mut self, _: Instant, _: &mut Endpoint, _: ConnectionHandle, _: Event) {}
    fn is_done(&self) -> bool {
        self.sent == RECORDS
    }
    fn poll_timeout(&self) -> Option<Instant> {
        let start = self.start?;
        (self.sent < RECORDS).then(|| start + INTERVAL * self.sent as u32)
    }
}

/// Reads records and keeps, per flow, each record's latency and whether another flow was
/// stalled on a gap at that moment.
#[derive(Default)]
struct Reader {
    epoch: Option<Instant>,
    conns: Vec<ConnectionHandle>,
    bufs: BTreeMap<u64, Vec<u8>>,
    latencies: BTreeMap<u64, Vec<Duration>>,
    /// Records delivered on one flow while the other flow's next record was overdue.
    delivered_past_a_stall: u64,
    last_delivery: BTreeMap<u64, Instant>,
}

impl App for Reader {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        while let Some(h) = ep.accept() {
            self.conns.push(h);
        }
        for &h in &self.conns {
            let Some(conn) = ep.connection_mut(h) else {
                continue;
            };
            while let Some(id) = conn.accept_flow(Dir::Uni) {
                self.bufs.insert(id.index(), Vec::new());
            }
            for index in self.bufs.keys().copied().collect::<Vec<_>>() {
                let id = FlowId::from_parts(tern_proto::Side::Client, Dir::Uni, index);
                let mut chunk = [0u8; 4096];
                while let Ok(Some(n)) = conn.read(id, &mut chunk) {
                    self.bufs
                        .get_mut(&index)
                        .unwrap()
                        .extend_from_slice(&chunk[..n]);
                }
                let buf = self.bufs.get_mut(&index).unwrap();
                while buf.len() >= RECORD {
                    let rec: Vec<u8> = buf.drain(..RECORD).collect();
                    let stamp = u64::from_be_bytes(rec[..8].try_into().unwrap());
                    let latency = now - self.epoch.unwrap() - Duration::from_nanos(stamp);
                    self.latencies.entry(index).or_default().push(latency);
                    self.last_delivery.insert(index, now);
                    let other = 1 - index;
                    let other_quiet = self
                        .last_delivery
                        .get(&other)
                        .is_some_and(|t| now - *t > Duration::from_millis(60));
                    if other_quiet {
                        self.delivered_past_a_stall += 1;
                    }
                }
            }
        }
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, _: ConnectionHandle, _: Event) {
        self.poll(now, ep);
    }
    fn is_done(&self) -> bool {
        self.latencies.values().map(Vec::len).sum::<usize>() as u64 == 2 * RECORDS
    }
}

fn p(latencies: &[Duration], q: f64) -> Duration {
    let mut v = latencies.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * q) as usize]
}

#[test]
fn a_loss_on_one_flow_does_not_delay_the_other() {
    let seed = tern_sim::seed_from_env(7);
    let mut sim: Simulation<PairHost<Writer, Reader>> = Simulation::new(seed);
    let now = sim.now();
    let c: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let s: SocketAddr = "10.0.0.2:4433".parse().unwrap();
    let server = Endpoint::new(endpoint_config(seed, true), now);
    let key = server.public_key();
    let client = Endpoint::new(endpoint_config(seed, false), now);
    let writer = Writer {
        server: s,
        key,
        conn: None,
        flows: vec![],
        start: None,
        sent: 0,
        epoch: now,
    };
    sim.add_host(
        PairHost::Client(TernNode::new(client, c, writer)),
        &[c.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(
            server,
            s,
            Reader {
                epoch: Some(now),
                ..Reader::default()
            },
        )),
        &[s.ip()],
    );
    let mut lossy = LinkConfig::new(20_000_000, Duration::from_millis(20));
    lossy.loss = LossModel::Random(0.05);
    sim.add_link(c.ip(), s.ip(), lossy);
    sim.add_link(
        s.ip(),
        c.ip(),
        LinkConfig::new(20_000_000, Duration::from_millis(20)),
    );
    sim.run_until_done(now + Duration::from_secs(30))
        .expect("all records delivered");
    let Some(PairHost::Server(reader)) = sim.owner(s.ip()).map(|h| sim.node(h)) else {
        unreachable!()
    };
    let all: Vec<Duration> = reader.app.latencies.values().flatten().copied().collect();
    let (p50, p99) = (p(&all, 0.5), p(&all, 0.99));
    eprintln!(
        "records {}; one-way latency p50 {p50:?} p99 {p99:?}; delivered while the other flow \
         was stalled: {}",
        all.len(),
        reader.app.delivered_past_a_stall
    );
    // Most records arrive in one trip (20 ms); losses are repaired within about an RTT.
    assert!(p50 < Duration::from_millis(22), "p50 {p50:?}");
    // Records kept arriving on one flow while the other waited for a repair: no
    // head-of-line blocking between flows.
    assert!(reader.app.delivered_past_a_stall > 0);
}
