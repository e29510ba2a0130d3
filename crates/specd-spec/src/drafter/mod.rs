//! Drafters: anything that, given the tokens so far, proposes a continuation.

pub mod draft_model;
pub mod mtp;
pub mod ngram;
pub mod synthetic;

use crate::SpecError;

/// The most likely token and its probability under a softmax of `logits` (the greedy choice and
/// confidence of model drafters, compared with `p_min`).
pub(crate) fn argmax_prob(logits: &[f32]) -> (u32, f32) {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    let m = logits[best];
    let z: f32 = logits.iter().map(|&v| (v - m).exp()).sum();
    (best as u32, 1.0 / z)
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
    /// The target kept `tokens` at positions `pos0..`; `hidden` holds their final normed hidden
    /// states (`tokens.len() × n_embd`). Called after prefill and after each verification with
    /// the accepted rows only.
    fn observe_target(&mut self, _tokens: &[u32], _pos0: usize, _hidden: &[f32]) {}
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
    /// Feedback to the drafter that won the last round.
    pub fn feedback(&mut self, drafted: usize, accepted: usize) {
        if let Some(i) = self.last {
            self.drafters[i].feedback(drafted, accepted);
        }
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
    pub fn observe_target(&mut self, tokens: &[u32], pos0: usize, hidden: &[f32]) {
        for d in self.drafters.iter_mut().filter(|d| d.wants_hidden()) {
            d.observe_target(tokens, pos0, hidden);
        }
    }
    /// Name of the drafter that produced the last draft.
    pub fn last_name(&self) -> Option<&'static str> {
        self.last.map(|i| self.drafters[i].name())
    }
}
