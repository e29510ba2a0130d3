//! `draft-simple`: a smaller model with the same vocabulary drafts greedily (or samples, under
//! probabilistic verification: see [`DraftSampling`]). Its memory follows
//! the accepted tokens; after each draft it is taken back to the last accepted token — by KV
//! truncation for a transformer draft, by a checkpoint for a hybrid one (drafting feeds one token
//! per decode, and the fast rollback covers one batch).

use super::{next_draft, start_draft, take_probs, DraftDist, DraftSampling, Drafter};
use crate::SpecError;
use specd_backend::{Backend, Batch, Context, MemoryConfig, Output, RollbackKind};
use std::ops::ControlFlow;
use std::sync::Arc;

const SEQ: u32 = 0;

/// Draft-model drafter for one sequence.
pub struct DraftModel {
    /// The draft model's sequence, on its backend.
    ctx: Box<dyn Context>,
    /// Tokens the draft memory has processed (a prefix of the sequence).
    fed: Vec<u32>,
    p_min: f32,
    /// Set under probabilistic verification: drafts are sampled and their q recorded.
    sampling: Option<DraftSampling>,
    /// The draft steps' decode output, kept so that its buffers are reused.
    out: Box<dyn Output>,
}

impl DraftModel {
    /// A drafter running the model of `backend`, with a context of `n_ctx` tokens.
    pub fn new(backend: Arc<dyn Backend>, n_ctx: usize, p_min: f32) -> Result<Self, SpecError> {
        let ctx = backend.new_context(MemoryConfig {
            n_ctx,
            max_seqs: 1,
            rollback: RollbackKind::Checkpoint,
            checkpoint_budget: usize::MAX,
            ..Default::default()
        })?;
        let out = ctx.new_output();
        Ok(DraftModel {
            ctx,
            fed: Vec::new(),
            p_min,
            sampling: None,
            out,
        })
    }

    /// Decodes `batch` into the drafter's output.
    fn decode(&mut self, batch: &Batch) -> Result<(), SpecError> {
        self.ctx
            .decode(batch, self.out.as_mut(), &mut |_| ControlFlow::Continue(()))?;
        Ok(())
    }

    /// Samples drafts with `sampling` instead of drafting greedily (probabilistic
    /// verification); `None` keeps greedy drafts.
    pub fn with_sampling(mut self, sampling: Option<DraftSampling>) -> Self {
        self.sampling = sampling;
        self
    }
}

impl Drafter for DraftModel {
    fn name(&self) -> &'static str {
        "draft-simple"
    }
    fn is_cheap(&self) -> bool {
        false
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        if tokens.is_empty() || n_max == 0 {
            return Ok(Vec::new());
        }
        start_draft(self.sampling.as_mut(), tokens)?;
        // Keep the longest common prefix of what was fed and the sequence.
        let common = self
            .fed
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let common = common.min(tokens.len() - 1);
        if common < self.fed.len() {
            if self.ctx.remove_from(SEQ, common).is_err() {
                self.ctx.clear(SEQ);
                self.fed.clear();
            } else {
                self.fed.truncate(common);
            }
        }
        let room = self.ctx.config().n_ctx.saturating_sub(tokens.len());
        let n_max = n_max.min(room);
        if n_max == 0 {
            return Ok(Vec::new());
        }
        let start = self.fed.len();
        let batch = Batch::from_tokens(&tokens[start..], start as u32, SEQ, false);
        self.decode(&batch)?;
        self.fed.extend_from_slice(&tokens[start..]);
        let cp = if self.ctx.is_hybrid() {
            self.ctx.checkpoint(SEQ)?
        } else {
            None
        };
        let mut drafts = Vec::new();
        // Drafted token i sits at position tokens.len() + i.
        let mut next = next_draft(
            self.out.as_ref(),
            0,
            tokens.len(),
            self.p_min,
            self.sampling.as_mut(),
        )?;
        while let Some(tok) = next {
            drafts.push(tok);
            if drafts.len() == n_max {
                break;
            }
            let pos = (tokens.len() + drafts.len() - 1) as u32;
            let b = Batch::from_tokens(&[tok], pos, SEQ, true);
            self.decode(&b)?;
            next = next_draft(
                self.out.as_ref(),
                0,
                tokens.len() + drafts.len(),
                self.p_min,
                self.sampling.as_mut(),
            )?;
        }
        // Back to the accepted sequence.
        let n_fed_drafts = self.ctx.n_past(SEQ) - tokens.len();
        if n_fed_drafts > 0 {
            match cp {
                Some(id) => self.ctx.restore(SEQ, id)?,
                None => self.ctx.rollback(SEQ, n_fed_drafts)?,
            }
        }
        if let Some(id) = cp {
            self.ctx.drop_checkpoint(id);
        }
        Ok(drafts)
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        // Only into an empty memory (a fresh sequence); `draft` catches up from whatever was fed.
        if !self.fed.is_empty() || tokens.is_empty() || tokens.len() > self.ctx.config().n_ctx {
            return Ok(());
        }
        self.decode(&Batch::from_tokens(tokens, 0, SEQ, false))?;
        self.fed.extend_from_slice(tokens);
        Ok(())
    }
    fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        take_probs(self.sampling.as_mut())
    }
}
