//! The per-source rate of unsolicited requests (REQ, SIDR_REQ) a CM takes (issue 35, item
//! 4; docs/design/security.md): a token bucket per sending address, kept as the generic cell rate
//! algorithm's one "theoretical arrival time" per source, checked on the MAD's AttributeID
//! before the MAD is parsed, so that a flood costs a table lookup per packet and the excess
//! leaves no state and draws no answer. A request dropped here is one its sender sends again
//! after its CM response timeout (IBA 12.9), as if the network had lost it.
//!
//! Bounded: at most [`MAX_SOURCES`] addresses have a bucket of their own; past that, sources
//! whose bucket is full again are forgotten, and until there is room the rest share one
//! bucket, so a flood from many (spoofed) addresses is held to one source's rate.

use std::collections::HashMap;
use std::time::Duration;

use softverbs_transport::Instant;

use crate::types::Peer;

/// Addresses with a bucket of their own.
pub const MAX_SOURCES: usize = 1024;

/// The buckets.
#[derive(Debug)]
pub(crate) struct ReqRate {
    /// Time one request costs (`1 s / rate`); zero: no limit.
    cost: Duration,
    /// How far ahead of `now` a source's arrival time may run: `burst` requests' cost.
    slack: Duration,
    /// Each source's theoretical arrival time: it may send while that is within `slack`.
    tat: HashMap<Peer, Instant>,
    /// The bucket of the sources past [`MAX_SOURCES`].
    shared: Instant,
    /// When the table was last swept of full buckets (at most once per `cost`).
    swept: Instant,
    /// Requests dropped.
    pub(crate) dropped: u64,
}

impl ReqRate {
    /// `rate` requests a second per source, after a burst of `burst` (either 0: no limit).
    pub(crate) fn new(rate: u32, burst: u32) -> ReqRate {
        let cost = if rate == 0 || burst == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(1) / rate
        };
        ReqRate {
            cost,
            slack: cost * burst,
            tat: HashMap::new(),
            shared: Instant(0),
            swept: Instant(0),
            dropped: 0,
        }
    }

    /// Whether a request from `peer` at `now` is taken (and its cost charged); `false`:
    /// drop it (counted).
    pub(crate) fn admit(&mut self, now: Instant, peer: Peer) -> bool {
        if self.cost.is_zero() {
            return true;
        }
        if !self.tat.contains_key(&peer) && self.tat.len() >= MAX_SOURCES && now >= self.swept {
            // Forget the sources whose bucket is full again (as good as no entry).
            self.tat.retain(|_, t| *t > now);
            self.swept = now.after(self.cost);
        }
        let room = self.tat.len() < MAX_SOURCES;
        let tat = match self.tat.get_mut(&peer) {
            Some(t) => t,
            None if room => self.tat.entry(peer).or_insert(now),
            None => &mut self.shared,
        };
        let start = (*tat).max(now);
        if start > now.after(self.slack) {
            self.dropped += 1;
            return false;
        }
        *tat = start.after(self.cost);
        true
    }
}

/// Whether `bytes` is a MAD whose AttributeID (MAD header bytes 16–17, IBA 13.4.2) says
/// REQ or SIDR_REQ: the requests nobody asked for, which the rate applies to.
pub(crate) fn is_request(bytes: &[u8]) -> bool {
    use softverbs_wire::cm::mad::AttrId;
    let Some(id) = bytes.get(16..18) else {
        return false;
    };
    let id = u16::from_be_bytes([id[0], id[1]]);
    id == AttrId::Req as u16 || id == AttrId::SidrReq as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn a_burst_then_the_rate() {
        let mut r = ReqRate::new(1000, 4);
        let t = Instant(1_000_000_000);
        // The burst, and one (the bucket starts full: burst + 1 at one instant).
        assert_eq!((0..10).filter(|_| r.admit(t, ip(1))).count(), 5);
        assert_eq!(r.dropped, 5);
        // One per millisecond after that.
        assert!(r.admit(t.after(Duration::from_millis(1)), ip(1)));
        assert!(!r.admit(t.after(Duration::from_millis(1)), ip(1)));
        // Another source has its own bucket.
        assert!(r.admit(t, ip(2)));
    }

    #[test]
    fn many_sources_share_one_bucket_past_the_table() {
        let mut r = ReqRate::new(1000, 1);
        let t = Instant(1_000_000_000);
        for n in 0..MAX_SOURCES as u32 {
            assert!(r.admit(t, ip(n)));
            assert!(r.admit(t, ip(n)));
        }
        // The table is full of busy buckets: newcomers share one.
        let extra = (0..100)
            .filter(|n| r.admit(t, ip(MAX_SOURCES as u32 + n)))
            .count();
        assert_eq!(extra, 2, "one shared bucket's burst");
        assert_eq!(r.tat.len(), MAX_SOURCES);
        // Once their buckets are full again, sources are forgotten to make room.
        let later = t.after(Duration::from_secs(1));
        assert!(r.admit(later, ip(5_000)));
        assert!(r.tat.len() <= 1, "{}", r.tat.len());
    }

    #[test]
    fn zero_means_no_limit() {
        let mut r = ReqRate::new(0, 0);
        assert!((0..100_000).all(|_| r.admit(Instant(0), ip(1))));
    }

    #[test]
    fn only_req_and_sidr_req_are_requests() {
        let mut mad = [0u8; 256];
        mad[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
        assert!(is_request(&mad));
        mad[16..18].copy_from_slice(&0x0017u16.to_be_bytes());
        assert!(is_request(&mad));
        mad[16..18].copy_from_slice(&0x0013u16.to_be_bytes());
        assert!(!is_request(&mad));
        assert!(!is_request(&mad[..10]));
    }
}
