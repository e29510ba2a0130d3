//! The CPU backend's decode output: logits in host memory, written by the LM head in place, and
//! hidden states as a shared host buffer behind the seam's opaque handle.

use specd_backend::{HiddenRows, Output};
use std::sync::Arc;

/// Hidden states in host memory: `n_embd` floats per row. What a [`HiddenRows`] made by the CPU
/// backend refers to.
#[derive(Debug)]
pub struct HostHidden {
    pub data: Vec<f32>,
    pub n_embd: usize,
}

impl HostHidden {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.n_embd..(i + 1) * self.n_embd]
    }
}

/// Logits (and optionally hidden states) of the rows that asked for them, in row order.
#[derive(Debug, Clone, Default)]
pub struct DecodeOutput {
    /// Batch row index of each output.
    pub rows: Vec<usize>,
    pub n_vocab: usize,
    /// `rows.len() × n_vocab` values, then possibly more: kept from an earlier, wider batch
    /// for reuse ([`crate::Model::decode_into`]). Read through [`DecodeOutput::logits`],
    /// [`DecodeOutput::all_logits`].
    pub(crate) logits: Vec<f32>,
    pub n_embd: usize,
    /// With [`specd_backend::Batch::want_hidden`]: the normed final hidden state of **every**
    /// batch row (`batch.len() × n_embd`, in batch-row order), filled chunk by chunk.
    pub(crate) hidden: Vec<f32>,
    /// The finished `hidden`, shared with the handles given out.
    pub(crate) shared: Option<Arc<HostHidden>>,
}

impl DecodeOutput {
    /// The logits of every output, row after row (`len() × n_vocab`).
    pub fn all_logits(&self) -> &[f32] {
        &self.logits[..self.rows.len() * self.n_vocab]
    }
    /// [`DecodeOutput::all_logits`], owned.
    pub fn into_logits(mut self) -> Vec<f32> {
        self.logits.truncate(self.rows.len() * self.n_vocab);
        self.logits
    }
    /// Logits of output `i` (the i-th row that asked for logits).
    pub fn logits(&self, i: usize) -> &[f32] {
        &self.logits[i * self.n_vocab..(i + 1) * self.n_vocab]
    }
    /// Hidden states of every batch row (requires [`specd_backend::Batch::want_hidden`]).
    pub fn hidden_host(&self) -> Option<&HostHidden> {
        self.shared.as_deref()
    }
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// True if no row asked for logits.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// Starts a decode of `n_vocab`-wide logits and `n_embd`-wide hidden states.
    pub(crate) fn reset(&mut self, n_vocab: usize, n_embd: usize) {
        self.rows.clear();
        self.hidden.clear();
        self.shared = None;
        self.n_vocab = n_vocab;
        self.n_embd = n_embd;
    }
    /// Ends a decode: the hidden states filled become shareable.
    pub(crate) fn finish(&mut self, want_hidden: bool) {
        if want_hidden {
            let data = std::mem::take(&mut self.hidden);
            self.shared = Some(Arc::new(HostHidden {
                data,
                n_embd: self.n_embd,
            }));
        }
    }
}

impl Output for DecodeOutput {
    fn rows(&self) -> &[usize] {
        &self.rows
    }
    fn logits(&self, i: usize) -> &[f32] {
        DecodeOutput::logits(self, i)
    }
    fn hidden(&self) -> Option<HiddenRows> {
        let s = self.shared.clone()?;
        let n = s.data.len() / s.n_embd.max(1);
        Some(HiddenRows::new(s, n))
    }
}
