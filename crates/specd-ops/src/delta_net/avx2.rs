//! AVX2 body of the recurrence for a run of tokens: rows outer, tokens inner, as in
//! [`super::avx512`], with each row kept in L1 rather than in registers (a 128-float row alone
//! would take all sixteen ymm registers).
//!
//! The token-by-token kernel passes a head's whole state (64 KiB at d_k = d_v = 128, more than
//! L1) through the cache for every token; here a verification batch or a rollback replay of `T`
//! tokens reads each row from L2 once and works its `T` tokens in L1.
//!
//! A token costs a row two passes — decay and `u = row·k`, then the update and `o = row·q` —
//! and each pass ends in a horizontal sum that the next one waits for. Passes over a row are
//! therefore *fused across tokens*: one sweep finishes token `t − 1` (update, `o`) and starts
//! token `t` (decay, `u`) element by element, so a run of `T` tokens is `T + 1` sweeps instead
//! of `2T`, and two rows take turns sweeping, so that one row's sums are reduced while the other
//! row's sweep runs. Every element sees the same multiplies, adds and fused multiply-adds in the
//! same order as in [`crate::vec::delta_rows_avx2`] (the token-by-token kernel's), and each
//! accumulator sums the same products in the same order, so the bits are the same — a unit test
//! checks it. Rows whose length is not a multiple of 32, and runs that store snapshots, take the
//! token-by-token kernel's two passes per token.

use super::{HeadOutputs, HeadTokens};
use std::arch::x86_64::*;

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
    let fused = d_k.is_multiple_of(32) && o.snap.is_null();
    let (s0, d0) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: rows `vi..vi + n` exist (`row_pairs`); the rest is the caller's contract.
    super::row_pairs(src, d_k, d_v, |vi, n| unsafe {
        match (fused, n) {
            (true, 2) => fused_rows(rows_at::<2>(s0, d0, vi * d_k, d_k), d_k, vi, tok, o),
            (true, _) => fused_rows(rows_at::<1>(s0, d0, vi * d_k, d_k), d_k, vi, tok, o),
            (false, 2) => pass_rows(rows_at::<2>(s0, d0, vi * d_k, d_k), d_k, vi, tok, o),
            (false, _) => pass_rows(rows_at::<1>(s0, d0, vi * d_k, d_k), d_k, vi, tok, o),
        }
    });
}

/// `R` rows as (input state, output state) pointers.
type RowPtrs<const R: usize> = ([*const f32; R], [*mut f32; R]);

/// The `R` rows of `d_k` values from offset `at` of the input and output states.
///
/// # Safety
/// Both states hold `at + R·d_k` values.
#[inline(always)]
unsafe fn rows_at<const R: usize>(
    src: *const f32,
    dst: *mut f32,
    at: usize,
    d_k: usize,
) -> RowPtrs<R> {
    unsafe {
        (
            std::array::from_fn(|r| src.add(at + r * d_k)),
            std::array::from_fn(|r| dst.add(at + r * d_k)),
        )
    }
}

/// Rows `vi0..vi0 + R` through every token of `tok`, in `tok.n + 1` sweeps per row ([`sweep`]).
#[inline(always)]
unsafe fn fused_rows<const R: usize>(
    (from, row): RowPtrs<R>,
    d_k: usize,
    vi0: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    unsafe {
        let k = |t: usize| tok.k.as_ptr().add(t * tok.qk_stride);
        let q = |t: usize| tok.q.as_ptr().add(t * tok.qk_stride);
        let decay = |t: usize| *tok.decay.get_unchecked(t * tok.gb_stride);
        // β(v − u) for row r: the update of the token a sweep has just started.
        let delta = |t: usize, r: usize, u: f32| {
            let v = *tok.v.get_unchecked(t * tok.v_stride + vi0 + r);
            *tok.beta.get_unchecked(t * tok.gb_stride) * (v - u)
        };
        let mut d = [0f32; R];
        for r in 0..R {
            let (_, u) =
                sweep::<false, true>(from[r], row[r], d_k, 0.0, k(0), q(0), decay(0), k(0));
            d[r] = delta(0, r, u);
        }
        for t in 1..=tok.n {
            for r in 0..R {
                let out = if t < tok.n {
                    let (out, u) = sweep::<true, true>(
                        row[r],
                        row[r],
                        d_k,
                        d[r],
                        k(t - 1),
                        q(t - 1),
                        decay(t),
                        k(t),
                    );
                    d[r] = delta(t, r, u);
                    out
                } else {
                    let (out, _) = sweep::<true, false>(
                        row[r],
                        row[r],
                        d_k,
                        d[r],
                        k(t - 1),
                        q(t - 1),
                        0.0,
                        k(t - 1),
                    );
                    out
                };
                if !o.out.is_null() {
                    *o.out.add((t - 1) * o.out_stride + vi0 + r) = out;
                }
            }
        }
    }
}

/// One sweep over `d_k` (a multiple of 32) values read from `from` as `x` and written to `row`
/// (the same row, but for a run's first sweep, which reads the input state). With `FINISH`, the
/// previous token's second pass: `x += dp·kp` (multiply, then add), `o = x·qp`. With `START`,
/// the next token's first pass: `x = g·x`, `u = x·k`. Returns `(o, u)` (0 for a pass not done),
/// each reduced in [`crate::vec::dot`]'s order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn sweep<const FINISH: bool, const START: bool>(
    from: *const f32,
    row: *mut f32,
    d_k: usize,
    dp: f32,
    kp: *const f32,
    qp: *const f32,
    g: f32,
    k: *const f32,
) -> (f32, f32) {
    unsafe {
        let (dv, gv) = (_mm256_set1_ps(dp), _mm256_set1_ps(g));
        let mut oa = [_mm256_setzero_ps(); 4];
        let mut ua = [_mm256_setzero_ps(); 4];
        for i in (0..d_k).step_by(32) {
            for j in 0..4 {
                let at = i + 8 * j;
                let mut x = _mm256_loadu_ps(from.add(at));
                if FINISH {
                    x = _mm256_add_ps(x, _mm256_mul_ps(dv, _mm256_loadu_ps(kp.add(at))));
                    oa[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(qp.add(at)), oa[j]);
                }
                if START {
                    x = _mm256_mul_ps(x, gv);
                    ua[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k.add(at)), ua[j]);
                }
                _mm256_storeu_ps(row.add(at), x);
            }
        }
        let sum = |a: [__m256; 4]| {
            crate::vec::hsum(_mm256_add_ps(
                _mm256_add_ps(a[0], a[1]),
                _mm256_add_ps(a[2], a[3]),
            ))
        };
        (
            if FINISH { sum(oa) } else { 0.0 },
            if START { sum(ua) } else { 0.0 },
        )
    }
}

/// Rows `vi0..vi0 + R` through every token of `tok`, two passes per token (the token-by-token
/// kernel's [`crate::vec::delta_rows_avx2`], rows in lockstep), storing snapshots if asked.
#[inline(always)]
unsafe fn pass_rows<const R: usize>(
    (src, row): RowPtrs<R>,
    d_k: usize,
    vi0: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    unsafe {
        for t in 0..tok.n {
            let from = if t == 0 {
                src
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
