//! Dense SwiGLU feed-forward: `down · (silu(gate·f) ⊙ up·f)`.

use crate::weights::Loader;
use crate::ModelError;
use specd_ops::activation::swiglu_inplace;
use specd_ops::scratch::Buf;
use specd_ops::{matmul, matmul_many, Weight};

/// FFN weights of one block.
pub struct Ffn {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl Ffn {
    /// Loads `blk.{i}.ffn_{gate,up,down}.weight`.
    pub fn load(l: &Loader, i: usize, n_embd: usize, n_ff: usize) -> Result<Self, ModelError> {
        Self::load_named(l, i, "", n_embd, n_ff)
    }

    /// Loads `blk.{i}.ffn_{gate,up,down}{suffix}.weight` (`_shexp`: a MoE's shared expert).
    pub fn load_named(
        l: &Loader,
        i: usize,
        suffix: &str,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Self, ModelError> {
        Ok(Ffn {
            gate: l.matrix(&format!("blk.{i}.ffn_gate{suffix}.weight"), n_ff, n_embd)?,
            up: l.matrix(&format!("blk.{i}.ffn_up{suffix}.weight"), n_ff, n_embd)?,
            down: l.matrix(&format!("blk.{i}.ffn_down{suffix}.weight"), n_embd, n_ff)?,
        })
    }

    /// `x` is `n × n_embd`; returns `n × n_embd`.
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Buf, ModelError> {
        let mut g = Buf::output(n * self.gate.rows);
        let mut u = Buf::output(n * self.up.rows);
        matmul_many(x, n, &[&self.gate, &self.up], &mut [&mut g, &mut u])?;
        swiglu_inplace(&mut g, &u);
        let mut out = Buf::output(n * self.down.rows);
        matmul(&g, n, &self.down, &mut out)?;
        Ok(out)
    }
}

impl super::block::FeedForward for Ffn {
    fn forward(&self, x: &[f32], n: usize) -> Result<Buf, ModelError> {
        Ffn::forward(self, x, n)
    }
}
