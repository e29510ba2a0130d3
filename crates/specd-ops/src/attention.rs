//! Causal softmax attention of a sequence's new query rows over its KV cache, with GQA.
//!
//! Each (query row, head) pair is computed independently, walking keys in position order with a
//! fixed reduction order, so a row's output never depends on the other rows of the batch.

use crate::parallel::SyncPtr;
use crate::vec::{axpy, dot};
use rayon::prelude::*;

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub d_head: usize,
}

/// `q`: `T × n_head × d_head` (already normed and rotated); `k_cache`, `v_cache`:
/// `n_pos × n_kv × d_head` holding this sequence's positions `0..n_pos`; query row `t` sits at
/// position `positions[t]` and sees keys `0..=positions[t]`. Writes `out`: `T × n_head × d_head`.
pub fn attention(
    q: &[f32],
    positions: &[u32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        n_head,
        n_kv,
        d_head,
    } = shape;
    let t_len = positions.len();
    let group = n_head / n_kv;
    let kv_row = n_kv * d_head;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    (0..t_len * n_head).into_par_iter().for_each(|th| {
        let (t, h) = (th / n_head, th % n_head);
        let kvh = h / group;
        let qv = &q[(t * n_head + h) * d_head..][..d_head];
        let n_keys = positions[t] as usize + 1;
        let mut scores = Vec::with_capacity(n_keys);
        let mut max = f32::NEG_INFINITY;
        for s in 0..n_keys {
            let kv = &k_cache[s * kv_row + kvh * d_head..][..d_head];
            let sc = dot(qv, kv) * scale;
            max = max.max(sc);
            scores.push(sc);
        }
        // SAFETY: each (t, h) owns its own output slice.
        let o = unsafe { out_ptr.slice_mut((t * n_head + h) * d_head, d_head) };
        o.fill(0.0);
        let mut sum = 0f32;
        for (s, sc) in scores.iter().enumerate() {
            let e = (sc - max).exp();
            sum += e;
            axpy(e, &v_cache[s * kv_row + kvh * d_head..][..d_head], o);
        }
        let inv = 1.0 / sum;
        for v in o.iter_mut() {
            *v *= inv;
        }
    });
}
