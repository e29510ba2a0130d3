//! The decode batch and its output.

use specd_memory::SeqId;

/// One row of a batch: feed `token` at `pos` of sequence `seq`; `logits` asks for its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRow {
    pub token: u32,
    pub pos: u32,
    pub seq: SeqId,
    pub logits: bool,
}

/// Rows from one or more sequences. Within one sequence, rows must continue that sequence's
/// positions in order; rows of different sequences may interleave.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub rows: Vec<BatchRow>,
    /// Also return the final normed hidden state of every row (the MTP head's input).
    pub want_hidden: bool,
}

impl Batch {
    /// Empty batch.
    pub fn new() -> Self {
        Batch::default()
    }
    /// Adds a row.
    pub fn push(&mut self, token: u32, pos: u32, seq: SeqId, logits: bool) -> &mut Self {
        self.rows.push(BatchRow {
            token,
            pos,
            seq,
            logits,
        });
        self
    }
    /// A run of tokens of one sequence from `pos0`, with logits for the last row only
    /// (`all_logits` for every row).
    pub fn from_tokens(tokens: &[u32], pos0: u32, seq: SeqId, all_logits: bool) -> Self {
        let n = tokens.len();
        let rows = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchRow {
                token: t,
                pos: pos0 + i as u32,
                seq,
                logits: all_logits || i + 1 == n,
            })
            .collect();
        Batch {
            rows,
            want_hidden: false,
        }
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
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
    /// With [`Batch::want_hidden`]: the normed final hidden state of **every** batch row
    /// (`batch.len() × n_embd`, in batch-row order).
    pub hidden: Vec<f32>,
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
    /// Logits of batch row `row`, if it asked for them.
    pub fn logits_of_row(&self, row: usize) -> Option<&[f32]> {
        self.rows
            .iter()
            .position(|&r| r == row)
            .map(|i| self.logits(i))
    }
    /// Hidden state of batch row `i` (requires [`Batch::want_hidden`]).
    pub fn hidden(&self, i: usize) -> &[f32] {
        &self.hidden[i * self.n_embd..(i + 1) * self.n_embd]
    }
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// True if no row asked for logits.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}
