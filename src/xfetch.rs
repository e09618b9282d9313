//! XFetch probabilistic early expiration (Vattani, Chierichetti, Lowenstein, "Optimal Probabilistic
//! Cache Stampede Prevention", VLDB 2015): a reader refreshes early with a probability that rises
//! as expiry nears and with how long the value takes to compute, so one reader usually refreshes
//! a hot key before it expires and nobody waits.

/// True when a reader at `now` should refresh early:
/// `now - compute_ms * beta * ln(unit) >= fresh_until`, with `unit` uniform in `(0, 1]`.
#[inline]
pub fn should_refresh(now: f64, fresh_until: f64, compute_ms: f64, beta: f64, unit: f64) -> bool {
    if beta <= 0.0 || compute_ms <= 0.0 {
        return now >= fresh_until;
    }
    // ln(unit) <= 0, so the term pushes `now` forward by a random, usually small, amount.
    now - compute_ms * beta * unit.ln() >= fresh_until
}

/// The largest shift one draw can give: `-ln(unit)` for the smallest `unit` a 53-bit uniform
/// draw `1 - r` yields (2^-53) is 36.7. Further than `horizon` from expiry no draw refreshes,
/// so the hot path skips the draw and the precise clock there.
pub const MAX_SHIFT: f64 = 37.0;

#[inline]
pub fn horizon(compute_ms: f64, beta: f64) -> f64 {
    compute_ms.max(0.0) * beta.max(0.0) * MAX_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    fn share_refreshing(remaining_ms: f64, compute_ms: f64, beta: f64) -> f64 {
        let mut rng = SmallRng::seed_from_u64(42);
        let n = 100_000;
        let hits = (0..n)
            .filter(|_| {
                let unit = 1.0 - rng.random::<f64>(); // (0, 1]
                should_refresh(1_000.0, 1_000.0 + remaining_ms, compute_ms, beta, unit)
            })
            .count();
        hits as f64 / n as f64
    }

    #[test]
    fn no_draw_refreshes_beyond_the_horizon() {
        let smallest_unit = f64::EPSILON / 2.0; // 2^-53
        let (compute, beta) = (120.0, 1.5);
        let fresh_until = 10_000.0;
        let now = fresh_until - horizon(compute, beta) - 1e-6;
        assert!(!should_refresh(
            now,
            fresh_until,
            compute,
            beta,
            smallest_unit
        ));
        assert!(should_refresh(
            fresh_until - 30.0 * compute * beta,
            fresh_until,
            compute,
            beta,
            smallest_unit
        ));
    }

    #[test]
    fn beta_zero_never_refreshes_early() {
        assert!(!should_refresh(0.0, 1.0, 100.0, 0.0, 1e-300));
        assert!(should_refresh(1.0, 1.0, 100.0, 0.0, 0.5));
    }

    #[test]
    fn probability_matches_the_exponential_law() {
        // P(refresh) = P(-ln U >= remaining / (compute * beta)) = exp(-remaining / (compute * beta)).
        for (remaining, compute, beta) in
            [(100.0, 100.0, 1.0), (50.0, 100.0, 1.0), (200.0, 50.0, 2.0)]
        {
            let expected = f64::exp(-remaining / (compute * beta));
            let got = share_refreshing(remaining, compute, beta);
            assert!(
                (got - expected).abs() < 0.01,
                "{remaining} {compute} {beta}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn far_from_expiry_almost_never_refreshes() {
        assert!(share_refreshing(60_000.0, 10.0, 1.0) == 0.0);
    }

    #[test]
    fn slower_loads_refresh_earlier() {
        assert!(share_refreshing(100.0, 200.0, 1.0) > share_refreshing(100.0, 20.0, 1.0));
    }
}
