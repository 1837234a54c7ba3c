//! Agents: the programs that run inside the namespaces. The collector re-invokes this binary
//! (`tern-bench agent --spec JSON`) through `ip netns exec`; a server prints one [`Ready`]
//! line and serves until killed, a client runs its workload and prints one
//! [`ClientReport`] line. Every agent exits by itself at its deadline.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::proto::{mux, quic, stream, tcp, ternp, tls, udp};
use crate::spec::{AgentSpec, ClientReport, Proto, Ready, Role, Work};
use crate::sysinfo;

fn print_line(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// CPU seconds (user + system) of this process so far.
pub fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

fn stream_transport(spec: &AgentSpec) -> anyhow::Result<Box<dyn stream::Transport>> {
    Ok(match spec.proto {
        Proto::Tcp => Box::new(tcp::Tcp {
            cc: "cubic".into(),
            mptcp: false,
        }),
        Proto::TcpBbr => Box::new(tcp::Tcp {
            cc: "bbr".into(),
            mptcp: false,
        }),
        Proto::Mptcp => Box::new(tcp::Tcp {
            cc: "cubic".into(),
            mptcp: true,
        }),
        Proto::TcpTls => Box::new(tls::TcpTls::client(
            spec.credential
                .as_deref()
                .context("tcp-tls: the client needs the certificate")?,
        )?),
        #[cfg(tern_bench_udt)]
        Proto::Udt => Box::new(crate::proto::cshim::Udt::new()),
        #[cfg(tern_bench_srt)]
        Proto::Srt => Box::new(crate::proto::cshim::Srt::new()),
        p => bail!("{p} is not a stream transport in this build"),
    })
}

/// Worker threads of an async agent's runtime when its case does not say
/// ([`AgentSpec::workers`]): both of this machine's cores.
const DEFAULT_WORKERS: u32 = 2;

fn runtime(spec: &AgentSpec) -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = spec.workers.unwrap_or(DEFAULT_WORKERS).max(1);
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers as usize)
        .enable_all()
        .build()?)
}

/// Runs an agent to completion.
pub fn run(spec: &AgentSpec) -> anyhow::Result<()> {
    let deadline = Duration::from_secs_f64(spec.deadline_s.max(1.0));
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        eprintln!("agent deadline of {deadline:?} reached; exiting");
        std::process::exit(3);
    });
    match spec.role {
        Role::Server => server(spec),
        Role::Client => client(spec),
    }
}

fn server(spec: &AgentSpec) -> anyhow::Result<()> {
    match spec.proto {
        Proto::Quic => {
            let rt = runtime(spec)?;
            rt.block_on(async {
                let (ep, cert) = quic::server(spec.addr)?;
                print_line(&Ready {
                    ready: true,
                    addr: ep.local_addr()?,
                    credential: Some(cert),
                })?;
                quic::serve(ep).await;
                Ok(())
            })
        }
        Proto::Tern => {
            let rt = runtime(spec)?;
            rt.block_on(async {
                let (ep, key) = ternp::server(spec.addr, &spec.advertise, &spec.tern_mode)?;
                print_line(&Ready {
                    ready: true,
                    addr: ep.local_addr()?,
                    credential: Some(key),
                })?;
                // Runs until the collector kills us.
                ternp::serve(ep).await;
                Ok(())
            })
        }
        Proto::Udp | Proto::Rtp => {
            let framing = if spec.proto == Proto::Rtp {
                udp::Framing::Rtp
            } else {
                udp::Framing::Plain
            };
            let (addr, h) = udp::serve(spec.addr, framing)?;
            print_line(&Ready {
                ready: true,
                addr,
                credential: None,
            })?;
            let _ = h.join();
            Ok(())
        }
        _ => {
            let (t, credential): (Box<dyn stream::Transport>, _) = if spec.proto == Proto::TcpTls {
                let (t, cert) = tls::TcpTls::server()?;
                (Box::new(t), Some(cert))
            } else {
                (stream_transport(spec)?, None)
            };
            let l = t.listen(spec.addr).context("listen")?;
            print_line(&Ready {
                ready: true,
                addr: l.local_addr()?,
                credential,
            })?;
            stream::serve(l)?;
            Ok(())
        }
    }
}

fn client(spec: &AgentSpec) -> anyhow::Result<()> {
    let work = spec.work.clone().context("a client needs work")?;
    let epoch = Instant::now();
    let mut report = ClientReport::default();
    match spec.proto {
        Proto::Quic | Proto::Tern => {
            let rt = runtime(spec)?;
            let cred = spec.credential.clone().unwrap_or_default();
            let (spec_owned, work_owned) = (spec.clone(), work.clone());
            let mut taken = std::mem::take(&mut report);
            // On a worker, not in `block_on`'s thread: a reply the driver receives wakes the
            // client's task on the driver's own worker (tokio's LIFO slot), not across
            // threads, as in a server application whose tasks are spawned.
            report = rt.block_on(rt.spawn(async move {
                let (spec, work, report) = (&spec_owned, &work_owned, &mut taken);
                macro_rules! go {
                    ($m:expr) => {{
                        let m = Arc::new($m);
                        let port = m.local_port();
                        match work {
                            Work::Rpc(p) => {
                                let (s, e, x) = mux::rpc_client(m, p, epoch).await;
                                report.rpc = s;
                                report.error = e;
                                report.extra = x;
                            }
                            Work::Flows(p) => {
                                let (s, e, x) = mux::flows_client(m, p, epoch).await;
                                report.flows = s;
                                report.error = e;
                                report.extra = x;
                            }
                            Work::Transfer(p) => {
                                let (s, e, x) = mux::transfer_client(m, p, epoch).await;
                                report.transfer = Some(s);
                                report.error = e;
                                report.extra = x;
                            }
                        }
                        // The receiving socket's kernel drops, while it is still open.
                        report.udp_socket_drops =
                            port.and_then(|p| sysinfo::udp_socket_drops_of("self", p));
                    }};
                }
                if spec.proto == Proto::Quic {
                    go!(quic::QuicClient::new(spec.addr, spec.bind, &cred)?);
                } else {
                    go!(ternp::TernClient::new(
                        spec.addr,
                        spec.bind,
                        &cred,
                        &spec.tern_mode,
                        tern_paths(spec, work)?,
                    )?);
                }
                Ok::<_, anyhow::Error>(taken)
            }))??;
            rt.shutdown_timeout(Duration::from_millis(200));
        }
        Proto::Udp | Proto::Rtp => {
            let framing = if spec.proto == Proto::Rtp {
                udp::Framing::Rtp
            } else {
                udp::Framing::Plain
            };
            match &work {
                Work::Rpc(p) => {
                    let (s, e) = udp::rpc_client(spec.addr, spec.bind, p, framing, epoch);
                    report.rpc = s;
                    report.error = e;
                }
                Work::Flows(p) => {
                    if framing == udp::Framing::Rtp {
                        bail!("rtp runs request/response workloads only");
                    }
                    let (s, e) = udp::flows_client(spec.addr, spec.bind, p, epoch);
                    report.flows = s;
                    report.error = e;
                }
                Work::Transfer(_) => bail!("{} has no metered transfer", spec.proto),
            }
        }
        _ => {
            let t: Arc<dyn stream::Transport> = Arc::from(stream_transport(spec)?);
            match &work {
                Work::Rpc(p) => {
                    let (s, e) = stream::rpc_client(t.as_ref(), spec.addr, spec.bind, p, epoch);
                    report.rpc = s;
                    report.error = e;
                }
                Work::Flows(p) => {
                    let (s, e) = stream::flows_client(t.as_ref(), spec.addr, spec.bind, p, epoch);
                    report.flows = s;
                    report.error = e;
                }
                Work::Transfer(p) => {
                    let (s, e) =
                        stream::transfer_client(t.as_ref(), spec.addr, spec.bind, p, epoch);
                    report.transfer = Some(s);
                    report.error = e;
                }
            }
            if matches!(
                spec.proto,
                Proto::Tcp | Proto::TcpBbr | Proto::Mptcp | Proto::TcpTls
            ) {
                report.extra = Value::from(tcp::congestion_of(
                    if spec.proto == Proto::TcpBbr {
                        "bbr"
                    } else {
                        "cubic"
                    },
                    spec.proto == Proto::Mptcp,
                ));
            }
        }
    }
    report.cpu_s = cpu_seconds();
    print_line(&report)?;
    // Do not wait for lingering library threads (UDT, SRT, tokio).
    std::process::exit(0);
}

/// Which paths a tern client uses: every path for a multipath transfer or the
/// `flows:multipath` mode, from the bound address and `local_ips`; otherwise one.
fn tern_paths(spec: &AgentSpec, work: &Work) -> anyhow::Result<ternp::Paths> {
    ternp::TernMode::parse(&spec.tern_mode).map_err(|e| anyhow::anyhow!(e))?;
    let multi =
        ternp::is_multipath(&spec.tern_mode) || matches!(work, Work::Transfer(p) if p.multipath);
    Ok(if multi {
        ternp::Paths::Multi(spec.local_ips.clone())
    } else {
        ternp::Paths::One
    })
}

/// Burns CPU: `threads` threads, each busy `load` percent of every 10 ms.
pub fn hog(load: f64, threads: usize, seconds: f64) -> ! {
    let load = load.clamp(0.0, 100.0) / 100.0;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let period = Duration::from_millis(10);
                let mut x: u64 = 1;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    while t0.elapsed() < period.mul_f64(load) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        std::hint::black_box(x);
                    }
                    let rest = period.mul_f64(1.0 - load);
                    if !rest.is_zero() {
                        std::thread::sleep(rest);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    std::process::exit(0);
}
