//! `tern`: send and receive files, measure round trips and throughput, manage keys, and run a
//! loopback demo, over the tern transport.

// A command-line tool measures wall-clock time (round trips, goodput); the sans-I/O rule
// against reading the clock applies to the protocol core, not here.
#![allow(clippy::disallowed_methods)]

mod echo;
mod perf;
mod transfer;
mod util;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// tern: an encrypted, multi-flow transport over UDP for the mobile edge.
///
/// Servers print their public key; give it to clients with --server-key for a one-round-trip
/// handshake (Noise IK). Without it, clients use Noise XX and print the key they learned.
#[derive(Parser)]
#[command(name = "tern", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// Congestion controller of every connection this command makes or accepts: newreno,
    /// cubic (the default), udt, copa, bbr or explicit (a tern router's rate, CUBIC where no
    /// router stamps).
    #[arg(long, global = true, default_value_t = tern::cc::Algorithm::default())]
    cc: tern::cc::Algorithm,
    /// With `--cc cubic` or `newreno`: every loss is a congestion signal, as RFC 9002 says,
    /// without tern's random-loss tolerance (PROTOCOL.md §11.8). The tolerance keeps the window
    /// up on radio links with random loss; beside TCP at a shallow shared buffer it takes most
    /// of the link (docs/BENCHMARKS.md, `coexist`).
    #[arg(long, global = true)]
    no_loss_tolerance: bool,
    /// Write a qlog file (JSON-SEQ, readable in qvis) per connection into this directory:
    /// packets, RTT, congestion window, pacing rate and state. Also: TERN_QLOG_DIR.
    #[arg(long, global = true)]
    qlog: Option<PathBuf>,
    /// A probe train with the handshake (PROTOCOL.md §4.3, §11.10): a client with --server-key pads
    /// its first flight (4.8 kB) so that the server may send its first probe train right
    /// behind its response, and a download starts at the measured rate a round trip earlier;
    /// a server answers such padding with a train. Worth it before a large download only.
    #[arg(long, global = true)]
    handshake_train: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server and a client on loopback: a verified file transfer and round trips
    /// (the default when no command is given).
    Demo,
    /// Write a new key pair: NAME.key (private, mode 0600) and NAME.pub.
    Keygen {
        /// Base name of the two files.
        #[arg(default_value = "tern")]
        name: PathBuf,
        /// Replace an existing key pair of that name (its identity is lost).
        #[arg(long)]
        force: bool,
    },
    /// Receive files into a directory (a server).
    Recv {
        #[command(flatten)]
        server: ServerArgs,
        /// Where received files are written.
        #[arg(long, short, default_value = ".")]
        dir: PathBuf,
        /// Exit after receiving one file.
        #[arg(long)]
        once: bool,
    },
    /// Send a file to a `tern recv` server, verified end to end with SHA-256; an interrupted
    /// transfer resumes when the same command is run again.
    Send {
        /// The file to send.
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Round trips of N-byte messages over one connection (min / median / p99).
    Echo {
        /// Run the echo server instead of the client.
        #[arg(long)]
        server: bool,
        #[command(flatten)]
        server_args: ServerArgs,
        /// Server address, HOST:PORT (client mode).
        addr: Option<String>,
        /// The server's public key (client mode; IK). Without it: XX.
        #[arg(long)]
        server_key: Option<String>,
        /// Message sizes in bytes, comma-separated (e.g. 64,4096,65536,1048576).
        #[arg(long, value_delimiter = ',', default_value = "64")]
        size: Vec<usize>,
        /// Round trips per size.
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Also measure kernel TCP (TCP_NODELAY) on loopback in the same run: starts both a
        /// tern and a TCP echo server in this process (no address needed).
        #[arg(long)]
        compare_tcp: bool,
    },
    /// Bulk throughput of one connection: goodput, CPU time and retransmissions.
    Perf {
        /// Run the perf server instead of the client.
        #[arg(long)]
        server: bool,
        #[command(flatten)]
        server_args: ServerArgs,
        /// Server address, HOST:PORT (client mode).
        addr: Option<String>,
        /// The server's public key (client mode; IK). Without it: XX.
        #[arg(long)]
        server_key: Option<String>,
        #[command(flatten)]
        paths: PathArgs,
        /// Bytes to send (accepts suffixes: 100M, 1G).
        #[arg(long, default_value = "1G", value_parser = util::parse_size)]
        bytes: u64,
        /// Send for this many seconds instead of a byte count.
        #[arg(long, value_parser = util::parse_seconds)]
        time: Option<f64>,
        /// Run server and client in this process on loopback, and kernel TCP (plain and,
        /// with the same payload, as a baseline) in the same run.
        #[arg(long)]
        compare_tcp: bool,
    },
}

/// Options of the serving commands.
#[derive(Args, Clone)]
struct ServerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:4433")]
    listen: SocketAddr,
    /// Private key file (from `tern keygen`); without it a new key is made for this run.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Other addresses of this server that clients may open paths to (multipath), as IP or
    /// IP:PORT (the listening port by default), comma-separated. Default with a wildcard
    /// listen address: every address of this host's interfaces (not loopback); `none`: none.
    #[arg(long, value_delimiter = ',')]
    advertise: Vec<String>,
}

/// Options of the connecting commands.
#[derive(Args, Clone)]
struct ClientArgs {
    /// Server address, HOST:PORT.
    addr: String,
    /// The server's public key (base64 or hex): Noise IK, data in the first packet.
    /// Without it: Noise XX, and the key the server presented is printed.
    #[arg(long)]
    server_key: Option<String>,
    #[command(flatten)]
    paths: PathArgs,
}

/// How a client uses several paths (multipath).
#[derive(Args, Clone, Default)]
struct PathArgs {
    /// Local addresses to open extra paths from, comma-separated. Default: every address of
    /// this host's interfaces in the server's family (none when the server is on loopback);
    /// `none`: one path only.
    #[arg(long = "local", value_delimiter = ',')]
    local: Vec<String>,
    /// Which path carries each packet: min-rtt (default), ack-clocked, round-robin,
    /// redundant, deadline, backup.
    #[arg(long, default_value = "min-rtt")]
    scheduler: tern::SchedulerKind,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    util::init_logging(&cli.log);
    if cli.no_loss_tolerance && !util::has_loss_tolerance(cli.cc) {
        eprintln!(
            "error: --no-loss-tolerance applies to --cc cubic and newreno ({} has no random-loss tolerance)",
            cli.cc
        );
        return ExitCode::FAILURE;
    }
    util::set_globals(util::Globals {
        cc: cli.cc,
        no_loss_tolerance: cli.no_loss_tolerance,
        qlog: cli.qlog.clone(),
        handshake_train: cli.handshake_train,
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let command = async move { run(cli.command.unwrap_or(Command::Demo)).await };
        // Ctrl-C ends the command (its endpoints close as they are dropped, the demo's
        // files are removed) with a message and a non-zero exit.
        tokio::select! {
            result = command => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The server address a client command was given, resolved (`echo` and `perf` also run as
/// servers, so theirs is optional on the command line).
fn server_addr(addr: Option<String>) -> anyhow::Result<std::net::SocketAddr> {
    let addr =
        addr.ok_or_else(|| anyhow::anyhow!("give the server address (HOST:PORT), or --server"))?;
    util::resolve(&addr)
}

/// Runs one command.
async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo => transfer::demo().await,
        Command::Keygen { name, force } => util::keygen(&name, force),
        Command::Recv { server, dir, once } => transfer::recv(&server, &dir, once).await,
        Command::Send { file, client } => transfer::send(&file, &client).await,
        Command::Echo {
            server,
            server_args,
            addr,
            server_key,
            size,
            count,
            compare_tcp,
        } => {
            if server {
                echo::serve(&server_args).await
            } else if compare_tcp {
                echo::compare_local(&size, count).await
            } else {
                let addr = server_addr(addr)?;
                echo::client(addr, server_key.as_deref(), &size, count).await
            }
        }
        Command::Perf {
            server,
            server_args,
            addr,
            server_key,
            paths,
            bytes,
            time,
            compare_tcp,
        } => {
            if server {
                perf::serve(&server_args).await
            } else if compare_tcp {
                perf::compare_local(bytes, time).await
            } else {
                let addr = server_addr(addr)?;
                perf::client(addr, server_key.as_deref(), &paths, bytes, time).await
            }
        }
    }
}
