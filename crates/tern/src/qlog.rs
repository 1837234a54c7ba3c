//! qlog files: each connection's records ([`tern_proto::qlog`]) written as JSON-SEQ in the
//! qlog main schema (draft-ietf-quic-qlog-main-schema, `qlog_version` 0.3, with the QUIC
//! event names qvis reads: `transport:packet_sent`, `transport:packet_received`,
//! `recovery:packet_lost`, `recovery:metrics_updated`,
//! `recovery:congestion_state_updated`).
//!
//! One file per connection, `<dir>/tern-<client|server>-<port>-<n>.sqlog`, started when the
//! connection's first record is written; times are milliseconds relative to that first
//! record (`time_format: relative`). Turned on by
//! [`EndpointBuilder::qlog_dir`](crate::EndpointBuilder::qlog_dir) or the environment
//! variable `TERN_QLOG_DIR`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};
use tern_proto::qlog::{QlogEvent, QlogRecord};
use tern_proto::{ConnectionHandle, Side};

/// The environment variable that turns qlog on for every endpoint of a process.
pub const QLOG_DIR_ENV: &str = "TERN_QLOG_DIR";

/// JSON-SEQ's record separator (RFC 7464).
const RS: u8 = 0x1e;

/// How much record time a file's buffer may hold before it is flushed: a process killed
/// mid-run (as benchmark agents are) loses at most this much of each trace.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// One connection's open file.
struct Trace {
    out: BufWriter<File>,
    start: Instant,
    flushed: Instant,
}

/// The qlog files of one endpoint.
pub(crate) struct QlogDir {
    dir: PathBuf,
    /// The endpoint's port (and worker), to tell the files of several endpoints in one
    /// directory apart.
    name: String,
    traces: HashMap<(ConnectionHandle, u64), Trace>,
}

impl QlogDir {
    /// Writes into `dir` (created if missing).
    pub(crate) fn new(dir: &Path, name: String) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            name,
            traces: HashMap::new(),
        })
    }

    /// Appends `records` of connection `(handle, generation)`.
    pub(crate) fn write(
        &mut self,
        handle: ConnectionHandle,
        generation: u64,
        side: Side,
        records: impl Iterator<Item = QlogRecord>,
    ) -> io::Result<()> {
        let mut records = records.peekable();
        let Some(first) = records.peek() else {
            return Ok(());
        };
        let trace = match self.traces.entry((handle, generation)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let side = match side {
                    Side::Client => "client",
                    Side::Server => "server",
                };
                let path = self
                    .dir
                    .join(format!("tern-{side}-{}-{generation}.sqlog", self.name));
                let mut out = BufWriter::new(File::create(&path)?);
                write_record(&mut out, &header(side, generation))?;
                e.insert(Trace {
                    out,
                    start: first.time,
                    flushed: first.time,
                })
            }
        };
        let mut latest = trace.flushed;
        for r in records {
            let time = r.time.saturating_duration_since(trace.start).as_secs_f64() * 1e3;
            write_record(&mut trace.out, &event(time, &r.event))?;
            latest = latest.max(r.time);
        }
        if latest.saturating_duration_since(trace.flushed) >= FLUSH_EVERY {
            trace.out.flush()?;
            trace.flushed = latest;
        }
        Ok(())
    }

    /// The connection ended: flush and close its file.
    pub(crate) fn finish(&mut self, handle: ConnectionHandle, generation: u64) -> io::Result<()> {
        match self.traces.remove(&(handle, generation)) {
            Some(mut t) => t.out.flush(),
            None => Ok(()),
        }
    }

    /// Flushes every open file (the endpoint is going away, or a test reads them).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        for t in self.traces.values_mut() {
            t.out.flush()?;
        }
        Ok(())
    }
}

impl Drop for QlogDir {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

fn write_record(out: &mut impl Write, value: &Value) -> io::Result<()> {
    out.write_all(&[RS])?;
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// The file's first record: the QlogFileSeq header with its one trace.
fn header(side: &str, generation: u64) -> Value {
    json!({
        "qlog_version": "0.3",
        "qlog_format": "JSON-SEQ",
        "title": format!("tern connection {generation}"),
        "description": "tern, a transport over UDP; per-path packet numbers, path ID in each event",
        "trace": {
            "vantage_point": { "type": side, "name": "tern" },
            "common_fields": { "time_format": "relative", "protocol_type": ["QUIC"] },
        },
    })
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One event record.
fn event(time: f64, e: &QlogEvent) -> Value {
    let (name, data) = match e {
        QlogEvent::PacketSent {
            path,
            packet_number,
            size,
        } => (
            "transport:packet_sent",
            json!({
                "header": match packet_number {
                    Some(pn) => json!({"packet_type": "1RTT", "packet_number": pn}),
                    None => json!({"packet_type": "handshake"}),
                },
                "raw": {"length": size},
                "path_id": path,
            }),
        ),
        QlogEvent::PacketReceived {
            path,
            packet_number,
            size,
        } => (
            "transport:packet_received",
            json!({
                "header": {"packet_type": "1RTT", "packet_number": packet_number},
                "raw": {"length": size},
                "path_id": path,
            }),
        ),
        QlogEvent::PacketLost {
            path,
            packet_number,
        } => (
            "recovery:packet_lost",
            json!({
                "header": {"packet_type": "1RTT", "packet_number": packet_number},
                "path_id": path,
            }),
        ),
        QlogEvent::MetricsUpdated {
            path,
            min_rtt,
            smoothed_rtt,
            latest_rtt,
            rtt_variance,
            congestion_window,
            bytes_in_flight,
            pacing_rate_bps,
            feedback_rate_bps,
        } => (
            "recovery:metrics_updated",
            json!({
                "min_rtt": ms(*min_rtt),
                "smoothed_rtt": ms(*smoothed_rtt),
                "latest_rtt": ms(*latest_rtt),
                "rtt_variance": ms(*rtt_variance),
                "congestion_window": congestion_window,
                "bytes_in_flight": bytes_in_flight,
                "pacing_rate": pacing_rate_bps,
                // tern extension (F12): the router rate the peer echoed, bit/s.
                "feedback_rate": feedback_rate_bps,
                "path_id": path,
            }),
        ),
        QlogEvent::CongestionStateUpdated { path, old, new } => (
            "recovery:congestion_state_updated",
            json!({"old": old.name(), "new": new.name(), "path_id": path}),
        ),
        QlogEvent::KeyUpdated {
            send,
            generation,
            local,
        } => (
            "security:key_updated",
            json!({
                "key_type": if *send { "1rtt_send" } else { "1rtt_receive" },
                "generation": generation,
                "trigger": if *local { "local_update" } else { "remote_update" },
            }),
        ),
        other => ("tern:unknown", json!({"debug": format!("{other:?}")})),
    };
    json!({"time": time, "name": name, "data": data})
}
