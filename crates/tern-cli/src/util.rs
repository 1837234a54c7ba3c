//! Shared helpers: keys, addresses, sizes, CPU time, statistics.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tern::{Endpoint, PublicKey, StaticKeypair};

use crate::ServerArgs;

pub(crate) fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) fn keygen(name: &Path) -> Result<()> {
    let pair = StaticKeypair::generate(tern::entropy());
    let (private, public) = tern::keys::write_keypair(name, &pair)?;
    println!("private key: {}", private.display());
    println!(
        "public key:  {} ({})",
        public.display(),
        tern::keys::encode_public(&pair.public())
    );
    Ok(())
}

/// The server's identity: from a key file, or new for this run.
pub(crate) fn server_keypair(args: &ServerArgs) -> Result<StaticKeypair> {
    match &args.key {
        Some(path) => Ok(tern::keys::read_keypair(path)?),
        None => Ok(StaticKeypair::generate(tern::entropy())),
    }
}

/// Binds a server and prints how clients reach it.
pub(crate) fn bind_server(args: &ServerArgs, what: &str) -> Result<Endpoint> {
    let pair = server_keypair(args)?;
    let ep = Endpoint::server(args.listen, pair)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let key = tern::keys::encode_public(&ep.public_key());
    eprintln!("{what} listening on {}", ep.local_addr()?);
    eprintln!("server key: {key}");
    eprintln!("clients: --server-key {key}");
    Ok(ep)
}

/// Resolves HOST:PORT to one address, with a clear error.
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("bad address {addr:?} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow!("address {addr:?} resolved to nothing"))
}

pub(crate) fn parse_key(text: Option<&str>) -> Result<Option<PublicKey>> {
    text.map(|t| PublicKey::parse(t).map_err(|e| anyhow!("bad --server-key: {e}")))
        .transpose()
}

/// Connects, and for XX prints the key the server presented so it can be pinned next time.
pub(crate) async fn connect(
    addr: SocketAddr,
    key: Option<&str>,
) -> Result<(Endpoint, tern::Connection)> {
    let key = parse_key(key)?;
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("valid address");
    let ep = Endpoint::bind(
        bind,
        tern::EndpointConfig::new(StaticKeypair::generate(tern::entropy()), tern::entropy()),
    )?;
    let conn = ep
        .connect(addr, key)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    if key.is_none() {
        if let Some(k) = conn.peer_key() {
            eprintln!(
                "server key (not verified; pin it with --server-key): {}",
                tern::keys::encode_public(&k)
            );
        }
    }
    Ok((ep, conn))
}

pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size {text:?} (e.g. 4096, 64K, 100M, 1G)"))
}

/// CPU time (user + system) this process has used.
pub(crate) fn cpu_time() -> Duration {
    // SAFETY-free: getrusage through the libc crate's safe-to-call wrapper would still be
    // unsafe; /proc is enough on Linux.
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = text
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Fields after the command name: utime is the 12th, stime the 13th (0-based 11, 12).
    let hz = clock_ticks();
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz)
}

fn clock_ticks() -> f64 {
    // sysconf(_SC_CLK_TCK) is 100 on Linux for every architecture we build for.
    100.0
}

/// (min, median, p99, mean) of durations.
pub(crate) fn summary(samples: &mut [Duration]) -> (Duration, Duration, Duration, Duration) {
    samples.sort();
    if samples.is_empty() {
        return Default::default();
    }
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    (samples[0], at(0.5), at(0.99), mean)
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn rate(bytes: u64, d: Duration) -> String {
    let bps = bytes as f64 * 8.0 / d.as_secs_f64().max(1e-9);
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.1} Mbit/s", bps / 1e6)
    }
}
