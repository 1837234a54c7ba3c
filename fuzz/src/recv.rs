//! `endpoint_recv`: a server endpoint fed datagrams from one client address.
//!
//! # Input format
//! - Up to [`MAX_SINGLE`] bytes: the whole input is one datagram.
//! - Longer: a sequence of records, each a 2-byte big-endian length `n` and `n` bytes (the
//!   last record takes what is left if `n` runs past the end). A record of length 0 means
//!   "let time pass to the endpoint's next timer and run it".
//!
//! After the input, the endpoint's timers run for up to a minute of virtual time, and
//! everything it wants to send is collected after every step.
//!
//! # Checks
//! - No panic.
//! - Every datagram goes to the client's address.
//! - Anti-amplification (docs/PROTOCOL.md §7): the fuzzer never proves its address (that
//!   needs the client's keys or a server-issued token), so the server sends at most 3x the
//!   bytes it received, plus [`ALLOWANCE`] (stateless resets are always shorter than their
//!   trigger, so in practice the allowance is not needed).

use std::time::Duration;

use tern_proto::Endpoint;

use crate::{drain_transmits, epoch, server_config, CLIENT};

/// Inputs up to this long are a single datagram (a little over the 1500 bytes a tern
/// endpoint accepts, so every real datagram fits).
pub const MAX_SINGLE: usize = 1600;

/// Bytes the server may send beyond 3x what it received.
pub const ALLOWANCE: usize = 64;

/// Virtual time the timers run for after the input.
const SETTLE: Duration = Duration::from_secs(60);

/// Most timer steps after the input.
const MAX_TIMER_STEPS: usize = 1_000;

/// Timer steps in a row that may find the next timer already due before the harness calls
/// it a spinning timer (a driver would busy-loop).
pub const MAX_STUCK: usize = 100;

/// One item of an input: a datagram, or "run the next timer".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A datagram from the client's address.
    Datagram(&'a [u8]),
    /// Let time pass to the next timer.
    Timer,
}

/// Splits an input into items (see the module documentation).
pub fn parse(data: &[u8]) -> Vec<Item<'_>> {
    if data.len() <= MAX_SINGLE {
        return vec![Item::Datagram(data)];
    }
    let mut items = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        if n == 0 {
            items.push(Item::Timer);
            continue;
        }
        let (d, r) = rest.split_at(n.min(rest.len()));
        items.push(Item::Datagram(d));
        rest = r;
    }
    items
}

/// Builds an input from items (for seed corpora). A result of up to [`MAX_SINGLE`] bytes
/// would be read as one datagram, so it is padded with timer records until it is longer.
pub fn encode(items: &[Item<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        match item {
            Item::Datagram(d) => {
                let n = u16::try_from(d.len()).expect("datagram under 64 KiB");
                assert!(n > 0, "an empty record means Timer");
                out.extend_from_slice(&n.to_be_bytes());
                out.extend_from_slice(d);
            }
            Item::Timer => out.extend_from_slice(&[0, 0]),
        }
    }
    while out.len() <= MAX_SINGLE {
        out.extend_from_slice(&[0, 0]);
    }
    out
}

/// The target.
pub fn run(data: &[u8]) {
    let mut now = epoch();
    let mut server = Endpoint::new(server_config(), now);
    let mut received = 0usize;
    let mut sent = 0usize;
    let mut scratch = Vec::new();
    let out = |server: &mut Endpoint, now| {
        let n = drain_transmits(server, now, |t, _| {
            let to = t.destination;
            assert_eq!(to, CLIENT, "sent to an address nothing came from")
        });
        while server.poll_event().is_some() {}
        while server.accept().is_some() {}
        n
    };
    for item in parse(data) {
        match item {
            Item::Datagram(d) => {
                received += d.len();
                scratch.clear();
                scratch.extend_from_slice(d);
                server.handle(now, CLIENT, None, &mut scratch);
            }
            Item::Timer => {
                if let Some(t) = server.poll_timeout() {
                    now = now.max(t);
                    server.handle_timeout(now);
                }
            }
        }
        sent += out(&mut server, now);
    }
    let end = now + SETTLE;
    let mut stuck = 0;
    for _ in 0..MAX_TIMER_STEPS {
        match server.poll_timeout() {
            Some(t) if t <= end => {
                stuck = if t <= now { stuck + 1 } else { 0 };
                assert!(
                    stuck < MAX_STUCK,
                    "timer at {t:?} stays due after handle_timeout"
                );
                now = now.max(t);
                server.handle_timeout(now);
                sent += out(&mut server, now);
            }
            _ => break,
        }
    }
    assert!(
        sent <= 3 * received + ALLOWANCE,
        "amplification: sent {sent} bytes to an unproven address that sent {received} ({:?})",
        server.stats()
    );
}
