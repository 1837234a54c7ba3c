//! The endpoint: a UDP socket and the tern connections on it.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tern_proto::{ConnectionError, EndpointConfig, Event, PublicKey, StaticKeypair};

use crate::connection::Connection;
use crate::driver::{self, ConnectionId, Inner, Shared};
use crate::runtime;
use crate::socket::{AsyncUdpSocket, SocketOptions, UdpSocket};
use crate::workers::Workers;
use tern_proto::lb::{QuicLb, RoutableCids};

/// Why `connect` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The connection could not be started (e.g. too many connections).
    #[error(transparent)]
    Start(#[from] crate::StartError),
    /// The handshake failed or timed out.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// The endpoint's socket failed.
    #[error("endpoint stopped: {0}")]
    EndpointStopped(String),
}

/// A tern endpoint bound to a UDP socket: connects to servers and, if configured as a
/// server, accepts connections. One tokio task drives the socket and every connection.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tern::{Endpoint, StaticKeypair};
/// use tokio::io::AsyncReadExt;
///
/// let server = Endpoint::server("127.0.0.1:4433".parse()?, StaticKeypair::generate(tern::entropy()))?;
/// let client = Endpoint::client(StaticKeypair::generate(tern::entropy()))?;
/// let conn = client.connect(server.local_addr()?, Some(server.public_key())).await?;
/// let mut flow = conn.open_uni().await?;
/// # Ok(()) }
/// ```
pub struct Endpoint {
    shared: Arc<Shared>,
    local: SocketAddr,
    public_key: PublicKey,
}

impl Clone for Endpoint {
    fn clone(&self) -> Self {
        self.shared.add_handle();
        Self {
            shared: self.shared.clone(),
            local: self.local,
            public_key: self.public_key,
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shared.drop_handle();
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.local)
            .field("public_key", &self.public_key)
            .finish()
    }
}

/// 32 bytes from the operating system's RNG, for keys and endpoint seeds.
pub fn entropy() -> [u8; 32] {
    use rand::TryRngCore;
    let mut seed = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .expect("the operating system's random number generator is unavailable");
    seed
}

/// Sets up an [`Endpoint`]: its identity, whether it serves, where it binds (or the socket it
/// takes over), the protocol settings and the socket's. Every setting has a default:
///
/// | setting | default |
/// |---|---|
/// | [`bind`](Self::bind) | `0.0.0.0:0` (any interface, an ephemeral port) |
/// | [`server`](Self::server) | off: the endpoint only connects |
/// | [`config`](Self::config) | [`EndpointConfig::new`] with a seed from [`entropy`] |
/// | [`recv_buffer`](Self::recv_buffer), [`send_buffer`](Self::send_buffer) | 8 MiB each (the kernel caps them at `net.core.rmem_max`/`wmem_max`) |
/// | [`gso`](Self::gso) | on where the kernel has it |
/// | [`socket`](Self::socket), [`async_socket`](Self::async_socket) | none: tern binds a kernel UDP socket itself |
/// | [`qlog_dir`](Self::qlog_dir) | `$TERN_QLOG_DIR` if set, else no qlog |
///
/// ```no_run
/// # async fn f() -> std::io::Result<()> {
/// use tern::{Endpoint, StaticKeypair};
/// let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
///     .bind("[::1]:0".parse().unwrap())       // IPv6 loopback
///     .recv_buffer(32 << 20)
///     .configure(|c| c.connection.idle_timeout = std::time::Duration::from_secs(60))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "an EndpointBuilder does nothing until build() is called"]
pub struct EndpointBuilder {
    pub(crate) config: EndpointConfig,
    pub(crate) addr: SocketAddr,
    socket: Option<std::net::UdpSocket>,
    async_socket: Option<Box<dyn AsyncUdpSocket>>,
    pub(crate) options: SocketOptions,
    pub(crate) qlog_dir: Option<std::path::PathBuf>,
    /// A QUIC-LB configuration and the server IDs to use (one per worker).
    pub(crate) routable: Option<(QuicLb, Vec<Vec<u8>>)>,
}

impl EndpointBuilder {
    /// Writes a qlog trace of every connection into `dir` (JSON-SEQ, the qlog main schema:
    /// packets, RTT, congestion window, pacing rate and congestion state per path, readable
    /// in qvis), one file per connection. Without it, the environment variable
    /// `TERN_QLOG_DIR` ([`QLOG_DIR_ENV`](crate::QLOG_DIR_ENV)) does the same for every
    /// endpoint of the process.
    pub fn qlog_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.qlog_dir = Some(dir.into());
        self
    }

    /// The address to bind (ignored with [`socket`](Self::socket)).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Accept connections too (a server needs a known port: see [`bind`](Self::bind)).
    pub fn server(mut self) -> Self {
        self.config = self.config.server();
        self
    }

    /// Replaces the protocol configuration (its keypair becomes the endpoint's identity).
    pub fn config(mut self, config: EndpointConfig) -> Self {
        self.config = config;
        self
    }

    /// Changes the protocol configuration in place: connection, flow and congestion settings
    /// ([`EndpointConfig::connection`]), retry policy, limits.
    pub fn configure(mut self, f: impl FnOnce(&mut EndpointConfig)) -> Self {
        f(&mut self.config);
        self
    }

    /// The socket receive buffer to ask the kernel for, in bytes. Large buffers keep bursts
    /// at high rates from overflowing it (the kernel's `RcvbufErrors`).
    pub fn recv_buffer(mut self, bytes: usize) -> Self {
        self.options.recv_buffer = bytes;
        self
    }

    /// The socket send buffer to ask the kernel for, in bytes.
    pub fn send_buffer(mut self, bytes: usize) -> Self {
        self.options.send_buffer = bytes;
        self
    }

    /// Whether to send GSO batches (one `sendmsg` for up to 64 datagrams) where the kernel
    /// supports them. Off: one datagram per call (for comparisons, or paths that mishandle
    /// segmentation offload).
    pub fn gso(mut self, enabled: bool) -> Self {
        self.options.gso = enabled;
        self
    }

    /// Uses a UDP socket the application created and bound itself (a port handed over by a
    /// supervisor, a socket with options tern does not set) instead of binding one. tern
    /// still sets its buffer sizes, non-blocking mode, and the ECN and GRO options.
    pub fn socket(mut self, socket: std::net::UdpSocket) -> Self {
        self.socket = Some(socket);
        self
    }

    /// Sends and receives through `socket`, a socket of the application's own making (see
    /// [`AsyncUdpSocket`](crate::socket::AsyncUdpSocket)): a wrapper that meters or shapes
    /// traffic, a relay, an in-process transport. The bind address, buffer and GSO settings
    /// do not apply to it; it has its own.
    pub fn async_socket(mut self, socket: impl AsyncUdpSocket) -> Self {
        self.async_socket = Some(Box::new(socket));
        self
    }

    /// Makes the server's connection IDs routable by a QUIC-LB load balancer
    /// ([`tern_proto::lb`]): each carries a server ID under `lb`'s key, so that a balancer
    /// with the same configuration sends a connection's datagrams to this machine wherever
    /// the client moves. `server_ids`: this machine's (one per worker with
    /// [`build_workers`](Self::build_workers), else the first is used). tern's connection
    /// IDs are 8 bytes: the server ID and nonce lengths of `lb` must sum to 7.
    pub fn routable_cids(mut self, lb: QuicLb, server_ids: Vec<Vec<u8>>) -> Self {
        self.routable = Some((lb, server_ids));
        self
    }

    /// Binds (or takes over the socket) and starts the endpoint's task. Must be called inside
    /// a tokio runtime.
    pub fn build(mut self) -> io::Result<Endpoint> {
        if let Some((lb, ids)) = self.routable.take() {
            let id = ids.first().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "routable_cids: no server ID")
            })?;
            self.config.routable_cids = Some(RoutableCids::new(lb, id).map_err(io::Error::other)?);
        }
        let socket: Box<dyn AsyncUdpSocket> = match (self.async_socket, self.socket) {
            (Some(s), _) => s,
            (None, Some(s)) => Box::new(UdpSocket::from_std_with(s, self.options)?),
            (None, None) => Box::new(UdpSocket::bind_with(self.addr, self.options)?),
        };
        Endpoint::start(socket, self.config, self.qlog_dir, None)
    }

    /// Binds `n` sockets to the same address (`SO_REUSEPORT`) and starts a server endpoint
    /// on each: the workers of [`Workers`], which the runtime's threads run in parallel.
    /// Datagrams that reach the wrong worker (a client that moved) are passed to the right
    /// one by the server ID in their connection ID (see [`Workers`]). Needs a built-in
    /// socket (not [`socket`](Self::socket) or [`async_socket`](Self::async_socket)).
    pub fn build_workers(self, n: usize) -> io::Result<Workers> {
        if self.socket.is_some() || self.async_socket.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "build_workers binds its own sockets",
            ));
        }
        Workers::build(self, n)
    }
}

impl Endpoint {
    /// Sets up an endpoint with identity `keypair`, step by step (see [`EndpointBuilder`]).
    pub fn builder(keypair: StaticKeypair) -> EndpointBuilder {
        EndpointBuilder {
            config: EndpointConfig::new(keypair, entropy()),
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            socket: None,
            async_socket: None,
            options: SocketOptions::default(),
            qlog_dir: None,
            routable: None,
        }
    }

    /// Binds `addr` with a full configuration and default socket settings. Must be called
    /// inside a tokio runtime.
    pub fn bind(addr: SocketAddr, config: EndpointConfig) -> io::Result<Self> {
        Self::start(Box::new(UdpSocket::bind(addr)?), config, None, None)
    }

    /// Starts the driver of an endpoint on `socket` (`worker`: its index among the workers
    /// of one server, which names its qlog files apart).
    pub(crate) fn start(
        socket: Box<dyn AsyncUdpSocket>,
        mut config: EndpointConfig,
        qlog_dir: Option<std::path::PathBuf>,
        worker: Option<usize>,
    ) -> io::Result<Self> {
        let local = socket.local_addr()?;
        let qlog_dir = qlog_dir.or_else(|| std::env::var_os(crate::QLOG_DIR_ENV).map(Into::into));
        let name = match worker {
            Some(w) => format!("{}-w{w}", local.port()),
            None => local.port().to_string(),
        };
        let qlog = match &qlog_dir {
            Some(dir) => Some(crate::qlog::QlogDir::new(dir, name)?),
            None => None,
        };
        config.connection.qlog |= qlog.is_some();
        // Application handles may still hold unread data of a closed connection: the
        // runtime frees connections itself when the last handle is gone.
        config.release_drained = false;
        let public_key = config.keypair.public();
        // Timestamps our first flights and lets the server prove others' fresh (§7.6).
        let now = runtime::now();
        config.wall_clock = config.wall_clock.or_else(runtime::wall_clock);
        let proto = tern_proto::Endpoint::new(config, now);
        let gso = socket.max_transmit_segments().max(1);
        let gro = socket.max_receive_segments().max(1);
        tracing::debug!(%local, gso, gro, ?socket, "endpoint bound");
        let mut inner = Inner::new(proto, gso, gro);
        inner.qlog = qlog;
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            wake: tokio::sync::Notify::new(),
            io: Default::default(),
            forwarded: Mutex::new(Vec::new()),
            socket: Arc::from(socket),
            send: Default::default(),
            handles: 1.into(),
        });
        tokio::spawn(driver::drive(shared.clone()));
        Ok(Self {
            shared,
            local,
            public_key,
        })
    }

    /// A server on `addr` with identity `keypair` and default settings (shorthand for
    /// `Endpoint::builder(keypair).bind(addr).server().build()`).
    pub fn server(addr: SocketAddr, keypair: StaticKeypair) -> io::Result<Self> {
        Self::builder(keypair).bind(addr).server().build()
    }

    /// A client on an ephemeral IPv4 port with identity `keypair` and default settings
    /// (shorthand for `Endpoint::builder(keypair).build()`; use the builder to bind IPv6,
    /// loopback or a given port).
    pub fn client(keypair: StaticKeypair) -> io::Result<Self> {
        Self::builder(keypair).build()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// This endpoint's identity.
    pub fn public_key(&self) -> PublicKey {
        self.public_key
    }

    /// Segments one UDP GSO send may carry (1: no GSO).
    pub fn gso_segments(&self) -> usize {
        self.shared.lock().gso_segments
    }

    /// Segments one receive may coalesce with GRO (1: no GRO).
    pub fn gro_segments(&self) -> usize {
        self.shared.lock().gro_segments
    }

    /// Connects to `addr`. With the server's key the handshake is Noise IK (one round trip);
    /// without, XX (the server's key is learned: check `Connection::peer_key`). Resolves once
    /// the handshake completed, or fails after the handshake timeout
    /// (`ConnectionConfig::handshake_timeout`, 10 s by default) without an answer. Dropping the
    /// future before it resolves abandons the attempt: the half-made connection is closed.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server_key: Option<PublicKey>,
    ) -> Result<Connection, ConnectError> {
        let id = {
            let mut inner = self.shared.lock();
            let handle = inner.proto.connect(runtime::now(), addr, server_key)?;
            inner.register(handle)
        };
        let conn = Connection::new(self.shared.clone(), id);
        // The first message leaves from this task, as any command's packets do, not after
        // the driver is scheduled (often on the other core); the driver is still woken for
        // the handshake's timer.
        conn.transmit_now();
        let shared = &self.shared;
        poll_fn(|cx| {
            let mut inner = shared.lock();
            if let Some(reason) = &inner.dead {
                return Poll::Ready(Err(ConnectError::EndpointStopped(reason.clone())));
            }
            match inner.state(id) {
                Some(s) if s.connected => Poll::Ready(Ok(())),
                Some(s) if s.error.is_some() => Poll::Ready(Err(ConnectError::Connection(
                    s.error
                        .clone()
                        .unwrap_or(ConnectionError::HandshakeTimedOut),
                ))),
                Some(s) => {
                    crate::driver::wait_on(&mut s.waiters, cx.waker());
                    Poll::Pending
                }
                None => Poll::Ready(Err(ConnectError::Connection(
                    ConnectionError::HandshakeTimedOut,
                ))),
            }
        })
        .await?;
        Ok(conn)
    }

    /// Waits for the next incoming connection. `None` if the endpoint stopped or is closing
    /// ([`Endpoint::close`]).
    pub async fn accept(&self) -> Option<Connection> {
        let id = poll_fn(|cx| {
            let mut inner = self.shared.lock();
            if inner.dead.is_some() || inner.closing.is_some() {
                return Poll::Ready(None);
            }
            match inner.incoming.pop_front() {
                Some(id) => Poll::Ready(Some(id)),
                None => {
                    crate::driver::wait_on(&mut inner.accept_waiters, cx.waker());
                    Poll::Pending
                }
            }
        })
        .await?;
        Some(Connection::new(self.shared.clone(), id))
    }

    /// Registers an up-call: `callback` runs on the endpoint's task for every event of every
    /// connection (connected, flow readable, closed, security violation, …), the SLTP style
    /// for servers that react to events rather than await them. It must not block.
    pub fn on_event(&self, callback: impl Fn(ConnectionId, &Event) + Send + Sync + 'static) {
        self.shared.lock().upcalls.push(Arc::new(callback));
    }

    /// What the socket did: `sendmsg` calls and the datagrams they carried (the GSO batch size
    /// is their ratio), receive calls and datagrams, send errors.
    pub fn io_stats(&self) -> crate::IoStats {
        self.shared.io.snapshot()
    }

    /// Endpoint-level counters (malformed, unroutable, retries, resets, …).
    pub fn stats(&self) -> crate::EndpointStats {
        self.shared.lock().proto.stats().clone()
    }

    /// Closes every connection of this endpoint with an application `code` and `reason`, as
    /// [`Connection::close`] does for one, and refuses new ones: `accept` returns `None` from
    /// now on, and a client that connects meanwhile is closed with the same code as soon as
    /// its handshake completes. [`Endpoint::wait_idle`] resolves when every peer has the close
    /// (or its drain period ended). Graceful, unlike [`Endpoint::abort`].
    pub fn close(&self, code: u64, reason: &[u8]) {
        let mut inner = self.shared.lock();
        inner.closing = Some((code, reason.to_vec()));
        inner.close_all(runtime::now());
        for w in inner.accept_waiters.drain(..) {
            w.wake();
        }
        drop(inner);
        self.shared.wake.notify_one();
    }

    /// Waits until every connection of this endpoint has finished closing: each peer
    /// acknowledged the close, or the close's drain period (about one probe timeout) ended,
    /// or the connection timed out. Call it after [`Endpoint::close`] and before the process
    /// exits, so that peers learn of the close instead of waiting for their idle timeout.
    /// Resolves at once when there are no connections, or when the endpoint stopped.
    pub async fn wait_idle(&self) {
        poll_fn(|cx| {
            let mut inner = self.shared.lock();
            if inner.is_idle() {
                return Poll::Ready(());
            }
            crate::driver::wait_on(&mut inner.idle_waiters, cx.waker());
            Poll::Pending
        })
        .await;
    }

    /// Stops the endpoint at once, as a crash would: nothing more is sent or received, no
    /// close is announced, and every waiting task gets an error. Peers find out by idle
    /// timeout (or by stateless reset if a new endpoint with the same key takes the port).
    pub fn abort(&self) {
        self.shared.stop("endpoint aborted");
        self.shared.wake.notify_one();
    }

    /// Tells every connection that this host's address `old` became `new` (a new lease, a
    /// new roadside unit; call it once per address when several change at once). Paths
    /// that sent from `old` send from `new`; the peer follows and revalidates them, and the
    /// connections keep every byte. A wildcard-bound endpoint whose paths let the host pick
    /// the source address follows address changes without this call. Returns how many paths
    /// moved.
    pub fn local_ip_changed(&self, old: std::net::IpAddr, new: std::net::IpAddr) -> usize {
        let moved = self
            .shared
            .lock()
            .proto
            .local_ip_changed(runtime::now(), old, new);
        self.shared.wake.notify_one();
        moved
    }

    /// Connections alive on this endpoint.
    pub fn connection_count(&self) -> usize {
        self.shared.lock().proto.connection_count()
    }
}
