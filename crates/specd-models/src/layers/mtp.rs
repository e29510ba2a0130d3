//! The multi-token-prediction (NextN) head of Qwen3.5 files (docs/qwen35.md §3.7). Loaded with the
//! model; run only by the MTP drafter, never in the main pass. It keeps its own one-layer KV
//! cache in a separate [`Memory`]. Its FFN is the architecture's: dense in qwen35, a MoE FFN
//! (router, experts, gated shared expert) in qwen35moe and qwen3next.

use super::attention::Attention;
use super::block::FeedForward;
use super::SeqRows;
use crate::weights::Loader;
use crate::ModelError;
use specd_memory::Memory;
use specd_ops::attention::AttnShape;
use specd_ops::norm::{rms_norm, rms_norm_rows};
use specd_ops::rope::Rope;
use specd_ops::{matmul, Weight};

/// Weights of the MTP block `blk.L`.
pub struct Mtp {
    pub eh_proj: Weight,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub attn_norm: Vec<f32>,
    pub attn: Attention,
    pub post_norm: Vec<f32>,
    pub ffn: Box<dyn FeedForward>,
    /// `shared_head_norm` if present (else the model's output norm is used).
    pub head_norm: Option<Vec<f32>>,
    /// Own embedding table if present.
    pub embed: Option<Weight>,
    /// Own LM head if present.
    pub head: Option<Weight>,
    pub eps: f32,
}

impl Mtp {
    /// Loads block `i` (= number of trunk layers) around its FFN `ffn` (loaded by the
    /// architecture).
    pub fn load(
        l: &Loader,
        i: usize,
        n_embd: usize,
        n_vocab: usize,
        ffn: Box<dyn FeedForward>,
        shape: AttnShape,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let p = |x: &str| format!("blk.{i}.{x}");
        Ok(Mtp {
            eh_proj: l.matrix(&p("nextn.eh_proj.weight"), n_embd, 2 * n_embd)?,
            enorm: l.vector(&p("nextn.enorm.weight"), n_embd)?,
            hnorm: l.vector(&p("nextn.hnorm.weight"), n_embd)?,
            attn_norm: l.vector(&p("attn_norm.weight"), n_embd)?,
            attn: Attention::load(l, i, n_embd, shape, true, true, eps)?,
            post_norm: l.vector(&p("post_attention_norm.weight"), n_embd)?,
            ffn,
            head_norm: l.vector_opt(&p("nextn.shared_head_norm.weight"), n_embd)?,
            embed: l.matrix_opt(&p("nextn.embed_tokens.weight"), n_vocab, n_embd)?,
            head: l.matrix_opt(&p("nextn.shared_head_head.weight"), n_vocab, n_embd)?,
            eps,
        })
    }

    /// Runs the head for `n` rows: `emb` are the token embeddings (`n × H`), `h` the paired hidden
    /// states (`n × H`). Returns (normed MTP hidden `n × H`, logits `n × V` for rows in
    /// `want_logits`) using `model_out_norm`/`model_head` when the block has none of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        emb: &[f32],
        h: &[f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
        model_out_norm: &[f32],
        model_head: &Weight,
        want_logits: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let d = self.enorm.len();
        let mut cat = vec![0f32; n * 2 * d];
        for r in 0..n {
            rms_norm(
                &emb[r * d..(r + 1) * d],
                &self.enorm,
                self.eps,
                &mut cat[r * 2 * d..r * 2 * d + d],
            );
            rms_norm(
                &h[r * d..(r + 1) * d],
                &self.hnorm,
                self.eps,
                &mut cat[r * 2 * d + d..(r + 1) * 2 * d],
            );
        }
        let mut x = vec![0f32; n * d];
        matmul(&cat, n, &self.eh_proj, &mut x)?;
        let mut a = vec![0f32; n * d];
        rms_norm_rows(&x, &self.attn_norm, self.eps, &mut a);
        let m = self.attn.forward(&a, n, groups, rope, mem, 0)?;
        for (xv, mv) in x.iter_mut().zip(m.iter()) {
            *xv += mv;
        }
        rms_norm_rows(&x, &self.post_norm, self.eps, &mut a);
        let f = self.ffn.forward(&a, n)?;
        for (xv, fv) in x.iter_mut().zip(f.iter()) {
            *xv += fv;
        }
        let norm = self.head_norm.as_deref().unwrap_or(model_out_norm);
        let mut hm = vec![0f32; n * d];
        rms_norm_rows(&x, norm, self.eps, &mut hm);
        let head = self.head.as_ref().unwrap_or(model_head);
        let sel = super::gather(&hm, d, want_logits);
        let mut logits = vec![0f32; want_logits.len() * head.rows];
        matmul(&sel, want_logits.len(), head, &mut logits)?;
        Ok((hm, logits))
    }
}
