//! The seam between the protocol and the operating system: the clock and the UDP socket. This
//! is the one module of tern that reads the clock (the core takes `now` as an argument).

#![allow(clippy::disallowed_methods)] // The real clock belongs here and only here.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::time::Instant;

use quinn_udp::{EcnCodepoint as UdpEcn, RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use tern_proto::EcnCodepoint;
use tokio::io::Interest;

/// The current time.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// Largest UDP payload a GSO batch may hold (the kernel's limit, 65 507 bytes, rounded
/// down to leave room for headers).
pub(crate) const MAX_GSO_BYTES: usize = 65_000;

/// Datagrams received in one system call (with GRO, each may hold several).
pub(crate) const RECV_BATCH: usize = 32;

/// The ECN codepoint quinn-udp read from a datagram's IP header, in the core's terms.
pub(crate) fn ecn_of(meta: &RecvMeta) -> Option<EcnCodepoint> {
    meta.ecn.map(|e| match e {
        UdpEcn::Ect0 => EcnCodepoint::Ect0,
        UdpEcn::Ect1 => EcnCodepoint::Ect1,
        UdpEcn::Ce => EcnCodepoint::Ce,
    })
}

fn udp_ecn(ecn: EcnCodepoint) -> UdpEcn {
    match ecn {
        EcnCodepoint::Ect0 => UdpEcn::Ect0,
        EcnCodepoint::Ect1 => UdpEcn::Ect1,
        EcnCodepoint::Ce => UdpEcn::Ce,
    }
}

/// How the endpoint's socket is set up (see [`crate::EndpointBuilder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketOptions {
    /// `SO_RCVBUF` to ask for, bytes (the kernel caps it at `net.core.rmem_max`).
    pub(crate) recv_buffer: usize,
    /// `SO_SNDBUF` to ask for, bytes (capped at `net.core.wmem_max`).
    pub(crate) send_buffer: usize,
    /// Use GSO batches where the kernel offers them.
    pub(crate) gso: bool,
}

impl Default for SocketOptions {
    /// Buffers sized for bursts at tens of Gbit/s (8 MiB each way), GSO on.
    fn default() -> Self {
        Self {
            recv_buffer: 8 << 20,
            send_buffer: 8 << 20,
            gso: true,
        }
    }
}

/// A UDP socket driven through quinn-udp: GSO, GRO and batched receives where the kernel has
/// them, plain sendmsg/recvmsg where it does not.
pub(crate) struct Socket {
    io: tokio::net::UdpSocket,
    state: UdpSocketState,
    gso: bool,
}

impl Socket {
    /// Binds `addr` (non-blocking).
    pub(crate) fn bind(addr: SocketAddr, options: SocketOptions) -> io::Result<Self> {
        let domain = socket2::Domain::for_address(addr);
        let sock =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        if addr.is_ipv6() {
            // Accept IPv4-mapped peers on a wildcard IPv6 socket where allowed.
            let _ = sock.set_only_v6(false);
        }
        sock.bind(&addr.into())?;
        Self::from_std(sock.into(), options)
    }

    /// Takes over a socket the application bound itself (any address, any options it set
    /// before; tern sets its buffers, non-blocking mode and the ECN and GRO options).
    pub(crate) fn from_std(
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
        let io = tokio::net::UdpSocket::from_std(std_sock)?;
        Ok(Self {
            io,
            state,
            gso: options.gso,
        })
    }

    /// The receive buffer the kernel granted, bytes.
    pub(crate) fn recv_buffer(&self) -> usize {
        self.state
            .recv_buffer_size(UdpSockRef::from(&self.io))
            .unwrap_or(0)
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    /// How many segments one GSO send may carry (1 when GSO is unavailable or turned off).
    pub(crate) fn max_gso_segments(&self) -> usize {
        if self.gso {
            self.state.max_gso_segments()
        } else {
            1
        }
    }

    /// How many segments one receive may coalesce (1 without GRO).
    pub(crate) fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// Sends one datagram or a GSO batch of equal-sized segments (the last may be shorter),
    /// all with the same ECN codepoint, waiting for the socket to be writable.
    pub(crate) async fn send(
        &self,
        destination: SocketAddr,
        ecn: Option<EcnCodepoint>,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let transmit = Transmit {
            destination,
            ecn: ecn.map(udp_ecn),
            contents,
            segment_size,
            src_ip: None,
        };
        loop {
            self.io.writable().await?;
            match self.io.try_io(Interest::WRITABLE, || {
                self.state.try_send(UdpSockRef::from(&self.io), &transmit)
            }) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until datagrams can be read.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.io.readable().await
    }

    /// Receives a batch without waiting; `Ok(0)` when nothing is ready.
    pub(crate) fn try_recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        match self.io.try_io(Interest::READABLE, || {
            self.state.recv(UdpSockRef::from(&self.io), bufs, meta)
        }) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }
}
