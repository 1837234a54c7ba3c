//! The socket an endpoint sends and receives through: the [`AsyncUdpSocket`] trait, and
//! [`UdpSocket`], the built-in one over a kernel UDP socket (GSO, GRO and batched receives
//! through quinn-udp).
//!
//! Bring your own socket (quinn's `AsyncUdpSocket` idea) to put something between tern and
//! the kernel: a socket that counts or shapes traffic, a relay, an in-process transport, a
//! socket from a sandbox's broker. Wrap the built-in one to keep its batching:
//!
//! ```
//! use std::io::{self, IoSliceMut};
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::task::{Context, Poll};
//! use tern::socket::{AsyncUdpSocket, RecvMeta, Transmit, UdpSocket};
//!
//! /// Counts the bytes tern sends.
//! #[derive(Debug)]
//! struct Metered {
//!     inner: UdpSocket,
//!     bytes_sent: AtomicU64,
//! }
//!
//! impl AsyncUdpSocket for Metered {
//!     fn poll_send(&self, cx: &mut Context<'_>, t: &Transmit<'_>) -> Poll<io::Result<()>> {
//!         let sent = self.inner.poll_send(cx, t);
//!         if let Poll::Ready(Ok(())) = sent {
//!             self.bytes_sent.fetch_add(t.contents.len() as u64, Ordering::Relaxed);
//!         }
//!         sent
//!     }
//!     fn poll_recv(
//!         &self,
//!         cx: &mut Context<'_>,
//!         bufs: &mut [IoSliceMut<'_>],
//!         meta: &mut [RecvMeta],
//!     ) -> Poll<io::Result<usize>> {
//!         self.inner.poll_recv(cx, bufs, meta)
//!     }
//!     fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
//!         self.inner.local_addr()
//!     }
//!     fn max_transmit_segments(&self) -> usize {
//!         self.inner.max_transmit_segments()
//!     }
//!     fn max_receive_segments(&self) -> usize {
//!         self.inner.max_receive_segments()
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> io::Result<()> {
//! let socket = Metered {
//!     inner: UdpSocket::bind("127.0.0.1:0".parse().unwrap())?,
//!     bytes_sent: AtomicU64::new(0),
//! };
//! let keypair = tern::StaticKeypair::generate(tern::entropy());
//! let endpoint = tern::Endpoint::builder(keypair).async_socket(socket).build()?;
//! # Ok(()) }
//! ```

#![allow(clippy::disallowed_methods)] // Binding sockets belongs to the runtime.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{ready, Context, Poll};

use quinn_udp::{EcnCodepoint as UdpEcn, UdpSockRef, UdpSocketState};
use tern_proto::EcnCodepoint;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Datagrams one receive call may return (the size of the `meta` slice the endpoint passes).
pub const RECV_BATCH: usize = 32;

/// Largest UDP payload of one GSO batch tern hands to [`AsyncUdpSocket::poll_send`] (the
/// kernel's limit, 65 507 bytes, rounded down to leave room for headers).
pub const MAX_TRANSMIT_BYTES: usize = 65_000;

/// One datagram, or a batch of equal-sized datagrams for one destination (GSO), to send.
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Where to send.
    pub destination: SocketAddr,
    /// The local address to send from (`None`: the kernel's choice). Set for the paths of a
    /// multipath connection opened from a given interface; a socket bound to a wildcard
    /// address sets it per datagram (`IP_PKTINFO`).
    pub src_ip: Option<IpAddr>,
    /// The ECN codepoint for the IP header (`None`: Not-ECT).
    pub ecn: Option<EcnCodepoint>,
    /// The datagrams' bytes, back to back.
    pub contents: &'a [u8],
    /// With several datagrams: the size of each but the last (which may be shorter). `None`:
    /// `contents` is one datagram. Never set when the socket's
    /// [`max_transmit_segments`](AsyncUdpSocket::max_transmit_segments) is 1.
    pub segment_size: Option<usize>,
}

impl Transmit<'_> {
    /// The datagrams of this transmit one by one (for sockets without GSO that receive a
    /// batch anyway, or that inspect each datagram).
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        let size = self.segment_size.unwrap_or(self.contents.len()).max(1);
        self.contents.chunks(size)
    }
}

/// Where a received buffer came from, and how it splits into datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sender.
    pub addr: SocketAddr,
    /// Bytes written into the buffer.
    pub len: usize,
    /// The size of each datagram in the buffer (GRO coalesces equal-sized datagrams from one
    /// sender); `len` for a single datagram.
    pub stride: usize,
    /// The ECN codepoint of the IP header, if the socket can read it.
    pub ecn: Option<EcnCodepoint>,
    /// The local address the datagram was sent to, if known.
    pub dst_ip: Option<IpAddr>,
}

impl Default for RecvMeta {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            len: 0,
            stride: 0,
            ecn: None,
            dst_ip: None,
        }
    }
}

/// A datagram socket an [`Endpoint`](crate::Endpoint) can drive. The endpoint's task
/// receives; sends come from that task or from an application task that just gave a
/// connection something to send, one sender at a time, possibly while a receive is under
/// way on another thread. The methods take `&self` so that a socket can be shared.
///
/// The `poll_*` methods follow the usual contract: `Poll::Pending` registers `cx`'s waker to
/// be woken when the call may succeed. Errors from `poll_send` are counted and the datagrams
/// left to loss recovery; errors from `poll_recv` are skipped (ICMP errors surface there),
/// except that one returned while the endpoint waits for data stops the endpoint.
pub trait AsyncUdpSocket: Send + Sync + fmt::Debug + 'static {
    /// Sends `transmit`, or registers the waker and returns `Pending` while the socket cannot
    /// take it.
    fn poll_send(&self, cx: &mut Context<'_>, transmit: &Transmit<'_>) -> Poll<io::Result<()>>;

    /// Receives up to `bufs.len()` buffers (`meta[i]` describes `bufs[i]`) and returns how
    /// many were filled, or registers the waker and returns `Pending` when none is waiting.
    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>>;

    /// The address this socket is bound to.
    fn local_addr(&self) -> io::Result<SocketAddr>;

    /// How many datagrams one [`Transmit`] may carry (1: no batching).
    fn max_transmit_segments(&self) -> usize {
        1
    }

    /// How many datagrams one received buffer may hold (1: no coalescing); tern sizes its
    /// buffers at 64 KiB either way.
    fn max_receive_segments(&self) -> usize {
        1
    }
}

fn to_udp_ecn(ecn: EcnCodepoint) -> UdpEcn {
    match ecn {
        EcnCodepoint::Ect0 => UdpEcn::Ect0,
        EcnCodepoint::Ect1 => UdpEcn::Ect1,
        EcnCodepoint::Ce => UdpEcn::Ce,
    }
}

fn from_udp_ecn(ecn: UdpEcn) -> EcnCodepoint {
    match ecn {
        UdpEcn::Ect0 => EcnCodepoint::Ect0,
        UdpEcn::Ect1 => EcnCodepoint::Ect1,
        UdpEcn::Ce => EcnCodepoint::Ce,
    }
}

/// How the built-in socket is set up (see [`crate::EndpointBuilder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketOptions {
    /// `SO_RCVBUF` to ask for, bytes (the kernel caps it at `net.core.rmem_max`).
    pub(crate) recv_buffer: usize,
    /// `SO_SNDBUF` to ask for, bytes (capped at `net.core.wmem_max`).
    pub(crate) send_buffer: usize,
    /// Use GSO batches where the kernel offers them.
    pub(crate) gso: bool,
    /// `SO_REUSEPORT`: several sockets (the workers of one server) share the port.
    pub(crate) reuse_port: bool,
}

impl Default for SocketOptions {
    /// Buffers sized for bursts at tens of Gbit/s (8 MiB each way), GSO on.
    fn default() -> Self {
        Self {
            recv_buffer: 8 << 20,
            send_buffer: 8 << 20,
            gso: true,
            reuse_port: false,
        }
    }
}

/// The built-in socket: a kernel UDP socket driven through quinn-udp, with GSO, GRO and
/// batched receives where the kernel has them and plain `sendmsg`/`recvmsg` where it does
/// not; ECN codepoints are set and read. Must be created inside a tokio runtime.
///
/// The socket is registered with the runtime for reading only. A UDP socket is writable
/// nearly always, and Linux signals `EPOLLOUT` each time a sent datagram's buffer is freed
/// (at once on loopback, at transmit completion on a NIC): registered for writing too, the
/// runtime's thread would wake once per datagram sent for nothing. Sends are tried directly;
/// only when the kernel refuses one for a full buffer is a duplicate of the descriptor
/// registered for writing, until a send goes through again.
pub struct UdpSocket {
    io: AsyncFd<std::net::UdpSocket>,
    /// The write registration, present only while the send buffer is full.
    writable: Mutex<Option<AsyncFd<std::net::UdpSocket>>>,
    /// The runtime the socket was made in: the write registration goes to its reactor too,
    /// whichever thread sends.
    runtime: tokio::runtime::Handle,
    /// Sends the kernel refused for a full buffer (each then waited for room).
    send_buffer_waits: AtomicU64,
    state: UdpSocketState,
    gso: bool,
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("local", &self.io.get_ref().local_addr().ok())
            .field("gso_segments", &self.max_transmit_segments())
            .field("gro_segments", &self.max_receive_segments())
            .finish()
    }
}

impl UdpSocket {
    /// Binds `addr` with tern's default options (8 MiB buffers, GSO on).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::bind_with(addr, SocketOptions::default())
    }

    /// Takes over a socket the application bound itself, with tern's default options.
    pub fn from_std(socket: std::net::UdpSocket) -> io::Result<Self> {
        Self::from_std_with(socket, SocketOptions::default())
    }

    pub(crate) fn bind_with(addr: SocketAddr, options: SocketOptions) -> io::Result<Self> {
        let domain = socket2::Domain::for_address(addr);
        let sock =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        if addr.is_ipv6() {
            // Accept IPv4-mapped peers on a wildcard IPv6 socket where allowed.
            let _ = sock.set_only_v6(false);
        }
        if options.reuse_port {
            sock.set_reuse_port(true)?;
        }
        sock.bind(&addr.into())?;
        Self::from_std_with(sock.into(), options)
    }

    /// Takes over a bound socket (any options the application set before stay; tern sets its
    /// buffers, non-blocking mode and the ECN and GRO options).
    pub(crate) fn from_std_with(
        std_sock: std::net::UdpSocket,
        options: SocketOptions,
    ) -> io::Result<Self> {
        let state = UdpSocketState::new(UdpSockRef::from(&std_sock))?;
        // quinn-udp 0.6 asks for receive timestamps, which tern does not use, and reads the
        // control messages into 96 bytes: with GRO, timestamp + GRO + PKTINFO + TOS need 112,
        // so the kernel cuts the TOS message and every coalesced datagram reads as Not-ECT
        // (seen on Linux 6.x over loopback). Without timestamps the ECN bits fit.
        if let Err(e) = nix::sys::socket::setsockopt(
            &std_sock,
            nix::sys::socket::sockopt::ReceiveTimestampns,
            &false,
        ) {
            tracing::debug!("cannot turn off receive timestamps: {e}");
        }
        // The kernel caps the buffers at its limits; a smaller grant is not an error.
        let _ = state.set_send_buffer_size(UdpSockRef::from(&std_sock), options.send_buffer);
        let _ = state.set_recv_buffer_size(UdpSockRef::from(&std_sock), options.recv_buffer);
        std_sock.set_nonblocking(true)?;
        let io = register(std_sock, Interest::READABLE)?;
        Ok(Self {
            io,
            writable: Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
            send_buffer_waits: AtomicU64::new(0),
            state,
            gso: options.gso,
        })
    }

    /// The receive buffer the kernel granted, bytes.
    pub fn recv_buffer(&self) -> usize {
        self.state
            .recv_buffer_size(UdpSockRef::from(self.io.get_ref()))
            .unwrap_or(0)
    }

    /// The send buffer the kernel granted, bytes.
    pub fn send_buffer(&self) -> usize {
        self.state
            .send_buffer_size(UdpSockRef::from(self.io.get_ref()))
            .unwrap_or(0)
    }

    /// How many times the kernel refused a send because the send buffer was full, and the
    /// socket waited for room (a queue below the socket, such as a slow qdisc, holds the
    /// datagrams; on loopback the buffer never fills).
    pub fn send_buffer_waits(&self) -> u64 {
        self.send_buffer_waits.load(Ordering::Relaxed)
    }
}

/// Whether quinn-udp receives with `recvmmsg` here, so that a short batch means the queue is
/// empty. Elsewhere it reads one datagram per call, and only a failed call says so.
const RECV_FILLS_BATCH: bool = cfg!(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
));

/// Registers `socket` with the current runtime's reactor for `interest`.
#[allow(unsafe_code)]
fn register(
    socket: std::net::UdpSocket,
    interest: Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: the `AsyncFd` owns `socket`, which owns its descriptor: it stays open and
    // `as_raw_fd` returns it unchanged until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(io::Error::from)
}

impl AsyncUdpSocket for UdpSocket {
    fn poll_send(&self, cx: &mut Context<'_>, transmit: &Transmit<'_>) -> Poll<io::Result<()>> {
        let transmit = quinn_udp::Transmit {
            destination: transmit.destination,
            ecn: transmit.ecn.map(to_udp_ecn),
            contents: transmit.contents,
            segment_size: transmit.segment_size,
            src_ip: transmit.src_ip,
        };
        let socket = self.io.get_ref();
        let mut writable = self.writable.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(w) = writable.as_ref() {
                let mut guard = ready!(w.poll_write_ready(cx))?;
                match guard.try_io(|_| self.state.try_send(UdpSockRef::from(socket), &transmit)) {
                    Ok(result) => {
                        // Room again: stop listening for it.
                        *writable = None;
                        return Poll::Ready(result);
                    }
                    Err(_would_block) => continue,
                }
            }
            match self.state.try_send(UdpSockRef::from(socket), &transmit) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.send_buffer_waits.fetch_add(1, Ordering::Relaxed);
                    // Registering reports the socket writable at once if room appeared
                    // since the refusal, so no wake-up is lost between the two.
                    let _runtime = self.runtime.enter();
                    *writable = Some(register(socket.try_clone()?, Interest::WRITABLE)?);
                }
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut udp_meta = [quinn_udp::RecvMeta::default(); RECV_BATCH];
        let count = bufs.len().min(meta.len()).min(RECV_BATCH);
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            let received = guard.try_io(|socket| {
                self.state.recv(
                    UdpSockRef::from(socket.get_ref()),
                    &mut bufs[..count],
                    &mut udp_meta[..count],
                )
            });
            match received {
                Err(_would_block) => continue,
                Ok(Ok(n)) => {
                    if RECV_FILLS_BATCH && n < count {
                        // The queue ran dry during the call (`recvmmsg` without
                        // `MSG_WAITFORONE` fills what it can): forget the readiness now rather
                        // than learn it from one more call that fails. Every datagram that
                        // arrives later signals again.
                        guard.clear_ready();
                    }
                    for (out, m) in meta.iter_mut().zip(&udp_meta[..n]) {
                        *out = RecvMeta {
                            addr: m.addr,
                            len: m.len,
                            stride: m.stride,
                            ecn: m.ecn.map(from_udp_ecn),
                            dst_ip: m.dst_ip,
                        };
                    }
                    return Poll::Ready(Ok(n));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        if self.gso {
            self.state.max_gso_segments()
        } else {
            1
        }
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmit_splits_into_its_datagrams() {
        let data = [1u8; 25];
        let t = Transmit {
            destination: SocketAddr::from(([127, 0, 0, 1], 1)),
            src_ip: None,
            ecn: None,
            contents: &data,
            segment_size: Some(10),
        };
        let sizes: Vec<usize> = t.datagrams().map(<[u8]>::len).collect();
        assert_eq!(sizes, [10, 10, 5]);
        let single = Transmit {
            segment_size: None,
            ..t
        };
        assert_eq!(single.datagrams().count(), 1);
    }

    #[tokio::test]
    async fn built_in_socket_round_trips_a_gso_batch_with_ecn() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let segments = a.max_transmit_segments().min(3);
        let data: Vec<u8> = (0..segments * 100).map(|i| i as u8).collect();
        let t = Transmit {
            destination: b.local_addr().unwrap(),
            src_ip: None,
            ecn: Some(EcnCodepoint::Ect0),
            contents: &data,
            segment_size: (segments > 1).then_some(100),
        };
        std::future::poll_fn(|cx| a.poll_send(cx, &t))
            .await
            .unwrap();
        let mut received = Vec::new();
        let mut storage = vec![0u8; RECV_BATCH * 65_536];
        while received.len() < data.len() {
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.chunks_mut(65_536).map(IoSliceMut::new).collect();
            let mut meta = [RecvMeta::default(); RECV_BATCH];
            let n = std::future::poll_fn(|cx| b.poll_recv(cx, &mut bufs, &mut meta))
                .await
                .unwrap();
            for (m, buf) in meta.iter().zip(&bufs).take(n) {
                assert_eq!(m.addr, a.local_addr().unwrap());
                assert_eq!(m.stride, 100);
                assert_eq!(m.ecn, Some(EcnCodepoint::Ect0));
                received.extend_from_slice(&buf[..m.len]);
            }
        }
        assert_eq!(received, data);
    }
}
