//! qlog over real sockets: a transfer with qlog on at both ends writes one JSON-SEQ file per
//! connection, and every record in it has the shape of the qlog main schema (the header of
//! a QlogFileSeq, then events with a time, a known name and the data fields qvis reads).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tern::{Endpoint, StaticKeypair};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The records of a JSON-SEQ file (RFC 7464: each record is RS, JSON, LF).
fn records(path: &Path) -> Vec<Value> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        bytes.first(),
        Some(&0x1e),
        "{} starts with RS",
        path.display()
    );
    bytes
        .split(|&b| b == 0x1e)
        .skip(1)
        .map(|r| {
            assert_eq!(r.last(), Some(&b'\n'), "a record ends with LF");
            serde_json::from_slice(r).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// Checks one file against the schema; returns how often each event name occurs.
fn check(path: &Path, side: &str) -> BTreeMap<String, usize> {
    let recs = records(path);
    let header = &recs[0];
    assert_eq!(header["qlog_version"], "0.3");
    assert_eq!(header["qlog_format"], "JSON-SEQ");
    assert_eq!(header["trace"]["vantage_point"]["type"], side);
    assert_eq!(header["trace"]["common_fields"]["time_format"], "relative");
    let mut names = BTreeMap::new();
    let mut last = 0.0;
    for e in &recs[1..] {
        let time = e["time"].as_f64().expect("a numeric time");
        assert!(time >= last, "times never go back ({time} after {last})");
        last = time;
        let data = &e["data"];
        assert!(data.is_object(), "{e}");
        let name = e["name"].as_str().expect("a name");
        match name {
            "transport:packet_sent" | "transport:packet_received" => {
                let kind = data["header"]["packet_type"].as_str().unwrap();
                assert!(kind == "1RTT" || kind == "handshake", "{e}");
                if kind == "1RTT" {
                    assert!(data["header"]["packet_number"].is_u64(), "{e}");
                }
                assert!(data["raw"]["length"].as_u64().unwrap() > 0, "{e}");
            }
            "recovery:packet_lost" => assert!(data["header"]["packet_number"].is_u64()),
            "recovery:metrics_updated" => {
                for k in ["min_rtt", "smoothed_rtt", "latest_rtt", "rtt_variance"] {
                    assert!(data[k].as_f64().unwrap() >= 0.0, "{k} in {e}");
                }
                for k in ["congestion_window", "bytes_in_flight", "pacing_rate"] {
                    assert!(data[k].is_u64(), "{k} in {e}");
                }
            }
            "recovery:congestion_state_updated" => {
                for k in ["old", "new"] {
                    let s = data[k].as_str().unwrap();
                    assert!(
                        ["slow_start", "congestion_avoidance", "recovery"].contains(&s),
                        "{e}"
                    );
                }
            }
            other => panic!("unexpected event {other}"),
        }
        assert!(data["path_id"].is_u64(), "{e}");
        *names.entry(name.to_string()).or_default() += 1;
    }
    names
}

#[tokio::test]
async fn a_transfer_writes_a_qlog_file_per_connection_end() {
    let dir = TempDir(std::env::temp_dir().join(format!("tern-qlog-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let server = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .server()
        .qlog_dir(&dir.0)
        .build()
        .unwrap();
    let client = Endpoint::builder(StaticKeypair::generate(tern::entropy()))
        .bind("127.0.0.1:0".parse().unwrap())
        .qlog_dir(&dir.0)
        .build()
        .unwrap();
    const SIZE: usize = 2 << 20;
    let addr = server.local_addr().unwrap();
    let key = server.public_key();
    let receiver = tokio::spawn(async move {
        let conn = server.accept().await.unwrap();
        let mut flow = conn.accept_uni().await.unwrap();
        let got = flow.read_to_end(SIZE).await.unwrap();
        conn.closed().await;
        server.wait_idle().await;
        got.len()
    });
    let conn = client.connect(addr, Some(key)).await.unwrap();
    let mut flow = conn.open_uni().await.unwrap();
    flow.write_all(&vec![7u8; SIZE]).await.unwrap();
    flow.finish().unwrap();
    flow.finished().await.unwrap();
    conn.close(0, b"done");
    conn.closed().await;
    client.wait_idle().await;
    assert_eq!(receiver.await.unwrap(), SIZE);
    drop(client);

    let files: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for side in ["client", "server"] {
        let prefix = format!("tern-{side}-");
        let file = files
            .iter()
            .find(|f| {
                f.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .unwrap_or_else(|| panic!("no {side} file in {files:?}"));
        let names = check(file, side);
        eprintln!("{side}: {names:?}");
        let count = |n: &str| names.get(n).copied().unwrap_or(0);
        assert!(count("transport:packet_sent") > 0 && count("transport:packet_received") > 0);
        if side == "client" {
            // The sender's packets carried the 2 MiB; its ACKs brought RTT and window.
            assert!(count("transport:packet_sent") >= SIZE / 9000, "{names:?}");
            assert!(count("recovery:metrics_updated") > 0, "{names:?}");
            assert!(count("recovery:congestion_state_updated") >= 1, "{names:?}");
        } else {
            assert!(
                count("transport:packet_received") >= SIZE / 9000,
                "{names:?}"
            );
        }
    }
}
