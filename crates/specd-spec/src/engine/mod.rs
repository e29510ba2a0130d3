//! [`Engine`]: generation for many sequences at once, one speculative round per step.
//!
//! A step reads as its phases, one file each: [`Engine::step_with`] runs the prefill of new
//! prompts (`prefill.rs`), plans each sequence's draft (`plan.rs`), then verifies every draft
//! in one batch and ends each round (`round.rs`: verification, feedback, rollback), whose
//! tokens enter the sequences through the stop conditions (`stop.rs`). What the engine is asked
//! and answers: `request.rs`; the prompt cache's doors: `cache.rs`.

mod cache;
mod plan;
mod prefill;
mod request;
mod round;
mod stop;

pub use request::{
    logit_bias_with_eog, FinishReason, LiveTimings, PromptProgress, SeqOutput, SequenceRequest,
    StepEvent, TokenProbs,
};

use crate::controller::{Controller, CostModel};
use crate::drafter::draft_model::DraftModel;
use crate::drafter::ngram::{ModTable, NgramCache, NgramMapK, NgramMapK4v, NgramMod, NgramSimple};
use crate::drafter::synthetic::Synthetic;
use crate::drafter::{Chain, DraftDist, DraftSampling, Drafter};
use crate::params::{DrafterKind, RollbackKind, VerifyKind};
use crate::reuse::PromptReuse;
use crate::stats::SpecStats;
use crate::SpecError;
use request::token_probs;
use specd_backend::SequenceMemory;
use specd_backend::{Backend, Batch, CheckpointId, Context, MemoryConfig, Output, SeqId};
use specd_output::TextStage;
use specd_sampling::{GrammarVocab, Sampler, SamplerParams};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct GenSeq {
    req: SequenceRequest,
    sampler: Sampler,
    /// Prompt + generated tokens; the last one is not yet in memory.
    tokens: Vec<u32>,
    n_prompt: usize,
    /// Leading prompt tokens already in memory when the sequence started (prompt reuse).
    n_cached: usize,
    /// Prompt tokens in memory so far: `n_cached`, then more as prefill chunks complete (a
    /// prefill stopped early resumes from here).
    n_in_memory: usize,
    generated: Vec<u32>,
    /// The generated text: stop strings and the text let out so far.
    text: TextStage,
    chain: Chain,
    controller: Controller,
    stats: SpecStats,
    prefilled: bool,
    prompt_secs: f64,
    gen_start: Option<Instant>,
    /// When the rounds that produced the first and the latest tokens ended.
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    probs: Vec<TokenProbs>,
    /// This round's draft came from the grammar, not the drafters (no drafter feedback).
    forced_round: bool,
    /// When prompt processing started (progress reports).
    prompt_start: Option<Instant>,
    /// The end-of-generation token that ended the sequence.
    eog: Option<u32>,
    /// Where the prefill stops to checkpoint (prompt positions, ascending; see
    /// [`SequenceRequest::checkpoints`]).
    marks: Vec<usize>,
    /// Teacher-forced log-probabilities of the prompt so far (prompt scoring).
    prompt_probs: Vec<TokenProbs>,
}

impl GenSeq {
    /// Where this step's prefill of the sequence ends: the prompt's last token but one, or
    /// sooner — at the next checkpoint mark, or where a scoring piece's logits would exceed
    /// [`SCORE_LOGITS`] floats.
    fn prefill_end(&self, n_vocab: usize) -> usize {
        let last = self.tokens.len() - 1;
        let from = self.n_in_memory;
        let mut end = self
            .marks
            .iter()
            .copied()
            .find(|&m| m > from && m < last)
            .unwrap_or(last);
        if self.req.prompt_logprobs.is_some() {
            end = end.min(from + (SCORE_LOGITS / n_vocab.max(1)).max(1));
        }
        end
    }

    /// Passes the prompt to the drafters (a draft model processes it now, as prompt work) and
    /// returns the seconds that took. A failure is not the sequence's: the drafter catches up
    /// in its first draft call instead (and reports any error there).
    fn prefill_drafters(&mut self) -> f64 {
        if self.chain.is_empty() || !self.req.spec.enabled() {
            return 0.0;
        }
        let t0 = Instant::now();
        let n = self.tokens.len() - 1;
        let ok = self.chain.prefill(&self.tokens[..n]).is_ok();
        let secs = t0.elapsed().as_secs_f64();
        if ok && !self.chain.is_cheap() {
            self.controller.observe_prefill(secs, n);
        }
        secs
    }
}

/// Most logits a scoring prefill piece holds at once (64 MiB of `f32`): a long prompt is scored
/// piece by piece so that its logits never take prompt length × vocabulary floats.
const SCORE_LOGITS: usize = 16 << 20;

/// One sequence's part of a step's verification batch.
struct Planned {
    id: SeqId,
    draft: Vec<u32>,
    /// State saved before verifying (checkpoint rollback), if any.
    cp: Option<CheckpointId>,
    /// Probabilistic verification: the drafter's distribution for each draft token. `None`:
    /// exact matching.
    probs: Option<Vec<DraftDist>>,
}

/// Runs generations for many sequences; all sequences' rows of a step share one decode batch.
pub struct Engine {
    backend: Arc<dyn Backend>,
    /// The target's sequences, on its backend.
    ctx: Box<dyn Context>,
    seqs: BTreeMap<SeqId, GenSeq>,
    cost: CostModel,
    mod_table: Arc<Mutex<ModTable>>,
    rollback: RollbackKind,
    /// Built on the first grammar request: indexing a large vocabulary costs tens of ms.
    grammar_vocab: OnceLock<Arc<GrammarVocab>>,
    /// Prompt reuse: what finished sequences keep, and the RAM cache (see
    /// [`Engine::set_prompt_cache`]).
    reuse: PromptReuse,
    /// The rounds' decode output, kept so that its buffers are reused (taken out while a round
    /// ends: a checkpoint redecode then decodes into an output of its own).
    out: Option<Box<dyn Output>>,
}

impl Engine {
    /// An engine over the model of `backend` with a context for `mem_cfg.max_seqs` sequences.
    /// `rollback` picks how recurrent state is taken back after rejected drafts.
    pub fn new(
        backend: Arc<dyn Backend>,
        mut mem_cfg: MemoryConfig,
        rollback: RollbackKind,
    ) -> Result<Self, SpecError> {
        mem_cfg.rollback = rollback;
        let ctx = backend.new_context(mem_cfg)?;
        let cost = if !backend.info().hybrid {
            CostModel::default()
        } else if rollback == RollbackKind::Checkpoint {
            CostModel::with_fast_window(0)
        } else {
            CostModel::with_fast_window(ctx.config().rollback_window)
        };
        let out = Some(ctx.new_output());
        Ok(Engine {
            backend,
            ctx,
            seqs: BTreeMap::new(),
            cost,
            mod_table: ModTable::new(1 << 20),
            rollback,
            grammar_vocab: OnceLock::new(),
            reuse: PromptReuse::default(),
            out,
        })
    }

    /// The measured costs of verification widths the draft-length controller plans with.
    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }
    /// The target's backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// The target's sequence memory (usage, positions).
    pub fn memory(&self) -> &dyn SequenceMemory {
        &*self.ctx
    }
    /// True if no sequence is running.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    /// Number of running sequences.
    pub fn active(&self) -> usize {
        self.seqs.len()
    }

    /// Starts a sequence. Its prompt is processed at the next [`Engine::step`].
    pub fn add(&mut self, seq: SeqId, req: SequenceRequest) -> Result<(), SpecError> {
        if req.prompt.is_empty() {
            return Err(SpecError::Invalid("empty prompt".into()));
        }
        if self.seqs.contains_key(&seq) {
            return Err(SpecError::Invalid(format!(
                "sequence {seq} is already running"
            )));
        }
        let n_vocab = self.backend.info().n_vocab;
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(SpecError::Invalid(format!(
                "prompt token {t} out of vocabulary ({n_vocab})"
            )));
        }
        let n_ctx = self.ctx.config().n_ctx;
        if req.prompt.len() >= n_ctx {
            return Err(SpecError::Invalid(format!(
                "prompt of {} tokens does not fit the context of {n_ctx}",
                req.prompt.len()
            )));
        }
        req.spec.validate().map_err(SpecError::Invalid)?;
        let bias = self.logit_bias(&req);
        let mut sampler = Sampler::new(req.sampler, &req.prompt)?.with_logit_bias(&bias)?;
        if let Some(g) = &req.grammar {
            sampler = sampler.with_grammar(self.grammar_vocab()?.compile(g)?);
        }
        if let Some(b) = &req.reasoning_budget {
            sampler = sampler.with_reasoning_budget(b.clone());
        }
        let chain = self.build_chain(&req, sampler.seed())?;
        // A scored prompt is processed whole: reused positions would have no logits.
        let n_cached = self.reuse.take(
            &mut *self.ctx,
            seq,
            req.cache_scope,
            &req.prompt,
            req.cache_prompt && req.prompt_logprobs.is_none(),
        );
        let marks = if self.reuse.checkpoints_on(&*self.ctx) {
            let mut m = req.checkpoints.clone();
            m.sort_unstable();
            m.dedup();
            m
        } else {
            Vec::new()
        };
        let tokens = req.prompt.clone();
        let n_prompt = tokens.len();
        let controller = Controller::new(req.spec.n_max);
        self.seqs.insert(
            seq,
            GenSeq {
                text: TextStage::new(&req.stop),
                req,
                sampler,
                tokens,
                n_prompt,
                n_cached,
                n_in_memory: n_cached,
                generated: Vec::new(),
                chain,
                controller,
                stats: SpecStats::default(),
                prefilled: false,
                prompt_secs: 0.0,
                gen_start: None,
                first_token: None,
                last_token: None,
                probs: Vec::new(),
                forced_round: false,
                prompt_start: None,
                eog: None,
                marks,
                prompt_probs: Vec::new(),
            },
        );
        Ok(())
    }

    /// Passes the hidden states of the first `n_rows` rows of a decoded batch (every row kept; the
    /// rest were not decoded: a prefill stopped early) to the drafters that read them.
    fn observe_rows(&mut self, batch: &Batch, out: &dyn Output, n_rows: usize) {
        let Some(hidden) = out.hidden().filter(|_| batch.want_hidden) else {
            return;
        };
        let rows = &batch.rows[..n_rows.min(batch.rows.len())];
        let mut i = 0;
        while i < rows.len() {
            let seq = rows[i].seq;
            let j = i + rows[i..].iter().take_while(|r| r.seq == seq).count();
            if let Some(s) = self.seqs.get_mut(&seq) {
                let toks: Vec<u32> = batch.rows[i..j].iter().map(|r| r.token).collect();
                if let Some(h) = hidden.slice(i, j - i) {
                    s.chain
                        .observe_target(&toks, batch.rows[i].pos as usize, &h);
                }
            }
            i = j;
        }
    }

    /// Prompt scoring: the log-probability of the token after each decoded prompt row of a
    /// scored sequence (rows carry logits only for those), from the first `n_rows` rows.
    fn score_rows(&mut self, batch: &Batch, out: &dyn Output, n_rows: usize) {
        for (r, row) in batch.rows[..n_rows.min(batch.rows.len())]
            .iter()
            .enumerate()
        {
            if !row.logits {
                continue;
            }
            let Some(s) = self.seqs.get_mut(&row.seq) else {
                continue;
            };
            let (Some(n), Some(logits)) = (s.req.prompt_logprobs, out.logits_of_row(r)) else {
                continue;
            };
            let next = s.tokens[row.pos as usize + 1];
            s.prompt_probs.push(token_probs(logits, next, n));
        }
    }

    /// The logit biases `req` samples with (see [`logit_bias_with_eog`]).
    fn logit_bias(&self, req: &SequenceRequest) -> Vec<(u32, f32)> {
        let eog = self.backend.tokenizer().eog_ids();
        logit_bias_with_eog(&req.logit_bias, req.ignore_eos, eog)
    }

    /// The grammar index of the model's vocabulary.
    fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, SpecError> {
        if let Some(v) = self.grammar_vocab.get() {
            return Ok(v.clone());
        }
        let v = Arc::new(crate::grammar::vocab_for(self.backend.tokenizer())?);
        Ok(self.grammar_vocab.get_or_init(|| v).clone())
    }

    /// Stops a sequence now and frees its memory.
    pub fn cancel(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.forget(seq);
    }

    /// The request's drafters. `seed`: the sampler's resolved seed, which model drafters sample
    /// their drafts with under probabilistic verification.
    fn build_chain(&self, req: &SequenceRequest, seed: u32) -> Result<Chain, SpecError> {
        let sp = &req.spec;
        let mut v: Vec<Box<dyn Drafter>> = Vec::new();
        if !sp.enabled() {
            return Ok(Chain::new(v));
        }
        // Rejection sampling needs a random target draw and the target's whole distribution:
        // greedy requests (where it equals exact matching anyway) and grammar-constrained ones
        // (the mask would have to shape q too) keep exact verification.
        let sampling = || -> Result<Option<DraftSampling>, SpecError> {
            if sp.verify != VerifyKind::Probabilistic
                || req.sampler.is_greedy()
                || req.grammar.is_some()
            {
                return Ok(None);
            }
            // The target's biases shape q too: a banned token is never drafted.
            DraftSampling::new(
                SamplerParams {
                    seed,
                    ..req.sampler
                },
                &self.logit_bias(req),
            )
            .map(Some)
        };
        for k in &sp.drafters {
            v.push(match k {
                DrafterKind::NgramSimple => Box::new(NgramSimple { n: sp.ngram_n }),
                DrafterKind::NgramMapK => Box::new(NgramMapK::new(sp.ngram_n)),
                DrafterKind::NgramMapK4v => Box::new(NgramMapK4v::new(sp.ngram_n)),
                DrafterKind::NgramMod => {
                    Box::new(NgramMod::new(sp.ngram_n, self.mod_table.clone()))
                }
                DrafterKind::NgramCache => Box::new(NgramCache::new(None)),
                DrafterKind::DraftSimple => {
                    let m = req.draft_model.clone().ok_or_else(|| {
                        SpecError::Invalid("draft-simple needs a draft model (-md)".into())
                    })?;
                    if m.info().n_vocab != self.backend.info().n_vocab {
                        return Err(SpecError::Invalid(format!(
                            "draft model vocabulary {} differs from the target's {}",
                            m.info().n_vocab,
                            self.backend.info().n_vocab
                        )));
                    }
                    Box::new(
                        DraftModel::new(m, self.ctx.config().n_ctx, sp.p_min)?
                            .with_sampling(sampling()?),
                    )
                }
                DrafterKind::DraftMtp => Box::new(
                    crate::drafter::mtp::MtpDrafter::new(
                        self.backend.as_ref(),
                        self.ctx.config().n_ctx,
                        sp.p_min,
                    )?
                    .with_sampling(sampling()?),
                ),
                DrafterKind::Synthetic => {
                    let r = req.reference.clone().ok_or_else(|| {
                        SpecError::Invalid(
                            "the synthetic drafter needs a reference continuation".into(),
                        )
                    })?;
                    Box::new(Synthetic::new(
                        r,
                        sp.synthetic_rates(),
                        0x5eed,
                        self.backend.info().n_vocab as u32,
                    ))
                }
            });
        }
        Ok(Chain::new(v))
    }

    /// One round for every running sequence. Returns what happened, in sequence order.
    pub fn step(&mut self) -> Vec<StepEvent> {
        self.step_with(&mut |_| {}, &|_| false)
    }

    /// [`Engine::step`], telling `on_progress` how far each new sequence's prompt has got while
    /// the step runs (at the start, after each chunk of the prompt batch but the one that
    /// completes it, and after the first round has decoded the last prompt token).
    ///
    /// `gone(seq)`: the sequence's client has left. Prompt processing stops after the chunk in
    /// which that is seen, so the caller can [`Engine::cancel`] it within one chunk's time; the
    /// other new prompts of the batch go on from where they got to in the next step.
    pub fn step_with(
        &mut self,
        on_progress: &mut dyn FnMut(PromptProgress),
        gone: &dyn Fn(SeqId) -> bool,
    ) -> Vec<StepEvent> {
        let mut events = Vec::new();
        if self.seqs.is_empty() {
            return events;
        }
        self.prefill(on_progress, gone, &mut events);
        // Sequences whose prompt is not all in memory yet (a prefill stopped early) wait.
        let ids: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.prefilled)
            .map(|(id, _)| *id)
            .collect();
        let plan: Vec<Planned> = ids
            .into_iter()
            .filter_map(|id| self.plan_draft(id, &mut events))
            .collect();
        if !plan.is_empty() {
            self.verify(plan, on_progress, &mut events);
        }
        events
    }

    fn finish(
        &mut self,
        id: SeqId,
        reason: FinishReason,
        stop_word: Option<String>,
        events: &mut Vec<StepEvent>,
    ) {
        if let Some(s) = self.seqs.remove(&id) {
            self.reuse
                .retire(&mut *self.ctx, id, s.req.cache_scope, &s.tokens);
            let gen_secs = s.gen_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
            let output = SeqOutput {
                text: s.text.text(),
                tokens: s.generated,
                reason,
                stop_word,
                n_prompt: s.n_prompt,
                n_cached: s.n_cached,
                prompt_secs: s.prompt_secs,
                gen_secs,
                first_token_secs: between(s.gen_start, s.first_token),
                decode_secs: between(s.first_token, s.last_token),
                stats: s.stats,
                probs: s.probs,
                prompt_probs: s.prompt_probs,
                eog: s.eog,
            };
            events.push(StepEvent::Finished {
                seq: id,
                output: Box::new(output),
            });
        }
    }

    fn fail(&mut self, id: SeqId, error: String, events: &mut Vec<StepEvent>) {
        self.seqs.remove(&id);
        self.forget(id);
        events.push(StepEvent::Failed { seq: id, error });
    }

    /// Timing counters of a running sequence so far.
    pub fn live_timings(&self, seq: SeqId) -> Option<LiveTimings> {
        self.seqs.get(&seq).map(|s| LiveTimings {
            n_prompt: s.n_prompt,
            n_cached: s.n_cached,
            prompt_secs: s.prompt_secs,
            first_token_secs: between(s.gen_start, s.first_token),
            decode_secs: between(s.first_token, s.last_token),
            n_decoded: s.generated.len() + usize::from(s.eog.is_some()),
            stats: s.stats.clone(),
        })
    }

    /// Log-probabilities of the tokens a running sequence has emitted so far (requests with
    /// `n_probs > 0`), for streaming them before the sequence finishes.
    pub fn token_probs(&self, seq: SeqId) -> Option<&[TokenProbs]> {
        self.seqs.get(&seq).map(|s| s.probs.as_slice())
    }

    /// Runs one sequence to completion (convenience for the CLI and tests).
    pub fn generate(&mut self, seq: SeqId, req: SequenceRequest) -> Result<SeqOutput, SpecError> {
        self.add(seq, req)?;
        loop {
            for ev in self.step() {
                match ev {
                    StepEvent::Finished { seq: s, output } if s == seq => return Ok(*output),
                    StepEvent::Failed { seq: s, error } if s == seq => {
                        return Err(SpecError::Invalid(error))
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Seconds from `a` to `b` (0 unless both happened).
fn between(a: Option<Instant>, b: Option<Instant>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    }
}
