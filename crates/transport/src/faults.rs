//! Fault injection for the wire, shared by the network simulator ([`crate::sim`]) and the
//! daemon's UDP devices (this machine has no netem), after smoltcp's `FaultInjector`: one
//! seeded [`FaultInjector`] decides what happens to each packet a shell sends — lost,
//! duplicated, a bit flipped, held back — and counts it in the one [`NetStats`] both
//! shells keep. The shell only carries out the decisions: the simulator delays a held-back
//! copy by a few one-way delays, a UDP device sends it after the next packet.

use std::time::Duration;

/// SplitMix64: a tiny, well-known, seedable generator; enough for fault injection and kept
/// here so the library needs no RNG dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// What the network does to packets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faults {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back (delivered after later ones).
    pub reorder: f64,
    /// Probability one byte of a packet is flipped (the ICRC must catch it).
    pub corrupt: f64,
    /// One-way delay (the simulator's; a UDP device has the real one).
    pub delay: Duration,
}

impl Faults {
    /// A perfect network with 1 µs latency.
    pub const NONE: Faults = Faults {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        delay: Duration::from_micros(1),
    };
}

/// Counters of what a network (the simulator's wire, or one UDP device) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams put on the wire (the simulator: transmitted by a host; a device: handed to
    /// the kernel).
    pub sent: u64,
    /// Lost by the fault injector.
    pub lost: u64,
    /// Extra copies the fault injector made.
    pub duplicated: u64,
    /// Copies whose bit the fault injector flipped.
    pub corrupted: u64,
    /// Copies the fault injector held back behind later packets.
    pub reordered: u64,
    /// Every fault the injector applied, of any kind (the sum of the four above).
    pub injected: u64,
    /// Received datagrams handed on to the engine (their ICRC checked out).
    pub delivered: u64,
    /// Received datagrams dropped for a bad ICRC (a device also counts malformed ones).
    pub rejected: u64,
    /// Corrupted packets a receiver accepted (simulator only, which knows what it corrupted;
    /// must stay 0: the ICRC covers every byte the corruption may touch).
    pub corrupt_accepted: u64,
}

/// Decides, from a seeded [`Rng`], the faults of each packet sent. Per packet the decisions
/// come in a fixed order — [`copies`](Self::copies), then for each copy
/// [`damage`](Self::damage) and [`hold`](Self::hold) — so one seed replays one run.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    faults: Faults,
    rng: Rng,
}

impl FaultInjector {
    /// An injector of `faults`, seeded.
    pub fn new(faults: Faults, seed: u64) -> FaultInjector {
        FaultInjector {
            faults,
            rng: Rng::new(seed),
        }
    }

    /// The profile it injects.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// How many copies of the next packet the wire carries: 0 (lost), 1, or 2 (duplicated).
    pub fn copies(&mut self, stats: &mut NetStats) -> usize {
        if self.rng.chance(self.faults.loss) {
            stats.lost += 1;
            stats.injected += 1;
            return 0;
        }
        if self.rng.chance(self.faults.duplicate) {
            stats.duplicated += 1;
            stats.injected += 1;
            2
        } else {
            1
        }
    }

    /// Maybe flips one bit of a copy's IB packet `ib` (BTH through ICRC); returns whether it
    /// did. BTH byte 4 (FECN, BECN, reserved) is spared: the ICRC masks it because switches
    /// may change it (Annex A17), so a flip there would go unseen.
    pub fn damage(&mut self, ib: &mut [u8], stats: &mut NetStats) -> bool {
        if ib.is_empty() || !self.rng.chance(self.faults.corrupt) {
            return false;
        }
        let mut at = self.rng.below(ib.len() as u64) as usize;
        if at == 4 {
            at += 1;
        }
        let bit = self.rng.below(8);
        if let Some(b) = ib.get_mut(at) {
            *b ^= 1 << bit;
        }
        stats.corrupted += 1;
        stats.injected += 1;
        true
    }

    /// Whether a copy is held back behind later packets, and if so by how many one-way
    /// delays (1 to 8; a shell that can only hold one packet back ignores the number).
    pub fn hold(&mut self, stats: &mut NetStats) -> Option<u32> {
        if !self.rng.chance(self.faults.reorder) {
            return None;
        }
        stats.reordered += 1;
        stats.injected += 1;
        Some(1 + self.rng.below(8) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_perfect_network_carries_every_packet_once_untouched() {
        let mut f = FaultInjector::new(Faults::NONE, 7);
        let mut stats = NetStats::default();
        for _ in 0..1000 {
            assert_eq!(f.copies(&mut stats), 1);
            let mut ib = [0xA5u8; 64];
            assert!(!f.damage(&mut ib, &mut stats));
            assert_eq!(ib, [0xA5u8; 64]);
            assert_eq!(f.hold(&mut stats), None);
        }
        assert_eq!(stats, NetStats::default());
    }

    #[test]
    fn every_fault_is_counted_and_a_flip_is_one_bit_outside_bth_byte_4() {
        let all = Faults {
            loss: 0.2,
            duplicate: 0.2,
            reorder: 0.3,
            corrupt: 0.5,
            ..Faults::NONE
        };
        let mut f = FaultInjector::new(all, 42);
        let mut stats = NetStats::default();
        for _ in 0..2000 {
            for _ in 0..f.copies(&mut stats) {
                let mut ib = [0u8; 32];
                let hit = f.damage(&mut ib, &mut stats);
                let flipped: u32 = ib.iter().map(|b| b.count_ones()).sum();
                assert_eq!(flipped, u32::from(hit));
                assert_eq!(ib[4], 0, "BTH byte 4 is masked by the ICRC");
                if let Some(k) = f.hold(&mut stats) {
                    assert!((1..=8).contains(&k));
                }
            }
        }
        assert!(stats.lost > 0 && stats.duplicated > 0 && stats.corrupted > 0);
        assert!(stats.reordered > 0);
        assert_eq!(
            stats.injected,
            stats.lost + stats.duplicated + stats.corrupted + stats.reordered
        );
    }
}
