//! AVX2 body of the recurrence for a run of tokens: rows outer, tokens inner, as in
//! [`super::avx512`], with each row kept in L1 rather than in registers (a 128-float row alone
//! would take all sixteen ymm registers), two rows in lockstep (`super::row_pairs`).
//!
//! The token-by-token kernel passes a head's whole state (64 KiB at d_k = d_v = 128, more than
//! L1) through the cache for every token; here a verification batch or a rollback replay of `T`
//! tokens reads each row from L2 once and works its `T` tokens in L1. Every row step is
//! [`crate::vec::delta_rows_avx2`], the token-by-token kernel's own, so the bits are the same.

use super::{HeadOutputs, HeadTokens};

/// Runs all tokens of `tok` over one head's state: rows read from `src` (`d_v × d_k`), final
/// rows written to `dst`.
///
/// # Safety
/// AVX2 and FMA must be available; `src`, `dst` hold `d_v·d_k` values; every strided input index
/// for `t < tok.n` is in bounds; non-null output pointers are valid for every index written
/// (see [`HeadOutputs`]).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run(
    src: &[f32],
    dst: &mut [f32],
    d_k: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    let d_v = dst.len() / d_k;
    // SAFETY: rows `vi..vi + n` exist (`row_pairs`); the rest is the caller's contract.
    super::row_pairs(src, d_k, d_v, |vi, n| unsafe {
        if n == 2 {
            rows::<2>(src, dst, d_k, vi, tok, o)
        } else {
            rows::<1>(src, dst, d_k, vi, tok, o)
        }
    });
}

/// Rows `vi0..vi0 + R` through every token of `tok`.
#[inline(always)]
unsafe fn rows<const R: usize>(
    src: &[f32],
    dst: &mut [f32],
    d_k: usize,
    vi0: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    unsafe {
        let row: [*mut f32; R] = std::array::from_fn(|r| dst.as_mut_ptr().add((vi0 + r) * d_k));
        for t in 0..tok.n {
            let from: [*const f32; R] = if t == 0 {
                std::array::from_fn(|r| src.as_ptr().add((vi0 + r) * d_k))
            } else {
                row.map(|p| p as *const f32)
            };
            let y = crate::vec::delta_rows_avx2(
                from,
                row,
                d_k,
                *tok.decay.get_unchecked(t * tok.gb_stride),
                *tok.beta.get_unchecked(t * tok.gb_stride),
                tok.k.as_ptr().add(t * tok.qk_stride),
                tok.q.as_ptr().add(t * tok.qk_stride),
                std::array::from_fn(|r| *tok.v.get_unchecked(t * tok.v_stride + vi0 + r)),
            );
            if !o.out.is_null() {
                for (r, y) in y.into_iter().enumerate() {
                    *o.out.add(t * o.out_stride + vi0 + r) = y;
                }
            }
            if !o.snap.is_null() && t >= o.snap_first {
                let base = o.snap.add((t - o.snap_first) * o.snap_stride);
                for (r, p) in row.iter().enumerate() {
                    std::ptr::copy_nonoverlapping(*p, base.add((vi0 + r) * d_k), d_k);
                }
            }
        }
    }
}
