//! tern-proto driven by the simulator: handshakes and transfers over simulated links.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tern_proto::Endpoint;
use tern_sim::tern::{endpoint_config, BulkSender, TernNode, VerifyingReceiver};
use tern_sim::{LinkConfig, Node, Simulation};

const CLIENT: &str = "10.0.0.1";
const SERVER: &str = "10.0.0.2";

enum Host {
    Client(TernNode<BulkSender>),
    Server(TernNode<VerifyingReceiver>),
}

impl Node for Host {
    fn handle(&mut self, now: std::time::Instant, d: tern_sim::Datagram) {
        match self {
            Host::Client(n) => n.handle(now, d),
            Host::Server(n) => n.handle(now, d),
        }
    }
    fn poll_transmit(&mut self, now: std::time::Instant) -> Option<tern_sim::Datagram> {
        match self {
            Host::Client(n) => n.poll_transmit(now),
            Host::Server(n) => n.poll_transmit(now),
        }
    }
    fn poll_timeout(&mut self) -> Option<std::time::Instant> {
        match self {
            Host::Client(n) => n.poll_timeout(),
            Host::Server(n) => n.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: std::time::Instant) {
        match self {
            Host::Client(n) => n.handle_timeout(now),
            Host::Server(n) => n.handle_timeout(now),
        }
    }
    fn is_done(&self) -> bool {
        match self {
            Host::Client(n) => n.is_done(),
            Host::Server(n) => n.is_done(),
        }
    }
}

fn setup(seed: u64, link: LinkConfig, sizes: Vec<u64>, ik: bool) -> Simulation<Host> {
    let mut sim = Simulation::new(seed);
    let now = sim.now();
    let c: IpAddr = CLIENT.parse().unwrap();
    let s: IpAddr = SERVER.parse().unwrap();
    let server_addr = SocketAddr::new(s, 4433);
    let server_ep = Endpoint::new(endpoint_config(seed, true), now);
    let key = ik.then(|| server_ep.public_key());
    let n = sizes.len();
    let client = TernNode::new(
        Endpoint::new(endpoint_config(seed, false), now),
        SocketAddr::new(c, 5000),
        BulkSender::new(server_addr, key, sizes),
    );
    let mut rx = VerifyingReceiver::new(n);
    rx.record_timeline = true;
    let server = TernNode::new(server_ep, server_addr, rx);
    sim.add_host(Host::Client(client), &[c]);
    let _server = sim.add_host(Host::Server(server), &[s]);
    sim.add_link(c, s, link.clone());
    sim.add_link(s, c, link);
    sim
}

#[test]
fn ik_and_xx_transfer_over_a_clean_link() {
    for ik in [true, false] {
        let link = LinkConfig::new(10_000_000, Duration::from_millis(10));
        let mut sim = setup(1, link, vec![300_000, 50_000], ik);
        let took = sim
            .run_until_done(sim.now() + Duration::from_secs(30))
            .expect("transfer completes");
        let id = sim.owner(SERVER.parse().unwrap()).unwrap();
        let Host::Server(server) = sim.node(id) else {
            unreachable!()
        };
        assert_eq!(server.app.corrupt, None);
        assert_eq!(server.app.total(), 350_000);
        eprintln!("ik={ik}: {took:?}");
    }
}

#[test]
fn debug_handshake() {
    let link = LinkConfig::new(10_000_000, Duration::from_millis(10));
    let mut sim = setup(1, link, vec![3000], true);
    for _ in 0..20 {
        sim.run_for(Duration::from_millis(5));
        for ip in [CLIENT, SERVER] {
            let id = sim.owner(ip.parse().unwrap()).unwrap();
            match sim.node(id) {
                Host::Client(n) => eprintln!("{:?} client {:?} {:?}", sim.elapsed(), n.endpoint, n.app.error),
                Host::Server(n) => eprintln!("{:?} server {:?} total={}", sim.elapsed(), n.endpoint, n.app.total()),
            }
        }
        eprintln!("{}", sim.summary());
    }
}
