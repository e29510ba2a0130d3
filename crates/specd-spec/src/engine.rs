//! [`Engine`]: generation for many sequences at once, one speculative round per step.

use crate::controller::{Controller, CostModel};
use crate::drafter::draft_model::DraftModel;
use crate::drafter::ngram::{ModTable, NgramCache, NgramMapK, NgramMapK4v, NgramMod, NgramSimple};
use crate::drafter::synthetic::Synthetic;
use crate::drafter::{Chain, DraftDist, DraftSampling, Drafter};
use crate::params::{DrafterKind, RollbackKind, SpecParams, VerifyKind};
use crate::reuse::{PromptReuse, RamCacheStats};
use crate::rollback::{rollback_rejected, RolledBack};
use crate::stats::SpecStats;
use crate::SpecError;
use specd_memory::{Memory, MemoryConfig, RollbackMode, SeqId};
use specd_models::{Batch, DecodeOutput, Model};
use specd_output::TextStage;
use specd_sampling::{GrammarSpec, GrammarVocab, ReasoningBudget, Sampler, SamplerParams, Verdict};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What one sequence should generate.
#[derive(Clone)]
pub struct SequenceRequest {
    /// Prompt tokens (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub n_predict: usize,
    pub sampler: SamplerParams,
    /// Generation ends at end-of-generation tokens unless this is set.
    pub ignore_eos: bool,
    /// Stop strings: generation ends where one appears; nothing after it is emitted.
    pub stop: Vec<String>,
    pub spec: SpecParams,
    /// For the synthetic drafter: the plain run's tokens (prompt + continuation).
    pub reference: Option<Arc<Vec<u32>>>,
    /// For `draft-simple`: the draft model.
    pub draft_model: Option<Arc<Model>>,
    /// Report the top `n_probs` log-probabilities of each generated token: of the raw logits,
    /// or of the sampler's final distribution with `post_sampling_probs`.
    pub n_probs: usize,
    /// `n_probs` describe the distribution the token was drawn from (logit bias, penalties,
    /// filters and temperature applied; tokens without mass left out), as llama.cpp's
    /// `post_sampling_probs`.
    pub post_sampling_probs: bool,
    /// Constrain the output (GBNF, Lark, JSON schema, regex).
    pub grammar: Option<GrammarSpec>,
    /// `(token, bias)` added to the target's logits before sampling (see
    /// [`Sampler::with_logit_bias`]); `ignore_eos` adds more (see [`logit_bias_with_eog`]).
    pub logit_bias: Vec<(u32, f32)>,
    /// The thinking budget (primed with the end of the prompt): the end of a thinking block
    /// that runs past it is forced (see [`ReasoningBudget`]).
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Reuse kept memory for the prompt's prefix (with prompt reuse on: see
    /// [`Engine::set_prompt_cache`]); off, the prompt is processed from the start.
    pub cache_prompt: bool,
    /// Whose kept memory the request may reuse: memory is only ever reused within the scope
    /// of the request that made it (the server's per-API-key and `cache_salt` partition).
    pub cache_scope: u64,
    /// llama-server's `t_max_predict_ms`: once generation has run this long, the sequence ends
    /// (as `n_predict` would) at the next token that contains a newline — a time limit for
    /// editor completions that still cuts at a line end.
    pub time_limit: Option<std::time::Duration>,
    /// Prompt positions worth a recurrent-state checkpoint: where a later request is expected
    /// to diverge from this prompt (message boundaries, the start of the generation prompt; the
    /// chat renderer knows them). With prompt reuse on a hybrid model the prefill stops at each
    /// and checkpoints there, besides the prompt-end checkpoint. Ignored otherwise.
    pub checkpoints: Vec<usize>,
    /// Score the prompt: with `Some(n)` the log-probability of every prompt token after the
    /// first (teacher-forced: from the logits of the position before it) and the top `n` at each
    /// position, in [`SeqOutput::prompt_probs`]. The prompt is then processed whole (no reuse:
    /// reused positions have no logits), in pieces whose logits stay bounded in size.
    pub prompt_logprobs: Option<usize>,
}

/// The logit biases a request samples with: its own, then `-inf` on every end-of-generation
/// token when it ignores them (as llama.cpp does: a generation that does not stop there never
/// samples them either).
pub fn logit_bias_with_eog(bias: &[(u32, f32)], ignore_eos: bool, eog: &[u32]) -> Vec<(u32, f32)> {
    let mut all = bias.to_vec();
    if ignore_eos {
        all.extend(eog.iter().map(|&t| (t, f32::NEG_INFINITY)));
    }
    all
}

impl SequenceRequest {
    /// Plain greedy generation of `n_predict` tokens.
    pub fn greedy(prompt: Vec<u32>, n_predict: usize) -> Self {
        SequenceRequest {
            prompt,
            n_predict,
            sampler: SamplerParams::greedy(),
            ignore_eos: false,
            stop: Vec::new(),
            spec: SpecParams::default(),
            reference: None,
            draft_model: None,
            n_probs: 0,
            post_sampling_probs: false,
            grammar: None,
            logit_bias: Vec::new(),
            reasoning_budget: None,
            cache_prompt: true,
            cache_scope: 0,
            time_limit: None,
            checkpoints: Vec::new(),
            prompt_logprobs: None,
        }
    }
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token.
    Eos,
    /// `n_predict` reached.
    Limit,
    /// A stop string.
    Stop,
    /// The context is full.
    Context,
    /// The sequence failed (its error is in [`StepEvent::Failed`]).
    Error,
}

/// What a step produced for one sequence.
#[derive(Debug)]
pub enum StepEvent {
    /// New tokens (in order) and their text.
    Tokens {
        seq: SeqId,
        tokens: Vec<u32>,
        text: String,
    },
    /// The sequence finished; its summary.
    Finished { seq: SeqId, output: Box<SeqOutput> },
    /// The sequence failed; it is removed.
    Failed { seq: SeqId, error: String },
}

/// Summary of a finished sequence.
#[derive(Debug, Clone)]
pub struct SeqOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
    /// The stop string that ended it, if any.
    pub stop_word: Option<String>,
    pub n_prompt: usize,
    /// Prompt tokens taken from the sequence's kept memory instead of being processed (prompt
    /// reuse, see [`Engine::set_prompt_cache`]); `n_prompt - n_cached` were processed.
    pub n_cached: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
    /// Seconds from the end of the prompt's prefill to the first generated token: the round
    /// that decodes the last prompt token, whose logits give that token (llama-server counts
    /// this in the prompt's time).
    pub first_token_secs: f64,
    /// Seconds from the first generated token to the last one (0 with fewer than two).
    pub decode_secs: f64,
    pub stats: SpecStats,
    /// Per generated token: its log-probability and the top `n_probs` (token, log-probability).
    pub probs: Vec<TokenProbs>,
    /// With [`SequenceRequest::prompt_logprobs`]: per prompt token after the first, its
    /// teacher-forced log-probability and the top ones at its position.
    pub prompt_probs: Vec<TokenProbs>,
    /// The end-of-generation token that ended the sequence (reason [`FinishReason::Eos`]); it
    /// was sampled but is not in `tokens`.
    pub eog: Option<u32>,
}

impl SeqOutput {
    /// Tokens sampled, the end-of-generation token included (what llama-server counts as
    /// predicted).
    pub fn n_decoded(&self) -> usize {
        self.tokens.len() + usize::from(self.eog.is_some())
    }
    /// The timing counters of the whole generation.
    pub fn timings(&self) -> LiveTimings {
        LiveTimings {
            n_prompt: self.n_prompt,
            n_cached: self.n_cached,
            prompt_secs: self.prompt_secs,
            first_token_secs: self.first_token_secs,
            decode_secs: self.decode_secs,
            n_decoded: self.n_decoded(),
            stats: self.stats.clone(),
        }
    }
}

/// How far a sequence's prompt has been processed (llama-server's `prompt_progress`), reported
/// by [`Engine::step_with`]: when processing starts, after each chunk of the prompt batch, and
/// when the last prompt token has been decoded with the first round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptProgress {
    pub seq: SeqId,
    /// Prompt tokens.
    pub total: usize,
    /// Prompt tokens taken from kept memory.
    pub cache: usize,
    /// Prompt tokens in memory so far (`cache` included).
    pub processed: usize,
    /// Seconds since processing started.
    pub secs: f64,
}

/// Timing counters of a sequence: so far while it runs (reported with each streamed token), or
/// of the whole generation ([`SeqOutput::timings`]).
#[derive(Debug, Clone)]
pub struct LiveTimings {
    pub n_prompt: usize,
    pub n_cached: usize,
    pub prompt_secs: f64,
    /// As in [`SeqOutput`]: the round that gave the first token, and the first to the latest
    /// token.
    pub first_token_secs: f64,
    pub decode_secs: f64,
    /// Tokens sampled so far.
    pub n_decoded: usize,
    pub stats: SpecStats,
}

/// Log-probabilities of one generated token: of the raw logits, or of the sampler's final
/// distribution when the request asked for post-sampling probabilities.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenProbs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

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
    cp: Option<specd_memory::CheckpointId>,
    /// Probabilistic verification: the drafter's distribution for each draft token. `None`:
    /// exact matching.
    probs: Option<Vec<DraftDist>>,
}

/// Runs generations for many sequences; all sequences' rows of a step share one decode batch.
pub struct Engine {
    model: Arc<Model>,
    mem: Memory,
    seqs: BTreeMap<SeqId, GenSeq>,
    cost: CostModel,
    mod_table: Arc<Mutex<ModTable>>,
    rollback: RollbackKind,
    /// Built on the first grammar request: indexing a large vocabulary costs tens of ms.
    grammar_vocab: OnceLock<Arc<GrammarVocab>>,
    /// Prompt reuse: what finished sequences keep, and the RAM cache (see
    /// [`Engine::set_prompt_cache`]).
    reuse: PromptReuse,
    /// The rounds' decode output, kept so that its logits buffer is reused
    /// ([`Model::decode_into`]).
    out: DecodeOutput,
}

impl Engine {
    /// An engine over `model` with a memory for `mem_cfg.max_seqs` sequences. `rollback` picks
    /// how recurrent state is taken back after rejected drafts.
    pub fn new(model: Arc<Model>, mut mem_cfg: MemoryConfig, rollback: RollbackKind) -> Self {
        mem_cfg.rollback = match rollback {
            RollbackKind::Fast => RollbackMode::Replay,
            RollbackKind::Snapshot => RollbackMode::Snapshot,
            RollbackKind::Checkpoint => RollbackMode::None,
        };
        let mem = model.new_memory(mem_cfg);
        let cost = if !model.memory_layout().is_hybrid() {
            CostModel::default()
        } else if rollback == RollbackKind::Checkpoint {
            CostModel::with_fast_window(0)
        } else {
            CostModel::with_fast_window(mem.config().rollback_window)
        };
        Engine {
            model,
            mem,
            seqs: BTreeMap::new(),
            cost,
            mod_table: ModTable::new(1 << 20),
            rollback,
            grammar_vocab: OnceLock::new(),
            reuse: PromptReuse::default(),
            out: DecodeOutput::default(),
        }
    }

    /// The measured costs of verification widths the draft-length controller plans with.
    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }
    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    /// The memory (usage, checkpoints).
    pub fn memory(&self) -> &Memory {
        &self.mem
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
        let n_vocab = self.model.config().n_vocab;
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(SpecError::Invalid(format!(
                "prompt token {t} out of vocabulary ({n_vocab})"
            )));
        }
        let n_ctx = self.mem.config().n_ctx;
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
            &mut self.mem,
            seq,
            req.cache_scope,
            &req.prompt,
            req.cache_prompt && req.prompt_logprobs.is_none(),
        );
        let marks = if self.reuse.checkpoints_on(&self.mem) {
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
    fn observe_rows(&mut self, batch: &Batch, out: &specd_models::DecodeOutput, n_rows: usize) {
        if !batch.want_hidden {
            return;
        }
        let rows = &batch.rows[..n_rows.min(batch.rows.len())];
        let mut i = 0;
        while i < rows.len() {
            let seq = rows[i].seq;
            let j = i + rows[i..].iter().take_while(|r| r.seq == seq).count();
            if let Some(s) = self.seqs.get_mut(&seq) {
                let toks: Vec<u32> = batch.rows[i..j].iter().map(|r| r.token).collect();
                let hidden: Vec<f32> = (i..j).flat_map(|r| out.hidden(r).iter().copied()).collect();
                s.chain
                    .observe_target(&toks, batch.rows[i].pos as usize, &hidden);
            }
            i = j;
        }
    }

    /// Prompt scoring: the log-probability of the token after each decoded prompt row of a
    /// scored sequence (rows carry logits only for those), from the first `n_rows` rows.
    fn score_rows(&mut self, batch: &Batch, out: &specd_models::DecodeOutput, n_rows: usize) {
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
        let eog = self.model.tokenizer().eog_ids();
        logit_bias_with_eog(&req.logit_bias, req.ignore_eos, eog)
    }

    /// The grammar index of the model's vocabulary.
    fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, SpecError> {
        if let Some(v) = self.grammar_vocab.get() {
            return Ok(v.clone());
        }
        let v = Arc::new(crate::grammar::vocab_for(self.model.tokenizer())?);
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
                    if m.config().n_vocab != self.model.config().n_vocab {
                        return Err(SpecError::Invalid(format!(
                            "draft model vocabulary {} differs from the target's {}",
                            m.config().n_vocab,
                            self.model.config().n_vocab
                        )));
                    }
                    Box::new(
                        DraftModel::new(m, self.mem.config().n_ctx, sp.p_min)
                            .with_sampling(sampling()?),
                    )
                }
                DrafterKind::DraftMtp => Box::new(
                    crate::drafter::mtp::MtpDrafter::new(
                        self.model.clone(),
                        self.mem.config().n_ctx,
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
                        self.model.config().n_vocab as u32,
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

    /// Phase 1 of a step: the prompts of sequences added since the last step, all but each
    /// prompt's last token (the first round feeds that one), in one batch; if the batch fails,
    /// one sequence at a time, so a bad prompt fails only its own sequence.
    fn prefill(
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
        if !new.is_empty() {
            let n_vocab = self.model.config().n_vocab;
            let mut batch = Batch::new();
            // Per new sequence: its rows in the batch and its tokens in memory before them.
            let mut spans = Vec::with_capacity(new.len());
            let t0 = Instant::now();
            for id in &new {
                let Some(s) = self.seqs.get_mut(id) else {
                    continue;
                };
                let start = *s.prompt_start.get_or_insert(t0);
                on_progress(PromptProgress {
                    seq: *id,
                    total: s.n_prompt,
                    cache: s.n_cached,
                    processed: s.n_in_memory,
                    secs: start.elapsed().as_secs_f64(),
                });
                let from = batch.len();
                // Tokens reused from kept memory (prompt cache), or processed by an earlier
                // step whose prefill stopped early, are already there.
                let end = s.prefill_end(n_vocab);
                let scored = s.req.prompt_logprobs.is_some();
                for (i, &t) in s.tokens[..end].iter().enumerate().skip(s.n_in_memory) {
                    batch.push(t, i as u32, *id, scored);
                }
                spans.push((
                    *id,
                    from,
                    batch.len(),
                    s.n_cached,
                    s.n_in_memory,
                    s.n_prompt,
                ));
            }
            // Drafters that read hidden states (MTP) mirror the prompt.
            batch.want_hidden = new.iter().any(|id| self.seqs[id].chain.wants_hidden());
            let mut prev = 0;
            let mut chunk_done = |done: usize| {
                for &(seq, from, to, cache, before, total) in &spans {
                    // Rows of this sequence in the chunk just decoded; the chunk that completes
                    // the prefill is reported with the first round (the last prompt token).
                    if from < done && prev < to && done < to {
                        on_progress(PromptProgress {
                            seq,
                            total,
                            cache,
                            processed: before + done - from,
                            secs: t0.elapsed().as_secs_f64(),
                        });
                    }
                }
                prev = done;
                // A client that has left stops the batch at this chunk's end, unless its rows
                // are all done already.
                if spans.iter().any(|&(seq, _, to, ..)| done < to && gone(seq)) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            let res = if batch.is_empty() {
                Ok(batch.len())
            } else {
                self.model
                    .decode_with(&mut self.mem, &batch, &mut chunk_done)
                    .map(|out| {
                        self.observe_rows(&batch, &out, prev);
                        self.score_rows(&batch, &out, prev);
                        prev
                    })
            };
            let secs = t0.elapsed().as_secs_f64();
            match res {
                Ok(done) => {
                    for &(id, from, to, _, before, _) in &spans {
                        let Some(s) = self.seqs.get_mut(&id) else {
                            continue;
                        };
                        if done < to {
                            // Stopped early: resume from the rows that are in memory.
                            s.n_in_memory = before + done.saturating_sub(from);
                            s.prompt_secs += secs;
                            continue;
                        }
                        s.prompt_secs += secs;
                        s.n_in_memory = before + (to - from);
                        if s.n_in_memory < s.tokens.len() - 1 {
                            // A piece ended at a checkpoint mark (or a scoring piece's end):
                            // the rest follows in the next step.
                            if s.marks.contains(&s.n_in_memory) {
                                self.reuse.checkpoint_prompt(&mut self.mem, id);
                            }
                            continue;
                        }
                        s.prefilled = true;
                        if !gone(id) {
                            s.prompt_secs += s.prefill_drafters();
                        }
                        self.reuse.checkpoint_prompt(&mut self.mem, id);
                    }
                }
                Err(_) => {
                    // Retry one by one so a bad prompt fails only its own sequence.
                    for id in new {
                        let s = &self.seqs[&id];
                        if s.req.prompt_logprobs.is_some() {
                            // A whole prompt's logits at once could be prompt × vocabulary
                            // floats: a scored prompt is not retried in one piece.
                            self.fail(id, "scoring the prompt failed".into(), events);
                            continue;
                        }
                        let toks = s.tokens[..s.tokens.len() - 1].to_vec();
                        self.mem.clear(id);
                        if let Some(s) = self.seqs.get_mut(&id) {
                            // The retry processes the whole prompt.
                            s.n_cached = 0;
                            s.n_in_memory = 0;
                        }
                        let t0 = Instant::now();
                        let r = if toks.is_empty() {
                            Ok(())
                        } else {
                            let mut b = Batch::from_tokens(&toks, 0, id, false);
                            b.want_hidden = self.seqs[&id].chain.wants_hidden();
                            self.model
                                .decode(&mut self.mem, &b)
                                .map(|out| self.observe_rows(&b, &out, b.rows.len()))
                        };
                        match r {
                            Ok(()) => {
                                if let Some(s) = self.seqs.get_mut(&id) {
                                    s.n_in_memory = s.tokens.len() - 1;
                                    s.prefilled = true;
                                    s.prompt_secs =
                                        t0.elapsed().as_secs_f64() + s.prefill_drafters();
                                }
                                self.reuse.checkpoint_prompt(&mut self.mem, id);
                            }
                            Err(e) => {
                                self.fail(id, e.to_string(), events);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Phase 2, per sequence: this round's draft — tokens the grammar forces, else what the
    /// drafters propose, cut to what the controller expects to pay for — and the checkpoint the
    /// rollback needs, if any. `None`: the sequence ended or failed here (reported in `events`).
    fn plan_draft(&mut self, id: SeqId, events: &mut Vec<StepEvent>) -> Option<Planned> {
        let n_ctx = self.mem.config().n_ctx;
        let hybrid = self.model.memory_layout().is_hybrid();
        let window = self.mem.config().rollback_window;
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
        let mut draft = Vec::new();
        let mut probs: Option<Vec<DraftDist>> = None;
        // Tokens the grammar (or the thinking budget) forces are certain: draft them for
        // free, ahead of any drafter. Only when speculation is on: "off" means one row per
        // step, whatever the request.
        let constrained = s.sampler.has_grammar() || s.req.reasoning_budget.is_some();
        let forced = if cap > 0 && s.req.spec.enabled() && constrained {
            s.sampler.grammar_forced_tokens()
        } else {
            Vec::new()
        };
        s.forced_round = !forced.is_empty();
        if s.forced_round {
            draft = forced;
            draft.truncate(cap);
            s.stats.grammar_forced_tokens += draft.len() as u64;
        } else if cap > 0 && !s.chain.is_empty() {
            // A model drafter costs its time even when the draft is thrown away: ask it only
            // for as many tokens as pay for themselves (possibly none).
            let cheap = s.chain.is_cheap();
            let ask = if s.req.spec.adaptive && !cheap {
                s.controller.plan(cap, s.req.spec.n_min, &self.cost)
            } else {
                cap
            };
            if ask == 0 {
                s.stats.controller_skips += 1;
                s.stats.record_choice(0);
                return Some(Planned {
                    id,
                    draft,
                    cp: None,
                    probs: None,
                });
            }
            let t_draft = Instant::now();
            match s.chain.draft(&s.tokens, ask) {
                Ok(d) => draft = d,
                Err(e) => {
                    self.fail(id, e.to_string(), events);
                    return None;
                }
            }
            if !cheap {
                s.controller
                    .observe_draft_time(t_draft.elapsed().as_secs_f64(), draft.len());
                if draft.is_empty() {
                    // A model drafter that proposes nothing (below p-min) spent its time for
                    // no token: for the throughput estimate that is a miss at position 0.
                    s.controller.observe(1, 0);
                }
            }
            probs = s.chain.take_draft_probs();
            draft.truncate(cap);
            // A draft token the grammar forbids can never be accepted: don't verify it.
            let valid = s.sampler.grammar_valid_prefix(&draft);
            draft.truncate(valid);
            let n = if s.req.spec.adaptive {
                s.controller
                    .choose(draft.len(), s.req.spec.n_min, &self.cost)
            } else if draft.len() >= s.req.spec.n_min {
                draft.len()
            } else {
                0
            };
            if n == 0 && !draft.is_empty() {
                s.stats.controller_skips += 1;
            }
            // The first token not verified stays in the shadow (free for a cheap drafter).
            if s.chain.is_cheap() {
                s.controller.shadow = draft.get(n).map(|&t| (n, t));
            }
            draft.truncate(n);
        }
        // Distributions for exactly the tokens verified (every later cut is a prefix cut);
        // none, or too few, means exact matching.
        let probs = probs
            .filter(|q| !draft.is_empty() && q.len() >= draft.len())
            .map(|mut q| {
                q.truncate(draft.len());
                q
            });
        s.stats.record_choice(draft.len());
        let cp = if hybrid
            && !draft.is_empty()
            && (self.rollback == RollbackKind::Checkpoint || draft.len() + 1 > window)
        {
            let t_cp = Instant::now();
            let c = self.mem.checkpoint(id);
            self.cost.observe_checkpoint(t_cp.elapsed().as_secs_f64());
            match c {
                Ok(c) => c,
                Err(e) => {
                    self.fail(id, e.to_string(), events);
                    return None;
                }
            }
        } else {
            None
        };
        Some(Planned {
            id,
            draft,
            cp,
            probs,
        })
    }

    /// Phase 3: one verification batch for every planned sequence, then each sequence's
    /// acceptance, rollback and stop conditions ([`Engine::accept`]); if the batch cannot be
    /// decoded, one sequence at a time.
    fn verify(
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
        let h = self.model.config().n_embd;
        let t0 = Instant::now();
        let mut out = std::mem::take(&mut self.out);
        match self.model.decode_into(&mut self.mem, &batch, &mut out) {
            Ok(()) => {
                if plan.len() == 1 {
                    self.cost.observe(batch.len(), t0.elapsed().as_secs_f64());
                }
                self.report_prompt_done(&plan, on_progress);
            }
            Err(_) => {
                self.out = out;
                // Fail only the sequences whose rows cannot be decoded: retry each alone.
                let mut outs = Vec::new();
                for pl in plan {
                    let s = &self.seqs[&pl.id];
                    let p = s.tokens.len() - 1;
                    let mut rows = vec![s.tokens[p]];
                    rows.extend_from_slice(&pl.draft);
                    let mut b = Batch::from_tokens(&rows, p as u32, pl.id, true);
                    b.want_hidden = batch.want_hidden;
                    match self.model.decode(&mut self.mem, &b) {
                        Ok(o) => {
                            self.report_prompt_done(std::slice::from_ref(&pl), on_progress);
                            outs.push((pl, o))
                        }
                        Err(e) => self.fail(pl.id, e.to_string(), events),
                    }
                }
                for (pl, o) in outs {
                    let logits: Vec<&[f32]> = (0..o.len()).map(|i| o.logits(i)).collect();
                    self.accept(&pl, &logits, &o.hidden, events);
                }
                return;
            }
        };
        let mut row = 0;
        for pl in plan {
            let n = pl.draft.len() + 1;
            let logits: Vec<&[f32]> = (row..row + n).map(|i| out.logits(i)).collect();
            let hidden = out.hidden.get(row * h..(row + n) * h).unwrap_or(&[]);
            row += n;
            self.accept(&pl, &logits, hidden, events);
        }
        self.out = out;
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

    /// Walks the verified rows of one sequence with its sampler, keeps the accepted prefix of
    /// the draft plus one target token, rolls back the rest and applies the stop conditions.
    /// Exact verification keeps drafts while the sampler's own token matches them; with the
    /// drafter's distributions (`plan.probs`), each draft token passes the rejection-sampling
    /// test instead and the first rejected one is replaced by a draw from the residual. `hidden`:
    /// the rows' final hidden states when a drafter reads them (else empty).
    fn accept(
        &mut self,
        plan: &Planned,
        logits: &[&[f32]],
        hidden: &[f32],
        events: &mut Vec<StepEvent>,
    ) {
        let (id, draft, cp) = (plan.id, plan.draft.as_slice(), plan.cp);
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let p = s.tokens.len() - 1; // position of the fed `last`
        let mut new_tokens = Vec::new();
        let mut new_probs = Vec::new();
        // The drafter only samples under these conditions; checked again so that a round whose
        // draft did not come from it (grammar-forced) is never tested against a stale q.
        let probabilistic = plan
            .probs
            .as_deref()
            .filter(|_| !s.forced_round && !s.sampler.has_grammar())
            .filter(|_| !s.sampler.params().is_greedy());
        for (i, l) in logits.iter().enumerate() {
            let pos = (p + 1 + i) as u64;
            // Post-sampling probabilities: the distribution this row's token comes from, taken
            // before the token enters the penalty history.
            let dist =
                (s.req.n_probs > 0 && s.req.post_sampling_probs).then(|| s.sampler.distribution(l));
            // The token this row emits, and whether the round goes on past it.
            let (t, go_on) = match (draft.get(i), probabilistic.and_then(|q| q.get(i))) {
                (Some(&d), Some(q)) => match s.sampler.verify_draft(l, pos, d, q) {
                    Verdict::Accepted => (d, true),
                    Verdict::Rejected(r) => (r, false),
                },
                (Some(&d), None) => {
                    let t = s.sampler.sample(l, pos);
                    (t, t == d)
                }
                // The bonus row after a fully accepted draft (or a plain step).
                (None, _) => (s.sampler.sample(l, pos), false),
            };
            if let Err(e) = s.sampler.accept(t) {
                let msg = e.to_string();
                self.fail(id, msg, events);
                return;
            }
            new_tokens.push(t);
            if s.req.n_probs > 0 {
                new_probs.push(match dist {
                    Some(d) => sampled_token_probs(d, t, s.req.n_probs),
                    None => token_probs(l, t, s.req.n_probs),
                });
            }
            if !go_on {
                break;
            }
        }
        let k = new_tokens.len() - 1; // accepted drafts
        s.stats.rounds += 1;
        if probabilistic.is_some() {
            s.stats.probabilistic_rounds += 1;
        }
        if draft.is_empty() {
            s.stats.empty_draft_rounds += 1;
            s.controller.resolve_shadow(0, new_tokens[0]);
        } else if s.forced_round {
            // Grammar-forced drafts say nothing about the drafters or their acceptance rate.
            s.stats.record_draft(draft.len(), k);
            s.controller.shadow = None;
        } else {
            s.stats.record_draft(draft.len(), k);
            s.controller.observe(draft.len(), k);
            s.controller.resolve_shadow(k, new_tokens[k]);
            s.chain.feedback(draft.len(), k);
        }
        // Fed rows: last, d1..dn. Accepted in memory: last, d1..dk.
        let mut fed = vec![s.tokens[p]];
        fed.extend_from_slice(draft);
        let t_rb = Instant::now();
        let rolled = rollback_rejected(
            &self.model,
            &mut self.mem,
            id,
            p,
            &fed,
            k + 1,
            cp,
            &mut s.stats,
        );
        let secs = t_rb.elapsed().as_secs_f64();
        match rolled {
            Ok(RolledBack::Redecode) => self.cost.observe_redecode(k + 1, secs),
            Ok(RolledBack::Fast) => self.cost.observe_fast_rollback(k + 1, secs),
            Ok(RolledBack::Nothing) => {}
            Err(e) => {
                let msg = e.to_string();
                self.fail(id, msg, events);
                return;
            }
        }
        let h = self.model.config().n_embd;
        if let Some(kept) = hidden.get(..(k + 1) * h) {
            s.chain.observe_target(&fed[..=k], p, kept);
        }
        if !new_tokens.is_empty() {
            let now = Instant::now();
            s.first_token.get_or_insert(now);
            s.last_token = Some(now);
        }
        // Stop conditions, token by token.
        let tok = self.model.tokenizer();
        let mut emit = Vec::new();
        let mut finish: Option<(FinishReason, Option<String>)> = None;
        for &t in &new_tokens {
            if !s.req.ignore_eos && tok.is_eog(t) {
                s.tokens.push(t);
                s.eog = Some(t);
                finish = Some((FinishReason::Eos, None));
                break;
            }
            s.tokens.push(t);
            s.generated.push(t);
            emit.push(t);
            if let Some(pr) = new_probs.get(emit.len() - 1) {
                s.probs.push(pr.clone());
            }
            if let Some(w) = s.text.push(tok.token_to_bytes(t)) {
                finish = Some((FinishReason::Stop, Some(w)));
                break;
            }
            if s.generated.len() >= s.req.n_predict {
                finish = Some((FinishReason::Limit, None));
                break;
            }
            if let (Some(limit), Some(t0)) = (s.req.time_limit, s.gen_start) {
                if tok.token_to_bytes(t).contains(&b'\n') && t0.elapsed() > limit {
                    finish = Some((FinishReason::Limit, None));
                    break;
                }
            }
        }
        // Text goes out complete (UTF-8) and final (no tail that may become a stop string).
        let text = s.text.take(finish.is_some());
        if !emit.is_empty() || !text.is_empty() {
            events.push(StepEvent::Tokens {
                seq: id,
                tokens: emit,
                text,
            });
        }
        if let Some((reason, word)) = finish {
            self.finish(id, reason, word, events);
        }
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
                .retire(&mut self.mem, id, s.req.cache_scope, &s.tokens);
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

    /// Prompt reuse across requests on the same sequence id (server slots). With `keep` on, a
    /// finished sequence keeps its memory, and [`Engine::add`] on that id processes only the part
    /// of the new prompt that kept memory does not already cover (see [`crate::reuse`]): the
    /// common prefix is kept when memory can be cut there (attention KV truncation, or the last
    /// batch's recurrent rollback record), otherwise a hybrid model's recurrent state is
    /// restored from the checkpoint taken at the end of an earlier prompt (at most
    /// `max_checkpoints` per sequence, within the memory's checkpoint byte budget); failing
    /// both, the prompt is processed from the start. Off (the default): finished sequences free
    /// their memory. Turning it off frees all kept memory and the RAM cache.
    pub fn set_prompt_cache(&mut self, keep: bool, max_checkpoints: usize) {
        self.reuse.configure(&mut self.mem, keep, max_checkpoints);
    }

    /// The prompt cache in RAM: with prompt reuse on, the memory of a conversation whose
    /// sequence another request takes is saved (up to `bytes` in all, least recently used
    /// dropped first) and restored into whichever sequence serves its next request. 0: off.
    pub fn set_ram_cache(&mut self, bytes: usize) {
        self.reuse.set_ram_limit(bytes);
    }

    /// Counters of the RAM cache.
    pub fn ram_cache_stats(&self) -> RamCacheStats {
        self.reuse.ram_stats()
    }

    /// Frees every finished sequence's kept memory and the RAM cache.
    pub fn clear_prompt_cache(&mut self) {
        self.reuse.clear(&mut self.mem);
    }

    /// Prompt tokens a running sequence took from kept memory instead of processing them.
    pub fn n_cached(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.n_cached)
    }

    /// Tokens a finished sequence left in its kept memory (prompt reuse), if any.
    pub fn cached_tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.reuse.tokens(seq)
    }

    /// Leading tokens of `prompt` a request of cache scope `scope` would take from what the
    /// idle sequence `seq` kept (0 for a running one): what the server's slot choice compares.
    pub fn reusable_prefix(&self, seq: SeqId, scope: u64, prompt: &[u32]) -> usize {
        if self.seqs.contains_key(&seq) {
            return 0;
        }
        self.reuse.reusable(&self.mem, seq, scope, prompt)
    }

    /// Slot save: the tokens an idle sequence kept for prompt reuse by `scope` and its memory
    /// as bytes ([`specd_memory::Memory::save_sequence`]: KV, recurrent state, prompt
    /// checkpoints). Memory kept for another scope saves as empty.
    pub fn save_kept(&self, seq: SeqId, scope: u64) -> Result<(Vec<u32>, Vec<u8>), SpecError> {
        if self.seqs.contains_key(&seq) {
            return Err(SpecError::Invalid(format!("sequence {seq} is running")));
        }
        Ok(self.reuse.save(&self.mem, seq, scope)?)
    }

    /// Slot restore: makes an idle sequence hold `tokens` with the memory saved by
    /// [`Engine::save_kept`], so the next request of `scope` on it reuses them like its own
    /// earlier prompt. On error the sequence's kept memory is freed (as a failed restore leaves
    /// it in llama-server).
    pub fn restore_kept(
        &mut self,
        seq: SeqId,
        scope: u64,
        tokens: Vec<u32>,
        state: &[u8],
    ) -> Result<(), SpecError> {
        if self.seqs.contains_key(&seq) {
            return Err(SpecError::Invalid(format!("sequence {seq} is running")));
        }
        let n_vocab = self.model.config().n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            self.forget(seq);
            return Err(SpecError::Invalid(format!(
                "saved token {t} out of vocabulary ({n_vocab})"
            )));
        }
        self.reuse
            .restore(&mut self.mem, seq, scope, tokens, state)
            .map_err(SpecError::Invalid)
    }

    /// llama-server's `--cache-idle-slots` for one idle sequence: its kept memory is saved into
    /// the RAM cache and freed, so that its conversation continues from the cache in whichever
    /// sequence serves it next. No effect on a running sequence. Returns whether it saved.
    pub fn cache_idle(&mut self, seq: SeqId) -> bool {
        if self.seqs.contains_key(&seq) {
            return false;
        }
        self.reuse.cache_idle(&mut self.mem, seq)
    }

    /// Frees the memory a finished sequence kept (no effect on a running sequence).
    pub fn forget(&mut self, seq: SeqId) {
        if self.seqs.contains_key(&seq) {
            return;
        }
        self.reuse.forget(&mut self.mem, seq);
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

/// Log-softmax of the raw logits: the chosen token's value and the top `n` (the chosen token's
/// value is the one it has in the top list, if it is there).
fn token_probs(logits: &[f32], token: u32, n: usize) -> TokenProbs {
    TokenProbs {
        token,
        logprob: specd_sampling::token_logprob(logits, token),
        top: specd_sampling::top_logprobs(logits, n),
    }
}

/// Log-probabilities under the sampler's final distribution `dist` (which holds only tokens
/// with mass): the chosen token's and the `n` most likely, by descending probability (ties →
/// lowest id). A chosen token missing from `dist` (none is) would count as certain, as in
/// llama.cpp.
fn sampled_token_probs(mut dist: Vec<(u32, f32)>, token: u32, n: usize) -> TokenProbs {
    let ln = |p: f32| f64::from(p).ln() as f32;
    let logprob = dist.iter().find(|x| x.0 == token).map_or(0.0, |x| ln(x.1));
    dist.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    dist.truncate(n);
    TokenProbs {
        token,
        logprob,
        top: dist.into_iter().map(|(t, p)| (t, ln(p))).collect(),
    }
}
