//! Generation with exact speculative decoding. Knows nothing about HTTP.
//!
//! One *round* per sequence (docs/speculative.md §1): a [`drafter`] proposes tokens, the target
//! model verifies `[last, d1..dn]` in one batch (rows of all active sequences share one decode
//! batch), the target's own sampler walks the rows and keeps the longest matching prefix plus one
//! token of its own, everything the rejected tokens touched is rolled back ([`rollback`]), and the
//! drafter hears how many were accepted. Plain decoding is the same loop with empty drafts, so both
//! paths share every line that could make their outputs differ. Opt-in probabilistic verification
//! ([`params::VerifyKind::Probabilistic`]) replaces the matching by rejection sampling for the
//! model drafters: same output distribution, not the same tokens.
//!
//! * [`engine::Engine`]: the round for many sequences at once.
//! * [`controller`]: picks each round's draft length for the best expected tokens per second
//!   (zero included) — speculation must never make generation slower.
//! * [`reuse`]: prompt reuse across requests and the prompt cache in RAM.
//! * [`stats`]: per-sequence statistics (docs/speculative.md §7).

pub mod controller;
pub mod drafter;
pub mod engine;
pub mod grammar;
pub mod params;
pub mod reuse;
pub mod rollback;
pub mod stats;

pub use engine::{
    Engine, FinishReason, LiveTimings, PromptProgress, SeqOutput, SequenceRequest, StepEvent,
};
pub use params::{DrafterKind, RollbackKind, SpecParams, VerifyKind};
pub use reuse::RamCacheStats;
pub use stats::SpecStats;

/// Errors of a generation.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Backend(#[from] specd_backend::BackendError),
    #[error(transparent)]
    Memory(#[from] specd_backend::MemoryError),
    #[error(transparent)]
    Sampling(#[from] specd_sampling::SamplingError),
    #[error("invalid request: {0}")]
    Invalid(String),
}
