//! Probabilistic verification of drafted tokens: speculative rejection sampling (Leviathan et
//! al. 2023, Chen et al. 2023).
//!
//! A drafter samples token `x` from its own distribution `q`; `p` is the target's distribution at
//! the same position. Accepting `x` with probability `min(1, p(x)/q(x))` and, on rejection,
//! drawing the replacement from `norm(max(0, p − q))` emits a token distributed exactly as `p`,
//! whatever `q` is. The emitted tokens are not those of plain decoding (the random numbers are
//! used differently), only their distribution is — which is why specd's default verification is
//! exact matching and this one is opt-in.
//!
//! Every decision takes its number from its own lane of [`position_uniform`](crate::position_uniform)
//! for the token's position: draft sampling ([`LANE_DRAFT`]), the acceptance coin
//! ([`LANE_ACCEPT`]) and the residual draw ([`LANE_RESIDUAL`]) are independent of each other and
//! of plain sampling (lane 0), and a run with a given seed and the same draft lengths repeats.

use crate::rng::draw;

/// Lane of the number a drafter samples its token for a position with.
pub const LANE_DRAFT: u32 = 1;
/// Lane of the acceptance coin of a drafted token.
pub const LANE_ACCEPT: u32 = 2;
/// Lane of the draw from the residual distribution after a rejection.
pub const LANE_RESIDUAL: u32 = 3;

/// Outcome of the probabilistic test of one drafted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token is kept.
    Accepted,
    /// The drafted token is rejected; this token (drawn from the residual) replaces it and the
    /// round stops there.
    Rejected(u32),
}

/// Mass of `p` counted the way [`draw`] counts it: negative or non-finite is zero.
fn mass(p: f32) -> f64 {
    if p.is_finite() && p > 0.0 {
        f64::from(p)
    } else {
        0.0
    }
}

/// Probability of `token` in `dist` (`(token, p)` pairs; 0 when absent).
pub fn prob_of(dist: &[(u32, f32)], token: u32) -> f64 {
    dist.iter()
        .filter(|&&(t, _)| t == token)
        .map(|&(_, p)| mass(p))
        .sum()
}

/// `min(1, p(x)/q(x))`: the probability of keeping draft token `x`. A token `q` gives no mass
/// (it cannot have been drawn from `q`) is kept iff `p` allows it.
pub fn acceptance_probability(p: &[(u32, f32)], q: &[(u32, f32)], x: u32) -> f64 {
    let px = prob_of(p, x);
    let qx = prob_of(q, x);
    if qx <= 0.0 {
        return if px > 0.0 { 1.0 } else { 0.0 };
    }
    (px / qx).min(1.0)
}

/// The residual distribution `norm(max(0, p − q))` as `(token, probability)` pairs in token-id
/// order, zero entries left out. Empty when `p − q` has no positive mass (`p ≤ q` everywhere,
/// which for two normalised distributions means `p = q` up to rounding).
pub fn residual(p: &[(u32, f32)], q: &[(u32, f32)]) -> Vec<(u32, f32)> {
    // Merge by token id: both lists are short (top-k) or a vocabulary at most.
    let mut ps: Vec<(u32, f64)> = p.iter().map(|&(t, v)| (t, mass(v))).collect();
    let mut qs: Vec<(u32, f64)> = q.iter().map(|&(t, v)| (t, mass(v))).collect();
    ps.sort_unstable_by_key(|&(t, _)| t);
    qs.sort_unstable_by_key(|&(t, _)| t);
    let mut out: Vec<(u32, f64)> = Vec::new();
    let mut j = 0;
    let mut i = 0;
    while i < ps.len() {
        let (t, mut pv) = ps[i];
        // Duplicate ids (not produced by the sampler) are summed.
        while i + 1 < ps.len() && ps[i + 1].0 == t {
            i += 1;
            pv += ps[i].1;
        }
        i += 1;
        while j < qs.len() && qs[j].0 < t {
            j += 1;
        }
        let mut qv = 0.0;
        while j < qs.len() && qs[j].0 == t {
            qv += qs[j].1;
            j += 1;
        }
        let r = pv - qv;
        if r > 0.0 {
            out.push((t, r));
        }
    }
    let total: f64 = out.iter().map(|&(_, r)| r).sum();
    if total <= 0.0 || !total.is_finite() {
        return Vec::new();
    }
    out.into_iter()
        .map(|(t, r)| (t, (r / total) as f32))
        .filter(|&(_, r)| r > 0.0)
        .collect()
}

/// The rejection-sampling test of draft token `x` drawn from `q`, against the target's `p`, with
/// the uniform numbers `u_accept` (the coin) and `u_residual` (the replacement draw), both in
/// `[0, 1)`. Accepts iff `u_accept < min(1, p(x)/q(x))`; otherwise draws the replacement from
/// [`residual`]`(p, q)`, or from `p` itself when rounding left the residual empty.
pub fn verify_token(
    p: &[(u32, f32)],
    q: &[(u32, f32)],
    x: u32,
    u_accept: f64,
    u_residual: f64,
) -> Verdict {
    if u_accept < acceptance_probability(p, q, x) {
        return Verdict::Accepted;
    }
    let r = residual(p, q);
    let from = if r.is_empty() { p } else { &r };
    Verdict::Rejected(draw(from, u_residual))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::position_uniform;

    fn close(a: &[(u32, f32)], b: &[(u32, f32)]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-6)
    }

    #[test]
    fn equal_distributions_accept_every_draft() {
        let p = [(3, 0.5), (0, 0.25), (7, 0.25)];
        // Same distribution listed in another order.
        let q = [(0, 0.25), (7, 0.25), (3, 0.5)];
        for x in [0, 3, 7] {
            assert_eq!(acceptance_probability(&p, &q, x), 1.0);
            for i in 0..200 {
                let u = position_uniform(9, i, LANE_ACCEPT);
                assert_eq!(verify_token(&p, &q, x, u, 0.5), Verdict::Accepted);
            }
        }
        assert!(residual(&p, &q).is_empty());
    }

    #[test]
    fn draft_mass_the_target_lacks_is_always_rejected() {
        let p = [(0, 0.6), (1, 0.4)];
        let q = [(0, 0.3), (1, 0.2), (2, 0.5)];
        assert_eq!(acceptance_probability(&p, &q, 2), 0.0);
        for i in 0..500 {
            let ua = position_uniform(1, i, LANE_ACCEPT);
            let ur = position_uniform(1, i, LANE_RESIDUAL);
            match verify_token(&p, &q, 2, ua, ur) {
                Verdict::Rejected(t) => assert!(t == 0 || t == 1, "replacement {t}"),
                Verdict::Accepted => panic!("token 2 has no target mass"),
            }
        }
        // Even the smallest coin cannot keep it.
        assert!(matches!(
            verify_token(&p, &q, 2, 0.0, 0.0),
            Verdict::Rejected(_)
        ));
    }

    #[test]
    fn acceptance_is_the_probability_ratio() {
        let p = [(0, 0.2), (1, 0.8)];
        let q = [(0, 0.8), (1, 0.2)];
        assert!((acceptance_probability(&p, &q, 0) - 0.25).abs() < 1e-6);
        assert_eq!(acceptance_probability(&p, &q, 1), 1.0);
        assert_eq!(verify_token(&p, &q, 0, 0.2499, 0.0), Verdict::Accepted);
        // Rejected: the residual is all on token 1.
        assert_eq!(verify_token(&p, &q, 0, 0.2501, 0.0), Verdict::Rejected(1));
        // A token q lacks but p has (never drawn from q in practice) is kept.
        assert_eq!(acceptance_probability(&p, &[(0, 1.0)], 1), 1.0);
    }

    #[test]
    fn residual_is_normalised_positive_part_of_the_difference() {
        // p - q = [0.4, 0.1, -0.1, -0.4] → max(0, ·) = [0.4, 0.1] → / 0.5.
        let p = [(2, 0.2), (0, 0.5), (1, 0.3)];
        let q = [(3, 0.4), (2, 0.3), (1, 0.2), (0, 0.1)];
        assert!(close(&residual(&p, &q), &[(0, 0.8), (1, 0.2)]));
        // Disjoint supports: the residual is p.
        assert!(close(
            &residual(&[(5, 0.75), (9, 0.25)], &[(1, 1.0)]),
            &[(5, 0.75), (9, 0.25)]
        ));
        // Garbage masses count as zero.
        assert!(close(
            &residual(&[(0, f32::NAN), (1, 1.0)], &[(1, -3.0)]),
            &[(1, 1.0)]
        ));
    }

    /// Empirical distribution of the emitted token over `n` trials of one drafted position:
    /// x ~ q from the draft lane, then `decide` (the procedure under test) with the coin and
    /// residual lanes. Every trial is its own position, so the numbers are independent.
    fn emitted(q: &[(u32, f32)], n: u64, decide: impl Fn(u32, f64, f64) -> u32) -> [f64; 4] {
        let mut hist = [0.0f64; 4];
        for i in 0..n {
            let x = draw(q, position_uniform(2024, i, LANE_DRAFT));
            let t = decide(
                x,
                position_uniform(2024, i, LANE_ACCEPT),
                position_uniform(2024, i, LANE_RESIDUAL),
            );
            hist[t as usize] += 1.0 / n as f64;
        }
        hist
    }

    fn max_deviation(h: &[f64; 4], p: &[f64; 4]) -> f64 {
        h.iter()
            .zip(p)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn emitted_tokens_follow_the_target_distribution() {
        let p_dense = [0.5, 0.3, 0.2, 0.0];
        let p = [(0, 0.5), (1, 0.3), (2, 0.2)];
        let q = [(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)];
        let n = 20_000;
        // Each frequency has a standard deviation of at most sqrt(0.25 / n) ≈ 0.0035: the
        // tolerance is ~5.7 of them (and the draws are fixed by the seed, so never flaky).
        let tol = 0.02;
        let right = emitted(&q, n, |x, ua, ur| match verify_token(&p, &q, x, ua, ur) {
            Verdict::Accepted => x,
            Verdict::Rejected(t) => t,
        });
        let dev = max_deviation(&right, &p_dense);
        assert!(dev < tol, "emitted {right:?} vs p {p_dense:?}: {dev}");

        // Wrong implementations must fail the same tolerance by a wide margin, else the check
        // above would prove nothing:
        // * always accepting emits q: token 0 at 0.1 instead of 0.5 (deviation 0.4);
        // * resampling from p instead of the residual emits min(p, q) + P(reject)·p with
        //   Σ min(p, q) = 0.5, i.e. [0.35, 0.35, 0.3, 0]: deviation 0.15 on token 0;
        // * keeping the draft with probability p(x) instead of p(x)/q(x) (with the correct
        //   residual) keeps q·p = [0.05, 0.06, 0.06, 0] and sends the other 0.83 to the residual
        //   [0.8, 0.2, 0, 0]: [0.71, 0.23, 0.06, 0], deviation 0.21 on token 0.
        let always_accept = emitted(&q, n, |x, _, _| x);
        let resample_p = emitted(&q, n, |x, ua, ur| {
            if ua < acceptance_probability(&p, &q, x) {
                x
            } else {
                draw(&p, ur)
            }
        });
        let accept_by_p = emitted(&q, n, |x, ua, ur| {
            if ua < prob_of(&p, x) {
                x
            } else {
                draw(&residual(&p, &q), ur)
            }
        });
        for (name, h, at_least) in [
            ("always accept", always_accept, 0.35),
            ("resample from p", resample_p, 0.12),
            ("accept with p(x)", accept_by_p, 0.18),
        ] {
            let dev = max_deviation(&h, &p_dense);
            assert!(dev > at_least, "{name}: {h:?} deviates only {dev}");
            assert!(dev > 5.0 * tol, "{name} would pass the tolerance");
        }
    }
}
