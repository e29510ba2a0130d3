//! The synthetic drafter (tests and benchmarks only): proposes the target's *true* continuation,
//! taken from a reference run, corrupted so that draft position i is accepted with the
//! configured **unconditional** probability P_i (llama.cpp's `--spec-synth-rates` meaning). One
//! uniform u is drawn per round and the first k = #{i : u < P_i} positions are kept true (P must
//! not increase). Unlike a coin flip per drafted token (which makes an engine emit invalid text),
//! the output stays exactly the plain output, whatever the acceptance rate.

use super::Drafter;
use crate::SpecError;
use std::sync::Arc;

/// Synthetic drafter over a reference token sequence (prompt + plain continuation).
pub struct Synthetic {
    reference: Arc<Vec<u32>>,
    rates: Vec<f32>,
    seed: u64,
    n_vocab: u32,
}

/// Unconditional per-position rates for a constant per-token (conditional) acceptance `a` over
/// `n` positions: `[a, a², …, aⁿ]`.
pub fn rates_for_per_token(a: f32, n: usize) -> Vec<f32> {
    (1..=n).map(|i| a.powi(i as i32)).collect()
}

/// Rates whose mean acceptance length (accepted + the target's own token) is `len`, with a
/// constant per-token acceptance over `n` positions (found by bisection).
pub fn rates_for_mean_length(len: f32, n: usize) -> Vec<f32> {
    let target = (len - 1.0).clamp(0.0, n as f32);
    let mean = |a: f32| -> f32 { (1..=n).map(|i| a.powi(i as i32)).sum() };
    let (mut lo, mut hi) = (0f32, 1f32);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if mean(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    rates_for_per_token(0.5 * (lo + hi), n)
}

impl Synthetic {
    /// `rates[i]`: unconditional acceptance probability of draft position i; the draft is at
    /// most `rates.len()` long.
    pub fn new(reference: Arc<Vec<u32>>, rates: Vec<f32>, seed: u64, n_vocab: u32) -> Self {
        // Enforce non-increasing rates: position i cannot be accepted more often than i−1.
        let mut r = rates;
        for i in 1..r.len() {
            r[i] = r[i].min(r[i - 1]);
        }
        Synthetic {
            reference,
            rates: r,
            seed,
            n_vocab,
        }
    }
    /// Deterministic uniform in [0,1) for a sequence position.
    fn coin(&self, pos: usize) -> f32 {
        let mut x = self.seed ^ (pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        (x >> 40) as f32 / (1u64 << 24) as f32
    }
}

impl Drafter for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        let p = tokens.len();
        if p > self.reference.len() || self.reference[..p] != *tokens {
            return Ok(Vec::new()); // off the reference path
        }
        let n = n_max.min(self.rates.len());
        let u = self.coin(p);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let Some(&t) = self.reference.get(p + i) else {
                break;
            };
            if u < self.rates[i] {
                out.push(t);
            } else {
                // A token that is certainly not the target's: rejected at this position.
                out.push((t + 1) % self.n_vocab.max(2));
            }
        }
        Ok(out)
    }
}
