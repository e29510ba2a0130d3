//! A context: one backend's sequences and the calls that run the model on them.

use crate::{BackendError, Batch, HiddenRows, Output, SequenceMemory};
use std::ops::ControlFlow;

/// What a decode did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decoded {
    /// Rows decoded: all of the batch, or fewer when `on_chunk` stopped it.
    pub rows: usize,
    /// Seconds the model took for them, measured by the backend once its work was done (a
    /// device backend waits for the device), so the controller prices rounds by what they cost.
    pub secs: f64,
}

/// A model's working state for several sequences (llama.cpp's context with its memory): decodes
/// batches of rows of those sequences and keeps what they leave — KV, recurrent state, rollback
/// records, checkpoints — where the backend runs its layers.
///
/// Every kernel behind a context is batch-invariant: a row's outputs do not depend on the batch
/// width, its place in the batch, or the other sequences in it. Exact speculation rests on this
/// (a verification batch must give each row what a one-row step gives it).
pub trait Context: SequenceMemory + Send {
    /// An empty output for [`Context::decode`] to fill (its buffers are kept between decodes).
    fn new_output(&self) -> Box<dyn Output>;
    /// Decodes `batch` into `out` (whose contents are replaced; `out` must come from this
    /// context's [`Context::new_output`]): every row's token enters its sequence; outputs for
    /// the rows that ask. Batches wider than the backend's micro-batch run in chunks;
    /// `on_chunk(rows_done)` after each may stop the rest (the rows done stay in memory and in
    /// `out`). On error the memory is as it was before the failing chunk.
    fn decode(
        &mut self,
        batch: &Batch,
        out: &mut dyn Output,
        on_chunk: &mut dyn FnMut(usize) -> ControlFlow<()>,
    ) -> Result<Decoded, BackendError>;

    /// [`Context::decode`] of the whole batch into a new output.
    fn decode_new(&mut self, batch: &Batch) -> Result<Box<dyn Output>, BackendError> {
        let mut out = self.new_output();
        self.decode(batch, out.as_mut(), &mut |_| ControlFlow::Continue(()))?;
        Ok(out)
    }
}

/// A model's multi-token-prediction (NextN) head with its own one-layer memory for one sequence
/// (made by [`crate::Backend::new_mtp_context`] of the target).
pub trait MtpContext: Send {
    /// Runs the head over rows of its sequence: row `i` is `tokens[i]` at position `pos0 + i`,
    /// paired with the hidden state of the position before it — the rows of `prev` one after
    /// another (the target's, or the head's own output when drafting recursively). The output
    /// has the logits of the last row and the head's hidden state of every row.
    fn decode(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        prev: &[HiddenRows],
    ) -> Result<&dyn Output, BackendError>;
    /// Positions in the head's memory.
    fn n_past(&self) -> usize;
    /// The head's context size.
    fn n_ctx(&self) -> usize;
    /// Removes positions `p0..` from the head's memory.
    fn remove_from(&mut self, p0: usize) -> Result<(), BackendError>;
}
