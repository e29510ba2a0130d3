//! Causal depthwise 1-D convolution followed by SiLU (the Gated DeltaNet input conv).

use crate::activation::silu_inplace;
use crate::parallel::SyncPtr;

/// Longest kernel the conv takes (Qwen3.5 and Qwen3-Next use 4).
pub const MAX_K: usize = 8;

/// `state`: the last `k−1` inputs, `(k−1) × c` with row 0 the oldest; `w`: `c × k` (tap `k−1`
/// multiplies the current input); `x`: `T × c`. Writes `out` (`T × c`, after SiLU) and
/// `state_out` (the last `k−1` rows of `[state | x]`). `state` and `state_out` may not alias.
pub fn causal_conv_silu(
    state: &[f32],
    x: &[f32],
    w: &[f32],
    k: usize,
    c: usize,
    out: &mut [f32],
    state_out: &mut [f32],
) {
    let t_len = x.len() / c;
    let hist = k - 1;
    // Input row i of the virtual sequence [state | x].
    let row = |i: usize| -> &[f32] {
        if i < hist {
            &state[i * c..(i + 1) * c]
        } else {
            &x[(i - hist) * c..(i - hist + 1) * c]
        }
    };
    // Channels in chunks whose weights are first transposed tap-major, so that the inner loop
    // runs over contiguous channels (the weights are channel-major, stride `k`, which kept it
    // scalar). Per output the sum is still 0 + w₀x₀ + w₁x₁ + … in tap order.
    // A batch's chunks are split over the threads (one row's stay on one: a hand-off would cost
    // more than its 6 Ki outputs).
    const CH: usize = 64;
    assert!(
        out.len() >= t_len * c && w.len() >= c * k,
        "causal_conv_silu: short buffers"
    );
    let optr = SyncPtr(out.as_mut_ptr());
    let chunk = |ci: usize| {
        let c0 = ci * CH;
        let m = CH.min(c - c0);
        let mut wt = [0f32; CH * MAX_K];
        for tau in 0..k {
            for j in 0..m {
                wt[tau * CH + j] = w[(c0 + j) * k + tau];
            }
        }
        for t in 0..t_len {
            // SAFETY: channels c0..c0+m of every row are this chunk's only; in bounds (asserted).
            let o = unsafe { optr.slice_mut(t * c + c0, m) };
            o.fill(0.0);
            for tau in 0..k {
                let xr = &row(t + tau)[c0..c0 + m];
                for ((o, &wv), &xv) in o.iter_mut().zip(&wt[tau * CH..tau * CH + m]).zip(xr) {
                    *o += wv * xv;
                }
            }
        }
    };
    if t_len * c >= 16 * 1024 {
        crate::parallel::for_each(c.div_ceil(CH), chunk);
    } else {
        (0..c.div_ceil(CH)).for_each(chunk);
    }
    silu_inplace(&mut out[..t_len * c]);
    window(state, x, hist, c, t_len, state_out);
}

/// The conv state after the first `n` of the `x` rows: the last `hist` rows of `[state | x[..n]]`.
pub fn window(state: &[f32], x: &[f32], hist: usize, c: usize, n: usize, state_out: &mut [f32]) {
    for j in 0..hist {
        let i = n + j; // index in [state | x] of the j-th kept row
        let src = if i < hist {
            &state[i * c..(i + 1) * c]
        } else {
            &x[(i - hist) * c..(i - hist + 1) * c]
        };
        state_out[j * c..(j + 1) * c].copy_from_slice(src);
    }
}
