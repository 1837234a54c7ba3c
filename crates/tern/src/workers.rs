//! A server spread over several cores: one endpoint per worker, each with its own socket on
//! the same port (`SO_REUSEPORT`) and its own driver task, so that the runtime's threads
//! run them in parallel and no lock is shared between them on the data path.
//!
//! The kernel spreads datagrams over the sockets by their address 4-tuple, so a
//! connection's datagrams keep reaching the worker that took its first one. When a client
//! moves (a new address, a new 4-tuple) they may reach another: every connection ID a
//! worker hands out carries its server ID (QUIC-LB, [`tern_proto::lb`]), and a worker that
//! receives a datagram for a connection ID it does not route reads the server ID and
//! passes the datagram to the worker that owns it. The workers share one identity and
//! one first-flight register, so a replayed first flight is caught whichever worker the
//! kernel hands it to.
//!
//! The same server IDs let an external QUIC-LB load balancer spread connections over
//! machines: give each machine's workers their own server IDs (see
//! [`EndpointBuilder::routable_cids`]) and the balancer the configuration.

use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::task::Poll;

use tern_proto::lb::{QuicLb, RoutableCids};
use tern_proto::{EcnCodepoint, PublicKey};

use crate::connection::Connection;
use crate::driver::Shared;
use crate::endpoint::{Endpoint, EndpointBuilder};
use crate::socket::{RecvMeta, UdpSocket};

/// Most datagrams waiting to be taken by a worker from the others (beyond, they are dropped,
/// as a full socket buffer would).
const FORWARD_QUEUE: usize = 4096;

/// A datagram one worker received for another's connection.
pub(crate) struct Forwarded {
    pub(crate) local: Option<IpAddr>,
    pub(crate) remote: SocketAddr,
    pub(crate) ecn: Option<EcnCodepoint>,
    pub(crate) data: Vec<u8>,
}

/// What a worker needs to pass datagrams to the others.
pub(crate) struct Steering {
    me: usize,
    lb: QuicLb,
    /// Each worker's server ID, by worker index.
    server_ids: Vec<Vec<u8>>,
    /// The workers' shared state (weak: a worker's driver stops when its handles are gone).
    workers: Vec<Weak<Shared>>,
}

impl Steering {
    /// The worker that owns the connection ID `dcid`, if it is another one.
    fn owner(&self, proto: &tern_proto::Endpoint, dcid: &[u8]) -> Option<usize> {
        if proto.routes(dcid) {
            return None;
        }
        let sid = self.lb.server_id(dcid)?;
        let w = self.server_ids.iter().position(|s| *s == sid)?;
        (w != self.me).then_some(w)
    }

    /// Passes `datagram` to the worker that owns its connection, if that is another one:
    /// returns whether it did (or dropped it because that worker is gone or behind).
    pub(crate) fn forward(
        &self,
        proto: &tern_proto::Endpoint,
        meta: &RecvMeta,
        datagram: &[u8],
    ) -> bool {
        let Some(dcid) = tern_proto::wire::destination_cid(datagram) else {
            return false;
        };
        let Some(w) = self.owner(proto, dcid) else {
            return false;
        };
        if let Some(shared) = self.workers.get(w).and_then(Weak::upgrade) {
            let mut queue = shared.forwarded.lock().unwrap_or_else(|p| p.into_inner());
            if queue.len() < FORWARD_QUEUE {
                queue.push(Forwarded {
                    local: meta.dst_ip,
                    remote: meta.addr,
                    ecn: meta.ecn,
                    data: datagram.to_vec(),
                });
            }
            drop(queue);
            shared.wake.notify_one();
        }
        true
    }
}

/// A server on one port served by several workers (see the module documentation); built
/// with [`EndpointBuilder::build_workers`]. `accept` takes connections from every worker.
///
/// ```no_run
/// # async fn f() -> std::io::Result<()> {
/// use tern::{Endpoint, StaticKeypair};
/// let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
///     .bind("0.0.0.0:4433".parse().unwrap())
///     .server()
///     .build_workers(4)?;
/// while let Some(conn) = server.accept().await {
///     tokio::spawn(async move { /* serve conn */ });
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Workers {
    endpoints: Vec<Endpoint>,
    local: SocketAddr,
}

impl Workers {
    pub(crate) fn build(builder: EndpointBuilder, n: usize) -> io::Result<Self> {
        let n = n.max(1);
        if n > 256 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "at most 256 workers (one byte of server ID each)",
            ));
        }
        let EndpointBuilder {
            mut config,
            addr,
            mut options,
            qlog_dir,
            routable,
            ..
        } = builder;
        // Without a balancer's configuration: a local one, a random key and the worker's
        // index as its 1-byte server ID (7-byte IDs: 1 + 6 bytes of nonce).
        let (lb, server_ids) = match routable {
            // Only the first `n` IDs are any worker's: a connection ID naming a later one
            // is nobody's (handled here, like any unknown ID).
            Some((lb, mut ids)) if ids.len() >= n => {
                ids.truncate(n);
                (lb, ids)
            }
            Some((_, ids)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} server IDs for {n} workers", ids.len()),
                ))
            }
            None => {
                let mut key = [0u8; 16];
                key.copy_from_slice(&crate::entropy()[..16]);
                let lb = QuicLb::new(0, 1, 6, Some(key)).map_err(io::Error::other)?;
                (lb, (0..n).map(|i| vec![i as u8]).collect())
            }
        };
        config.first_flight.shared_register = Some(config.first_flight.new_shared_register());
        options.reuse_port = true;
        let mut endpoints = Vec::with_capacity(n);
        let mut local = addr;
        for (i, server_id) in server_ids.iter().take(n).enumerate() {
            let mut c = config.clone();
            c.rng_seed = crate::entropy();
            c.routable_cids =
                Some(RoutableCids::new(lb.clone(), server_id).map_err(io::Error::other)?);
            // The first socket picks the port (if 0); the others join it.
            let socket = UdpSocket::bind_with(local, options)?;
            let ep = Endpoint::start(Box::new(socket), c, qlog_dir.clone(), (n > 1).then_some(i))?;
            local = ep.local_addr()?;
            endpoints.push(ep);
        }
        let workers: Vec<Weak<Shared>> = endpoints
            .iter()
            .map(|e| Arc::downgrade(e.shared()))
            .collect();
        for (i, ep) in endpoints.iter().enumerate().filter(|_| n > 1) {
            ep.shared().lock().steering = Some(Steering {
                me: i,
                lb: lb.clone(),
                server_ids: server_ids.clone(),
                workers: workers.clone(),
            });
        }
        Ok(Self { endpoints, local })
    }

    /// The bound address (every worker's).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The server's identity.
    pub fn public_key(&self) -> PublicKey {
        self.endpoints[0].public_key()
    }

    /// The workers' endpoints (for their statistics, or to connect from one of them).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The next connection any worker accepted; `None` once every worker stopped or is
    /// closing.
    pub async fn accept(&self) -> Option<Connection> {
        let mut start = 0;
        poll_fn(|cx| {
            let n = self.endpoints.len();
            let mut open = 0;
            for k in 0..n {
                let i = (start + k) % n;
                let shared = self.endpoints[i].shared();
                let mut inner = shared.lock();
                if inner.dead.is_some() || inner.closing.is_some() {
                    continue;
                }
                open += 1;
                if let Some(id) = inner.incoming.pop_front() {
                    start = i + 1;
                    drop(inner);
                    return Poll::Ready(Some(Connection::new(shared.clone(), id)));
                }
                crate::driver::wait_on(&mut inner.accept_waiters, cx.waker());
            }
            if open == 0 {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Closes every connection of every worker (see [`Endpoint::close`]).
    pub fn close(&self, code: u64, reason: &[u8]) {
        for e in &self.endpoints {
            e.close(code, reason);
        }
    }

    /// Waits until every worker's connections have finished closing.
    pub async fn wait_idle(&self) {
        for e in &self.endpoints {
            e.wait_idle().await;
        }
    }

    /// Connections alive on all workers.
    pub fn connection_count(&self) -> usize {
        self.endpoints.iter().map(Endpoint::connection_count).sum()
    }
}
