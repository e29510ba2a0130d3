//! Per-sequence speculation statistics (docs/speculative.md §7).

use serde::Serialize;

/// Counters of one generation.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SpecStats {
    /// Rounds run (plain steps included).
    pub rounds: u64,
    /// Rounds that verified a non-empty draft.
    pub drafts: u64,
    /// Tokens drafted and verified.
    pub draft_tokens: u64,
    /// Drafted tokens accepted.
    pub accepted_tokens: u64,
    /// Rounds whose draft was empty (drafter had nothing, or the controller chose zero).
    pub empty_draft_rounds: u64,
    /// Rounds where the controller chose not to speculate although a draft was available.
    pub controller_skips: u64,
    /// Accepted counts per draft position (index 0 = first drafted token).
    pub accepted_per_position: Vec<u64>,
    /// Drafted counts per draft position.
    pub drafted_per_position: Vec<u64>,
    /// Rollbacks without decoding again (recurrence replay or snapshot).
    pub rollbacks_fast: u64,
    /// Rollbacks by checkpoint restore + redecode.
    pub rollbacks_checkpoint: u64,
    /// Tokens decoded again by checkpoint redecodes.
    pub redecoded_tokens: u64,
    /// Histogram of chosen draft lengths (index = length).
    pub chosen_lengths: Vec<u64>,
    /// Tokens drafted for free because the grammar forced them.
    pub grammar_forced_tokens: u64,
    /// Draft rounds verified by rejection sampling (probabilistic verification) instead of
    /// exact matching.
    pub probabilistic_rounds: u64,
}

impl SpecStats {
    /// Mean tokens per verified draft round: 1 + accepted / drafts.
    pub fn acceptance_length(&self) -> f64 {
        if self.drafts == 0 {
            return 1.0;
        }
        1.0 + self.accepted_tokens as f64 / self.drafts as f64
    }
    /// Accepted / drafted.
    pub fn acceptance_rate(&self) -> f64 {
        if self.draft_tokens == 0 {
            return 0.0;
        }
        self.accepted_tokens as f64 / self.draft_tokens as f64
    }
    pub(crate) fn record_draft(&mut self, drafted: usize, accepted: usize) {
        if self.accepted_per_position.len() < drafted {
            self.accepted_per_position.resize(drafted, 0);
            self.drafted_per_position.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.drafted_per_position[i] += 1;
            if i < accepted {
                self.accepted_per_position[i] += 1;
            }
        }
        self.drafts += 1;
        self.draft_tokens += drafted as u64;
        self.accepted_tokens += accepted as u64;
    }
    pub(crate) fn record_choice(&mut self, n: usize) {
        if self.chosen_lengths.len() <= n {
            self.chosen_lengths.resize(n + 1, 0);
        }
        self.chosen_lengths[n] += 1;
    }
    /// Adds another sequence's counters (server-wide totals).
    pub fn merge(&mut self, o: &SpecStats) {
        self.rounds += o.rounds;
        self.drafts += o.drafts;
        self.draft_tokens += o.draft_tokens;
        self.accepted_tokens += o.accepted_tokens;
        self.empty_draft_rounds += o.empty_draft_rounds;
        self.controller_skips += o.controller_skips;
        self.rollbacks_fast += o.rollbacks_fast;
        self.rollbacks_checkpoint += o.rollbacks_checkpoint;
        self.redecoded_tokens += o.redecoded_tokens;
        self.grammar_forced_tokens += o.grammar_forced_tokens;
        self.probabilistic_rounds += o.probabilistic_rounds;
        for (dst, src) in [
            (&mut self.accepted_per_position, &o.accepted_per_position),
            (&mut self.drafted_per_position, &o.drafted_per_position),
            (&mut self.chosen_lengths, &o.chosen_lengths),
        ] {
            if dst.len() < src.len() {
                dst.resize(src.len(), 0);
            }
            for (d, s) in dst.iter_mut().zip(src) {
                *d += s;
            }
        }
    }
}
