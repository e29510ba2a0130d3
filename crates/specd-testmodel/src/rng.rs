//! Seeded weights: uniform in ±√3·σ (standard deviation σ), from ChaCha8 so every platform writes
//! the same file for the same seed.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// A per-tensor generator: the stream is derived from the tensor name, so adding a tensor does
/// not change the others.
pub struct WeightRng(ChaCha8Rng);

impl WeightRng {
    pub fn new(seed: u64, name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(h);
        WeightRng(r)
    }

    /// `n` values with standard deviation `std` around `mean`.
    pub fn fill(&mut self, n: usize, mean: f32, std: f32) -> Vec<f32> {
        let a = std * 3f32.sqrt();
        (0..n)
            .map(|_| {
                let u = (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32;
                mean + a * (2.0 * u - 1.0)
            })
            .collect()
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32;
                lo + (hi - lo) * u
            })
            .collect()
    }
}
