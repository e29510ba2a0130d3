//! The decode batch: rows of (token, position, sequence, wants-output) from several sequences.

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
    /// Also keep the final normed hidden state of every row (the MTP head's input), as an
    /// opaque handle in the output ([`crate::Output::hidden`]).
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
