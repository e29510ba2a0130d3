//! `draft-mtp`: the model's own multi-token-prediction (NextN) head drafts (docs/qwen35.md §3.7).
//!
//! The head is one attention block fed with a token and the hidden state of the position before
//! it. Its KV cache mirrors the target: every row the target keeps is fed through the head
//! (batched into the next draft call, so mirroring costs no extra pass), paired with the target's
//! hidden state of the previous row. Drafting then runs the head recursively on its own output,
//! and the drafted positions are removed from its cache afterwards (attention only: plain
//! position removal, no recurrent state to roll back). Under probabilistic verification the head's
//! tokens are sampled instead of taken greedily (see [`DraftSampling`]).

use super::{next_draft, start_draft, take_probs, DraftDist, DraftSampling, Drafter};
use crate::SpecError;
use specd_memory::{Memory, MemoryConfig, RollbackKind};
use specd_models::Model;
use std::sync::Arc;

const SEQ: u32 = 0;

/// MTP drafter for one sequence.
pub struct MtpDrafter {
    model: Arc<Model>,
    mem: Memory,
    n_embd: usize,
    /// Target rows not yet mirrored into the head: tokens from position `pending_pos0`, and the
    /// hidden state paired with each (that of the previous position).
    pending_tokens: Vec<u32>,
    pending_h: Vec<f32>,
    pending_pos0: usize,
    /// The target's hidden state at the last position it kept (zeros before the first).
    last_h: Vec<f32>,
    /// Positions the target has kept and reported.
    n_target: usize,
    p_min: f32,
    /// Set when the head cannot follow the target (the target started from a reused prefix the
    /// head never saw): the drafter then proposes nothing.
    lost: bool,
    /// Set under probabilistic verification: drafts are sampled and their q recorded.
    sampling: Option<DraftSampling>,
}

impl MtpDrafter {
    /// A drafter on `model`'s MTP head with a context of `n_ctx`; stops drafting when the head's
    /// top probability falls under `p_min`.
    pub fn new(model: Arc<Model>, n_ctx: usize, p_min: f32) -> Result<Self, SpecError> {
        let mem = model.new_mtp_memory(MemoryConfig {
            n_ctx,
            max_seqs: 1,
            rollback: RollbackKind::Checkpoint,
            ..Default::default()
        })?;
        let n_embd = model.config().n_embd;
        Ok(MtpDrafter {
            model,
            mem,
            n_embd,
            pending_tokens: Vec::new(),
            pending_h: Vec::new(),
            pending_pos0: 0,
            last_h: vec![0.0; n_embd],
            n_target: 0,
            p_min,
            lost: false,
            sampling: None,
        })
    }

    /// Samples drafts with `sampling` instead of drafting greedily (probabilistic
    /// verification); `None` keeps greedy drafts.
    pub fn with_sampling(mut self, sampling: Option<DraftSampling>) -> Self {
        self.sampling = sampling;
        self
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "draft-mtp"
    }
    fn is_cheap(&self) -> bool {
        false
    }
    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe_target(&mut self, tokens: &[u32], pos0: usize, hidden: &[f32]) {
        let h = self.n_embd;
        if self.lost || tokens.is_empty() {
            return;
        }
        if pos0 != self.n_target || hidden.len() != tokens.len() * h {
            self.lost = true;
            return;
        }
        if self.pending_tokens.is_empty() {
            self.pending_pos0 = pos0;
        }
        for (i, &t) in tokens.iter().enumerate() {
            self.pending_tokens.push(t);
            self.pending_h.extend_from_slice(&self.last_h);
            self.last_h.copy_from_slice(&hidden[i * h..(i + 1) * h]);
        }
        self.n_target += tokens.len();
    }

    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        // The target has kept positions 0..p-1; `last` (position p) is what it decodes next.
        let p = tokens.len().saturating_sub(1);
        if self.lost || tokens.is_empty() || n_max == 0 || p != self.n_target {
            return Ok(Vec::new());
        }
        let room = self.mem.config().n_ctx.saturating_sub(tokens.len());
        let n_max = n_max.min(room);
        if n_max == 0 {
            return Ok(Vec::new());
        }
        // Mirror the pending target rows and decode `last` in the same pass.
        let mut rows = std::mem::take(&mut self.pending_tokens);
        let mut hs = std::mem::take(&mut self.pending_h);
        let pos0 = if rows.is_empty() {
            p
        } else {
            self.pending_pos0
        };
        rows.push(tokens[p]);
        hs.extend_from_slice(&self.last_h);
        let (hm, logits) = self
            .model
            .decode_mtp(&mut self.mem, SEQ, &rows, pos0, &hs)?;
        let h = self.n_embd;
        let mut prev_h = hm[(rows.len() - 1) * h..].to_vec();
        let mut drafts = Vec::new();
        start_draft(self.sampling.as_mut(), tokens)?;
        // Drafted token i sits at position p + 1 + i.
        let mut next = next_draft(&logits, p + 1, self.p_min, self.sampling.as_mut())?;
        while let Some(tok) = next {
            drafts.push(tok);
            if drafts.len() == n_max {
                break;
            }
            let (hm, logits) =
                self.model
                    .decode_mtp(&mut self.mem, SEQ, &[tok], p + drafts.len(), &prev_h)?;
            prev_h = hm;
            next = next_draft(
                &logits,
                p + 1 + drafts.len(),
                self.p_min,
                self.sampling.as_mut(),
            )?;
        }
        // Keep only the mirrored target rows (positions < p) in the head's cache.
        self.mem.remove_from(SEQ, p)?;
        Ok(drafts)
    }
    fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        take_probs(self.sampling.as_mut())
    }
}
