//! The filter steps of the sampler chain, on candidate lists.
//!
//! Semantics follow llama.cpp's samplers (`llama-sampling.cpp`); the code is
//! independent. Logits are "cleaned" on entry: NaN becomes `-inf` (a NaN
//! token is never preferred and never sampled) and `-0.0` becomes `+0.0` (so
//! the total order used for sorting agrees with `>` and ties go to the lowest
//! id everywhere).

use std::cmp::Ordering;

use crate::params::SamplerParams;

/// One surviving token: id, logit after penalties, and (once computed)
/// probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Reusable vocabulary-sized buffers of the chain.
#[derive(Debug, Default)]
pub(crate) struct Work {
    /// Contiguous exp weights (vectorised softmax).
    pub w: Vec<f32>,
    /// Histogram bucket of each entry (top-p).
    pub keys: Vec<u16>,
}

/// NaN → `-inf`, `-0.0` → `+0.0`; every other value unchanged.
#[inline]
pub(crate) fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        // Adding +0.0 maps -0.0 to +0.0 and leaves everything else alone.
        x + 0.0
    }
}

/// Descending logit, ties broken by ascending id: a total order on cleaned
/// candidates, so unstable sorts and selections are deterministic.
#[inline]
pub(crate) fn desc(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Penalised logit of a token occurring `count > 0` times in the window.
///
/// llama.cpp: non-positive logits are multiplied by `repeat_penalty`,
/// positive ones divided (so the penalty always lowers the logit for
/// `repeat_penalty > 1`), then `count * frequency + presence` is subtracted.
pub(crate) fn penalize(logit: f32, count: u32, p: &SamplerParams) -> f32 {
    let l = clean(logit);
    let l = if l <= 0.0 {
        l * p.repeat_penalty
    } else {
        l / p.repeat_penalty
    };
    // Extreme penalties can produce inf - inf; clean keeps the result ordered.
    clean(l - (count as f32 * p.frequency_penalty + p.presence_penalty))
}

/// Largest cleaned value of a slice (`-inf` when empty or all NaN).
pub(crate) fn max_of_slice(xs: &[f32]) -> f32 {
    // Independent per-lane maxima vectorise; one running maximum would be a
    // serial dependency chain. NaN loses every `>`, as in the cleaned order.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for ch in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(ch) {
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *m = if x > *m { x } else { *m };
    }
    max_of(lanes.into_iter())
}

/// Index of the largest cleaned value, ties → lowest index; 0 when empty
/// or when every value is `-inf`/NaN.
pub(crate) fn argmax(xs: &[f32]) -> usize {
    // Two vectorisable passes: the maximum, then the first index holding it.
    // `-0.0 == 0.0` and NaN never equals anything, which is exactly the
    // cleaned order, so no per-element cleaning is needed.
    let max = max_of_slice(xs);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    xs.iter().position(|&x| x == max).unwrap_or(0)
}

/// `e^x` for `x <= 0` (NaN/`-inf` → 0), to ~1 ulp.
///
/// Plain f32 arithmetic (Cody–Waite reduction, Cephes `expf` minimax
/// polynomial, exponent by bit construction) instead of the platform libm:
/// it vectorises, which matters over a 248k vocabulary, and gives the same
/// bits on every platform, so a seeded request reproduces across machines.
#[inline]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    // Below this the result would be subnormal; flushing to 0 keeps the
    // exponent construction simple and changes no sampling decision.
    const MIN_X: f32 = -87.0;
    let valid = x >= MIN_X; // false for NaN and -inf too
    let xc = if valid { x.min(0.0) } else { 0.0 };
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    // The integer n also sits in the low mantissa bits of `shifted`; reading
    // it from there avoids a saturating float→int cast that blocks SIMD.
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut q = 1.987_569_2e-4f32;
    q = q * r + 1.398_199_9e-3;
    q = q * r + 8.333_452e-3;
    q = q * r + 4.166_579_6e-2;
    q = q * r + 1.666_666_5e-1;
    q = q * r + 0.5; // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    let poly = q * r * r + r + 1.0;
    // n is an integer in [-126, 0]: 2^n built directly from its exponent bits.
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if valid {
        poly * scale
    } else {
        0.0
    }
}

/// Largest cleaned value of `xs` (`-inf` when empty or all NaN).
pub(crate) fn max_of(xs: impl Iterator<Item = f32>) -> f32 {
    // `>` ignores NaN, matching the cleaned order.
    xs.fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// Writes `exp((x - max) / temp)` for every `x` of `w` in place and returns
/// the sum (`max` finite, `temp > 0`).
///
/// `w` is contiguous, so the exp loop vectorises; the sum runs in a fixed
/// lane pattern (deterministic, and not a serial dependency chain).
fn exp_weights(w: &mut [f32], max: f32, temp: f32) -> f64 {
    const LANES: usize = 8;
    for v in w.iter_mut() {
        // Subtracting the max keeps the argument <= 0; the max maps to 1.
        *v = exp_nonpositive((*v - max) / temp);
    }
    let mut lanes = [0.0f64; LANES];
    let mut chunks = w.chunks_exact(LANES);
    for ch in &mut chunks {
        for (acc, &v) in lanes.iter_mut().zip(ch) {
            *acc += f64::from(v);
        }
    }
    for (acc, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *acc += f64::from(v);
    }
    lanes.iter().sum()
}

/// Writes `softmax(logit / temp)` into `p` (`temp > 0`), using `w` as
/// scratch.
///
/// Degenerate inputs are resolved as limits: if the maximum is `+inf` the
/// mass is shared equally by the `+inf` candidates; if every logit is `-inf`
/// the candidate with the lowest id gets all of it.
pub(crate) fn softmax(c: &mut [Cand], temp: f32, work: &mut Work) {
    if c.is_empty() {
        return;
    }
    let max = max_of(c.iter().map(|x| x.logit));
    if max == f32::NEG_INFINITY {
        let lowest = c.iter().map(|x| x.id).min().unwrap_or(0);
        for x in c.iter_mut() {
            x.p = if x.id == lowest { 1.0 } else { 0.0 };
        }
        return;
    }
    if max == f32::INFINITY {
        let n = c.iter().filter(|x| x.logit == f32::INFINITY).count();
        let share = 1.0 / n as f32;
        for x in c.iter_mut() {
            x.p = if x.logit == f32::INFINITY { share } else { 0.0 };
        }
        return;
    }
    // Gather into a contiguous buffer: exp over the 12-byte candidate
    // structs does not vectorise, over plain f32 it does.
    let w = &mut work.w;
    w.clear();
    w.extend(c.iter().map(|x| x.logit));
    // sum >= 1 because the maximum contributes exp(0).
    let inv = 1.0 / exp_weights(w, max, temp);
    for (x, &v) in c.iter_mut().zip(w.iter()) {
        x.p = (f64::from(v) * inv) as f32;
    }
}

/// All of `view` as candidates, in id order.
pub(crate) fn all_candidates(view: &[f32], out: &mut Vec<Cand>) {
    out.clear();
    out.extend(view.iter().enumerate().map(|(i, &l)| Cand {
        id: i as u32,
        logit: clean(l),
        p: 0.0,
    }));
}

/// The `k` best entries of `view` (0 < k < len), sorted by [`desc`].
///
/// One pass with a rising admission threshold: a buffer collects candidates
/// and, when full, is cut back to its best `k` by partial selection; the k-th
/// logit then becomes the bar a later token must strictly exceed. Strictly,
/// because a later token has a larger id and therefore loses a tie. Most of a
/// large vocabulary is rejected by a single comparison, which is cheaper
/// than materialising every candidate and selecting over all of them.
pub(crate) fn top_k_of(view: &[f32], k: usize, out: &mut Vec<Cand>) {
    out.clear();
    let cap = k.saturating_mul(4).max(1024);
    let mut bar: Option<f32> = None;
    const BLOCK: usize = 16;
    for (blk, chunk) in view.chunks(BLOCK).enumerate() {
        // Whole-block rejection with a vectorisable test: once the bar is
        // up, most blocks of a large vocabulary have no member above it.
        // Raw `>` is fine here: NaN fails it, and -0.0 vs a 0.0 bar is a tie
        // the later (higher) id loses.
        if let Some(b) = bar {
            if !chunk.iter().fold(false, |any, &l| any | (l > b)) {
                continue;
            }
        }
        for (j, &l) in chunk.iter().enumerate() {
            if !bar.is_none_or(|b| l > b) {
                continue;
            }
            out.push(Cand {
                id: (blk * BLOCK + j) as u32,
                logit: clean(l),
                p: 0.0,
            });
            if out.len() >= cap {
                out.select_nth_unstable_by(k - 1, desc);
                out.truncate(k);
                bar = Some(out[k - 1].logit);
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, desc);
        out.truncate(k);
    }
    out.sort_unstable_by(desc);
}

/// Locally typical filter (llama.cpp `typical`): with `H` the entropy of the
/// candidates, rank them by `|-ln p - H|` ascending and keep the shortest
/// prefix whose mass exceeds `p` (strictly), at least one. The output is in
/// typicality order, hence no longer sorted by logit.
pub(crate) fn typical(c: &mut Vec<Cand>, sorted: &mut bool, mass: f32, work: &mut Work) {
    if c.len() <= 1 {
        return;
    }
    if !*sorted {
        c.sort_unstable_by(desc);
    }
    softmax(c, 1.0, work);
    let entropy: f64 = c
        .iter()
        .filter(|x| x.p > 0.0)
        .map(|x| -f64::from(x.p) * f64::from(x.p).ln())
        .sum();
    let mut scored: Vec<(f64, Cand)> = c
        .iter()
        .map(|x| {
            // p == 0 gives an infinite score: least typical of all.
            let s = (-f64::from(x.p).ln() - entropy).abs();
            (s, *x)
        })
        .collect();
    // Stable: equal scores keep descending-probability order.
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut cum = 0.0f64;
    let mut keep = scored.len();
    for (i, (_, x)) in scored.iter().enumerate() {
        cum += f64::from(x.p);
        if cum > f64::from(mass) {
            keep = i + 1;
            break;
        }
    }
    c.clear();
    c.extend(scored[..keep].iter().map(|&(_, x)| x));
    *sorted = false;
}

/// Nucleus filter (llama.cpp `top-p`) on a candidate list: probabilities
/// at temperature 1, keep the shortest prefix by descending probability
/// whose cumulative mass reaches `p` (`>=`), at least one candidate.
///
/// A sorted list is simply cut. An unsorted one keeps its order: the cut is
/// located without sorting (see [`locate_bucket`]).
pub(crate) fn top_p(c: &mut Vec<Cand>, sorted: bool, p: f32, work: &mut Work) {
    if c.is_empty() {
        return;
    }
    softmax(c, 1.0, work);
    let target = f64::from(p);
    if sorted {
        let mut cum = 0.0f64;
        for i in 0..c.len() {
            cum += f64::from(c[i].p);
            if cum >= target {
                c.truncate(i + 1);
                return;
            }
        }
        return;
    }
    let max = max_of(c.iter().map(|x| x.logit));
    let pivot = if max.is_finite() {
        let keys = &mut work.keys;
        keys.clear();
        keys.extend(c.iter().map(|x| bucket_of(max, x.logit)));
        locate_bucket(keys, c.iter().map(|x| x.p), target).and_then(|(b, before)| {
            let mut members: Vec<Cand> = c
                .iter()
                .zip(keys.iter())
                .filter(|&(_, &k)| k == b)
                .map(|(x, _)| *x)
                .collect();
            members.sort_unstable_by(desc);
            cut_in(&members, before, target)
        })
    } else {
        // Degenerate (all -inf, or some +inf): softmax put all the mass on
        // a few candidates, which outrank every zero-mass one, so sorting
        // just those is enough.
        let mut pos: Vec<Cand> = c.iter().copied().filter(|x| x.p > 0.0).collect();
        pos.sort_unstable_by(desc);
        cut_in(&pos, 0.0, target)
    };
    if let Some(pivot) = pivot {
        // Keep everything ranked at or before the pivot.
        c.retain(|x| desc(x, &pivot) != Ordering::Greater);
    }
}

/// Top-p straight from the (penalised) logits, for the common "top-k
/// disabled" configuration: survivors go to `out` in id order, with the
/// same result as [`all_candidates`] followed by [`top_p`] on the unsorted
/// list (up to rounding), without materialising a candidate per token.
pub(crate) fn top_p_of(view: &[f32], p: f32, out: &mut Vec<Cand>, work: &mut Work) {
    let max = max_of_slice(view);
    if !max.is_finite() {
        // Rare garbage input: take the general path.
        all_candidates(view, out);
        top_p(out, false, p, work);
        return;
    }
    let Work { w, keys } = work;
    w.clear();
    w.extend_from_slice(view);
    // Unnormalised weights (NaN → 0); the target mass is scaled instead.
    let z = exp_weights(w, max, 1.0);
    let target = f64::from(p) * z;
    keys.clear();
    keys.extend(view.iter().map(|&l| bucket_of(max, clean(l))));
    out.clear();
    let Some((b, before)) = locate_bucket(keys, w.iter().copied(), target) else {
        all_candidates(view, out);
        return;
    };
    let cand = |i: usize| Cand {
        id: i as u32,
        logit: clean(view[i]),
        p: w[i],
    };
    let mut members: Vec<Cand> = keys
        .iter()
        .enumerate()
        .filter(|&(_, &k)| k == b)
        .map(|(i, _)| cand(i))
        .collect();
    members.sort_unstable_by(desc);
    let Some(pivot) = cut_in(&members, before, target) else {
        return;
    };
    // Everything in earlier buckets, plus the pivot bucket up to the pivot.
    for (i, &k) in keys.iter().enumerate() {
        if k < b || (k == b && desc(&cand(i), &pivot) != Ordering::Greater) {
            out.push(Cand { p: 0.0, ..cand(i) });
        }
    }
}

/// Logit buckets of the top-p histogram: `BUCKETS_PER_NAT` per unit of
/// logit below the maximum; everything further than `BUCKETS / BUCKETS_PER_NAT`
/// = 32 nats below shares the last bucket (each such token has < e^-32 of
/// the maximum's mass, so the cut practically never falls there, and it would
/// still be exact if it did).
const BUCKETS: usize = 4096;
const BUCKETS_PER_NAT: f32 = 128.0;

/// Histogram bucket of a cleaned logit given the finite maximum: monotone
/// (a higher logit never gets a later bucket).
#[inline]
fn bucket_of(max: f32, logit: f32) -> u16 {
    // min() first so the cast cannot saturate (max - (-inf) = +inf is
    // clamped; NaN cannot occur on cleaned logits).
    ((max - logit) * BUCKETS_PER_NAT).min((BUCKETS - 1) as f32) as u16
}

/// Sums `masses` per bucket of `keys` and walks the buckets in order to the
/// one where the running mass reaches `target`. Returns that bucket and the
/// mass of all earlier buckets, or `None` when rounding keeps the total
/// below `target` (keep everything).
///
/// Because buckets are monotone in the logit, only the returned bucket's
/// members need sorting to find the exact cut: linear time even when the
/// top-p set spans most of the vocabulary (a flat distribution).
fn locate_bucket(
    keys: &[u16],
    masses: impl Iterator<Item = f32>,
    target: f64,
) -> Option<(u16, f64)> {
    let mut mass = vec![0.0f64; BUCKETS];
    for (&k, m) in keys.iter().zip(masses) {
        mass[usize::from(k)] += f64::from(m);
    }
    let mut before = 0.0f64;
    for (b, &m) in mass.iter().enumerate() {
        if before + m >= target {
            return Some((b as u16, before));
        }
        before += m;
    }
    None
}

/// First element of sorted `xs` at which `before` plus the running mass
/// reaches `target` (the last one if rounding prevents it).
fn cut_in(xs: &[Cand], mut before: f64, target: f64) -> Option<Cand> {
    for x in xs {
        before += f64::from(x.p);
        if before >= target {
            return Some(*x);
        }
    }
    xs.last().copied()
}

/// Min-p filter (llama.cpp `min-p`): keep candidates with
/// `p >= min_p * p_max`, i.e. `logit >= max_logit + ln(min_p)` at
/// temperature 1. The best candidate always survives. Order is preserved.
pub(crate) fn min_p(c: &mut Vec<Cand>, p: f32) {
    if c.is_empty() {
        return;
    }
    let bar = max_of(c.iter().map(|x| x.logit)) + p.ln();
    c.retain(|x| x.logit >= bar);
}

/// Runs top-k → typical → top-p → min-p on penalised logits `view`, leaving
/// the survivors in `out` (`w` is scratch). Returns whether `out` is sorted
/// by [`desc`] (true when top-k ran; otherwise survivors are in id order, or
/// in typicality order after the typical filter).
pub(crate) fn filter(
    view: &[f32],
    params: &SamplerParams,
    out: &mut Vec<Cand>,
    work: &mut Work,
) -> bool {
    let mut sorted = false;
    let k = usize::try_from(params.top_k).unwrap_or(0);
    let typical_on = params.typical_p < 1.0;
    let top_p_on = params.top_p < 1.0;
    let mut top_p_done = false;
    if k > 0 && k < view.len() {
        top_k_of(view, k, out);
        sorted = true;
    } else if k == 0 && !typical_on && top_p_on {
        top_p_of(view, params.top_p, out, work);
        top_p_done = true;
    } else {
        all_candidates(view, out);
        if k > 0 {
            // llama.cpp's top-k sorts even when it keeps everything.
            out.sort_unstable_by(desc);
            sorted = true;
        }
    }
    if typical_on {
        typical(out, &mut sorted, params.typical_p, work);
    }
    if top_p_on && !top_p_done {
        top_p(out, sorted, params.top_p, work);
    }
    if params.min_p > 0.0 {
        min_p(out, params.min_p);
    }
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Cand> {
        let mut v = Vec::new();
        all_candidates(logits, &mut v);
        v
    }

    fn ids(c: &[Cand]) -> Vec<u32> {
        c.iter().map(|x| x.id).collect()
    }

    fn off() -> SamplerParams {
        SamplerParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            ..SamplerParams::default()
        }
    }

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpositive(x));
            worst = worst.max(((got - want) / want).abs());
            x -= 0.001_37;
        }
        assert!(worst < 3e-7, "max relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(f32::NAN), 0.0);
    }

    #[test]
    fn clean_maps_nan_and_negative_zero() {
        assert_eq!(clean(f32::NAN), f32::NEG_INFINITY);
        assert!(clean(-0.0).is_sign_positive());
        assert_eq!(clean(1.5), 1.5);
        assert_eq!(clean(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn argmax_ties_and_garbage() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[-0.0, 0.0]), 0); // equal after cleaning
        assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn penalty_formula() {
        let p = SamplerParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplerParams::default()
        };
        // Positive: divided. 3 / 2 - (2 * 0.5 + 0.25) = 0.25
        assert_eq!(penalize(3.0, 2, &p), 0.25);
        // Negative: multiplied. -1 * 2 - (1 * 0.5 + 0.25) = -2.75
        assert_eq!(penalize(-1.0, 1, &p), -2.75);
        // Zero counts as non-positive: 0 * 2 - 0.75.
        assert_eq!(penalize(0.0, 1, &p), -0.75);
        assert_eq!(penalize(f32::NAN, 1, &p), f32::NEG_INFINITY);
        let huge = SamplerParams {
            frequency_penalty: f32::MAX,
            ..SamplerParams::default()
        };
        // inf - inf would be NaN; it must come out ordered.
        assert!(!penalize(f32::INFINITY, 4, &huge).is_nan());
    }

    #[test]
    fn softmax_values_and_limits() {
        let mut c = cands(&[0.0, (3.0f32).ln()]);
        softmax(&mut c, 1.0, &mut Work::default());
        assert!((c[0].p - 0.25).abs() < 1e-6 && (c[1].p - 0.75).abs() < 1e-6);
        // Temperature 0.5 squares the ratio: 1 : 9.
        softmax(&mut c, 0.5, &mut Work::default());
        assert!((c[0].p - 0.1).abs() < 1e-6 && (c[1].p - 0.9).abs() < 1e-6);
        let mut c = cands(&[f32::INFINITY, 5.0, f32::INFINITY]);
        softmax(&mut c, 1.0, &mut Work::default());
        assert_eq!(c.iter().map(|x| x.p).collect::<Vec<_>>(), [0.5, 0.0, 0.5]);
        let mut c = cands(&[f32::NEG_INFINITY, f32::NAN]);
        c.reverse();
        softmax(&mut c, 1.0, &mut Work::default());
        assert_eq!(
            c.iter().map(|x| (x.id, x.p)).collect::<Vec<_>>(),
            [(1, 0.0), (0, 1.0)]
        );
    }

    #[test]
    fn top_k_keeps_k_best_with_lowest_id_ties() {
        let v = [1.0, 5.0, 3.0, 5.0, f32::NAN, 4.0, 3.0];
        let mut out = Vec::new();
        top_k_of(&v, 3, &mut out);
        assert_eq!(ids(&out), [1, 3, 5]);
        top_k_of(&v, 5, &mut out);
        assert_eq!(ids(&out), [1, 3, 5, 2, 6]);
        top_k_of(&v, 1, &mut out);
        assert_eq!(ids(&out), [1]);
    }

    #[test]
    fn top_k_threshold_path_matches_full_sort() {
        // Long enough to trigger several buffer compactions, with many ties.
        let v: Vec<f32> = (0..10_000u32)
            .map(|i| ((i * 7919) % 613) as f32 / 7.0)
            .collect();
        let mut full = cands(&v);
        full.sort_unstable_by(desc);
        for k in [1, 2, 40, 300, 2000] {
            let mut out = Vec::new();
            top_k_of(&v, k, &mut out);
            assert_eq!(out, full[..k].to_vec(), "k = {k}");
        }
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (ids 2, 0, 1, 3).
        let l = [
            (0.25f32).ln(),
            (0.125f32).ln(),
            (0.5f32).ln(),
            (0.125f32).ln(),
        ];
        let run = |p: f32, sorted: bool| {
            let mut c = cands(&l);
            if sorted {
                c.sort_unstable_by(desc);
            }
            top_p(&mut c, sorted, p, &mut Work::default());
            ids(&c)
        };
        // Unsorted input keeps its (id) order; sorted input stays sorted.
        for (p, unsorted, sorted) in [
            (0.49, vec![2], vec![2]),
            (0.6, vec![0, 2], vec![2, 0]),
            (0.74, vec![0, 2], vec![2, 0]),
            (0.8, vec![0, 1, 2], vec![2, 0, 1]),
            (0.0, vec![2], vec![2]), // at least one
            (0.999, vec![0, 1, 2, 3], vec![2, 0, 1, 3]),
        ] {
            assert_eq!(run(p, false), unsorted, "p = {p}");
            assert_eq!(run(p, true), sorted, "p = {p}");
        }
    }

    /// Reference top-p: full sort, then the shortest prefix reaching `p`.
    fn top_p_by_sorting(v: &[f32], p: f32) -> Vec<u32> {
        let mut c = cands(v);
        c.sort_unstable_by(desc);
        top_p(&mut c, true, p, &mut Work::default());
        let mut got = ids(&c);
        got.sort_unstable();
        got
    }

    #[test]
    fn top_p_histogram_matches_full_sort() {
        let peaked: Vec<f32> = (0..20_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 20) as f32 / 256.0)
            .collect();
        let flat: Vec<f32> = (0..20_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 20) as f32 / 4096.0 / 64.0)
            .collect();
        let mut ties = vec![1.0f32; 3000];
        ties.extend([5.0, f32::NAN, -3.0, f32::NEG_INFINITY]);
        let wide: Vec<f32> = (0..5000).map(|i| -(i as f32) * 0.05).collect();
        for (name, v) in [
            ("peaked", &peaked),
            ("flat", &flat),
            ("ties", &ties),
            ("wide", &wide),
        ] {
            // Not p → 1: there the cut sits among tokens whose masses are
            // below the rounding error of the total, and the two summation
            // orders may legitimately disagree by a few such tokens.
            for p in [0.0f32, 0.01, 0.3, 0.9, 0.95, 0.99] {
                let mut c = cands(v);
                top_p(&mut c, false, p, &mut Work::default());
                // Survivors stay in id order.
                assert!(c.windows(2).all(|w| w[0].id < w[1].id));
                let want = top_p_by_sorting(v, p);
                assert!(
                    ids(&c) == want,
                    "{name} p = {p}: {} vs {} kept",
                    c.len(),
                    want.len()
                );
                let mut direct = Vec::new();
                top_p_of(v, p, &mut direct, &mut Work::default());
                assert!(
                    ids(&direct) == want,
                    "{name} p = {p}: direct {} vs {} kept",
                    direct.len(),
                    want.len()
                );
            }
        }
    }

    #[test]
    fn top_p_degenerate_logits() {
        let v = [1.0, f32::INFINITY, 3.0, f32::INFINITY, f32::INFINITY];
        let mut c = cands(&v);
        top_p(&mut c, false, 0.5, &mut Work::default());
        assert_eq!(ids(&c), [1, 3]); // 1/3 each: two reach 0.5
        let mut direct = Vec::new();
        top_p_of(&v, 0.5, &mut direct, &mut Work::default());
        assert_eq!(ids(&direct), [1, 3]);
        let v = [f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY, f32::NAN];
        let mut c = cands(&v);
        top_p(&mut c, false, 0.9, &mut Work::default());
        assert_eq!(ids(&c), [0]);
        top_p_of(&v, 0.9, &mut direct, &mut Work::default());
        assert_eq!(ids(&direct), [0]);
    }

    #[test]
    fn min_p_is_relative_to_the_best() {
        // p ∝ 1, 0.5, 0.1, 0.05 → with min_p 0.1 keep the first three.
        let l = [0.0, (0.5f32).ln(), (0.1f32).ln() + 1e-6, (0.05f32).ln()];
        let mut c = cands(&l);
        min_p(&mut c, 0.1);
        assert_eq!(ids(&c), [0, 1, 2]);
        let mut c = cands(&l);
        min_p(&mut c, 0.6);
        assert_eq!(ids(&c), [0]);
        let mut c = cands(&l);
        min_p(&mut c, 1.0);
        assert_eq!(ids(&c), [0]);
        // Everything -inf: all tie with the max, all survive.
        let mut c = cands(&[f32::NEG_INFINITY; 3]);
        min_p(&mut c, 0.5);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn typical_prefers_tokens_near_the_entropy() {
        // p = 0.4, 0.3, 0.2, 0.1: H ≈ 1.2799; |-ln p - H| ≈
        // 0.364, 0.076, 0.330, 1.023 → order ids 1, 2, 0, 3.
        let l = [(0.4f32).ln(), (0.3f32).ln(), (0.2f32).ln(), (0.1f32).ln()];
        let run = |m: f32| {
            let mut c = cands(&l);
            let mut sorted = false;
            typical(&mut c, &mut sorted, m, &mut Work::default());
            assert!(!sorted);
            ids(&c)
        };
        assert_eq!(run(0.25), [1]);
        assert_eq!(run(0.45), [1, 2]);
        assert_eq!(run(0.6), [1, 2, 0]);
        assert_eq!(run(0.95), [1, 2, 0, 3]);
        assert_eq!(run(0.0), [1]);
    }

    #[test]
    fn filter_chain_order() {
        // top-k 3 then top-p 0.7 on the renormalised top-3, then min-p.
        let l = [
            (0.1f32).ln(),
            (0.4f32).ln(),
            (0.05f32).ln(),
            (0.3f32).ln(),
            (0.15f32).ln(),
        ];
        let p = SamplerParams {
            top_k: 3,
            top_p: 0.7,
            ..off()
        };
        let mut out = Vec::new();
        assert!(filter(&l, &p, &mut out, &mut Work::default()));
        // top-3 = {1: .4, 3: .3, 4: .15} renormalised: .47, .35, .18 → 0.82 ≥ 0.7 after two.
        assert_eq!(ids(&out), [1, 3]);
        let p = SamplerParams {
            min_p: 0.5,
            ..off()
        };
        assert!(!filter(&l, &p, &mut out, &mut Work::default()));
        assert_eq!(ids(&out), [1, 3]); // id order, unsorted
        let p = SamplerParams { top_k: 10, ..off() };
        assert!(filter(&l, &p, &mut out, &mut Work::default()));
        assert_eq!(ids(&out), [1, 3, 4, 0, 2]);
    }
}
