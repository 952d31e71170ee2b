//! CM timer values (IBA 12.7.27 / 12.7.33: a 5-bit timeout field means 4.096 µs × 2^value).

use std::time::Duration;

/// The time a 5-bit CM timeout field stands for.
pub fn cm_timeout(field: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(field.min(31)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(cm_timeout(0), Duration::from_nanos(4096));
        // rdma_cm's default CM response timeout, 20: about 4.3 s.
        assert_eq!(cm_timeout(20), Duration::from_nanos(4096 << 20));
        assert_eq!(cm_timeout(40), cm_timeout(31));
    }
}
