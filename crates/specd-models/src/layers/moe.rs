//! Mixture-of-experts FFN, as llama.cpp computes it for qwen35moe (`build_moe_ffn` with softmax
//! gating and normalised weights, plus a gated shared expert) — shared with qwen3next.
//!
//! Per row: router logits `ffn_gate_inp · x` → softmax over all experts → the `k` most probable
//! experts (ties: the lower index) → their probabilities divided by their sum → each selected
//! expert's SwiGLU FFN (`ffn_{gate,up,down}_exps`, or the merged `ffn_gate_up_exps`) scaled by
//! its weight and summed in selection order; then the shared expert `ffn_*_shexp` scaled by
//! `sigmoid(ffn_gate_inp_shexp · x)` is added.
//!
//! Batch invariance: rows are grouped by expert, so each selected expert's weights stream once
//! per batch, and the kernels' per-row results do not depend on which other rows share the
//! call; each row then sums its experts in its own selection order. A row's output is therefore
//! bit-identical alone, in a verification batch or next to other sequences' rows.

use super::block::FeedForward;
use super::ffn::Ffn;
use super::{gather, scatter};
use crate::weights::Loader;
use crate::ModelError;
use specd_ops::activation::{sigmoid, swiglu_inplace};
use specd_ops::scratch::Buf;
use specd_ops::{matmul, matmul_many, Weight};

/// Expert counts and widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each row uses (`expert_used_count`).
    pub n_expert_used: usize,
    /// FFN width of a routed expert.
    pub n_ff_exp: usize,
    /// FFN width of the shared expert.
    pub n_ff_shexp: usize,
}

/// The sum of the selected probabilities is clamped to the smallest normal f16 before dividing
/// (llama.cpp's guard against a zero sum).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// One MoE FFN layer.
pub struct MoeFfn {
    /// `n_expert × n_embd`.
    router: Weight,
    /// Per expert, `n_ff_exp × n_embd` each.
    gate: Vec<Weight>,
    up: Vec<Weight>,
    /// Per expert, `n_embd × n_ff_exp`.
    down: Vec<Weight>,
    shared: Ffn,
    /// `1 × n_embd`: the shared expert's gate logit.
    shared_gate: Weight,
    n_used: usize,
}

impl MoeFfn {
    /// Loads block `i`'s router, experts and shared expert.
    pub fn load(l: &Loader, i: usize, n_embd: usize, c: &MoeConfig) -> Result<Self, ModelError> {
        let (h, ne, ff) = (n_embd, c.n_expert, c.n_ff_exp);
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let router = l.matrix(&p("ffn_gate_inp"), ne, h)?;
        let merged = p("ffn_gate_up_exps");
        let (gate, up) = if l.has(&merged) {
            // Each expert's gate rows, then its up rows.
            let mut both = l.stacked_parts(&merged, ne, 2, ff, h)?.into_iter();
            let (mut gate, mut up) = (Vec::with_capacity(ne), Vec::with_capacity(ne));
            while let (Some(g), Some(u)) = (both.next(), both.next()) {
                gate.push(g);
                up.push(u);
            }
            (gate, up)
        } else {
            (
                l.stacked(&p("ffn_gate_exps"), ne, ff, h)?,
                l.stacked(&p("ffn_up_exps"), ne, ff, h)?,
            )
        };
        let down = l.stacked(&p("ffn_down_exps"), ne, h, ff)?;
        let shared = Ffn::load_named(l, i, "_shexp", h, c.n_ff_shexp)?;
        let sg = l.vector(&p("ffn_gate_inp_shexp"), h)?;
        Ok(MoeFfn {
            router,
            gate,
            up,
            down,
            shared,
            shared_gate: Weight::from_f32(1, h, &sg)?,
            n_used: c.n_expert_used,
        })
    }

    /// Experts in the layer.
    pub fn n_expert(&self) -> usize {
        self.router.rows
    }
}

/// The `k` experts a row uses and their weights, in selection order (most probable first, the
/// lower index first among equals): softmax over `logits`, then the selected probabilities
/// divided by their sum. The softmax and the sum accumulate in f64, as ggml's do.
pub fn route(logits: &[f32], k: usize, out: &mut Vec<(usize, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = p.iter().map(|&v| v as f64).sum();
    let inv = (1.0 / sum) as f32;
    for v in &mut p {
        *v *= inv;
    }
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx.truncate(k);
    let wsum = idx.iter().map(|&e| p[e] as f64).sum::<f64>() as f32;
    let wsum = wsum.max(MIN_WEIGHT_SUM);
    out.clear();
    out.extend(idx.iter().map(|&e| (e, p[e] / wsum)));
}

impl MoeFfn {
    /// The routed experts of a one-row batch: `sel` holds its `k` selections; expert `s`'s
    /// output goes to `ys[s·h..]`.
    fn single_row(
        &self,
        x: &[f32],
        sel: &[(usize, f32)],
        ys: &mut [f32],
    ) -> Result<(), ModelError> {
        let h = self.router.cols;
        let ws: Vec<&Weight> = sel
            .iter()
            .flat_map(|&(e, _)| [&self.gate[e], &self.up[e]])
            .collect();
        let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; w.rows]).collect();
        {
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            matmul_many(x, 1, &ws, &mut outs)?;
        }
        for (s, (&(e, _), gu)) in sel.iter().zip(bufs.chunks_exact_mut(2)).enumerate() {
            let (g, u) = gu.split_at_mut(1);
            swiglu_inplace(&mut g[0], &u[0]);
            matmul(&g[0], 1, &self.down[e], &mut ys[s * h..(s + 1) * h])?;
        }
        Ok(())
    }
}

impl FeedForward for MoeFfn {
    fn forward(&self, x: &[f32], n: usize) -> Result<Buf, ModelError> {
        let (ne, k) = (self.n_expert(), self.n_used);
        let h = self.router.cols;
        let mut logits = vec![0f32; n * ne];
        matmul(x, n, &self.router, &mut logits)?;
        // Selections: entry r·k + s is row r's s-th expert and its weight.
        let mut sel: Vec<(usize, f32)> = Vec::with_capacity(n * k);
        let mut row_sel = Vec::with_capacity(k);
        for lr in logits.chunks_exact(ne) {
            route(lr, k, &mut row_sel);
            sel.extend_from_slice(&row_sel);
        }
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); ne];
        for (j, &(e, _)) in sel.iter().enumerate() {
            by_expert[e].push(j);
        }
        // Each used expert once, over all the rows that chose it.
        let mut ys = vec![0f32; n * k * h];
        if n == 1 {
            // One row (plain decoding): every selected expert reads the same input, so all their
            // gate and up projections go to the threads as one piece of work instead of one per
            // expert (each hand-off can cost a thread wake-up, and a routed expert's matrices
            // are small). `matmul_many` gives the same values as one `matmul` per matrix.
            self.single_row(x, &sel, &mut ys)?;
        }
        for (e, slots) in by_expert.iter().enumerate() {
            if slots.is_empty() || n == 1 {
                continue;
            }
            let rows: Vec<usize> = slots.iter().map(|j| j / k).collect();
            let m = rows.len();
            let xe = gather(x, h, &rows);
            let ff = self.gate[e].rows;
            let (mut g, mut u) = (vec![0f32; m * ff], vec![0f32; m * ff]);
            matmul_many(&xe, m, &[&self.gate[e], &self.up[e]], &mut [&mut g, &mut u])?;
            swiglu_inplace(&mut g, &u);
            let mut ye = vec![0f32; m * h];
            matmul(&g, m, &self.down[e], &mut ye)?;
            scatter(&ye, h, slots, &mut ys);
        }
        let shared = self.shared.forward(x, n)?;
        let mut sg = vec![0f32; n];
        matmul(x, n, &self.shared_gate, &mut sg)?;
        // Each row's first expert assigns, the rest add: every element is written.
        let mut out = Buf::output(n * h);
        for r in 0..n {
            let o = &mut out[r * h..(r + 1) * h];
            for s in 0..k {
                let j = r * k + s;
                let w = sel[j].1;
                let y = &ys[j * h..(j + 1) * h];
                if s == 0 {
                    for (ov, &yv) in o.iter_mut().zip(y) {
                        *ov = yv * w;
                    }
                } else {
                    for (ov, &yv) in o.iter_mut().zip(y) {
                        *ov += yv * w;
                    }
                }
            }
            let gate = sigmoid(sg[r]);
            for (ov, &sv) in o.iter_mut().zip(&shared[r * h..(r + 1) * h]) {
                *ov += sv * gate;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routing_picks_the_most_probable_and_normalises() {
        let mut out = Vec::new();
        route(&[0.0, 2.0, 1.0, 2.0, -1.0], 3, &mut out);
        // Ties in probability go to the lower index.
        let picked: Vec<usize> = out.iter().map(|p| p.0).collect();
        assert_eq!(picked, vec![1, 3, 2]);
        let sum: f32 = out.iter().map(|p| p.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert_eq!(out[0].1, out[1].1);
        assert!(out[2].1 < out[0].1);
    }
}
