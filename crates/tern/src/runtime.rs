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

/// A UDP socket driven through quinn-udp: GSO, GRO and batched receives where the kernel has
/// them, plain sendmsg/recvmsg where it does not.
pub(crate) struct Socket {
    io: tokio::net::UdpSocket,
    state: UdpSocketState,
}

impl Socket {
    /// Binds `addr` (large buffers, non-blocking).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Self> {
        let domain = socket2::Domain::for_address(addr);
        let sock =
            socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        if addr.is_ipv6() {
            // Accept IPv4-mapped peers on a wildcard IPv6 socket where allowed.
            let _ = sock.set_only_v6(false);
        }
        sock.bind(&addr.into())?;
        let std_sock: std::net::UdpSocket = sock.into();
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
        // Buffers sized for bursts at tens of Gbit/s; the kernel caps them at its limits.
        let _ = state.set_send_buffer_size(UdpSockRef::from(&std_sock), 8 << 20);
        let _ = state.set_recv_buffer_size(UdpSockRef::from(&std_sock), 8 << 20);
        std_sock.set_nonblocking(true)?;
        let io = tokio::net::UdpSocket::from_std(std_sock)?;
        Ok(Self { io, state })
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    /// How many segments one GSO send may carry (1 when GSO is unavailable).
    pub(crate) fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
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
