//! AVX-512 VNNI kernel for the interleaved Q4_1 / Q5_0 / Q5_1 layouts (see the parent module):
//! per block the weight side (scale conversion, nibble masks and shifts, fifth bits) is done once
//! for the tile; per activation row it is eight `vpdpbusd` of four broadcast activation bytes
//! against four weights of each of the 16 rows, one convert, one scale multiply, one FMA, and for
//! the types with `m` one more FMA — for 16 outputs.

use super::{ActPtrs, LegacyFormat};
use std::arch::x86_64::*;

/// Compile-time view of a format (so each kernel is specialised).
pub(crate) trait Fmt {
    const F: LegacyFormat;
}
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
impl Fmt for Q4_1 {
    const F: LegacyFormat = LegacyFormat::Q4_1;
}
impl Fmt for Q5_0 {
    const F: LegacyFormat = LegacyFormat::Q5_0;
}
impl Fmt for Q5_1 {
    const F: LegacyFormat = LegacyFormat::Q5_1;
}

/// The unsigned levels of chunk `c` (weights `4c..4c+4` of each of the 16 rows) of the group
/// block at `blk`.
#[inline(always)]
unsafe fn load<F: Fmt>(blk: *const u8, wv: &mut [__m512i; 8]) {
    unsafe {
        let f = F::F;
        let mask = _mm512_set1_epi8(0x0f);
        let qs = blk.add(f.group_qs_at());
        for k in 0..4 {
            let v = _mm512_loadu_si512(qs.add(64 * k) as *const __m512i);
            wv[2 * k] = _mm512_and_si512(v, mask);
            wv[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
        }
        if f.has_high() {
            // Byte bit `c` is the fifth bit of chunk `c`'s weight: shift it to bit 4 (shifts of
            // at most 4 never carry across bytes into bit 4), then `wv | (h & 0x10)`.
            let h = _mm512_loadu_si512(blk.add(f.group_qh_at()) as *const __m512i);
            let bit4 = _mm512_set1_epi8(0x10);
            macro_rules! or_bit {
                ($c:expr, $h:expr) => {
                    wv[$c] = _mm512_ternarylogic_epi32::<0xf8>(wv[$c], $h, bit4)
                };
            }
            or_bit!(0, _mm512_slli_epi16::<4>(h));
            or_bit!(1, _mm512_slli_epi16::<3>(h));
            or_bit!(2, _mm512_slli_epi16::<2>(h));
            or_bit!(3, _mm512_slli_epi16::<1>(h));
            or_bit!(4, h);
            or_bit!(5, _mm512_srli_epi16::<1>(h));
            or_bit!(6, _mm512_srli_epi16::<2>(h));
            or_bit!(7, _mm512_srli_epi16::<3>(h));
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // raw tile addressing
unsafe fn kernel<F: Fmt, const R: usize>(w: *const u8, p: ActPtrs, out: *mut f32, ostride: usize) {
    unsafe {
        let f = F::F;
        let gbb = f.group_block_bytes();
        let mut acc = [_mm512_setzero_ps(); R];
        let mut wv = [_mm512_setzero_si512(); 8];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_BLOCKS);
        let near = crate::prefetch::near_l1();
        for b in 0..p.nb {
            let blk = w.add(b * gbb);
            // A block of 32 columns spans 5–7 lines, requested at once (see `prefetch`).
            crate::prefetch::whole(
                blk.wrapping_add(crate::prefetch::ahead(R, crate::prefetch::WIDE_BLOCKS)),
                gbb,
                l2,
            );
            if near {
                crate::prefetch::whole(blk.wrapping_add(crate::prefetch::NEAR), gbb, false);
            }
            let ws = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let ms = if f.has_min() {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            load::<F>(blk, &mut wv);
            for r in 0..R {
                let xb = p.q.add(r * p.qstride + 32 * b);
                macro_rules! x4 {
                    ($c:expr) => {
                        _mm512_set1_epi32(std::ptr::read_unaligned(xb.add(4 * $c) as *const i32))
                    };
                }
                // Q5_0 starts from `−16·Σq` (`c = −128·Σq`, a multiple of 128: exact shift).
                let start = if f.offset() != 0 {
                    *p.c.add(r * p.nb + b) >> 3
                } else {
                    0
                };
                // Two chains of four so that a one-row tile is not bound by `vpdpbusd` latency;
                // integer adds, so the sum is exact.
                let mut ip0 = _mm512_set1_epi32(start);
                let mut ip1 = _mm512_setzero_si512();
                for c in (0..8).step_by(2) {
                    ip0 = _mm512_dpbusd_epi32(ip0, wv[c], x4!(c));
                    ip1 = _mm512_dpbusd_epi32(ip1, wv[c + 1], x4!(c + 1));
                }
                let ip = _mm512_add_epi32(ip0, ip1);
                let s = _mm512_mul_ps(ws, _mm512_set1_ps(*p.d.add(r * p.nb + b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), s, acc[r]);
                if f.has_min() {
                    acc[r] = _mm512_fmadd_ps(ms, _mm512_set1_ps(*p.s.add(r * p.nb + b)), acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out.add(r * ostride), acc[r]);
        }
    }
}

/// One group of 16 interleaved rows of `fmt` (`w`: its `p.nb` group blocks) against `t` (1..=8)
/// activation rows; row `i`'s 16 outputs go to `out + i·ostride`.
///
/// # Safety
/// AVX-512 F/BW/VL/DQ/VNNI must be available; the pointers must cover what they describe.
pub(crate) unsafe fn dot_group(
    fmt: LegacyFormat,
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
        match fmt {
            LegacyFormat::Q4_1 => tiles!(Q4_1),
            LegacyFormat::Q5_0 => tiles!(Q5_0),
            LegacyFormat::Q5_1 => tiles!(Q5_1),
        }
    }
}
