//! Log-probabilities of the raw model distribution, for API `logprobs`.

use crate::chain::{clean, desc, Cand};

/// The `n` most likely tokens under `log_softmax(logits)` (temperature 1, no
/// penalties or filters: what the model itself predicted), as
/// `(token, logprob)` pairs in descending order, ties → lowest id.
///
/// NaN logits count as `-inf`. If some logits are `+inf`, those share the
/// whole mass (`logprob = -ln(count)`) and every other token gets `-inf`.
/// `n` is clamped to the vocabulary size.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let norm = Normaliser::of(logits);
    let mut c: Vec<Cand> = Vec::with_capacity(logits.len());
    crate::chain::all_candidates(logits, &mut c);
    if n < c.len() {
        c.select_nth_unstable_by(n - 1, desc);
        c.truncate(n);
    }
    c.sort_unstable_by(desc);
    c.iter().map(|x| (x.id, norm.logprob(x.logit))).collect()
}

/// The log-probability of `token` under `log_softmax(logits)`, exactly as
/// [`top_logprobs`] reports it (so a token listed there has the same value);
/// `-inf` for an id outside `logits`.
pub fn token_logprob(logits: &[f32], token: u32) -> f32 {
    match logits.get(token as usize) {
        Some(&l) => Normaliser::of(logits).logprob(clean(l)),
        None => f32::NEG_INFINITY,
    }
}

/// What turns a cleaned logit into its log-probability.
struct Normaliser {
    max: f32,
    shift: f64,
    log_z: f64,
}

impl Normaliser {
    fn of(logits: &[f32]) -> Self {
        let max = logits
            .iter()
            .map(|&l| clean(l))
            .fold(f32::NEG_INFINITY, f32::max);
        // log-sum-exp in f64: a 248k-entry sum in f32 loses digits that matter
        // for the small logprobs clients display.
        let (shift, log_z) = if max == f32::INFINITY {
            let count = logits.iter().filter(|&&l| l == f32::INFINITY).count();
            (0.0, (count as f64).ln())
        } else if max == f32::NEG_INFINITY {
            (0.0, f64::INFINITY)
        } else {
            let sum: f64 = logits
                .iter()
                .map(|&l| (f64::from(clean(l)) - f64::from(max)).exp())
                .sum();
            (f64::from(max), sum.ln())
        };
        Normaliser { max, shift, log_z }
    }

    fn logprob(&self, logit: f32) -> f32 {
        let lp = if self.max == f32::INFINITY {
            if logit == f32::INFINITY {
                -self.log_z
            } else {
                f64::NEG_INFINITY
            }
        } else if self.max == f32::NEG_INFINITY {
            // No information at all: report every token as impossible
            // rather than inventing a distribution.
            f64::NEG_INFINITY
        } else {
            f64::from(logit) - self.shift - self.log_z
        };
        lp as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_values() {
        let l = [0.0f32, (3.0f32).ln(), f32::NAN, 0.0];
        let top = top_logprobs(&l, 3);
        assert_eq!(top.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 0, 3]);
        // Mass 3/5, 1/5, 1/5.
        assert!((top[0].1 - (0.6f32).ln()).abs() < 1e-6);
        assert!((top[1].1 - (0.2f32).ln()).abs() < 1e-6);
        assert_eq!(top[1].1, top[2].1);
        let all = top_logprobs(&l, 10);
        assert_eq!(all.len(), 4);
        assert_eq!(all[3], (2, f32::NEG_INFINITY));
        let total: f32 = all.iter().map(|x| x.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&l, 0).is_empty());
        assert!(top_logprobs(&[], 5).is_empty());
    }

    #[test]
    fn log_softmax_is_shift_invariant_for_large_logits() {
        let a = top_logprobs(&[1000.0, 999.0, 998.0], 3);
        let b = top_logprobs(&[0.0, -1.0, -2.0], 3);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.0, y.0);
            assert!((x.1 - y.1).abs() < 1e-5);
        }
    }

    #[test]
    fn token_logprob_matches_the_top_list() {
        let l = [0.3f32, -1.0, 2.5, f32::NAN, 2.5, 0.0];
        for (id, lp) in top_logprobs(&l, 6) {
            assert_eq!(token_logprob(&l, id).to_bits(), lp.to_bits(), "token {id}");
        }
        assert_eq!(token_logprob(&l, 6), f32::NEG_INFINITY);
    }

    #[test]
    fn infinite_logits() {
        let top = top_logprobs(&[f32::INFINITY, 1.0, f32::INFINITY], 3);
        assert_eq!(top[0], (0, -(2.0f32).ln()));
        assert_eq!(top[1], (2, -(2.0f32).ln()));
        assert_eq!(top[2], (1, f32::NEG_INFINITY));
        let none = top_logprobs(&[f32::NEG_INFINITY, f32::NAN], 2);
        assert_eq!(none, [(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)]);
    }
}
