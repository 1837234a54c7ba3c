//! Shared helpers: keys, addresses, sizes, CPU time, statistics.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tern::cc::ControllerFactory;
use tern::{Endpoint, PublicKey, StaticKeypair};

use crate::{PathArgs, ServerArgs};

/// Settings of every endpoint this process makes (global options, set once in `main`
/// before any endpoint is made).
#[derive(Default)]
pub(crate) struct Globals {
    /// `--cc`: the congestion controller.
    pub(crate) cc: tern::cc::Algorithm,
    /// `--no-loss-tolerance`: CUBIC or NewReno without the random-loss tolerance.
    pub(crate) no_loss_tolerance: bool,
    /// `--qlog DIR`: write a qlog file per connection there.
    pub(crate) qlog: Option<std::path::PathBuf>,
    /// `--handshake-train`: ask for (client) or answer with (server) a probe train with the
    /// handshake.
    pub(crate) handshake_train: bool,
}

static GLOBALS: std::sync::OnceLock<Globals> = std::sync::OnceLock::new();

/// Sets the global options (once; later calls are ignored).
pub(crate) fn set_globals(globals: Globals) {
    let _ = GLOBALS.set(globals);
}

/// The controller set with `--cc`, for reports.
pub(crate) fn controller() -> tern::cc::Algorithm {
    GLOBALS.get().map(|g| g.cc).unwrap_or_default()
}

/// Whether `--no-loss-tolerance` is in force (only with a controller that has the tolerance).
pub(crate) fn strict_losses() -> bool {
    GLOBALS.get().is_some_and(|g| g.no_loss_tolerance) && has_loss_tolerance(controller())
}

/// The congestion-controller factory of `--cc` and `--no-loss-tolerance`.
fn congestion() -> Arc<dyn ControllerFactory> {
    let cc = controller();
    let strict = strict_losses()
        .then(|| cc.factory_with_loss_tolerance(tern::cc::DEFAULT_INITIAL_WINDOW_PACKETS, false))
        .flatten();
    strict.unwrap_or_else(|| cc.factory())
}

/// Whether `cc` has a random-loss tolerance to switch off (CUBIC, NewReno).
pub(crate) fn has_loss_tolerance(cc: tern::cc::Algorithm) -> bool {
    cc.factory_with_loss_tolerance(tern::cc::DEFAULT_INITIAL_WINDOW_PACKETS, false)
        .is_some()
}

/// An endpoint builder for identity `pair` with the global options applied (`--cc`,
/// `--qlog`). A key `new` to this run was never an earlier server's, so that server may trust
/// first-flight timestamps from its start (PROTOCOL.md §7.6).
fn builder(pair: StaticKeypair, new: bool) -> tern::EndpointBuilder {
    let b = Endpoint::builder(pair).configure(|c| {
        // A transfer goes quiet while the receiver syncs and hashes a large file, and while a
        // resuming sender hashes what the receiver has: keep-alives stop the idle timeout from
        // ending it there (found by an outside read: beyond 30 s of hashing, it could never
        // finish).
        c.connection.keep_alive = Some(Duration::from_secs(5));
        c.connection.congestion = congestion();
        c.connection.handshake_train = GLOBALS.get().is_some_and(|g| g.handshake_train);
        c.first_flight.trust_start = new;
    });
    match GLOBALS.get().and_then(|g| g.qlog.clone()) {
        Some(dir) => b.qlog_dir(dir),
        None => b,
    }
}

/// A server on an ephemeral loopback port with a new key, for the in-process comparisons
/// and the demo.
pub(crate) fn loopback_server() -> Result<Endpoint> {
    builder(StaticKeypair::generate(tern::entropy()), true)
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .server()
        .build()
        .context("cannot listen on loopback")
}

pub(crate) fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) fn keygen(name: &Path, force: bool) -> Result<()> {
    // The names `write_keypair` writes.
    let private = name.with_extension("key");
    if !force && (private.exists() || name.with_extension("pub").exists()) {
        anyhow::bail!(
            "{} exists: its identity would be lost (--force replaces it)",
            private.display()
        );
    }
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

/// Addresses of this host's interfaces that are up, in the family of `like`, not loopback.
pub(crate) fn interface_ips(like: IpAddr) -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut ips = Vec::new();
    for a in addrs {
        if !a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let link_local = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        if ip.is_loopback() || ip.is_unspecified() || link_local || ip.is_ipv4() != like.is_ipv4() {
            continue;
        }
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

/// Parses `--local`/`--advertise` lists: `none`, or addresses (IP, or IP:PORT).
fn parse_addrs(list: &[String], port: u16, what: &str) -> Result<Option<Vec<SocketAddr>>> {
    if list.is_empty() {
        return Ok(None);
    }
    if list.len() == 1 && list[0] == "none" {
        return Ok(Some(Vec::new()));
    }
    list.iter()
        .map(|t| {
            t.parse::<SocketAddr>()
                .or_else(|_| t.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, port)))
                .map_err(|_| anyhow!("bad {what} address {t:?} (expected IP, IP:PORT or none)"))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Binds a server and prints how clients reach it.
pub(crate) fn bind_server(args: &ServerArgs, what: &str) -> Result<Endpoint> {
    let pair = server_keypair(args)?;
    let listen = args.listen;
    let advertise = match parse_addrs(&args.advertise, listen.port(), "--advertise")? {
        Some(list) => list,
        None if listen.ip().is_unspecified() => interface_ips(listen.ip())
            .into_iter()
            .map(|ip| SocketAddr::new(ip, listen.port()))
            .collect(),
        None => Vec::new(),
    };
    let ep = builder(pair, args.key.is_none())
        .bind(listen)
        .server()
        .configure(|c| c.connection.advertise = advertise.clone())
        .build()
        .with_context(|| format!("cannot listen on {listen}"))?;
    let key = tern::keys::encode_public(&ep.public_key());
    eprintln!("{what} listening on {}", ep.local_addr()?);
    if !advertise.is_empty() {
        let list: Vec<String> = advertise.iter().map(ToString::to_string).collect();
        eprintln!("advertising for multipath: {}", list.join(", "));
    }
    eprintln!("server key: {key}");
    eprintln!("clients: --server-key {key}");
    Ok(ep)
}

/// `HOST:PORT` to an address: an IPv4 one when the name has both (servers listen on
/// `0.0.0.0` by default, and `localhost` often resolves to `::1` first).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    let all: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .with_context(|| format!("bad address {addr:?} (expected HOST:PORT)"))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| anyhow!("address {addr:?} resolved to nothing"))
}

pub(crate) fn parse_key(text: Option<&str>) -> Result<Option<PublicKey>> {
    text.map(|t| PublicKey::parse(t).map_err(|e| anyhow!("bad --server-key: {e}")))
        .transpose()
}

/// Connects (opening a path from each local address `paths` names, see [`PathArgs`]), and
/// for XX prints the key the server presented so it can be pinned next time.
pub(crate) async fn connect(
    addr: SocketAddr,
    key: Option<&str>,
    paths: &PathArgs,
) -> Result<(Endpoint, tern::Connection)> {
    let key = parse_key(key)?;
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("valid address");
    let local_ips: Vec<IpAddr> = match parse_addrs(&paths.local, 0, "--local")? {
        Some(list) => list.iter().map(SocketAddr::ip).collect(),
        None if addr.ip().is_loopback() => Vec::new(),
        None => interface_ips(addr.ip()),
    };
    let scheduler = paths.scheduler;
    let ep = builder(StaticKeypair::generate(tern::entropy()), true)
        .bind(bind)
        .configure(|c| {
            c.connection.local_ips = local_ips;
            c.connection.scheduler = scheduler;
        })
        .build()?;
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

/// One line per path of `conn` (only when it has more than one): addresses, state, the
/// share of the bytes sent, the rate over `took`, RTT and window.
pub(crate) fn print_paths(conn: &tern::Connection, took: Duration) {
    let paths = conn.paths();
    if paths.len() < 2 {
        return;
    }
    let total: u64 = paths.iter().map(|p| p.bytes_sent).sum::<u64>().max(1);
    for p in &paths {
        let local = p.local.map_or("?".to_string(), |ip| ip.to_string());
        println!(
            "  path {} {local} -> {} {:?}{}: sent {:>5.1} % ({}), rtt {}, cwnd {} kB",
            p.id,
            p.remote,
            p.state,
            if p.validated { "" } else { " (unvalidated)" },
            100.0 * p.bytes_sent as f64 / total as f64,
            rate(p.bytes_sent, took),
            ms(p.rtt),
            p.cwnd / 1000,
        );
    }
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
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {text:?} (e.g. 4096, 64K, 100M, 1G)"))
}

/// A duration in seconds: finite, positive, at most a day.
pub(crate) fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!(
            "bad duration {text:?}: seconds, above 0, at most 86400"
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_are_checked() {
        assert_eq!(parse_size("64K"), Ok(65_536));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        // Found by an outside read: a product past u64 wrapped to a small size.
        assert!(parse_size("17179869184G").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        // These panicked in Duration::from_secs_f64 after connecting.
        for bad in ["nan", "inf", "-1", "0", "1e9"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }
}
