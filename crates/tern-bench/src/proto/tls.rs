//! Kernel TCP (CUBIC, as the `tcp` driver) with TLS 1.3 from rustls 0.23 (ring provider):
//! the reference deployment tern is measured against (issue 12: "bulk goodput ≥ kernel
//! TCP + TLS"). The server makes a self-signed ECDSA P-256 certificate with rcgen at start
//! (as the quinn driver does) and prints it in its ready line; the client trusts exactly that
//! certificate. Everything else is rustls' default configuration (`ServerConfig::builder()`,
//! `ClientConfig::builder()`): X25519 first, AES-256-GCM / AES-128-GCM / ChaCha20-Poly1305,
//! 16 KiB records, two session tickets sent by the server after the handshake.
//!
//! Two drivers use it:
//! - the blocking stream driver ([`super::stream`], `bulk`, `echo-sizes`, …) through
//!   [`TcpTls`]: one thread per connection, the same requests and flows as `tcp`;
//! - the `scale` scenario ([`crate::scale`]) through tokio-rustls ([`server_config`],
//!   [`client_config`]).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::stream::{Conn, Listener, Transport};
use super::tcp::Tcp;

/// The name in the certificate and the one the client checks.
pub const SERVER_NAME: &str = "tern-bench.invalid";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A self-signed certificate for [`SERVER_NAME`] and the server configuration that presents
/// it (TLS 1.3 only); the certificate as hex DER for the ready line.
pub fn server_config() -> io::Result<(Arc<rustls::ServerConfig>, String)> {
    let cert =
        rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()]).map_err(io::Error::other)?;
    let der = cert.cert.der().to_vec();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(der.clone())], key)
        .map_err(io::Error::other)?;
    Ok((Arc::new(cfg), super::quic::hex(&der)))
}

/// A client configuration (TLS 1.3) that trusts the certificate `cert_hex` only. With
/// `resume` false, session resumption is off: every handshake is a full one (`scale`).
pub fn client_config(cert_hex: &str, resume: bool) -> io::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(super::quic::unhex(cert_hex)?))
        .map_err(io::Error::other)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        cfg.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(cfg))
}

/// The server name the client asks for.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("valid DNS name")
}

/// TCP + TLS for the blocking stream driver. A server has a server configuration, a client
/// a client configuration.
pub struct TcpTls {
    tcp: Tcp,
    server: Option<Arc<rustls::ServerConfig>>,
    client: Option<Arc<rustls::ClientConfig>>,
}

impl TcpTls {
    fn tcp() -> Tcp {
        Tcp {
            cc: "cubic".into(),
            mptcp: false,
        }
    }

    /// A server side; returns it and the certificate to print.
    pub fn server() -> io::Result<(Self, String)> {
        let (cfg, cert) = server_config()?;
        Ok((
            Self {
                tcp: Self::tcp(),
                server: Some(cfg),
                client: None,
            },
            cert,
        ))
    }

    /// A client side trusting `cert_hex` (session resumption as rustls' default: on).
    pub fn client(cert_hex: &str) -> io::Result<Self> {
        Ok(Self {
            tcp: Self::tcp(),
            server: None,
            client: Some(client_config(cert_hex, true)?),
        })
    }
}

/// A TLS connection shared by one reading and one writing thread. rustls' state is behind a
/// mutex that neither holds while it blocks on the socket: a reader reads ciphertext from
/// the socket, then feeds it to rustls under the lock; a writer encrypts under the lock into
/// a buffer and writes that to the socket with the lock released (another mutex keeps the
/// writes in record order).
struct TlsConn {
    sock: TcpStream,
    /// Kept for `TCP_INFO` (the rate hint) and the send buffer.
    raw: socket2::Socket,
    tls: Mutex<rustls::Connection>,
    /// Held across a socket write, so that records reach the socket in the order rustls
    /// made them.
    wlock: Mutex<Vec<u8>>,
    /// The reader's ciphertext not yet given to rustls.
    rbuf: Mutex<(Vec<u8>, usize, usize)>,
}

impl TlsConn {
    fn new(s: socket2::Socket, mut tls: rustls::Connection) -> io::Result<Self> {
        let mut sock: TcpStream = s.try_clone()?.into();
        // The handshake, blocking, before the connection is shared.
        while tls.is_handshaking() {
            tls.complete_io(&mut sock)?;
        }
        Ok(Self {
            sock,
            raw: s,
            tls: Mutex::new(tls),
            wlock: Mutex::new(Vec::with_capacity(64 << 10)),
            rbuf: Mutex::new((vec![0u8; 64 << 10], 0, 0)),
        })
    }

    /// Writes what rustls has to send (while holding `wlock`).
    fn flush_tls(&self, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        {
            let mut tls = self.tls.lock().expect("tls");
            while tls.wants_write() {
                tls.write_tls(out)?;
            }
        }
        (&self.sock).write_all(out)
    }
}

impl Conn for TlsConn {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = self.rbuf.lock().expect("rbuf");
        loop {
            {
                let mut tls = self.tls.lock().expect("tls");
                match tls.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // Give rustls what was read and not taken yet.
                let (data, at, end) = &mut *rb;
                if *at < *end {
                    let n = tls.read_tls(&mut &data[*at..*end])?;
                    *at += n;
                    let state = tls
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    let wants_write = tls.wants_write();
                    drop(tls);
                    if wants_write {
                        // Post-handshake messages that need an answer (a key update).
                        let mut w = self.wlock.lock().expect("wlock");
                        self.flush_tls(&mut w)?;
                    }
                    if state.plaintext_bytes_to_read() == 0 && state.peer_has_closed() {
                        return Ok(0);
                    }
                    continue;
                }
            }
            // Nothing buffered: block on the socket (honours the read timeout).
            let (data, at, end) = &mut *rb;
            let n = (&self.sock).read(data)?;
            if n == 0 {
                return Ok(0);
            }
            *at = 0;
            *end = n;
        }
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let mut w = self.wlock.lock().expect("wlock");
        let n = {
            let mut tls = self.tls.lock().expect("tls");
            // At most 64 KiB per call: rustls encrypts it into 16 KiB records.
            let k = buf.len().min(64 << 10);
            tls.writer().write(&buf[..k])?
        };
        self.flush_tls(&mut w)?;
        Ok(n)
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(timeout)
    }

    fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    fn rate_hint(&self) -> Option<u64> {
        super::tcp::rate_hint(&self.raw)
    }

    fn limit_send_buffer(&self, bytes: u32) {
        let _ = self.raw.set_send_buffer_size(bytes as usize);
    }
}

struct TlsListener {
    addr: SocketAddr,
    l: socket2::Socket,
    tcp: Tcp,
    cfg: Arc<rustls::ServerConfig>,
}

impl Listener for TlsListener {
    fn accept(&self) -> io::Result<Box<dyn Conn>> {
        let (s, _) = self.l.accept()?;
        s.set_tcp_nodelay(true)?;
        let _ = s.set_tcp_congestion(self.tcp.cc.as_bytes());
        let tls = rustls::ServerConnection::new(self.cfg.clone()).map_err(io::Error::other)?;
        Ok(Box::new(TlsConn::new(s, tls.into())?))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

impl Transport for TcpTls {
    fn listen(&self, addr: SocketAddr) -> io::Result<Box<dyn Listener>> {
        let cfg = self
            .server
            .clone()
            .ok_or_else(|| io::Error::other("a TLS client cannot listen"))?;
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        s.set_tcp_nodelay(true)?;
        s.set_tcp_congestion(self.tcp.cc.as_bytes())?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        let addr = s
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        Ok(Box::new(TlsListener {
            addr,
            l: s,
            tcp: self.tcp.clone(),
            cfg,
        }))
    }

    fn connect(&self, addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<Box<dyn Conn>> {
        let cfg = self
            .client
            .clone()
            .ok_or_else(|| io::Error::other("a TLS server cannot connect"))?;
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        s.set_tcp_nodelay(true)?;
        s.set_tcp_congestion(self.tcp.cc.as_bytes())?;
        if let Some(ip) = bind {
            s.bind(&SocketAddr::new(ip, 0).into())?;
        }
        s.connect_timeout(&addr.into(), Duration::from_secs(10))?;
        let tls = rustls::ClientConnection::new(cfg, server_name()).map_err(io::Error::other)?;
        Ok(Box::new(TlsConn::new(s, tls.into())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::stream::{recv_exact, send_all};

    #[test]
    fn a_tls_connection_carries_both_ways_at_once() {
        let (srv, cert) = TcpTls::server().unwrap();
        let l = srv.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let c = l.accept().unwrap();
            // Echo 4 MB back while the client is still sending.
            let mut buf = vec![0u8; 100_000];
            let mut left = 4_000_000usize;
            while left > 0 {
                let n = c.recv(&mut buf[..left.min(100_000)]).unwrap();
                assert!(n > 0);
                send_all(c.as_ref(), &buf[..n]).unwrap();
                left -= n;
            }
        });
        let cli = TcpTls::client(&cert).unwrap();
        let c: Arc<dyn Conn> = Arc::from(cli.connect(addr, None).unwrap());
        let w = {
            let c = c.clone();
            std::thread::spawn(move || {
                let data = crate::spec::payload(4_000_000);
                send_all(c.as_ref(), &data).unwrap();
            })
        };
        let mut got = vec![0u8; 4_000_000];
        recv_exact(c.as_ref(), &mut got).unwrap();
        assert_eq!(got, crate::spec::payload(4_000_000));
        w.join().unwrap();
        h.join().unwrap();
        assert!(c.rate_hint().is_some());
    }
}
