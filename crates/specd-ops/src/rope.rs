//! Rotary position embeddings: Llama's adjacent-pair form, NEOX's split-half form, and Qwen3.5's
//! interleaved multi-section form (IMROPE) for text positions.

/// How dimensions are paired and which pairs rotate.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeMode {
    /// Pairs (2m, 2m+1) — llama.cpp `LLAMA_ROPE_TYPE_NORM` (Llama).
    Norm,
    /// Pairs (m, m + n_rot/2) — NEOX (Qwen2/3, Qwen3-Next).
    Neox,
    /// NEOX pairing; pair m rotates only if its section takes the text position (see
    /// docs/qwen35.md §3.4: for text tokens the 4th section's position is 0, i.e. no rotation).
    IMrope { sections: [u32; 4] },
}

/// Precomputed rotation table for one model.
#[derive(Debug, Clone)]
pub struct Rope {
    n_rot: usize,
    neox: bool,
    inv_freq: Vec<f32>,
    rotates: Vec<bool>,
}

impl Rope {
    /// `n_rot` rotary dims (even), frequency base, pairing mode.
    pub fn new(n_rot: usize, base: f32, mode: RopeMode) -> Self {
        let half = n_rot / 2;
        let inv_freq = (0..half)
            .map(|m| (base as f64).powf(-2.0 * m as f64 / n_rot as f64) as f32)
            .collect();
        let rotates = (0..half)
            .map(|m| match &mode {
                RopeMode::IMrope { sections } => {
                    let total: u32 = sections.iter().sum();
                    if total == 0 {
                        return false;
                    }
                    let sector = m as u32 % total;
                    let s = |i: usize| sector % 3 == i as u32 && sector < 3 * sections[i];
                    s(0) || s(1) || s(2)
                }
                _ => true,
            })
            .collect();
        Rope {
            n_rot,
            neox: !matches!(mode, RopeMode::Norm),
            inv_freq,
            rotates,
        }
    }

    /// Rotates the first `n_rot` dims of one head vector for position `pos`.
    pub fn apply(&self, head: &mut [f32], pos: u32) {
        let half = self.n_rot / 2;
        for m in 0..half {
            if !self.rotates[m] {
                continue;
            }
            let theta = pos as f32 * self.inv_freq[m];
            let (s, c) = theta.sin_cos();
            let (i, j) = if self.neox {
                (m, m + half)
            } else {
                (2 * m, 2 * m + 1)
            };
            let (x0, x1) = (head[i], head[j]);
            head[i] = x0 * c - x1 * s;
            head[j] = x0 * s + x1 * c;
        }
    }

    /// Applies [`Rope::apply`] to every head of a `[n_heads × head_dim]` row.
    pub fn apply_heads(&self, row: &mut [f32], head_dim: usize, pos: u32) {
        for h in row.chunks_exact_mut(head_dim) {
            self.apply(h, pos);
        }
    }
}
