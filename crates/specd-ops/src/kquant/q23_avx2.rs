//! AVX2 and AVX-VNNI kernels for Q2_K and Q3_K: the layouts of [`super::q23`] read as two halves
//! of eight rows, with the integer sums and float operations of the AVX-512 kernels (so the same
//! bits as the scalar reference).
//!
//! With AVX-VNNI they are the AVX-512 kernels at half width. Plain AVX2 has no `vpdpbusd`:
//! `vpmaddubsw` multiplies `u` (≤ 3 for Q2_K, ≤ 7 for Q3_K) by the activations (|x| ≤ 127) into
//! i16 pair sums of at most 2·7·127; the four of a sub-block add up to at most 7112 — exact in
//! i16 — and `vpmaddwd` against the sub-block scale (repeated in both halves of each lane) widens
//! them and applies the scale at once.

use super::q23::{da_offset, quant_offset, sc_offset};
use super::{ActPtrs, KFormat, QK_K};
use std::arch::x86_64::*;

trait Fmt {
    const F: KFormat;
    /// Fills `wv[c]` with weights `4c..4c+4` of sub-block `2k + E` of the eight rows of half `h`:
    /// `u` (times the scale for Q2_K with `VNNI`, see [`super::q23_avx512`]).
    unsafe fn load_sub<const VNNI: bool, const E: usize>(
        blk: *const u8,
        k: usize,
        h: usize,
        wv: &mut [__m256i; 4],
    );
}

struct Q2K;
struct Q3K;

#[inline(always)]
unsafe fn low_bits(q: *const u8, wv: &mut [__m256i; 4]) {
    unsafe {
        let v = _mm256_loadu_si256(q as *const __m256i);
        let m = _mm256_set1_epi8(3);
        wv[0] = _mm256_and_si256(v, m);
        wv[1] = _mm256_and_si256(_mm256_srli_epi16::<2>(v), m);
        wv[2] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
        wv[3] = _mm256_and_si256(_mm256_srli_epi16::<6>(v), m);
    }
}

/// The eight rows' scales of sub-block `s` as i32 (Q2_K: the low nibbles).
#[inline(always)]
unsafe fn scales(fmt: KFormat, blk: *const u8, s: usize, h: usize) -> __m256i {
    unsafe {
        let b = _mm_loadl_epi64(blk.add(sc_offset(fmt) + 16 * s + 8 * h) as *const __m128i);
        if fmt == KFormat::Q3K {
            _mm256_cvtepi8_epi32(b)
        } else {
            _mm256_and_si256(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(0x0f))
        }
    }
}

/// `sc` repeated in both i16 halves of each lane (for `vpmaddwd` / `vpmullw`).
#[inline(always)]
unsafe fn twice16(sc: __m256i) -> __m256i {
    unsafe {
        _mm256_or_si256(
            _mm256_and_si256(sc, _mm256_set1_epi32(0xffff)),
            _mm256_slli_epi32::<16>(sc),
        )
    }
}

impl Fmt for Q2K {
    const F: KFormat = KFormat::Q2K;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool, const E: usize>(
        blk: *const u8,
        k: usize,
        h: usize,
        wv: &mut [__m256i; 4],
    ) {
        let s = 2 * k + E;
        unsafe {
            low_bits(blk.add(quant_offset(Self::F) + 64 * s + 32 * h), wv);
            if VNNI {
                let sc16 = twice16(scales(Self::F, blk, s, h));
                for v in wv.iter_mut() {
                    *v = _mm256_mullo_epi16(*v, sc16);
                }
            }
        }
    }
}

impl Fmt for Q3K {
    const F: KFormat = KFormat::Q3K;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool, const E: usize>(
        blk: *const u8,
        k: usize,
        h: usize,
        wv: &mut [__m256i; 4],
    ) {
        unsafe {
            let pair = blk.add(quant_offset(Self::F) + 192 * k + 32 * h);
            low_bits(pair.add(64 * E), wv);
            let hb = _mm256_loadu_si256(pair.add(128) as *const __m256i);
            let four = _mm256_set1_epi8(4);
            // High bit `4E + c` of each byte to bit 2 (16-bit shifts; the mask drops what
            // crosses a byte).
            let hs = if E == 0 {
                [
                    _mm256_slli_epi16::<2>(hb),
                    _mm256_slli_epi16::<1>(hb),
                    hb,
                    _mm256_srli_epi16::<1>(hb),
                ]
            } else {
                [
                    _mm256_srli_epi16::<2>(hb),
                    _mm256_srli_epi16::<3>(hb),
                    _mm256_srli_epi16::<4>(hb),
                    _mm256_srli_epi16::<5>(hb),
                ]
            };
            for c in 0..4 {
                wv[c] = _mm256_or_si256(wv[c], _mm256_and_si256(hs[c], four));
            }
        }
    }
}

#[inline(always)]
unsafe fn x4(xb: *const i8, c: usize) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(xb.add(4 * c) as *const i32)) }
}

/// Sub-block `2k + E` of super-block `b` (at `blk`), half `h`, against `R` activation rows: adds
/// `sc·Σ u·x` to `isum`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn sub_block<F: Fmt, const R: usize, const VNNI: bool, const E: usize>(
    blk: *const u8,
    k: usize,
    h: usize,
    b: usize,
    p: ActPtrs,
    isum: &mut [__m256i; R],
) {
    unsafe {
        let fmt = F::F;
        let s = 2 * k + E;
        let mut wv = [_mm256_setzero_si256(); 4];
        F::load_sub::<VNNI, E>(blk, k, h, &mut wv);
        let sc = if VNNI && fmt == KFormat::Q2K {
            _mm256_setzero_si256()
        } else {
            scales(fmt, blk, s, h)
        };
        let sc16 = twice16(sc);
        for r in 0..R {
            let xb = p.q.add(r * p.qstride + b * QK_K + 16 * s);
            if !VNNI {
                let s16 = _mm256_add_epi16(
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(wv[0], x4(xb, 0)),
                        _mm256_maddubs_epi16(wv[1], x4(xb, 1)),
                    ),
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(wv[2], x4(xb, 2)),
                        _mm256_maddubs_epi16(wv[3], x4(xb, 3)),
                    ),
                );
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16, sc16));
                continue;
            }
            let z = _mm256_setzero_si256();
            let p0 = _mm256_dpbusd_avx_epi32(z, wv[0], x4(xb, 0));
            let p1 = _mm256_dpbusd_avx_epi32(z, wv[1], x4(xb, 1));
            let p0 = _mm256_dpbusd_avx_epi32(p0, wv[2], x4(xb, 2));
            let p1 = _mm256_dpbusd_avx_epi32(p1, wv[3], x4(xb, 3));
            let ip = _mm256_add_epi32(p0, p1);
            isum[r] = if fmt == KFormat::Q3K {
                _mm256_add_epi32(isum[r], _mm256_mullo_epi32(ip, sc))
            } else {
                _mm256_add_epi32(isum[r], ip)
            };
        }
    }
}

/// One group (both halves of eight rows) against `R` activation rows, on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<F: Fmt, const R: usize>(w: *const u8, p: ActPtrs, out: *mut f32, ostride: usize) {
    unsafe { kernel_body::<F, R, false>(w, p, out, ostride) }
}

/// [`kernel`] with AVX-VNNI's `vpdpbusd`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn kernel_vnni<F: Fmt, const R: usize>(
    w: *const u8,
    p: ActPtrs,
    out: *mut f32,
    ostride: usize,
) {
    unsafe { kernel_body::<F, R, true>(w, p, out, ostride) }
}

#[inline(always)]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn kernel_body<F: Fmt, const R: usize, const VNNI: bool>(
    w: *const u8,
    p: ActPtrs,
    out: *mut f32,
    ostride: usize,
) {
    unsafe {
        let fmt = F::F;
        let gbb = fmt.group_block_bytes();
        let sc0 = sc_offset(fmt);
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_SUPER_BLOCKS);
        let near = crate::prefetch::near_l1();
        for b in 0..p.nbk {
            let blk = w.add(b * gbb);
            let pf = blk.wrapping_add(crate::prefetch::ahead(
                R,
                crate::prefetch::WIDE_SUPER_BLOCKS,
            ));
            // Both halves of a super-block before the next one, the lines ahead requested a
            // slice per pair of sub-blocks of either half (see `super::avx2::kernel_body`).
            for (h, acc) in acc.iter_mut().enumerate() {
                let mut isum = [_mm256_setzero_si256(); R];
                for k in 0..8 {
                    crate::prefetch::stream(blk, pf, gbb, (8 * h + k, 16), l2, near);
                    sub_block::<F, R, VNNI, 0>(blk, k, h, b, p, &mut isum);
                    sub_block::<F, R, VNNI, 1>(blk, k, h, b, p, &mut isum);
                }
                // Row j's two scale bytes of each pair of sub-blocks as an i16 pair (Q3_K: `sc`
                // for the offset; Q2_K: `m`), against a row's two activation sums.
                let pairs = if fmt == KFormat::Q3K {
                    super::avx2::scale_pairs::<false>(blk.add(sc0), h)
                } else {
                    super::avx2::scale_pairs::<true>(blk.add(sc0), h)
                };
                let da = _mm256_cvtph_ps(_mm_loadu_si128(
                    blk.add(da_offset(fmt) + 16 * h) as *const __m128i
                ));
                let db = if fmt == KFormat::Q2K {
                    _mm256_cvtph_ps(_mm_loadu_si128(blk.add(32 + 16 * h) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                // Row by row (no array of sums: registers for four-row tiles).
                for r in 0..R {
                    let msum = super::avx2::scaled_sums(&pairs, p.bs16.add((r * p.nbk + b) * 16));
                    if fmt == KFormat::Q3K {
                        // `u` carries +4: subtract 4·Σ_s sc_s·Σx_s.
                        isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32::<2>(msum));
                    }
                    let dy = _mm256_set1_ps(*p.d.add(r * p.nbk + b));
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(da, dy), acc[r]);
                    if fmt == KFormat::Q2K {
                        acc[r] = _mm256_fnmadd_ps(
                            _mm256_cvtepi32_ps(msum),
                            _mm256_mul_ps(db, dy),
                            acc[r],
                        );
                    }
                }
            }
        }
        crate::matmul::store_halves(&acc, out, ostride);
    }
}

/// One group of 16 interleaved rows of Q2_K / Q3_K against `t` (1..=8) activation rows; see
/// [`super::avx2::dot_group`].
///
/// # Safety
/// AVX2, FMA and F16C must be available (with `vnni`, AVX-VNNI); the pointers must cover what
/// they describe.
pub(crate) unsafe fn dot_group(
    fmt: KFormat,
    vnni: bool,
    w: *const u8,
    p: ActPtrs,
    t: usize,
    out: *mut f32,
    ostride: usize,
) {
    macro_rules! tiles {
        ($f:ty) => {
            if vnni {
                crate::for_tile_height!(
                    t,
                    [8, 7, 6, 5, 4, 3, 2],
                    1,
                    kernel_vnni::<$f>(w, p, out, ostride)
                )
            } else {
                crate::for_tile_height!(
                    t,
                    [8, 7, 6, 5, 4, 3, 2],
                    1,
                    kernel::<$f>(w, p, out, ostride)
                )
            }
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
