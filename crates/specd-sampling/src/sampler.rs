//! The stateful sampler: parameters, resolved seed and penalty history.

use std::cell::RefCell;
use std::fmt;

use crate::budget::ReasoningBudget;
use crate::chain::{argmax, clean, desc, filter, max_of_slice, penalize, softmax, Cand, Work};
use crate::grammar::Grammar;
use crate::history::History;
use crate::params::{SamplerParams, SamplingError};
use crate::rejection::{verify_token, Verdict, LANE_ACCEPT, LANE_DRAFT, LANE_RESIDUAL};
use crate::rng::{draw, draw_iter, position_uniform, resolve_seed};

/// Buffers reused across calls so per-token sampling does not allocate
/// vocabulary-sized vectors.
#[derive(Default)]
struct Scratch {
    /// Penalised copy of the logits (only used when a penalty applies).
    logits: Vec<f32>,
    /// Surviving candidates of the chain.
    cands: Vec<Cand>,
    /// Buffers of the filter steps.
    work: Work,
}

/// Samples tokens with llama.cpp's default chain, keyed by position.
///
/// The outcome of [`sample`](Self::sample) depends only on the logits, the
/// parameters, the seed, the position and the penalty window of the history
/// — never on how many times sampling ran. Speculative decoding relies on
/// this: rows can be sampled in any order, and rejected tokens are undone
/// with [`truncate_history`](Self::truncate_history), after which every
/// position samples exactly as it would have without speculation.
///
/// `Sampler` is `Send` but not `Sync` (its scratch buffer sits in a
/// `RefCell`); give each sequence its own.
pub struct Sampler {
    params: SamplerParams,
    seed: u32,
    history: History,
    scratch: RefCell<Scratch>,
    /// The output constraint; a `RefCell` because computing a mask advances the matcher's
    /// internal caches while [`sample`](Self::sample) stays `&self`.
    grammar: Option<RefCell<Grammar>>,
    /// `(token, bias)` added to the logits before every other step, in this order.
    logit_bias: Vec<(u32, f32)>,
    /// The thinking budget: while it forces a token, every other token is masked.
    budget: Option<ReasoningBudget>,
}

impl Sampler {
    /// Validates `params`, resolves a random seed if requested, and seeds the
    /// penalty history with the prompt (as llama.cpp's server does by
    /// accepting the prompt tokens into its sampler).
    pub fn new(params: SamplerParams, prompt_tokens: &[u32]) -> Result<Self, SamplingError> {
        params.validate()?;
        let window = match params.repeat_last_n {
            -1 => None,
            n => Some(usize::try_from(n).unwrap_or(0)),
        };
        let mut history = History::new(window, params.penalties_active());
        for &t in prompt_tokens {
            history.push(t);
        }
        Ok(Self {
            params,
            seed: resolve_seed(params.seed),
            history,
            scratch: RefCell::new(Scratch::default()),
            grammar: None,
            logit_bias: Vec::new(),
            budget: None,
        })
    }

    /// Limits thinking blocks with `budget` (primed with the end of the prompt by the caller).
    pub fn with_reasoning_budget(mut self, budget: ReasoningBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Adds `bias` to the logit of `token` for every `(token, bias)` pair, before penalties,
    /// filters and the grammar mask (llama.cpp's logit-bias sampler opens its chain). Pairs apply
    /// in order, so a token listed twice gets both biases; `-inf` bans a token (unless it bans
    /// every token a grammar allows: the grammar wins). Tokens outside the vocabulary of the
    /// logits are ignored. A NaN bias is an error: it would make the token's rank meaningless.
    pub fn with_logit_bias(mut self, bias: &[(u32, f32)]) -> Result<Self, SamplingError> {
        if let Some(&(_, b)) = bias.iter().find(|(_, b)| b.is_nan()) {
            return Err(SamplingError::InvalidParam {
                name: "logit_bias",
                value: b.into(),
                expected: "a number or -inf",
            });
        }
        self.logit_bias = bias.to_vec();
        Ok(self)
    }

    /// The logit biases (see [`with_logit_bias`](Self::with_logit_bias)).
    pub fn logit_bias(&self) -> &[(u32, f32)] {
        &self.logit_bias
    }

    /// Constrains the output with `grammar` (compiled from [`GrammarVocab`](crate::GrammarVocab)).
    pub fn with_grammar(mut self, grammar: Grammar) -> Self {
        self.grammar = Some(RefCell::new(grammar));
        self
    }

    /// True if a grammar constrains this sampler.
    pub fn has_grammar(&self) -> bool {
        self.grammar.is_some()
    }

    /// Tokens the grammar forces next (empty without a grammar), or the rest of the closing
    /// sequence the thinking budget is forcing: the engine drafts them for free.
    pub fn grammar_forced_tokens(&self) -> Vec<u32> {
        if let Some(rest) = self.budget.as_ref().and_then(ReasoningBudget::forced_rest) {
            return rest.to_vec();
        }
        self.grammar
            .as_ref()
            .map(|g| g.borrow_mut().forced_tokens())
            .unwrap_or_default()
    }

    /// How many leading tokens of `draft` the grammar allows (all without a grammar).
    pub fn grammar_valid_prefix(&self, draft: &[u32]) -> usize {
        match &self.grammar {
            Some(g) => g.borrow_mut().valid_prefix(draft),
            None => draft.len(),
        }
    }

    /// The parameters as given (their `seed` may be
    /// [`RANDOM_SEED`](crate::RANDOM_SEED); see [`seed`](Self::seed)).
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The concrete seed in use. Passing it as `SamplerParams::seed`
    /// reproduces this sampler's draws.
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Uniform number in `[0, 1)` for `(seed, pos, lane)`; lane 0 is the one
    /// [`sample`](Self::sample) uses. See [`position_uniform`].
    pub fn uniform(&self, pos: u64, lane: u32) -> f64 {
        position_uniform(self.seed, pos, lane)
    }

    /// Samples the token for position `pos` from `logits` (one entry per
    /// vocabulary token) without changing the sampler; call
    /// [`accept`](Self::accept) with the token that is kept.
    ///
    /// Equal to `self.sample_from_distribution(&self.distribution(logits), pos)`.
    /// Greedy parameters return the argmax of the penalised logits (ties →
    /// lowest id). Empty `logits` yield token 0.
    pub fn sample(&self, logits: &[f32], pos: u64) -> u32 {
        let mut s = self.scratch.borrow_mut();
        self.run_chain(logits, &mut s);
        match s.cands.as_slice() {
            [] => 0,
            // Also the greedy case: no random number needed.
            [only] => only.id,
            cands => draw_iter(cands.iter().map(|c| (c.id, c.p)), self.uniform(pos, 0)),
        }
    }

    /// The candidate distribution after the whole chain: `(token, p)` pairs
    /// with `p > 0` summing to 1 (up to rounding). Order: descending
    /// probability when top-k is enabled; otherwise token-id order (or
    /// typicality order if typical sampling is on), so that a disabled top-k
    /// never sorts the whole vocabulary. The order is deterministic and is
    /// the order in which the draw walks the mass. Greedy parameters give a
    /// single pair with `p = 1`. Does not depend on the position: only the
    /// final draw is random.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let mut s = self.scratch.borrow_mut();
        self.run_chain(logits, &mut s);
        s.cands.iter().map(|c| (c.id, c.p)).collect()
    }

    /// Draws from a distribution (normally one returned by
    /// [`distribution`](Self::distribution)) with this sampler's number for
    /// `pos`; see [`draw`] for the exact rule.
    pub fn sample_from_distribution(&self, dist: &[(u32, f32)], pos: u64) -> u32 {
        match dist {
            [] => 0,
            [(id, _)] => *id,
            _ => draw(dist, self.uniform(pos, 0)),
        }
    }

    /// Samples a *draft* token for position `pos` from a drafter's `logits` under this sampler's
    /// chain (penalties from this sampler's history, filters, temperature), with the draft lane
    /// ([`LANE_DRAFT`]) so it is independent of the target's own draw for that position.
    /// Returns the token and the distribution `q` it was drawn from (as
    /// [`distribution`](Self::distribution)), which [`verify_draft`](Self::verify_draft) needs.
    pub fn sample_draft(&self, logits: &[f32], pos: u64) -> (u32, Vec<(u32, f32)>) {
        let q = self.distribution(logits);
        let t = match q.as_slice() {
            [] => 0,
            [(id, _)] => *id,
            _ => draw(&q, self.uniform(pos, LANE_DRAFT)),
        };
        (t, q)
    }

    /// Probabilistic verification (speculative rejection sampling) of draft token `x` at `pos`,
    /// drawn by a drafter from `q`, against this sampler's distribution `p` for the target's
    /// `logits` (penalties and grammar mask included): keeps `x` with probability
    /// `min(1, p(x)/q(x))`, else returns the replacement drawn from `norm(max(0, p - q))`.
    /// The coin and the replacement use their own lanes ([`LANE_ACCEPT`], [`LANE_RESIDUAL`]).
    /// Does not change the sampler; [`accept`](Self::accept) the token that is kept.
    pub fn verify_draft(&self, logits: &[f32], pos: u64, x: u32, q: &[(u32, f32)]) -> Verdict {
        let p = self.distribution(logits);
        verify_token(
            &p,
            q,
            x,
            self.uniform(pos, LANE_ACCEPT),
            self.uniform(pos, LANE_RESIDUAL),
        )
    }

    /// Appends a kept token to the history (and the penalty window) and advances the grammar.
    /// A token the grammar cannot take is an error (the sampler never picks one).
    pub fn accept(&mut self, token: u32) -> Result<(), SamplingError> {
        if let Some(g) = &self.grammar {
            g.borrow_mut().accept(token)?;
        }
        if let Some(b) = &mut self.budget {
            b.accept(token);
        }
        self.history.push(token);
        Ok(())
    }

    /// Prompt plus accepted tokens, oldest first.
    pub fn history(&self) -> &[u32] {
        self.history.tokens()
    }

    /// Number of tokens in [`history`](Self::history).
    pub fn history_len(&self) -> usize {
        self.history.tokens().len()
    }

    /// Drops tokens beyond the first `len` (rejected speculative tokens),
    /// restoring the penalty window exactly; no-op if `len >= history_len()`.
    pub fn truncate_history(&mut self, len: usize) -> Result<(), SamplingError> {
        let drop = self.history_len().saturating_sub(len);
        if let Some(g) = &self.grammar {
            g.borrow_mut().rollback(drop)?;
        }
        if let Some(b) = &mut self.budget {
            b.rollback(drop);
        }
        self.history.truncate(len);
        Ok(())
    }

    /// Logits with the logit biases, the grammar mask and the penalties applied, in llama.cpp's
    /// order (bias first: a penalty divides or multiplies the biased logit): `logits` itself
    /// when none applies, else a patched copy in `buf` (only a few tokens change, so a copy
    /// plus point updates beats a per-token lookup; masked tokens become -inf).
    fn penalised<'a>(&self, logits: &'a [f32], buf: &'a mut Vec<f32>) -> &'a [f32] {
        // A forced token is the only one left (llama.cpp's budget sampler sets every other
        // logit to -inf), whatever the biases, grammar and penalties say.
        if let Some(f) = self.budget.as_ref().and_then(ReasoningBudget::forced) {
            if (f as usize) < logits.len() {
                buf.clear();
                buf.resize(logits.len(), f32::NEG_INFINITY);
                buf[f as usize] = 0.0;
                return buf;
            }
        }
        let counts = self.history.counts();
        let applies = counts.keys().any(|&t| (t as usize) < logits.len());
        if !applies && self.grammar.is_none() && self.logit_bias.is_empty() {
            return logits;
        }
        let mask = self.grammar.as_ref().map(|g| g.borrow_mut().mask());
        let fill = |buf: &mut Vec<f32>, bias: &[(u32, f32)]| {
            buf.clear();
            buf.extend_from_slice(logits);
            for &(t, b) in bias {
                // Ids past this vocabulary (a drafter's smaller one, a caller's mistake) have no
                // logit.
                if let Some(l) = buf.get_mut(t as usize) {
                    *l += b;
                }
            }
            if let Some(mask) = &mask {
                for (i, l) in buf.iter_mut().enumerate() {
                    if !mask.is_allowed(i as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        };
        fill(buf, &self.logit_bias);
        if mask.is_some() && !self.logit_bias.is_empty() && max_of_slice(buf) == f32::NEG_INFINITY {
            // The biases banned every token the grammar allows (a complete grammar allows only
            // EOS, which `ignore_eos` bans): the grammar is the hard constraint, so its choice
            // stands, unbiased.
            fill(buf, &[]);
        }
        for (&t, &c) in counts {
            // Tokens outside this vocabulary (e.g. from a mismatched prompt)
            // have nothing to penalise.
            if let Some(l) = buf.get_mut(t as usize) {
                *l = penalize(*l, c, &self.params);
            }
        }
        buf
    }

    /// Runs the chain, leaving the final distribution in `s.cands`.
    fn run_chain(&self, logits: &[f32], s: &mut Scratch) {
        let Scratch {
            logits: buf,
            cands,
            work,
        } = s;
        cands.clear();
        let view = self.penalised(logits, buf);
        if view.is_empty() {
            return;
        }
        let p = &self.params;
        if p.is_greedy() && p.typical_p >= 1.0 {
            // top-k, top-p and min-p always keep the best token, so greedy
            // is one argmax pass over the penalised logits.
            let i = argmax(view);
            cands.push(Cand {
                id: i as u32,
                logit: clean(view[i]),
                p: 1.0,
            });
            return;
        }
        filter(view, p, cands, work);
        if p.is_greedy() {
            // Typical sampling may drop the argmax: take the best survivor.
            if let Some(best) = cands.iter().copied().min_by(desc) {
                cands.clear();
                cands.push(Cand { p: 1.0, ..best });
            }
            return;
        }
        softmax(cands, p.temperature, work);
        // Zero-mass survivors (underflow, -inf logits) can never be drawn;
        // dropping them keeps the reported support honest.
        cands.retain(|c| c.p > 0.0);
    }
}

impl Clone for Sampler {
    /// Clones parameters, seed and history; the scratch buffer starts empty.
    fn clone(&self) -> Self {
        Self {
            params: self.params,
            seed: self.seed,
            history: self.history.clone(),
            scratch: RefCell::new(Scratch::default()),
            grammar: self
                .grammar
                .as_ref()
                .map(|g| RefCell::new(g.borrow().clone())),
            logit_bias: self.logit_bias.clone(),
            budget: self.budget.clone(),
        }
    }
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .field("seed", &self.seed)
            .field("history_len", &self.history_len())
            .finish_non_exhaustive()
    }
}
