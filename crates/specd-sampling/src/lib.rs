//! Token sampling for specd with position-keyed randomness and a
//! rollback-able penalty history.
//!
//! Exact speculative decoding needs the token chosen at a position to be a
//! pure function of `(logits, parameters, seed, position, penalty window)`.
//! [`Sampler::sample`] therefore takes `&self` and the position, draws its
//! uniform number from a counter-based generator keyed by `(seed, pos)`
//! ([`position_uniform`]), and the history can be rolled back with
//! [`Sampler::truncate_history`] when draft tokens are rejected.
//!
//! Speculative decoding verifies drafts exactly by default (the target's own draw must match the
//! draft); [`rejection`] holds the opt-in probabilistic test ([`Sampler::sample_draft`],
//! [`Sampler::verify_draft`]), which preserves the target distribution instead of the tokens.
//!
//! An optional [`Grammar`] (llguidance: GBNF, Lark, JSON schema, regex) masks
//! the logits before the chain and rolls back with the history.
//!
//! A [`ReasoningBudget`] forces the end of a thinking block that ran past its budget (a forced
//! token masks every other, so drafts are verified against it like any other token).
//!
//! The chain mirrors llama.cpp's default order: logit bias
//! ([`Sampler::with_logit_bias`]) → penalties → top-k → typical → top-p →
//! min-p → temperature → draw.
//!
//! ```
//! use specd_sampling::{Sampler, SamplerParams};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let params = SamplerParams { seed: 1234, ..SamplerParams::default() };
//! let mut sampler = Sampler::new(params, &[1, 2, 3])?;
//! let logits = [0.1f32, 2.0, 1.5, -1.0];
//! let token = sampler.sample(&logits, 3);
//! // Same position, same state: same token.
//! assert_eq!(token, sampler.sample(&logits, 3));
//! sampler.accept(token)?;
//! # Ok(())
//! # }
//! ```

mod budget;
mod chain;
mod gbnf;
mod grammar;
mod history;
mod logprobs;
mod params;
pub mod rejection;
mod rng;
mod sampler;

pub use budget::ReasoningBudget;
pub use gbnf::gbnf_to_lark;
pub use grammar::{Grammar, GrammarSpec, GrammarVocab};
pub use logprobs::{token_logprob, top_logprobs};
pub use params::{SamplerParams, SamplingError, RANDOM_SEED};
pub use rejection::Verdict;
pub use rng::{draw, position_uniform};
pub use sampler::Sampler;
