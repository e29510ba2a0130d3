//! The pre-norm residual block every supported architecture stacks: `x += mixer(norm(x))`, then
//! `x += ffn(norm(x))`. Architectures differ in the mixer (attention forms, Gated DeltaNet), the
//! FFN (dense, mixture of experts) and the names of their tensors.

use super::attention::Attention;
use super::gdn::GatedDeltaNet;
use super::SeqRows;
use crate::ModelError;
use specd_memory::Memory;
use specd_ops::norm::rms_norm_rows;
use specd_ops::rope::Rope;
use specd_ops::scratch::Buf;

/// A feed-forward layer: `n × n_embd` normed rows in, `n × n_embd` out.
pub trait FeedForward: Send + Sync {
    fn forward(&self, x: &[f32], n: usize) -> Result<Buf, ModelError>;
}

/// The token mixer of a block, with the index of its layer in the sequence memory.
pub enum Mixer {
    Attention { w: Attention, kv_layer: usize },
    Recurrent { w: GatedDeltaNet, rec_layer: usize },
}

impl Mixer {
    /// Runs the mixer over `a` (`n × n_embd`, normed).
    pub fn forward(
        &self,
        a: &[f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
    ) -> Result<Buf, ModelError> {
        match self {
            Mixer::Attention { w, kv_layer } => w.forward(a, n, groups, rope, mem, *kv_layer),
            Mixer::Recurrent { w, rec_layer } => w.forward(a, n, groups, mem, *rec_layer),
        }
    }
}

/// One block: norm → mixer → residual, norm → FFN → residual.
pub struct Block<F> {
    pub attn_norm: Vec<f32>,
    pub mixer: Mixer,
    /// The norm before the FFN (`ffn_norm`, or qwen35's `post_attention_norm`).
    pub ffn_norm: Vec<f32>,
    pub ffn: F,
}

impl<F: FeedForward> Block<F> {
    /// Runs the block on the residual stream `x` (`n × n_embd`); `a` is scratch of the same size.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &mut [f32],
        a: &mut [f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
        eps: f32,
    ) -> Result<(), ModelError> {
        rms_norm_rows(x, &self.attn_norm, eps, a);
        let m = self.mixer.forward(a, n, groups, rope, mem)?;
        for (xv, mv) in x.iter_mut().zip(m.iter()) {
            *xv += mv;
        }
        rms_norm_rows(x, &self.ffn_norm, eps, a);
        let f = self.ffn.forward(a, n)?;
        for (xv, fv) in x.iter_mut().zip(f.iter()) {
            *xv += fv;
        }
        Ok(())
    }
}

/// Runs `blocks` in order over `x`.
pub fn run_blocks<F: FeedForward>(
    blocks: &[Block<F>],
    x: &mut [f32],
    n: usize,
    groups: &[SeqRows],
    rope: &Rope,
    mem: &mut Memory,
    eps: f32,
) -> Result<(), ModelError> {
    let mut a = Buf::output(x.len());
    for b in blocks {
        b.forward(x, &mut a, n, groups, rope, mem, eps)?;
    }
    Ok(())
}
