//! Every path scheduler on the same two-path scenarios, in virtual time: when each wins.
//!
//! ```sh
//! cargo run --release -p tern-sim --example schedulers            # the table in BENCHMARKS.md
//! cargo run --release -p tern-sim --example schedulers -- 5       # mean over 5 seeds
//! ```
//!
//! The client has two interfaces (say Wi-Fi and 5G), each with its own link to the server.
//! Scenarios: bulk over unequal and equal paths; 30 Hz video-like frames with a 150 ms
//! deadline over a fast lossy path and a slow clean one; small urgent messages over two lossy
//! paths; and a bulk transfer whose fast path goes dark for good after 1 s.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tern_proto::{ConnectionHandle, Endpoint, Event, MessageOptions, SchedulerKind};
use tern_sim::tern::{
    endpoint_config, message_payload, App, BulkSender, PairHost, TernNode, VerifyingReceiver,
};
use tern_sim::{LinkConfig, LossModel, Simulation};

const CLIENT: &str = "10.0.0.1:5000";
const CLIENT_CELL: &str = "10.1.0.1";
const SERVER: &str = "10.0.0.2:4433";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn link(mbit: u64, one_way_ms: u64, loss: f64) -> LinkConfig {
    let mut l = LinkConfig::new(mbit * 1_000_000, Duration::from_millis(one_way_ms));
    l.loss = LossModel::Random(loss);
    l
}

/// Sends `count` messages of `size` bytes every `interval` once connected (message i carries
/// i), each with `opts`.
struct Periodic {
    server_key: Option<tern_proto::PublicKey>,
    conn: Option<ConnectionHandle>,
    start: Option<Instant>,
    sent: u64,
    count: u64,
    size: usize,
    interval: Duration,
    opts: MessageOptions,
}

impl App for Periodic {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let h = *self.conn.get_or_insert_with(|| {
            ep.connect(now, addr(SERVER), self.server_key)
                .expect("connect")
        });
        let Some(conn) = ep.connection_mut(h) else {
            return;
        };
        let Some(start) = self.start else {
            return;
        };
        while self.sent < self.count && start + self.interval * self.sent as u32 <= now {
            let _ = conn.send_message(now, message_payload(self.sent, self.size), self.opts);
            self.sent += 1;
        }
    }

    fn on_event(&mut self, now: Instant, _: &mut Endpoint, _: ConnectionHandle, e: Event) {
        if e == Event::Connected {
            // Let the other path open and validate first.
            self.start = Some(now + Duration::from_millis(500));
        }
    }

    fn is_done(&self) -> bool {
        self.sent == self.count
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let start = self.start?;
        (self.sent < self.count).then(|| start + self.interval * self.sent as u32)
    }
}

/// Records when each message arrived.
#[derive(Default)]
struct Arrivals {
    at: HashMap<u64, Instant>,
}

impl App for Arrivals {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        while ep.accept().is_some() {}
        let handles: Vec<_> = ep.handles().collect();
        for h in handles {
            if let Some(conn) = ep.connection_mut(h) {
                while let Some(m) = conn.recv_message() {
                    let index = u64::from_be_bytes(m.data[..8].try_into().expect("8 bytes"));
                    self.at.entry(index).or_insert(now);
                }
            }
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, _: ConnectionHandle, _: Event) {
        self.poll(now, ep);
    }

    fn is_done(&self) -> bool {
        false
    }
}

fn build<C: App, S: App>(
    seed: u64,
    kind: SchedulerKind,
    links: [LinkConfig; 2],
    client_app: impl FnOnce(Option<tern_proto::PublicKey>) -> C,
    server_app: S,
) -> Simulation<PairHost<C, S>> {
    let mut sim = Simulation::new(seed);
    let now = sim.now();
    let server_ep = Endpoint::new(endpoint_config(seed, true), now);
    let mut client_cfg = endpoint_config(seed, false);
    let cell: IpAddr = CLIENT_CELL.parse().expect("ip");
    client_cfg.connection.local_ips = vec![cell];
    client_cfg.connection.scheduler = kind;
    let key = Some(server_ep.public_key());
    let client = TernNode::new(
        Endpoint::new(client_cfg, now),
        addr(CLIENT),
        client_app(key),
    );
    let server = TernNode::new(server_ep, addr(SERVER), server_app);
    sim.add_host(PairHost::Client(client), &[addr(CLIENT).ip(), cell]);
    sim.add_host(PairHost::Server(server), &[addr(SERVER).ip()]);
    let [wifi, cellular] = links;
    sim.add_duplex(addr(CLIENT).ip(), addr(SERVER).ip(), wifi);
    sim.add_duplex(cell, addr(SERVER).ip(), cellular);
    sim
}

/// Bulk: seconds to deliver `bytes`, and the longest gap in delivery (ms) after the first
/// byte.
fn bulk(
    seed: u64,
    kind: SchedulerKind,
    links: [LinkConfig; 2],
    dark_at: Option<Duration>,
) -> (f64, f64) {
    let bytes = 10_000_000;
    let mut receiver = VerifyingReceiver::new(1);
    receiver.record_timeline = true;
    let mut sim = build(
        seed,
        kind,
        links,
        |key| BulkSender::new(addr(SERVER), key, vec![bytes]),
        receiver,
    );
    if let Some(at) = dark_at {
        sim.schedule_in(at, |sim| {
            let (c, s) = (addr(CLIENT).ip(), addr(SERVER).ip());
            for (from, to) in [(c, s), (s, c)] {
                let id = sim.link_between(from, to).expect("link");
                sim.link_mut(id).set_up(false);
            }
        });
    }
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(300))
        .expect("transfer completes");
    let server = sim
        .hosts()
        .find_map(|h| match sim.node(h) {
            PairHost::Server(n) => Some(n),
            PairHost::Client(_) => None,
        })
        .expect("server");
    assert_eq!(server.app.total(), bytes);
    assert_eq!(server.app.corrupt, None);
    let timeline = &server.app.timeline;
    let stall = timeline
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0))
        .max()
        .unwrap_or_default();
    (took.as_secs_f64(), stall.as_secs_f64() * 1e3)
}

/// Messages: p50 and p99 latency (ms) and the fraction delivered within `deadline`.
fn messages(
    seed: u64,
    kind: SchedulerKind,
    links: [LinkConfig; 2],
    size: usize,
    hz: u32,
    deadline: Duration,
    opts: MessageOptions,
) -> (f64, f64, f64) {
    let count = u64::from(hz) * 10;
    let interval = Duration::from_secs(1) / hz;
    let mut sim = build(
        seed,
        kind,
        links,
        |key| Periodic {
            server_key: key,
            conn: None,
            start: None,
            sent: 0,
            count,
            size,
            interval,
            opts: opts.deadline(deadline),
        },
        Arrivals::default(),
    );
    let start = sim.now();
    sim.run_until(start + Duration::from_secs(20));
    let mut client_start = None;
    let mut arrivals = None;
    for h in sim.hosts().collect::<Vec<_>>() {
        match sim.node(h) {
            PairHost::Client(n) => client_start = n.app.start,
            PairHost::Server(n) => arrivals = Some(n.app.at.clone()),
        }
    }
    let (t0, at) = (client_start.expect("connected"), arrivals.expect("server"));
    let mut lat: Vec<f64> = (0..count)
        .map(|i| match at.get(&i) {
            Some(t) => t.duration_since(t0 + interval * i as u32).as_secs_f64() * 1e3,
            None => f64::INFINITY,
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    let on_time = lat
        .iter()
        .filter(|l| **l <= deadline.as_secs_f64() * 1e3)
        .count();
    (q(0.5), q(0.99), on_time as f64 / lat.len() as f64)
}

fn main() {
    let seeds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mean = |f: &dyn Fn(u64) -> Vec<f64>| -> Vec<f64> {
        let runs: Vec<Vec<f64>> = (1..=seeds).map(f).collect();
        (0..runs[0].len())
            .map(|i| runs.iter().map(|r| r[i]).sum::<f64>() / seeds as f64)
            .collect()
    };
    println!("Two paths; mean of {seeds} seeds (virtual time).\n");
    println!("| scheduler | bulk unequal: s (Mbit/s) | bulk equal: s (Mbit/s) | fast path dark at 1 s: s, longest stall ms | frames 30 Hz 30 kB, 150 ms: p50 / p99 ms, on time | urgent 1 kB 100 Hz, lossy: p50 / p99 ms, on time |");
    println!("|---|---|---|---|---|---|");
    for kind in SchedulerKind::ALL {
        let unequal = mean(&|s| {
            let (t, _) = bulk(s, kind, [link(50, 10, 0.0), link(10, 40, 0.0)], None);
            vec![t]
        });
        let equal = mean(&|s| {
            let (t, _) = bulk(s, kind, [link(25, 10, 0.0), link(25, 10, 0.0)], None);
            vec![t]
        });
        let dark = mean(&|s| {
            let (t, stall) = bulk(
                s,
                kind,
                [link(25, 10, 0.0), link(25, 30, 0.0)],
                Some(Duration::from_secs(1)),
            );
            vec![t, stall]
        });
        let frames = mean(&|s| {
            let (p50, p99, ok) = messages(
                s,
                kind,
                [link(20, 15, 0.02), link(10, 50, 0.0)],
                30_000,
                30,
                Duration::from_millis(150),
                MessageOptions::default().unordered(),
            );
            vec![p50, p99, ok]
        });
        let urgent = mean(&|s| {
            let (p50, p99, ok) = messages(
                s,
                kind,
                [link(10, 20, 0.05), link(10, 30, 0.05)],
                1_000,
                100,
                Duration::from_millis(100),
                MessageOptions::default().unordered().priority(7),
            );
            vec![p50, p99, ok]
        });
        let mbit = |t: f64| 80.0 / t;
        println!(
            "| {kind} | {:.2} ({:.1}) | {:.2} ({:.1}) | {:.2}, {:.0} | {:.1} / {:.1}, {:.1} % | {:.1} / {:.1}, {:.1} % |",
            unequal[0],
            mbit(unequal[0]),
            equal[0],
            mbit(equal[0]),
            dark[0],
            dark[1],
            frames[0],
            frames[1],
            frames[2] * 100.0,
            urgent[0],
            urgent[1],
            urgent[2] * 100.0,
        );
    }
}
