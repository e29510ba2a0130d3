//! Drafters: anything that, given the tokens so far, proposes a continuation.

pub mod draft_model;
pub mod mtp;
pub mod ngram;
pub mod synthetic;

use crate::SpecError;
use specd_backend::{HiddenRows, Output};
use specd_sampling::{Sampler, SamplerParams};

/// A drafter's distribution for one drafted position: `(token, probability)` pairs (probabilistic
/// verification).
pub type DraftDist = Vec<(u32, f32)>;

/// How a model drafter picks its tokens under probabilistic verification: sampled from its own
/// distribution q (its logits through the request's sampler chain, with the draft lane of the
/// position-keyed randomness), with q recorded per drafted position for the target's
/// acceptance test.
pub struct DraftSampling {
    /// The request's sampler (concrete seed); its history mirrors the sequence plus the tokens
    /// drafted so far, so repetition penalties shape q as they will shape the target's p.
    sampler: Sampler,
    /// q of each token of the last draft.
    probs: Vec<DraftDist>,
}

impl DraftSampling {
    /// Draft sampling with the request's `params` and logit biases; `params.seed` must be the
    /// target sampler's resolved seed ([`Sampler::seed`]) so the run repeats with it.
    pub fn new(params: SamplerParams, logit_bias: &[(u32, f32)]) -> Result<Self, SpecError> {
        Ok(DraftSampling {
            sampler: Sampler::new(params, &[])?.with_logit_bias(logit_bias)?,
            probs: Vec::new(),
        })
    }

    /// Starts a draft continuing `tokens`: the penalty history becomes `tokens` (only the part
    /// that changed since the last draft is redone) and the recorded distributions are cleared.
    fn start(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        self.probs.clear();
        let common = self
            .sampler
            .history()
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        self.sampler.truncate_history(common)?;
        for &t in &tokens[common..] {
            self.sampler.accept(t)?;
        }
        Ok(())
    }

    /// Samples the token for position `pos` from the drafter's `logits`, records its q and
    /// appends it to the history.
    fn pick(&mut self, logits: &[f32], pos: usize) -> Result<u32, SpecError> {
        let (t, q) = self.sampler.sample_draft(logits, pos as u64);
        self.sampler.accept(t)?;
        self.probs.push(q);
        Ok(t)
    }
}

/// The next draft token of a model drafter from output `i` of its decode, for position `pos`,
/// or `None` when its confidence (top probability of the raw logits) is under `p_min`: the
/// greedy choice, or a token sampled by `sampling` under probabilistic verification. Greedy
/// drafting asks the backend only for the top token ([`Output::top`]), never for the row.
pub(crate) fn next_draft(
    out: &dyn Output,
    i: usize,
    pos: usize,
    p_min: f32,
    sampling: Option<&mut DraftSampling>,
) -> Result<Option<u32>, SpecError> {
    let (best, p) = out.top(i);
    if p < p_min {
        return Ok(None);
    }
    match sampling {
        None => Ok(Some(best)),
        Some(s) => s.pick(out.logits(i), pos).map(Some),
    }
}

/// Starts a model drafter's draft (see [`DraftSampling::start`]); no-op without sampling.
pub(crate) fn start_draft(
    sampling: Option<&mut DraftSampling>,
    tokens: &[u32],
) -> Result<(), SpecError> {
    match sampling {
        Some(s) => s.start(tokens),
        None => Ok(()),
    }
}

/// The distributions of the last draft, taken out (see [`Drafter::take_draft_probs`]).
pub(crate) fn take_probs(sampling: Option<&mut DraftSampling>) -> Option<Vec<DraftDist>> {
    sampling.map(|s| std::mem::take(&mut s.probs))
}

/// A source of draft tokens for one sequence.
pub trait Drafter: Send {
    /// `--spec-type` name.
    fn name(&self) -> &'static str;
    /// Proposes up to `n_max` tokens continuing `tokens` (the whole sequence so far, prompt and
    /// generated, ending with the token the target will decode next).
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError>;
    /// After verification: `drafted` tokens were verified, the first `accepted` matched.
    fn feedback(&mut self, _drafted: usize, _accepted: usize) {}
    /// Called with the prompt (all but its last token) while the target processes it, so that
    /// a drafter running a model processes the prompt as prompt work — batched with it and
    /// timed with it — instead of in its first draft call, where a draft model's prompt
    /// catch-up cost a short request a few percent of its generation speed even when the
    /// controller then never used a draft.
    fn prefill(&mut self, _tokens: &[u32]) -> Result<(), SpecError> {
        Ok(())
    }
    /// True if drafting costs no model time (n-gram tables): the controller may then draft "in
    /// the shadow" of a plain step to keep measuring acceptance at no cost.
    fn is_cheap(&self) -> bool {
        true
    }
    /// True if the drafter reads the target's hidden states (then the engine asks the model for
    /// them and calls [`Drafter::observe_target`]).
    fn wants_hidden(&self) -> bool {
        false
    }
    /// The target kept `tokens` at positions `pos0..`; `hidden` are their final normed hidden
    /// states (one row per token, in the target's backend). Called after prefill and after each
    /// verification with the accepted rows only.
    fn observe_target(&mut self, _tokens: &[u32], _pos0: usize, _hidden: &HiddenRows) {}
    /// Probabilistic verification: the distribution each token of the last draft was sampled
    /// from (one per token, in order), taken out. `None` (the default, and for drafters that
    /// draft greedily or from tables): that round is verified by exact matching.
    fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        None
    }
}

/// Several drafters in priority order: the first non-empty draft wins the round, and only that
/// drafter hears the feedback.
pub struct Chain {
    pub drafters: Vec<Box<dyn Drafter>>,
    last: Option<usize>,
}

impl Chain {
    /// A chain over `drafters`.
    pub fn new(drafters: Vec<Box<dyn Drafter>>) -> Self {
        Chain {
            drafters,
            last: None,
        }
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.drafters.is_empty()
    }
    /// Drafts with the first drafter that proposes something.
    pub fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        self.last = None;
        for (i, d) in self.drafters.iter_mut().enumerate() {
            let v = d.draft(tokens, n_max)?;
            if !v.is_empty() {
                self.last = Some(i);
                return Ok(v);
            }
        }
        Ok(Vec::new())
    }
    /// The winning drafter's distributions for the last draft (see
    /// [`Drafter::take_draft_probs`]).
    pub fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        self.last.and_then(|i| self.drafters[i].take_draft_probs())
    }
    /// Feedback to the drafter that won the last round.
    pub fn feedback(&mut self, drafted: usize, accepted: usize) {
        if let Some(i) = self.last {
            self.drafters[i].feedback(drafted, accepted);
        }
    }
    /// Passes the prompt to every drafter (see [`Drafter::prefill`]).
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(), SpecError> {
        for d in &mut self.drafters {
            d.prefill(tokens)?;
        }
        Ok(())
    }
    /// True if every drafter is cheap.
    pub fn is_cheap(&self) -> bool {
        self.drafters.iter().all(|d| d.is_cheap())
    }
    /// True if any drafter reads the target's hidden states.
    pub fn wants_hidden(&self) -> bool {
        self.drafters.iter().any(|d| d.wants_hidden())
    }
    /// Passes the target's kept rows to every drafter that reads hidden states.
    pub fn observe_target(&mut self, tokens: &[u32], pos0: usize, hidden: &HiddenRows) {
        for d in self.drafters.iter_mut().filter(|d| d.wants_hidden()) {
            d.observe_target(tokens, pos0, hidden);
        }
    }
    /// Name of the drafter that produced the last draft.
    pub fn last_name(&self) -> Option<&'static str> {
        self.last.map(|i| self.drafters[i].name())
    }
}
