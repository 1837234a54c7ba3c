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

/// The kernel's `struct tcp_info` (include/uapi/linux/tcp.h) up to `tcpi_delivery_rate`:
/// glibc's copy (and so the libc crate's) stops before the rate fields.
#[repr(C)]
#[derive(Default)]
struct KernelTcpInfo {
    /// `tcpi_state` … the wscale and app-limited bit fields.
    head: [u8; 8],
    /// `tcpi_rto` … `tcpi_total_retrans`; `tcpi_rtt` is [15] (µs).
    words: [u32; 24],
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    /// µs.
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
}

/// `TCP_INFO` of a socket (`None` if the kernel refuses or returns less than the rate
/// fields: kernels before 4.9).
#[allow(unsafe_code)] // getsockopt into a plain-data struct of the kernel's layout.
fn tcp_info(s: &Socket) -> Option<KernelTcpInfo> {
    use std::os::fd::AsRawFd;
    let mut info = KernelTcpInfo::default();
    let mut len = std::mem::size_of::<KernelTcpInfo>() as libc::socklen_t;
    // SAFETY: `info` is a live, writable repr(C) struct of `len` bytes of integers (any bit
    // pattern is valid); the kernel writes at most `len` bytes and sets `len` to what it wrote.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut KernelTcpInfo).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize >= std::mem::size_of::<KernelTcpInfo>()).then_some(info)
}

/// The rate a video encoder on this socket should produce, bytes per second: the kernel's
/// pacing rate (the controller's own estimate: CUBIC's is 1.2 × cwnd / srtt in congestion
/// avoidance, 2 × in slow start; BBR's its bottleneck bandwidth × gain) scaled by min RTT /
/// RTT, as tern's target rate is, so that an encoder whose data queues is asked for less.
/// `None` before the kernel has a rate.
pub fn rate_hint(s: &Socket) -> Option<u64> {
    let i = tcp_info(s)?;
    if i.pacing_rate == 0 || i.pacing_rate == u64::MAX {
        return None;
    }
    let (rtt, min_rtt) = (i.words[15], i.min_rtt);
    let scale = if rtt > 0 && min_rtt > 0 && min_rtt != u32::MAX {
        (f64::from(min_rtt) / f64::from(rtt)).min(1.0)
    } else {
        1.0
    };
    Some((i.pacing_rate as f64 * scale) as u64)
}

impl Conn for TcpConn {
    fn rate_hint(&self) -> Option<u64> {
        rate_hint(&self.0)
    }
    fn limit_send_buffer(&self, bytes: u32) {
        let _ = self.0.set_send_buffer_size(bytes as usize);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_info_has_the_kernels_layout_and_a_connected_socket_a_rate() {
        // The rate fields sit where the kernel puts them.
        assert_eq!(std::mem::size_of::<KernelTcpInfo>(), 168);
        let t = Tcp {
            cc: "cubic".into(),
            mptcp: false,
        };
        let l = t.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let s = t.socket(&addr).unwrap();
        s.connect(&SockAddr::from(addr)).unwrap();
        let _peer = l.accept().unwrap();
        let hint = rate_hint(&s).expect("a connected socket has a pacing rate");
        assert!(hint > 0);
    }
}
