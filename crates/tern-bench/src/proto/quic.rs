//! QUIC with quinn 0.11 (rustls with ring). The server makes a self-signed certificate with
//! rcgen and prints it (hex DER) in its ready line; the client trusts exactly that
//! certificate. Windows match tern's defaults (4 MiB per stream, 16 MiB per connection) so
//! neither protocol is held back by flow control; quinn's congestion controller is its
//! default (CUBIC).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};

use super::mux::{serve_stream, ChunkWrite, Mux};
use super::video::RateHint;

const SERVER_NAME: &str = "tern-bench.invalid";

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(100_000u32.into())
        .stream_receive_window((4u32 << 20).into())
        .receive_window((16u32 << 20).into())
        .send_window(16 << 20)
        .max_idle_timeout(Some(
            Duration::from_secs(30).try_into().expect("valid timeout"),
        ));
    Arc::new(t)
}

fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The socket buffers quinn's endpoints get here: the 8 MiB tern's endpoint asks for, so that
/// neither protocol is measured against the kernel's default (about 208 KiB), which dropped
/// quinn's datagrams at the receiving socket in `bulk` and its Initials in `scale` (found by
/// an outside read).
pub(crate) const UDP_BUFFER: usize = 8 << 20;

/// A quinn endpoint bound to `addr` (a server with `server`), on a socket with
/// [`UDP_BUFFER`]-byte buffers.
pub(crate) fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> io::Result<quinn::Endpoint> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(false);
    }
    // The kernel caps them at its limits; a smaller grant is not an error (as for tern).
    let _ = socket.set_recv_buffer_size(UDP_BUFFER);
    let _ = socket.set_send_buffer_size(UDP_BUFFER);
    socket.bind(&addr.into())?;
    let runtime =
        quinn::default_runtime().ok_or_else(|| io::Error::other("quinn needs a tokio runtime"))?;
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        socket.into(),
        runtime,
    )
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> io::Result<Vec<u8>> {
    if s.len() % 2 != 0 {
        return Err(io::Error::other("odd hex length"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(io::Error::other))
        .collect()
}

/// Starts a server; returns the bound address and the certificate to print.
pub fn server(addr: SocketAddr) -> io::Result<(quinn::Endpoint, String)> {
    install_provider();
    let cert =
        rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()]).map_err(io::Error::other)?;
    let der = cert.cert.der().to_vec();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let mut cfg =
        quinn::ServerConfig::with_single_cert(vec![CertificateDer::from(der.clone())], key)
            .map_err(io::Error::other)?;
    cfg.transport_config(transport());
    let ep = endpoint(addr, Some(cfg))?;
    Ok((ep, hex(&der)))
}

/// quinn's rate for a video encoder (`fairness`' video flows), bytes per second: its window
/// over the smoothed RTT (quinn's statistics have no minimum RTT, so the min RTT / RTT
/// scaling tern's and TCP's hints get is left out).
fn quic_rate_hint(c: &quinn::Connection) -> Option<u64> {
    let p = c.stats().path;
    let rtt = p.rtt.as_secs_f64();
    (p.cwnd > 0 && rtt > 0.0).then(|| (p.cwnd as f64 / rtt) as u64)
}

/// Serves until the process is killed.
impl ChunkWrite for quinn::SendStream {
    async fn write_owned(&mut self, data: bytes::Bytes) -> io::Result<()> {
        self.write_chunk(data).await.map_err(io::Error::other)
    }
}

pub async fn serve(ep: quinn::Endpoint) {
    while let Some(incoming) = ep.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((w, r)) = conn.accept_bi().await {
                let c = conn.clone();
                tokio::spawn(async move {
                    let h = c.clone();
                    let _ = serve_stream(
                        w,
                        r,
                        move || QuicClient::stats(&c),
                        move || quic_rate_hint(&h).map(RateHint::estimated),
                    )
                    .await;
                });
            }
        });
    }
}

/// The client side.
pub struct QuicClient {
    ep: quinn::Endpoint,
    addr: SocketAddr,
}

impl QuicClient {
    /// A client endpoint that trusts `cert_hex`.
    pub fn new(addr: SocketAddr, bind: Option<IpAddr>, cert_hex: &str) -> io::Result<Self> {
        install_provider();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(unhex(cert_hex)?))
            .map_err(io::Error::other)?;
        let crypto = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut cfg = quinn::ClientConfig::new(Arc::new(
            QuicClientConfig::try_from(crypto).map_err(io::Error::other)?,
        ));
        cfg.transport_config(transport());
        let local = SocketAddr::new(bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0);
        let mut ep = endpoint(local, None)?;
        ep.set_default_client_config(cfg);
        Ok(Self { ep, addr })
    }

    /// The client endpoint's UDP port.
    pub fn local_port(&self) -> Option<u16> {
        self.ep.local_addr().ok().map(|a| a.port())
    }
}

impl Mux for QuicClient {
    type Conn = quinn::Connection;
    type W = quinn::SendStream;
    type R = quinn::RecvStream;

    async fn connect(&self) -> io::Result<quinn::Connection> {
        self.ep
            .connect(self.addr, SERVER_NAME)
            .map_err(io::Error::other)?
            .await
            .map_err(io::Error::other)
    }

    async fn open_bi(conn: &quinn::Connection) -> io::Result<(Self::W, Self::R)> {
        conn.open_bi().await.map_err(io::Error::other)
    }

    fn close(conn: &quinn::Connection) {
        conn.close(0u32.into(), b"done");
    }

    /// Client migration: a new socket on the wildcard address, so that the kernel picks
    /// the new source address (quinn then probes the path from it).
    fn rebind(&self, _changes: &[(IpAddr, IpAddr)]) -> io::Result<bool> {
        let socket =
            std::net::UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
        self.ep.rebind(socket)?;
        Ok(true)
    }

    fn stats(conn: &quinn::Connection) -> Value {
        let s = conn.stats();
        json!({
            "rtt_ms": conn.rtt().as_secs_f64() * 1e3,
            "packets_lost": s.path.lost_packets,
            "bytes_lost": s.path.lost_bytes,
            "sent_packets": s.path.sent_packets,
            "datagrams_sent": s.udp_tx.datagrams,
            "datagrams_received": s.udp_rx.datagrams,
            "cwnd": s.path.cwnd,
            "congestion_events": s.path.congestion_events,
        })
    }
}
