//! XFetch probabilistic early expiration (Vattani, Chierichetti, Lowenstein, "Optimal Probabilistic
//! Cache Stampede Prevention", VLDB 2015): a reader refreshes early with a probability that rises
//! as expiry nears and with how long the value takes to compute, so one reader usually refreshes
//! a hot key before it expires and nobody waits.
//!
//! The paper's cache has no stale window: past expiry a reader waits for the value. Here an entry
//! lives on as stale until `hard_until`, served at once while one refresh runs, so past expiry
//! nobody waits either. An early refresh then buys nothing a stale read would not, and costs a load:
//! each one shortens a cycle, and with several processes each may draw its own (the
//! peer bench's hot key, ttl 1 s, hardTtl 10 s, 4 processes for 10 s, made 11-13 loads against 10
//! ideal, and 9 with beta 0). So the draw is made only when the stale window is too short to
//! cover a refresh: shorter than `horizon`, the furthest ahead of expiry a draw can refresh. A
//! window at least that long gives a refresh started by the first stale read at least as much
//! time to finish before anyone waits (at `hard_until`) as the earliest early refresh had before
//! `fresh_until`. In numbers: a 25 ms load at beta 1 reaches 25 * 37 = 925 ms ahead; a stale
//! window of 9 s covers it 9 times over, so stale-while-revalidate refreshes the key, once per
//! ttl. With `hardTtl == ttl` (no window) XFetch draws exactly as in the paper; a 200 ms load
//! with ttl 60 s and hardTtl 61 s (reach 7.4 s, window 1 s) still draws too.

/// The XFetch draw, without the stale window: true when a reader at `now` should refresh early,
/// `now - compute_ms * beta * ln(unit) >= fresh_until`, with `unit` uniform in `(0, 1]`.
#[inline]
fn draw_refreshes(now: f64, fresh_until: f64, compute_ms: f64, beta: f64, unit: f64) -> bool {
    if beta <= 0.0 || compute_ms <= 0.0 {
        return now >= fresh_until;
    }
    // ln(unit) <= 0, so the term pushes `now` forward by a random, usually small, amount.
    now - compute_ms * beta * unit.ln() >= fresh_until
}

/// True when a reader at `now` of a fresh entry (`now < fresh_until`, stale until `hard_until`)
/// should refresh it early: the XFetch draw, made only when the stale window does not cover a
/// refresh (see the module's comment). `unit` is uniform in `(0, 1]`.
#[inline]
pub fn should_refresh(
    now: f64,
    fresh_until: f64,
    hard_until: f64,
    compute_ms: f64,
    beta: f64,
    unit: f64,
) -> bool {
    if stale_window_covers(fresh_until, hard_until, compute_ms, beta) {
        return now >= fresh_until;
    }
    draw_refreshes(now, fresh_until, compute_ms, beta, unit)
}

/// The stale window `hard_until - fresh_until` is at least XFetch's reach (`reach` is 0 when
/// beta or compute_ms is: then no draw refreshes early anyway).
#[inline]
fn stale_window_covers(fresh_until: f64, hard_until: f64, compute_ms: f64, beta: f64) -> bool {
    hard_until - fresh_until >= reach(compute_ms, beta)
}

/// The largest shift one draw can give: `-ln(unit)` for the smallest `unit` a 53-bit uniform
/// draw `1 - r` yields (2^-53) is 36.7. Further than `reach` from expiry no draw refreshes.
pub const MAX_SHIFT: f64 = 37.0;

/// How far ahead of expiry one draw can refresh.
#[inline]
fn reach(compute_ms: f64, beta: f64) -> f64 {
    compute_ms.max(0.0) * beta.max(0.0) * MAX_SHIFT
}

/// How far ahead of `fresh_until` a read may refresh early: XFetch's reach, or 0 when the stale
/// window covers it. Further than `horizon` from expiry no read refreshes, so the hot path skips
/// the draw and the precise clock there.
#[inline]
pub fn horizon(fresh_until: f64, hard_until: f64, compute_ms: f64, beta: f64) -> f64 {
    if stale_window_covers(fresh_until, hard_until, compute_ms, beta) {
        0.0
    } else {
        reach(compute_ms, beta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    /// The share of 100,000 reads `remaining_ms` before expiry that refresh early, for an entry
    /// stale for `window_ms` more.
    fn share_refreshing_with(remaining_ms: f64, window_ms: f64, compute_ms: f64, beta: f64) -> f64 {
        let mut rng = SmallRng::seed_from_u64(42);
        let n = 100_000;
        let fresh_until = 1_000.0 + remaining_ms;
        let hits = (0..n)
            .filter(|_| {
                let unit = 1.0 - rng.random::<f64>(); // (0, 1]
                should_refresh(
                    1_000.0,
                    fresh_until,
                    fresh_until + window_ms,
                    compute_ms,
                    beta,
                    unit,
                )
            })
            .count();
        hits as f64 / n as f64
    }

    /// No stale window (hardTtl == ttl): the paper's XFetch.
    fn share_refreshing(remaining_ms: f64, compute_ms: f64, beta: f64) -> f64 {
        share_refreshing_with(remaining_ms, 0.0, compute_ms, beta)
    }

    #[test]
    fn no_draw_refreshes_beyond_the_horizon() {
        let smallest_unit = f64::EPSILON / 2.0; // 2^-53
        let (compute, beta) = (120.0, 1.5);
        let fresh_until = 10_000.0;
        let h = horizon(fresh_until, fresh_until, compute, beta);
        assert_eq!(h, 120.0 * 1.5 * MAX_SHIFT);
        let now = fresh_until - h - 1e-6;
        assert!(!should_refresh(
            now,
            fresh_until,
            fresh_until,
            compute,
            beta,
            smallest_unit
        ));
        assert!(should_refresh(
            fresh_until - 30.0 * compute * beta,
            fresh_until,
            fresh_until,
            compute,
            beta,
            smallest_unit
        ));
    }

    #[test]
    fn beta_zero_never_refreshes_early() {
        assert!(!should_refresh(0.0, 1.0, 1.0, 100.0, 0.0, 1e-300));
        assert!(!should_refresh(0.0, 1.0, 10_000.0, 100.0, 0.0, 1e-300));
        assert!(should_refresh(1.0, 1.0, 1.0, 100.0, 0.0, 0.5));
        assert_eq!(horizon(1.0, 1.0, 100.0, 0.0), 0.0);
    }

    #[test]
    fn without_a_stale_window_every_draw_is_the_papers() {
        // hardTtl == ttl: the decision is the bare draw for every unit and every time left.
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..100_000 {
            let remaining = rng.random::<f64>() * 2_000.0;
            let (compute, beta) = (1.0 + rng.random::<f64>() * 100.0, rng.random::<f64>() * 3.0);
            let unit = 1.0 - rng.random::<f64>();
            let fresh_until = 50_000.0;
            let now = fresh_until - remaining;
            assert_eq!(
                should_refresh(now, fresh_until, fresh_until, compute, beta, unit),
                draw_refreshes(now, fresh_until, compute, beta, unit)
            );
        }
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
            // A stale window shorter than the reach (compute * beta * 37) changes nothing.
            let short = compute * beta * MAX_SHIFT - 1.0;
            let got = share_refreshing_with(remaining, short, compute, beta);
            assert!(
                (got - expected).abs() < 0.01,
                "window {short}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn a_stale_window_that_covers_a_refresh_leaves_it_to_stale_while_revalidate() {
        // The peer bench's hot key: ttl 1 s, hardTtl 10 s, a 25 ms load, beta 1. A
        // reader every millisecond of the entry's fresh life never refreshes early; the first
        // read at expiry finds it stale (and refreshes it, served at once).
        let clock = ManualClock::new(1_000_000.0);
        let (compute, beta) = (25.0, 1.0);
        let fresh_until = clock.now_ms() + 1_000.0;
        let hard_until = clock.now_ms() + 10_000.0;
        assert_eq!(horizon(fresh_until, hard_until, compute, beta), 0.0);
        let mut rng = SmallRng::seed_from_u64(1);
        while clock.now_ms() < fresh_until {
            let unit = 1.0 - rng.random::<f64>();
            assert!(
                !should_refresh(clock.now_ms(), fresh_until, hard_until, compute, beta, unit),
                "refreshed early at {} ms before expiry",
                fresh_until - clock.now_ms()
            );
            clock.advance(1.0);
        }
        // The same key without a stale window: the draw refreshes it early, as the paper's.
        let clock = ManualClock::new(1_000_000.0);
        let fresh_until = clock.now_ms() + 1_000.0;
        let mut early = None;
        while clock.now_ms() < fresh_until {
            let unit = 1.0 - rng.random::<f64>();
            if should_refresh(
                clock.now_ms(),
                fresh_until,
                fresh_until,
                compute,
                beta,
                unit,
            ) {
                early = Some(fresh_until - clock.now_ms());
                break;
            }
            clock.advance(1.0);
        }
        let ahead = early.expect("a reader every ms refreshes before expiry without a window");
        assert!(
            ahead > 0.0 && ahead <= compute * beta * MAX_SHIFT,
            "{ahead} ms ahead"
        );
    }

    #[test]
    fn the_window_covers_a_refresh_from_the_reach_on() {
        let (compute, beta) = (200.0, 1.0);
        let reach = compute * beta * MAX_SHIFT; // 7.4 s
        let smallest_unit = f64::EPSILON / 2.0;
        let fresh_until = 100_000.0;
        // A window of exactly the reach: covered; any shorter: the draw runs, up to the reach.
        assert_eq!(
            horizon(fresh_until, fresh_until + reach, compute, beta),
            0.0
        );
        assert_eq!(
            horizon(fresh_until, fresh_until + reach - 1.0, compute, beta),
            reach
        );
        let now = fresh_until - 1_000.0;
        assert!(!should_refresh(
            now,
            fresh_until,
            fresh_until + reach,
            compute,
            beta,
            smallest_unit
        ));
        assert!(should_refresh(
            now,
            fresh_until,
            fresh_until + reach - 1.0,
            compute,
            beta,
            smallest_unit
        ));
        // ttl 60 s, hardTtl 61 s with this 200 ms load: the 1 s window is short, XFetch draws.
        assert!(should_refresh(
            now,
            fresh_until,
            fresh_until + 1_000.0,
            compute,
            beta,
            smallest_unit
        ));
        // A higher beta reaches further, so a longer window is needed to cover it.
        assert_eq!(
            horizon(fresh_until, fresh_until + reach, compute, 2.0),
            2.0 * reach
        );
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
