//! Kernel TCP and MPTCP through socket2: the congestion controller is named on every socket
//! (`TCP_CONGESTION`; this kernel defaults to bbr, Debian to cubic), Nagle is off, the
//! initial window is the kernel's (IW10). MPTCP sockets are `socket(AF_INET, SOCK_STREAM,
//! IPPROTO_MPTCP)`; extra subflows come from the in-kernel path manager, configured by the
//! collector with `ip mptcp` inside the namespaces.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::stream::{Conn, Listener, Transport};

/// `IPPROTO_MPTCP`.
pub const IPPROTO_MPTCP: i32 = 262;

/// Kernel TCP or MPTCP with a named congestion controller.
#[derive(Clone, Debug)]
pub struct Tcp {
    /// `cubic`, `bbr`, `reno`.
    pub cc: String,
    /// MPTCP instead of TCP.
    pub mptcp: bool,
}

impl Tcp {
    fn socket(&self, addr: &SocketAddr) -> io::Result<Socket> {
        let proto = if self.mptcp {
            Protocol::from(IPPROTO_MPTCP)
        } else {
            Protocol::TCP
        };
        let s = Socket::new(Domain::for_address(*addr), Type::STREAM, Some(proto))?;
        self.tune(&s)?;
        Ok(s)
    }

    fn tune(&self, s: &Socket) -> io::Result<()> {
        s.set_tcp_nodelay(true)?;
        match s.set_tcp_congestion(self.cc.as_bytes()) {
            Ok(()) => {}
            // MPTCP sockets accept TCP_CONGESTION on recent kernels only; if refused, the
            // subflows use the namespace default, which the collector sets to the same name.
            Err(_) if self.mptcp => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

struct TcpConn(Socket);

impl Conn for TcpConn {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.0).read(buf)
    }
    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        (&self.0).write(buf)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.0.set_read_timeout(timeout)
    }
    fn shutdown(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

struct TcpListener(Socket, Tcp);

impl Listener for TcpListener {
    fn accept(&self) -> io::Result<Box<dyn Conn>> {
        let (s, _) = self.0.accept()?;
        let _ = self.1.tune(&s);
        Ok(Box::new(TcpConn(s)))
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))
    }
}

impl Transport for Tcp {
    fn listen(&self, addr: SocketAddr) -> io::Result<Box<dyn Listener>> {
        let s = self.socket(&addr)?;
        s.set_reuse_address(true)?;
        s.bind(&SockAddr::from(addr))?;
        s.listen(1024)?;
        Ok(Box::new(TcpListener(s, self.clone())))
    }

    fn connect(&self, addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<Box<dyn Conn>> {
        let s = self.socket(&addr)?;
        if let Some(ip) = bind {
            s.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
        }
        s.connect_timeout(&SockAddr::from(addr), Duration::from_secs(10))?;
        Ok(Box::new(TcpConn(s)))
    }
}

/// What the results record about the controller.
pub fn congestion_of(cc: &str, mptcp: bool) -> String {
    if mptcp {
        // This kernel accepts TCP_CONGESTION on MPTCP sockets; it applies to every subflow.
        format!("{cc} (MPTCP socket, every subflow)")
    } else {
        cc.to_string()
    }
}
