//! Phase 1 of a step: the prompts of sequences added since the last step, all but each
//! prompt's last token (the first round feeds that one), in one batch, stopping at checkpoint
//! marks and scoring pieces' ends; if the batch fails, one sequence at a time, so a bad prompt
//! fails only its own sequence.

use super::{Engine, PromptProgress, StepEvent};
use specd_backend::Batch;
use specd_backend::SeqId;
use std::ops::ControlFlow;
use std::time::Instant;

/// One new sequence's part of the prefill batch.
#[derive(Clone, Copy)]
struct Span {
    seq: SeqId,
    /// Its rows in the batch: `from..to`.
    from: usize,
    to: usize,
    /// Prompt tokens reused from kept memory, in memory before the batch, in all.
    cache: usize,
    before: usize,
    total: usize,
}

impl Engine {
    pub(super) fn prefill(
        &mut self,
        on_progress: &mut dyn FnMut(PromptProgress),
        gone: &dyn Fn(SeqId) -> bool,
        events: &mut Vec<StepEvent>,
    ) {
        let new: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| !s.prefilled)
            .map(|(id, _)| *id)
            .collect();
        if new.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let (batch, spans) = self.prefill_batch(&new, t0, on_progress);
        match self.decode_prefill(&batch, &spans, t0, on_progress, gone) {
            Ok(done) => self.settle_prefill(&spans, done, t0.elapsed().as_secs_f64(), gone),
            Err(()) => {
                for id in new {
                    self.prefill_alone(id, events);
                }
            }
        }
    }

    /// The batch of this step's prompt rows (from what each sequence has in memory to its
    /// prefill end), reporting each sequence's start to `on_progress`.
    fn prefill_batch(
        &mut self,
        new: &[SeqId],
        t0: Instant,
        on_progress: &mut dyn FnMut(PromptProgress),
    ) -> (Batch, Vec<Span>) {
        let n_vocab = self.backend.info().n_vocab;
        let mut batch = Batch::new();
        let mut spans = Vec::with_capacity(new.len());
        for id in new {
            let Some(s) = self.seqs.get_mut(id) else {
                continue;
            };
            // A prompt that starts in this step has taken no time yet (reported as 0, as
            // llama-server does); one resumed after a stopped prefill reports its time so far.
            let secs = match s.prompt_start {
                Some(start) => start.elapsed().as_secs_f64(),
                None => {
                    s.prompt_start = Some(t0);
                    0.0
                }
            };
            on_progress(PromptProgress {
                seq: *id,
                total: s.n_prompt,
                cache: s.n_cached,
                processed: s.n_in_memory,
                secs,
            });
            let from = batch.len();
            // Tokens reused from kept memory (prompt cache), or processed by an earlier step
            // whose prefill stopped early, are already there.
            let end = s.prefill_end(n_vocab);
            let scored = s.req.prompt_logprobs.is_some();
            for (i, &t) in s.tokens[..end].iter().enumerate().skip(s.n_in_memory) {
                batch.push(t, i as u32, *id, scored);
            }
            spans.push(Span {
                seq: *id,
                from,
                to: batch.len(),
                cache: s.n_cached,
                before: s.n_in_memory,
                total: s.n_prompt,
            });
        }
        // Drafters that read hidden states (MTP) mirror the prompt.
        batch.want_hidden = new.iter().any(|id| self.seqs[id].chain.wants_hidden());
        (batch, spans)
    }

    /// Decodes the prefill batch chunk by chunk, reporting progress after each and stopping
    /// after the chunk in which a client is seen gone; the rows decoded.
    fn decode_prefill(
        &mut self,
        batch: &Batch,
        spans: &[Span],
        t0: Instant,
        on_progress: &mut dyn FnMut(PromptProgress),
        gone: &dyn Fn(SeqId) -> bool,
    ) -> Result<usize, ()> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut prev = 0;
        let mut chunk_done = |done: usize| {
            for sp in spans {
                // Rows of this sequence in the chunk just decoded; the chunk that completes the
                // prefill is reported with the first round (the last prompt token).
                if sp.from < done && prev < sp.to && done < sp.to {
                    on_progress(PromptProgress {
                        seq: sp.seq,
                        total: sp.total,
                        cache: sp.cache,
                        processed: sp.before + done - sp.from,
                        secs: t0.elapsed().as_secs_f64(),
                    });
                }
            }
            prev = done;
            // A client that has left stops the batch at this chunk's end, unless its rows are
            // all done already.
            if spans.iter().any(|sp| done < sp.to && gone(sp.seq)) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let mut out = self.ctx.new_output();
        let done = self
            .ctx
            .decode(batch, out.as_mut(), &mut chunk_done)
            .map_err(|_| ())?
            .rows;
        self.observe_rows(batch, out.as_ref(), done);
        self.score_rows(batch, out.as_ref(), done);
        Ok(done)
    }

    /// After a prefill batch of which `done` rows were decoded in `secs`: each sequence's
    /// progress, its checkpoint at a mark it reached, and — its prompt all in memory — its
    /// drafters' prefill and the prompt-end checkpoint.
    fn settle_prefill(
        &mut self,
        spans: &[Span],
        done: usize,
        secs: f64,
        gone: &dyn Fn(SeqId) -> bool,
    ) {
        for sp in spans {
            let Some(s) = self.seqs.get_mut(&sp.seq) else {
                continue;
            };
            s.prompt_secs += secs;
            if done < sp.to {
                // Stopped early: resume from the rows that are in memory.
                s.n_in_memory = sp.before + done.saturating_sub(sp.from);
                continue;
            }
            s.n_in_memory = sp.before + (sp.to - sp.from);
            if s.n_in_memory < s.tokens.len() - 1 {
                // A piece ended at a checkpoint mark (or a scoring piece's end): the rest
                // follows in the next step.
                if s.marks.contains(&s.n_in_memory) {
                    self.reuse.checkpoint_prompt(&mut *self.ctx, sp.seq);
                }
                continue;
            }
            s.prefilled = true;
            if !gone(sp.seq) {
                s.prompt_secs += s.prefill_drafters();
            }
            self.reuse.checkpoint_prompt(&mut *self.ctx, sp.seq);
        }
    }

    /// The retry of a failed prefill batch for one sequence: its whole prompt alone, from the
    /// start (no reuse, no marks), so that only a prompt that itself cannot be decoded fails.
    fn prefill_alone(&mut self, id: SeqId, events: &mut Vec<StepEvent>) {
        let s = &self.seqs[&id];
        if s.req.prompt_logprobs.is_some() {
            // A whole prompt's logits at once could be prompt × vocabulary floats: a scored
            // prompt is not retried in one piece.
            self.fail(id, "scoring the prompt failed".into(), events);
            return;
        }
        let toks = s.tokens[..s.tokens.len() - 1].to_vec();
        let want_hidden = s.chain.wants_hidden();
        self.ctx.clear(id);
        if let Some(s) = self.seqs.get_mut(&id) {
            s.n_cached = 0;
            s.n_in_memory = 0;
        }
        let t0 = Instant::now();
        let r = if toks.is_empty() {
            Ok(())
        } else {
            let mut b = Batch::from_tokens(&toks, 0, id, false);
            b.want_hidden = want_hidden;
            self.ctx
                .decode_new(&b)
                .map(|out| self.observe_rows(&b, out.as_ref(), b.rows.len()))
        };
        match r {
            Ok(()) => {
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.n_in_memory = s.tokens.len() - 1;
                    s.prefilled = true;
                    s.prompt_secs = t0.elapsed().as_secs_f64() + s.prefill_drafters();
                }
                self.reuse.checkpoint_prompt(&mut *self.ctx, id);
            }
            Err(e) => self.fail(id, e.to_string(), events),
        }
    }
}
