//! AVX-512 VNNI kernels for Q8_0 / Q4_0 weights.
//!
//! Why a second x86 path: with AVX2 each (row, block) costs ~9 instructions (sign fix-up, two
//! widening multiply-adds, conversion, scale broadcast, FMA), so a 4-row verification batch is
//! compute-bound. Here one `vpdpbusd` does the whole 64-byte (two-block) integer
//! dot product, and the per-row work per block pair is four instructions: `vpdpbusd`, convert,
//! scale multiply, FMA. The weight-side work (load, scales, the +128 correction) is done once per
//! block pair and shared by up to eight activation rows.
//!
//! `vpdpbusd` multiplies *unsigned* by signed bytes, so activations arrive offset by +128 (see
//! [`crate::quant::quantize_row_u8`]) and the accumulator starts at −128·Σw, which the same
//! instruction computes from the weights alone. The per-row instruction sequence is identical for
//! every tile size, so results are batch-invariant.
//!
//! On the AMX level the wide tiles of the interleaved layouts ([`dot_r16_amx`]) take their integer
//! dot products from AMX tile multiplies instead (see [`crate::amx`]) and keep the float steps.

use super::avx2::f16_at;
use crate::amx::{self, Scratch};
use std::arch::x86_64::*;

/// How to load a pair of weight blocks (64 signed bytes) and a single block (32).
pub trait Blocks {
    /// Bytes per block.
    const BB: usize;
    /// The 64 weights of blocks `b`, `b+1` starting at block `b`'s first byte.
    unsafe fn pair(w: *const u8) -> __m512i;
    /// The 32 weights of the block at `w`.
    unsafe fn one(w: *const u8) -> __m256i;
}

/// ggml Q8_0: f16 scale + 32 × i8.
pub struct Q8_0;
/// ggml Q4_0: f16 scale + 16 bytes of nibbles (low nibbles = weights 0..16, high = 16..32).
pub struct Q4_0;

impl Blocks for Q8_0 {
    const BB: usize = 34;
    #[inline(always)]
    unsafe fn pair(w: *const u8) -> __m512i {
        unsafe {
            let lo = _mm256_loadu_si256(w.add(2) as *const __m256i);
            let hi = _mm256_loadu_si256(w.add(36) as *const __m256i);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        }
    }
    #[inline(always)]
    unsafe fn one(w: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(w.add(2) as *const __m256i) }
    }
}

impl Blocks for Q4_0 {
    const BB: usize = 18;
    #[inline(always)]
    unsafe fn pair(w: *const u8) -> __m512i {
        unsafe {
            let r0 = _mm_loadu_si128(w.add(2) as *const __m128i);
            let r1 = _mm_loadu_si128(w.add(20) as *const __m128i);
            // 128-bit lanes [r0, r0, r1, r1]; shift lanes 1 and 3 right by 4 to reach the high
            // nibbles, so the lanes become [lo0, hi0, lo1, hi1] = weights in block order.
            let a = _mm512_castsi256_si512(_mm256_set_m128i(r1, r0));
            let v = _mm512_shuffle_i64x2::<0x50>(a, a);
            let shift = _mm512_setr_epi32(
                0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004, 0, 0, 0, 0, 0x40004, 0x40004,
                0x40004, 0x40004,
            );
            let nib = _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi8(0x0f));
            _mm512_sub_epi8(nib, _mm512_set1_epi8(8))
        }
    }
    #[inline(always)]
    unsafe fn one(w: *const u8) -> __m256i {
        unsafe {
            let raw = _mm_loadu_si128(w.add(2) as *const __m128i);
            let mask = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
        }
    }
}

/// The f16 scales of the blocks at `wb` and `wb + bb` as a 16-lane vector `[d0 × 8, d1 × 8]`:
/// both halves converted in one `vcvtph2ps`, then spread with one permute.
#[inline(always)]
unsafe fn scale_pair(wb: *const u8, bb: usize, spread: __m512i) -> __m512 {
    unsafe {
        let d0 = std::ptr::read_unaligned(wb as *const u16) as i32;
        let d1 = std::ptr::read_unaligned(wb.add(bb) as *const u16) as i32;
        let h = _mm_insert_epi16::<1>(_mm_cvtsi32_si128(d0), d1);
        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(h)))
    }
}

/// One weight row (`nb` blocks) against `R` activation rows in the [`quantize_row_u8`] layout:
/// `xq[r]` points at `32·nb` offset quants, `xs[r]` at the expanded scales.
///
/// [`quantize_row_u8`]: crate::quant::quantize_row_u8
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot<B: Blocks, const R: usize>(
    w: *const u8,
    nb: usize,
    xq: [*const u8; R],
    xs: [*const f32; R],
) -> [f32; R] {
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let offset = _mm512_set1_epi8(-128); // 0x80: the +128 the activations carry
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let np = nb / 2;
        for p in 0..np {
            let wb = w.add(2 * p * B::BB);
            let wv = B::pair(wb);
            let ws = scale_pair(wb, B::BB, spread);
            let corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, wv);
            let start = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
            for r in 0..R {
                let xv = _mm512_loadu_si512(xq[r].add(p * 64) as *const __m512i);
                let ip = _mm512_dpbusd_epi32(start, xv, wv);
                let s = _mm512_mul_ps(ws, _mm512_loadu_ps(xs[r].add(p * 16)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), s, acc[r]);
            }
        }
        if nb % 2 == 1 {
            let wb = w.add(2 * np * B::BB);
            let wv = B::one(wb);
            let ws = _mm256_set1_ps(f16_at(wb));
            let corr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), wv);
            let start = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
            for r in 0..R {
                let xv = _mm256_loadu_si256(xq[r].add(np * 64) as *const __m256i);
                let ip = _mm256_dpbusd_epi32(start, xv, wv);
                let s = _mm256_mul_ps(ws, _mm256_loadu_ps(xs[r].add(np * 16)));
                let f = _mm256_mul_ps(_mm256_cvtepi32_ps(ip), s);
                acc[r] = _mm512_add_ps(acc[r], _mm512_insertf32x8::<0>(_mm512_setzero_ps(), f));
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]);
        }
        out
    }
}

/// One group block of a 16-row interleaved type (see [`crate::pack`]): the 16 rows' scales and
/// eight registers of four unsigned weights per row, plus how the kernel's starting value follows
/// from the activations' `−128·Σx`.
pub trait GroupBlock {
    /// Bytes of one group block.
    const BYTES: usize;
    /// Right shift turning `−128·Σx` into the offset this layout's unsigned weights carry
    /// (`−128·Σx` for Q8_0's `q + 128`, `−8·Σx` for Q4_0's `q + 8`; exact, it is a multiple of 128).
    const CORR_SHIFT: i32;
    /// Are the block's 512 weight bytes, from byte 32 on, already what [`GroupBlock::load`]
    /// returns (so an AMX tile loads them in place)?
    const TILE_READY: bool = false;
    /// Chunk `c` of `wv` gets weights `4c..4c+4` of each row, as unsigned bytes.
    unsafe fn load(blk: *const u8, wv: &mut [__m512i; 8]);
}

impl GroupBlock for Q8_0 {
    const BYTES: usize = 16 * 34;
    const CORR_SHIFT: i32 = 0;
    const TILE_READY: bool = true;
    #[inline(always)]
    unsafe fn load(blk: *const u8, wv: &mut [__m512i; 8]) {
        unsafe {
            for (c, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(blk.add(32 + 64 * c) as *const __m512i);
            }
        }
    }
}

impl GroupBlock for Q4_0 {
    const BYTES: usize = 16 * 18;
    const CORR_SHIFT: i32 = 4;
    #[inline(always)]
    unsafe fn load(blk: *const u8, wv: &mut [__m512i; 8]) {
        unsafe {
            let mask = _mm512_set1_epi8(0x0f);
            for k in 0..4 {
                let v = _mm512_loadu_si512(blk.add(32 + 64 * k) as *const __m512i);
                wv[2 * k] = _mm512_and_si512(v, mask);
                wv[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
            }
        }
    }
}

/// IQ4_NL: Q4_0's nibble layout, each index looked up as `level + 128` (unsigned, as `vpdpbusd`
/// wants); the kernel starts from `−128·Σx`.
pub struct IQ4NL;

impl GroupBlock for IQ4NL {
    const BYTES: usize = 16 * 18;
    const CORR_SHIFT: i32 = 0;
    #[inline(always)]
    unsafe fn load(blk: *const u8, wv: &mut [__m512i; 8]) {
        unsafe {
            Q4_0::load(blk, wv);
            let t = crate::kquant::IQ4_UNSIGNED.as_ptr() as *const __m128i;
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t));
            for v in wv.iter_mut() {
                *v = _mm512_shuffle_epi8(table, *v);
            }
        }
    }
}

/// One group of 16 interleaved weight rows (`nb` blocks of layout `G`, see [`crate::pack`])
/// against `R` activation rows quantised by [`quantize_row_i8s`]: row `r`'s
/// quants start at `xq + r·qstride`, its block scales at `xd + r·bstride`, its corrections at
/// `xc + r·bstride`. Writes row `r`'s 16 outputs to `out + r·ostride`.
///
/// Per block the weight side is one scale conversion and the weight loads (plus, for Q4_0, a mask
/// and a shift per 64 bytes), shared by the tile;
/// per row it is eight `vpdpbusd` (four broadcast activation bytes against four weights of each
/// of the 16 rows), one convert, one scale multiply and one FMA — for 16 outputs. Each output
/// adds its blocks in order whatever `R`, so results are batch-invariant.
///
/// [`quantize_row_i8s`]: crate::quant::quantize_row_i8s
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // raw tile addressing
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
    unsafe { dot_r16_body::<G, R>(w, nb, xq, qstride, xd, xc, bstride, out, ostride) }
}

/// [`dot_r16`] for `t` in 12..=16 rows ([`crate::matmul::AMX_MIN_ROWS`] up) with each block's
/// integer dot products done by AMX tile multiplies (see [`crate::amx`]): the same i32 sums, then
/// the same float steps per row.
///
/// # Safety
/// As [`dot_r16`], and [`crate::amx::available`] is true.
#[allow(clippy::too_many_arguments)] // raw tile addressing
pub unsafe fn dot_r16_amx<G: GroupBlock>(
    w: *const u8,
    nb: usize,
    xq: *const i8,
    qstride: usize,
    xd: *const f32,
    xc: *const i32,
    bstride: usize,
    t: usize,
    out: *mut f32,
    ostride: usize,
) {
    unsafe {
        crate::for_tile_height!(
            t,
            [16, 15, 14, 13],
            12,
            r16_amx::<G>(w, nb, xq, qstride, xd, xc, bstride, out, ostride)
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // raw tile addressing
unsafe fn r16_amx<G: GroupBlock, const R: usize>(
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
        amx::configure(R, 32);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut wv = [_mm512_setzero_si512(); 8];
        // Four blocks' weights as right-hand tiles (unless they lie in memory as tiles), and the
        // four tiles of sums.
        let (mut bt, mut ct) = (Scratch::<2048>::new(), Scratch::<4096>::new());
        let bt = bt.ptr();
        let ct = ct.ptr() as *mut i32;
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_BLOCKS);
        for b0 in (0..nb).step_by(4) {
            let k = (nb - b0).min(4);
            let mut bp = [bt as *const u8; 4];
            for j in 0..k {
                let blk = w.add((b0 + j) * G::BYTES);
                crate::prefetch::whole(
                    blk.wrapping_add(crate::prefetch::ahead(R, crate::prefetch::WIDE_BLOCKS)),
                    G::BYTES,
                    l2,
                );
                bp[j] = if G::TILE_READY {
                    blk.add(32)
                } else {
                    G::load(blk, &mut wv);
                    for (c, v) in wv.iter().enumerate() {
                        let at = bt.add(512 * j + 64 * c);
                        _mm512_store_si512(at as *mut __m512i, *v);
                    }
                    bt.add(512 * j) as *const u8
                };
            }
            let a = |j: usize| xq.add(32 * (b0 + j));
            if k == 4 {
                amx::dot4_su([a(0), a(1), a(2), a(3)], qstride, bp, ct);
            } else {
                for j in 0..k {
                    amx::dot_su(a(j), qstride, bp[j], ct.add(256 * j));
                }
            }
            // The AVX-512 kernel's float steps, per block in order.
            for j in 0..k {
                let b = b0 + j;
                let ws = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(b * G::BYTES) as *const __m256i));
                for r in 0..R {
                    let corr = _mm512_set1_epi32(*xc.add(r * bstride + b) >> G::CORR_SHIFT);
                    let d = _mm512_load_si512(ct.add(256 * j + 16 * r) as *const __m512i);
                    let ip = _mm512_add_epi32(corr, d);
                    let s = _mm512_mul_ps(ws, _mm512_set1_ps(*xd.add(r * bstride + b)));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), s, acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out.add(r * ostride), acc[r]);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // raw tile addressing
unsafe fn dot_r16_body<G: GroupBlock, const R: usize>(
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
        let mut acc = [_mm512_setzero_ps(); R];
        let mut wv = [_mm512_setzero_si512(); 8];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_BLOCKS);
        let near = crate::prefetch::near_l1();
        for b in 0..nb {
            let blk = w.add(b * G::BYTES);
            // Without the prefetch a few-row tile's compute and the weight stream take turns. A
            // block of 32 columns spans 5–9 lines, requested at once (see `prefetch`).
            crate::prefetch::whole(
                blk.wrapping_add(crate::prefetch::ahead(R, crate::prefetch::WIDE_BLOCKS)),
                G::BYTES,
                l2,
            );
            if near {
                crate::prefetch::whole(blk.wrapping_add(crate::prefetch::NEAR), G::BYTES, false);
            }
            let ws = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            G::load(blk, &mut wv);
            for r in 0..R {
                let xb = xq.add(r * qstride + 32 * b);
                macro_rules! x4 {
                    ($c:expr) => {
                        _mm512_set1_epi32(std::ptr::read_unaligned(xb.add(4 * $c) as *const i32))
                    };
                }
                // Two chains of four so that a one-row tile is not bound by `vpdpbusd` latency;
                // integer adds, so the sum is exact.
                let mut ip0 = _mm512_set1_epi32(*xc.add(r * bstride + b) >> G::CORR_SHIFT);
                let mut ip1 = _mm512_setzero_si512();
                for c in (0..8).step_by(2) {
                    ip0 = _mm512_dpbusd_epi32(ip0, wv[c], x4!(c));
                    ip1 = _mm512_dpbusd_epi32(ip1, wv[c + 1], x4!(c + 1));
                }
                let ip = _mm512_add_epi32(ip0, ip1);
                let s = _mm512_mul_ps(ws, _mm512_set1_ps(*xd.add(r * bstride + b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), s, acc[r]);
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out.add(r * ostride), acc[r]);
        }
    }
}
