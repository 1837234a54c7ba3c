//! tern through its public API (`tern::Endpoint`). The server prints its public key in its
//! ready line; clients connect with Noise IK. `--tern-mode flows` (the only mode for now)
//! uses one two-way flow per request: request bytes + FIN, then the reply + FIN. A
//! message-based mode will slot in here as another [`Mux`] implementation.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde_json::{json, Value};

use super::mux::{serve_stream, Mux};

fn config(server: bool) -> tern::EndpointConfig {
    let mut cfg = tern::EndpointConfig::new(
        tern::StaticKeypair::generate(tern::entropy()),
        tern::entropy(),
    );
    if server {
        cfg = cfg.server();
    }
    // Open-loop request streams can pile up on a saturated link; do not let the flow limit
    // (rather than the link) decide the latency. quinn gets the same treatment.
    cfg.connection.flows.max_concurrent_bidi = 100_000;
    cfg
}

/// Starts a server; returns it and its public key to print.
pub fn server(addr: SocketAddr) -> io::Result<(tern::Endpoint, String)> {
    let ep = tern::Endpoint::bind(addr, config(true))?;
    let key = tern::keys::encode_public(&ep.public_key());
    Ok((ep, key))
}

/// Serves until the process is killed.
pub async fn serve(ep: tern::Endpoint) {
    while let Some(conn) = ep.accept().await {
        tokio::spawn(async move {
            while let Ok((w, r)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    let _ = serve_stream(w, r).await;
                });
            }
        });
    }
}

/// The client side.
pub struct TernClient {
    ep: tern::Endpoint,
    addr: SocketAddr,
    key: tern::PublicKey,
}

impl TernClient {
    /// A client endpoint that expects the server key `key` (as printed by the server).
    pub fn new(addr: SocketAddr, bind: Option<IpAddr>, key: &str, mode: &str) -> io::Result<Self> {
        if mode != "flows" {
            return Err(io::Error::other(format!(
                "--tern-mode {mode:?} is not implemented yet (only `flows`)"
            )));
        }
        let key =
            tern::PublicKey::parse(key.trim()).map_err(|e| io::Error::other(format!("{e:?}")))?;
        let local = SocketAddr::new(bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), 0);
        let ep = tern::Endpoint::bind(local, config(false))?;
        Ok(Self { ep, addr, key })
    }
}

impl Mux for TernClient {
    type Conn = tern::Connection;
    type W = tern::SendFlow;
    type R = tern::RecvFlow;

    async fn connect(&self) -> io::Result<tern::Connection> {
        self.ep
            .connect(self.addr, Some(self.key))
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }

    async fn open_bi(conn: &tern::Connection) -> io::Result<(Self::W, Self::R)> {
        conn.open_bi()
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn close(conn: &tern::Connection) {
        conn.close(0, b"done");
    }

    fn stats(conn: &tern::Connection) -> Value {
        json!({ "stats": format!("{:?}", conn.stats()) })
    }
}
