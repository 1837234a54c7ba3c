//! What the tern-netem tests of the `tern` command share: a child process that is killed when
//! the test ends, and a `tern perf --server` started inside a topology's node.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;

use tern_netem::Topology;

/// A child process killed when the test ends, pass or fail.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tern perf --server --listen LISTEN` in `node` and waits until it says it is
/// listening. Returns the process and the rest of its stderr, line by line (read on a thread,
/// so that the server never blocks on a full pipe).
pub fn perf_server(topo: &Topology, node: &str, listen: &str) -> (Killed, Receiver<String>) {
    let mut server = topo
        .command(node, env!("CARGO_BIN_EXE_tern"))
        .expect("node");
    server
        .args(["perf", "--server", "--listen", listen])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut server = Killed(server.spawn().expect("server starts"));
    let stderr = server.0.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    assert!(
        rx.iter().any(|l| l.contains("listening")),
        "perf server did not start"
    );
    (server, rx)
}

/// One `tern [GLOBAL…] perf SERVER --bytes BYTES` from `c` to `s` over tern-netem's `single`
/// topology whose link `r` has `up` settings on the data direction and `down` on the
/// acknowledgements'. Returns the client's report line and the data direction's counters.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn perf_over(
    up: &str,
    down: &str,
    global: &[&str],
    bytes: &str,
) -> (String, tern_netem::DirectionStats) {
    use tern_netem::{Direction, DirectionConfig, DuplexConfig, EmulationConfig, TopologySpec};
    let topo = Topology::build(&TopologySpec::single()).expect("topology");
    let (mut up_cfg, mut down_cfg) = (DirectionConfig::default(), DirectionConfig::default());
    up_cfg.apply(up).expect("settings");
    down_cfg.apply(down).expect("settings");
    let link = DuplexConfig {
        up: up_cfg,
        down: down_cfg,
    };
    let emu = topo
        .start(&EmulationConfig::default().with_link("r", link))
        .expect("emulator");
    let server_addr = format!("{}:4433", topo.addr("s").expect("server address"));
    let (server, _stderr) = perf_server(&topo, "s", &server_addr);
    let out = topo
        .command("c", env!("CARGO_BIN_EXE_tern"))
        .expect("node")
        .args(global)
        .args(["perf", &server_addr, "--bytes", bytes])
        .stderr(Stdio::inherit())
        .output()
        .expect("client runs");
    assert!(out.status.success(), "tern perf failed: {:?}", out.status);
    let report = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("tern "))
        .expect("report line")
        .to_owned();
    let stats = emu.stats("r", Direction::Up).expect("counters");
    drop(server);
    (report, stats)
}
