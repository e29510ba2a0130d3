//! AVX2 and AVX-VNNI kernels for the interleaved super-block formats: the same layout and the
//! same integer sums and float operations as the AVX-512 VNNI kernels (so the same bits), with
//! each 16-row register split into two halves of eight rows.
//!
//! With AVX-VNNI the kernels are the AVX-512 ones at half width (`vpdpbusd`, then `vpmulld` by
//! the sub-block scales). Plain AVX2 has no `vpdpbusd`: `vpmaddubsw` multiplies and adds pairs
//! into i16 — saturating — and `vpmaddwd` widens pairs to i32. The kernels keep every i16 step
//! exact and use the widening to apply the sub-block scale at the same time (`vpmaddwd` against
//! the scale repeated in both halves of each lane), which saves the 32-bit multiply. Activations
//! are in −127..=127 (see [`super::quantize_row_k`]), so a chunk's pair sums are bounded by
//! 2·127·|w|max, and [`Fmt::CHUNKS_I16`] chunks are added in i16 before widening: Q4_K (`u` ≤ 15)
//! all 8 of a sub-block (30480), Q5_K (≤ 31) 4 (31496), Q6_K (≤ 63) 2 (32004). Q6_K's offset
//! (`w = u − 32`) is taken off once per super-block, with AVX-VNNI too: `32·Σ_s sc_s·Σx` from the
//! activations' sums per sub-block, as i16 pairs (`vpmaddwd`) — cheaper than the sign trick on
//! every chunk, which costs two more instructions per row and chunk, and than a `−32·Σx` start
//! for each sub-block's `vpdpbusd` sum (a scalar multiply and a broadcast per row and 16 values).
//! IQ4_XS's table values (up to 127 in magnitude) are multiplied as signed values with the sign
//! trick, one chunk at a time, so its offset needs no correction.

use super::{ActPtrs, KFormat, IQ4_UNSIGNED, IQ4_VALUES, QK_K};
use std::arch::x86_64::*;

trait Fmt {
    const F: KFormat;
    /// Without VNNI the weights are signed (`u − OFF`), multiplied with the sign trick: no
    /// offset correction.
    const SIGNED: bool = false;
    /// Without VNNI: chunks whose `vpmaddubsw` pair sums are added in i16 before widening.
    const CHUNKS_I16: usize;
    /// Fills `wv[c]` (`c < SUB/4`) with weights `4c..4c+4` of the eight rows of half `h` (as
    /// `u`, or as signed values for a [`Fmt::SIGNED`] format without `VNNI`).
    unsafe fn load_sub<const VNNI: bool>(q: *const u8, h: usize, wv: &mut [__m256i; 8]);
}

struct Q4K;
struct Q5K;
struct Q6K;
struct IQ4XS;

#[inline(always)]
unsafe fn nibbles(q: *const u8, h: usize, n: usize, wv: &mut [__m256i; 8]) {
    unsafe {
        let mask = _mm256_set1_epi8(0x0f);
        for k in 0..n {
            let v = _mm256_loadu_si256(q.add(64 * k + 32 * h) as *const __m256i);
            wv[2 * k] = _mm256_and_si256(v, mask);
            wv[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        }
    }
}

impl Fmt for Q4K {
    const F: KFormat = KFormat::Q4K;
    const CHUNKS_I16: usize = 8;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool>(q: *const u8, h: usize, wv: &mut [__m256i; 8]) {
        unsafe { nibbles(q, h, 4, wv) }
    }
}

impl Fmt for Q5K {
    const F: KFormat = KFormat::Q5K;
    const CHUNKS_I16: usize = 4;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool>(q: *const u8, h: usize, wv: &mut [__m256i; 8]) {
        unsafe {
            nibbles(q, h, 4, wv);
            let hb = _mm256_loadu_si256(q.add(256 + 32 * h) as *const __m256i);
            let sixteen = _mm256_set1_epi8(16);
            for (c, v) in wv.iter_mut().enumerate() {
                let bit = _mm256_set1_epi8(1 << c);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit);
                *v = _mm256_or_si256(*v, _mm256_and_si256(set, sixteen));
            }
        }
    }
}

impl Fmt for Q6K {
    const F: KFormat = KFormat::Q6K;
    const CHUNKS_I16: usize = 2;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool>(q: *const u8, h: usize, wv: &mut [__m256i; 8]) {
        unsafe {
            nibbles(q, h, 2, wv);
            let hb = _mm256_loadu_si256(q.add(128 + 32 * h) as *const __m256i);
            let m = _mm256_set1_epi8(0x30);
            let hs = [
                _mm256_slli_epi16::<4>(hb),
                _mm256_slli_epi16::<2>(hb),
                hb,
                _mm256_srli_epi16::<2>(hb),
            ];
            for c in 0..4 {
                wv[c] = _mm256_or_si256(wv[c], _mm256_and_si256(hs[c], m));
            }
        }
    }
}

impl Fmt for IQ4XS {
    const F: KFormat = KFormat::IQ4XS;
    const SIGNED: bool = true;
    const CHUNKS_I16: usize = 1;
    #[inline(always)]
    unsafe fn load_sub<const VNNI: bool>(q: *const u8, h: usize, wv: &mut [__m256i; 8]) {
        unsafe {
            nibbles(q, h, 4, wv);
            // `vpdpbusd` takes `u` = value + 128 (unsigned); the AVX2 sign trick the values.
            let t = if VNNI {
                _mm_loadu_si128(IQ4_UNSIGNED.as_ptr() as *const __m128i)
            } else {
                _mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i)
            };
            let table = _mm256_set_m128i(t, t);
            for v in wv.iter_mut() {
                *v = _mm256_shuffle_epi8(table, *v);
            }
        }
    }
}

#[inline(always)]
unsafe fn x4(xb: *const i8, c: usize) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(xb.add(4 * c) as *const i32)) }
}

/// AVX-VNNI: `p + Σ u·x` over the `n` chunks of a sub-block, as two chains of `vpdpbusd` (even
/// and odd chunks): with one chain per row, a tile of few rows would leave the pipes waiting on
/// each instruction's latency. Integer adds: the sum is the same either way.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // chunk c pairs with activation bytes 4c..4c+4
unsafe fn idot_vnni(wv: &[__m256i; 8], xb: *const i8, n: usize, p: __m256i) -> __m256i {
    unsafe {
        let (mut p0, mut p1) = (p, _mm256_setzero_si256());
        for c in (0..n).step_by(2) {
            p0 = _mm256_dpbusd_avx_epi32(p0, wv[c], x4(xb, c));
            p1 = _mm256_dpbusd_avx_epi32(p1, wv[c + 1], x4(xb, c + 1));
        }
        _mm256_add_epi32(p0, p1)
    }
}

/// AVX2: `sc · Σ w·x` over the `n` chunks of a sub-block (`sc16`: the eight rows' scales, each
/// repeated in both i16 halves of its lane) — exact, see the module docs.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // chunk c pairs with activation bytes 4c..4c+4
unsafe fn idot_scaled<F: Fmt>(
    wv: &[__m256i; 8],
    xb: *const i8,
    n: usize,
    sc16: __m256i,
) -> __m256i {
    unsafe {
        let mut p = _mm256_setzero_si256();
        for g in (0..n).step_by(F::CHUNKS_I16) {
            let mut s16 = _mm256_setzero_si256();
            for c in g..g + F::CHUNKS_I16 {
                let m = if F::SIGNED {
                    _mm256_maddubs_epi16(
                        _mm256_sign_epi8(wv[c], wv[c]),
                        _mm256_sign_epi8(x4(xb, c), wv[c]),
                    )
                } else {
                    _mm256_maddubs_epi16(wv[c], x4(xb, c))
                };
                s16 = _mm256_add_epi16(s16, m);
            }
            p = _mm256_add_epi32(p, _mm256_madd_epi16(s16, sc16));
        }
        p
    }
}

/// For the eight rows of half `h`: row j's scales of sub-blocks 2k and 2k+1 (of 16) as an i16
/// pair in lane j of `pairs[k]`. `sc` points at sub-block 0's 16 scale bytes (one per row of the
/// group), each sub-block's following the last. Signed bytes (Q6_K, Q3_K), or with `HI_NIBBLE`
/// the unsigned high nibbles (Q2_K's `m`).
#[inline(always)]
pub(super) unsafe fn scale_pairs<const HI_NIBBLE: bool>(sc: *const u8, h: usize) -> [__m256i; 8] {
    unsafe {
        let mut pairs = [_mm256_setzero_si256(); 8];
        for (k, v) in pairs.iter_mut().enumerate() {
            let a = _mm_loadl_epi64(sc.add(32 * k + 8 * h) as *const __m128i);
            let c = _mm_loadl_epi64(sc.add(32 * k + 16 + 8 * h) as *const __m128i);
            let ac = _mm_unpacklo_epi8(a, c);
            *v = if HI_NIBBLE {
                _mm256_srli_epi16::<4>(_mm256_cvtepu8_epi16(ac))
            } else {
                _mm256_cvtepi8_epi16(ac)
            };
        }
        pairs
    }
}

/// `Σ_s sc_s·Σx_s` per row of the half, for one activation row whose 16 sums per 16 values are
/// at `bs` (`pairs` from [`scale_pairs`]); exact in i32.
#[inline(always)]
pub(super) unsafe fn scaled_sums(pairs: &[__m256i; 8], bs: *const i16) -> __m256i {
    unsafe {
        let mut sum = _mm256_setzero_si256();
        for (k, v) in pairs.iter().enumerate() {
            let pair = std::ptr::read_unaligned(bs.add(2 * k) as *const i32);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(*v, _mm256_set1_epi32(pair)));
        }
        sum
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
        let (sub, nsub) = (fmt.sub(), fmt.nsub());
        let (gbb, hb, qb) = (
            fmt.group_block_bytes(),
            fmt.header_bytes(),
            fmt.sub_quant_bytes(),
        );
        let off = fmt.offset();
        // Q6_K's offset (`w = u − 32`, 16-value sub-blocks) is taken off once per super-block
        // from the activations' sums, at both levels: with VNNI too, one `Σ_s sc_s·Σx_s` per row
        // costs less than a scalar `−OFF·Σx` broadcast into every sub-block's sum (IQ4_XS's
        // 32-value sub-blocks keep that: half as many, and no per-16 sums to pair).
        let sb_offset = off != 0 && sub == 16;
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        let mut wv = [_mm256_setzero_si256(); 8];
        let l2 = crate::prefetch::into_l2(R, crate::prefetch::WIDE_SUPER_BLOCKS);
        let near = crate::prefetch::near_l1();
        for b in 0..p.nbk {
            let blk = w.add(b * gbb);
            let pf = blk.wrapping_add(crate::prefetch::ahead(
                R,
                crate::prefetch::WIDE_SUPER_BLOCKS,
            ));
            // Both halves of a super-block before the next one, rather than one half's pass
            // over the whole group and then the other's: the stream ahead is requested in
            // slices spread over both halves' sub-blocks, so it keeps flowing while the second
            // half computes (a second pass issued no requests, and a wide tile's arithmetic and
            // the stream took turns).
            for (h, acc) in acc.iter_mut().enumerate() {
                let mut isum = [_mm256_setzero_si256(); R];
                for s in 0..nsub {
                    crate::prefetch::stream(blk, pf, gbb, (h * nsub + s, 2 * nsub), l2, near);
                    F::load_sub::<VNNI>(blk.add(hb + s * qb), h, &mut wv);
                    let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        blk.add(fmt.sc_offset() + 16 * s + 8 * h) as *const __m128i,
                    ));
                    let sc16 = _mm256_or_si256(
                        _mm256_and_si256(sc, _mm256_set1_epi32(0xffff)),
                        _mm256_slli_epi32::<16>(sc),
                    );
                    if !VNNI && F::SIGNED {
                        // The sign trick's |w| once per chunk for every row of the tile (chunks
                        // outermost); one chunk per widening, so the integer sums are the same.
                        const { assert!(!F::SIGNED || F::CHUNKS_I16 == 1) };
                        for c in 0..sub / 4 {
                            let aw = _mm256_sign_epi8(wv[c], wv[c]);
                            for r in 0..R {
                                let xb = p.q.add(r * p.qstride + b * QK_K + s * sub);
                                let m =
                                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x4(xb, c), wv[c]));
                                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(m, sc16));
                            }
                        }
                        continue;
                    }
                    for r in 0..R {
                        let xb = p.q.add(r * p.qstride + b * QK_K + s * sub);
                        if !VNNI {
                            let d = idot_scaled::<F>(&wv, xb, sub / 4, sc16);
                            isum[r] = _mm256_add_epi32(isum[r], d);
                            continue;
                        }
                        let p0 = if fmt.has_dmin() || sb_offset {
                            _mm256_setzero_si256()
                        } else {
                            // IQ4_XS (`u` = value + 128): 32-value sub-blocks.
                            let bs = *p.bs32.add((r * p.nbk + b) * 8 + s);
                            _mm256_set1_epi32(-off * bs as i32)
                        };
                        let d = idot_vnni(&wv, xb, sub / 4, p0);
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(d, sc));
                    }
                }
                if sb_offset {
                    // The offset of `w = u − OFF` (Q6_K): `OFF·Σ_s sc_s·Σx_s` off each row's sum.
                    let pairs = scale_pairs::<false>(blk.add(fmt.sc_offset()), h);
                    for r in 0..R {
                        let corr = scaled_sums(&pairs, p.bs16.add((r * p.nbk + b) * 16));
                        isum[r] = _mm256_sub_epi32(
                            isum[r],
                            _mm256_mullo_epi32(corr, _mm256_set1_epi32(off)),
                        );
                    }
                }
                let da = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h) as *const __m128i));
                for r in 0..R {
                    let dy = _mm256_set1_ps(*p.d.add(r * p.nbk + b));
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(da, dy), acc[r]);
                }
                if fmt.has_dmin() {
                    let db =
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(32 + 16 * h) as *const __m128i));
                    let m0 = blk.add(fmt.m_offset() + 16 * h);
                    let mut mp = [_mm256_setzero_si256(); 4];
                    for (k, v) in mp.iter_mut().enumerate() {
                        *v =
                            _mm256_cvtepi8_epi16(_mm_loadu_si128(m0.add(32 * k) as *const __m128i));
                    }
                    for r in 0..R {
                        let bs = p.bs32.add((r * p.nbk + b) * 8);
                        let mut msum = _mm256_setzero_si256();
                        for (k, v) in mp.iter().enumerate() {
                            let pair = std::ptr::read_unaligned(bs.add(2 * k) as *const i32);
                            msum = _mm256_add_epi32(
                                msum,
                                _mm256_madd_epi16(*v, _mm256_set1_epi32(pair)),
                            );
                        }
                        let dy = _mm256_set1_ps(*p.d.add(r * p.nbk + b));
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

/// One group of 16 interleaved rows of `fmt` against `t` (1..=8) activation rows; see
/// [`super::avx512::dot_group`]. Every tile height up to eight is one pass over the group: past
/// four rows the sixteen ymm registers no longer hold every row's sums next to a sub-block's
/// weights and the compiler spills some, but that is cheaper at 5–8 rows than two tiles that
/// each decode the weights again (`cargo bench -p specd-ops --bench matmul -- hot tiles`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; the pointers must cover what they describe.
/// With `vnni`, the AVX-VNNI kernels (the caller checked the feature).
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
        ($f:ty, $vnni:expr, $p:expr, $t:expr, $out:expr) => {
            if $vnni {
                crate::for_tile_height!(
                    $t,
                    [8, 7, 6, 5, 4, 3, 2],
                    1,
                    kernel_vnni::<$f>(w, $p, $out, ostride)
                )
            } else {
                crate::for_tile_height!(
                    $t,
                    [8, 7, 6, 5, 4, 3, 2],
                    1,
                    kernel::<$f>(w, $p, $out, ostride)
                )
            }
        };
    }
    unsafe {
        let mut r = 0;
        while r < t {
            let n = (t - r).min(8);
            let pr = p.rows_from(r);
            let o = out.add(r * ostride);
            let vnni = vnni && vnni_pays(fmt, n);
            match fmt {
                KFormat::Q4K => tiles!(Q4K, vnni, pr, n, o),
                KFormat::Q5K => tiles!(Q5K, vnni, pr, n, o),
                KFormat::Q6K => tiles!(Q6K, vnni, pr, n, o),
                KFormat::IQ4XS => tiles!(IQ4XS, vnni, pr, n, o),
                KFormat::Q2K | KFormat::Q3K => {
                    super::q23_avx2::dot_group(fmt, vnni, w, pr, n, o, ostride)
                }
            }
            r += n;
        }
    }
}

/// Whether a tile of `rows` rows of `fmt` is cheaper with the AVX-VNNI kernel than with the
/// plain AVX2 one on an AVX-VNNI CPU. Both give the same bits (exact integer sums, the same float
/// operations), so the choice can differ by tile height. `vpdpbusd` saves the pair-widening, but
/// the VNNI kernels apply a sub-block's scale with a `vpmulld` per row (two µops with a long
/// latency) where AVX2 folds it into `vpmaddwd`; with 16-value sub-blocks (Q6_K, Q2_K, Q3_K)
/// that is twice as many multiplies, and the wide tiles, short of registers, lost to AVX2 —
/// the heights below are where each kernel measured faster (`cargo bench -p specd-ops --bench
/// matmul -- hot tiles`).
fn vnni_pays(fmt: KFormat, rows: usize) -> bool {
    match fmt {
        KFormat::Q6K => rows <= 4,
        KFormat::Q2K => (2..=6).contains(&rows),
        KFormat::Q3K => false,
        KFormat::Q4K | KFormat::Q5K | KFormat::IQ4XS => true,
    }
}

/// AVX2 body of [`super::quantize_row_k`] for one block of 256 values (bit-identical to
/// [`super::quantize_block_scalar`]): returns `d`.
///
/// # Safety
/// AVX2 must be available; `xs` and `q` hold 256 values, `bs16` 16.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_block(xs: &[f32], q: &mut [i8], bs16: &mut [i16]) -> f32 {
    unsafe {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            // maxps returns its second operand when the first is NaN: NaN is ignored.
            m = _mm256_max_ps(
                _mm256_and_ps(_mm256_loadu_ps(xs.as_ptr().add(8 * k)), abs_mask),
                m,
            );
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
        if amax == 0.0 {
            q[..QK_K].fill(0);
            bs16[..16].fill(0);
            return 0.0;
        }
        let max = xs.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let vs = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        for k in 0..32 {
            let r = _mm256_mul_ps(vs, _mm256_loadu_ps(xs.as_ptr().add(8 * k)));
            // NaN → 0 like `as i32`; `vcvtps2dq` rounds half to even (the default MXCSR mode).
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
            let qi = _mm256_min_epi32(_mm256_cvtps_epi32(r), cap);
            let mut out = [0i32; 8];
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, qi);
            let mut sum = 0i16;
            for (o, &v) in q[8 * k..8 * k + 8].iter_mut().zip(&out) {
                *o = v as i8;
                sum += v as i16;
            }
            if k % 2 == 0 {
                bs16[k / 2] = sum;
            } else {
                bs16[k / 2] += sum;
            }
        }
        1.0 / iscale
    }
}
