//! AVX2 and AVX-VNNI kernels for the interleaved Q4_1 / Q5_0 / Q5_1 layouts (see the parent
//! module): the AVX-512 kernel's work in two halves of eight rows (256-bit registers), with the
//! same integer sums (exact) and the same float operations per output, so the same bits.
//!
//! Without VNNI the unsigned levels (≤ 31) meet the signed activations (|q| ≤ 127) in
//! `vpmaddubsw`: a pair sum is at most 2·31·127 = 7874, so four chunks' pair sums add up in i16
//! without overflow (31 496) before one `vpmaddwd` widens them.

use super::avx512::{Fmt, Q4_1, Q5_0, Q5_1};
use super::{ActPtrs, LegacyFormat};
use std::arch::x86_64::*;

/// Chunk `c` (weights `4c..4c+4` of each of rows `8h..8h+8`) of the group block at `blk`.
#[inline(always)]
unsafe fn load<F: Fmt>(blk: *const u8, h: usize, wv: &mut [__m256i; 8]) {
    unsafe {
        let f = F::F;
        let mask = _mm256_set1_epi8(0x0f);
        let qs = blk.add(f.group_qs_at() + 32 * h);
        for k in 0..4 {
            let v = _mm256_loadu_si256(qs.add(64 * k) as *const __m256i);
            wv[2 * k] = _mm256_and_si256(v, mask);
            wv[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        }
        if f.has_high() {
            // Byte bit `c` is the fifth bit of chunk `c`'s weight: shift it to bit 4 (no carry
            // across bytes reaches bit 4) and add it in.
            let hb = _mm256_loadu_si256(blk.add(f.group_qh_at() + 32 * h) as *const __m256i);
            let bit4 = _mm256_set1_epi8(0x10);
            macro_rules! or_bit {
                ($c:expr, $h:expr) => {
                    wv[$c] = _mm256_or_si256(wv[$c], _mm256_and_si256($h, bit4))
                };
            }
            or_bit!(0, _mm256_slli_epi16::<4>(hb));
            or_bit!(1, _mm256_slli_epi16::<3>(hb));
            or_bit!(2, _mm256_slli_epi16::<2>(hb));
            or_bit!(3, _mm256_slli_epi16::<1>(hb));
            or_bit!(4, hb);
            or_bit!(5, _mm256_srli_epi16::<1>(hb));
            or_bit!(6, _mm256_srli_epi16::<2>(hb));
            or_bit!(7, _mm256_srli_epi16::<3>(hb));
        }
    }
}

#[inline(always)]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn body<F: Fmt, const R: usize, const VNNI: bool>(
    w: *const u8,
    p: ActPtrs,
    out: *mut f32,
    ostride: usize,
) {
    unsafe {
        let f = F::F;
        let gbb = f.group_block_bytes();
        let mut wv = [_mm256_setzero_si256(); 8];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_BLOCKS);
        let near = crate::prefetch::near_l1();
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        for b in 0..p.nb {
            let blk = w.add(b * gbb);
            let pf = blk.wrapping_add(crate::prefetch::ahead(R, crate::prefetch::WIDE_BLOCKS));
            // Both halves of a block before the next one, each requesting half of the lines
            // ahead, so that the stream flows while either half computes (see `prefetch`).
            for (h, acc) in acc.iter_mut().enumerate() {
                crate::prefetch::stream(blk, pf, gbb, (h, 2), l2, near);
                let ws = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h) as *const __m128i));
                let ms = if f.has_min() {
                    _mm256_cvtph_ps(_mm_loadu_si128(blk.add(32 + 16 * h) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                load::<F>(blk, h, &mut wv);
                for r in 0..R {
                    let xb = p.q.add(r * p.qstride + 32 * b);
                    macro_rules! x4 {
                        ($c:expr) => {
                            _mm256_set1_epi32(
                                std::ptr::read_unaligned(xb.add(4 * $c) as *const i32),
                            )
                        };
                    }
                    let start = if f.offset() != 0 {
                        *p.c.add(r * p.nb + b) >> 3
                    } else {
                        0
                    };
                    let ip = if VNNI {
                        let mut ip0 = _mm256_set1_epi32(start);
                        let mut ip1 = _mm256_setzero_si256();
                        for c in (0..8).step_by(2) {
                            ip0 = _mm256_dpbusd_avx_epi32(ip0, wv[c], x4!(c));
                            ip1 = _mm256_dpbusd_avx_epi32(ip1, wv[c + 1], x4!(c + 1));
                        }
                        _mm256_add_epi32(ip0, ip1)
                    } else {
                        let ones = _mm256_set1_epi16(1);
                        let mut ip = _mm256_set1_epi32(start);
                        for c0 in [0, 4] {
                            let mut s = _mm256_maddubs_epi16(wv[c0], x4!(c0));
                            for c in c0 + 1..c0 + 4 {
                                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wv[c], x4!(c)));
                            }
                            ip = _mm256_add_epi32(ip, _mm256_madd_epi16(s, ones));
                        }
                        ip
                    };
                    let s = _mm256_mul_ps(ws, _mm256_set1_ps(*p.d.add(r * p.nb + b)));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip), s, acc[r]);
                    if f.has_min() {
                        acc[r] =
                            _mm256_fmadd_ps(ms, _mm256_set1_ps(*p.s.add(r * p.nb + b)), acc[r]);
                    }
                }
            }
        }
        crate::matmul::store_halves(&acc, out, ostride);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<F: Fmt, const R: usize>(w: *const u8, p: ActPtrs, out: *mut f32, ostride: usize) {
    unsafe { body::<F, R, false>(w, p, out, ostride) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn kernel_vnni<F: Fmt, const R: usize>(
    w: *const u8,
    p: ActPtrs,
    out: *mut f32,
    ostride: usize,
) {
    unsafe { body::<F, R, true>(w, p, out, ostride) }
}

/// One group of 16 interleaved rows of `fmt` (`w`: its `p.nb` group blocks) against `t` (1..=8)
/// activation rows; row `i`'s 16 outputs go to `out + i·ostride`.
///
/// # Safety
/// AVX2/FMA/F16C (and AVX-VNNI if `vnni`) must be available; the pointers must cover what they
/// describe.
pub(crate) unsafe fn dot_group(
    fmt: LegacyFormat,
    vnni: bool,
    w: *const u8,
    p: ActPtrs,
    t: usize,
    out: *mut f32,
    ostride: usize,
) {
    macro_rules! tiles {
        ($k:ident, $f:ty) => {
            crate::for_tile_height!(t, [8, 7, 6, 5, 4, 3, 2], 1, $k::<$f>(w, p, out, ostride))
        };
    }
    macro_rules! level {
        ($f:ty) => {
            if vnni {
                tiles!(kernel_vnni, $f)
            } else {
                tiles!(kernel, $f)
            }
        };
    }
    unsafe {
        match fmt {
            LegacyFormat::Q4_1 => level!(Q4_1),
            LegacyFormat::Q5_0 => level!(Q5_0),
            LegacyFormat::Q5_1 => level!(Q5_1),
        }
    }
}
