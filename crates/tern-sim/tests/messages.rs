//! Messages, deadlines, priorities and the handover window (F5, F7) in the simulator.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tern_proto::{ConnectionHandle, Dir, Endpoint, Event, MessageId, MessageOptions, PublicKey};
use tern_sim::tern::{
    endpoint_config, established, App, BulkSender, PairHost, TernNode, VerifyingReceiver,
};
use tern_sim::{LinkConfig, LossModel, Simulation};

/// One message to send: at `at` (after the connection is up), `size` bytes, with options.
#[derive(Clone)]
struct Planned {
    at: Duration,
    size: usize,
    opts: MessageOptions,
}

/// Sends planned messages, and optionally a bulk stream of low-priority messages.
struct Sender {
    server: SocketAddr,
    key: PublicKey,
    conn: Option<ConnectionHandle>,
    start: Option<Instant>,
    plan: Vec<Planned>,
    next: usize,
    /// id → (send time, deadline)
    sent: BTreeMap<MessageId, (Instant, Option<Duration>)>,
    /// Keep this many bytes of low-priority bulk messages queued.
    bulk_backlog: usize,
    bulk_sent: usize,
    expired: Vec<MessageId>,
}

impl Sender {
    fn new(server: SocketAddr, key: PublicKey, plan: Vec<Planned>) -> Self {
        Self {
            server,
            key,
            conn: None,
            start: None,
            plan,
            next: 0,
            sent: BTreeMap::new(),
            bulk_backlog: 0,
            bulk_sent: 0,
            expired: Vec::new(),
        }
    }
}

impl App for Sender {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        let Some(conn) = established(&mut self.conn, ep, now, self.server, self.key) else {
            return;
        };
        let start = *self.start.get_or_insert(now);
        while self.next < self.plan.len() && start + self.plan[self.next].at <= now {
            let p = &self.plan[self.next];
            let id = conn
                .send_message(now, Bytes::from(vec![self.next as u8; p.size]), p.opts)
                .unwrap();
            self.sent.insert(id, (now, p.opts.deadline));
            self.next += 1;
        }
        // Bulk: keep the sender busy with priority-0 messages of 64 kB.
        while self.bulk_backlog > 0 && self.bulk_sent < self.bulk_backlog {
            conn.send_message(
                now,
                Bytes::from(vec![0xbb; 64_000]),
                MessageOptions::default().priority(0),
            )
            .unwrap();
            self.bulk_sent += 64_000;
        }
    }
    fn on_event(&mut self, _: Instant, _: &mut Endpoint, _: ConnectionHandle, e: Event) {
        if let Event::MessageExpired {
            id,
            by_sender: true,
            ..
        } = e
        {
            self.expired.push(id);
        }
    }
    fn is_done(&self) -> bool {
        self.next == self.plan.len()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        let start = self.start?;
        self.plan.get(self.next).map(|p| start + p.at)
    }
}

/// Receives messages and records when each arrived; can close its window for a while.
#[derive(Default)]
struct Receiver {
    conns: Vec<ConnectionHandle>,
    got: BTreeMap<MessageId, (Instant, usize)>,
    order: Vec<MessageId>,
    skipped: Vec<(MessageId, Duration)>,
    expect: usize,
}

impl App for Receiver {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        while let Some(h) = ep.accept() {
            self.conns.push(h);
        }
        for &h in &self.conns {
            let Some(conn) = ep.connection_mut(h) else {
                continue;
            };
            while let Some(m) = conn.recv_message() {
                if m.priority > 0 {
                    self.order.push(m.id);
                    self.got.insert(m.id, (now, m.data.len()));
                }
            }
        }
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, _: ConnectionHandle, e: Event) {
        if let Event::MessageExpired {
            id,
            by_sender: false,
            late_by,
        } = e
        {
            self.skipped.push((id, late_by));
        }

        self.poll(now, ep);
    }
    fn is_done(&self) -> bool {
        self.got.len() + self.skipped.len() >= self.expect
    }
}

type MessageSim = Simulation<PairHost<Sender, Receiver>>;

fn run(
    seed: u64,
    link: LinkConfig,
    plan: Vec<Planned>,
    bulk: usize,
) -> (MessageSim, SocketAddr, SocketAddr) {
    run_with(seed, link, plan, bulk, |_| {})
}

/// [`run`], with `setup` called on the simulation before it runs (to schedule link events).
fn run_with(
    seed: u64,
    link: LinkConfig,
    plan: Vec<Planned>,
    bulk: usize,
    setup: impl FnOnce(&mut MessageSim),
) -> (MessageSim, SocketAddr, SocketAddr) {
    let mut sim: MessageSim = Simulation::new(seed);
    let now = sim.now();
    let c: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let s: SocketAddr = "10.0.0.2:4433".parse().unwrap();
    let server = Endpoint::new(endpoint_config(seed, true), now);
    let key = server.public_key();
    let n = plan.len();
    let mut sender = Sender::new(s, key, plan);
    sender.bulk_backlog = bulk;
    let receiver = Receiver {
        expect: n,
        ..Receiver::default()
    };
    sim.add_host(
        PairHost::Client(TernNode::new(
            Endpoint::new(endpoint_config(seed, false), now),
            c,
            sender,
        )),
        &[c.ip()],
    );
    sim.add_host(
        PairHost::Server(TernNode::new(server, s, receiver)),
        &[s.ip()],
    );
    sim.add_link(c.ip(), s.ip(), link.clone());
    let mut back = link;
    back.loss = LossModel::None;
    sim.add_link(s.ip(), c.ip(), back);
    setup(&mut sim);
    let _ = sim.run_until_done(now + Duration::from_secs(120));
    // Let stragglers and skips arrive.
    let end = sim.now() + Duration::from_secs(2);
    sim.run_until(end);
    (sim, c, s)
}

fn apps(sim: &MessageSim, c: SocketAddr, s: SocketAddr) -> (&Sender, &Receiver) {
    let sender = match sim.owner(c.ip()).map(|h| sim.node(h)) {
        Some(PairHost::Client(n)) => &n.app,
        _ => unreachable!(),
    };
    let receiver = match sim.owner(s.ip()).map(|h| sim.node(h)) {
        Some(PairHost::Server(n)) => &n.app,
        _ => unreachable!(),
    };
    (sender, receiver)
}

/// The client's connection statistics.
fn client_stats(sim: &MessageSim, c: SocketAddr, sender: &Sender) -> tern_proto::ConnectionStats {
    match sim.owner(c.ip()).map(|h| sim.node(h)) {
        Some(PairHost::Client(n)) => n
            .endpoint
            .connection(sender.conn.expect("connected"))
            .expect("open")
            .stats(),
        _ => unreachable!("the client"),
    }
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * 0.99) as usize]
}

#[test]
fn deadline_messages_are_never_late_and_never_stall_later_ones() {
    // 30 Hz frames of 4.5–60 kB with a 150 ms deadline on a 20 Mbit/s, 40 ms RTT link with
    // 5 % loss.
    let mut link = LinkConfig::new(20_000_000, Duration::from_millis(20));
    link.loss = LossModel::Random(0.05);
    let plan: Vec<Planned> = (0..300)
        .map(|i| Planned {
            at: Duration::from_millis(33 * i),
            size: 4_500 + (i as usize * 7_919) % 56_000,
            opts: MessageOptions::default().deadline(Duration::from_millis(150)),
        })
        .collect();
    let (sim, c, s) = run(11, link, plan, 0);
    let (sender, receiver) = apps(&sim, c, s);
    let mut late = 0;
    let mut latencies = Vec::new();
    for (id, (at, _)) in &receiver.got {
        let (sent, deadline) = sender.sent[id];
        let latency = *at - sent;
        latencies.push(latency);
        if latency > deadline.unwrap() {
            late += 1;
        }
    }
    // Ordered delivery held: IDs arrive increasing even though some were skipped.
    assert!(receiver.order.windows(2).all(|w| w[0] < w[1]));
    eprintln!(
        "delivered {} of 300, skipped {} (sender gave up {}), late 0 expected: {late}; p99 latency {:?}",
        receiver.got.len(),
        receiver.skipped.len(),
        sender.expired.len(),
        p99(latencies.clone())
    );
    if let Some(PairHost::Client(n)) = sim.owner(c.ip()).map(|h| sim.node(h)) {
        eprintln!(
            "sender stats: {:?}",
            n.endpoint
                .connection(ConnectionHandle(0))
                .map(|c| c.stats())
        );
    }
    assert_eq!(late, 0, "a message was delivered after its deadline");
    assert_eq!(
        receiver.got.len() + receiver.skipped.len(),
        300,
        "every message delivered or skipped"
    );
    assert!(
        receiver.got.len() >= 270,
        "most messages make it: {}",
        receiver.got.len()
    );
}

#[test]
fn high_priority_messages_overtake_a_bulk_transfer() {
    let link = || {
        let mut l = LinkConfig::new(20_000_000, Duration::from_millis(20));
        l.queue_limit_bytes = 100_000;
        l
    };
    let plan: Vec<Planned> = (0..100)
        .map(|i| Planned {
            at: Duration::from_millis(50 * i + 500),
            size: 2_000,
            // Urgent and independent: unordered, so it waits for no bulk message either.
            opts: MessageOptions::default().priority(7).unordered(),
        })
        .collect();
    let measure = |bulk: usize| {
        let (sim, c, s) = run(5, link(), plan.clone(), bulk);
        let (sender, receiver) = apps(&sim, c, s);
        let lat: Vec<Duration> = receiver
            .got
            .iter()
            .map(|(id, (at, _))| *at - sender.sent[id].0)
            .collect();
        assert_eq!(lat.len(), 100);
        p99(lat)
    };
    let alone = measure(0);
    let with_bulk = measure(40_000_000);
    eprintln!("high-priority p99 latency: alone {alone:?}, beside a 40 MB low-priority bulk {with_bulk:?}");
    // The bulk fills the link and its queue; the urgent messages jump the sender's queue, so
    // they wait at most for the bottleneck queue (100 kB = 40 ms at 20 Mbit/s) and the
    // packets already in flight.
    assert!(
        with_bulk < alone + Duration::from_millis(60),
        "{with_bulk:?} vs {alone:?}"
    );
}

#[test]
fn an_unordered_message_is_delivered_before_a_missing_earlier_one_is_repaired() {
    // Message 0 (ordered, large) loses packets; message 1 (unordered, small) arrives first.
    let mut link = LinkConfig::new(10_000_000, Duration::from_millis(50));
    link.loss = LossModel::Random(0.10);
    let plan = vec![
        Planned {
            at: Duration::ZERO,
            size: 100_000,
            opts: MessageOptions::default(),
        },
        Planned {
            at: Duration::from_millis(1),
            size: 500,
            opts: MessageOptions::default().unordered(),
        },
    ];
    let (sim, c, s) = run(3, link, plan, 0);
    let (_, receiver) = apps(&sim, c, s);
    assert_eq!(receiver.order.len(), 2);
    assert!(
        !receiver.order[0].is_ordered(),
        "the unordered message came first: {:?}",
        receiver.order
    );
}

/// Window-close handover (F7): the receiver closes its window for 2 s in the middle of a
/// transfer; the transfer completes byte for byte, and the sender's polls are few.
#[test]
fn window_close_handover_loses_nothing() {
    let mut sim: Simulation<PairHost<BulkSender, WindowReceiver>> = Simulation::new(21);
    let now = sim.now();
    let c: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let s: SocketAddr = "10.0.0.2:4433".parse().unwrap();
    let server = Endpoint::new(endpoint_config(21, true), now);
    let key = server.public_key();
    let sender = BulkSender::new(s, Some(key), vec![3_000_000]);
    let rx = WindowReceiver {
        inner: VerifyingReceiver::new(1),
        close_at: now + Duration::from_millis(500),
        open_at: now + Duration::from_millis(2500),
        closed: false,
        opened: false,
        received_while_closed: 0,
        received_at_close: 0,
    };
    sim.add_host(
        PairHost::Client(TernNode::new(
            Endpoint::new(endpoint_config(21, false), now),
            c,
            sender,
        )),
        &[c.ip()],
    );
    sim.add_host(PairHost::Server(TernNode::new(server, s, rx)), &[s.ip()]);
    let mut link = LinkConfig::new(10_000_000, Duration::from_millis(20));
    link.queue_limit_bytes = 50_000;
    sim.add_link(c.ip(), s.ip(), link.clone());
    sim.add_link(s.ip(), c.ip(), link);
    sim.run_until_done(now + Duration::from_secs(60))
        .expect("completes");
    let (probes, flows_finished) = match sim.owner(c.ip()).map(|h| sim.node(h)) {
        Some(PairHost::Client(n)) => {
            let st = n
                .endpoint
                .connection(ConnectionHandle(0))
                .map(|c| c.stats())
                .unwrap();
            (st.window_probes, n.app.finished)
        }
        _ => unreachable!(),
    };
    let Some(PairHost::Server(n)) = sim.owner(s.ip()).map(|h| sim.node(h)) else {
        unreachable!()
    };
    let rx = &n.app;
    assert_eq!(rx.inner.corrupt, None);
    assert_eq!(rx.inner.total(), 3_000_000, "every byte arrived");
    // What was in flight (at most a window: 50 kB of queue plus 50 kB in the pipe, and the
    // window can briefly exceed that) lands after the close; after that nothing new is sent.
    eprintln!(
        "window closed 2 s: {} bytes arrived after the close (in flight), sender polled {probes} times",
        rx.received_while_closed
    );
    assert!(
        rx.received_while_closed < 250_000,
        "{}",
        rx.received_while_closed
    );
    assert!((1..=12).contains(&probes), "{probes} polls in 2 s");
    assert_eq!(
        flows_finished, 1,
        "the sender saw its one flow acknowledged to the end"
    );
}

struct WindowReceiver {
    inner: VerifyingReceiver,
    close_at: Instant,
    open_at: Instant,
    closed: bool,
    opened: bool,
    received_at_close: u64,
    received_while_closed: u64,
}

impl App for WindowReceiver {
    fn poll(&mut self, now: Instant, ep: &mut Endpoint) {
        self.inner.poll(now, ep);
        let conn = self.inner.accepted.first().copied();
        if let Some(h) = conn {
            if let Some(c) = ep.connection_mut(h) {
                if !self.closed && now >= self.close_at {
                    c.close_window(1, b"handover to the next roadside unit");
                    self.closed = true;
                    self.received_at_close = self.inner.total();
                }
                if self.closed && !self.opened && now >= self.open_at {
                    self.received_while_closed = self.inner.total() - self.received_at_close;
                    c.open_window();
                    self.opened = true;
                }
            }
        }
    }
    fn on_event(&mut self, now: Instant, ep: &mut Endpoint, h: ConnectionHandle, e: Event) {
        self.inner.on_event(now, ep, h, e);
        self.poll(now, ep);
    }
    fn is_done(&self) -> bool {
        self.inner.is_done()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        if !self.closed {
            Some(self.close_at)
        } else if !self.opened {
            Some(self.open_at)
        } else {
            None
        }
    }
}

#[allow(dead_code)]
fn unused(_: Dir) {}

/// A request-sized message on a new connection leaves at once: no round trip of pacing
/// delay from a small initial pacing bucket (10.8 kB = 9 packets within the initial window).
#[test]
fn first_messages_on_a_new_connection_leave_at_once() {
    let one_way = Duration::from_millis(18);
    let link = LinkConfig::new(30_000_000, one_way);
    let plan: Vec<Planned> = (0..6)
        .map(|i| Planned {
            at: Duration::from_millis(5 + 33 * i),
            size: 10_800,
            opts: MessageOptions::default().unordered(),
        })
        .collect();
    let (sim, c, s) = run(3, link, plan, 0);
    let (sender, receiver) = apps(&sim, c, s);
    assert_eq!(receiver.got.len(), 6);
    // One-way delay plus 9 packets of ~1.25 kB on the wire at 30 Mbit/s, plus 1 ms.
    let bound = one_way + Duration::from_micros(9 * 1250 * 8 / 30) + Duration::from_millis(1);
    let (id, (at, _)) = receiver.got.iter().next().unwrap();
    let latency = *at - sender.sent[id].0;
    assert!(latency <= bound, "first message: {latency:?} > {bound:?}");
    // (The next ones may wait a few ms for the initial window to be acknowledged.)
}

/// What [`lose_message`] saw.
struct Lost {
    /// How long after it was sent the victim arrived.
    took: Duration,
    /// The client's connection statistics.
    stats: tern_proto::ConnectionStats,
    /// Datagrams the uplink dropped while down.
    dropped: u64,
}

/// `count` messages of `size` bytes, one per `period`, over 20 ms each way; the uplink goes
/// down halfway between messages `victim - 1` and `victim` and comes back `down` later
/// (message `victim - 1` was acknowledged long before, and the client sends nothing but
/// messages and their repairs).
fn lose_message(
    count: usize,
    victim: usize,
    period: Duration,
    size: usize,
    down: Duration,
) -> Lost {
    let plan: Vec<Planned> = (0..count)
        .map(|i| Planned {
            at: period * i as u32,
            size,
            opts: MessageOptions::default().priority(1),
        })
        .collect();
    let link = LinkConfig::new(30_000_000, ONE_WAY);
    let c: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    fn watch(sim: &mut MessageSim, c: SocketAddr, victim: usize, period: Duration, down: Duration) {
        let sender = match sim.owner(c.ip()).map(|h| sim.node(h)) {
            Some(PairHost::Client(n)) => &n.app,
            _ => unreachable!("the client"),
        };
        let uplink = sim.links().next().expect("the uplink was added first");
        let last_sent = (sender.next == victim)
            .then(|| sender.sent.values().map(|(t, _)| *t).max())
            .flatten();
        match last_sent {
            Some(t) if sim.now() >= t + period / 2 => {
                sim.link_mut(uplink).set_up(false);
                sim.schedule_in(down, move |s| s.link_mut(uplink).set_up(true));
            }
            _ => sim.schedule_in(Duration::from_millis(1), move |s| {
                watch(s, c, victim, period, down)
            }),
        }
    }
    let (sim, c, s) = run_with(3, link, plan, 0, |sim| watch(sim, c, victim, period, down));
    let (sender, receiver) = apps(&sim, c, s);
    let uplink = sim.links().next().expect("the uplink");
    let dropped = sim.link(uplink).stats().dropped_down;
    assert_eq!(receiver.got.len(), count, "every message arrives");
    let id = *sender.sent.keys().nth(victim).expect("the victim was sent");
    let took = receiver.got[&id].0 - sender.sent[&id].0;
    let stats = client_stats(&sim, c, sender);
    eprintln!(
        "message {victim} of {count} delivered after {took:?}; dropped {dropped}, tail probes {}, PTOs {}, NACKs {}",
        stats.tail_probes, stats.ptos, stats.nacks_received
    );
    Lost {
        took,
        stats,
        dropped,
    }
}

/// [`lose_message`] of one 1 000-byte packet: the uplink is down only while it leaves, so
/// its one packet is the only datagram lost.
fn lose_one_message(count: usize, victim: usize, period: Duration) -> Lost {
    let down = period / 2 + Duration::from_millis(5);
    let lost = lose_message(count, victim, period, 1_000, down);
    assert_eq!(lost.dropped, 1, "one datagram dropped");
    lost
}

const ONE_WAY: Duration = Duration::from_millis(20);

/// A message whose last packet is lost, sent by an application that sends one message per
/// period: the probe timeout counts from the latest packet, so every new message pushed it
/// back and only the next message revealed the gap (a whole period later, then a round trip
/// for the NACK). The tail-loss probe resends it a probe timeout after it left instead.
#[test]
fn a_lost_last_packet_is_probed_before_the_next_message_reveals_it() {
    // Shorter than a probe timeout (here about 55 ms: a 40 ms RTT, its variation, the
    // peer's 10 ms ACK delay), so the next message leaves before it expires. Message 30:
    // late enough for the RTT variation to have settled.
    const PERIOD: Duration = Duration::from_millis(40);
    let Lost { took, stats, .. } = lose_one_message(40, 30, PERIOD);
    assert_eq!(stats.tail_probes, 1, "the lost packet was probed once");
    // The next message's packet reaches the receiver PERIOD + ONE_WAY after the victim left;
    // a repair that the gap it reveals sets off arrives a round trip after that.
    assert!(
        took < PERIOD + 3 * ONE_WAY,
        "repaired before a repair set off by the next message could arrive ({took:?})"
    );
}

/// The last message of all is lost: nothing is sent after it, so the probe timeout is as early
/// as a tail-loss probe would be, and it alone repairs the loss (no second, duplicate probe).
#[test]
fn a_lone_lost_packet_is_left_to_the_probe_timeout() {
    let stats = lose_one_message(31, 30, Duration::from_millis(40)).stats;
    assert!(stats.ptos >= 1, "the probe timeout fired");
    assert_eq!(stats.tail_probes, 0, "no tail-loss probe besides it");
}

/// An outage that takes the last two messages: one tail-loss probe (the second message
/// put the probe timeout off), then the probe timeout with its backoff. (A first version
/// probed each probe in turn: every probe was the "later packet" that let the next one fire,
/// and the probe timeout never came.)
#[test]
fn an_outage_gets_one_tail_loss_probe_then_the_probe_timeout() {
    let period = Duration::from_millis(40);
    let lost = lose_message(32, 30, period, 1_000, Duration::from_secs(2));
    assert!(
        lost.dropped >= 4,
        "the messages and the probes were dropped"
    );
    assert_eq!(lost.stats.tail_probes, 1, "one probe for the episode");
    assert!(
        lost.stats.ptos >= 3,
        "the probe timeout fired and backed off"
    );
}

/// Small messages at 30 Hz (the MAR benchmark's smallest frame, 4.5 kB) over an uplink with
/// 1 % random loss (30 Mbit/s, 17 ms each way, 2 ms jitter, like `lte`): the 99th percentile
/// of delivery is a repair, and a repair takes about one probe timeout even when the lost
/// packet was a message's last, since the tail-loss probe (PROTOCOL.md §11.6). Before it,
/// such a loss waited for the next message to reveal it: the same run's 99th percentile was
/// 87 ms, against 67 ms with the probe.
#[test]
fn small_periodic_messages_repair_a_lost_tail_within_a_probe_timeout() {
    let plan: Vec<Planned> = (0..1500)
        .map(|i| Planned {
            at: Duration::from_micros(33_333 * i),
            size: 4_500,
            opts: MessageOptions::default().priority(1),
        })
        .collect();
    let link = LinkConfig::new(30_000_000, Duration::from_millis(17))
        .with_jitter(Duration::from_millis(2))
        .with_loss(LossModel::Random(0.01));
    let (sim, c, s) = run(11, link, plan, 0);
    let (sender, receiver) = apps(&sim, c, s);
    assert_eq!(receiver.got.len(), 1500, "every message arrives");
    let latencies: Vec<Duration> = receiver
        .got
        .iter()
        .map(|(id, (at, _))| *at - sender.sent[id].0)
        .collect();
    let stats = client_stats(&sim, c, sender);
    let p99 = p99(latencies);
    eprintln!(
        "4.5 kB at 30 Hz, 1 % loss: p99 {p99:?}; lost {}, tail probes {}, PTOs {}, NACKs {}",
        stats.packets_lost, stats.tail_probes, stats.ptos, stats.nacks_received
    );
    assert!(stats.tail_probes > 0, "some losses were a message's tail");
    // One way (about 19 ms) plus a probe timeout (about 40 + 4 × rttvar + 10 ms), with room
    // for the jitter; a repair that waits for the next message takes a period (33 ms) and a
    // round trip more.
    assert!(p99 < Duration::from_millis(75), "p99 {p99:?}");
}
