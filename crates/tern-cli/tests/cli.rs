//! The `tern` command end to end: a 200 MB file over loopback with the same SHA-256 on both
//! sides, and a clear message with a non-zero exit for every kind of failure.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn tern() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tern"))
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("tern-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha256(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    ring::digest::digest(&ring::digest::SHA256, &data)
        .as_ref()
        .to_vec()
}

fn keygen(dir: &Path) -> (PathBuf, String) {
    let out = tern()
        .arg("keygen")
        .arg(dir.join("server"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let public = std::fs::read_to_string(dir.join("server.pub")).unwrap();
    (dir.join("server.key"), public.trim().to_string())
}

fn start_recv(key: &Path, port: u16, into: &Path) -> Server {
    let mut child = tern()
        .args(["recv", "--once", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--key")
        .arg(key)
        .arg("--dir")
        .arg(into)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready when it says it listens (not after a fixed sleep, which a loaded machine can
    // outlast); its stderr keeps being passed on, so the pipe never fills.
    let stderr = child.stderr.take().expect("piped stderr");
    let (listening, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut listening = Some(listening);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                if let Some(tx) = listening.take() {
                    let _ = tx.send(());
                }
            }
            eprintln!("tern recv: {line}");
        }
    });
    let server = Server(child);
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("tern recv says it listens");
    server
}

/// `tern send FILE 127.0.0.1:PORT --server-key KEY`, run to its end.
fn send_file(file: &Path, port: u16, key: &str) -> Output {
    tern()
        .arg("send")
        .arg(file)
        .arg(format!("127.0.0.1:{port}"))
        .args(["--server-key", key])
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_200_mb_file_arrives_with_the_same_hash() {
    let dir = TempDir::new("big");
    let (key, public) = keygen(&dir.0);
    let file = dir.0.join("big.bin");
    let mut data = vec![0u8; 200 << 20];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&file, &data).unwrap();
    drop(data);
    let inbox = dir.0.join("in");
    std::fs::create_dir_all(&inbox).unwrap();
    let port = free_port();
    let mut server = start_recv(&key, port, &inbox);
    let out = send_file(&file, port, &public);
    assert!(out.status.success(), "send failed: {}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified"));
    let status = server.0.wait().unwrap();
    assert!(status.success(), "recv --once exited with {status}");
    assert_eq!(sha256(&file), sha256(&inbox.join("big.bin")));
}

#[test]
fn failures_exit_non_zero_with_a_clear_message() {
    let dir = TempDir::new("errors");
    let (key, public) = keygen(&dir.0);
    let file = dir.0.join("small.bin");
    std::fs::write(&file, b"hello").unwrap();

    // A bad address.
    let out = tern()
        .arg("send")
        .arg(&file)
        .arg("not-an-address")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bad address"), "{}", stderr(&out));

    // A missing file.
    let out = tern()
        .args(["send", "/nonexistent/file", "127.0.0.1:9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cannot open"), "{}", stderr(&out));

    // A bad key on the command line.
    let out = tern()
        .arg("send")
        .arg(&file)
        .args(["127.0.0.1:9", "--server-key", "xyz"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("bad --server-key"),
        "{}",
        stderr(&out)
    );

    // The wrong server key.
    let port = free_port();
    let _server = start_recv(&key, port, &dir.0);
    let other = tern::keys::encode_public(&tern::StaticKeypair::generate([9; 32]).public());
    let out = send_file(&file, port, &other);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("wrong server public key"),
        "{}",
        stderr(&out)
    );

    // A file of that name exists where the receiver writes (here the sent file itself, and
    // beside it the server's key, which a client could otherwise replace): refused, nothing
    // replaced (found by an outside read).
    let out = send_file(&file, port, &public);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("exists on the receiver"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");

    // A second keygen of the same name would lose the server's identity: refused.
    let identity = std::fs::read(&key).unwrap();
    let out = tern()
        .arg("keygen")
        .arg(dir.0.join("server"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&key).unwrap(), identity);

    // A directory is not sent (before, it connected and then failed to read).
    let out = tern()
        .arg("send")
        .arg(&dir.0)
        .arg("127.0.0.1:9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn no_server_means_a_handshake_timeout_message() {
    let dir = TempDir::new("gone");
    let file = dir.0.join("f.bin");
    std::fs::write(&file, b"x").unwrap();
    let out = tern()
        .arg("send")
        .arg(&file)
        .arg(format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("handshake timed out"), "{err}");
}

/// Disk full, on a 1 MiB tmpfs (needs root; skipped otherwise).
#[test]
fn a_full_disk_is_reported_to_the_sender() {
    let dir = TempDir::new("full");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let (key, public) = keygen(&dir.0);
    let file = dir.0.join("big.bin");
    std::fs::write(&file, vec![1u8; 5 << 20]).unwrap();
    let port = free_port();
    let _server = start_recv(&key, port, &mnt);
    let out = send_file(&file, port, &public);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.to_lowercase().contains("no space"), "{err}");
}

#[test]
fn the_congestion_controller_is_chosen_by_name() {
    // Every built-in controller carries a transfer; the report names the one that ran.
    // Explicit (F12) is outside ALL (no router in the sweeps) but takes the same plumbing.
    for cc in tern::cc::Algorithm::ALL
        .iter()
        .chain([&tern::cc::Algorithm::Explicit])
    {
        let out = tern()
            .args(["perf", "--compare-tcp", "--bytes", "4M", "--cc", cc.name()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cc}: {text}{}", stderr(&out));
        assert!(text.contains(&format!("cc {cc};")), "{cc}: {text}");
    }
    // With --qlog, both ends of the connection leave a qlog file (JSON-SEQ: RS first).
    let dir = TempDir::new("qlog");
    let out = tern()
        .arg("--qlog")
        .arg(&dir.0)
        .args(["perf", "--compare-tcp", "--bytes", "2M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut files: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].starts_with("tern-client-") && files[1].starts_with("tern-server-"));
    for f in &files {
        let bytes = std::fs::read(dir.0.join(f)).unwrap();
        assert_eq!(bytes.first(), Some(&0x1e), "{f} is JSON-SEQ");
    }
    // An unknown name is refused before anything starts, with the known names.
    let out = tern().args(["--cc", "vegas", "demo"]).output().unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("unknown congestion control algorithm \"vegas\""),
        "{err}"
    );
    assert!(err.contains("cubic"), "{err}");
    // CUBIC without its random-loss tolerance; a controller that has none refuses the flag.
    let out = tern()
        .args([
            "perf",
            "--compare-tcp",
            "--bytes",
            "2M",
            "--cc",
            "cubic",
            "--no-loss-tolerance",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("cc cubic without loss tolerance;"), "{text}");
    let out = tern()
        .args(["--cc", "bbr", "--no-loss-tolerance", "demo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--no-loss-tolerance applies to --cc cubic and newreno"),
        "{err}"
    );
}

/// A UDP relay on loopback between one client and `server` that keeps a copy of the first
/// datagram the client sent (what an on-path observer records). Runs until dropped.
struct RecordingRelay {
    port: u16,
    first: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RecordingRelay {
    fn new(server: std::net::SocketAddr) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let port = socket.local_addr().unwrap().port();
        let first = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (first2, stop2) = (first.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut client = None;
            let mut buf = vec![0u8; 65_536];
            while !stop2.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if from == server {
                    if let Some(c) = client {
                        let _ = socket.send_to(&buf[..n], c);
                    }
                } else {
                    client = Some(from);
                    first2
                        .lock()
                        .unwrap()
                        .get_or_insert_with(|| buf[..n].to_vec());
                    let _ = socket.send_to(&buf[..n], server);
                }
            }
        });
        Self {
            port,
            first,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RecordingRelay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The attack found from outside (issue 13): a server run as `tern recv --once` was kept from
/// its legitimate client by a first flight an observer had recorded earlier. The replay must
/// neither deliver its data again nor take the one-shot server's only connection.
#[test]
fn a_replayed_first_flight_neither_delivers_again_nor_takes_a_one_shot_server() {
    let dir = TempDir::new("replay");
    let (key, public) = keygen(&dir.0);
    let first = dir.0.join("first.txt");
    std::fs::write(&first, b"pay 100 EUR to Mallory").unwrap();
    let second = dir.0.join("second.txt");
    std::fs::write(&second, b"the legitimate client's file").unwrap();
    let (inbox1, inbox2) = (dir.0.join("in1"), dir.0.join("in2"));
    std::fs::create_dir_all(&inbox1).unwrap();
    std::fs::create_dir_all(&inbox2).unwrap();

    // An observer on the path records the first transfer's first datagram.
    let port = free_port();
    let mut server = start_recv(&key, port, &inbox1);
    let relay = RecordingRelay::new(format!("127.0.0.1:{port}").parse().unwrap());
    let out = tern()
        .arg("send")
        .arg(&first)
        .arg(format!("127.0.0.1:{}", relay.port))
        .args(["--server-key", &public])
        .output()
        .unwrap();
    assert!(out.status.success(), "first send failed: {}", stderr(&out));
    assert!(server.0.wait().unwrap().success());
    let recorded = relay.first.lock().unwrap().clone().expect("recorded");
    drop(relay);

    // The server runs again (same key, same port) and the observer replays the recording
    // before the legitimate client comes.
    let mut server = start_recv(&key, port, &inbox2);
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..3 {
        attacker
            .send_to(&recorded, format!("127.0.0.1:{port}"))
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = send_file(&second, port, &public);
    assert!(
        out.status.success(),
        "legitimate send failed: {}",
        stderr(&out)
    );
    let status = server.0.wait().unwrap();
    assert!(status.success(), "recv --once exited with {status}");
    assert_eq!(
        std::fs::read(inbox2.join("second.txt")).unwrap(),
        b"the legitimate client's file"
    );
    assert!(
        !inbox2.join("first.txt").exists(),
        "the replayed first flight delivered its data again"
    );
}
