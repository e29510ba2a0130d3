//! AVX-512 body of the recurrence for a run of tokens: each state row is loaded into registers
//! once, carried through every token of the run, and stored once.
//!
//! The token-by-token kernel ([`crate::vec::delta_head_step`]) streams a head's whole state
//! (64 KiB at d_k = d_v = 128, more than L1) through the cache twice per token; a verification
//! batch or a rollback replay of `T` tokens paid that `T` times. A row's recurrence does not
//! depend on the other rows, so the loops can be swapped: rows outer, tokens inner.
//!
//! Bit-identical to the token-by-token kernel: every lane does the same multiply, add and
//! fused multiply-add in the same order, and the two dot products per token are reduced exactly
//! as [`crate::vec::dot`] does it (four 8-lane accumulators over 32-element blocks, the same
//! horizontal sum) — a 16-lane accumulator holds two of those 8-lane ones side by side.

use super::{HeadOutputs, HeadTokens};
use std::arch::x86_64::*;

/// Can [`run`] take rows of this length? (Multiples of 32 up to 128: the row stays in 8
/// registers and the reduction has no 8-wide or scalar tail.)
pub(super) fn supports(d_k: usize) -> bool {
    d_k.is_multiple_of(32) && (32..=128).contains(&d_k)
}

/// Runs all tokens of `tok` over one head's state: rows read from `src` (`d_v × d_k`), final
/// rows written to `dst`.
///
/// # Safety
/// AVX-512F must be available; `supports(d_k)`; `src`, `dst` hold `d_v·d_k` values; every
/// strided input index for `t < tok.n` is in bounds; non-null output pointers are valid for
/// every index written (see [`HeadOutputs`]).
pub(super) unsafe fn run(
    src: &[f32],
    dst: &mut [f32],
    d_k: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    unsafe {
        match d_k {
            32 => run_rows::<1>(src, dst, tok, o),
            64 => run_rows::<2>(src, dst, tok, o),
            96 => run_rows::<3>(src, dst, tok, o),
            _ => run_rows::<4>(src, dst, tok, o),
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn run_rows<const NB: usize>(
    src: &[f32],
    dst: &mut [f32],
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    let d_k = 32 * NB;
    let d_v = dst.len() / d_k;
    // SAFETY: rows `vi..vi + n` exist (`row_pairs`); the rest is the caller's contract.
    super::row_pairs(src, d_k, d_v, |vi, n| unsafe {
        if n == 2 {
            rows::<NB, 2>(src, dst, vi, tok, o)
        } else {
            rows::<NB, 1>(src, dst, vi, tok, o)
        }
    });
}

/// Sum of the four 8-lane accumulators held in `a` (acc0 | acc1) and `b` (acc2 | acc3), in
/// `dot`'s order: hsum((acc0 + acc1) + (acc2 + acc3)).
#[inline(always)]
unsafe fn reduce(a: __m512, b: __m512) -> f32 {
    unsafe {
        let lo = |x: __m512| _mm512_castps512_ps256(x);
        let hi = |x: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
        let s = _mm256_add_ps(_mm256_add_ps(lo(a), hi(a)), _mm256_add_ps(lo(b), hi(b)));
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

#[inline(always)]
unsafe fn rows<const NB: usize, const R: usize>(
    src: &[f32],
    dst: &mut [f32],
    vi0: usize,
    tok: &HeadTokens<'_>,
    o: &HeadOutputs,
) {
    unsafe {
        let d_k = 32 * NB;
        // row[r][2b], row[r][2b+1]: elements 32b..32b+16 and 32b+16..32b+32 of row vi0 + r.
        let mut row = [[_mm512_setzero_ps(); 8]; R];
        for (r, rr) in row.iter_mut().enumerate() {
            let p = src.as_ptr().add((vi0 + r) * d_k);
            for (i, x) in rr.iter_mut().take(2 * NB).enumerate() {
                *x = _mm512_loadu_ps(p.add(16 * i));
            }
        }
        for t in 0..tok.n {
            let kp = tok.k.as_ptr().add(t * tok.qk_stride);
            let qp = tok.q.as_ptr().add(t * tok.qk_stride);
            let g = _mm512_set1_ps(*tok.decay.get_unchecked(t * tok.gb_stride));
            let beta = *tok.beta.get_unchecked(t * tok.gb_stride);
            // row = decay·row; u = row·k
            let mut ua = [_mm512_setzero_ps(); R];
            let mut ub = [_mm512_setzero_ps(); R];
            for b in 0..NB {
                let k0 = _mm512_loadu_ps(kp.add(32 * b));
                let k1 = _mm512_loadu_ps(kp.add(32 * b + 16));
                for r in 0..R {
                    row[r][2 * b] = _mm512_mul_ps(row[r][2 * b], g);
                    row[r][2 * b + 1] = _mm512_mul_ps(row[r][2 * b + 1], g);
                    ua[r] = _mm512_fmadd_ps(row[r][2 * b], k0, ua[r]);
                    ub[r] = _mm512_fmadd_ps(row[r][2 * b + 1], k1, ub[r]);
                }
            }
            // row += β(v − u)·k (multiply, then add); o = row·q
            let mut dv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let v = *tok.v.get_unchecked(t * tok.v_stride + vi0 + r);
                dv[r] = _mm512_set1_ps(beta * (v - reduce(ua[r], ub[r])));
            }
            let mut oa = [_mm512_setzero_ps(); R];
            let mut ob = [_mm512_setzero_ps(); R];
            for b in 0..NB {
                let k0 = _mm512_loadu_ps(kp.add(32 * b));
                let k1 = _mm512_loadu_ps(kp.add(32 * b + 16));
                let q0 = _mm512_loadu_ps(qp.add(32 * b));
                let q1 = _mm512_loadu_ps(qp.add(32 * b + 16));
                for r in 0..R {
                    row[r][2 * b] = _mm512_add_ps(row[r][2 * b], _mm512_mul_ps(dv[r], k0));
                    row[r][2 * b + 1] = _mm512_add_ps(row[r][2 * b + 1], _mm512_mul_ps(dv[r], k1));
                    oa[r] = _mm512_fmadd_ps(row[r][2 * b], q0, oa[r]);
                    ob[r] = _mm512_fmadd_ps(row[r][2 * b + 1], q1, ob[r]);
                }
            }
            if !o.out.is_null() {
                for r in 0..R {
                    *o.out.add(t * o.out_stride + vi0 + r) = reduce(oa[r], ob[r]);
                }
            }
            if !o.snap.is_null() && t >= o.snap_first {
                let base = o.snap.add((t - o.snap_first) * o.snap_stride);
                for (r, rr) in row.iter().enumerate() {
                    let p = base.add((vi0 + r) * d_k);
                    for (i, x) in rr.iter().take(2 * NB).enumerate() {
                        _mm512_storeu_ps(p.add(16 * i), *x);
                    }
                }
            }
        }
        for (r, rr) in row.iter().enumerate() {
            let p = dst.as_mut_ptr().add((vi0 + r) * d_k);
            for (i, x) in rr.iter().take(2 * NB).enumerate() {
                _mm512_storeu_ps(p.add(16 * i), *x);
            }
        }
    }
}
