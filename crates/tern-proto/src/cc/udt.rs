//! UDT's native congestion control: DAIMD rate control (AIMD with decreasing increases), with
//! PaUDT's initial window of 16 datagrams.
//!
//! # What UDT's controller is
//!
//! UDT (Gu & Grossman, "UDT: UDP-based data transfer for high-speed wide area networks",
//! Computer Networks 51(7), 2007) controls the *rate*, not a window. Every SYN interval (10 ms,
//! independent of the RTT, which is what makes UDT RTT-fair) the sender raises its packet rate
//! by
//!
//! ```text
//! inc = max(10^ceil(log10((B − C) × MSS × 8)) × β / MSS, 1 / MSS)   packets per SYN, β = 1.5e-6
//! ```
//!
//! where `B` is the estimated link capacity and `C` the current sending rate, both in packets
//! per second: far from the capacity the rate climbs fast, close to it slowly (the "decreasing
//! increases"; projecting `B − C` onto powers of ten makes it robust to estimation error). On a
//! loss report (a NAK) that starts a new congestion epoch the rate drops by 1/9 (the packet
//! period is multiplied by 1.125). The flow window only caps the data in flight. Before the
//! first loss, a window-based slow start (the window grows by the number of acknowledged
//! packets) finds the capacity quickly.
//!
//! # From the paper, from udt4, and what differs here
//!
//! From the paper: the SYN-clocked DAIMD increase formula above, the 1/9 decrease per
//! congestion epoch, slow start until the first loss, and `B` from the receiver's packet-pair
//! estimate.
//!
//! From udt4's `CUDTCC` (`ccc.cpp`), which refines the paper:
//! - the epoch logic: a NAK opens a new epoch if it reports a packet sent after the last
//!   decrease (`LastDecSeq`). Within an epoch, further decreases come at random intervals: at
//!   the start of an epoch the sender draws `DecRandom` uniformly in `1..=AvgNAKNum` (an EWMA,
//!   gain 1/8, of NAKs per epoch) and decreases again on every `DecRandom`-th NAK, at most 4
//!   more times per epoch ("0.875^5 = 0.51, rate should not be decreased by more than half").
//!   The randomisation breaks the synchronisation of flows sharing a bottleneck;
//! - while the rate is below the rate before the last epoch's decrease, `B − C` is capped at
//!   `B / 9` (the headroom that decrease created), so the rate creeps back instead of leaping;
//! - no increase in the SYN interval after one that saw a loss;
//! - on leaving slow start the rate becomes the receiver's delivery rate, or window / (RTT +
//!   SYN) without one; slow start also ends when the window exceeds the maximum window;
//! - a timeout does nothing outside slow start (udt4 commented its decrease out).
//!
//! Here, in tern's sans-I/O shape:
//! - **No timer.** The rate-control step runs from [`Controller::on_end_acks`] when at least a
//!   SYN has passed since the previous one, one step per call, as udt4's ACK timer does (tern's
//!   peer ACKs every 2 to 10 packets, so once it sends 100 ACKs/s every SYN has its step; at
//!   lower rates steps, and growth, are sparser). App-limited ACKs take
//!   no step (UDT has no app-limited notion; growing on them would let the rate run away).
//! - **A "NAK" is one [`Controller::on_congestion_event`]** (one batch of packets declared
//!   lost), and "sent after the last decrease" compares send times instead of sequence numbers.
//!   tern passes the send time of the *newest* lost packet, udt4 looks at the *oldest* one in
//!   the NAK; so a batch that mixes packets from both sides of a decrease opens an epoch here
//!   where udt4 would count it in the old one.
//! - **The randomness is deterministic.** udt4 seeds `rand()` with `LastDecSeq`; tern
//!   controllers never draw random numbers, so `DecRandom` comes from a hash of the number of
//!   packets sent so far, the path id and [`UdtConfig::seed`]. Two flows still draw different
//!   values (they have sent different amounts) and every run replays exactly.
//! - **Capacity `B`.** UDT's receiver measures it with packet pairs and reports it in every
//!   ACK. tern's receiver does not; a measurement from outside (packet-pair fast start, F11)
//!   arrives through [`Controller::on_rate_estimate`] and is smoothed like udt4 (gain 1/8).
//!   Until one arrives, `B` is the largest delivery rate the controller itself measured over
//!   intervals of about an RTT in the last [`CAPACITY_WINDOW`]. That estimate cannot exceed
//!   what the flow sent, so it relies on slow start's overshoot to see the link; if slow start
//!   ends early (random loss), `B` stays low and the increase falls to 1/MSS packets per SYN.
//! - **Delivery rate on leaving slow start** is that same measurement (UDT's receiver reports
//!   its packet arrival speed).
//! - **Rates in floating point.** udt4 rounds the period up to whole microseconds on every
//!   decrease; here the rate is an `f64` in packets per second, floored at one packet per
//!   second.
//! - **Pacing in slow start.** udt4 sends slow start unpaced (period 1 µs, window-limited);
//!   tern paces everything (F11), at 2 × window / smoothed RTT, as [`Classic`] does.
//! - **Window.** udt4 sets the flow window to `delivery rate × (RTT + SYN) + 16` packets. Here it
//!   is `max(16 packets, 2 × rate × (smoothed RTT + SYN))` and at most the maximum window:
//!   twice the rate, so that the window never binds while the pacer is in charge and only
//!   limits the damage when the RTT collapses or ACKs stop.
//! - **The slow-start overshoot counts once.** In udt4 the first loss ends slow start (rate =
//!   delivery rate) and opens an epoch (rate × 8/9); the many further NAKs of the overshoot
//!   then fall in that epoch and, with `AvgNAKNum` still 0, each one decreases again, five
//!   decreases in all: the flow leaves slow start at 0.55 × the delivery rate, and below the
//!   pre-decrease rate the increase is capped at the `B / 9` step (about 1 Mbit/s per second
//!   on a 50 Mbit/s link), so it takes some 20 s to get back. Here losses of packets sent
//!   before slow start ended do not decrease the rate again (they are counted as
//!   non-congestive): the switch to the measured delivery rate already answered them. In the
//!   simulator (50 Mbit/s, 40 ms, one BDP of buffer) this lifts the utilisation after the first
//!   second from 62 % to 92 %.
//! - **Random loss.** UDT reads every loss epoch as congestion, and at 1 % random loss nearly
//!   every lost packet opens an epoch. Measured in `tern-sim` (50 Mbit/s, 40 ms, 1 % loss):
//!   about 1 Mbit/s, under 2 % of the link. Knowing `B` from a packet pair does not rescue it
//!   (9 % against 6 % in the link simulation of `cc/tests.rs`): below the rate of its last
//!   decrease the increase is held at the `B / 9` step. This is UDT as designed, for clean
//!   high-speed paths; tern's [`Classic`] controllers have random-loss tolerance, UDT has none.
//! - **Spurious losses** are not undone (UDT has no such notion); persistent congestion ends
//!   slow start and otherwise counts as one more NAK.
//!
//! [`Classic`]: super::Classic

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Controller, ControllerFactory, Metrics, PathInfo};
use crate::recovery::rtt::RttEstimator;

/// UDT's rate-control interval, `SYN` (udt4 `m_iSYNInterval`, 10 000 µs).
pub const SYN: Duration = Duration::from_millis(10);

/// PaUDT's initial window, which is also the smallest flow window, in datagrams (udt4
/// `m_dCWndSize = 16`).
pub const INITIAL_WINDOW_PACKETS: u32 = 16;

/// Default maximum window in datagrams: udt4's default flight flag size (25 600 packets).
pub const DEFAULT_MAX_WINDOW_PACKETS: u32 = 25_600;

/// `β` of the increase formula, 1.5 × 10⁻⁶ (udt4: "Beta = 1.5 * 10^(-6)").
pub const INCREASE_BETA: f64 = 0.000_001_5;

/// The packet period is multiplied by this on a decrease: the rate drops by 1/9.
pub const DECREASE_FACTOR: f64 = 1.125;

/// At most this many decreases per congestion epoch (udt4 `m_iDecCount < 5`): 0.889⁵ ≈ 0.55,
/// so one epoch never halves the rate.
pub const MAX_DECREASES_PER_EPOCH: u32 = 5;

/// How long a delivery-rate sample counts towards the capacity estimate `B` when no outside
/// estimate arrived (long enough to span slow start and a few epochs, short enough to follow a
/// link that slows down).
pub const CAPACITY_WINDOW: Duration = Duration::from_secs(10);

/// Lowest rate, in packets per second.
const MIN_RATE: f64 = 1.0;

/// Highest rate, in packets per second (keeps every product finite and far from `u64::MAX`).
const MAX_RATE: f64 = 1e12;

/// Most delivery-rate samples kept for the capacity estimate.
const MAX_SAMPLES: usize = 256;

/// UDT's increase, in packets per SYN, with `available` = `B − C` packets per second and
/// `mss` bytes per packet: `max(10^ceil(log10(available × mss × 8)) × β / mss, 1 / mss)`.
pub fn increase_per_syn(available: f64, mss: f64) -> f64 {
    let mss = mss.max(1.0);
    let floor = 1.0 / mss;
    let bits = available * mss * 8.0;
    if !(bits.is_finite() && bits > 0.0) {
        return floor;
    }
    let inc = 10f64.powf(bits.log10().ceil()) * INCREASE_BETA / mss;
    if inc.is_finite() {
        inc.max(floor)
    } else {
        floor
    }
}

/// A uniform number in `[0, 1)` from `x` (SplitMix64's finaliser).
fn uniform(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Measures the delivery rate over intervals of about an RTT and keeps the recent maximum.
#[derive(Debug, Clone, Default)]
struct DeliveryRate {
    interval_start: Option<Instant>,
    bytes: u64,
    /// The most recent sample, bytes per second.
    latest: Option<f64>,
    /// (time, bytes per second), times increasing and rates decreasing: the front is the
    /// largest sample of the last [`CAPACITY_WINDOW`].
    samples: VecDeque<(Instant, f64)>,
}

impl DeliveryRate {
    fn on_ack(&mut self, now: Instant, bytes: u64, interval: Duration) {
        let Some(start) = self.interval_start else {
            // The bytes of this first ACK were in flight before the interval began.
            self.interval_start = Some(now);
            self.bytes = 0;
            return;
        };
        if now < start {
            // Time stepped back: restart the interval.
            self.interval_start = Some(now);
            self.bytes = 0;
            return;
        }
        self.bytes = self.bytes.saturating_add(bytes);
        let elapsed = now - start;
        if elapsed < interval || elapsed.is_zero() {
            return;
        }
        let rate = self.bytes as f64 / elapsed.as_secs_f64();
        self.interval_start = Some(now);
        self.bytes = 0;
        if !rate.is_finite() {
            return;
        }
        self.latest = Some(rate);
        while self.samples.back().is_some_and(|&(_, r)| r <= rate) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, rate));
        if self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        while self.samples.len() > 1
            && self
                .samples
                .front()
                .is_some_and(|&(t, _)| now.saturating_duration_since(t) > CAPACITY_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Largest recent sample, bytes per second.
    fn max(&self) -> Option<f64> {
        self.samples.front().map(|&(_, r)| r)
    }
}

/// UDT's native controller (DAIMD). Build it with [`UdtConfig`].
#[derive(Debug, Clone)]
pub struct Udt {
    config: UdtConfig,
    path_id: u32,
    /// Current maximum datagram size, at least 1.
    mss: u64,
    slow_start: bool,
    /// Slow-start window in packets.
    cwnd: f64,
    /// Sending rate in packets per second (meaningful after slow start).
    rate: f64,
    /// Smoothed RTT at the latest ACK.
    srtt: Duration,
    /// Time of the latest rate-control step.
    last_rc: Option<Instant>,
    /// Bytes acknowledged since the last rate-control step (slow-start growth).
    acked_since_rc: u64,
    /// A loss was reported since the last rate-control step (udt4 `m_bLoss`).
    loss_since_rc: bool,
    /// Packets sent so far (udt4's current sequence number, for the epoch's random draw).
    packets_sent: u64,
    /// Send time of the newest packet sent.
    last_sent: Option<Instant>,
    /// Send time of the newest packet sent at the latest decrease (udt4 `m_iLastDecSeq`): a
    /// loss of a later packet opens a new epoch.
    last_decrease: Option<Instant>,
    /// Rate before the current epoch's first decrease (udt4 `m_dLastDecPeriod`), infinite
    /// before any.
    last_decrease_rate: f64,
    /// Send time of the newest packet sent before slow start ended: losses of these packets
    /// are the overshoot slow start ended on, already answered by the switch to the delivery
    /// rate.
    slow_start_end: Option<Instant>,
    /// EWMA of NAKs per epoch (udt4 `m_iAvgNAKNum`).
    avg_naks: u32,
    /// NAKs in the current epoch (udt4 `m_iNAKCount`).
    naks: u32,
    /// Decreases checked in the current epoch (udt4 `m_iDecCount`).
    decreases: u32,
    /// Decrease on every `dec_random`-th NAK of the epoch (udt4 `m_iDecRandom`).
    dec_random: u32,
    /// Link capacity from outside (packet pair), bytes per second, smoothed.
    capacity: Option<f64>,
    delivery: DeliveryRate,
    congestion_events: u64,
    non_congestive_losses: u64,
    persistent_congestion_events: u64,
}

impl Udt {
    /// A controller in slow start for the path `info`.
    pub fn new(config: &UdtConfig, now: Instant, info: &PathInfo) -> Self {
        let _ = now;
        let mss = u64::from(info.max_datagram_size).max(1);
        let cwnd = f64::from(config.initial_window_packets.max(1));
        Self {
            config: config.clone(),
            path_id: info.path_id,
            mss,
            slow_start: true,
            cwnd,
            rate: MIN_RATE,
            srtt: info.initial_rtt,
            last_rc: None,
            acked_since_rc: 0,
            loss_since_rc: false,
            packets_sent: 0,
            last_sent: None,
            last_decrease: None,
            last_decrease_rate: f64::INFINITY,
            slow_start_end: None,
            avg_naks: 0,
            naks: 0,
            decreases: 0,
            dec_random: 1,
            capacity: None,
            delivery: DeliveryRate::default(),
            congestion_events: 0,
            non_congestive_losses: 0,
            persistent_congestion_events: 0,
        }
    }

    /// Whether the controller is still in slow start.
    pub fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    /// Sending rate in packets per second (after slow start).
    pub fn rate_packets(&self) -> f64 {
        self.rate
    }

    /// The link capacity `B` in packets per second the increase is computed from: the outside
    /// estimate if one arrived, else the largest recent delivery rate; `None` without either.
    pub fn capacity_packets(&self) -> Option<f64> {
        self.capacity
            .or_else(|| self.delivery.max())
            .map(|bytes| bytes / self.mss as f64)
    }

    /// The decrease period of the current epoch (udt4 `DecRandom`).
    pub fn dec_random(&self) -> u32 {
        self.dec_random
    }

    fn max_window_packets(&self) -> f64 {
        f64::from(self.config.max_window_packets.max(INITIAL_WINDOW_PACKETS))
    }

    fn set_rate(&mut self, rate: f64) {
        self.rate = if rate.is_finite() {
            rate.clamp(MIN_RATE, MAX_RATE)
        } else {
            MAX_RATE
        };
    }

    /// Leaves slow start with the delivery rate (udt4: `m_iRcvRate`, else `cwnd / (RTT + SYN)`).
    fn end_slow_start(&mut self) {
        if !self.slow_start {
            return;
        }
        self.slow_start = false;
        self.slow_start_end = self.last_sent;
        let mss = self.mss as f64;
        let rate = match self.delivery.latest {
            Some(bytes) if bytes > 0.0 => bytes / mss,
            _ => self.cwnd / (self.srtt + SYN).as_secs_f64().max(1e-6),
        };
        self.set_rate(rate);
    }

    /// One SYN's rate increase (udt4 `CUDTCC::onACK` after slow start).
    fn increase(&mut self) {
        let mss = self.mss as f64;
        let mut available = 0.0;
        if let Some(capacity) = self.capacity_packets() {
            available = capacity - self.rate;
            //= udt4 ccc.cpp CUDTCC::onACK
            //# if ((m_dPktSndPeriod > m_dLastDecPeriod) && ((m_iBandwidth / 9) < B))
            //#    B = m_iBandwidth / 9;
            if self.rate < self.last_decrease_rate && capacity / 9.0 < available {
                available = capacity / 9.0;
            }
        }
        let inc = increase_per_syn(available, mss);
        // period' = period × SYN / (period × inc + SYN), i.e. rate' = rate + inc / SYN.
        self.set_rate(self.rate + inc / SYN.as_secs_f64());
    }

    /// One rate-control step, at most once per SYN.
    fn rate_control(&mut self, now: Instant, app_limited: bool) {
        match self.last_rc {
            None => {
                self.last_rc = Some(now);
                return;
            }
            Some(last) if now < last => {
                // Time stepped back: restart the SYN clock from here.
                self.last_rc = Some(now);
                return;
            }
            Some(last) if now - last < SYN => return,
            Some(_) => self.last_rc = Some(now),
        }
        let acked = std::mem::take(&mut self.acked_since_rc);
        if self.slow_start {
            //= udt4 ccc.cpp CUDTCC::onACK
            //# m_dCWndSize += CSeqNo::seqlen(m_iLastAck, ack);
            self.cwnd += acked as f64 / self.mss as f64;
            if self.cwnd > self.max_window_packets() {
                self.cwnd = self.max_window_packets();
                self.end_slow_start();
            }
            return;
        }
        if std::mem::take(&mut self.loss_since_rc) || app_limited {
            return;
        }
        self.increase();
    }

    /// Multiplies the period by 1.125 and marks packets sent so far as the old epoch's.
    fn decrease(&mut self, largest_lost_sent: Instant) {
        self.set_rate(self.rate / DECREASE_FACTOR);
        self.last_decrease = Some(
            self.last_sent
                .map_or(largest_lost_sent, |t| t.max(largest_lost_sent)),
        );
        self.congestion_events += 1;
    }

    /// udt4 `CUDTCC::onLoss` for one NAK.
    fn on_nak(&mut self, largest_lost_sent: Instant) {
        self.loss_since_rc = true;
        let new_epoch = self.last_decrease.is_none_or(|t| largest_lost_sent > t);
        if new_epoch {
            self.last_decrease_rate = self.rate;
            //= udt4 ccc.cpp CUDTCC::onLoss
            //# m_iAvgNAKNum = (int)ceil(m_iAvgNAKNum * 0.875 + m_iNAKCount * 0.125);
            let avg = (f64::from(self.avg_naks) * 0.875 + f64::from(self.naks) * 0.125).ceil();
            self.avg_naks = avg as u32;
            self.naks = 1;
            self.decreases = 1;
            // udt4 seeds rand() with LastDecSeq, the sequence number at the decrease.
            let seed = self.packets_sent.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ self.config.seed
                ^ (u64::from(self.path_id) << 32);
            let draw = (f64::from(self.avg_naks) * uniform(seed)).ceil();
            self.dec_random = (draw as u32).max(1);
            self.decrease(largest_lost_sent);
            return;
        }
        if self
            .slow_start_end
            .is_some_and(|end| largest_lost_sent <= end)
        {
            // The rest of the slow-start overshoot (see the module doc): no extra decreases.
            self.non_congestive_losses += 1;
            return;
        }
        // `(m_iDecCount ++ < 5) && (0 == (++ m_iNAKCount % m_iDecRandom))`: past the fifth
        // check, NAKs are no longer counted either.
        let check = self.decreases < MAX_DECREASES_PER_EPOCH;
        self.decreases = self.decreases.saturating_add(1);
        if check {
            self.naks = self.naks.saturating_add(1);
            if self.naks % self.dec_random.max(1) == 0 {
                self.decrease(largest_lost_sent);
                return;
            }
        }
        self.non_congestive_losses += 1;
    }
}

impl Controller for Udt {
    fn on_sent(&mut self, now: Instant, bytes: u64, bytes_in_flight: u64) {
        let _ = (bytes, bytes_in_flight);
        self.packets_sent = self.packets_sent.wrapping_add(1);
        self.last_sent = Some(self.last_sent.map_or(now, |t| t.max(now)));
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        let _ = sent;
        self.srtt = rtt.smoothed();
        // Slow start grows by what the network took for a sender that filled its window:
        // a packet sent while the application had nothing more says nothing of the path
        // (RFC 9002 §7.8), and counting it let an idle-ish sender's window climb to the
        // maximum, to be spent in one burst at twice the window per RTT later.
        if !app_limited {
            self.acked_since_rc = self.acked_since_rc.saturating_add(bytes);
        }
        self.delivery.on_ack(now, bytes, self.srtt.max(SYN));
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        bytes_in_flight: u64,
        app_limited: bool,
        largest_acked_sent: Option<Instant>,
    ) {
        let _ = (bytes_in_flight, largest_acked_sent);
        self.delivery.expire(now);
        self.rate_control(now, app_limited);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        largest_lost_sent: Instant,
        lost_bytes: u64,
        persistent_congestion: bool,
        rtt: &RttEstimator,
    ) {
        let _ = (now, lost_bytes);
        self.srtt = rtt.smoothed();
        if persistent_congestion {
            self.persistent_congestion_events += 1;
        }
        //= udt4 ccc.cpp CUDTCC::onLoss
        //# //Slow Start stopped, if it hasn't yet
        self.end_slow_start();
        self.on_nak(largest_lost_sent);
    }

    fn on_rate_estimate(&mut self, now: Instant, bytes_per_second: u64, rtt: &RttEstimator) {
        let _ = (now, rtt);
        if bytes_per_second == 0 {
            return;
        }
        let sample = bytes_per_second as f64;
        //= udt4 core.cpp (ACK processing)
        //# m_iBandwidth = (m_iBandwidth * 7 + bandwidth) >> 3;
        self.capacity = Some(match self.capacity {
            Some(old) => (old * 7.0 + sample) / 8.0,
            None => sample,
        });
    }

    fn on_mtu_update(&mut self, max_datagram_size: u16) {
        let new = u64::from(max_datagram_size).max(1);
        // Keep the byte rate and byte window; the packet counts change.
        let scale = self.mss as f64 / new as f64;
        self.cwnd = (self.cwnd * scale).max(1.0);
        self.set_rate(self.rate * scale);
        self.mss = new;
    }

    fn window(&self) -> u64 {
        let mss = self.mss as f64;
        let max = self.max_window_packets() * mss;
        let window = if self.slow_start {
            self.cwnd * mss
        } else {
            let cap = 2.0 * self.rate * mss * (self.srtt + SYN).as_secs_f64();
            cap.max(f64::from(INITIAL_WINDOW_PACKETS) * mss)
        };
        // Float-to-integer `as` saturates (and maps NaN to 0, which `max` then lifts).
        (window.min(max) as u64).max(self.mss)
    }

    fn pacing_rate(&self, rtt: &RttEstimator) -> Option<u64> {
        let rate = if self.slow_start {
            let srtt = rtt.smoothed().as_secs_f64().max(1e-6);
            2.0 * self.cwnd * self.mss as f64 / srtt
        } else {
            self.rate * self.mss as f64
        };
        Some((rate as u64).max(1))
    }

    fn initial_window(&self) -> u64 {
        u64::from(self.config.initial_window_packets.max(1)).saturating_mul(self.mss)
    }

    fn metrics(&self) -> Metrics {
        let mut metrics = Metrics::new(self.window());
        let rtt = RttEstimator::new(self.srtt);
        metrics.pacing_rate = self.pacing_rate(&rtt);
        metrics.in_slow_start = self.slow_start;
        metrics.congestion_events = self.congestion_events;
        metrics.non_congestive_losses = self.non_congestive_losses;
        metrics.persistent_congestion_events = self.persistent_congestion_events;
        metrics
    }

    fn name(&self) -> &'static str {
        "udt"
    }
}

/// Configuration and factory of [`Udt`] controllers.
///
/// `Arc::new(UdtConfig::default())` as a connection's congestion factory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdtConfig {
    initial_window_packets: u32,
    max_window_packets: u32,
    seed: u64,
}

impl Default for UdtConfig {
    /// PaUDT's 16-datagram initial window, udt4's 25 600-datagram maximum window, seed 0.
    fn default() -> Self {
        Self {
            initial_window_packets: INITIAL_WINDOW_PACKETS,
            max_window_packets: DEFAULT_MAX_WINDOW_PACKETS,
            seed: 0,
        }
    }
}

impl UdtConfig {
    /// Slow-start window at the start, in datagrams (default 16, at least 1).
    pub fn initial_window_packets(mut self, packets: u32) -> Self {
        self.initial_window_packets = packets.max(1);
        self
    }

    /// Largest window in datagrams (default 25 600); slow start ends above it.
    pub fn max_window_packets(mut self, packets: u32) -> Self {
        self.max_window_packets = packets.max(INITIAL_WINDOW_PACKETS);
        self
    }

    /// Mixed into the epochs' random draws, so that flows of one host desynchronise even if
    /// they send alike.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The configured initial window in datagrams.
    pub fn get_initial_window_packets(&self) -> u32 {
        self.initial_window_packets
    }

    /// The configured maximum window in datagrams.
    pub fn get_max_window_packets(&self) -> u32 {
        self.max_window_packets
    }
}

impl ControllerFactory for UdtConfig {
    fn build(&self, now: Instant, info: &PathInfo) -> Box<dyn Controller> {
        Box::new(Udt::new(self, now, info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::testing::{epoch, rtt_with};

    const MSS: u64 = 1200;
    const MS: Duration = Duration::from_millis(1);

    fn udt() -> Udt {
        Udt::new(
            &UdtConfig::default(),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        )
    }

    /// Acknowledges `packets` packets at `now` as one ACK frame.
    fn ack(cc: &mut Udt, now: Instant, packets: u64, rtt: &RttEstimator) {
        for _ in 0..packets {
            cc.on_ack(now, now - rtt.smoothed(), MSS, false, rtt);
        }
        cc.on_end_acks(now, 0, false, Some(now - rtt.smoothed()));
    }

    /// A controller out of slow start at `rate` packets/s with capacity `capacity` packets/s
    /// (from an outside estimate), in a fresh epoch-free state.
    fn in_rate_phase(rate: f64, capacity: f64) -> Udt {
        let mut cc = udt();
        let rtt = rtt_with(40 * MS, 40 * MS);
        cc.on_rate_estimate(epoch(), (capacity * MSS as f64) as u64, &rtt);
        cc.slow_start = false;
        cc.rate = rate;
        cc
    }

    #[test]
    fn increase_formula_values() {
        // B − C in bits/s → 10^ceil(log10) × 1.5e-6 / MSS packets per SYN (the paper's table
        // for 1500-byte packets: 0.1 packet per SYN for 10–100 Mbit/s of headroom, 1 for
        // 100 Mbit/s–1 Gbit/s).
        let per_packet = |bits: f64| increase_per_syn(bits / (1500.0 * 8.0), 1500.0);
        assert!((per_packet(50e6) - 0.1).abs() < 1e-12);
        assert!((per_packet(500e6) - 1.0).abs() < 1e-12);
        assert!((per_packet(5e9) - 10.0).abs() < 1e-9);
        // 10 Mbit/s exactly is a power of ten: ceil(7) = 7.
        assert!((per_packet(10e6) - 0.01).abs() < 1e-12);
        // Below 1/MSS, and for no or negative headroom, the floor 1/MSS.
        assert_eq!(per_packet(1000.0), 1.0 / 1500.0);
        assert_eq!(increase_per_syn(0.0, 1500.0), 1.0 / 1500.0);
        assert_eq!(increase_per_syn(-5.0, 1500.0), 1.0 / 1500.0);
        assert_eq!(increase_per_syn(f64::NAN, 0.0), 1.0);
    }

    #[test]
    fn rate_increases_once_per_syn_by_the_formula() {
        // B = 5208 packets/s (50 Mbit/s of 1200-byte packets), C = 2000. Before any decrease
        // the rate is below `last_decrease_rate` (infinite), so udt4 caps B − C at B / 9 =
        // 578.7 packets/s = 5.6 Mbit/s → 10^7 × 1.5e-6 / 1200 = 0.0125 packets per SYN, i.e.
        // +1.25 packets/s per step. Uncapped, B − C = 30.8 Mbit/s → 10^8 → 0.125 packets per
        // SYN, +12.5 packets/s.
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = in_rate_phase(2000.0, 5208.0);
        let t = epoch();
        ack(&mut cc, t, 2, &rtt);
        assert_eq!(
            cc.rate_packets(),
            2000.0,
            "first call only starts the SYN clock"
        );
        ack(&mut cc, t + 5 * MS, 2, &rtt);
        assert_eq!(cc.rate_packets(), 2000.0, "less than a SYN later");
        ack(&mut cc, t + 10 * MS, 2, &rtt);
        assert!(
            (cc.rate_packets() - 2001.25).abs() < 1e-9,
            "{}",
            cc.rate_packets()
        );
        // Above the rate of the last decrease the full headroom counts.
        cc.last_decrease_rate = 1000.0;
        ack(&mut cc, t + 20 * MS, 2, &rtt);
        assert!(
            (cc.rate_packets() - 2013.75).abs() < 1e-9,
            "{}",
            cc.rate_packets()
        );
        // App-limited steps do not grow the rate.
        cc.on_end_acks(t + 30 * MS, 0, true, None);
        assert!((cc.rate_packets() - 2013.75).abs() < 1e-9);
        // At or above the capacity: 1/MSS packets per SYN.
        let mut cc = in_rate_phase(6000.0, 5208.0);
        ack(&mut cc, t, 2, &rtt);
        ack(&mut cc, t + 10 * MS, 2, &rtt);
        let expected = 6000.0 + 1.0 / 1200.0 / 0.01;
        assert!((cc.rate_packets() - expected).abs() < 1e-9);
    }

    #[test]
    fn slow_start_grows_by_acked_packets_then_first_loss_starts_the_rate_phase() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = udt();
        assert_eq!(cc.window(), 16 * MSS);
        assert_eq!(cc.initial_window(), 16 * MSS);
        assert!(cc.in_slow_start());
        let mut t = epoch();
        ack(&mut cc, t, 0, &rtt);
        // 16 packets acknowledged over 40 ms, in four SYNs.
        for _ in 0..4 {
            t += SYN;
            ack(&mut cc, t, 4, &rtt);
        }
        assert_eq!(cc.window(), 32 * MSS);
        // Pacing at twice window / RTT in slow start.
        assert_eq!(cc.pacing_rate(&rtt), Some(2 * 32 * MSS * 25));
        for _ in 0..8 {
            t += SYN;
            ack(&mut cc, t, 8, &rtt);
        }
        assert_eq!(cc.window(), 96 * MSS);
        let delivered = cc.delivery.latest.expect("a delivery sample");
        // 8 packets per 10 ms.
        assert!((delivered - 800.0 * MSS as f64).abs() < 1.0, "{delivered}");
        cc.on_sent(t, MSS, MSS);
        cc.on_congestion_event(t + MS, t, MSS, false, &rtt);
        assert!(!cc.in_slow_start());
        // Rate = delivery rate, less the epoch's 1/9.
        assert!((cc.rate_packets() - 800.0 / 1.125).abs() < 1e-6);
        assert_eq!(cc.pacing_rate(&rtt), Some((800.0 / 1.125 * 1200.0) as u64));
        assert_eq!(cc.metrics().congestion_events, 1);
        assert!(!cc.metrics().in_slow_start);
        // Window: max(16, 2 × rate × (RTT + SYN)).
        let expected = 2.0 * 800.0 / 1.125 * 1200.0 * 0.05;
        assert!((cc.window() as f64 - expected).abs() <= 1.0);
        // No increase in the SYN after a loss.
        let rate = cc.rate_packets();
        ack(&mut cc, t + 20 * MS, 2, &rtt);
        assert_eq!(cc.rate_packets(), rate);
        ack(&mut cc, t + 30 * MS, 2, &rtt);
        assert!(cc.rate_packets() > rate);
    }

    #[test]
    fn slow_start_does_not_grow_on_what_an_application_limited_sender_sent() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = udt();
        let mut t = epoch();
        ack(&mut cc, t, 0, &rtt);
        for _ in 0..20 {
            t += SYN;
            // Packets sent while the application had nothing more to send.
            for _ in 0..4 {
                cc.on_ack(t, t - rtt.smoothed(), MSS, true, &rtt);
            }
            cc.on_end_acks(t, 0, true, Some(t - rtt.smoothed()));
        }
        assert_eq!(cc.window(), 16 * MSS, "no growth from app-limited ACKs");
        assert!(cc.in_slow_start());
        // The same ACKs from a sender that filled its window do grow it.
        t += SYN;
        ack(&mut cc, t, 4, &rtt);
        assert_eq!(cc.window(), 20 * MSS);
    }

    #[test]
    fn slow_start_ends_at_the_maximum_window() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = Udt::new(
            &UdtConfig::default().max_window_packets(40),
            epoch(),
            &PathInfo::new(MSS as u16, 40 * MS, 0),
        );
        let t = epoch();
        ack(&mut cc, t, 0, &rtt);
        ack(&mut cc, t + SYN, 30, &rtt);
        assert!(!cc.in_slow_start());
        assert!(cc.window() <= 40 * MSS);
    }

    #[test]
    fn one_decrease_per_epoch_plus_randomised_ones() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = in_rate_phase(1000.0, 5000.0);
        let t = epoch() + Duration::from_secs(1);
        cc.on_sent(t, MSS, MSS);
        // First NAK: new epoch, rate / 1.125, AvgNAKNum = 0 → DecRandom = 1.
        cc.on_congestion_event(t + 40 * MS, t, MSS, false, &rtt);
        assert!((cc.rate_packets() - 1000.0 / 1.125).abs() < 1e-9);
        assert_eq!(cc.dec_random(), 1);
        // Further NAKs of old packets in the same epoch: with DecRandom = 1 each decreases,
        // up to 5 decreases in all.
        for _ in 0..10 {
            cc.on_congestion_event(t + 41 * MS, t, MSS, false, &rtt);
        }
        let expected = 1000.0 / 1.125f64.powi(5);
        assert!(
            (cc.rate_packets() - expected).abs() < 1e-9,
            "{}",
            cc.rate_packets()
        );
        assert_eq!(cc.metrics().congestion_events, 5);
        assert_eq!(cc.metrics().non_congestive_losses, 6);
        // A packet sent after the last decrease opens the next epoch: AvgNAKNum =
        // ceil(0 × 0.875 + 5 × 0.125) = 1, so DecRandom = 1 again.
        let later = t + 100 * MS;
        cc.on_sent(later, MSS, MSS);
        cc.on_congestion_event(later + 40 * MS, later, MSS, false, &rtt);
        assert!((cc.rate_packets() - expected / 1.125).abs() < 1e-9);
        assert_eq!(cc.avg_naks, 1);
        assert_eq!(cc.metrics().congestion_events, 6);
    }

    #[test]
    fn dec_random_spreads_decreases_within_an_epoch() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = in_rate_phase(1000.0, 5000.0);
        // As if epochs had averaged 40 NAKs.
        cc.avg_naks = 40;
        cc.naks = 40;
        let t = epoch() + Duration::from_secs(1);
        cc.on_sent(t, MSS, MSS);
        cc.on_congestion_event(t + 40 * MS, t, MSS, false, &rtt);
        let d = cc.dec_random();
        assert!((1..=40).contains(&d), "{d}");
        // Only the 5 NAK checks after the first decrease count; a decrease happens on each
        // check whose NAK count is a multiple of DecRandom.
        for _ in 0..4 {
            cc.on_congestion_event(t + 41 * MS, t, MSS, false, &rtt);
        }
        let extra = (2..=5).filter(|n| n % d == 0).count() as i32;
        let expected = 1000.0 / 1.125f64.powi(1 + extra);
        assert!((cc.rate_packets() - expected).abs() < 1e-9);
        // The draw is deterministic: the same history gives the same DecRandom.
        let mut again = in_rate_phase(1000.0, 5000.0);
        again.avg_naks = 40;
        again.naks = 40;
        again.on_sent(t, MSS, MSS);
        again.on_congestion_event(t + 40 * MS, t, MSS, false, &rtt);
        assert_eq!(again.dec_random(), d);
    }

    #[test]
    fn capacity_comes_from_outside_or_from_delivery() {
        let rtt = rtt_with(40 * MS, 40 * MS);
        let mut cc = udt();
        assert_eq!(cc.capacity_packets(), None);
        let mut t = epoch();
        ack(&mut cc, t, 0, &rtt);
        for _ in 0..8 {
            t += SYN;
            ack(&mut cc, t, 10, &rtt);
        }
        // 10 packets per 10 ms.
        let b = cc.capacity_packets().expect("delivery sample");
        assert!((b - 1000.0).abs() < 1e-6, "{b}");
        // An outside estimate wins, then is smoothed with gain 1/8.
        cc.on_rate_estimate(t, 5000 * MSS, &rtt);
        assert!((cc.capacity_packets().unwrap_or(0.0) - 5000.0).abs() < 1e-9);
        cc.on_rate_estimate(t, 13_000 * MSS, &rtt);
        assert!((cc.capacity_packets().unwrap_or(0.0) - 6000.0).abs() < 1e-9);
        cc.on_rate_estimate(t, 0, &rtt);
        assert!((cc.capacity_packets().unwrap_or(0.0) - 6000.0).abs() < 1e-9);
    }

    #[test]
    fn window_is_at_least_sixteen_packets() {
        let cc = in_rate_phase(1.0, 5000.0);
        assert_eq!(cc.window(), 16 * MSS);
        let cc = in_rate_phase(10_000.0, 5000.0);
        // 2 × 10 000 × 1200 × (40 + 10) ms.
        assert_eq!(cc.window(), 1_200_000);
    }

    #[test]
    fn odd_call_sequences_do_not_panic() {
        let rtt = RttEstimator::new(Duration::ZERO);
        let mut cc = udt();
        let t = epoch() + Duration::from_secs(100);
        cc.on_end_acks(t, 0, false, None);
        cc.on_ack(t, t, 0, false, &rtt);
        cc.on_end_acks(t - Duration::from_secs(50), 0, false, None);
        cc.on_ack(t - Duration::from_secs(60), t, 0, true, &rtt);
        cc.on_congestion_event(t, t + Duration::from_secs(5), 0, true, &rtt);
        cc.on_congestion_event(t - Duration::from_secs(90), t, 0, false, &rtt);
        cc.on_mtu_update(0);
        cc.on_rate_estimate(t, u64::MAX, &rtt);
        cc.on_end_acks(t + Duration::from_secs(3600), 0, false, None);
        cc.on_end_acks(t + Duration::from_secs(7200), 0, false, None);
        cc.on_mtu_update(u16::MAX);
        cc.on_spurious_congestion_event();
        assert!(cc.window() >= 1);
        assert!(cc.pacing_rate(&rtt).is_some_and(|r| r > 0));
        assert_eq!(cc.name(), "udt");
        let _ = cc.metrics();
    }

    #[test]
    fn factory_and_name() {
        let cc = UdtConfig::default()
            .initial_window_packets(32)
            .build(epoch(), &PathInfo::default());
        assert_eq!(cc.name(), "udt");
        assert_eq!(cc.window(), 32 * 1200);
        assert!(cc.metrics().in_slow_start);
    }
}
