//! The connection manager proper: connections keyed by Local Communication ID, the
//! listeners, the retransmission and time-wait timers (docs/design/cm.md §3).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use softverbs_transport::Instant;
use softverbs_wire::cm::msg::{self, target, Drep, Dreq, Mra, PathInfo, Rej, Rep, Req, Rtu};
use softverbs_wire::cm::msg::{SidrRep, SidrReq};
use softverbs_wire::cm::{CmMad, CmMessage, CmWireError, RejReason, SidrStatus, MAD_LEN};

use crate::timeout::cm_timeout;
use crate::types::*;

/// A message retransmitted until it is answered (IBA 12.6.1: same TransactionID each time).
#[derive(Debug)]
struct Pending {
    mad: [u8; MAD_LEN],
    timeout: Duration,
    retries_left: u8,
    deadline: Instant,
}

/// Connections from a peer are found by the peer's own ID (its Local Communication ID or
/// SIDR RequestID): that is how a duplicate REQ or SIDR_REQ is recognised.
type RemoteKey = (Peer, u32, bool);

#[derive(Debug)]
struct Conn {
    owner: Option<Owner>,
    peer: Peer,
    /// The peer's ID for this connection, 0 until known.
    remote_id: u32,
    state: State,
    pending: Option<Pending>,
    /// The last answer sent, sent again when what it answered arrives again.
    cached: Option<[u8; MAD_LEN]>,
    /// End of time-wait.
    deadline: Option<Instant>,
    remote_qpn: u32,
    /// Wait and retries for this side's later messages (REP, DREQ).
    timeout: Duration,
    retries: u8,
    service_id: u64,
    key: Option<RemoteKey>,
    /// The listener whose backlog this unanswered request (REQ Rcvd, SIDR_REQ Rcvd) counts
    /// against; None once answered or ended.
    waiting: Option<u32>,
    /// The peer's CA GUID from its REQ (0 if unknown): a REJ Timeout that names no
    /// Remote Communication ID must carry it (IBA 12.6.7.2).
    remote_ca_guid: u64,
    /// An XRC connection (REQ Transport Service Type 3, Extended Transport Type 1, IBA
    /// A14.4): the target's REP carries its QP number in the Local EE Context Number field.
    xrc: bool,
}

/// A REQ or SIDR_REQ for a service without a listener, held for
/// [`Config::listen_grace`]: handled again when a listener for it appears, refused at
/// `deadline`.
#[derive(Debug)]
struct Held {
    deadline: Instant,
    arrived: Instant,
    peer: Peer,
    key: RemoteKey,
    service_id: u64,
    mad: Vec<u8>,
}

/// Most requests held at once; more are refused at once.
const MAX_HELD: usize = 64;

#[derive(Debug)]
struct Listener {
    owner: Owner,
    service_id: u64,
    /// Most unanswered requests it holds (rdma_listen(3)'s backlog).
    backlog: u32,
    /// Unanswered requests it holds now.
    waiting: u32,
}

/// What a CM holds, for `softverbs status` and for tests that check nothing is left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Listeners.
    pub listeners: usize,
    /// Connections and SIDR requests not in time-wait.
    pub connections: usize,
    /// Ended connections remembered for late duplicates.
    pub time_wait: usize,
    /// Of all of them, those an owner still holds.
    pub owned: usize,
    /// Requests (REQ, SIDR_REQ) dropped unparsed over their source's rate
    /// ([`Config::req_rate`]), ever.
    pub rate_dropped: u64,
}

/// One port's connection manager.
#[derive(Debug)]
pub struct Cm {
    cfg: Config,
    /// Where IDs come from (a CSPRNG: an ID a peer cannot guess is what keeps an off-path
    /// sender from naming our connections, docs/design/security.md "CM").
    rng: ChaCha20Rng,
    next_tid: u64,
    /// Unanswered requests of all listeners.
    waiting: u32,
    conns: BTreeMap<u32, Conn>,
    by_remote: HashMap<RemoteKey, u32>,
    listeners: BTreeMap<u32, Listener>,
    by_service: BTreeMap<u64, u32>,
    held: Vec<Held>,
    /// What each owner holds: (listeners, connections), kept as they change so that a
    /// per-owner or per-user share is checked in O(1) (docs/guide/limits.md).
    holdings: HashMap<Owner, (usize, usize)>,
    /// No timer is due before this (a lower bound, exact after each [`Self::handle_timeout`]
    /// that had work): the daemon asks on every round, and a scan of thousands of
    /// connections waiting for their consumers must not be paid each time.
    next_timer: Option<Instant>,
    tx: VecDeque<Transmit>,
    events: VecDeque<(Owner, CmId, Event)>,
    /// Each source's rate of unsolicited requests ([`Config::req_rate`]).
    rate: crate::rate::ReqRate,
}

impl Cm {
    /// An empty CM.
    pub fn new(cfg: Config) -> Self {
        let mut rng = ChaCha20Rng::from_seed(cfg.id_seed);
        Self {
            rate: crate::rate::ReqRate::new(cfg.req_rate, cfg.req_burst),
            next_tid: rng.next_u64(),
            rng,
            waiting: 0,
            cfg,
            conns: BTreeMap::new(),
            by_remote: HashMap::new(),
            listeners: BTreeMap::new(),
            by_service: BTreeMap::new(),
            held: Vec::new(),
            holdings: HashMap::new(),
            next_timer: None,
            tx: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next event for an owner.
    pub fn poll_event(&mut self) -> Option<(Owner, CmId, Event)> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] next may have something to do (never later than the
    /// earliest timer).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer
    }

    /// A timer was set for `at`.
    fn timer_at(&mut self, at: Instant) {
        self.next_timer = Some(self.next_timer.map_or(at, |t| t.min(at)));
    }

    /// The earliest timer, by a scan.
    fn earliest_timer(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| match (&c.pending, c.deadline) {
                (Some(p), _) => Some(p.deadline),
                (None, d) => d,
            })
            .chain(self.held.iter().map(|h| h.deadline))
            .min()
    }

    /// A connection's state, if `owner` holds it.
    pub fn state(&self, owner: Owner, id: CmId) -> Option<State> {
        self.conns
            .get(&id.0)
            .filter(|c| c.owner == Some(owner))
            .map(|c| c.state)
    }

    /// The peer's QPN as its REQ or REP stated it (0 before).
    pub fn remote_qpn(&self, id: CmId) -> Option<u32> {
        self.conns.get(&id.0).map(|c| c.remote_qpn)
    }

    /// What this CM holds.
    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            listeners: self.listeners.len(),
            // A held request is a connection in progress as far as its peer knows.
            connections: self.held.len(),
            rate_dropped: self.rate.dropped,
            ..Counts::default()
        };
        for conn in self.conns.values() {
            if conn.state == State::TimeWait {
                c.time_wait += 1;
            } else {
                c.connections += 1;
            }
            c.owned += usize::from(conn.owner.is_some());
        }
        debug_assert_eq!(
            self.holdings
                .values()
                .fold((0, 0), |a, h| (a.0 + h.0, a.1 + h.1)),
            (c.listeners, c.owned),
            "the per-owner holdings agree with the tables"
        );
        c
    }

    /// What one owner holds: (listeners, connections).
    pub fn owner_counts(&self, owner: Owner) -> (usize, usize) {
        self.holdings.get(&owner).copied().unwrap_or_default()
    }

    /// Every owner holding something, with [`Self::owner_counts`].
    pub fn holdings(&self) -> impl Iterator<Item = (Owner, (usize, usize))> + '_ {
        self.holdings.iter().map(|(o, c)| (*o, *c))
    }

    /// `owner` holds `listeners` and `conns` more (or fewer).
    fn hold(&mut self, owner: Option<Owner>, listeners: isize, conns: isize) {
        let Some(owner) = owner else {
            return;
        };
        let h = self.holdings.entry(owner).or_default();
        h.0 = h.0.saturating_add_signed(listeners);
        h.1 = h.1.saturating_add_signed(conns);
        if *h == (0, 0) {
            self.holdings.remove(&owner);
        }
    }

    /// A fresh random ID, never 0 and never one in use or in time-wait (the tombstones stay
    /// in `conns` until time-wait ends, IBA 12.9.9).
    fn alloc_id(&mut self) -> u32 {
        loop {
            let id = self.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) && !self.listeners.contains_key(&id) {
                return id;
            }
        }
    }

    /// The request `id` is no longer an unanswered one: its listener's backlog and the
    /// CM's cap get the room back.
    fn unwait(&mut self, id: u32) {
        let Some(lid) = self.conns.get_mut(&id).and_then(|c| c.waiting.take()) else {
            return;
        };
        self.waiting = self.waiting.saturating_sub(1);
        if let Some(l) = self.listeners.get_mut(&lid) {
            l.waiting = l.waiting.saturating_sub(1);
        }
    }

    /// Whether listener `lid` may take one more unanswered request, and if so counts it
    /// for connection `id`.
    fn admit(&mut self, lid: u32, id: u32) -> bool {
        let cap = self.cfg.max_pending_requests;
        let Some(l) = self.listeners.get_mut(&lid) else {
            return false;
        };
        if l.waiting >= l.backlog || self.waiting >= cap {
            return false;
        }
        l.waiting += 1;
        self.waiting += 1;
        if let Some(c) = self.conns.get_mut(&id) {
            c.waiting = Some(lid);
        }
        true
    }

    /// Whether listener `lid` has room for one more unanswered request.
    fn has_room(&self, lid: u32) -> bool {
        self.listeners
            .get(&lid)
            .is_some_and(|l| l.waiting < l.backlog && self.waiting < self.cfg.max_pending_requests)
    }

    fn encode(&mut self, msg: CmMessage) -> Result<[u8; MAD_LEN], CmWireError> {
        self.next_tid = self.next_tid.wrapping_add(1);
        CmMad {
            tid: self.next_tid,
            msg,
        }
        .emit()
    }

    fn send(&mut self, peer: Peer, mad: [u8; MAD_LEN]) {
        self.tx.push_back(Transmit { peer, mad });
    }

    fn notify(&mut self, id: u32, ev: Event) {
        if let Some(owner) = self.conns.get(&id).and_then(|c| c.owner) {
            self.events.push_back((owner, CmId(id), ev));
        }
    }

    fn rej(
        &mut self,
        local: u32,
        remote: u32,
        rejected: u8,
        reason: RejReason,
        pd: &[u8],
    ) -> Result<[u8; MAD_LEN], CmWireError> {
        // IBA 12.6.7.2 (table 109): a REJ for Timeout carries the sender's CA GUID as its
        // additional rejection information. It may name no Remote Communication ID (the
        // active side never learnt it), so that GUID and the sender's own ID are how the
        // receiving CM finds the connection; a kernel CM looks it up by exactly these.
        let mut ari = [0; msg::REJ_ARI];
        let info_length = if reason == RejReason::TIMEOUT {
            ari[..8].copy_from_slice(&self.cfg.local_ca_guid.to_be_bytes());
            8
        } else {
            0
        };
        self.encode(CmMessage::Rej(Box::new(Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: rejected,
            info_length,
            reason,
            ari,
            private_data: msg::private_data(pd)?,
        })))
    }

    /// Ends a connection: it answers late duplicates for `time_wait`, then goes.
    fn retire(&mut self, now: Instant, id: u32, ev: Option<Event>) {
        if let Some(ev) = ev {
            self.notify(id, ev);
        }
        self.unwait(id);
        let tw = self.cfg.time_wait;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.pending = None;
            c.deadline = Some(now.after(tw));
        }
        self.timer_at(now.after(tw));
    }

    fn remove(&mut self, id: u32) {
        self.unwait(id);
        if let Some(c) = self.conns.remove(&id) {
            self.hold(c.owner, 0, -1);
            if let Some(k) = c.key {
                self.by_remote.remove(&k);
            }
        }
    }

    fn owned(&mut self, owner: Owner, id: CmId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&id.0)
            .filter(|c| c.owner == Some(owner))
            .ok_or(CmError::UnknownId)
    }

    fn new_conn(
        &mut self,
        id: u32,
        owner: Owner,
        peer: Peer,
        state: State,
        timeout: Duration,
        retries: u8,
    ) {
        self.hold(Some(owner), 0, 1);
        self.conns.insert(
            id,
            Conn {
                owner: Some(owner),
                peer,
                remote_id: 0,
                state,
                pending: None,
                cached: None,
                deadline: None,
                remote_qpn: 0,
                timeout,
                retries,
                service_id: 0,
                key: None,
                waiting: None,
                remote_ca_guid: 0,
                xrc: false,
            },
        );
    }

    fn start_pending(
        &mut self,
        now: Instant,
        id: u32,
        mad: [u8; MAD_LEN],
        timeout: Duration,
        retries: u8,
    ) {
        let peer = match self.conns.get_mut(&id) {
            Some(c) => {
                c.pending = Some(Pending {
                    mad,
                    timeout,
                    retries_left: retries,
                    deadline: now.after(timeout),
                });
                c.peer
            }
            None => return,
        };
        self.timer_at(now.after(timeout));
        self.send(peer, mad);
    }

    // ---- commands -------------------------------------------------------------------

    /// Listens on `service_id` (IBA 12.7.2): REQs and SIDR_REQs for it become events.
    /// The listener holds at most [`Config::default_backlog`] of them unanswered.
    pub fn listen(&mut self, owner: Owner, service_id: u64) -> Result<CmId, CmError> {
        self.listen_backlog(owner, service_id, 0)
    }

    /// [`Self::listen`] holding at most `backlog` unanswered requests (rdma_listen(3)); 0,
    /// or more than [`Config::default_backlog`], means that default, as the kernel's
    /// `ucma` caps a listen backlog at its `max_backlog`. A request past it is refused.
    pub fn listen_backlog(
        &mut self,
        owner: Owner,
        service_id: u64,
        backlog: u32,
    ) -> Result<CmId, CmError> {
        if self.by_service.contains_key(&service_id) {
            return Err(CmError::ServiceInUse(service_id));
        }
        let max = self.cfg.default_backlog;
        let backlog = if backlog == 0 || backlog > max {
            max
        } else {
            backlog
        };
        let id = self.alloc_id();
        self.hold(Some(owner), 1, 0);
        self.listeners.insert(
            id,
            Listener {
                owner,
                service_id,
                backlog,
                waiting: 0,
            },
        );
        self.by_service.insert(service_id, id);
        // Requests that came before the listener are its own now, as if they came now
        // (their timers run from their arrival).
        let (mine, rest) = std::mem::take(&mut self.held)
            .into_iter()
            .partition::<Vec<_>, _>(|h| h.service_id == service_id);
        self.held = rest;
        for h in mine {
            let _ = self.receive(h.arrived, h.peer, &h.mad, false);
        }
        Ok(CmId(id))
    }

    /// Stops listening. Connections it produced stay.
    pub fn unlisten(&mut self, owner: Owner, id: CmId) -> Result<(), CmError> {
        match self.listeners.get(&id.0) {
            Some(l) if l.owner == owner => {
                let l = self.listeners.remove(&id.0).expect("just seen");
                self.by_service.remove(&l.service_id);
                self.hold(Some(owner), -1, 0);
                Ok(())
            }
            _ => Err(CmError::UnknownId),
        }
    }

    /// Who holds the listener or connection `id` (none for a connection its owner left).
    pub fn owner_of(&self, id: CmId) -> Option<Owner> {
        match self.listeners.get(&id.0) {
            Some(l) => Some(l.owner),
            None => self.conns.get(&id.0).and_then(|c| c.owner),
        }
    }

    /// `rdma_migrate_id(3)`: the listener or connection `id` of `from` belongs to `to` from
    /// now on (another owner of the same process: the CM's own state is unchanged, only
    /// whose events and commands they are).
    pub fn reassign(&mut self, from: Owner, id: CmId, to: Owner) -> Result<(), CmError> {
        if let Some(l) = self.listeners.get_mut(&id.0) {
            if l.owner != from {
                return Err(CmError::UnknownId);
            }
            l.owner = to;
            self.hold(Some(from), -1, 0);
            self.hold(Some(to), 1, 0);
            return Ok(());
        }
        self.owned(from, id)?.owner = Some(to);
        self.hold(Some(from), 0, -1);
        self.hold(Some(to), 0, 1);
        Ok(())
    }

    /// Sends a REQ (IBA 12.6.5) and waits for REP, MRA or REJ, retransmitting it after each
    /// response timeout up to `max_cm_retries` times.
    pub fn connect(
        &mut self,
        now: Instant,
        owner: Owner,
        p: &ConnectParams,
    ) -> Result<CmId, CmError> {
        let timeout = cm_timeout(p.response_timeout) + 2 * self.cfg.packet_lifetime;
        let (tst, ext) = match p.qp_kind {
            QpKind::Rc => (0, 0),
            QpKind::Uc => (1, 0),
            QpKind::Xrc => (3, 1),
        };
        let xrc = p.qp_kind == QpKind::Xrc;
        let id = self.alloc_id();
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            // An XRC initiator has no receive side nor responder: the kernel's ib_cm leaves
            // Responder Resources, the retry counts and SRQ zero in its REQ (cm_format_req).
            responder_resources: if xrc { 0 } else { p.responder_resources },
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.response_timeout,
            transport_service_type: tst,
            end_to_end_flow_control: true,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.response_timeout,
            retry_count: if xrc { 0 } else { p.retry_count },
            pkey: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: if xrc { 0 } else { p.rnr_retry_count },
            max_cm_retries: p.max_cm_retries,
            srq: p.srq && !xrc,
            extended_transport_type: ext,
            primary: PathInfo {
                // Permissive LIDs: on RoCE the path is the GIDs (docs/design/cm.md §2).
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: p.local_gid,
                remote_gid: p.remote_gid,
                hop_limit: p.hop_limit,
                local_ack_timeout: p.local_ack_timeout,
                ..PathInfo::default()
            },
            alternate: PathInfo::default(),
            sap_supported: false,
            private_data: msg::private_data(&p.private_data)?,
        };
        let mad = self.encode(CmMessage::Req(Box::new(req)))?;
        self.hold(Some(owner), 0, 1);
        self.conns.insert(
            id,
            Conn {
                owner: Some(owner),
                peer: p.peer,
                remote_id: 0,
                state: State::ReqSent,
                pending: None,
                cached: None,
                deadline: None,
                remote_qpn: 0,
                timeout,
                retries: p.max_cm_retries,
                service_id: p.service_id,
                key: None,
                waiting: None,
                remote_ca_guid: 0,
                xrc,
            },
        );
        self.start_pending(now, id, mad, timeout, p.max_cm_retries);
        Ok(CmId(id))
    }

    /// Answers a connect request with a REP (IBA 12.6.8) and waits for RTU.
    pub fn accept(
        &mut self,
        now: Instant,
        owner: Owner,
        id: CmId,
        p: &AcceptParams,
    ) -> Result<(), CmError> {
        let c = self.owned(owner, id)?;
        if c.state != State::ReqRcvd {
            return Err(CmError::State(c.state));
        }
        let (remote, timeout, retries, xrc) = (c.remote_id, c.timeout, c.retries, c.xrc);
        // Answered: no longer waits for the consumer (nor counts against the backlog).
        c.deadline = None;
        self.unwait(id.0);
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: remote,
            local_qkey: 0,
            // An XRC target's REP (IBA A14.4.2, the kernel's cm_format_rep): its QP number
            // in Local EE Context Number, Local QPN, Initiator Depth and flow control zero,
            // SRQ set (a target QP receives only through SRQs).
            local_qpn: if xrc { 0 } else { p.qpn },
            local_eecn: if xrc { p.qpn } else { 0 },
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: if xrc { 0 } else { p.initiator_depth },
            target_ack_delay: self.cfg.ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: !xrc,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq || xrc,
            local_ca_guid: self.cfg.local_ca_guid,
            private_data: msg::private_data(&p.private_data)?,
        };
        let mad = self.encode(CmMessage::Rep(Box::new(rep)))?;
        let c = self.conns.get_mut(&id.0).expect("owned");
        c.state = State::RepSent;
        c.cached = None;
        self.start_pending(now, id.0, mad, timeout, retries);
        Ok(())
    }

    /// Rejects a connect request, or a REP this side received (IBA 12.6.7, reason
    /// consumer-defined). The id stays the owner's until [`Self::destroy`].
    pub fn reject(
        &mut self,
        now: Instant,
        owner: Owner,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.owned(owner, id)?;
        let rejected = match c.state {
            State::ReqRcvd => target::REQ,
            State::RepRcvd => target::REP,
            s => return Err(CmError::State(s)),
        };
        let (peer, remote) = (c.peer, c.remote_id);
        let mad = self.rej(id.0, remote, rejected, RejReason::CONSUMER, private_data)?;
        self.send(peer, mad);
        self.conns.get_mut(&id.0).expect("owned").cached = Some(mad);
        self.retire(now, id.0, None);
        Ok(())
    }

    /// Sends the RTU after a REP (IBA 12.6.9): the connection is established.
    pub fn establish(&mut self, now: Instant, owner: Owner, id: CmId) -> Result<(), CmError> {
        let _ = now;
        let c = self.owned(owner, id)?;
        if c.state != State::RepRcvd {
            return Err(CmError::State(c.state));
        }
        let (peer, remote) = (c.peer, c.remote_id);
        let mad = self.encode(CmMessage::Rtu(Box::new(Rtu {
            local_comm_id: id.0,
            remote_comm_id: remote,
            private_data: [0; msg::RTU_PRIVATE_DATA],
        })))?;
        self.send(peer, mad);
        let c = self.conns.get_mut(&id.0).expect("owned");
        c.state = State::Established;
        c.cached = Some(mad);
        self.notify(id.0, Event::Established);
        Ok(())
    }

    /// Sends a DREQ (IBA 12.6.10) and waits for DREP. Disconnecting an id that is already
    /// disconnecting or ended does nothing.
    pub fn disconnect(
        &mut self,
        now: Instant,
        owner: Owner,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.owned(owner, id)?;
        match c.state {
            State::Established | State::RepSent => {}
            State::DreqSent | State::TimeWait => return Ok(()),
            s => return Err(CmError::State(s)),
        }
        self.send_dreq(now, id.0, private_data)?;
        Ok(())
    }

    fn send_dreq(&mut self, now: Instant, id: u32, pd: &[u8]) -> Result<(), CmWireError> {
        let Some(c) = self.conns.get(&id) else {
            return Ok(());
        };
        let (remote, qpn, timeout, retries) = (c.remote_id, c.remote_qpn, c.timeout, c.retries);
        let mad = self.encode(CmMessage::Dreq(Box::new(Dreq {
            local_comm_id: id,
            remote_comm_id: remote,
            remote_qpn: qpn,
            private_data: msg::private_data(pd)?,
        })))?;
        let c = self.conns.get_mut(&id).expect("checked");
        c.state = State::DreqSent;
        self.start_pending(now, id, mad, timeout, retries);
        Ok(())
    }

    /// Sends a SIDR_REQ (IBA 12.11.1) and waits for its SIDR_REP.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        owner: Owner,
        p: &SidrParams,
    ) -> Result<CmId, CmError> {
        let timeout = cm_timeout(p.response_timeout) + 2 * self.cfg.packet_lifetime;
        let id = self.alloc_id();
        let mad = self.encode(CmMessage::SidrReq(Box::new(SidrReq {
            request_id: id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data: msg::private_data(&p.private_data)?,
        })))?;
        self.new_conn(
            id,
            owner,
            p.peer,
            State::SidrReqSent,
            timeout,
            p.max_retries,
        );
        self.conns.get_mut(&id).expect("new").service_id = p.service_id;
        self.start_pending(now, id, mad, timeout, p.max_retries);
        Ok(CmId(id))
    }

    /// Answers a SIDR request (IBA 12.11.2).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        owner: Owner,
        id: CmId,
        p: &SidrReplyParams,
    ) -> Result<(), CmError> {
        let c = self.owned(owner, id)?;
        if c.state != State::SidrReqRcvd {
            return Err(CmError::State(c.state));
        }
        let (peer, remote, sid) = (c.peer, c.remote_id, c.service_id);
        let mad = self.sidr_rep(remote, sid, p.status, p.qpn, p.qkey, &p.private_data)?;
        self.send(peer, mad);
        self.conns.get_mut(&id.0).expect("owned").cached = Some(mad);
        self.retire(now, id.0, None);
        Ok(())
    }

    fn sidr_rep(
        &mut self,
        request_id: u32,
        sid: u64,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        pd: &[u8],
    ) -> Result<[u8; MAD_LEN], CmWireError> {
        self.encode(CmMessage::SidrRep(Box::new(SidrRep {
            request_id,
            status,
            info_length: 0,
            qpn,
            service_id: sid,
            qkey,
            info: [0; msg::SIDR_REP_INFO],
            private_data: msg::private_data(pd)?,
        })))
    }

    /// The owner lets go of a connection or listener. Its peer is told as the CM would tell
    /// it of a vanished consumer (IBA 12.9: REJ before establishment, DREQ after); what is
    /// left answers late duplicates until time-wait ends.
    pub fn destroy(&mut self, now: Instant, owner: Owner, id: CmId) -> Result<(), CmError> {
        if self.unlisten(owner, id).is_ok() {
            return Ok(());
        }
        self.owned(owner, id)?;
        self.abandon(now, id.0);
        Ok(())
    }

    /// Everything `owner` holds is destroyed (its process died or closed its connection).
    pub fn destroy_owner(&mut self, now: Instant, owner: Owner) {
        let ls: Vec<u32> = self
            .listeners
            .iter()
            .filter(|(_, l)| l.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        for id in ls {
            let _ = self.unlisten(owner, CmId(id));
        }
        let ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.owner == Some(owner))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.abandon(now, id);
        }
    }

    fn abandon(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let was = c.owner.take();
        let (state, peer, remote) = (c.state, c.peer, c.remote_id);
        self.hold(was, 0, -1);
        // What the REJ rejects (IBA 12.6.7): the REQ or REP this side received and has not
        // answered, or no message (a REQ_SENT that gives up, a REP already sent).
        let rej = |reason| {
            (
                reason,
                match state {
                    State::RepRcvd => target::REP,
                    State::ReqRcvd => target::REQ,
                    _ => target::OTHER,
                },
            )
        };
        let reject = match state {
            State::ReqSent => Some(rej(RejReason::TIMEOUT)),
            State::ReqRcvd | State::RepSent | State::RepRcvd => Some(rej(RejReason::CONSUMER)),
            _ => None,
        };
        if let Some((reason, rejected)) = reject {
            if let Ok(mad) = self.rej(id, remote, rejected, reason, &[]) {
                self.send(peer, mad);
                self.conns.get_mut(&id).expect("present").cached = Some(mad);
            }
            self.retire(now, id, None);
            return;
        }
        match state {
            State::Established => {
                let _ = self.send_dreq(now, id, &[]);
            }
            State::TimeWait if self.conns[&id].deadline.is_none() => self.remove(id),
            State::SidrReqSent => self.remove(id),
            State::SidrReqRcvd => {
                let sid = self.conns[&id].service_id;
                if let Ok(mad) = self.sidr_rep(remote, sid, SidrStatus::REJECT, 0, 0, &[]) {
                    self.send(peer, mad);
                    self.conns.get_mut(&id).expect("present").cached = Some(mad);
                }
                self.retire(now, id, None);
            }
            _ => {}
        }
    }

    // ---- timers ---------------------------------------------------------------------

    /// Retransmits what is due, gives up what ran out of retries, ends time-waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.next_timer.is_none_or(|t| now < t) {
            return;
        }
        self.run_timers(now);
        self.next_timer = self.earliest_timer();
    }

    fn run_timers(&mut self, now: Instant) {
        let (late, kept) = std::mem::take(&mut self.held)
            .into_iter()
            .partition::<Vec<_>, _>(|h| h.deadline <= now);
        self.held = kept;
        for h in late {
            let _ = self.receive(now, h.peer, &h.mad, false);
        }
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| match (&c.pending, c.deadline) {
                (Some(p), _) => p.deadline <= now,
                (None, Some(d)) => d <= now,
                _ => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let c = self.conns.get_mut(&id).expect("listed");
            let peer = c.peer;
            if c.pending.is_none() && matches!(c.state, State::ReqRcvd | State::SidrReqRcvd) {
                self.expire(now, id);
            } else if let Some(p) = c.pending.as_mut() {
                if p.retries_left > 0 {
                    p.retries_left -= 1;
                    p.deadline = now.after(p.timeout);
                    let mad = p.mad;
                    self.send(peer, mad);
                } else {
                    self.give_up(now, id);
                }
            } else if c.owner.is_none() {
                self.remove(id);
            } else {
                // The owner still holds the id: it stays, inert, until destroyed.
                c.deadline = None;
            }
        }
    }

    /// A request its consumer left unanswered for as long as its sender waits for the
    /// answer (see [`Self::on_req`]): the sender has given up by now, so the passive side
    /// does too. A REQ gets the REJ Timeout the active side would send (IBA 12.6.7, the
    /// REQ Rcvd state of the 12.9 diagram has the same exit), and its owner sees the
    /// connect request rejected; a SIDR request simply ends.
    fn expire(&mut self, now: Instant, id: u32) {
        let c = &self.conns[&id];
        let (state, peer, remote) = (c.state, c.peer, c.remote_id);
        if state == State::ReqRcvd {
            if let Ok(mad) = self.rej(id, remote, target::REQ, RejReason::TIMEOUT, &[]) {
                self.send(peer, mad);
                self.conns.get_mut(&id).expect("present").cached = Some(mad);
            }
            let ev = Event::Rejected {
                reason: RejReason::TIMEOUT,
                private_data: Vec::new(),
            };
            self.retire(now, id, Some(ev));
        } else {
            self.retire(now, id, None);
        }
    }

    fn give_up(&mut self, now: Instant, id: u32) {
        let c = &self.conns[&id];
        let (state, peer, remote) = (c.state, c.peer, c.remote_id);
        match state {
            State::ReqSent | State::RepSent => {
                // Tell the peer, so that it does not wait for us either (IBA 12.6.7).
                if let Ok(mad) = self.rej(id, remote, target::OTHER, RejReason::TIMEOUT, &[]) {
                    self.send(peer, mad);
                    self.conns.get_mut(&id).expect("present").cached = Some(mad);
                }
                self.retire(now, id, Some(Event::Unreachable));
            }
            State::DreqSent => self.retire(now, id, Some(Event::Disconnected)),
            State::SidrReqSent => {
                self.notify(id, Event::Unreachable);
                self.remove(id);
            }
            _ => self.retire(now, id, None),
        }
    }

    // ---- received MADs --------------------------------------------------------------

    /// Handles a MAD from `peer`'s GSI. Malformed MADs are refused with the reason and
    /// change nothing. A REQ or SIDR_REQ past its source's rate ([`Config::req_rate`]) is
    /// dropped before it is parsed, and counted.
    pub fn handle_mad(
        &mut self,
        now: Instant,
        peer: Peer,
        bytes: &[u8],
    ) -> Result<(), CmWireError> {
        if crate::rate::is_request(bytes) && !self.rate.admit(now, peer) {
            return Ok(());
        }
        self.receive(now, peer, bytes, true)
    }

    /// [`Self::handle_mad`]; with `hold`, a request for a service nobody listens on may be
    /// held ([`Config::listen_grace`]) instead of refused.
    fn receive(
        &mut self,
        now: Instant,
        peer: Peer,
        bytes: &[u8],
        hold: bool,
    ) -> Result<(), CmWireError> {
        let mad = CmMad::parse(bytes)?;
        let wait = match &mad.msg {
            CmMessage::Req(m) => Some((m.service_id, (peer, m.local_comm_id, false))),
            CmMessage::SidrReq(m) => Some((m.service_id, (peer, m.request_id, true))),
            _ => None,
        };
        if let Some((service_id, key)) = wait.filter(|_| hold) {
            if self.holds(now, peer, service_id, key, bytes) {
                return Ok(());
            }
        }
        match mad.msg {
            CmMessage::Req(m) => self.on_req(now, peer, m),
            CmMessage::Mra(m) => self.on_mra(now, peer, &m),
            CmMessage::Rej(m) => self.on_rej(now, peer, &m),
            CmMessage::Rep(m) => self.on_rep(now, peer, m),
            CmMessage::Rtu(m) => self.on_rtu(peer, &m),
            CmMessage::Dreq(m) => self.on_dreq(now, peer, &m),
            CmMessage::Drep(m) => self.on_drep(now, peer, &m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, peer, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(peer, m),
        }
        Ok(())
    }

    /// Whether a request for `service_id` is (now) held for a listener: none listens yet,
    /// the request is no duplicate of a known connection, and there is room. A copy of a
    /// held request changes nothing.
    fn holds(
        &mut self,
        now: Instant,
        peer: Peer,
        service_id: u64,
        key: RemoteKey,
        bytes: &[u8],
    ) -> bool {
        if self.cfg.listen_grace.is_zero()
            || self.by_service.contains_key(&service_id)
            || self.by_remote.contains_key(&key)
        {
            return false;
        }
        if self.held.iter().any(|h| h.key == key) {
            return true;
        }
        if self.held.len() >= MAX_HELD {
            return false;
        }
        self.timer_at(now.after(self.cfg.listen_grace));
        self.held.push(Held {
            deadline: now.after(self.cfg.listen_grace),
            arrived: now,
            peer,
            key,
            service_id,
            mad: bytes.to_vec(),
        });
        true
    }

    /// The connection a message names by our ID, if it came from that connection's peer
    /// and, once the peer's ID is known, names exactly that ID too (IBA 12.6.1: both
    /// Communication IDs identify the connection). A message naming 0 as the peer's ID
    /// matches nothing then: the one legitimate such message, a REJ Timeout from an active
    /// side that never learnt our ID, is found in [`Self::on_rej`] by its sender's ID and
    /// CA GUID.
    fn addressed(&self, peer: Peer, ours: u32, theirs: u32) -> Option<u32> {
        let c = self.conns.get(&ours)?;
        (c.peer == peer && (c.remote_id == 0 || c.remote_id == theirs)).then_some(ours)
    }

    fn resend_cached(&mut self, id: u32) -> bool {
        let c = &self.conns[&id];
        match c.cached {
            Some(mad) => {
                let peer = c.peer;
                self.send(peer, mad);
                true
            }
            None => false,
        }
    }

    fn on_req(&mut self, now: Instant, peer: Peer, req: Box<Req>) {
        let key = (peer, req.local_comm_id, false);
        if let Some(&id) = self.by_remote.get(&key) {
            let state = self.conns[&id].state;
            match state {
                // IBA 12.6.6: the consumer is still deciding; ask for more time.
                State::ReqRcvd if !self.resend_cached(id) => {
                    let mra = Mra {
                        local_comm_id: id,
                        remote_comm_id: req.local_comm_id,
                        message_mraed: target::REQ,
                        service_timeout: self.cfg.mra_service_timeout,
                        private_data: [0; msg::MRA_PRIVATE_DATA],
                    };
                    if let Ok(mad) = self.encode(CmMessage::Mra(Box::new(mra))) {
                        self.send(peer, mad);
                        self.conns.get_mut(&id).expect("present").cached = Some(mad);
                    }
                }
                State::RepSent => {
                    if let Some(mad) = self.conns[&id].pending.as_ref().map(|p| p.mad) {
                        self.send(peer, mad);
                    }
                }
                State::TimeWait if !self.resend_cached(id) => {
                    if let Ok(mad) = self.rej(
                        id,
                        req.local_comm_id,
                        target::REQ,
                        RejReason::STALE_CONN,
                        &[],
                    ) {
                        self.send(peer, mad);
                    }
                }
                _ => {}
            }
            return;
        }
        let tst_ok = matches!(
            (req.transport_service_type, req.extended_transport_type),
            (0, _) | (1, _) | (3, 1)
        );
        let listener = self.by_service.get(&req.service_id).copied();
        let reason = match (tst_ok, listener) {
            (false, _) => Some(RejReason::INVALID_TRANSPORT_TYPE),
            (true, None) => Some(RejReason::INVALID_SERVICE_ID),
            _ => None,
        };
        if let Some(reason) = reason {
            if let Ok(mad) = self.rej(0, req.local_comm_id, target::REQ, reason, &[]) {
                self.send(peer, mad);
            }
            return;
        }
        let lid = listener.expect("checked");
        if !self.has_room(lid) {
            // The listener's backlog or the CM's cap is full: refuse without keeping
            // anything (IBA 12.6.7.2 table 109, reason 3 "No resources available"). The
            // sender's next retransmission may find room.
            if let Ok(mad) = self.rej(
                0,
                req.local_comm_id,
                target::REQ,
                RejReason::NO_RESOURCES,
                &[],
            ) {
                self.send(peer, mad);
            }
            return;
        }
        let owner = self.listeners[&lid].owner;
        let timeout = cm_timeout(req.local_cm_response_timeout) + 2 * self.cfg.packet_lifetime;
        // How long the consumer may take: as long as the active side waits for our answer.
        // It sends the REQ max_cm_retries + 1 times, waiting each time the REQ's Remote CM
        // Response Timeout plus the round trip (IBA 12.6.5, 12.7.27), and each MRA we send
        // for a duplicate adds our MRA service timeout to that wait (IBA 12.6.6). Past the
        // sum it has given up (REJ Timeout), so REQ Rcvd ends then.
        let per_try = cm_timeout(req.remote_cm_response_timeout)
            + cm_timeout(self.cfg.mra_service_timeout)
            + 2 * self.cfg.packet_lifetime;
        let wait = per_try * (u32::from(req.max_cm_retries) + 1);
        let id = self.alloc_id();
        self.new_conn(id, owner, peer, State::ReqRcvd, timeout, req.max_cm_retries);
        let c = self.conns.get_mut(&id).expect("new");
        c.remote_id = req.local_comm_id;
        c.remote_qpn = req.local_qpn;
        c.service_id = req.service_id;
        c.key = Some(key);
        c.remote_ca_guid = req.local_ca_guid;
        c.xrc = (req.transport_service_type, req.extended_transport_type) == (3, 1);
        c.deadline = Some(now.after(wait));
        self.timer_at(now.after(wait));
        self.by_remote.insert(key, id);
        self.admit(lid, id);
        self.notify(
            id,
            Event::ConnectRequest {
                listener: CmId(lid),
                peer,
                req,
            },
        );
    }

    fn on_mra(&mut self, now: Instant, peer: Peer, mra: &Mra) {
        let Some(id) = self.addressed(peer, mra.remote_comm_id, mra.local_comm_id) else {
            return;
        };
        let c = self.conns.get_mut(&id).expect("addressed");
        let fits = matches!(
            (c.state, mra.message_mraed),
            (State::ReqSent, target::REQ) | (State::RepSent, target::REP)
        );
        if let (true, Some(p)) = (fits, c.pending.as_mut()) {
            // IBA 12.6.6: the peer has the message; wait its service timeout longer
            // before the next retransmission.
            p.deadline = now.after(cm_timeout(mra.service_timeout) + p.timeout);
            if c.remote_id == 0 {
                c.remote_id = mra.local_comm_id;
            }
        }
    }

    fn on_rej(&mut self, now: Instant, peer: Peer, rej: &Rej) {
        // An active side that gives up before it learnt our ID names only itself: a REJ
        // Timeout, found by the sender's ID and the CA GUID it carries (IBA 12.6.7.2), which
        // must be the one its REQ gave.
        let by_theirs = (rej.remote_comm_id == 0 && rej.reason == RejReason::TIMEOUT)
            .then(|| {
                self.by_remote
                    .get(&(peer, rej.local_comm_id, false))
                    .copied()
            })
            .flatten()
            .filter(|id| {
                let guid = self.conns[id].remote_ca_guid.to_be_bytes();
                rej.info_length >= 8 && rej.ari[..8] == guid
            });
        let Some(id) =
            by_theirs.or_else(|| self.addressed(peer, rej.remote_comm_id, rej.local_comm_id))
        else {
            return;
        };
        let ev = Event::Rejected {
            reason: rej.reason,
            private_data: rej.private_data.to_vec(),
        };
        match self.conns[&id].state {
            State::ReqSent | State::RepRcvd | State::ReqRcvd | State::RepSent => {
                self.retire(now, id, Some(ev))
            }
            // The peer never saw our RTU and gave up (Timeout) or its owner went (consumer):
            // the connection it never had is over (IBA 12.9, the CM state diagram: a REJ in
            // the established state enters time-wait). Only a REJ naming both IDs: the
            // peer's ID is known once established.
            State::Established if rej.local_comm_id == self.conns[&id].remote_id => {
                self.retire(now, id, Some(Event::Disconnected))
            }
            _ => {}
        }
    }

    fn on_rep(&mut self, now: Instant, peer: Peer, rep: Box<Rep>) {
        let _ = now;
        let Some(id) = self.addressed(peer, rep.remote_comm_id, rep.local_comm_id) else {
            if !self.conns.contains_key(&rep.remote_comm_id) {
                if let Ok(mad) = self.rej(
                    0,
                    rep.local_comm_id,
                    target::REP,
                    RejReason::INVALID_COMM_ID,
                    &[],
                ) {
                    self.send(peer, mad);
                }
            }
            return;
        };
        match self.conns[&id].state {
            State::ReqSent => {
                let c = self.conns.get_mut(&id).expect("addressed");
                c.remote_id = rep.local_comm_id;
                c.remote_qpn = if c.xrc { rep.local_eecn } else { rep.local_qpn };
                c.pending = None;
                c.state = State::RepRcvd;
                self.notify(id, Event::ConnectReply { rep });
            }
            State::Established | State::TimeWait => {
                self.resend_cached(id);
            }
            _ => {}
        }
    }

    fn on_rtu(&mut self, peer: Peer, rtu: &Rtu) {
        let Some(id) = self.addressed(peer, rtu.remote_comm_id, rtu.local_comm_id) else {
            return;
        };
        let c = self.conns.get_mut(&id).expect("addressed");
        if c.state == State::RepSent {
            c.state = State::Established;
            c.pending = None;
            self.notify(id, Event::Established);
        }
    }

    fn drep(&mut self, local: u32, remote: u32) -> Result<[u8; MAD_LEN], CmWireError> {
        self.encode(CmMessage::Drep(Box::new(Drep {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; msg::DREP_PRIVATE_DATA],
        })))
    }

    fn on_dreq(&mut self, now: Instant, peer: Peer, dreq: &Dreq) {
        let Some(id) = self.addressed(peer, dreq.remote_comm_id, dreq.local_comm_id) else {
            // IBA 12.9.8: a DREQ for a connection we do not have is still answered, so the
            // peer can finish.
            if !self.conns.contains_key(&dreq.remote_comm_id) {
                if let Ok(mad) = self.drep(dreq.remote_comm_id, dreq.local_comm_id) {
                    self.send(peer, mad);
                }
            }
            return;
        };
        match self.conns[&id].state {
            State::Established | State::RepSent | State::RepRcvd | State::DreqSent => {
                if let Ok(mad) = self.drep(id, dreq.local_comm_id) {
                    self.send(peer, mad);
                    self.conns.get_mut(&id).expect("addressed").cached = Some(mad);
                }
                self.retire(now, id, Some(Event::Disconnected));
            }
            State::TimeWait => {
                if let Ok(mad) = self.drep(id, dreq.local_comm_id) {
                    self.send(peer, mad);
                }
            }
            _ => {}
        }
    }

    fn on_drep(&mut self, now: Instant, peer: Peer, drep: &Drep) {
        let Some(id) = self.addressed(peer, drep.remote_comm_id, drep.local_comm_id) else {
            return;
        };
        if self.conns[&id].state == State::DreqSent {
            self.retire(now, id, Some(Event::Disconnected));
        }
    }

    fn on_sidr_req(&mut self, now: Instant, peer: Peer, req: Box<SidrReq>) {
        let key = (peer, req.request_id, true);
        if let Some(&id) = self.by_remote.get(&key) {
            self.resend_cached(id);
            return;
        }
        let Some(&lid) = self.by_service.get(&req.service_id) else {
            if let Ok(mad) = self.sidr_rep(
                req.request_id,
                req.service_id,
                SidrStatus::UNSUPPORTED,
                0,
                0,
                &[],
            ) {
                self.send(peer, mad);
            }
            return;
        };
        if !self.has_room(lid) {
            // As for a REQ: no room, no state (IBA 12.11.2 table 121 has no "no resources";
            // status 2, rejected by the service provider, is the nearest).
            if let Ok(mad) = self.sidr_rep(
                req.request_id,
                req.service_id,
                SidrStatus::REJECT,
                0,
                0,
                &[],
            ) {
                self.send(peer, mad);
            }
            return;
        }
        let owner = self.listeners[&lid].owner;
        let id = self.alloc_id();
        self.new_conn(id, owner, peer, State::SidrReqRcvd, Duration::ZERO, 0);
        let c = self.conns.get_mut(&id).expect("new");
        c.remote_id = req.request_id;
        c.service_id = req.service_id;
        c.key = Some(key);
        c.deadline = Some(now.after(self.cfg.sidr_req_wait));
        self.timer_at(now.after(self.cfg.sidr_req_wait));
        self.by_remote.insert(key, id);
        self.admit(lid, id);
        self.notify(
            id,
            Event::SidrRequest {
                listener: CmId(lid),
                peer,
                req,
            },
        );
    }

    fn on_sidr_rep(&mut self, peer: Peer, rep: Box<SidrRep>) {
        let id = rep.request_id;
        let ok = self.conns.get(&id).is_some_and(|c| {
            c.peer == peer && c.state == State::SidrReqSent && c.service_id == rep.service_id
        });
        if ok {
            self.notify(id, Event::SidrReply { rep });
            self.remove(id);
        }
    }
}
