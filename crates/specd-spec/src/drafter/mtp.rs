//! `draft-mtp`: the model's own multi-token-prediction (NextN) head drafts (docs/qwen35.md §3.7).
//!
//! The head is one attention block fed with a token and the hidden state of the position before
//! it. Its KV cache mirrors the target: every row the target keeps is fed through the head
//! (batched into the next draft call, so mirroring costs no extra pass), paired with the target's
//! hidden state of the previous row. Hidden states stay in the backend: the drafter holds only
//! handles to them ([`HiddenRows`]). Drafting then runs the head recursively on its own output,
//! and the drafted positions are removed from its cache afterwards (attention only: plain
//! position removal, no recurrent state to roll back). Under probabilistic verification the head's
//! tokens are sampled instead of taken greedily (see [`DraftSampling`]).

use super::{next_draft, start_draft, take_probs, DraftDist, DraftSampling, Drafter};
use crate::SpecError;
use specd_backend::{Backend, HiddenRows, MemoryConfig, MtpContext, RollbackKind};

/// MTP drafter for one sequence.
pub struct MtpDrafter {
    head: Box<dyn MtpContext>,
    /// Target rows not yet mirrored into the head: tokens from position `pending_pos0`, and the
    /// hidden states paired with them (that of each one's previous position), in order.
    pending_tokens: Vec<u32>,
    pending_h: Vec<HiddenRows>,
    pending_pos0: usize,
    /// The target's hidden state at the last position it kept (zeros before the first).
    last_h: HiddenRows,
    /// Positions the target has kept and reported.
    n_target: usize,
    p_min: f32,
    /// Set when the head cannot follow the target (the target started from a reused prefix the
    /// head never saw): the drafter then proposes nothing.
    lost: bool,
    /// Set under probabilistic verification: drafts are sampled and their q recorded.
    sampling: Option<DraftSampling>,
}

impl MtpDrafter {
    /// A drafter on the MTP head of `target` with a context of `n_ctx`; stops drafting when the
    /// head's top probability falls under `p_min`.
    pub fn new(target: &dyn Backend, n_ctx: usize, p_min: f32) -> Result<Self, SpecError> {
        let head = target.new_mtp_context(MemoryConfig {
            n_ctx,
            max_seqs: 1,
            rollback: RollbackKind::Checkpoint,
            ..Default::default()
        })?;
        Ok(MtpDrafter {
            head,
            pending_tokens: Vec::new(),
            pending_h: Vec::new(),
            pending_pos0: 0,
            last_h: HiddenRows::zeros(1),
            n_target: 0,
            p_min,
            lost: false,
            sampling: None,
        })
    }

    /// Samples drafts with `sampling` instead of drafting greedily (probabilistic
    /// verification); `None` keeps greedy drafts.
    pub fn with_sampling(mut self, sampling: Option<DraftSampling>) -> Self {
        self.sampling = sampling;
        self
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "draft-mtp"
    }
    fn is_cheap(&self) -> bool {
        false
    }
    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe_target(&mut self, tokens: &[u32], pos0: usize, hidden: &HiddenRows) {
        let n = tokens.len();
        if self.lost || n == 0 {
            return;
        }
        if pos0 != self.n_target || hidden.len() != n {
            self.lost = true;
            return;
        }
        if self.pending_tokens.is_empty() {
            self.pending_pos0 = pos0;
        }
        // Row i is paired with the hidden state of position i - 1: the last kept one, then
        // these rows but the last, which becomes the last kept.
        self.pending_tokens.extend_from_slice(tokens);
        self.pending_h.push(self.last_h.clone());
        self.pending_h.extend(hidden.slice(0, n - 1));
        if let Some(last) = hidden.slice(n - 1, 1) {
            self.last_h = last;
        }
        self.n_target += n;
    }

    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        // The target has kept positions 0..p-1; `last` (position p) is what it decodes next.
        let p = tokens.len().saturating_sub(1);
        if self.lost || tokens.is_empty() || n_max == 0 || p != self.n_target {
            return Ok(Vec::new());
        }
        let room = self.head.n_ctx().saturating_sub(tokens.len());
        let n_max = n_max.min(room);
        if n_max == 0 {
            return Ok(Vec::new());
        }
        // Mirror the pending target rows and decode `last` in the same pass.
        let mut rows = std::mem::take(&mut self.pending_tokens);
        let mut hs = std::mem::take(&mut self.pending_h);
        let pos0 = if rows.is_empty() {
            p
        } else {
            self.pending_pos0
        };
        rows.push(tokens[p]);
        hs.push(self.last_h.clone());
        let out = self.head.decode(&rows, pos0, &hs)?;
        let mut prev_h = last_row(out.hidden(), rows.len())?;
        let mut drafts = Vec::new();
        start_draft(self.sampling.as_mut(), tokens)?;
        // Drafted token i sits at position p + 1 + i.
        let mut next = next_draft(out, 0, p + 1, self.p_min, self.sampling.as_mut())?;
        while let Some(tok) = next {
            drafts.push(tok);
            if drafts.len() == n_max {
                break;
            }
            let out = self
                .head
                .decode(&[tok], p + drafts.len(), std::slice::from_ref(&prev_h))?;
            prev_h = last_row(out.hidden(), 1)?;
            next = next_draft(
                out,
                0,
                p + 1 + drafts.len(),
                self.p_min,
                self.sampling.as_mut(),
            )?;
        }
        // Keep only the mirrored target rows (positions < p) in the head's cache.
        self.head.remove_from(p)?;
        Ok(drafts)
    }
    fn take_draft_probs(&mut self) -> Option<Vec<DraftDist>> {
        take_probs(self.sampling.as_mut())
    }
}

/// The last of the `n` rows of the head's hidden output.
fn last_row(h: Option<HiddenRows>, n: usize) -> Result<HiddenRows, SpecError> {
    h.and_then(|h| h.slice(n - 1, 1))
        .ok_or_else(|| SpecError::Invalid("MTP: the head returned no hidden state".into()))
}
