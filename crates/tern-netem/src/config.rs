//! What one emulated link does to the packets crossing it, per direction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tern_sim::{Fade, LinkConfig, LossModel, Outage};

use crate::shaper::{QueueLimit, RateModel};
use crate::trace::Trace;
use crate::units::{self, QueueSpec};
use crate::Error;

/// A direction of an emulated link. `Up` goes from the link's A side to its B side (client
/// towards server in the preset topologies), `Down` the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// A side → B side.
    Up,
    /// B side → A side.
    Down,
}

impl Direction {
    /// Both directions, `Up` first.
    pub const BOTH: [Direction; 2] = [Direction::Up, Direction::Down];

    /// `"up"` or `"down"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that shapes one direction of an emulated link.
///
/// Stage order (as in the simulator): `outage` (a packet arriving while dark is dropped before
/// the queue) → drop-tail queue drained by `rate` → `outage` again (a packet leaving the queue
/// while dark is dropped) → `loss`, then `fade` (a lost packet still used its share of the
/// capacity) → duplication → corruption → `delay` + `jitter` (order-preserving) or +
/// `reorder_delay` for the packets picked by `reorder`.
///
/// Sizes and rates count whole IP packets (headers included, no link-layer framing), as
/// mahimahi does.
#[derive(Clone, Debug)]
pub struct DirectionConfig {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per packet, never reordering.
    pub jitter: Duration,
    /// Probability that a packet is exempt from the in-order rule and gets `reorder_delay`.
    pub reorder: f64,
    /// Extra delay of reordered packets.
    pub reorder_delay: Duration,
    /// Random or Gilbert–Elliott loss.
    pub loss: LossModel,
    /// Scheduled dark windows, from the emulator's start (see [`tern_sim::Outage`]).
    pub outage: Option<Outage>,
    /// Time-based good/bad loss, on top of `loss` (see [`tern_sim::Fade`]).
    pub fade: Option<Fade>,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that one bit of a packet is flipped (the receiver's checksums then drop it).
    pub corrupt: f64,
    /// Constant rate, trace, or unlimited.
    pub rate: RateModel,
    /// Drop-tail limit.
    pub queue: QueueSpec,
    /// ECN: mark CE above a queue threshold, or bleach/rewrite the bits.
    pub ecn: crate::ecn::EcnRule,
    /// Whether the direction carries traffic (`false`: every packet is dropped).
    pub up: bool,
    /// Largest IP packet carried, in bytes (`mtu=9000`); larger ones are dropped and counted
    /// (`dropped_mtu`), silently, as a black hole does. `None`: no limit of the emulator's own.
    /// The veths of the topology and the TUN devices are given the largest MTU any direction
    /// asks for above 1 500, so that jumbo datagrams reach the emulator at all.
    pub mtu: Option<usize>,
    /// Seed of the random draws, mixed with the link's name and direction (so directions never
    /// share a sequence); `None` is seed 0. Runs with the same seeds draw the same losses.
    pub seed: Option<u64>,
    /// `router=ncr`: the F12 explicit-rate router (`tern_proto::router`) at the queue's
    /// entrance, lowering the Feedback Rate of tern packets (see [`crate::ncr`]). Its capacity
    /// is the direction's rate (a trace's rate over the last 100 ms), not `capacity_bps`.
    /// `None`: no router. Tuned by `ncr_alpha=`, `ncr_interval=`, `ncr_rtt=`, `ncr_phase=`,
    /// `ncr_cid=`.
    pub router: Option<tern_proto::router::RouterConfig>,
}

impl Default for DirectionConfig {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            loss: LossModel::None,
            outage: None,
            fade: None,
            duplicate: 0.0,
            corrupt: 0.0,
            rate: RateModel::Unlimited,
            queue: QueueSpec::Default,
            ecn: crate::ecn::EcnRule::Pass,
            up: true,
            mtu: None,
            seed: None,
            router: None,
        }
    }
}

/// Keys understood by [`DirectionConfig::set`], for help texts.
pub const KEYS: &str = "delay=20ms jitter=1ms rate=10mbit trace=FILE loss=1% \
ge=P_GB,P_BG[,LOSS_GOOD,LOSS_BAD] bursty=LOSS,MEAN_BURST outage=AT+FOR[/EVERY]|off \
fade=MEAN_GOOD,MEAN_BAD[,LOSS_BAD]|off queue=100kB|64pkt|50ms|unlimited reorder=P,DELAY duplicate=P corrupt=P ecn=30kB|20pkt|5ms|bleach|ect1|off mtu=9000|off seed=N up=true|false router=ncr|off \
ncr_alpha=0.98 ncr_interval=10ms ncr_rtt=100ms ncr_phase=0.25 ncr_cid=8";

impl DirectionConfig {
    /// A pass-through direction (no delay, no loss, unlimited rate).
    pub fn ideal() -> Self {
        Self::default()
    }

    /// Sets one knob from its textual form (see [`KEYS`]): e.g. `set("delay", "20ms")`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let pair = |v: &str| -> Result<Vec<String>, Error> {
            Ok(v.split([',', ':', '/'])
                .map(|s| s.trim().to_owned())
                .collect())
        };
        match key.trim() {
            "delay" => self.delay = units::parse_duration(value)?,
            "jitter" => self.jitter = units::parse_duration(value)?,
            "rate" => {
                self.rate = match value.trim() {
                    "unlimited" | "inf" | "none" => RateModel::Unlimited,
                    v => RateModel::Constant(units::parse_rate(v)?),
                }
            }
            "trace" => self.rate = RateModel::Trace(Arc::new(Trace::load(value.trim())?)),
            "loss" => self.loss = LossModel::Random(units::parse_probability(value)?),
            "ge" | "gilbert-elliott" | "gilbert" => {
                let parts = pair(value)?;
                let p = |i: usize, default: f64| -> Result<f64, Error> {
                    parts
                        .get(i)
                        .map(|s| units::parse_probability(s))
                        .unwrap_or(Ok(default))
                };
                if !(2..=4).contains(&parts.len()) {
                    return Err(Error::Parse(format!(
                        "ge={value}: want P_GOOD_TO_BAD,P_BAD_TO_GOOD[,LOSS_IN_GOOD,LOSS_IN_BAD]"
                    )));
                }
                self.loss = LossModel::GilbertElliott {
                    p_good_to_bad: p(0, 0.0)?,
                    p_bad_to_good: p(1, 1.0)?,
                    loss_in_good: p(2, 0.0)?,
                    loss_in_bad: p(3, 1.0)?,
                };
            }
            "bursty" => {
                let parts = pair(value)?;
                if parts.len() != 2 {
                    return Err(Error::Parse(format!(
                        "bursty={value}: want MEAN_LOSS,MEAN_BURST_PACKETS (e.g. 2%,5)"
                    )));
                }
                let burst: f64 = parts[1]
                    .parse()
                    .map_err(|_| Error::Parse(format!("bursty={value}: bad burst length")))?;
                self.loss = LossModel::bursty(units::parse_probability(&parts[0])?, burst);
            }
            "mtu" => {
                self.mtu = match value.trim() {
                    "off" | "none" | "unlimited" => None,
                    v => {
                        let mtu: usize = v
                            .parse()
                            .map_err(|_| Error::Parse(format!("mtu={value}: want bytes")))?;
                        if !(68..=65_535).contains(&mtu) {
                            return Err(Error::Parse(format!(
                                "mtu={value}: want 68 to 65535 bytes"
                            )));
                        }
                        Some(mtu)
                    }
                }
            }
            "outage" => self.outage = parse_outage(value)?,
            "fade" => self.fade = parse_fade(value)?,
            "queue" => self.queue = units::parse_queue(value)?,
            "reorder" => {
                let parts = pair(value)?;
                if parts.len() != 2 {
                    return Err(Error::Parse(format!(
                        "reorder={value}: want PROBABILITY,EXTRA_DELAY (e.g. 1%,5ms)"
                    )));
                }
                self.reorder = units::parse_probability(&parts[0])?;
                self.reorder_delay = units::parse_duration(&parts[1])?;
            }
            "ecn" => {
                self.ecn = match value.trim() {
                    "off" | "pass" | "none" => crate::ecn::EcnRule::Pass,
                    "bleach" => crate::ecn::EcnRule::Rewrite(0),
                    "ect1" => crate::ecn::EcnRule::Rewrite(0b01),
                    v => crate::ecn::EcnRule::Mark(units::parse_queue(v).map_err(|_| {
                        Error::Parse(format!(
                            "ecn={v}: want a marking threshold (30kB, 20pkt, 5ms), bleach, \
                             ect1 or off"
                        ))
                    })?),
                }
            }
            "duplicate" | "dup" => self.duplicate = units::parse_probability(value)?,
            "corrupt" => self.corrupt = units::parse_probability(value)?,
            "seed" => {
                self.seed = Some(
                    value
                        .trim()
                        .parse()
                        .map_err(|_| Error::Parse(format!("seed={value}: not a number")))?,
                )
            }
            "router" => {
                self.router = match value.trim() {
                    "ncr" | "on" => Some(self.router.take().unwrap_or_default()),
                    "off" | "none" => None,
                    v => return Err(Error::Parse(format!("router={v}: want ncr or off"))),
                }
            }
            // Tuning keys turn the router on (with the other constants at their defaults).
            "ncr_alpha" => {
                let alpha = units::parse_probability(value)?;
                if alpha <= 0.0 {
                    return Err(Error::Parse(format!(
                        "ncr_alpha={value}: want a target utilisation in (0, 1]"
                    )));
                }
                self.router
                    .get_or_insert_with(Default::default)
                    .target_utilisation = alpha;
            }
            "ncr_interval" => {
                let t = units::parse_duration(value)?;
                self.router.get_or_insert_with(Default::default).interval = t;
            }
            "ncr_rtt" => {
                let d = units::parse_duration(value)?;
                self.router.get_or_insert_with(Default::default).control_rtt = d;
            }
            "ncr_phase" => {
                let k: f64 = value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|k: &f64| k.is_finite() && *k >= 0.0)
                    .ok_or_else(|| Error::Parse(format!("ncr_phase={value}: want a gain ≥ 0")))?;
                self.router.get_or_insert_with(Default::default).phase_gain = k;
            }
            "ncr_cid" => {
                let len: usize = value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|l| *l <= tern_proto::wire::MAX_CID_LEN)
                    .ok_or_else(|| Error::Parse(format!("ncr_cid={value}: want 0 to 20 bytes")))?;
                self.router.get_or_insert_with(Default::default).cid_len = len;
            }
            "up" => {
                self.up = match value.trim() {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" => false,
                    v => return Err(Error::Parse(format!("up={v}: want true or false"))),
                }
            }
            other => {
                return Err(Error::Parse(format!(
                    "unknown link setting {other:?}; known: {KEYS}"
                )))
            }
        }
        Ok(())
    }

    /// Applies a list like `"delay=20ms,loss=1%"` or `"delay=20ms loss=1%"`. Values that
    /// contain commas (`ge=0.01,0.3`) keep them: a comma only starts a new setting when the
    /// text after it has an `=`.
    pub fn apply(&mut self, spec: &str) -> Result<(), Error> {
        for (key, value) in split_settings(spec)? {
            self.set(&key, &value)?;
        }
        Ok(())
    }

    /// The resolved drop-tail limit.
    pub fn queue_limit(&self) -> QueueLimit {
        QueueLimit::resolve(self.queue, self.rate.mean_bps())
    }

    /// The CE-marking threshold, resolved like the queue limit (unlimited without marking).
    pub fn ecn_mark_limit(&self) -> QueueLimit {
        match self.ecn {
            crate::ecn::EcnRule::Mark(spec) => QueueLimit::resolve(spec, self.rate.mean_bps()),
            _ => QueueLimit::UNLIMITED,
        }
    }

    /// The simulator link model for everything after the queue (its own rate stage unused).
    pub fn link_config(&self) -> LinkConfig {
        let mut link = LinkConfig::ideal()
            .with_delay(self.delay)
            .with_jitter(self.jitter)
            .with_reorder(self.reorder, self.reorder_delay)
            .with_loss(self.loss.clone())
            .with_duplicate(self.duplicate)
            .with_corrupt(self.corrupt);
        link.outage = self.outage;
        link.fade = self.fade;
        link
    }
}

/// `AT+FOR` (dark during `[AT, AT+FOR)`), `AT+FOR/EVERY` (and again every EVERY), or `off`.
fn parse_outage(value: &str) -> Result<Option<Outage>, Error> {
    let v = value.trim();
    if matches!(v, "off" | "none") {
        return Ok(None);
    }
    let want = || {
        Error::Parse(format!(
            "outage={value}: want AT+FOR or AT+FOR/EVERY (e.g. 5s+2s, 1s+500ms/10s) or off"
        ))
    };
    let (at, rest) = v.split_once('+').ok_or_else(want)?;
    let (length, every) = match rest.split_once('/') {
        Some((length, every)) => (length, Some(every)),
        None => (rest, None),
    };
    let duration = |s: &str| {
        units::parse_duration(s).map_err(|e| Error::Parse(format!("outage={value}: {e}")))
    };
    let (at, length) = (duration(at)?, duration(length)?);
    if length.is_zero() {
        return Err(Error::Parse(format!(
            "outage={value}: FOR is zero, the link would never be dark"
        )));
    }
    Ok(Some(match every {
        None => Outage::once(at, length),
        Some(every) => {
            let every = duration(every)?;
            if every <= length {
                return Err(Error::Parse(format!(
                    "outage={value}: EVERY must be longer than FOR, or the link never comes \
                     back (up=false takes a direction down for good)"
                )));
            }
            Outage::periodic(at, length, every)
        }
    }))
}

/// `MEAN_GOOD,MEAN_BAD[,LOSS_BAD]` (e.g. `2s,50ms` or `2s,50ms,80%`), or `off`.
fn parse_fade(value: &str) -> Result<Option<Fade>, Error> {
    let v = value.trim();
    if matches!(v, "off" | "none") {
        return Ok(None);
    }
    let parts: Vec<&str> = v.split(',').map(str::trim).collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(Error::Parse(format!(
            "fade={value}: want MEAN_GOOD,MEAN_BAD[,LOSS_BAD] (e.g. 2s,50ms or 2s,50ms,80%) or off"
        )));
    }
    let mean = |s: &str, what: &str| -> Result<std::time::Duration, Error> {
        let d = units::parse_duration(s).map_err(|e| Error::Parse(format!("fade={value}: {e}")))?;
        if d.is_zero() {
            return Err(Error::Parse(format!(
                "fade={value}: the mean {what} time must be more than zero"
            )));
        }
        Ok(d)
    };
    let fade = Fade::new(mean(parts[0], "good")?, mean(parts[1], "bad")?);
    Ok(Some(match parts.get(2) {
        Some(p) => fade.with_loss_in_bad(
            units::parse_probability(p).map_err(|e| Error::Parse(format!("fade={value}: {e}")))?,
        ),
        None => fade,
    }))
}

/// Splits `"a=1,b=2 c=x,y"` into `[(a,1),(b,2),(c,"x,y")]`.
pub(crate) fn split_settings(spec: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out: Vec<(String, String)> = Vec::new();
    for word in spec.split_whitespace() {
        for piece in word.split(',') {
            match piece.split_once('=') {
                Some((k, v)) => out.push((k.trim().to_owned(), v.trim().to_owned())),
                None => match out.last_mut() {
                    Some((_, v)) if !piece.is_empty() => {
                        v.push(',');
                        v.push_str(piece);
                    }
                    _ if piece.is_empty() => {}
                    _ => {
                        return Err(Error::Parse(format!(
                            "{piece:?} in {spec:?} is not KEY=VALUE; known keys: {KEYS}"
                        )))
                    }
                },
            }
        }
    }
    Ok(out)
}

impl fmt::Display for DirectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.up {
            return write!(f, "down (drops everything)");
        }
        write!(f, "delay {:?}", self.delay)?;
        if !self.jitter.is_zero() {
            write!(f, " jitter {:?}", self.jitter)?;
        }
        match &self.rate {
            RateModel::Unlimited => write!(f, " rate unlimited")?,
            RateModel::Constant(bps) => write!(f, " rate {}", units::format_rate(*bps as f64))?,
            RateModel::Trace(t) => write!(
                f,
                " trace {} (mean {}, period {:?})",
                t.source()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(inline)".into()),
                units::format_rate(t.mean_rate_bps()),
                t.period()
            )?,
        }
        let q = self.queue_limit();
        match (q.bytes, q.packets) {
            (Some(b), _) => write!(f, " queue {b} B")?,
            (None, Some(p)) => write!(f, " queue {p} pkt")?,
            (None, None) if !matches!(self.rate, RateModel::Unlimited) => {
                write!(f, " queue unlimited")?
            }
            (None, None) => {}
        }
        match &self.loss {
            LossModel::Random(p) if *p > 0.0 => write!(f, " loss {:.3} %", p * 100.0)?,
            LossModel::GilbertElliott { .. } => write!(
                f,
                " loss gilbert-elliott (mean {:.3} %)",
                self.loss.mean_loss() * 100.0
            )?,
            _ => {}
        }
        if let Some(o) = &self.outage {
            write!(f, " outage {:?}+{:?}", o.at, o.duration)?;
            if let Some(every) = o.every {
                write!(f, " every {every:?}")?;
            }
        }
        if let Some(fade) = &self.fade {
            write!(
                f,
                " fade good {:?} bad {:?} loss {:.3} % (bad {:.3} % of the time)",
                fade.mean_good,
                fade.mean_bad,
                fade.loss_in_bad * 100.0,
                fade.bad_fraction() * 100.0
            )?;
        }
        if let Some(mtu) = self.mtu {
            write!(f, " mtu {mtu} B")?;
        }
        if let Some(r) = &self.router {
            write!(
                f,
                " router ncr (α {} interval {:?} rtt {:?} phase {} cid {})",
                r.target_utilisation, r.interval, r.control_rtt, r.phase_gain, r.cid_len
            )?;
        }
        if self.reorder > 0.0 {
            write!(
                f,
                " reorder {:.3} % +{:?}",
                self.reorder * 100.0,
                self.reorder_delay
            )?;
        }
        if self.duplicate > 0.0 {
            write!(f, " duplicate {:.3} %", self.duplicate * 100.0)?;
        }
        if self.corrupt > 0.0 {
            write!(f, " corrupt {:.3} %", self.corrupt * 100.0)?;
        }
        Ok(())
    }
}

/// Both directions of one emulated link.
#[derive(Clone, Debug, Default)]
pub struct DuplexConfig {
    /// A side → B side.
    pub up: DirectionConfig,
    /// B side → A side.
    pub down: DirectionConfig,
}

impl DuplexConfig {
    /// The same settings both ways.
    pub fn symmetric(config: DirectionConfig) -> Self {
        Self {
            up: config.clone(),
            down: config,
        }
    }

    /// One direction.
    pub fn get(&self, dir: Direction) -> &DirectionConfig {
        match dir {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        }
    }

    /// One direction, mutably.
    pub fn get_mut(&mut self, dir: Direction) -> &mut DirectionConfig {
        match dir {
            Direction::Up => &mut self.up,
            Direction::Down => &mut self.down,
        }
    }
}

/// What every emulated link of a topology does: a default for all links, per-link overrides,
/// and whether to record queue-length traces.
#[derive(Clone, Debug)]
pub struct EmulationConfig {
    /// Used for every link not in `links`.
    pub default: DuplexConfig,
    /// Per-link settings, by link name.
    pub links: std::collections::BTreeMap<String, DuplexConfig>,
    /// Record the queue length on every enqueue and departure.
    pub queue_trace: bool,
    /// Run the forwarder threads in the real-time scheduling class (default), so that busy
    /// processes on the machine do not add scheduler delays to the emulated links.
    pub realtime: bool,
}

impl Default for EmulationConfig {
    fn default() -> Self {
        Self {
            default: DuplexConfig::default(),
            links: std::collections::BTreeMap::new(),
            queue_trace: false,
            realtime: true,
        }
    }
}

impl EmulationConfig {
    /// The largest `mtu` any direction of any link asks for.
    pub fn max_mtu(&self) -> Option<usize> {
        std::iter::once(&self.default)
            .chain(self.links.values())
            .flat_map(|d| [d.up.mtu, d.down.mtu])
            .flatten()
            .max()
    }

    /// The same settings on every link.
    pub fn uniform(config: DuplexConfig) -> Self {
        Self {
            default: config,
            ..Self::default()
        }
    }

    /// Overrides one link.
    #[must_use]
    pub fn with_link(mut self, link: &str, config: DuplexConfig) -> Self {
        self.links.insert(link.to_owned(), config);
        self
    }

    /// Turns the queue-length trace on or off.
    #[must_use]
    pub fn with_queue_trace(mut self, enabled: bool) -> Self {
        self.queue_trace = enabled;
        self
    }

    /// The settings of one direction of one link.
    pub fn get(&self, link: &str, dir: Direction) -> &DirectionConfig {
        self.links.get(link).unwrap_or(&self.default).get(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        let mut c = DirectionConfig::default();
        c.apply("delay=20ms,jitter=1ms rate=10mbit loss=1% queue=64pkt")
            .unwrap();
        assert_eq!(c.delay, Duration::from_millis(20));
        assert_eq!(c.jitter, Duration::from_millis(1));
        assert!(matches!(c.rate, RateModel::Constant(10_000_000)));
        assert_eq!(c.loss, LossModel::Random(0.01));
        assert_eq!(c.queue_limit().packets, Some(64));
        c.apply("ge=1%,30%").unwrap();
        assert!((c.loss.mean_loss() - 0.01 / 0.31).abs() < 1e-9);
        c.apply("reorder=2%,5ms,dup=0.1%").unwrap();
        assert_eq!(c.reorder, 0.02);
        assert_eq!(c.reorder_delay, Duration::from_millis(5));
        assert_eq!(c.duplicate, 0.001);
        assert!(c.apply("colour=blue").is_err());
        assert!(c.apply("delay").is_err());
        assert!(c.apply("trace=/nonexistent/file").is_err());
        let text = c.to_string();
        assert!(text.contains("rate 10.00 Mbit/s"), "{text}");
        assert_eq!(c.mtu, None);
        c.apply("mtu=9000").unwrap();
        assert_eq!(c.mtu, Some(9000));
        assert!(c.to_string().contains("mtu 9000 B"));
        assert!(c.apply("mtu=20").is_err());
        assert!(c.apply("mtu=big").is_err());
        c.apply("mtu=off").unwrap();
        assert_eq!(c.mtu, None);
    }

    #[test]
    fn link_config_has_no_rate_stage() {
        let mut c = DirectionConfig::default();
        c.apply("delay=5ms,rate=1mbit,loss=2%").unwrap();
        let l = c.link_config();
        assert_eq!(l.rate_bps, None);
        assert_eq!(l.delay, Duration::from_millis(5));
        assert_eq!(l.loss, LossModel::Random(0.02));
    }

    #[test]
    fn outage_settings_parse() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let mut c = DirectionConfig::default();
        c.apply("delay=10ms outage=5s+2s").unwrap();
        assert_eq!(c.outage, Some(Outage::once(s(5), s(2))));
        c.apply("outage=1.5s+500ms/10s,loss=1%").unwrap();
        assert_eq!(c.outage, Some(Outage::periodic(ms(1500), ms(500), s(10))));
        assert_eq!(c.loss, LossModel::Random(0.01));
        let text = c.to_string();
        assert!(text.contains("outage 1.5s+500ms every 10s"), "{text}");
        assert_eq!(c.link_config().outage, c.outage);
        c.apply("outage=off").unwrap();
        assert_eq!(c.outage, None);
        let err = |spec: &str| {
            DirectionConfig::default()
                .apply(spec)
                .unwrap_err()
                .to_string()
        };
        assert!(
            err("outage=5s").contains("want AT+FOR"),
            "{}",
            err("outage=5s")
        );
        assert!(err("outage=5s+2parsecs").contains("bad duration \"2parsecs\""));
        assert!(err("outage=5s+0s").contains("FOR is zero"));
        assert!(err("outage=5s+2s/2s").contains("EVERY must be longer than FOR"));
        assert!(err("outage=5s+2s/").contains("bad duration"));
    }

    #[test]
    fn fade_settings_parse() {
        let ms = Duration::from_millis;
        let mut c = DirectionConfig::default();
        c.apply("fade=2s,50ms delay=5ms").unwrap();
        assert_eq!(c.fade, Some(Fade::new(ms(2000), ms(50))));
        assert_eq!(c.delay, ms(5));
        c.apply("fade=2s,50ms,80%,loss=0.1%").unwrap();
        assert_eq!(
            c.fade,
            Some(Fade::new(ms(2000), ms(50)).with_loss_in_bad(0.8))
        );
        assert_eq!(c.loss, LossModel::Random(0.001), "fade composes with loss");
        let text = c.to_string();
        assert!(
            text.contains("fade good 2s bad 50ms loss 80.000 %"),
            "{text}"
        );
        assert_eq!(c.link_config().fade, c.fade);
        c.apply("fade=off").unwrap();
        assert_eq!(c.fade, None);
        let err = |spec: &str| {
            DirectionConfig::default()
                .apply(spec)
                .unwrap_err()
                .to_string()
        };
        assert!(err("fade=2s").contains("want MEAN_GOOD,MEAN_BAD"));
        assert!(err("fade=2s,50ms,1,2").contains("want MEAN_GOOD,MEAN_BAD"));
        assert!(err("fade=2s,0ms").contains("mean bad time must be more than zero"));
        assert!(err("fade=0,50ms").contains("mean good time must be more than zero"));
        assert!(err("fade=2s,50ms,150%").contains("probability"));
        assert!(err("fade=soon,50ms").contains("bad duration"));
    }
}
