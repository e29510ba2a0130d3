//! Phase 2 of a step, per sequence: this round's draft — tokens the grammar forces, else what
//! the drafters propose, cut to what the controller expects to pay for — and the checkpoint the
//! rollback needs, if any.

use super::{Engine, GenSeq, Planned, StepEvent};
use crate::controller::CostModel;
use crate::drafter::DraftDist;
use crate::params::RollbackKind;
use crate::SpecError;
use specd_backend::{CheckpointId, SeqId};
use std::time::Instant;

/// A draft and, for probabilistic verification, the drafter's distribution of each token.
type Draft = (Vec<u32>, Option<Vec<DraftDist>>);

impl Engine {
    /// The sequence's plan for this round. `None`: the sequence ended or failed here (reported
    /// in `events`).
    pub(super) fn plan_draft(&mut self, id: SeqId, events: &mut Vec<StepEvent>) -> Option<Planned> {
        let n_ctx = self.ctx.config().n_ctx;
        let s = self.seqs.get_mut(&id)?;
        if s.gen_start.is_none() {
            s.gen_start = Some(Instant::now());
        }
        let remaining = s.req.n_predict - s.generated.len();
        // A round yields up to n+1 tokens and feeds n+1 rows.
        let room = n_ctx.saturating_sub(s.tokens.len()); // rows that still fit
        if room == 0 {
            self.finish(id, crate::FinishReason::Context, None, events);
            return None;
        }
        let cap = s
            .req
            .spec
            .n_max
            .min(remaining.saturating_sub(1))
            .min(room - 1);
        let (draft, probs) = match s.choose_draft(cap, &self.cost) {
            Ok(d) => d,
            Err(e) => {
                self.fail(id, e.to_string(), events);
                return None;
            }
        };
        // Distributions for exactly the tokens verified (every later cut is a prefix cut);
        // none, or too few, means exact matching.
        let probs = probs
            .filter(|q| !draft.is_empty() && q.len() >= draft.len())
            .map(|mut q| {
                q.truncate(draft.len());
                q
            });
        s.stats.record_choice(draft.len());
        let cp = match self.round_checkpoint(id, draft.len()) {
            Ok(cp) => cp,
            Err(e) => {
                self.fail(id, e.to_string(), events);
                return None;
            }
        };
        Some(Planned {
            id,
            draft,
            cp,
            probs,
        })
    }

    /// The checkpoint a round of `n_draft` drafts needs before it is verified: on a hybrid model
    /// with checkpoint rollback, or a draft longer than the fast rollback's window.
    fn round_checkpoint(
        &mut self,
        id: SeqId,
        n_draft: usize,
    ) -> Result<Option<CheckpointId>, SpecError> {
        let hybrid = self.backend.info().hybrid;
        let window = self.ctx.config().rollback_window;
        if !hybrid
            || n_draft == 0
            || (self.rollback != RollbackKind::Checkpoint && n_draft < window)
        {
            return Ok(None);
        }
        let t_cp = Instant::now();
        let c = self.ctx.checkpoint(id);
        self.cost.observe_checkpoint(t_cp.elapsed().as_secs_f64());
        Ok(c?)
    }
}

impl GenSeq {
    /// At most `cap` tokens to verify: the tokens a grammar (or the thinking budget) forces, else
    /// the drafters' proposal as far as the controller expects it to pay.
    fn choose_draft(&mut self, cap: usize, cost: &CostModel) -> Result<Draft, SpecError> {
        // Tokens the grammar (or the thinking budget) forces are certain: draft them for free,
        // ahead of any drafter. Only when speculation is on: "off" means one row per step,
        // whatever the request.
        let constrained = self.sampler.has_grammar() || self.req.reasoning_budget.is_some();
        let forced = if cap > 0 && self.req.spec.enabled() && constrained {
            self.sampler.grammar_forced_tokens()
        } else {
            Vec::new()
        };
        self.forced_round = !forced.is_empty();
        if self.forced_round {
            let mut draft = forced;
            draft.truncate(cap);
            self.stats.grammar_forced_tokens += draft.len() as u64;
            return Ok((draft, None));
        }
        if cap == 0 || self.chain.is_empty() {
            return Ok((Vec::new(), None));
        }
        self.drafted(cap, cost)
    }

    /// The drafters' proposal: asked for as many tokens as the controller expects to pay for
    /// (a model drafter costs its time even when its draft is thrown away), cut to the grammar's
    /// valid prefix and to the controller's choice of length.
    fn drafted(&mut self, cap: usize, cost: &CostModel) -> Result<Draft, SpecError> {
        let cheap = self.chain.is_cheap();
        let (adaptive, n_min) = (self.req.spec.adaptive, self.req.spec.n_min);
        let ask = if adaptive && !cheap {
            self.controller.plan(cap, n_min, cost)
        } else {
            cap
        };
        if ask == 0 {
            self.stats.controller_skips += 1;
            return Ok((Vec::new(), None));
        }
        let t_draft = Instant::now();
        let mut draft = self.chain.draft(&self.tokens, ask)?;
        if !cheap {
            self.controller
                .observe_draft_time(t_draft.elapsed().as_secs_f64(), draft.len());
            if draft.is_empty() {
                // A model drafter that proposes nothing (below p-min) spent its time for no
                // token: for the throughput estimate that is a miss at position 0.
                self.controller.observe(1, 0);
            }
        }
        let probs = self.chain.take_draft_probs();
        draft.truncate(cap);
        // A draft token the grammar forbids can never be accepted: don't verify it.
        let valid = self.sampler.grammar_valid_prefix(&draft);
        draft.truncate(valid);
        let n = if adaptive {
            self.controller.choose(draft.len(), n_min, cost)
        } else if draft.len() >= n_min {
            draft.len()
        } else {
            0
        };
        if n == 0 && !draft.is_empty() {
            self.stats.controller_skips += 1;
        }
        // The first token not verified stays in the shadow (free for a cheap drafter).
        if cheap {
            self.controller.shadow = draft.get(n).map(|&t| (n, t));
        }
        draft.truncate(n);
        Ok((draft, probs))
    }
}
