//! TTL jitter: entries written together (a deploy, a mass import) must not all expire together.

/// The factor one entry's ttl and hardTtl are both scaled by: uniform in `[1 - jitter, 1 + jitter)`
/// for `unit` uniform in `[0, 1)`. One factor for both keeps `hardTtl >= ttl`.
#[inline]
pub fn factor(jitter: f64, unit: f64) -> f64 {
    1.0 - jitter + 2.0 * jitter * unit
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    #[test]
    fn zero_jitter_is_identity() {
        assert_eq!(factor(0.0, 0.0), 1.0);
        assert_eq!(factor(0.0, 0.999), 1.0);
    }

    #[test]
    fn factor_stays_in_range_and_spreads() {
        let mut rng = SmallRng::seed_from_u64(7);
        let (mut lo, mut hi) = (f64::MAX, f64::MIN);
        for _ in 0..10_000 {
            let f = factor(0.1, rng.random::<f64>());
            assert!((0.9..1.1).contains(&f), "{f}");
            lo = lo.min(f);
            hi = hi.max(f);
        }
        // 10,000 draws cover nearly the whole interval: the spread is real, not a constant.
        assert!(lo < 0.902 && hi > 1.098, "{lo} {hi}");
    }
}
