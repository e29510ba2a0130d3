//! AVX-512 VNNI kernels for Q2_K and Q3_K (layouts in [`super::q23`]). Per sub-block of 16
//! weights, the weight side (one load, shifts and masks; Q3_K's high bits) is done once for 16
//! rows and shared by up to eight activation rows; per row it is four `vpdpbusd` against
//! broadcast activation bytes. The integer sums and the float operations per super-block are
//! those of [`super::dot_decoded`], so the results equal the scalar reference bit for bit.
//!
//! Q2_K's 4-bit scales are multiplied into the weights before the dot products (`u·sc ≤ 45`
//! still fits `vpdpbusd`'s unsigned byte; one `vpmullw` on byte pairs cannot carry, as
//! `u·sc < 256`): four multiplies per sub-block for all rows instead of one `vpmulld` per row.
//! Q3_K's signed 6-bit scales do not fit that way and are applied per row.

use super::q23::{da_offset, quant_offset, sc_offset};
use super::{ActPtrs, KFormat, QK_K};
use std::arch::x86_64::*;

trait Fmt {
    const F: KFormat;
    /// Fills `wv[c]` with weights `4c..4c+4` of sub-block `2k + E` of each of the 16 rows: `u·sc`
    /// for Q2_K, `u` for Q3_K.
    unsafe fn load_sub<const E: usize>(blk: *const u8, k: usize, wv: &mut [__m512i; 4]);
}

struct Q2K;
struct Q3K;

/// The 2-bit quants of one sub-block (64 bytes at `q`) as four registers of `u`.
#[inline(always)]
unsafe fn low_bits(q: *const u8, wv: &mut [__m512i; 4]) {
    unsafe {
        let v = _mm512_loadu_si512(q as *const __m512i);
        let m = _mm512_set1_epi8(3);
        wv[0] = _mm512_and_si512(v, m);
        wv[1] = _mm512_and_si512(_mm512_srli_epi16::<2>(v), m);
        wv[2] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
        wv[3] = _mm512_and_si512(_mm512_srli_epi16::<6>(v), m);
    }
}

impl Fmt for Q2K {
    const F: KFormat = KFormat::Q2K;
    #[inline(always)]
    unsafe fn load_sub<const E: usize>(blk: *const u8, k: usize, wv: &mut [__m512i; 4]) {
        let s = 2 * k + E;
        unsafe {
            low_bits(blk.add(quant_offset(Self::F) + 64 * s), wv);
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                blk.add(sc_offset(Self::F) + 16 * s) as *const __m128i
            ));
            let sc = _mm512_and_si512(sc, _mm512_set1_epi32(0x0f));
            let sc16 = _mm512_or_si512(sc, _mm512_slli_epi32::<16>(sc));
            for v in wv.iter_mut() {
                *v = _mm512_mullo_epi16(*v, sc16);
            }
        }
    }
}

impl Fmt for Q3K {
    const F: KFormat = KFormat::Q3K;
    #[inline(always)]
    unsafe fn load_sub<const E: usize>(blk: *const u8, k: usize, wv: &mut [__m512i; 4]) {
        unsafe {
            let pair = blk.add(quant_offset(Self::F) + 192 * k);
            low_bits(pair.add(64 * E), wv);
            let hb = _mm512_loadu_si512(pair.add(128) as *const __m512i);
            // High bit `4e + c` of each byte to bit 2 (16-bit shifts; the mask drops what
            // crosses a byte), or-ed in with one `vpternlogd` (A | (B & C)).
            let four = _mm512_set1_epi8(4);
            let h = if E == 0 {
                [
                    _mm512_slli_epi16::<2>(hb),
                    _mm512_slli_epi16::<1>(hb),
                    hb,
                    _mm512_srli_epi16::<1>(hb),
                ]
            } else {
                [
                    _mm512_srli_epi16::<2>(hb),
                    _mm512_srli_epi16::<3>(hb),
                    _mm512_srli_epi16::<4>(hb),
                    _mm512_srli_epi16::<5>(hb),
                ]
            };
            for c in 0..4 {
                wv[c] = _mm512_ternarylogic_epi32::<0xF8>(wv[c], h[c], four);
            }
        }
    }
}

/// Sub-block `2k + E` of super-block `b` (at `blk`) against `R` activation rows: adds
/// `sc·Σ u·x` (Q2_K: `Σ (u·sc)·x`) to `isum`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn sub_block<F: Fmt, const R: usize, const E: usize>(
    blk: *const u8,
    k: usize,
    b: usize,
    p: ActPtrs,
    isum: &mut [__m512i; R],
) {
    unsafe {
        let fmt = F::F;
        let s = 2 * k + E;
        let mut wv = [_mm512_setzero_si512(); 4];
        F::load_sub::<E>(blk, k, &mut wv);
        let sc = if fmt == KFormat::Q3K {
            _mm512_cvtepi8_epi32(_mm_loadu_si128(
                blk.add(sc_offset(fmt) + 16 * s) as *const __m128i
            ))
        } else {
            _mm512_setzero_si512()
        };
        for r in 0..R {
            let xb = p.q.add(r * p.qstride + b * QK_K + 16 * s);
            let x4 =
                |c: usize| _mm512_set1_epi32(std::ptr::read_unaligned(xb.add(4 * c) as *const i32));
            // Two chains: the four products of a sub-block are one dependency chain otherwise
            // (a one-row tile waits on its latency).
            let p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], x4(0));
            let p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], x4(1));
            let p0 = _mm512_dpbusd_epi32(p0, wv[2], x4(2));
            let p1 = _mm512_dpbusd_epi32(p1, wv[3], x4(3));
            let ip = _mm512_add_epi32(p0, p1);
            isum[r] = if fmt == KFormat::Q3K {
                _mm512_add_epi32(isum[r], _mm512_mullo_epi32(ip, sc))
            } else {
                _mm512_add_epi32(isum[r], ip)
            };
        }
    }
}

/// One group of 16 interleaved rows against `R` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn kernel<F: Fmt, const R: usize>(w: *const u8, p: ActPtrs, out: *mut f32, ostride: usize) {
    unsafe {
        let fmt = F::F;
        let gbb = fmt.group_block_bytes();
        let sc0 = sc_offset(fmt);
        let mut acc = [_mm512_setzero_ps(); R];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_SUPER_BLOCKS);
        let near = crate::prefetch::near_l1();
        for b in 0..p.nbk {
            let blk = w.add(b * gbb);
            let pf = blk.wrapping_add(crate::prefetch::ahead(
                R,
                crate::prefetch::WIDE_SUPER_BLOCKS,
            ));
            let mut isum = [_mm512_setzero_si512(); R];
            for k in 0..8 {
                // A slice of the lines ahead per pair of sub-blocks (see `prefetch`).
                crate::prefetch::stream(blk, pf, gbb, (k, 8), l2, near);
                sub_block::<F, R, 0>(blk, k, b, p, &mut isum);
                sub_block::<F, R, 1>(blk, k, b, p, &mut isum);
            }
            // Per pair k of sub-blocks, row j's two scale bytes as an i16 pair (the operand of
            // `vpdpwssd` against a row's two activation sums): Q3_K's `sc` (for the offset),
            // Q2_K's `m` (high nibbles).
            let mut pairs = [_mm512_setzero_si512(); 8];
            for (k, v) in pairs.iter_mut().enumerate() {
                let a = _mm_loadu_si128(blk.add(sc0 + 32 * k) as *const __m128i);
                let c = _mm_loadu_si128(blk.add(sc0 + 32 * k + 16) as *const __m128i);
                let ac = _mm256_set_m128i(_mm_unpackhi_epi8(a, c), _mm_unpacklo_epi8(a, c));
                *v = if fmt == KFormat::Q3K {
                    _mm512_cvtepi8_epi16(ac)
                } else {
                    _mm512_srli_epi16::<4>(_mm512_cvtepu8_epi16(ac))
                };
            }
            let da = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(da_offset(fmt)) as *const __m256i));
            let db = if fmt == KFormat::Q2K {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            // Row by row (no array of sums: registers for eight-row tiles).
            for r in 0..R {
                let bs = p.bs16.add((r * p.nbk + b) * 16);
                let mut msum = _mm512_setzero_si512();
                for (k, v) in pairs.iter().enumerate() {
                    let pair = std::ptr::read_unaligned(bs.add(2 * k) as *const i32);
                    msum = _mm512_dpwssd_epi32(msum, *v, _mm512_set1_epi32(pair));
                }
                if fmt == KFormat::Q3K {
                    // `u` carries +4: subtract 4·Σ_s sc_s·Σx_s.
                    isum[r] = _mm512_sub_epi32(isum[r], _mm512_slli_epi32::<2>(msum));
                }
                let dy = _mm512_set1_ps(*p.d.add(r * p.nbk + b));
                acc[r] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(da, dy), acc[r]);
                if fmt == KFormat::Q2K {
                    acc[r] =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(db, dy), acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out.add(r * ostride), acc[r]);
        }
    }
}

/// One group of 16 interleaved rows of Q2_K / Q3_K against `t` (1..=8) activation rows; see
/// [`super::avx512::dot_group`].
///
/// # Safety
/// AVX-512 F/BW/VL/DQ/VNNI must be available; the pointers must cover what they describe.
pub(crate) unsafe fn dot_group(
    fmt: KFormat,
    w: *const u8,
    p: ActPtrs,
    t: usize,
    out: *mut f32,
    ostride: usize,
) {
    macro_rules! tiles {
        ($f:ty) => {
            crate::for_tile_height!(
                t,
                [8, 7, 6, 5, 4, 3, 2],
                1,
                kernel::<$f>(w, p, out, ostride)
            )
        };
    }
    unsafe {
        if fmt == KFormat::Q2K {
            tiles!(Q2K)
        } else {
            tiles!(Q3K)
        }
    }
}
