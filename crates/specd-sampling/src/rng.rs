//! Position-keyed randomness.
//!
//! Every random number is a pure function of `(seed, pos, lane)`: the ChaCha8
//! key is derived from the seed, the 64-bit stream id is the position and the
//! lane selects the word offset inside that stream. Nothing depends on how
//! many draws happened before, so re-sampling a position after a speculative
//! rollback, or sampling positions out of order, yields the same numbers as a
//! plain left-to-right decode.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::params::RANDOM_SEED;

/// Uniform number in `[0, 1)` for `(seed, pos, lane)`.
///
/// Lane 0 is the draw used by [`Sampler::sample`](crate::Sampler::sample);
/// other lanes are independent numbers for the same position (e.g. the
/// acceptance test and the residual draw of probabilistic speculative
/// verification).
pub fn position_uniform(seed: u32, pos: u64, lane: u32) -> f64 {
    // The key is spelled out instead of using `seed_from_u64` so the mapping
    // never depends on rand_core's seed-expansion algorithm.
    let mut key = [0u8; 32];
    key[..4].copy_from_slice(&seed.to_le_bytes());
    key[4..12].copy_from_slice(b"specd-rs");
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(pos);
    // Each lane consumes one u64, i.e. two 32-bit words of the stream.
    rng.set_word_pos(u128::from(lane) * 2);
    // 53 random bits -> exactly representable f64 in [0, 1).
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Turns a requested seed into a concrete one: [`RANDOM_SEED`] is replaced by
/// a value drawn from OS-seeded hashing keys mixed with the clock.
pub(crate) fn resolve_seed(seed: u32) -> u32 {
    if seed != RANDOM_SEED {
        return seed;
    }
    use std::hash::{BuildHasher, Hasher};
    // `RandomState` keys come from the OS RNG, which avoids a new dependency;
    // the clock guards against a platform where those keys are weak.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    let v = h.finish();
    let s = (v ^ (v >> 32)) as u32;
    // The drawn seed must not be the sentinel itself, otherwise repeating the
    // request with it would draw yet another random seed.
    if s == RANDOM_SEED {
        RANDOM_SEED - 1
    } else {
        s
    }
}

/// Picks a token from `dist` (pairs of token id and probability) with the
/// uniform number `u` in `[0, 1)`: walking `dist` in order, the first entry
/// whose running mass reaches `u` times the total is chosen.
///
/// Probabilities need not be normalised. Negative or non-finite ones count
/// as zero, and a zero-probability entry is never chosen unless every entry
/// has zero mass (then the first entry is). An empty `dist` yields 0.
pub fn draw(dist: &[(u32, f32)], u: f64) -> u32 {
    draw_iter(dist.iter().copied(), u)
}

/// [`draw`] over any re-iterable sequence, so the sampler can draw straight
/// from its scratch buffer with exactly the arithmetic [`draw`] uses.
pub(crate) fn draw_iter<I>(dist: I, u: f64) -> u32
where
    I: Iterator<Item = (u32, f32)> + Clone,
{
    let mass = |p: f32| {
        if p.is_finite() && p > 0.0 {
            f64::from(p)
        } else {
            0.0
        }
    };
    let total: f64 = dist.clone().map(|(_, p)| mass(p)).sum();
    let mut first = None;
    let mut last_positive = None;
    if total > 0.0 {
        let target = u.clamp(0.0, 1.0) * total;
        let mut run = 0.0f64;
        for (id, p) in dist {
            let m = mass(p);
            if m > 0.0 {
                run += m;
                last_positive = Some(id);
                if run >= target {
                    return id;
                }
            }
        }
    } else {
        first = dist.map(|(id, _)| id).next();
    }
    // `last_positive` is only reached through rounding when `u` is within an
    // ulp of 1; `first` covers an all-zero distribution.
    last_positive.or(first).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_pure_and_in_range() {
        for pos in 0..1000 {
            let a = position_uniform(7, pos, 0);
            assert_eq!(a, position_uniform(7, pos, 0));
            assert!((0.0..1.0).contains(&a));
        }
        // Seeds, positions and lanes all change the value.
        let base = position_uniform(7, 3, 0);
        assert_ne!(base, position_uniform(8, 3, 0));
        assert_ne!(base, position_uniform(7, 4, 0));
        assert_ne!(base, position_uniform(7, 3, 1));
    }

    #[test]
    fn uniform_mean_and_lag_correlation() {
        // Deterministic moments over consecutive positions: mean 1/2, and no
        // correlation between neighbouring positions (would reveal a shared
        // stream or a bad key schedule).
        let n = 20_000u64;
        let xs: Vec<f64> = (0..n).map(|p| position_uniform(123, p, 0)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let cov = xs
            .windows(2)
            .map(|w| (w[0] - 0.5) * (w[1] - 0.5))
            .sum::<f64>()
            / n as f64;
        assert!(cov.abs() < 0.002, "lag-1 covariance {cov}");
    }

    #[test]
    fn resolved_seed_is_never_the_sentinel() {
        assert_eq!(resolve_seed(5), 5);
        for _ in 0..100 {
            assert_ne!(resolve_seed(RANDOM_SEED), RANDOM_SEED);
        }
    }

    #[test]
    fn draw_walks_cumulative_mass() {
        let d = [(10, 0.25), (11, 0.0), (12, 0.5), (13, 0.25)];
        assert_eq!(draw(&d, 0.0), 10);
        assert_eq!(draw(&d, 0.2499), 10);
        assert_eq!(draw(&d, 0.25), 10); // boundary belongs to the earlier entry
        assert_eq!(draw(&d, 0.2501), 12);
        assert_eq!(draw(&d, 0.75), 12);
        assert_eq!(draw(&d, 0.7501), 13);
        assert_eq!(draw(&d, 0.999_999_999), 13);
        // Unnormalised and garbage masses.
        assert_eq!(draw(&[(1, f32::NAN), (2, 3.0), (3, -1.0)], 0.9), 2);
        assert_eq!(draw(&[(4, 0.0), (5, f32::INFINITY)], 0.5), 4);
        assert_eq!(draw(&[], 0.5), 0);
    }
}
