//! The `fairness` video workload (NC-TCP's metric): the data's sender is a 30 fps encoder
//! whose frame size follows its transport's own rate hint, the same rule for every
//! protocol ([`Encoder`]); the receiver takes the frames apart ([`Deframer`]) and records
//! when each one completed. A frame misses if it completes more than the playout delay
//! (150 ms) after it was produced, or never.
//!
//! On the wire, after the request (`V`, u32 frames, u32 fps, u32 playout ms), each frame is
//! a 16-byte header — u32 index, u32 size (the whole frame, header included), u64 production time in
//! CLOCK_MONOTONIC nanoseconds — then `size − 16` pattern bytes. The namespaces of a run share
//! the host's clock, so the receiver subtracts the sender's time from its own.

use std::time::{Duration, Instant};

use crate::results::{FrameSample, VideoSample};
use crate::spec::TransferPlan;

/// Bytes of a frame's header.
pub const HEADER: usize = 16;

/// The smallest frame, header included: the encoder's lowest quality (120 kbit/s at 30 fps),
/// and what it sends before its transport has a rate.
pub const MIN_FRAME: u32 = 500;

/// The largest frame the receiver accepts (a sanity bound on data from the network); the
/// encoder never produces more.
pub const MAX_FRAME: u32 = 1 << 20;

/// What the encoder's transport may hold unacknowledged: tern's per-flow send buffer and
/// kernel TCP's `SO_SNDBUF` (the kernel doubles the value for its bookkeeping, so about as
/// much payload fits). Without a bound, a transport accepts megabytes at once, the encoder
/// never sees its frames wait, and frames queue inside the transport for seconds. 16 KiB is
/// 0.4 s of a third of 1 Mbit/s, and above a flow's window once three share these links
/// (bandwidth-delay product plus its third of the 100 ms queue, about 10 kB); a flow alone
/// (the start of `staggered`) is held below a full queue by it. A first try with 32 KiB left
/// frames waiting in the transports for up to 0.8 s.
pub const SEND_BUFFER: u32 = 16 << 10;

/// How long the receiver keeps reading after the last frame was due: beyond it every frame
/// still missing is late anyway (the playout delay plus the request's way are well under it).
pub const GRACE_MS: u64 = 1_000;

/// Per second, how much the encoder raises its gain while nothing waits (5 %).
const PROBE_PER_S: f64 = 1.05;
/// Per frame found waiting behind earlier ones, the gain's cut.
const BACKOFF: f64 = 0.9;
/// Bounds of the gain.
const GAIN_MIN: f64 = 0.5;
const GAIN_MAX: f64 = 2.0;
/// The gain's bound under a rate the network gave ([`RateHint::given`]).
const GIVEN_GAIN_MAX: f64 = 1.0;

/// A transport's rate for the encoder ([`Encoder::next_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateHint {
    /// Bytes per second the encoder should produce.
    pub bytes_per_second: u64,
    /// The network set this rate: tern's target rate when a router's explicit rate sets it
    /// on every path (`RateSource::Router`; the stamped rate × min RTT / RTT, less
    /// overheads), rather than the transport estimating it from its own window or pacing.
    pub given: bool,
}

impl RateHint {
    /// A rate the transport estimated (its window or pacing rate).
    pub fn estimated(bytes_per_second: u64) -> Self {
        Self {
            bytes_per_second,
            given: false,
        }
    }
}

/// The encoder's rate rule, the same for every protocol: a frame is `gain × hint / fps`
/// bytes (within [`MIN_FRAME`], [`MAX_FRAME`]), `hint` the transport's rate (tern:
/// `target_rate()`; TCP: `TCP_INFO`'s pacing rate × min RTT / RTT). The gain starts at 1 and
/// rises 5 % per second while every earlier frame has been taken by the transport when the
/// next is due, and is cut by 10 % for each frame that finds earlier ones still waiting.
/// A rate the network gave ([`RateHint::given`]: NC-TCP's encoder, told its rate by the
/// routers) is not probed above: the gain grows back only up to 1.
///
/// Why not the hint alone: an end-host controller grows its window only while the sender is
/// window-limited, so an encoder that produces exactly its hint stays app-limited and the
/// hint never rises. Why not a fixed headroom above it: more than the transport carries
/// piles up in its buffer without bound and every frame ends up late. Probing while the
/// transport keeps up and backing off as soon as frames queue in it keeps the queue near
/// empty, as real-time encoders do.
#[derive(Clone, Debug)]
pub struct Encoder {
    fps: f64,
    gain: f64,
}

impl Encoder {
    /// An encoder of `fps` frames per second.
    pub fn new(fps: u32) -> Self {
        Self {
            fps: f64::from(fps.max(1)),
            gain: 1.0,
        }
    }

    /// The size of the next frame, header included, given the transport's rate (bytes per
    /// second; `None`: not known yet) and whether earlier frames still wait for the
    /// transport to take them.
    pub fn next_size(&mut self, hint: Option<RateHint>, queued: bool) -> u32 {
        // Probing finds out whether an estimate may grow; a rate the network gave is the
        // share there is, and more than it only waits in the transport.
        let most = if hint.is_some_and(|h| h.given) {
            GIVEN_GAIN_MAX
        } else {
            GAIN_MAX
        };
        if queued {
            self.gain = (self.gain * BACKOFF).max(GAIN_MIN);
        } else {
            self.gain *= PROBE_PER_S.powf(1.0 / self.fps);
        }
        self.gain = self.gain.min(most);
        let Some(hint) = hint else {
            return MIN_FRAME;
        };
        let size = self.gain * hint.bytes_per_second as f64 / self.fps;
        size.clamp(f64::from(MIN_FRAME), f64::from(MAX_FRAME)) as u32
    }

    /// The gain now (for tests and logs).
    pub fn gain(&self) -> f64 {
        self.gain
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock every namespace of the host shares).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The request that asks the sender for `frames` frames at `fps`, each given up at
/// `playout_ms` ([`stale`]).
pub fn request(frames: u32, fps: u32, playout_ms: u32) -> Vec<u8> {
    let mut r = vec![b'V'];
    r.extend(frames.to_be_bytes());
    r.extend(fps.to_be_bytes());
    r.extend(playout_ms.to_be_bytes());
    r
}

/// Parses the 12 bytes after `V`: frames, fps and playout delay (ms).
pub fn parse_request(b: &[u8; 12]) -> (u32, u32, u32) {
    let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (word(0), word(4), word(8))
}

/// Whether a frame produced at `sent_ns` is stale at `now_ns`: older than the playout delay,
/// so that it can no longer be on time. The sender skips such a frame instead of handing it
/// to the transport (it counts as missed, never received), as a real-time sender does: a
/// frame that cannot be played only delays the ones behind it.
pub fn stale(sent_ns: u64, now_ns: u64, playout_ms: u32) -> bool {
    now_ns.saturating_sub(sent_ns) > u64::from(playout_ms) * 1_000_000
}

/// The production time in a frame built by [`frame`].
pub fn sent_ns_of(frame: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(frame.get(8..16)?.try_into().ok()?))
}

/// A whole frame: header, then pattern bytes up to `size` (at least the header).
pub fn frame(index: u32, size: u32, sent_ns: u64) -> Vec<u8> {
    let size = (size as usize).max(HEADER);
    let mut f = Vec::with_capacity(size);
    f.extend(index.to_be_bytes());
    f.extend((size as u32).to_be_bytes());
    f.extend(sent_ns.to_be_bytes());
    f.extend((HEADER..size).map(|i| (i % 251) as u8));
    f
}

/// Where a transfer's receiver stops reading, and how many frames it waits for: a video
/// flow reads until all its frames are in or [`GRACE_MS`] after its duration (`None`
/// frames: not a video flow; it stops at its duration, if any).
pub fn reading_bounds(plan: &TransferPlan, start: Instant) -> (Option<Instant>, Option<u32>) {
    let grace = if plan.video.is_some() { GRACE_MS } else { 0 };
    let stop = plan
        .duration_ms
        .map(|d| start + Duration::from_millis(d + grace));
    let due = plan.video.map(|v| v.frames(plan.duration_ms.unwrap_or(0)));
    (stop, due)
}

/// What the receiver asks the sender for: `frames` video frames for a video flow, else `F`
/// and `size` bytes.
pub fn request_for(plan: &TransferPlan, size: u64) -> Vec<u8> {
    match plan.video {
        Some(v) => request(
            v.frames(plan.duration_ms.unwrap_or(0)),
            v.fps,
            v.playout_ms.round() as u32,
        ),
        None => {
            let mut r = vec![b'F'];
            r.extend(size.to_be_bytes());
            r
        }
    }
}

/// The video part of a transfer's sample (`None`: not a video flow).
pub fn sample(plan: &TransferPlan, due: Option<u32>, d: Deframer) -> Option<VideoSample> {
    let v = plan.video?;
    Some(VideoSample {
        fps: v.fps,
        frames_due: due.unwrap_or(0),
        playout_ms: v.playout_ms,
        frames: d.frames,
    })
}

/// Takes a byte stream of frames apart as it arrives.
#[derive(Debug, Default)]
pub struct Deframer {
    header: Vec<u8>,
    /// The frame being read: index, size, production time, bytes still to come.
    current: Option<(u32, u32, u64, u64)>,
    /// Frames completed so far.
    pub frames: Vec<FrameSample>,
}

impl Deframer {
    /// Consumes `data`, which arrived at `now_ns` (CLOCK_MONOTONIC): every frame it completes
    /// is recorded with its latency. An impossible header (a size below the header or above
    /// [`MAX_FRAME`]) is an error: the stream cannot be followed after it.
    pub fn push(&mut self, mut data: &[u8], now_ns: u64) -> Result<(), String> {
        while !data.is_empty() {
            let Some((index, size, sent, left)) = self.current else {
                let want = HEADER - self.header.len();
                let take = want.min(data.len());
                self.header.extend_from_slice(&data[..take]);
                data = &data[take..];
                if self.header.len() == HEADER {
                    let h = &self.header;
                    let index = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                    let size = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                    let mut t = [0u8; 8];
                    t.copy_from_slice(&h[8..16]);
                    let sent = u64::from_be_bytes(t);
                    self.header.clear();
                    if (size as usize) < HEADER || size > MAX_FRAME {
                        return Err(format!("frame {index}: impossible size {size}"));
                    }
                    self.current = Some((index, size, sent, u64::from(size) - HEADER as u64));
                    self.complete_if_done(now_ns);
                }
                continue;
            };
            let take = left.min(data.len() as u64);
            self.current = Some((index, size, sent, left - take));
            data = &data[take as usize..];
            self.complete_if_done(now_ns);
        }
        Ok(())
    }

    fn complete_if_done(&mut self, now_ns: u64) {
        if let Some((index, size, sent, 0)) = self.current {
            self.frames.push(FrameSample {
                index,
                size,
                latency_ms: now_ns.saturating_sub(sent) as f64 / 1e6,
            });
            self.current = None;
        }
    }
}

/// Frame accounting of one flow: `due` frames were to be produced; a frame is on time if it
/// completed within `playout_ms` of its production. Returns (missed, mean size of the frames
/// received): every frame due and not received on time is missed, whether late or never
/// there; a frame index seen twice counts once.
pub fn missed(frames: &[FrameSample], due: u32, playout_ms: f64) -> (u32, f64) {
    let mut seen = std::collections::BTreeSet::new();
    let mut on_time = 0u32;
    for f in frames {
        if f.index < due && seen.insert(f.index) && f.latency_ms <= playout_ms {
            on_time += 1;
        }
    }
    let mean = if frames.is_empty() {
        f64::NAN
    } else {
        frames.iter().map(|f| f64::from(f.size)).sum::<f64>() / frames.len() as f64
    };
    (due.saturating_sub(on_time), mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_taken_apart_across_any_split() {
        let mut wire = Vec::new();
        wire.extend(frame(0, 500, 1_000_000));
        wire.extend(frame(1, 16, 2_000_000)); // header only
        wire.extend(frame(2, 3_000, 3_000_000));
        for chunk in [1, 7, 16, 499, 4_000] {
            let mut d = Deframer::default();
            let mut at = 0;
            for (k, c) in wire.chunks(chunk).enumerate() {
                d.push(c, 10_000_000 + k as u64 * 1_000_000).unwrap();
                at += c.len();
            }
            assert_eq!(at, wire.len());
            let idx: Vec<u32> = d.frames.iter().map(|f| f.index).collect();
            assert_eq!(idx, [0, 1, 2], "chunks of {chunk}");
            let sizes: Vec<u32> = d.frames.iter().map(|f| f.size).collect();
            assert_eq!(sizes, [500, 16, 3_000]);
        }
        // Latency: completion (the read that ended it) minus production.
        let mut d = Deframer::default();
        d.push(&wire[..500], 151_000_000).unwrap();
        assert_eq!(d.frames[0].latency_ms, 150.0);
    }

    #[test]
    fn impossible_headers_are_refused() {
        let mut d = Deframer::default();
        let mut bad = frame(0, 500, 0);
        bad[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(d.push(&bad, 0).is_err());
        let mut d = Deframer::default();
        let mut big = frame(0, 500, 0);
        big[4..8].copy_from_slice(&(MAX_FRAME + 1).to_be_bytes());
        assert!(d.push(&big[..HEADER], 0).is_err());
    }

    #[test]
    fn a_frame_misses_late_or_never() {
        let f = |index, latency_ms| FrameSample {
            index,
            size: 1_000,
            latency_ms,
        };
        // 5 due: one on time, one exactly at the playout (on time), one late, one twice
        // (counted once), one never.
        let frames = [f(0, 20.0), f(1, 150.0), f(2, 150.5), f(3, 40.0), f(3, 40.0)];
        let (missed, mean) = missed(&frames, 5, 150.0);
        assert_eq!(missed, 2, "2 late, 4 never");
        assert_eq!(mean, 1_000.0);
        // Indices beyond what was due do not count.
        assert_eq!(super::missed(&[f(9, 1.0)], 1, 150.0).0, 1);
        assert!(super::missed(&[], 3, 150.0).1.is_nan());
        assert_eq!(super::missed(&[], 3, 150.0).0, 3);
    }

    #[test]
    fn the_encoder_probes_while_nothing_waits_and_backs_off_when_frames_queue() {
        let est = |r| Some(RateHint::estimated(r));
        let mut e = Encoder::new(30);
        assert_eq!(e.next_size(None, false), MIN_FRAME, "no rate yet");
        // 30 kB/s: 1 kB a frame at gain ~1.
        let first = e.next_size(est(30_000), false);
        assert!((1_000..1_010).contains(&first), "{first}");
        // A second with nothing waiting: +5 %.
        for _ in 0..28 {
            e.next_size(est(30_000), false);
        }
        assert!((e.gain() - 1.05).abs() < 1e-3, "{}", e.gain());
        // Frames waiting: 10 % less each, down to half.
        let before = e.next_size(est(30_000), true);
        assert!(before < 1_000, "{before}");
        for _ in 0..50 {
            e.next_size(est(30_000), true);
        }
        assert_eq!(e.gain(), GAIN_MIN);
        // Never below the lowest quality, never above the bound.
        assert_eq!(e.next_size(est(1), true), MIN_FRAME);
        assert_eq!(e.next_size(est(u64::MAX), false), MAX_FRAME);
    }

    #[test]
    fn a_rate_the_network_gives_is_not_probed_above() {
        let given = Some(RateHint {
            bytes_per_second: 30_000,
            given: true,
        });
        let mut e = Encoder::new(30);
        // A minute with nothing waiting: the frames stay at the given rate.
        for _ in 0..30 * 60 {
            assert!(e.next_size(given, false) <= 1_000);
        }
        assert_eq!(e.gain(), 1.0);
        // A gain probed up under an estimate comes down to 1 once a router gives the rate.
        let probed_up = || {
            let mut e = Encoder::new(30);
            for _ in 0..30 * 10 {
                e.next_size(Some(RateHint::estimated(30_000)), false);
            }
            e
        };
        let mut e = probed_up();
        assert!(e.gain() > 1.5, "{}", e.gain());
        assert_eq!(e.next_size(given, false), 1_000);
        // The same with a frame waiting: the cut and the cap both apply.
        assert!(probed_up().next_size(given, true) <= 1_000);
        // Frames that queue still cut it, and it grows back to 1, not beyond.
        for _ in 0..5 {
            e.next_size(given, true);
        }
        assert!(e.gain() < 0.6, "{}", e.gain());
        for _ in 0..30 * 20 {
            e.next_size(given, false);
        }
        assert_eq!(e.gain(), 1.0);
        // Back to an estimate (the sender's own bound below the router's rate): probed again.
        for _ in 0..30 * 2 {
            e.next_size(Some(RateHint::estimated(30_000)), false);
        }
        assert!(e.gain() > 1.05, "{}", e.gain());
    }

    #[test]
    fn requests_round_trip() {
        let r = request(360, 30, 150);
        assert_eq!(r[0], b'V');
        let mut b = [0u8; 12];
        b.copy_from_slice(&r[1..]);
        assert_eq!(parse_request(&b), (360, 30, 150));
    }

    #[test]
    fn a_frame_past_its_playout_is_stale() {
        let f = frame(3, 100, 1_000_000_000);
        assert_eq!(sent_ns_of(&f), Some(1_000_000_000));
        assert_eq!(sent_ns_of(&f[..10]), None);
        assert!(
            !stale(1_000_000_000, 1_150_000_000, 150),
            "exactly at the playout"
        );
        assert!(stale(1_000_000_000, 1_150_000_001, 150));
        assert!(!stale(2_000_000_000, 1_000_000_000, 150), "clock order");
    }
}
