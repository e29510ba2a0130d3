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
    assert!(
        out.len() >= t_len * c && w.len() >= c * k && k <= MAX_K && state.len() >= (k - 1) * c,
        "causal_conv_silu: short buffers"
    );
    let conv = Conv {
        state,
        x,
        w,
        k,
        c,
        out: SyncPtr(out.as_mut_ptr()),
    };
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::isa() >= crate::Isa::Avx2;
    let chunk = |ci: usize| {
        // SAFETY: channels ci·CH.. of every output row are this chunk's only (see `Conv::chunk`);
        // the AVX2 build of the same code runs only where the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            return unsafe { conv.chunk_avx2(ci) };
        }
        unsafe { conv.chunk(ci) }
    };
    // A batch's chunks are split over the threads (one row's stay on one: a hand-off would cost
    // more than its 6 Ki outputs).
    if t_len * c >= 16 * 1024 {
        crate::parallel::for_each(c.div_ceil(CH), chunk);
    } else {
        (0..c.div_ceil(CH)).for_each(chunk);
    }
    silu_inplace(&mut out[..t_len * c]);
    window(state, x, k - 1, c, t_len, state_out);
}

/// Channels per chunk of the conv.
const CH: usize = 64;

/// One conv's operands, shared by its chunks.
struct Conv<'a> {
    state: &'a [f32],
    x: &'a [f32],
    w: &'a [f32],
    k: usize,
    c: usize,
    /// `T × c` outputs (`T` = `x.len() / c`).
    out: SyncPtr<f32>,
}

impl Conv<'_> {
    /// Channels `ci·CH..` of every output row. The weights are first transposed tap-major, so
    /// that the inner loop runs over contiguous channels (they are channel-major, stride `k`,
    /// which kept it scalar). Per output the sum is 0 + w₀x₀ + w₁x₁ + … in tap order, a multiply
    /// and an add each (no fused multiply-add), so every build of this code gives the same bits.
    ///
    /// # Safety
    /// `out` covers `T × c` floats and no other thread writes this chunk's channels; `k ≤ MAX_K`,
    /// `w` holds `c × k` and `state` `(k − 1) × c` floats.
    #[inline(always)]
    unsafe fn chunk(&self, ci: usize) {
        let Conv {
            state,
            x,
            w,
            k,
            c,
            out,
        } = *self;
        let hist = k - 1;
        let t_len = x.len() / c;
        // Input row i of the virtual sequence [state | x].
        let row = |i: usize| -> &[f32] {
            if i < hist {
                &state[i * c..(i + 1) * c]
            } else {
                &x[(i - hist) * c..(i - hist + 1) * c]
            }
        };
        let c0 = ci * CH;
        let m = CH.min(c - c0);
        let mut wt = [0f32; CH * MAX_K];
        for tau in 0..k {
            for j in 0..m {
                wt[tau * CH + j] = w[(c0 + j) * k + tau];
            }
        }
        for t in 0..t_len {
            // SAFETY: in bounds and this chunk's own (the caller's contract).
            let o = unsafe { out.slice_mut(t * c + c0, m) };
            o.fill(0.0);
            for tau in 0..k {
                let xr = &row(t + tau)[c0..c0 + m];
                for ((o, &wv), &xv) in o.iter_mut().zip(&wt[tau * CH..tau * CH + m]).zip(xr) {
                    *o += wv * xv;
                }
            }
        }
    }

    /// [`Conv::chunk`] compiled for AVX2: the same code, its loops vectorised eight lanes wide
    /// (the portable build gets SSE2's four).
    ///
    /// # Safety
    /// As [`Conv::chunk`]; the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn chunk_avx2(&self, ci: usize) {
        unsafe { self.chunk(ci) }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The conv against a plain loop with the same order of operations, bit for bit, over
    /// lengths that run on one thread and lengths split over the pool, channel counts that do
    /// and do not fill the last chunk, and kernels up to `MAX_K`.
    #[test]
    fn matches_the_plain_loop_bit_for_bit() {
        let pool = crate::pool::Pool::new(3).expect("compute threads");
        let mut seed = 0x9e37_79b9_u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        for &(t_len, c, k) in &[
            (1, 100, 4),
            (3, 64, 4),
            (8, 2100, 4),
            (9, 3000, 8),
            (2, 7, 2),
        ] {
            let hist = k - 1;
            let state: Vec<f32> = (0..hist * c).map(|_| rnd()).collect();
            let x: Vec<f32> = (0..t_len * c).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..c * k).map(|_| rnd()).collect();
            let mut want = vec![0f32; t_len * c];
            for t in 0..t_len {
                for ch in 0..c {
                    let mut acc = 0f32;
                    for tau in 0..k {
                        let i = t + tau;
                        let xv = if i < hist {
                            state[i * c + ch]
                        } else {
                            x[(i - hist) * c + ch]
                        };
                        acc += w[ch * k + tau] * xv;
                    }
                    want[t * c + ch] = acc;
                }
            }
            silu_inplace(&mut want);
            let mut want_state = vec![0f32; hist * c];
            for j in 0..hist {
                let i = t_len + j;
                for ch in 0..c {
                    want_state[j * c + ch] = if i < hist {
                        state[i * c + ch]
                    } else {
                        x[(i - hist) * c + ch]
                    };
                }
            }
            let mut out = vec![f32::NAN; t_len * c];
            let mut state_out = vec![f32::NAN; hist * c];
            pool.install(|| causal_conv_silu(&state, &x, &w, k, c, &mut out, &mut state_out));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "T {t_len}, c {c}, k {k}");
            assert_eq!(state_out, want_state, "T {t_len}, c {c}, k {k}");
        }
    }
}
