//! `draft-simple`: a smaller model with the same vocabulary drafts greedily (or samples, under
//! probabilistic verification: see [`DraftSampling`]). Its memory follows
//! the accepted tokens; after each draft it is taken back to the last accepted token — by KV
//! truncation for a transformer draft, by a checkpoint for a hybrid one (drafting feeds one token
//! per decode, and the fast rollback covers one batch).

use super::{next_draft, start_draft, take_probs, DraftDist, DraftSampling, Drafter};
use crate::SpecError;
use specd_memory::{Memory, MemoryConfig, RollbackKind};
use specd_models::{Batch, DecodeOutput, Model};
use std::sync::Arc;

const SEQ: u32 = 0;

/// Draft-model drafter for one sequence.
pub struct DraftModel {
    model: Arc<Model>,
    mem: Memory,
    /// Tokens the draft memory has processed (a prefix of the sequence).
    fed: Vec<u32>,
    p_min: f32,
    /// Set under probabilistic verification: drafts are sampled and their q recorded.
    sampling: Option<DraftSampling>,
    /// The draft steps' decode output, kept so that its logits buffer is reused.
    out: DecodeOutput,
}

impl DraftModel {
    /// A drafter running `model`, with a context of `n_ctx` tokens.
    pub fn new(model: Arc<Model>, n_ctx: usize, p_min: f32) -> Self {
        let mem = model.new_memory(MemoryConfig {
            n_ctx,
            max_seqs: 1,
            rollback: RollbackKind::Checkpoint,
            checkpoint_budget: usize::MAX,
            ..Default::default()
        });
        DraftModel {
            model,
            mem,
            fed: Vec::new(),
            p_min,
            sampling: None,
            out: DecodeOutput::default(),
        }
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
            if self.mem.remove_from(SEQ, common).is_err() {
                self.mem.clear(SEQ);
                self.fed.clear();
            } else {
                self.fed.truncate(common);
            }
        }
        let room = self.mem.config().n_ctx.saturating_sub(tokens.len());
        let n_max = n_max.min(room);
        if n_max == 0 {
            return Ok(Vec::new());
        }
        let start = self.fed.len();
        let batch = Batch::from_tokens(&tokens[start..], start as u32, SEQ, false);
        let out = &mut self.out;
        self.model.decode_into(&mut self.mem, &batch, out)?;
        self.fed.extend_from_slice(&tokens[start..]);
        let hybrid = self.model.memory_layout().is_hybrid();
        let cp = if hybrid {
            self.mem.checkpoint(SEQ)?
        } else {
            None
        };
        let mut drafts = Vec::new();
        // Drafted token i sits at position tokens.len() + i.
        let mut next = next_draft(
            out.logits(0),
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
            self.model.decode_into(&mut self.mem, &b, &mut self.out)?;
            next = next_draft(
                self.out.logits(0),
                tokens.len() + drafts.len(),
                self.p_min,
                self.sampling.as_mut(),
            )?;
        }
        // Back to the accepted sequence.
        let n_fed_drafts = self.mem.n_past(SEQ) - tokens.len();
        if n_fed_drafts > 0 {
            match cp {
                Some(id) => self.mem.restore(SEQ, id)?,
                None => self.model.rollback(&mut self.mem, SEQ, n_fed_drafts)?,
            }
        }
        if let Some(id) = cp {
            self.mem.drop_checkpoint(id);
        }
        Ok(drafts)
    }
    fn prefill(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        // Only into an empty memory (a fresh sequence); `draft` catches up from whatever was fed.
        if !self.fed.is_empty() || tokens.is_empty() || tokens.len() > self.mem.config().n_ctx {
            return Ok(());
        }
        self.model
            .decode(&mut self.mem, &Batch::from_tokens(tokens, 0, SEQ, false))?;
        self.fed.extend_from_slice(tokens);
        Ok(())
    }
    fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        take_probs(self.sampling.as_mut())
    }
}
