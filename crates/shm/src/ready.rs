//! Which work queues have work, so that a consumer serving many rings visits only those.
//!
//! Each owner of rings (a QP: its send and receive rings) has a [`WorkFlag`], one word in
//! shared memory. The producer, after publishing entries, [`announce`](WorkFlag::announce)s:
//! only on the flag's 0 → 1 transition does it push the owner's token into the context's
//! *ready ring* (an ordinary [`Producer`](crate::Producer)/[`Consumer`](crate::Consumer) ring
//! of 8-byte tokens). The consumer keeps a [`ReadySet`]: the owners it visits next round
//! (announced or woken by the consumer itself, and those still holding work), and clears an
//! owner's flag only when it finds the owner idle, re-checking its rings after the clear. So a
//! round costs what the owners with work cost, not what all owners cost.
//!
//! No lost work: this is the store-buffering pattern of the ring's own wake-up protocol
//! (docs/design/shm-rings.md), with the flag in place of `need_wakeup`:
//!
//! ```text
//! producer (post)                          consumer (settle an idle owner)
//!   producer_index.store(tail, Release)      flag.store(0)
//!   fence(SeqCst)   [in Producer::publish]   fence(SeqCst)
//!   if flag.load() == 0                      if ring.available() > 0 {   // Acquire
//!      && flag.swap(1) == 0 {                    if flag.swap(1) == 0 { keep visiting }
//!       push token to the ready ring             else { the producer announced: the
//!   }                                                   token in flight re-queues it }
//!                                            } else { idle: the next post announces }
//! ```
//!
//! With a full fence between each side's store and its load, at least one side sees the
//! other's store: either the consumer's re-check sees the entry, or the producer sees the
//! cleared flag and announces. Both RMWs on the flag are totally ordered, so exactly one of
//! the two `swap`s that race after a clear finds 0 and takes responsibility for the owner.
//!
//! A producer announces at most once per clear, and the consumer clears only when no token of
//! that owner is in flight (it remembers a token it knows of as `pending`), so an honest
//! producer has at most one token per owner in the ready ring: a ready ring with as many
//! slots as owners never fills. A producer that scribbles on its flags or its ready ring can
//! only lose its own announcements (its own queues stall); tokens are validated by the
//! consumer, and duplicates of queued owners are ignored.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use crate::{LayoutError, Region, CACHE_LINE};

/// Bytes a [`WorkFlag`] occupies in a region (a block of its own, as each ring header word).
pub const WORK_FLAG_SIZE: usize = CACHE_LINE;

/// An owner's "has work" word in shared memory: 0 idle, anything else busy.
#[derive(Debug)]
pub struct WorkFlag {
    region: Arc<Region>,
    offset: usize,
}

impl WorkFlag {
    /// The flag at `offset` of `region` (a multiple of [`CACHE_LINE`], inside the region). A
    /// freshly created region reads 0: idle.
    pub fn attach(region: Arc<Region>, offset: usize) -> Result<WorkFlag, LayoutError> {
        let fits = offset % CACHE_LINE == 0
            && offset
                .checked_add(WORK_FLAG_SIZE)
                .is_some_and(|end| end <= region.len());
        if !fits {
            return Err(LayoutError::Placement {
                offset,
                size: WORK_FLAG_SIZE,
                region: region.len(),
            });
        }
        Ok(WorkFlag { region, offset })
    }

    fn word(&self) -> &AtomicU32 {
        self.region.atomic_u32(self.offset)
    }

    /// Producer side, right after [`Producer::publish`](crate::Producer::publish) (whose
    /// `SeqCst` fence orders the entry's index store before this load): `true` when the
    /// owner was idle and its token must now go into the ready ring.
    pub fn announce(&self) -> bool {
        let w = self.word();
        w.load(Ordering::Relaxed) == 0 && w.swap(1, Ordering::AcqRel) == 0
    }

    /// Consumer side: marks the owner idle. The caller must re-check the owner's rings
    /// afterwards (the fence orders this store before those loads).
    fn clear(&self) {
        self.word().store(0, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Consumer side: marks the owner busy; `false` if it already was (then a producer
    /// announced it, or is about to).
    fn claim(&self) -> bool {
        self.word().swap(1, Ordering::AcqRel) == 0
    }

    /// The flag's current value as a boolean (tests and diagnostics).
    pub fn is_set(&self) -> bool {
        self.word().load(Ordering::Acquire) != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not visited until announced or woken.
    Idle,
    /// On the list of the next round.
    Queued,
    /// Being visited this round; `again`: woken meanwhile, so visit next round too.
    Visiting { again: bool },
}

#[derive(Debug)]
struct Owner {
    /// `None`: a producer that does not announce (an older client); visited every round.
    flag: Option<WorkFlag>,
    state: State,
    /// A token of this owner is in the ready ring (or about to be): the consumer must not
    /// clear the flag, and need not visit it until the token arrives.
    pending: bool,
    /// Rounds in a row it was visited and found idle.
    idle_rounds: u32,
}

/// The consumer's side: which owners to visit each round.
///
/// A round is [`start_round`](ReadySet::start_round), then one visit of each owner it lists
/// (take what the rings hold), each ended by [`settle`](ReadySet::settle).
#[derive(Debug)]
pub struct ReadySet<K> {
    owners: HashMap<K, Owner>,
    queued: Vec<K>,
    grace: u32,
}

impl<K> Default for ReadySet<K> {
    fn default() -> Self {
        ReadySet {
            owners: HashMap::new(),
            queued: Vec::new(),
            grace: 0,
        }
    }
}

impl<K: Copy + Eq + Hash> ReadySet<K> {
    /// An empty set; an owner found idle is dropped (its flag cleared) at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty set that keeps an owner found idle queued for `rounds` more rounds before
    /// dropping it. An owner in a request/response loop (a ping-pong) then stays queued
    /// between its posts, and its producer, seeing the flag still set, does not announce:
    /// a few extra visits of recently busy owners instead of a ready-ring push, a flag
    /// clear and its fence per message.
    pub fn with_grace(rounds: u32) -> Self {
        ReadySet {
            grace: rounds,
            ..Self::default()
        }
    }

    /// Adds an owner, queued for one visit, with its flag set (the visit settles it);
    /// `flag: None` for an owner visited every round. Replaces an owner of the same key.
    pub fn insert(&mut self, key: K, flag: Option<WorkFlag>) {
        // Queued means the flag is set (so the producer does not announce an owner that
        // will be visited anyway, which would put a second token in flight later).
        if let Some(f) = &flag {
            f.claim();
        }
        self.owners.insert(
            key,
            Owner {
                flag,
                state: State::Queued,
                pending: false,
                idle_rounds: 0,
            },
        );
        self.queued.push(key);
    }

    /// Forgets an owner (a stale entry on the list is skipped).
    pub fn remove(&mut self, key: K) {
        self.owners.remove(&key);
        // Keep the list bounded by the owners even if they come and go between rounds.
        if self.queued.len() > 2 * self.owners.len() + 64 {
            let owners = &self.owners;
            self.queued
                .retain(|k| owners.get(k).is_some_and(|o| o.state == State::Queued));
        }
    }

    /// The owner's token came off the ready ring. `false` for an unknown key (a stale or
    /// forged token: ignored).
    pub fn announced(&mut self, key: K) -> bool {
        let Some(o) = self.owners.get_mut(&key) else {
            return false;
        };
        o.pending = false;
        Self::enqueue(&mut self.queued, key, o);
        true
    }

    /// The consumer has work for the owner on its own (not through its rings).
    pub fn wake(&mut self, key: K) {
        let Some(o) = self.owners.get_mut(&key) else {
            return;
        };
        if o.state == State::Idle {
            // Busy from now on. A flag already set on an idle owner was set by the producer,
            // whose token is in flight.
            if let Some(f) = &o.flag {
                if !f.claim() {
                    o.pending = true;
                }
            }
        }
        Self::enqueue(&mut self.queued, key, o);
    }

    fn enqueue(queued: &mut Vec<K>, key: K, o: &mut Owner) {
        match o.state {
            State::Idle => {
                o.state = State::Queued;
                queued.push(key);
            }
            State::Queued => {}
            State::Visiting { .. } => o.state = State::Visiting { again: true },
        }
    }

    /// Starts a round: `visit` gets the owners to visit (its old contents are dropped).
    pub fn start_round(&mut self, visit: &mut Vec<K>) {
        visit.clear();
        std::mem::swap(visit, &mut self.queued);
        visit.retain(|k| match self.owners.get_mut(k) {
            Some(o) if o.state == State::Queued => {
                o.state = State::Visiting { again: false };
                true
            }
            _ => false,
        });
    }

    /// Ends the visit of `key` in this round. `busy`: it still has work (entries left in
    /// its rings, or requests the consumer holds for it). Otherwise its flag is cleared and
    /// `has_entries` re-checks its rings (see the module doc). Returns whether it stays
    /// queued for the next round.
    pub fn settle(&mut self, key: K, busy: bool, has_entries: impl FnOnce() -> bool) -> bool {
        let Some(o) = self.owners.get_mut(&key) else {
            return false;
        };
        let State::Visiting { again } = o.state else {
            return o.state == State::Queued;
        };
        if again || busy {
            o.idle_rounds = 0;
        } else {
            o.idle_rounds = o.idle_rounds.saturating_add(1);
        }
        let keep = match &o.flag {
            None => true,
            Some(_) if again || busy || o.idle_rounds <= self.grace => true,
            // The producer's token will bring it back; the flag stays set meanwhile.
            Some(_) if o.pending => false,
            Some(f) => {
                f.clear();
                if has_entries() {
                    if !f.claim() {
                        o.pending = true;
                    }
                    o.idle_rounds = 0;
                    true
                } else {
                    false
                }
            }
        };
        if keep {
            o.state = State::Queued;
            self.queued.push(key);
        } else {
            o.state = State::Idle;
        }
        keep
    }

    /// Owners queued for the next round.
    pub fn queued(&self) -> &[K] {
        &self.queued
    }

    /// Whether `key` is queued for the next round.
    pub fn is_queued(&self, key: K) -> bool {
        self.owners
            .get(&key)
            .is_some_and(|o| o.state == State::Queued)
    }

    /// Owners known.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// No owners.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag() -> (WorkFlag, WorkFlag) {
        let (r, _fd) = Region::create("flag", 4096).unwrap();
        let r = Arc::new(r);
        (
            WorkFlag::attach(r.clone(), CACHE_LINE).unwrap(),
            WorkFlag::attach(r, CACHE_LINE).unwrap(),
        )
    }

    fn round(s: &mut ReadySet<u32>, busy: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut v = Vec::new();
        s.start_round(&mut v);
        for &k in &v {
            s.settle(k, busy(k), || busy(k));
        }
        v
    }

    #[test]
    fn flag_placement_is_checked() {
        let (r, _fd) = Region::create("flag", 4096).unwrap();
        let r = Arc::new(r);
        assert!(WorkFlag::attach(r.clone(), 4096 - CACHE_LINE).is_ok());
        assert!(WorkFlag::attach(r.clone(), 4096).is_err());
        assert!(WorkFlag::attach(r, 8).is_err());
    }

    #[test]
    fn an_idle_owner_is_visited_once_then_only_when_announced() {
        let (client, daemon) = flag();
        let mut s = ReadySet::new();
        s.insert(7u32, Some(daemon));
        assert_eq!(round(&mut s, |_| false), vec![7]);
        assert!(!client.is_set(), "the first visit clears the flag");
        assert!(round(&mut s, |_| false).is_empty());
        // A post: announce once, however many entries follow before the visit.
        assert!(client.announce());
        assert!(!client.announce());
        assert!(s.announced(7));
        assert_eq!(round(&mut s, |_| true), vec![7], "busy: stays queued");
        assert_eq!(round(&mut s, |_| false), vec![7]);
        assert!(round(&mut s, |_| false).is_empty());
        assert!(client.announce(), "idle again: the next post announces");
    }

    #[test]
    fn an_entry_racing_the_clear_keeps_the_owner_or_is_announced() {
        // The producer publishes between the consumer's clear and its re-check, and loses
        // the race for the flag: the consumer keeps the owner, no token is pushed.
        let (client, daemon) = flag();
        let mut s = ReadySet::new();
        s.insert(1u32, Some(daemon));
        let mut v = Vec::new();
        s.start_round(&mut v);
        assert!(s.settle(1, false, || true), "re-check saw the entry");
        assert!(client.is_set(), "the consumer re-raised the flag");
        assert!(!client.announce(), "so the producer does not announce");
        // Now the producer wins the race: it announces between clear and claim.
        let mut v = Vec::new();
        s.start_round(&mut v);
        assert!(s.settle(1, false, || {
            assert!(client.announce());
            true
        }));
        // Its token is pending: once idle, the owner is dropped without clearing the flag,
        // and the token brings it back.
        s.start_round(&mut v);
        assert!(!s.settle(1, false, || unreachable!("pending: no clear, no re-check")));
        assert!(client.is_set());
        assert!(s.announced(1));
        assert!(s.is_queued(1));
    }

    #[test]
    fn waking_an_idle_owner_claims_its_flag() {
        let (client, daemon) = flag();
        let mut s = ReadySet::new();
        s.insert(3u32, Some(daemon));
        round(&mut s, |_| false);
        s.wake(3);
        assert!(client.is_set());
        assert!(
            !client.announce(),
            "queued by the consumer: no token needed"
        );
        assert_eq!(round(&mut s, |_| false), vec![3]);
        assert!(!client.is_set());
        // Woken while being visited: visited again next round.
        s.wake(3);
        let mut v = Vec::new();
        s.start_round(&mut v);
        s.wake(3);
        assert!(s.settle(3, false, || false));
    }

    #[test]
    fn with_grace_an_idle_owner_stays_queued_and_unannounced_for_that_many_rounds() {
        let (client, daemon) = flag();
        let mut s = ReadySet::with_grace(2);
        s.insert(5u32, Some(daemon));
        assert_eq!(round(&mut s, |_| false), vec![5]);
        assert_eq!(round(&mut s, |_| false), vec![5]);
        assert!(client.is_set(), "still queued: the flag stays set");
        assert!(!client.announce(), "a post now needs no token");
        assert_eq!(
            round(&mut s, |_| true),
            vec![5],
            "busy again: the count restarts"
        );
        assert_eq!(round(&mut s, |_| false), vec![5]);
        assert_eq!(round(&mut s, |_| false), vec![5]);
        assert_eq!(
            round(&mut s, |_| false),
            vec![5],
            "third idle round: dropped"
        );
        assert!(!client.is_set());
        assert!(round(&mut s, |_| false).is_empty());
        assert!(client.announce());
    }

    #[test]
    fn owners_without_a_flag_are_visited_every_round_and_forged_tokens_are_ignored() {
        let mut s = ReadySet::new();
        s.insert(1u32, None);
        for _ in 0..3 {
            assert_eq!(round(&mut s, |_| false), vec![1]);
        }
        assert!(!s.announced(99));
        s.announced(1);
        s.announced(1);
        assert_eq!(
            round(&mut s, |_| false),
            vec![1],
            "duplicates are not visited twice"
        );
        s.remove(1);
        assert!(round(&mut s, |_| false).is_empty());
        assert!(s.is_empty());
    }
}
