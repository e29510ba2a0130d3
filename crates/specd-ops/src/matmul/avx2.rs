//! AVX2 + FMA kernels: 32-lane i8 dot products via `maddubs`, four activation rows per weight
//! load.

use crate::quant::BlockQ8;
use crate::weight::WeightType;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    unsafe {
        let bits = std::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// Signed i8·i8 dot of 32 pairs, as 8 i32 lanes converted to f32. `aw` = |w|.
#[inline(always)]
unsafe fn dot_i8(aw: __m256i, w: __m256i, x: __m256i) -> __m256 {
    unsafe {
        let sx = _mm256_sign_epi8(x, w);
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(p)
    }
}

/// One Q8_0 weight row against `R` quantised activation rows. Block `b` accumulates into
/// `acc[b % 2]`; the order is the same for every `R`, which is what batch invariance needs.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0<const R: usize>(
    w: *const u8,
    nb: usize,
    x: [*const BlockQ8; R],
) -> [f32; R] {
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..nb {
            let wb = w.add(b * 34);
            let dw = f16_at(wb);
            let wq = _mm256_loadu_si256(wb.add(2) as *const __m256i);
            let aw = _mm256_sign_epi8(wq, wq);
            for r in 0..R {
                let xb = &*x[r].add(b);
                let xq = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let p = dot_i8(aw, wq, xq);
                let a = &mut acc[r][b & 1];
                *a = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * xb.d), *a);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
        }
        out
    }
}

/// One Q4_0 weight row against `R` quantised activation rows (same order rules as Q8_0).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0<const R: usize>(
    w: *const u8,
    nb: usize,
    x: [*const BlockQ8; R],
) -> [f32; R] {
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mask = _mm_set1_epi8(0x0f);
        let eight = _mm256_set1_epi8(8);
        for b in 0..nb {
            let wb = w.add(b * 18);
            let dw = f16_at(wb);
            let raw = _mm_loadu_si128(wb.add(2) as *const __m128i);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            let wq = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
            let aw = _mm256_sign_epi8(wq, wq);
            for r in 0..R {
                let xb = &*x[r].add(b);
                let xq = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let p = dot_i8(aw, wq, xq);
                let a = &mut acc[r][b & 1];
                *a = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * xb.d), *a);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
        }
        out
    }
}

#[inline(always)]
unsafe fn load8(wt: WeightType, w: *const u8, i: usize) -> __m256 {
    unsafe {
        match wt {
            WeightType::F32 => _mm256_loadu_ps((w as *const f32).add(i)),
            WeightType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(i * 2) as *const __m128i)),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(i * 2) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
        }
    }
}

#[inline(always)]
unsafe fn load1(wt: WeightType, w: *const u8, i: usize) -> f32 {
    unsafe {
        match wt {
            WeightType::F32 => std::ptr::read_unaligned((w as *const f32).add(i)),
            WeightType::F16 => f16_at(w.add(i * 2)),
            _ => {
                f32::from_bits((std::ptr::read_unaligned(w.add(i * 2) as *const u16) as u32) << 16)
            }
        }
    }
}

/// One float weight row (F32/F16/BF16) against `R` f32 activation rows: two 8-lane
/// accumulators per row over 16-wide steps, then an 8-wide step, then a scalar tail — the same
/// sequence for every `R`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_float<const R: usize>(
    wt: WeightType,
    w: *const u8,
    cols: usize,
    x: [*const f32; R],
) -> [f32; R] {
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut i = 0;
        while i + 16 <= cols {
            let w0 = load8(wt, w, i);
            let w1 = load8(wt, w, i + 8);
            for r in 0..R {
                acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r].add(i)), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r].add(i + 8)), acc[r][1]);
            }
            i += 16;
        }
        if i + 8 <= cols {
            let w0 = load8(wt, w, i);
            for r in 0..R {
                acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r].add(i)), acc[r][0]);
            }
            i += 8;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
        }
        while i < cols {
            let wv = load1(wt, w, i);
            for r in 0..R {
                out[r] += wv * *x[r].add(i);
            }
            i += 1;
        }
        out
    }
}

/// Writes an AVX2 group kernel's results: row `r`'s 16 outputs (half 0's eight, then half 1's)
/// at `out + r·ostride`.
///
/// # Safety
/// AVX must be available; `out` covers `(R − 1)·ostride + 16` floats.
#[inline(always)]
pub(crate) unsafe fn store_halves<const R: usize>(
    acc: &[[__m256; R]; 2],
    out: *mut f32,
    ostride: usize,
) {
    unsafe {
        for (h, acc) in acc.iter().enumerate() {
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * ostride + 8 * h), *a);
            }
        }
    }
}

/// How one 16-row interleaved type (see [`crate::pack`]) feeds the AVX2 group kernel.
pub trait GroupBlock {
    /// Bytes of one group block.
    const BYTES: usize;
    /// Right shift turning the activations' `−128·Σx` into the offset the stored unsigned
    /// weights carry (used where the weights are multiplied as unsigned).
    const CORR_SHIFT: i32;
    /// Integer dots of the eight rows of half `h` of the group block at `blk` with the 32
    /// activations at each `x[r]`: `p[r] += Σ w·x` per row (exact). Chunks outermost, so the
    /// weight side (decoding, the sign trick's |w|) is done once for all `R` rows.
    unsafe fn idot<const VNNI: bool, const R: usize>(
        blk: *const u8,
        h: usize,
        x: &[*const i8; R],
        p: &mut [__m256i; R],
    );
}

pub struct Q8_0;
pub struct Q4_0;

#[inline(always)]
unsafe fn x4(x: *const i8, c: usize) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(x.add(4 * c) as *const i32)) }
}

/// `p + Σ u·x` over four-byte groups with `vpdpbusd` (AVX-VNNI) or its AVX2 emulation, for
/// unsigned `u` small enough that two `vpmaddubsw` pair sums fit i16 (`u` ≤ 63).
#[inline(always)]
unsafe fn dp_small<const VNNI: bool>(p: __m256i, w: [__m256i; 2], x: [__m256i; 2]) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(p, w[0], x[0]), w[1], x[1])
        } else {
            let s = _mm256_add_epi16(
                _mm256_maddubs_epi16(w[0], x[0]),
                _mm256_maddubs_epi16(w[1], x[1]),
            );
            pin(_mm256_add_epi32(
                p,
                _mm256_madd_epi16(s, _mm256_set1_epi16(1)),
            ))
        }
    }
}

/// `p + Σ w·x` over four-byte groups for signed `w` with |w| ≤ 128, `aw` = |w| (the sign
/// trick: one `vpmaddubsw` pair sum is at most 2·128·127 = 32512, exact in i16).
#[inline(always)]
unsafe fn dp_signed(p: __m256i, aw: __m256i, w: __m256i, x: __m256i) -> __m256i {
    unsafe {
        let m = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
        pin(_mm256_add_epi32(
            p,
            _mm256_madd_epi16(m, _mm256_set1_epi16(1)),
        ))
    }
}

/// `v`, through an empty `asm!` that the compiler cannot look into or reorder with another
/// (`asm!` without `pure` counts as a side effect): keeps a tile's chunks in source order —
/// chunk outermost, rows inside, the weight side of a chunk computed once and used by every row
/// while it is in a register. Without it LLVM re-associates each row's integer sums into a tree
/// and computes the tile row by row, spilling every chunk's weight side (`|w|` and `w`, or the
/// two nibble vectors) to the stack for the next rows, and some tile heights cost far more.
/// Integer adds: the sums, and so the bits, are the same either way.
#[target_feature(enable = "avx")]
#[inline]
unsafe fn pin(mut v: __m256i) -> __m256i {
    unsafe {
        std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(nomem, nostack, preserves_flags));
    }
    v
}

impl GroupBlock for Q8_0 {
    const BYTES: usize = 16 * 34;
    const CORR_SHIFT: i32 = 0;
    #[inline(always)]
    unsafe fn idot<const VNNI: bool, const R: usize>(
        blk: *const u8,
        h: usize,
        x: &[*const i8; R],
        p: &mut [__m256i; R],
    ) {
        unsafe {
            for c in 0..8 {
                let w = _mm256_loadu_si256(blk.add(32 + 64 * c + 32 * h) as *const __m256i);
                if VNNI {
                    for r in 0..R {
                        p[r] = _mm256_dpbusd_avx_epi32(p[r], w, x4(x[r], c));
                    }
                } else {
                    // The stored `q + 128` would saturate `vpmaddubsw`: multiply the signed `q`
                    // with the sign trick instead (|q| ≤ 128, pair sums ≤ 32512).
                    let q = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
                    let aq = _mm256_abs_epi8(q);
                    for r in 0..R {
                        p[r] = dp_signed(p[r], aq, q, x4(x[r], c));
                    }
                }
            }
        }
    }
}

impl GroupBlock for Q4_0 {
    const BYTES: usize = 16 * 18;
    const CORR_SHIFT: i32 = 4;
    #[inline(always)]
    unsafe fn idot<const VNNI: bool, const R: usize>(
        blk: *const u8,
        h: usize,
        x: &[*const i8; R],
        p: &mut [__m256i; R],
    ) {
        unsafe {
            let mask = _mm256_set1_epi8(0x0f);
            for k in 0..4 {
                let v = _mm256_loadu_si256(blk.add(32 + 64 * k + 32 * h) as *const __m256i);
                let w = [
                    _mm256_and_si256(v, mask),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                ];
                for r in 0..R {
                    p[r] = dp_small::<VNNI>(p[r], w, [x4(x[r], 2 * k), x4(x[r], 2 * k + 1)]);
                }
            }
        }
    }
}

/// IQ4_NL: Q4_0's nibble layout holding indices of the 16 levels. With VNNI the index becomes
/// `level + 128` (unsigned; the kernel starts from `−128·Σx`); on AVX2 the signed level, with the
/// sign trick (|level| ≤ 127: one chunk's pair sums fit i16).
pub struct IQ4NL;

impl GroupBlock for IQ4NL {
    const BYTES: usize = 16 * 18;
    const CORR_SHIFT: i32 = 0;
    #[inline(always)]
    unsafe fn idot<const VNNI: bool, const R: usize>(
        blk: *const u8,
        h: usize,
        x: &[*const i8; R],
        p: &mut [__m256i; R],
    ) {
        unsafe {
            let mask = _mm256_set1_epi8(0x0f);
            let levels: *const u8 = if VNNI {
                crate::kquant::IQ4_UNSIGNED.as_ptr()
            } else {
                crate::kquant::IQ4_VALUES.as_ptr() as *const u8
            };
            let t = _mm_loadu_si128(levels as *const __m128i);
            let table = _mm256_set_m128i(t, t);
            for k in 0..4 {
                let v = _mm256_loadu_si256(blk.add(32 + 64 * k + 32 * h) as *const __m256i);
                let idx = [
                    _mm256_and_si256(v, mask),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                ];
                for (i, ix) in idx.into_iter().enumerate() {
                    let w = _mm256_shuffle_epi8(table, ix);
                    if VNNI {
                        for r in 0..R {
                            p[r] = _mm256_dpbusd_avx_epi32(p[r], w, x4(x[r], 2 * k + i));
                        }
                    } else {
                        let aw = _mm256_abs_epi8(w);
                        for r in 0..R {
                            p[r] = dp_signed(p[r], aw, w, x4(x[r], 2 * k + i));
                        }
                    }
                }
            }
        }
    }
}

/// The AVX2 / AVX-VNNI counterpart of [`super::avx512::dot_r16`]: one group of 16 interleaved
/// rows against `R` activation rows, as two halves of eight rows. Same integer sums (exact) and
/// the same float operations per output, so the same bits as the other levels.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // raw tile addressing
unsafe fn dot_r16_body<G: GroupBlock, const R: usize, const VNNI: bool>(
    w: *const u8,
    nb: usize,
    xq: *const i8,
    qstride: usize,
    xd: *const f32,
    xc: *const i32,
    bstride: usize,
    out: *mut f32,
    ostride: usize,
) {
    unsafe {
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_BLOCKS);
        let near = crate::prefetch::near_l1();
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        for b in 0..nb {
            let blk = w.add(b * G::BYTES);
            let pf = blk.wrapping_add(crate::prefetch::ahead(R, crate::prefetch::WIDE_BLOCKS));
            // Both halves of a block before the next one, each requesting half of the lines
            // ahead: the stream keeps flowing while the second half computes (see
            // `prefetch`, "Streaming the weights" in docs/quantisation.md).
            for (h, acc) in acc.iter_mut().enumerate() {
                crate::prefetch::stream(blk, pf, G::BYTES, (h, 2), l2, near);
                let ws = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h) as *const __m128i));
                let mut ip = [_mm256_setzero_si256(); R];
                let mut xs = [std::ptr::null::<i8>(); R];
                for r in 0..R {
                    // Unsigned products (VNNI, Q4_0) start from the correction; the sign trick
                    // (AVX2 Q8_0) multiplies the signed weights directly.
                    if VNNI || G::CORR_SHIFT != 0 {
                        ip[r] = _mm256_set1_epi32(*xc.add(r * bstride + b) >> G::CORR_SHIFT);
                    }
                    xs[r] = xq.add(r * qstride + 32 * b);
                }
                G::idot::<VNNI, R>(blk, h, &xs, &mut ip);
                for r in 0..R {
                    let s = _mm256_mul_ps(ws, _mm256_set1_ps(*xd.add(r * bstride + b)));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip[r]), s, acc[r]);
                }
            }
        }
        store_halves(&acc, out, ostride);
    }
}

/// [`dot_r16_body`] on AVX2 + FMA + F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_r16<G: GroupBlock, const R: usize>(
    w: *const u8,
    nb: usize,
    xq: *const i8,
    qstride: usize,
    xd: *const f32,
    xc: *const i32,
    bstride: usize,
    out: *mut f32,
    ostride: usize,
) {
    unsafe { dot_r16_body::<G, R, false>(w, nb, xq, qstride, xd, xc, bstride, out, ostride) }
}

/// [`dot_r16_body`] with AVX-VNNI's 256-bit `vpdpbusd`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_r16_vnni<G: GroupBlock, const R: usize>(
    w: *const u8,
    nb: usize,
    xq: *const i8,
    qstride: usize,
    xd: *const f32,
    xc: *const i32,
    bstride: usize,
    out: *mut f32,
    ostride: usize,
) {
    unsafe { dot_r16_body::<G, R, true>(w, nb, xq, qstride, xd, xc, bstride, out, ostride) }
}
