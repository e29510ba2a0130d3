//! Speculation parameters, named after llama.cpp's flags so users can carry theirs over.

use serde::{Deserialize, Serialize};
pub use specd_backend::RollbackKind;

/// Drafter families (llama.cpp `--spec-type` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrafterKind {
    NgramSimple,
    NgramMapK,
    NgramMapK4v,
    NgramMod,
    NgramCache,
    /// A second, smaller model (`-md`).
    DraftSimple,
    /// The target's own multi-token-prediction head.
    DraftMtp,
    /// Test/benchmark only: the true continuation, corrupted at configured per-position rates.
    Synthetic,
}

impl DrafterKind {
    /// Parses one `--spec-type` value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "ngram-simple" => DrafterKind::NgramSimple,
            "ngram-map-k" => DrafterKind::NgramMapK,
            "ngram-map-k4v" => DrafterKind::NgramMapK4v,
            "ngram-mod" => DrafterKind::NgramMod,
            "ngram-cache" => DrafterKind::NgramCache,
            "draft-simple" | "draft" => DrafterKind::DraftSimple,
            "draft-mtp" | "mtp" => DrafterKind::DraftMtp,
            "synthetic" | "synth" => DrafterKind::Synthetic,
            _ => return None,
        })
    }
    /// The `--spec-type` name.
    pub fn name(self) -> &'static str {
        match self {
            DrafterKind::NgramSimple => "ngram-simple",
            DrafterKind::NgramMapK => "ngram-map-k",
            DrafterKind::NgramMapK4v => "ngram-map-k4v",
            DrafterKind::NgramMod => "ngram-mod",
            DrafterKind::NgramCache => "ngram-cache",
            DrafterKind::DraftSimple => "draft-simple",
            DrafterKind::DraftMtp => "draft-mtp",
            DrafterKind::Synthetic => "synthetic",
        }
    }
    /// Parses a comma list.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                Self::parse(p).ok_or_else(|| format!("unknown speculative type '{}'", p.trim()))
            })
            .collect()
    }
}

/// How drafted tokens are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum VerifyKind {
    /// The target samples each row with its own sampler and keeps drafts while they match:
    /// output identical to plain decoding (default).
    #[default]
    Exact,
    /// Speculative rejection sampling for the model drafters (`draft-simple`, `draft-mtp`): they
    /// sample their drafts, and a draft token is kept with probability min(1, p/q). Preserves the
    /// target's output distribution, not its tokens (it can accept more drafts when sampling).
    /// Rounds fall back to exact matching for greedy requests, under a grammar, and for drafters
    /// without distributions (n-gram, synthetic). A seed repeats a run when the draft lengths
    /// repeat (fixed lengths, `adaptive` off): the controller's choices follow measured timings.
    Probabilistic,
}

impl VerifyKind {
    /// Parses `exact|probabilistic`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "exact" => VerifyKind::Exact,
            "probabilistic" => VerifyKind::Probabilistic,
            _ => return None,
        })
    }
    /// Name.
    pub fn name(self) -> &'static str {
        match self {
            VerifyKind::Exact => "exact",
            VerifyKind::Probabilistic => "probabilistic",
        }
    }
}

/// Speculation settings of one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpecParams {
    /// Drafters in priority order; empty = no speculation.
    pub drafters: Vec<DrafterKind>,
    /// Most tokens drafted per round.
    pub n_max: usize,
    /// Fewest tokens a draft must have to be verified (shorter drafts are dropped).
    pub n_min: usize,
    /// Draft-model drafting stops when its top probability falls below this (0 by default, as
    /// in llama-server: the controller decides how much to draft).
    pub p_min: f32,
    /// Let the controller choose the draft length (up to `n_max`, zero included). Off = always
    /// draft `n_max` when the drafter can.
    pub adaptive: bool,
    /// Synthetic drafter: unconditional per-position acceptance probabilities (llama.cpp's
    /// `--spec-synth-rates`). Empty: derived from `synth_len`.
    pub synth_rates: Vec<f32>,
    /// Synthetic drafter: target mean acceptance length including the target's own token
    /// (llama.cpp's `--spec-synth-len`), used when `synth_rates` is empty.
    pub synth_len: Option<f32>,
    /// n-gram key length for the n-gram drafters.
    pub ngram_n: usize,
    /// How drafts are verified (exact by default).
    #[serde(default)]
    pub verify: VerifyKind,
}

impl Default for SpecParams {
    fn default() -> Self {
        SpecParams {
            drafters: Vec::new(),
            n_max: 16,
            n_min: 0,
            p_min: 0.0,
            adaptive: true,
            synth_rates: Vec::new(),
            synth_len: None,
            ngram_n: 3,
            verify: VerifyKind::Exact,
        }
    }
}

impl SpecParams {
    /// Unconditional per-position rates of the synthetic drafter.
    pub fn synthetic_rates(&self) -> Vec<f32> {
        if !self.synth_rates.is_empty() {
            return self.synth_rates.clone();
        }
        let len = self.synth_len.unwrap_or(1.0 + self.n_max as f32 / 2.0);
        crate::drafter::synthetic::rates_for_mean_length(len, self.n_max)
    }
    /// True if any drafter is configured.
    pub fn enabled(&self) -> bool {
        !self.drafters.is_empty() && self.n_max > 0
    }
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), String> {
        if self.n_min > self.n_max {
            return Err(format!("n_min {} > n_max {}", self.n_min, self.n_max));
        }
        if self.n_max > 64 {
            return Err(format!("n_max {} exceeds the limit of 64", self.n_max));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(format!("p_min {} outside [0, 1]", self.p_min));
        }
        if self.synth_rates.iter().any(|r| !(0.0..=1.0).contains(r)) {
            return Err(format!(
                "synthetic rates {:?} must be in [0, 1]",
                self.synth_rates
            ));
        }
        if let Some(l) = self.synth_len {
            if !(1.0..=(self.n_max as f32 + 1.0)).contains(&l) {
                return Err(format!(
                    "synthetic mean length {l} must be in [1, n_max + 1]"
                ));
            }
        }
        if self.ngram_n == 0 {
            return Err("ngram key length must be at least 1".into());
        }
        Ok(())
    }
}
