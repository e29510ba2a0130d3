//! What the engine is asked and what it answers: a sequence's request, the events of a step,
//! a finished sequence's output, progress and timing reports, token log-probabilities.

use crate::params::SpecParams;
use crate::stats::SpecStats;
use specd_backend::Backend;
use specd_backend::SeqId;
use specd_sampling::{GrammarSpec, ReasoningBudget, SamplerParams};
use std::sync::Arc;

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
    pub draft_model: Option<Arc<dyn Backend>>,
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
    /// [`specd_sampling::Sampler::with_logit_bias`]); `ignore_eos` adds more (see [`logit_bias_with_eog`]).
    pub logit_bias: Vec<(u32, f32)>,
    /// The thinking budget (primed with the end of the prompt): the end of a thinking block
    /// that runs past it is forced (see [`ReasoningBudget`]).
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Reuse kept memory for the prompt's prefix (with prompt reuse on: see
    /// [`super::Engine::set_prompt_cache`]); off, the prompt is processed from the start.
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
    /// reuse, see [`super::Engine::set_prompt_cache`]); `n_prompt - n_cached` were processed.
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
/// by [`super::Engine::step_with`]: when processing starts, after each chunk of the prompt batch, and
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

/// Log-softmax of the raw logits: the chosen token's value and the top `n` (the chosen token's
/// value is the one it has in the top list, if it is there).
pub(super) fn token_probs(logits: &[f32], token: u32, n: usize) -> TokenProbs {
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
pub(super) fn sampled_token_probs(mut dist: Vec<(u32, f32)>, token: u32, n: usize) -> TokenProbs {
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
