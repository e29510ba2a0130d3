//! Phase 3 of a step: one verification batch for every planned sequence, then per sequence
//! the round's end — verification (which drafts the target's sampler keeps), what the round
//! teaches the drafters and the controller, the rollback of the rejected rows, and the stop
//! conditions (`stop.rs`).

use super::request::{sampled_token_probs, token_probs};
use super::{Engine, GenSeq, Planned, PromptProgress, StepEvent, TokenProbs};
use crate::drafter::DraftDist;
use crate::rollback::{rollback_rejected, RolledBack};
use specd_backend::{Batch, HiddenRows};
use specd_sampling::{Sampler, SamplingError, Verdict};
use std::ops::ControlFlow;
use std::time::Instant;

/// What verification keeps of a round: the accepted drafts followed by the target's own token
/// (the correction, or a bonus when every draft matched), and their log-probabilities when the
/// request asks for them.
pub(super) struct Verified {
    pub tokens: Vec<u32>,
    pub probs: Vec<TokenProbs>,
}

/// Verification as a function of the sampler, the verified rows' logits and the draft: walks
/// the rows in order with the target's sampler (each chosen token enters its state), keeping
/// drafts while its token matches them — or, with the drafter's distributions `q`, while each
/// passes the rejection-sampling test, the first rejected one replaced by a draw from the
/// residual. Row `i` sits at position `p + 1 + i`. `n_probs` / `post_sampling`: the
/// log-probabilities asked for (of the raw logits, or of the distribution sampled from).
pub(super) fn verify_rows(
    sampler: &mut Sampler,
    logits: &[&[f32]],
    draft: &[u32],
    q: Option<&[DraftDist]>,
    p: usize,
    (n_probs, post_sampling): (usize, bool),
) -> Result<Verified, SamplingError> {
    let mut v = Verified {
        tokens: Vec::new(),
        probs: Vec::new(),
    };
    for (i, l) in logits.iter().enumerate() {
        let pos = (p + 1 + i) as u64;
        // Post-sampling probabilities: the distribution this row's token comes from, taken
        // before the token enters the penalty history.
        let dist = (n_probs > 0 && post_sampling).then(|| sampler.distribution(l));
        // The token this row emits, and whether the round goes on past it.
        let (t, go_on) = match (draft.get(i), q.and_then(|q| q.get(i))) {
            (Some(&d), Some(q)) => match sampler.verify_draft(l, pos, d, q) {
                Verdict::Accepted => (d, true),
                Verdict::Rejected(r) => (r, false),
            },
            (Some(&d), None) => {
                let t = sampler.sample(l, pos);
                (t, t == d)
            }
            // The bonus row after a fully accepted draft (or a plain step).
            (None, _) => (sampler.sample(l, pos), false),
        };
        sampler.accept(t)?;
        v.tokens.push(t);
        if n_probs > 0 {
            v.probs.push(match dist {
                Some(d) => sampled_token_probs(d, t, n_probs),
                None => token_probs(l, t, n_probs),
            });
        }
        if !go_on {
            break;
        }
    }
    Ok(v)
}

impl Engine {
    /// Decodes every planned sequence's `[last, d1..dn]` in one batch and ends each one's
    /// round ([`Engine::accept`]); if the batch cannot be decoded, one sequence at a time.
    pub(super) fn verify(
        &mut self,
        plan: Vec<Planned>,
        on_progress: &mut dyn FnMut(PromptProgress),
        events: &mut Vec<StepEvent>,
    ) {
        let mut batch = Batch::new();
        for pl in &plan {
            let s = &self.seqs[&pl.id];
            let p = s.tokens.len() - 1;
            batch.push(s.tokens[p], p as u32, pl.id, true);
            for (i, &d) in pl.draft.iter().enumerate() {
                batch.push(d, (p + 1 + i) as u32, pl.id, true);
            }
        }
        batch.want_hidden = plan.iter().any(|pl| self.seqs[&pl.id].chain.wants_hidden());
        let mut out = self.out.take().unwrap_or_else(|| self.ctx.new_output());
        let decoded = self
            .ctx
            .decode(&batch, out.as_mut(), &mut |_| ControlFlow::Continue(()));
        let Ok(decoded) = decoded else {
            self.out = Some(out);
            self.verify_each(plan, batch.want_hidden, on_progress, events);
            return;
        };
        if plan.len() == 1 {
            self.cost.observe(batch.len(), decoded.secs);
        }
        self.report_prompt_done(&plan, on_progress);
        let hidden = out.hidden();
        let mut row = 0;
        for pl in plan {
            let n = pl.draft.len() + 1;
            let logits: Vec<&[f32]> = (row..row + n).map(|i| out.logits(i)).collect();
            let h = hidden.as_ref().and_then(|h| h.slice(row, n));
            row += n;
            self.accept(&pl, &logits, h, events);
        }
        self.out = Some(out);
    }

    /// The retry of a failed verification batch: each sequence's rows alone, so that only the
    /// sequences whose rows cannot be decoded fail.
    fn verify_each(
        &mut self,
        plan: Vec<Planned>,
        want_hidden: bool,
        on_progress: &mut dyn FnMut(PromptProgress),
        events: &mut Vec<StepEvent>,
    ) {
        let mut outs = Vec::new();
        for pl in plan {
            let s = &self.seqs[&pl.id];
            let p = s.tokens.len() - 1;
            let mut rows = vec![s.tokens[p]];
            rows.extend_from_slice(&pl.draft);
            let mut b = Batch::from_tokens(&rows, p as u32, pl.id, true);
            b.want_hidden = want_hidden;
            match self.ctx.decode_new(&b) {
                Ok(o) => {
                    self.report_prompt_done(std::slice::from_ref(&pl), on_progress);
                    outs.push((pl, o))
                }
                Err(e) => self.fail(pl.id, e.to_string(), events),
            }
        }
        for (pl, o) in outs {
            let logits: Vec<&[f32]> = (0..o.len()).map(|i| o.logits(i)).collect();
            self.accept(&pl, &logits, o.hidden(), events);
        }
    }

    /// Reports the prompt of each planned sequence in its first round as fully processed: the
    /// round's batch fed its last prompt token.
    fn report_prompt_done(&self, plan: &[Planned], on_progress: &mut dyn FnMut(PromptProgress)) {
        for pl in plan {
            let Some(s) = self.seqs.get(&pl.id) else {
                continue;
            };
            if s.stats.rounds == 0 && s.generated.is_empty() {
                on_progress(PromptProgress {
                    seq: pl.id,
                    total: s.n_prompt,
                    cache: s.n_cached,
                    processed: s.n_prompt,
                    secs: s.prompt_start.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                });
            }
        }
    }

    /// Ends one sequence's round: verification, feedback, the rollback of the rejected rows,
    /// the drafters' view of the kept hidden states (`hidden`: the rows' final hidden states
    /// when a drafter reads them), then the stop conditions.
    fn accept(
        &mut self,
        plan: &Planned,
        logits: &[&[f32]],
        hidden: Option<HiddenRows>,
        events: &mut Vec<StepEvent>,
    ) {
        let (id, draft) = (plan.id, plan.draft.as_slice());
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let p = s.tokens.len() - 1; // position of the fed `last`
                                    // The drafter only samples under these conditions; checked again so that a round whose
                                    // draft did not come from it (grammar-forced) is never tested against a stale q.
        let q = plan
            .probs
            .as_deref()
            .filter(|_| !s.forced_round && !s.sampler.has_grammar())
            .filter(|_| !s.sampler.params().is_greedy());
        let asked = (s.req.n_probs, s.req.post_sampling_probs);
        let v = match verify_rows(&mut s.sampler, logits, draft, q, p, asked) {
            Ok(v) => v,
            Err(e) => return self.fail(id, e.to_string(), events),
        };
        let k = v.tokens.len() - 1; // accepted drafts
        s.learn_from_round(draft, &v.tokens, q.is_some());
        // Fed rows: last, d1..dn. Accepted in memory: last, d1..dk.
        let mut fed = vec![s.tokens[p]];
        fed.extend_from_slice(draft);
        let t_rb = Instant::now();
        let rolled = rollback_rejected(&mut *self.ctx, id, p, &fed, k + 1, plan.cp, &mut s.stats);
        let secs = t_rb.elapsed().as_secs_f64();
        match rolled {
            Ok(RolledBack::Redecode) => self.cost.observe_redecode(k + 1, secs),
            Ok(RolledBack::Fast) => self.cost.observe_fast_rollback(k + 1, secs),
            Ok(RolledBack::Nothing) => {}
            Err(e) => return self.fail(id, e.to_string(), events),
        }
        if let Some(kept) = hidden.and_then(|h| h.slice(0, k + 1)) {
            s.chain.observe_target(&fed[..=k], p, &kept);
        }
        let now = Instant::now();
        s.first_token.get_or_insert(now);
        s.last_token = Some(now);
        let (emitted, finish) = s.take_tokens(id, self.backend.tokenizer(), &v);
        if let Some(ev) = emitted {
            events.push(ev);
        }
        if let Some((reason, word)) = finish {
            self.finish(id, reason, word, events);
        }
    }
}

impl GenSeq {
    /// What a round of `draft` that ended in `tokens` teaches the statistics, the controller
    /// and the drafters. `probabilistic`: verified by rejection sampling.
    fn learn_from_round(&mut self, draft: &[u32], tokens: &[u32], probabilistic: bool) {
        let k = tokens.len() - 1;
        self.stats.rounds += 1;
        if probabilistic {
            self.stats.probabilistic_rounds += 1;
        }
        if draft.is_empty() {
            self.stats.empty_draft_rounds += 1;
            self.controller.resolve_shadow(0, tokens[0]);
        } else if self.forced_round {
            // Grammar-forced drafts say nothing about the drafters or their acceptance rate.
            self.stats.record_draft(draft.len(), k);
            self.controller.shadow = None;
        } else {
            self.stats.record_draft(draft.len(), k);
            self.controller.observe(draft.len(), k);
            self.controller.resolve_shadow(k, tokens[k]);
            self.chain.feedback(draft.len(), k);
        }
    }
}
