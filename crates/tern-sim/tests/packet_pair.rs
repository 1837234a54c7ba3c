//! Packet-pair fast start (DESIGN.md F11, PROTOCOL.md §11.10) in the simulator: how close the
//! estimate from a probe train comes to the link rate, what it does to a transfer's start-up
//! (the `startup` row of DESIGN.md §4) and what it costs when the bottleneck is shared.
//!
//! `cargo test -p tern-sim --release --test packet_pair -- --nocapture` prints the figures.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tern_proto::{
    ConnectionHandle, Dir, Endpoint, EndpointConfig, Event, FlowId, PublicKey, WriteError,
};
use tern_sim::tern::{
    endpoint_config, payload_slice, App, Downloader, FlowServer, PairAccess, PairHost, TernNode,
    Transfer, CLIENT_ADDR, SERVER_ADDR,
};
use tern_sim::{LinkConfig, Simulation};

fn fast_start_off(c: &mut EndpointConfig) {
    c.connection.fast_start = false;
}

/// The client's rate estimate (bytes/s) after a transfer of `size` bytes over a clean link of
/// `rate_bps` and 40 ms RTT, with the number of estimates it got.
fn estimate(seed: u64, rate_bps: u64, size: u64) -> (Option<u64>, u64) {
    let link = LinkConfig::new(rate_bps, Duration::from_millis(20));
    let t = Transfer::new(seed, link, vec![size]);
    let mut sim = t.build();
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(120))
        .expect("transfer completes");
    assert_eq!(sim.server().app.corrupt, None);
    assert_eq!(sim.server().app.total(), size);
    let conn = sim
        .client()
        .endpoint
        .connection(ConnectionHandle(0))
        .expect("connection kept");
    let path = &conn.path_stats()[0];
    let stats = conn.stats();
    assert_eq!(
        path.rate_estimate,
        (stats.rate_estimate > 0).then_some(stats.rate_estimate)
    );
    (path.rate_estimate, stats.rate_estimates)
}

#[test]
fn estimate_is_within_ten_percent_of_the_link_rate() {
    for (rate, size) in [
        (1_000_000u64, 200_000u64),
        (10_000_000, 500_000),
        (100_000_000, 2_000_000),
        (1_000_000_000, 5_000_000),
    ] {
        let (got, count) = estimate(1, rate, size);
        let got = got.unwrap_or_else(|| panic!("no estimate at {rate} bit/s"));
        let want = rate as f64 / 8.0;
        let error = (got as f64 - want) / want;
        eprintln!(
            "link {:>5} Mbit/s: estimate {:>8.2} Mbit/s, error {:+.2} % ({count} estimate(s))",
            rate / 1_000_000,
            got as f64 * 8.0 / 1e6,
            100.0 * error
        );
        assert!(error.abs() <= 0.10, "{rate}: {got} bytes/s");
    }
}

/// The `startup` transfer (DESIGN.md §4): 1 MB on 50 Mbit/s with a 100 ms RTT.
const SIZE: u64 = 1_000_000;
/// See [`SIZE`].
const RATE: u64 = 50_000_000;

/// Its ideal completion: the handshake's RTT, size / rate, and one RTT more (the first
/// packet to the sender, or the last byte to the receiver and its acknowledgement back).
fn startup_ideal() -> Duration {
    let rtt = Duration::from_millis(100);
    rtt + Duration::from_secs_f64(SIZE as f64 * 8.0 / RATE as f64) + rtt
}

/// Completion of a 1 MB transfer on 50 Mbit/s, 100 ms RTT, a queue of one BDP, and its ratio
/// to the ideal (handshake RTT + size / C + one RTT for the last acknowledgement).
fn startup(seed: u64, fast_start: bool) -> (Duration, f64) {
    let link = LinkConfig::new(RATE, Duration::from_millis(50));
    let mut t = Transfer::new(seed, link, vec![SIZE]);
    if !fast_start {
        t.configure = fast_start_off;
    }
    let mut sim = t.build();
    let start = sim.now();
    let took = sim
        .run_until_done(start + Duration::from_secs(30))
        .expect("transfer completes");
    assert_eq!(sim.server().app.corrupt, None);
    assert_eq!(sim.server().app.total(), SIZE);
    let ideal = startup_ideal();
    let stats = sim
        .client()
        .endpoint
        .connection(ConnectionHandle(0))
        .map(|c| c.stats())
        .expect("connection kept");
    eprintln!(
        "startup seed {seed}, fast start {fast_start}: {took:?} = {:.2}× ideal ({ideal:?}); \
         trains {}, padding packets {}, estimate {:.1} Mbit/s, lost {}",
        took.as_secs_f64() / ideal.as_secs_f64(),
        stats.probe_trains_sent,
        stats.probe_padding_packets,
        stats.rate_estimate as f64 * 8.0 / 1e6,
        stats.packets_lost,
    );
    (took, took.as_secs_f64() / ideal.as_secs_f64())
}

#[test]
fn one_megabyte_at_fifty_megabit_completes_within_1_3_ideal() {
    for seed in 1..=3 {
        let (_, with) = startup(seed, true);
        let (_, without) = startup(seed, false);
        assert!(with <= 1.3, "fast start: {with:.2}× ideal (seed {seed})");
        assert!(with < without, "{with:.2} vs {without:.2} without");
    }
}

/// Completion of a 1 MB download (the server sends it as soon as it has the connection) on
/// 50 Mbit/s, 100 ms RTT, and its ratio to the ideal (handshake RTT + size / C + one RTT:
/// the client's first packet to the server, the last byte back), with the server's
/// connection statistics.
fn download(seed: u64, configure: fn(&mut EndpointConfig)) -> (f64, tern_proto::ConnectionStats) {
    let server_addr: SocketAddr = SERVER_ADDR.parse().unwrap();
    let client_addr: SocketAddr = CLIENT_ADDR.parse().unwrap();
    let mut sim: Simulation<PairHost<Downloader, FlowServer>> = Simulation::new(seed);
    let now = sim.now();
    let mut server_cfg = endpoint_config(seed, true);
    configure(&mut server_cfg);
    let mut client_cfg = endpoint_config(seed, false);
    configure(&mut client_cfg);
    let server = Endpoint::new(server_cfg, now);
    let client = Downloader::new(server_addr, Some(server.public_key()));
    sim.add_host(
        PairHost::Client(TernNode::new(
            Endpoint::new(client_cfg, now),
            client_addr,
            client,
        )),
        &[client_addr.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(server, server_addr, FlowServer::new(SIZE))),
        &[server_addr.ip()],
    );
    sim.add_duplex(
        client_addr.ip(),
        server_addr.ip(),
        LinkConfig::new(RATE, Duration::from_millis(50)),
    );
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(30))
        .expect("download completes");
    let host = sim.owner(client_addr.ip()).unwrap();
    let PairHost::Client(n) = sim.node(host) else {
        unreachable!()
    };
    assert_eq!(n.app.corrupt, None);
    assert_eq!(n.app.received, SIZE);
    let took = n.app.finished_at.expect("finished") - start;
    let ideal = startup_ideal();
    let ratio = took.as_secs_f64() / ideal.as_secs_f64();
    let PairHost::Server(server) = sim.node(sim.owner(server_addr.ip()).unwrap()) else {
        unreachable!()
    };
    let sh = server.endpoint.handles().next().unwrap();
    let sstats = server.endpoint.connection(sh).unwrap().stats();
    eprintln!(
        "download seed {seed}: {took:?} = {ratio:.2}× ideal ({ideal:?}); server: trains {}, \
         estimates {}, estimate {:.1} Mbit/s, lost {}",
        sstats.probe_trains_sent,
        sstats.rate_estimates,
        sstats.rate_estimate as f64 * 8.0 / 1e6,
        sstats.packets_lost,
    );
    (ratio, sstats)
}

#[test]
fn a_download_starts_from_the_rate_its_first_train_measures() {
    for seed in 1..=3 {
        let (with, stats) = download(seed, |_| {});
        let (without, _) = download(seed, fast_start_off);
        // The server's first train goes with its first data; the report ends slow start at
        // the link's rate a round trip later.
        assert_eq!(stats.probe_trains_sent, 1, "seed {seed}");
        assert_eq!(stats.rate_estimates, 1, "seed {seed}");
        let error = (stats.rate_estimate as f64 * 8.0 - 50e6) / 50e6;
        assert!(error.abs() <= 0.10, "estimate {} B/s", stats.rate_estimate);
        assert!(with <= 1.3, "{with:.2}× ideal (seed {seed})");
        assert!(
            with < without,
            "{with:.2} vs {without:.2} without fast start"
        );
    }
}

/// With `handshake_train` at both ends the client pads its first flight and the server's
/// first train goes right behind its response: the report comes back with the client's first
/// packets, and the download starts at the link's rate a round trip earlier (PROTOCOL.md §4.3, §11.10).
#[test]
fn a_handshake_train_starts_a_download_at_the_rate_a_round_trip_earlier() {
    for seed in 1..=3 {
        let (with, stats) = download(seed, |c| c.connection.handshake_train = true);
        let (usual, _) = download(seed, |_| {});
        assert_eq!(stats.probe_trains_sent, 1, "seed {seed}");
        assert_eq!(stats.rate_estimates, 1, "seed {seed}");
        let error = (stats.rate_estimate as f64 * 8.0 - 50e6) / 50e6;
        assert!(error.abs() <= 0.10, "estimate {} B/s", stats.rate_estimate);
        assert!(with <= 1.1, "{with:.2}× ideal (seed {seed})");
        assert!(
            with < usual - 0.15,
            "{with:.2} vs {usual:.2} with the usual first train"
        );
    }
}

// ---- a shared bottleneck --------------------------------------------------------------------

/// A client with two connections to the same server over the same link: a long background
/// transfer from the start, and a foreground transfer that starts `at` later. Completion of
/// each is recorded.
struct TwoConnections {
    server: SocketAddr,
    key: PublicKey,
    sizes: [u64; 2],
    start_at: [Duration; 2],
    epoch: Option<Instant>,
    conns: [Option<ConnectionHandle>; 2],
    flows: [Option<FlowId>; 2],
    sent: [u64; 2],
    finished_flow: [bool; 2],
    /// When each connection was opened and when its flow was acknowledged completely.
    pub opened: [Option<Instant>; 2],
    pub done: [Option<Instant>; 2],
}

impl App for TwoConnections {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let epoch = *self.epoch.get_or_insert(now);
        for i in 0..2 {
            if self.conns[i].is_none() && now >= epoch + self.start_at[i] {
                self.conns[i] = Some(
                    ep.connect(now, self.server, Some(self.key))
                        .expect("connect"),
                );
                self.opened[i] = Some(now);
            }
            let Some(h) = self.conns[i] else { continue };
            let Some(conn) = ep.connection_mut(h) else {
                continue;
            };
            if self.flows[i].is_none() {
                self.flows[i] = conn.open_flow(Dir::Uni).ok();
            }
            let Some(id) = self.flows[i] else { continue };
            while self.sent[i] < self.sizes[i] {
                let max = ((self.sizes[i] - self.sent[i]) as usize).min(64 * 1024);
                match conn.write_bytes(id, payload_slice(i as u64, self.sent[i], max)) {
                    Ok(k) => self.sent[i] += k as u64,
                    Err(WriteError::Blocked) => break,
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            if self.sent[i] == self.sizes[i] && !self.finished_flow[i] {
                conn.finish(id).expect("finish");
                self.finished_flow[i] = true;
            }
        }
    }

    fn on_event(&mut self, now: Instant, _: &mut Endpoint, conn: ConnectionHandle, event: Event) {
        if let Event::FlowFinished(_) = event {
            if let Some(i) = self.conns.iter().position(|c| *c == Some(conn)) {
                self.done[i] = Some(now);
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done.iter().all(Option::is_some)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let epoch = self.epoch?;
        (0..2)
            .filter(|&i| self.conns[i].is_none())
            .map(|i| epoch + self.start_at[i])
            .min()
    }
}

/// Reads everything on every connection; bytes received over time per connection.
#[derive(Default)]
struct Sink {
    conns: Vec<ConnectionHandle>,
    /// (time, connection index, cumulative bytes of that connection).
    timeline: Vec<(Instant, usize, u64)>,
    totals: HashMap<usize, u64>,
}

impl Sink {
    fn drain(&mut self, now: Instant, ep: &mut Endpoint, h: ConnectionHandle) {
        let Some(i) = self.conns.iter().position(|c| *c == h) else {
            return;
        };
        let Some(conn) = ep.connection_mut(h) else {
            return;
        };
        while conn.accept_flow(Dir::Uni).is_some() {}
        let id = FlowId::from_parts(tern_proto::Side::Client, Dir::Uni, 0);
        while let Ok(Some(chunk)) = conn.read_chunk(id, usize::MAX) {
            let chunk: Bytes = chunk;
            let total = self.totals.entry(i).or_default();
            *total += chunk.len() as u64;
            self.timeline.push((now, i, *total));
        }
    }

    /// Bytes of connection `i` received between two instants.
    fn between(&self, i: usize, from: Instant, to: Instant) -> u64 {
        let at = |t: Instant| {
            self.timeline
                .iter()
                .rev()
                .find(|(x, c, _)| *c == i && *x <= t)
                .map_or(0, |e| e.2)
        };
        at(to) - at(from)
    }
}

impl App for Sink {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        while let Some(h) = ep.accept() {
            self.conns.push(h);
            self.drain(now, ep, h);
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, conn: ConnectionHandle, event: Event) {
        if matches!(event, Event::FlowReadable(_) | Event::FlowOpened { .. }) {
            self.drain(now, ep, conn);
        }
    }

    fn is_done(&self) -> bool {
        true
    }
}

/// Results of one shared-bottleneck run.
struct Shared {
    /// The foreground transfer's completion time.
    completion: Duration,
    /// Bytes both connections got through while the foreground one ran.
    background_bytes: u64,
    foreground_bytes: u64,
    window: Duration,
    lost: u64,
    estimate: u64,
}

/// A 40 Mbit/s, 60 ms bottleneck (queue one BDP, `jitter` per direction) carrying a background
/// transfer from t = 0 and, from t = 3 s, a foreground transfer of `size` bytes.
fn shared(seed: u64, size: u64, jitter: Duration, fast_start: bool) -> Shared {
    let mut link = LinkConfig::new(40_000_000, Duration::from_millis(30));
    link.jitter = jitter;
    let mut sim: Simulation<PairHost<TwoConnections, Sink>> = Simulation::new(seed);
    let now = sim.now();
    let c: SocketAddr = CLIENT_ADDR.parse().unwrap();
    let s: SocketAddr = SERVER_ADDR.parse().unwrap();
    let mut server_cfg = endpoint_config(seed, true);
    let mut client_cfg = endpoint_config(seed, false);
    if !fast_start {
        fast_start_off(&mut client_cfg);
        fast_start_off(&mut server_cfg);
    }
    let server_ep = Endpoint::new(server_cfg, now);
    let app = TwoConnections {
        server: s,
        key: server_ep.public_key(),
        sizes: [200_000_000, size],
        start_at: [Duration::ZERO, Duration::from_secs(3)],
        epoch: None,
        conns: [None; 2],
        flows: [None; 2],
        sent: [0; 2],
        finished_flow: [false; 2],
        opened: [None; 2],
        done: [None; 2],
    };
    sim.add_host(
        PairHost::Client(TernNode::new(Endpoint::new(client_cfg, now), c, app)),
        &[c.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(server_ep, s, Sink::default())),
        &[s.ip()],
    );
    sim.add_link(c.ip(), s.ip(), link.clone());
    sim.add_link(s.ip(), c.ip(), link);
    // Run until the foreground transfer is done (the background one is far from it).
    let limit = now + Duration::from_secs(60);
    let client_host = sim.owner(c.ip()).unwrap();
    let server_host = sim.owner(s.ip()).unwrap();
    while sim.now() < limit {
        let step_to = sim.now() + Duration::from_millis(10);
        let _ = sim.run_until_done(step_to);
        let PairHost::Client(node) = sim.node(client_host) else {
            unreachable!()
        };
        if node.app.done[1].is_some() {
            break;
        }
    }
    let PairHost::Client(client) = sim.node(client_host) else {
        unreachable!()
    };
    let PairHost::Server(server) = sim.node(server_host) else {
        unreachable!()
    };
    let opened = client.app.opened[1].expect("foreground opened");
    let done = client.app.done[1].expect("foreground completes");
    let fg = client.app.conns[1].unwrap();
    let stats = client.endpoint.connection(fg).unwrap().stats();
    let bg_index = 0;
    let fg_index = 1;
    Shared {
        completion: done - opened,
        background_bytes: server.app.between(bg_index, opened, done),
        foreground_bytes: server.app.between(fg_index, opened, done),
        window: done - opened,
        lost: stats.packets_lost,
        estimate: stats.rate_estimate,
    }
}

#[test]
fn on_a_shared_bottleneck_fast_start_costs_at_most_ten_percent() {
    for (size, jitter) in [
        (1_000_000u64, Duration::ZERO),
        (5_000_000, Duration::ZERO),
        (1_000_000, Duration::from_millis(2)),
        (5_000_000, Duration::from_millis(2)),
    ] {
        let mut with_total = Duration::ZERO;
        let mut without_total = Duration::ZERO;
        // Bytes of both connections and time, while the foreground transfer ran.
        let mut agg_with = (0u64, 0f64);
        let mut agg_without = (0u64, 0f64);
        for seed in 1..=3 {
            let with = shared(seed, size, jitter, true);
            let without = shared(seed, size, jitter, false);
            for (name, r) in [("with", &with), ("without", &without)] {
                eprintln!(
                    "shared, {size} B, jitter {jitter:?}, seed {seed}, {name:>7} fast start: \
                     foreground {:?} ({} B), background {:.1} Mbit/s meanwhile, lost {}, \
                     estimate {:.1} Mbit/s",
                    r.completion,
                    r.foreground_bytes,
                    r.background_bytes as f64 * 8.0 / r.window.as_secs_f64() / 1e6,
                    r.lost,
                    r.estimate as f64 * 8.0 / 1e6,
                );
            }
            with_total += with.completion;
            without_total += without.completion;
            agg_with.0 += with.background_bytes + with.foreground_bytes;
            agg_with.1 += with.window.as_secs_f64();
            agg_without.0 += without.background_bytes + without.foreground_bytes;
            agg_without.1 += without.window.as_secs_f64();
        }
        let cost = with_total.as_secs_f64() / without_total.as_secs_f64() - 1.0;
        let mbps = |(bytes, secs): (u64, f64)| bytes as f64 * 8.0 / secs / 1e6;
        let (util_with, util_without) = (mbps(agg_with), mbps(agg_without));
        eprintln!(
            "shared, {size} B, jitter {jitter:?}: foreground completion {:+.1} % with fast start \
             (sum of 3 seeds {with_total:?} vs {without_total:?}); both flows together \
             {util_with:.1} vs {util_without:.1} Mbit/s of 40 meanwhile",
            100.0 * cost
        );
        assert!(cost <= 0.10, "fast start cost {:.1} %", 100.0 * cost);
        assert!(
            util_with >= 0.9 * util_without,
            "link use {util_with:.1} vs {util_without:.1} Mbit/s"
        );
    }
}

// ---- idle restarts and several paths ----------------------------------------------------------

/// One connection that sends `sizes[i]` on flow i, each flow starting `gap` after the previous
/// one was acknowledged completely.
struct Bursts {
    server: SocketAddr,
    key: PublicKey,
    sizes: Vec<u64>,
    gap: Duration,
    conn: Option<ConnectionHandle>,
    current: Option<(FlowId, u64, bool)>,
    next_at: Option<Instant>,
    finished: usize,
    /// `Event::RateEstimate`s seen: (path, bytes per second).
    estimates: Vec<(u32, u64)>,
}

impl App for Bursts {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let h = *self.conn.get_or_insert_with(|| {
            ep.connect(now, self.server, Some(self.key))
                .expect("connect")
        });
        let Some(conn) = ep.connection_mut(h).filter(|c| c.is_established()) else {
            return;
        };
        let index = self.finished;
        if self.current.is_none()
            && index < self.sizes.len()
            && self.next_at.is_none_or(|t| now >= t)
        {
            let id = conn.open_flow(Dir::Uni).expect("flow");
            self.current = Some((id, 0, false));
        }
        if let Some((id, sent, fin)) = &mut self.current {
            let size = self.sizes[index];
            while *sent < size {
                let max = ((size - *sent) as usize).min(64 * 1024);
                match conn.write_bytes(*id, payload_slice(index as u64, *sent, max)) {
                    Ok(k) => *sent += k as u64,
                    Err(WriteError::Blocked) => break,
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            if *sent == size && !*fin {
                conn.finish(*id).expect("finish");
                *fin = true;
            }
        }
    }

    fn on_event(&mut self, now: Instant, _: &mut Endpoint, _: ConnectionHandle, event: Event) {
        match event {
            Event::FlowFinished(_) => {
                self.finished += 1;
                self.current = None;
                self.next_at = Some(now + self.gap);
            }
            Event::RateEstimate {
                path,
                bytes_per_second,
            } => self.estimates.push((path, bytes_per_second)),
            _ => {}
        }
    }

    fn is_done(&self) -> bool {
        self.finished == self.sizes.len()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_at
            .filter(|_| self.current.is_none() && !self.is_done())
    }
}

/// Bursts of `sizes` bytes a second apart from client to server on a clean 20 Mbit/s, 20 ms
/// path; returns the client's statistics and its rate-estimate events.
fn idle_bursts(sizes: Vec<u64>) -> (tern_proto::ConnectionStats, Vec<(u32, u64)>) {
    let seed = 1;
    let link = LinkConfig::new(20_000_000, Duration::from_millis(20));
    let mut sim: Simulation<PairHost<Bursts, tern_sim::tern::VerifyingReceiver>> =
        Simulation::new(seed);
    let now = sim.now();
    let c: SocketAddr = CLIENT_ADDR.parse().unwrap();
    let s: SocketAddr = SERVER_ADDR.parse().unwrap();
    let server_ep = Endpoint::new(endpoint_config(seed, true), now);
    let total: u64 = sizes.iter().sum();
    let flows = sizes.len();
    let app = Bursts {
        server: s,
        key: server_ep.public_key(),
        sizes,
        gap: Duration::from_secs(1),
        conn: None,
        current: None,
        next_at: None,
        finished: 0,
        estimates: Vec::new(),
    };
    sim.add_host(
        PairHost::Client(TernNode::new(
            Endpoint::new(endpoint_config(seed, false), now),
            c,
            app,
        )),
        &[c.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(
            server_ep,
            s,
            tern_sim::tern::VerifyingReceiver::new(flows),
        )),
        &[s.ip()],
    );
    sim.add_duplex(c.ip(), s.ip(), link);
    sim.run_until_done(now + Duration::from_secs(30))
        .expect("transfers complete");
    let server_host = sim.owner(s.ip()).unwrap();
    let PairHost::Server(server) = sim.node(server_host) else {
        unreachable!()
    };
    assert_eq!(server.app.corrupt, None);
    assert_eq!(server.app.total(), total);
    let client_host = sim.owner(c.ip()).unwrap();
    let PairHost::Client(client) = sim.node(client_host) else {
        unreachable!()
    };
    let stats = client
        .endpoint
        .connection(client.app.conn.unwrap())
        .unwrap()
        .stats();
    eprintln!(
        "idle restart: trains {}, estimates {}, padding packets {}, last estimate {:.2} Mbit/s",
        stats.probe_trains_sent,
        stats.rate_estimates,
        stats.probe_padding_packets,
        stats.rate_estimate as f64 * 8.0 / 1e6
    );
    (stats, client.app.estimates.clone())
}

#[test]
fn a_path_probes_again_after_an_idle_period() {
    let (stats, estimates) = idle_bursts(vec![500_000, 500_000, 3_000]);
    // One train at the start and one after the idle second; the last, 3 kB burst is too small
    // to carry a train (it would be mostly padding), so it is sent without one.
    assert_eq!(stats.probe_trains_sent, 2);
    assert_eq!(stats.rate_estimates, 2);
    assert_eq!(estimates.len(), 2, "one event per estimate");
    assert!(estimates.iter().all(|e| e.0 == 0));
    assert_eq!(estimates[1].1, stats.rate_estimate);
    assert_eq!(stats.probe_padding_packets, 0);
    let want = 20_000_000.0 / 8.0;
    assert!((stats.rate_estimate as f64 - want).abs() <= 0.1 * want);
}

#[test]
fn a_restart_train_is_as_long_as_the_data_waiting() {
    // About 6.5 full packets after the idle second: a train of 7, not 10 with 3 of padding
    // (a request on a short path idles before every exchange and would pay that each time).
    let (stats, estimates) = idle_bursts(vec![500_000, 9_500]);
    assert_eq!(stats.probe_trains_sent, 2);
    assert_eq!(stats.rate_estimates, 2);
    assert_eq!(estimates.len(), 2);
    assert_eq!(stats.probe_padding_packets, 0, "no packet of padding alone");
    let want = 20_000_000.0 / 8.0;
    assert!(
        (stats.rate_estimate as f64 - want).abs() <= 0.1 * want,
        "a 7-packet train still measures the bottleneck: {}",
        stats.rate_estimate
    );
}

#[test]
fn each_path_measures_its_own_bottleneck() {
    let seed = 1;
    let client: SocketAddr = CLIENT_ADDR.parse().unwrap();
    let server: SocketAddr = SERVER_ADDR.parse().unwrap();
    let server_b: SocketAddr = "10.2.0.2:4433".parse().unwrap();
    let mut sim: Simulation<PairHost> = Simulation::new(seed);
    let now = sim.now();
    let mut server_cfg = endpoint_config(seed, true);
    server_cfg.connection.advertise = vec![server_b];
    let server_ep = Endpoint::new(server_cfg, now);
    let key = Some(server_ep.public_key());
    sim.add_host(
        PairHost::Client(TernNode::new(
            Endpoint::new(endpoint_config(seed, false), now),
            client,
            tern_sim::tern::BulkSender::new(server, key, vec![5_000_000]),
        )),
        &[client.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(
            server_ep,
            server,
            tern_sim::tern::VerifyingReceiver::new(1),
        )),
        &[server.ip(), server_b.ip()],
    );
    let rates = [20_000_000u64, 5_000_000];
    sim.add_duplex(
        client.ip(),
        server.ip(),
        LinkConfig::new(rates[0], Duration::from_millis(10)),
    );
    sim.add_duplex(
        client.ip(),
        server_b.ip(),
        LinkConfig::new(rates[1], Duration::from_millis(40)),
    );
    sim.run_until_done(now + Duration::from_secs(30))
        .expect("transfer completes");
    let client_host = sim.owner(client.ip()).unwrap();
    let PairHost::Client(node) = sim.node(client_host) else {
        unreachable!()
    };
    let ep = &node.endpoint;
    let paths = ep
        .connection(ep.handles().next().unwrap())
        .unwrap()
        .path_stats();
    assert_eq!(paths.len(), 2);
    for (p, rate) in paths.iter().zip(rates) {
        let got = p.rate_estimate.expect("every path probed");
        let want = rate as f64 / 8.0;
        eprintln!(
            "path {} to {}: estimate {:.2} Mbit/s (link {} Mbit/s)",
            p.id,
            p.remote,
            got as f64 * 8.0 / 1e6,
            rate / 1_000_000
        );
        assert!((got as f64 - want).abs() <= 0.1 * want, "{p:?}");
    }
}

/// The estimate on impaired 50 Mbit/s, 40 ms links: random loss inside the train only drops
/// samples; jitter comparable to the train's length (10 packets at 50 Mbit/s: 2.3 ms) moves
/// arrivals by more than the gaps being measured.
#[test]
fn estimate_on_impaired_links() {
    let rate = 50_000_000u64;
    let want = rate as f64 / 8.0;
    for (name, loss, jitter) in [
        ("1 % loss", 0.01, Duration::ZERO),
        ("5 % loss", 0.05, Duration::ZERO),
        ("0.2 ms jitter", 0.0, Duration::from_micros(200)),
        ("2 ms jitter", 0.0, Duration::from_millis(2)),
    ] {
        let mut errors = Vec::new();
        for seed in 1..=10 {
            let mut link = LinkConfig::new(rate, Duration::from_millis(20));
            if loss > 0.0 {
                link.loss = tern_sim::LossModel::Random(loss);
            }
            link.jitter = jitter;
            let mut t = Transfer::new(seed, link.clone(), vec![1_000_000]);
            // Impairments on the data direction only.
            t.downlink = LinkConfig::new(rate, Duration::from_millis(20));
            let mut sim = t.build();
            let start = sim.now();
            sim.run_until_done(start + Duration::from_secs(60))
                .expect("transfer completes");
            assert_eq!(sim.server().app.total(), 1_000_000);
            let conn = sim
                .client()
                .endpoint
                .connection(ConnectionHandle(0))
                .unwrap();
            if let Some(got) = conn.path_stats()[0].rate_estimate {
                errors.push((got as f64 - want) / want);
            }
        }
        let mut sorted = errors.clone();
        sorted.sort_by(f64::total_cmp);
        eprintln!(
            "{name}: {} of 10 runs estimated; error min {:+.1} %, median {:+.1} %, max {:+.1} %",
            errors.len(),
            100.0 * sorted.first().copied().unwrap_or(f64::NAN),
            100.0 * sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
            100.0 * sorted.last().copied().unwrap_or(f64::NAN),
        );
        if loss > 0.0 {
            // Losses never make the estimate too high: a packet lost inside the train can
            // only widen a gap (the safe direction, one packet of eight: 12.5 % low).
            assert!(
                errors.iter().all(|e| (-0.15..=0.10).contains(e)),
                "{name}: {errors:?}"
            );
        }
    }
}

#[test]
fn an_xx_client_probes_once_the_handshake_is_confirmed() {
    let link = LinkConfig::new(10_000_000, Duration::from_millis(20));
    let mut t = Transfer::new(1, link, vec![1_000_000]);
    t.ik = false;
    let mut sim = t.build();
    let start = sim.now();
    sim.run_until_done(start + Duration::from_secs(30))
        .expect("transfer completes");
    assert_eq!(sim.server().app.total(), 1_000_000);
    let stats = sim
        .client()
        .endpoint
        .connection(ConnectionHandle(0))
        .unwrap()
        .stats();
    assert_eq!(stats.probe_trains_sent, 1);
    let want = 10_000_000.0 / 8.0;
    assert!(
        (stats.rate_estimate as f64 - want).abs() <= 0.1 * want,
        "{stats:?}"
    );
}

/// Reports lost on the way back are sent again: every train gets its estimate.
#[test]
fn lost_reports_are_resent() {
    let mut resent = 0;
    for seed in 1..=20 {
        let rate = 20_000_000u64;
        let link = LinkConfig::new(rate, Duration::from_millis(20));
        let mut t = Transfer::new(seed, link.clone(), vec![1_000_000]);
        let mut back = link;
        back.loss = tern_sim::LossModel::Random(0.2);
        t.downlink = back;
        let mut sim = t.build();
        let start = sim.now();
        sim.run_until_done(start + Duration::from_secs(60))
            .expect("transfer completes");
        let stats = sim
            .client()
            .endpoint
            .connection(ConnectionHandle(0))
            .unwrap()
            .stats();
        resent += sim
            .server()
            .endpoint
            .connection(ConnectionHandle(0))
            .map_or(0, |c| c.stats().packets_lost);
        // (A stall with nothing in flight for an RTT, after a burst of lost ACKs, is an idle
        // period too: a second train may go.)
        assert!(stats.probe_trains_sent >= 1, "seed {seed}");
        assert_eq!(
            stats.rate_estimates, stats.probe_trains_sent,
            "seed {seed}: {stats:?}"
        );
        let want = rate as f64 / 8.0;
        assert!((stats.rate_estimate as f64 - want).abs() <= 0.1 * want);
    }
    eprintln!(
        "20 % loss on the way back: every train got its estimate ({resent} of the receiver's \
         ack-eliciting packets, which carry the reports, were lost over 20 seeds)"
    );
}

/// A node that reads its socket only every `tick` (interrupt coalescing, GRO, a busy event
/// loop): datagrams that arrive meanwhile wait and are handed in together, with one `now`.
struct Batching<N> {
    inner: N,
    tick: Duration,
    epoch: Instant,
    queue: Vec<tern_sim::Datagram>,
    due: Option<Instant>,
}

impl<N: tern_sim::Node> tern_sim::Node for Batching<N> {
    fn handle(&mut self, now: Instant, dgram: tern_sim::Datagram) {
        if self.tick.is_zero() {
            return self.inner.handle(now, dgram);
        }
        self.queue.push(dgram);
        if self.due.is_none() {
            let ticks = now.saturating_duration_since(self.epoch).as_nanos() / self.tick.as_nanos();
            let next = self.epoch + self.tick * (ticks as u32 + 1);
            self.due = Some(next);
        }
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<tern_sim::Datagram> {
        self.inner.poll_transmit(now)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        match (self.inner.poll_timeout(), self.due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.due.is_some_and(|d| d <= now) {
            self.due = None;
            for d in std::mem::take(&mut self.queue) {
                self.inner.handle(now, d);
            }
        }
        if self.inner.poll_timeout().is_some_and(|t| t <= now) {
            self.inner.handle_timeout(now);
        }
    }
    fn is_done(&self) -> bool {
        self.inner.is_done()
    }
}

/// The estimate when the receiver reads in batches every `tick`: a batch shows the spacing
/// only across its ends, so the error is up to about a tick over the train's length.
#[test]
fn estimate_with_a_batching_receiver() {
    // (rate, read interval, tolerance): within 10 % while reads are at most a tenth of the
    // train (9 gaps) apart; coarser, the error grows with tick / train.
    for (rate, tick, tolerance) in [
        (10_000_000u64, Duration::from_micros(500), 0.10),
        (100_000_000, Duration::from_micros(100), 0.10),
        (1_000_000_000, Duration::from_micros(10), 0.10),
        (100_000_000, Duration::from_micros(250), 0.25),
        (1_000_000_000, Duration::from_micros(20), 0.25),
    ] {
        let mut errors = Vec::new();
        let mut none = 0;
        for seed in 1..=5 {
            let mut sim: Simulation<Batching<PairHost>> = Simulation::new(seed);
            let now = sim.now();
            // The pair as `Transfer` builds it, with the server behind the batching reader.
            let c: SocketAddr = CLIENT_ADDR.parse().unwrap();
            let s: SocketAddr = SERVER_ADDR.parse().unwrap();
            let server_ep = Endpoint::new(endpoint_config(seed, true), now);
            let key = Some(server_ep.public_key());
            let client = TernNode::new(
                Endpoint::new(endpoint_config(seed, false), now),
                c,
                tern_sim::tern::BulkSender::new(s, key, vec![2_000_000]),
            );
            let server = TernNode::new(server_ep, s, tern_sim::tern::VerifyingReceiver::new(1));
            let epoch = now;
            sim.add_host(
                Batching {
                    inner: PairHost::Client(client),
                    tick: Duration::ZERO,
                    epoch,
                    queue: Vec::new(),
                    due: None,
                },
                &[c.ip()],
            );
            sim.add_host(
                Batching {
                    inner: PairHost::Server(server),
                    tick,
                    epoch,
                    queue: Vec::new(),
                    due: None,
                },
                &[s.ip()],
            );
            // The reads fall at a different phase of the train in each run: the server's
            // answers leave on its read grid, so it is the uplink delay that shifts the train.
            let up = Duration::from_millis(20) + tick * seed as u32 / 5;
            sim.add_link(c.ip(), s.ip(), LinkConfig::new(rate, up));
            sim.add_link(
                s.ip(),
                c.ip(),
                LinkConfig::new(rate, Duration::from_millis(20)),
            );
            sim.run_until_done(now + Duration::from_secs(60))
                .expect("transfer completes");
            let host = sim.owner(c.ip()).unwrap();
            let PairHost::Client(node) = &sim.node(host).inner else {
                unreachable!()
            };
            let conn = node.endpoint.connection(ConnectionHandle(0)).unwrap();
            match conn.path_stats()[0].rate_estimate {
                Some(got) => errors.push((got as f64 - rate as f64 / 8.0) / (rate as f64 / 8.0)),
                None => none += 1,
            }
        }
        let train = Duration::from_secs_f64(9.0 * 1452.0 * 8.0 / rate as f64);
        eprintln!(
            "batching reader, {} Mbit/s, a read every {tick:?} (train {train:?}): errors {:?}, \
             {none} without estimate",
            rate / 1_000_000,
            errors
                .iter()
                .map(|e| format!("{:+.1} %", 100.0 * e))
                .collect::<Vec<_>>()
        );
        assert_eq!(none, 0);
        assert!(errors.iter().all(|e| e.abs() <= tolerance), "{errors:?}");
    }
}
