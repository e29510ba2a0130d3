//! One module per layer kind. Each layer's `forward` takes the normed input rows of the whole
//! batch and the per-sequence row groups, and returns its output rows.

pub mod attention;
pub mod block;
pub mod ffn;
pub mod gdn;
pub mod moe;
pub mod mtp;

use specd_memory::SeqId;
use std::borrow::Cow;

/// The rows of one sequence within a batch, in position order.
#[derive(Debug, Clone)]
pub struct SeqRows {
    pub seq: SeqId,
    /// Batch row indices.
    pub rows: Vec<usize>,
    /// Their positions.
    pub positions: Vec<u32>,
}

/// Rows `idx` of a row-major `n × d` matrix as a contiguous `idx.len() × d` matrix: `src`
/// itself when `idx` is all of its rows in order (a batch of one sequence), else a copy.
pub fn gather<'a>(src: &'a [f32], d: usize, idx: &[usize]) -> Cow<'a, [f32]> {
    if idx.len() * d == src.len() && idx.iter().enumerate().all(|(j, &i)| i == j) {
        return Cow::Borrowed(src);
    }
    let mut out = Vec::with_capacity(idx.len() * d);
    for &i in idx {
        out.extend_from_slice(&src[i * d..(i + 1) * d]);
    }
    Cow::Owned(out)
}

/// Writes the rows of `src` (`idx.len() × d`) to rows `idx` of `dst`.
pub fn scatter(src: &[f32], d: usize, idx: &[usize], dst: &mut [f32]) {
    for (j, &i) in idx.iter().enumerate() {
        dst[i * d..(i + 1) * d].copy_from_slice(&src[j * d..(j + 1) * d]);
    }
}
