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
