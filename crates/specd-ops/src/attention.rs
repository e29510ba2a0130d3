//! Causal softmax attention of a sequence's new query rows over its KV cache, with GQA.
//!
//! Every (query row, head) pair is reduced on its own, walking keys in position order with a
//! fixed reduction order, so a row's output never depends on the other rows of the batch or on
//! how the work is split. What is shared is the *reading*: the query heads of one KV head (the
//! GQA group) and the rows of the batch are processed together, each key and value row loaded
//! once for all of them. On a long context the KV cache is the largest stream after the
//! weights; read once per query head and row, it made every extra verification row pay for a
//! whole pass over the cache, a cost that grows with the context.

use crate::parallel::SyncPtr;
use crate::vec::{axpy_rows, dot_kv, KvElem};

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub d_head: usize,
}

/// Queries of one work unit at most: their query vectors stay in L1 while the key rows stream
/// past.
const MAX_QUERIES: usize = 32;
/// Value rows per block: a block (64 KiB at `d_head` 256) stays in L2 while every query of the
/// unit adds it to its output.
const KEY_BLOCK: usize = 64;

thread_local! {
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `q`: `T × n_head × d_head` (already normed and rotated); `k_cache`, `v_cache`:
/// `n_pos × n_kv × d_head` holding this sequence's positions `0..n_pos` (`f32` or `f16`, see
/// [`KvElem`]); query row `t` sits at position `positions[t]` and sees keys `0..=positions[t]`.
/// Writes `out`: `T × n_head × d_head`.
pub fn attention<K: KvElem, V: KvElem>(
    q: &[f32],
    positions: &[u32],
    k_cache: &[K],
    v_cache: &[V],
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
    // The queries of KV head `kvh`, in (row, head) order: index `i` is row `i / group`, head
    // `kvh·group + i % group`. They are cut into chunks, enough for every thread to get work.
    let per_kv = t_len * group;
    let threads = crate::parallel::n_threads();
    let chunk = (per_kv * n_kv).div_ceil(threads).clamp(1, MAX_QUERIES);
    let chunks_per_kv = per_kv.div_ceil(chunk);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    crate::parallel::for_each(n_kv * chunks_per_kv, |unit| {
        let (kvh, c) = (unit / chunks_per_kv, unit % chunks_per_kv);
        let queries: Vec<(usize, usize)> = (c * chunk..((c + 1) * chunk).min(per_kv))
            .map(|i| (i / group, kvh * group + i % group))
            .collect();
        let n_keys: Vec<usize> = queries
            .iter()
            .map(|&(t, _)| positions[t] as usize + 1)
            .collect();
        let max_keys = n_keys.iter().copied().max().unwrap_or(0);
        // scores[i][s] for query i and key s < n_keys[i]; row stride max_keys. The buffer is the
        // thread's own and kept between calls: at a long context a fresh one is large enough to
        // be mapped from the OS and page-faulted in on every call.
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.resize(queries.len() * max_keys, 0.0);
            for s in 0..max_keys {
                let kv = &k_cache[s * kv_row + kvh * d_head..][..d_head];
                for (i, &(t, h)) in queries.iter().enumerate() {
                    if s < n_keys[i] {
                        let qv = &q[(t * n_head + h) * d_head..][..d_head];
                        scores[i * max_keys + s] = dot_kv(qv, kv) * scale;
                    }
                }
            }
            // Softmax weights per query, summed in key order.
            let mut inv = Vec::with_capacity(queries.len());
            for (i, &n) in n_keys.iter().enumerate() {
                let sc = &mut scores[i * max_keys..i * max_keys + n];
                let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let mut sum = 0f32;
                for x in sc.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                inv.push(1.0 / sum);
            }
            // SAFETY: each (t, h) output slice belongs to exactly one query of one unit.
            let mut outs: Vec<&mut [f32]> = queries
                .iter()
                .map(|&(t, h)| unsafe { out_ptr.slice_mut((t * n_head + h) * d_head, d_head) })
                .collect();
            for o in outs.iter_mut() {
                o.fill(0.0);
            }
            let v_head = &v_cache[kvh * d_head..];
            for b0 in (0..max_keys).step_by(KEY_BLOCK) {
                for (i, o) in outs.iter_mut().enumerate() {
                    let b1 = n_keys[i].min(b0 + KEY_BLOCK);
                    if b1 > b0 {
                        let w = &scores[i * max_keys + b0..i * max_keys + b1];
                        axpy_rows(w, &v_head[b0 * kv_row..], kv_row, o);
                    }
                }
            }
            for (o, &inv) in outs.iter_mut().zip(&inv) {
                for v in o.iter_mut() {
                    *v *= inv;
                }
            }
        });
    });
}
