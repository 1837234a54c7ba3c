//! Paths of a connection (PROTOCOL.md §13): opening one per (local address, peer address)
//! pair at once, validating each (challenge/response) before it carries data, following a
//! peer that changed address, and moving data off a path that stopped answering.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use rand::RngCore;

use super::Connection;
use crate::event::Event;
use crate::path::{Path, PathState, MAX_CHALLENGES};
use crate::recovery::SentPacket;
use crate::Side;

/// Probes a dead path keeps in flight at most (two per probe timeout: about a minute's worth
/// at the 2 s probe interval).
const MAX_DEAD_PATH_PROBES: usize = 64;

/// Peer addresses a connection keeps (advertised ones, and as many withdrawn ones).
const MAX_PEER_ADDRESSES: usize = 16;

impl Connection {
    /// Most paths this connection may hold.
    fn path_limit(&self) -> usize {
        self.config.max_paths.clamp(1, crate::path::MAX_PATHS)
    }

    /// A new path, not yet validated, with a challenge to send. `ours`: we chose its
    /// addresses (no amplification limit); otherwise a datagram from the peer opened it.
    fn add_path(
        &mut self,
        now: Instant,
        id: u32,
        remote: SocketAddr,
        local: Option<IpAddr>,
        ours: bool,
    ) {
        // Each path searches its own datagram size from the negotiated one (F14).
        let mtu = self.negotiated_udp_payload();
        let mut path = Path::new(
            now,
            id,
            remote,
            mtu,
            &self.config,
            self.config.congestion.as_ref(),
        );
        path.local = local;
        path.limited = !ours;
        path.set_expected_rate(self.expected_rate);
        if ours {
            // The client chose this (local, remote) pair: its datagrams leave from there.
            path.source = local;
        }
        self.paths.push(path);
        self.init_pmtu(self.paths.len() - 1, mtu);
        self.start_validation(self.paths.len() - 1);
        tracing::debug!(id, %remote, ?local, "path opened");
        self.events.push_back(Event::PathOpened { id, remote });
    }

    /// Starts (or restarts) validating a path: a fresh challenge goes out on it.
    fn start_validation(&mut self, index: usize) {
        self.paths[index].validated = false;
        self.send_challenge(index);
    }

    /// Queues a fresh challenge on a path (padded to 1 200 bytes when it leaves).
    fn send_challenge(&mut self, index: usize) {
        let mut data = [0u8; 8];
        let seed = self.path_seed;
        self.path_rng
            .get_or_insert_with(|| Box::new(rand::SeedableRng::from_seed(seed)))
            .fill_bytes(&mut data);
        let path = &mut self.paths[index];
        path.challenge = Some(data);
        path.challenges_sent = 0;
        path.challenge_sent_at = None;
        path.challenge_pending = true;
    }

    /// Client: opens a path for every (local address, peer address) pair of the same family
    /// that has none yet, all at once (Viscous), up to the path limit. Called when the
    /// handshake completes and when the peer advertises an address.
    pub(crate) fn open_paths(&mut self, now: Instant) {
        if self.side != Side::Client || !self.is_established() {
            return;
        }
        self.paths_opened = true;
        let first = &self.paths[0];
        let mut locals: Vec<Option<IpAddr>> = vec![first.local];
        for ip in &self.local_ips {
            if !locals.contains(&Some(*ip)) {
                locals.push(Some(*ip));
            }
        }
        let mut remotes = vec![first.remote];
        for (_, addr) in &self.peer_addresses {
            if !remotes.contains(addr) {
                remotes.push(*addr);
            }
        }
        for remote in remotes {
            for local in &locals {
                if self.paths.len() >= self.path_limit() {
                    return;
                }
                if local.is_some_and(|l| l.is_ipv4() != remote.is_ipv4()) {
                    continue;
                }
                let covered = self.paths.iter().any(|p| {
                    p.remote == remote
                        && (p.local == *local
                            // A path whose local address is unknown may be any of ours.
                            || p.local.is_none())
                });
                if covered || local.is_none() {
                    continue;
                }
                let id = self.paths.iter().map(|p| p.id).max().unwrap_or(0) + 1;
                self.add_path(now, id, remote, *local, true);
            }
        }
    }

    /// An authenticated packet arrived on path `id` from `remote` to `local`: finds its path,
    /// or opens it when the peer started a new one. `None`: the packet is dropped (too many
    /// paths). Only the path's newest packet so far (`newest`) moves it to another address
    /// (RFC 9000 §9.3): a packet the network held back from before a move would otherwise
    /// move it back, restarting its congestion state and validation twice.
    pub(crate) fn path_for_packet(
        &mut self,
        now: Instant,
        id: u32,
        remote: SocketAddr,
        local: Option<IpAddr>,
        newest: bool,
    ) -> Option<usize> {
        let index = match self.path_index(id) {
            Some(i) => i,
            None => {
                if self.paths.len() >= self.path_limit() || !self.is_established() {
                    return None;
                }
                self.add_path(now, id, remote, local, false);
                self.paths.len() - 1
            }
        };
        let path = &mut self.paths[index];
        if path.local.is_none() {
            path.local = local;
        }
        if path.remote != remote && newest {
            self.on_peer_address_changed(now, index, remote);
        }
        Some(index)
    }

    /// Server: a copy of the client's Initial arrived from `remote`. If the handshake is not
    /// confirmed and the address is new, the client moved before it heard our answer: the
    /// handshake's path follows it (revalidated, within the 3× limit), so the answer reaches
    /// the client instead of timing out at its old address.
    pub(crate) fn on_initial_from(&mut self, now: Instant, remote: SocketAddr) {
        if self.side == Side::Server && !self.confirmed && self.paths[0].remote != remote {
            self.on_peer_address_changed(now, 0, remote);
        }
    }

    /// The peer now sends from another address on this path. The path follows it but sends
    /// at most 3× what it receives there until the new address answers a challenge, so a
    /// spoofed source address cannot turn the connection into an amplifier. A new IP address
    /// is a new network path: its RTT and congestion state start afresh; a new port alone
    /// (NAT rebinding) keeps them.
    fn on_peer_address_changed(&mut self, now: Instant, index: usize, remote: SocketAddr) {
        let config = self.config.clone();
        let path = &mut self.paths[index];
        tracing::debug!(id = path.id, old = %path.remote, new = %remote, "peer address changed");
        let mut lost = Vec::new();
        if path.remote.ip() != remote.ip() {
            // A new network path. Packet numbers and the replay window stay; what was in
            // flight to the old address is sent again at once (not counted as congestion
            // against the new path's controller).
            path.restart_network_state(now, &config);
            lost = path.sent.abandon(now, &path.rtt);
        }
        path.remote = remote;
        path.limited = true;
        path.bytes_received = 0;
        path.bytes_sent = 0;
        let id = path.id;
        self.requeue_moved(lost);
        self.start_validation(index);
        self.events
            .push_back(Event::PeerAddressChanged { id, remote });
    }

    /// A PathResponse arrived: the path whose challenge it answers is validated (a response
    /// may come back on any path).
    pub(crate) fn on_path_response(&mut self, now: Instant, data: [u8; 8]) {
        let Some(path) = self.paths.iter_mut().find(|p| p.challenge == Some(data)) else {
            return;
        };
        path.challenge = None;
        path.challenge_pending = false;
        path.validated = true;
        let id = path.id;
        if path.state == PathState::Dead {
            path.state = path.wanted;
        }
        tracing::debug!(id, "path validated");
        self.events.push_back(Event::PathValidated { id });
        self.abandon_deferred(now);
    }

    /// No response to the path's challenge a probe timeout after it left (the challenge or
    /// its response was lost, even if the packet that carried the challenge was
    /// acknowledged): another challenge; after `MAX_CHALLENGES` the path also counts as dead.
    pub(crate) fn on_challenge_unanswered(&mut self, index: usize) {
        let path = &mut self.paths[index];
        path.challenge_sent_at = None;
        if path.abandoned() {
            return;
        }
        // Challenged again, backing off to the probe interval, however long it stays silent:
        // after a few tries it counts as dead, but it may be the path that comes back.
        path.challenge_pending = true;
        if path.challenges_sent >= MAX_CHALLENGES && path.state != PathState::Dead {
            path.state = PathState::Dead;
            let id = path.id;
            self.events.push_back(Event::PathDead { id });
        }
    }

    /// A packet on this path was acknowledged: a dead path is alive again.
    pub(crate) fn on_path_answered(&mut self, now: Instant, index: usize) {
        let path = &mut self.paths[index];
        if path.state == PathState::Dead && path.validated {
            path.state = path.wanted;
            let id = path.id;
            tracing::debug!(id, "path answers again");
            self.events.push_back(Event::PathAlive { id });
            self.abandon_deferred(now);
        }
    }

    /// Abandons the paths the peer gave up while each was the last that could carry data,
    /// now that another can (a path validated or came back).
    fn abandon_deferred(&mut self, now: Instant) {
        for i in 0..self.paths.len() {
            if self.paths[i].abandon_deferred && self.has_other_path(i) {
                self.paths[i].abandon_deferred = false;
                if !self.paths[i].abandoned() {
                    self.apply_path_state(now, i, PathState::Abandoned, true);
                }
            }
        }
    }

    /// A probe timeout fired on a path of a multipath connection. If other paths can carry
    /// its data, the path is declared dead and everything in flight on it is queued again
    /// for them at once (instead of waiting for it); returns whether that happened. A path
    /// that never answered its challenges is given up the same way.
    pub(crate) fn on_path_silent(&mut self, now: Instant, index: usize) -> bool {
        let path = &mut self.paths[index];
        if path.abandoned() {
            path.probes = 0;
            path.sent.abandon(now, &path.rtt);
            return true;
        }
        if !path.validated && path.challenge.is_some() {
            // The challenge (or its answer) was lost: the next challenge is the probe, until
            // the path is given up. What was in flight on it (sent before its address
            // changed, or within the 3× limit since) goes to any path again.
            path.probes = 0;
            let moved = path.sent.abandon(now, &path.rtt);
            // A path that never answered is dead after a few challenges, but still challenged
            // (backing off to the probe interval): it may be the one that comes back.
            path.challenge_pending = true;
            if path.challenges_sent >= MAX_CHALLENGES && path.state != PathState::Dead {
                path.state = PathState::Dead;
                let id = path.id;
                self.events.push_back(Event::PathDead { id });
            }
            self.pmtu_on_abandoned(index, &moved);
            self.requeue_moved(moved);
            return true;
        }
        let others = self
            .paths
            .iter()
            .enumerate()
            .any(|(i, p)| i != index && p.usable());
        if !others {
            return false;
        }
        let path = &mut self.paths[index];
        let probes = || {
            path.sent
                .packets
                .values()
                .filter(|p| p.ack_eliciting)
                .count()
        };
        if path.state == PathState::Dead && probes() < MAX_DEAD_PATH_PROBES {
            // Already dead: what is in flight on it are the probes asking whether it is
            // back. Left there, an answer slower than the probe timeout is an acknowledgement
            // that revives the path at once (taking them off at every timeout cost 5–7 % of
            // `multipath --quick`'s unequal goodput, 0.93–0.95 of MPTCP's against 1.02, and
            // so did a bound of 8); beyond the bound they are taken off, so that hours of
            // silence do not pile them up.
            return true;
        }
        let moved = path.sent.abandon(now, &path.rtt);
        self.pmtu_on_abandoned(index, &moved);
        let path = &mut self.paths[index];
        if path.state != PathState::Dead {
            path.state = PathState::Dead;
            let id = path.id;
            tracing::debug!(id, moved = moved.len(), "path dead");
            self.events.push_back(Event::PathDead { id });
        }
        self.requeue_moved(moved);
        // The probes owed on it ask whether it is back (Pings: its data went elsewhere).
        true
    }

    /// Queues the frames of packets taken off a path (not redundant copies) again, for
    /// whichever path the scheduler picks, and counts them as rerouted.
    fn requeue_moved(&mut self, moved: Vec<(u64, SentPacket)>) {
        for (_, p) in moved.into_iter().filter(|(_, p)| !p.copy) {
            self.stats.packets_rerouted += 1;
            self.requeue(&p.frames, false);
        }
    }

    /// One of our own addresses changed (a new lease, a new roadside unit; every address may
    /// change at once): the paths that used `old` now send from `new`. Their RTT and
    /// congestion state start afresh (a new address is a new network path); the peer sees
    /// the new address, follows it and revalidates it (§5.4). Returns how many paths moved.
    pub fn local_ip_changed(&mut self, now: Instant, old: IpAddr, new: IpAddr) -> usize {
        let config = self.config.clone();
        // Paths opened later leave from where we are now, not from where we were.
        for ip in &mut self.local_ips {
            if *ip == old {
                *ip = new;
            }
        }
        let mut moved = 0;
        let mut requeue = Vec::new();
        let mut moved_paths = Vec::new();
        for (i, path) in self.paths.iter_mut().enumerate() {
            if path.local != Some(old) && path.source != Some(old) {
                continue;
            }
            if path.source == Some(old) {
                path.source = Some(new);
            }
            path.local = Some(new);
            path.restart_network_state(now, &config);
            if path.state == PathState::Dead {
                path.state = path.wanted;
            }
            // What was in flight from the old address will not be acknowledged soon: send
            // it again now rather than after a probe timeout.
            let lost = path.sent.abandon(now, &path.rtt);
            let frames: Vec<_> = lost
                .into_iter()
                .filter(|(_, p)| !p.copy)
                .flat_map(|(_, p)| p.frames)
                .collect();
            self.stats.packets_rerouted += u64::from(!frames.is_empty());
            moved += 1;
            tracing::debug!(id = path.id, %old, %new, "local address changed");
            requeue.extend(frames);
            moved_paths.push(i);
        }
        self.requeue(&requeue, false);
        // Each moved path announces itself at once from its new address with a challenge
        // padded to 1 200 bytes (QUIC's migration probe): the peer learns the address before
        // any data needs it, and may answer with 3x that while it revalidates — an ACK-only
        // receiver would otherwise give it too little budget even to send its own challenge.
        // The peer's address did not change, so the path stays usable meanwhile.
        for i in moved_paths {
            self.send_challenge(i);
        }
        // Pairs from the new address that have no path yet (a client with more addresses).
        if self.paths_opened {
            self.open_paths(now);
        }
        moved
    }

    /// The peer advertised an address (AddAddress).
    pub(crate) fn on_add_address(&mut self, now: Instant, seq: u64, addr: SocketAddr) {
        if self.peer_addresses.iter().any(|(s, _)| *s == seq)
            || self.peer_addresses.len() >= MAX_PEER_ADDRESSES
            || self.removed_peer_addresses.contains(&addr)
        {
            return;
        }
        self.peer_addresses.push((seq, addr));
        if self.paths_opened {
            self.open_paths(now);
        }
    }

    /// The application's choice for a path: active, or standby (used only while no active
    /// path works), or abandoned (never used again). The peer is told (PathStatus, §9.30), so
    /// both ends use the path alike. Returns false if there is no such path, it is already
    /// abandoned, `state` is `Dead` (which only the path's silence decides), or it would
    /// abandon the last path that can carry data.
    pub fn set_path_state(&mut self, now: Instant, id: u32, state: PathState) -> bool {
        let Some(i) = self.path_index(id) else {
            return false;
        };
        if state == PathState::Dead
            || self.paths[i].abandoned()
            || (state == PathState::Abandoned && !self.has_other_path(i))
        {
            return false;
        }
        self.apply_path_state(now, i, state, false);
        let path = &mut self.paths[i];
        path.status_sequence += 1;
        path.status_pending = true;
        true
    }

    /// Puts path `index` in `state` (active, standby or abandoned) at the application's or
    /// the peer's request.
    fn apply_path_state(&mut self, now: Instant, index: usize, state: PathState, by_peer: bool) {
        let path = &mut self.paths[index];
        let id = path.id;
        if path.state == state && path.wanted == state {
            return;
        }
        if state == PathState::Abandoned {
            path.state = PathState::Abandoned;
            path.wanted = PathState::Abandoned;
            path.probes = 0;
            path.challenge = None;
            path.challenge_pending = false;
            path.pacing_until = None;
            let moved = path.sent.abandon(now, &path.rtt);
            self.requeue_moved(moved);
        } else {
            path.wanted = state;
            if path.state != PathState::Dead {
                path.state = state;
            }
        }
        tracing::debug!(id, ?state, by_peer, "path state");
        self.events
            .push_back(Event::PathStateChanged { id, state, by_peer });
    }

    /// The peer's PathStatus (§9.30). A status for a path we do not hold (yet) is ignored;
    /// so is one older than the last we applied. The last path that may carry data is not
    /// abandoned at the peer's word alone (the connection would have nowhere to send): it is
    /// abandoned once another path can carry data.
    pub(crate) fn on_path_status(
        &mut self,
        now: Instant,
        id: u32,
        sequence: u64,
        status: crate::wire::PathStatusCode,
    ) {
        use crate::wire::PathStatusCode;
        let Some(i) = self.path_index(id) else {
            return;
        };
        let path = &mut self.paths[i];
        if sequence <= path.peer_status_sequence || path.abandoned() {
            return;
        }
        path.peer_status_sequence = sequence;
        let state = match status {
            PathStatusCode::Active => PathState::Active,
            PathStatusCode::Standby => PathState::Standby,
            PathStatusCode::Abandoned => PathState::Abandoned,
        };
        // A later status overrides an abandon still waiting for another path, unless the
        // path's address was withdrawn (RemoveAddress), which no status undoes.
        let withdrawn = self.removed_peer_addresses.contains(&self.paths[i].remote);
        let deferred = state == PathState::Abandoned && !self.has_other_path(i);
        self.paths[i].abandon_deferred = deferred || (withdrawn && self.paths[i].abandon_deferred);
        if !deferred {
            self.apply_path_state(now, i, state, true);
        }
    }

    /// Whether a path other than `index` can carry data now (validated, neither dead nor
    /// abandoned): a path that merely is not abandoned (dead, or never validated) would
    /// leave the connection with nowhere to send.
    fn has_other_path(&self, index: usize) -> bool {
        self.paths
            .iter()
            .enumerate()
            .any(|(j, p)| j != index && p.usable())
    }

    /// The peer withdrew an address it advertised (RemoveAddress): the paths to it are
    /// abandoned (one that is the last able to carry data, once another can).
    pub(crate) fn on_remove_address(&mut self, now: Instant, seq: u64) {
        let Some(pos) = self.peer_addresses.iter().position(|(s, _)| *s == seq) else {
            return;
        };
        let (_, addr) = self.peer_addresses.remove(pos);
        // Remembered so that it is not opened again, within the same bound as the live list:
        // a peer that adds and removes addresses in turn must not grow it without end.
        if self.removed_peer_addresses.len() >= MAX_PEER_ADDRESSES {
            self.removed_peer_addresses.remove(0);
        }
        self.removed_peer_addresses.push(addr);
        for i in 0..self.paths.len() {
            if self.paths[i].remote != addr || self.paths[i].abandoned() {
                continue;
            }
            if self.has_other_path(i) {
                self.apply_path_state(now, i, PathState::Abandoned, true);
            } else {
                self.paths[i].abandon_deferred = true;
            }
        }
    }

    /// Server: withdraws one of the addresses it advertised (`ConnectionConfig::advertise`),
    /// e.g. before the interface goes down. The client abandons its paths to it. Returns
    /// false if the address was not advertised on this connection (or already withdrawn).
    pub fn remove_address(&mut self, addr: SocketAddr) -> bool {
        let Some(seq) = self.config.advertise.iter().position(|a| *a == addr) else {
            return false;
        };
        let seq = seq as u64;
        if self.side != Side::Server || self.withdrawn.contains(&seq) {
            return false;
        }
        self.withdrawn.push(seq);
        self.remove_pending.push(seq);
        true
    }
}
