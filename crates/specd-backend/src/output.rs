//! What a decode gives back. Logits are read per row, when the engine needs them, with the
//! question asked most — the top token and its probability — answered by the backend itself, so
//! a device backend need not copy every row's vocabulary to the host. Hidden states stay inside
//! the backend as opaque handles ([`HiddenRows`]) that the engine and the drafters only pass on.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

/// The most likely token of `logits` and its probability under a softmax (ties go to the lower
/// token id). Every backend's [`Output::top`] must answer exactly this.
pub fn argmax_prob(logits: &[f32]) -> (u32, f32) {
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

/// The outputs of one decode: one per batch row that asked for logits, in batch order. Made by
/// the context that fills it ([`crate::Context::new_output`]); a backend keeps its buffers in it
/// so that step after step reuses them.
pub trait Output: Any + Send {
    /// The batch row of each output.
    fn rows(&self) -> &[usize];
    /// The logits of output `i` (`n_vocab` values).
    fn logits(&self, i: usize) -> &[f32];
    /// The most likely token of output `i` and its probability ([`argmax_prob`]).
    fn top(&self, i: usize) -> (u32, f32) {
        argmax_prob(self.logits(i))
    }
    /// The final normed hidden state of every batch row, when the batch asked for them
    /// ([`crate::Batch::want_hidden`]).
    fn hidden(&self) -> Option<HiddenRows>;
    /// Number of outputs.
    fn len(&self) -> usize {
        self.rows().len()
    }
    /// True if no row asked for logits.
    fn is_empty(&self) -> bool {
        self.rows().is_empty()
    }
    /// The logits of batch row `row`, if it asked for them.
    fn logits_of_row(&self, row: usize) -> Option<&[f32]> {
        self.rows()
            .iter()
            .position(|&r| r == row)
            .map(|i| self.logits(i))
    }
}

/// Hidden states of consecutive rows, in the memory of the backend that computed them (host
/// memory on the CPU, a buffer on a GPU). Cloning shares them; [`HiddenRows::slice`] narrows the
/// view. Only the backend that made them reads them ([`HiddenRows::store`]); rows of
/// [`HiddenRows::zeros`] stand for the zero state before a sequence's first position.
#[derive(Clone)]
pub struct HiddenRows {
    store: Option<Arc<dyn Any + Send + Sync>>,
    first: usize,
    len: usize,
}

impl HiddenRows {
    /// The `len` rows of a backend's `store`.
    pub fn new(store: Arc<dyn Any + Send + Sync>, len: usize) -> Self {
        HiddenRows {
            store: Some(store),
            first: 0,
            len,
        }
    }
    /// `len` rows of zeros (no backend memory).
    pub fn zeros(len: usize) -> Self {
        HiddenRows {
            store: None,
            first: 0,
            len,
        }
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Rows `start..start + len` of these, if they are there.
    pub fn slice(&self, start: usize, len: usize) -> Option<HiddenRows> {
        (start + len <= self.len).then(|| HiddenRows {
            store: self.store.clone(),
            first: self.first + start,
            len,
        })
    }
    /// For the backend that made them: its store (`None` for zeros or another backend's) and
    /// the rows of it these are.
    pub fn store<T: Any>(&self) -> Option<(&T, Range<usize>)> {
        let s = self.store.as_deref()?.downcast_ref::<T>()?;
        Some((s, self.first..self.first + self.len))
    }
    /// True for [`HiddenRows::zeros`].
    pub fn is_zeros(&self) -> bool {
        self.store.is_none()
    }
}

impl std::fmt::Debug for HiddenRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HiddenRows({}..{}{})",
            self.first,
            self.first + self.len,
            if self.is_zeros() { ", zeros" } else { "" }
        )
    }
}
