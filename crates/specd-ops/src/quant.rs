//! Quantisation of activation rows to 8-bit blocks, as llama.cpp does before a matmul with
//! quantised weights (so that the dot product runs on integers). Each row is quantised on its
//! own, so the result does not depend on the batch.

use half::f16;

/// One block of 32 activations quantised to i8 with one scale (ggml's `block_q8_0` layout, with
/// the scale widened to f32 after rounding it to f16 exactly as ggml stores it).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(4))]
pub struct BlockQ8 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// Quantises 32 values: returns the f16-rounded scale and writes `round(v / d)` in −127..=127.
///
/// Written without a `roundf` call (it was 1 % of a decode step) so that it vectorises; the
/// result is the same: round half away from zero, exact because |v / d| ≤ 127 leaves `r − t`
/// exact.
#[inline]
fn quantize_block(xs: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(xs) {
        let r = v * id;
        // `trunc` through an integer: `f32::trunc` is a libm call on the baseline x86-64 target
        // (no SSE4.1 `roundps`), which kept this loop scalar. Exact for |r| ≤ 127 (NaN → 0).
        let t = (r as i32) as f32;
        let up = if (r - t).abs() >= 0.5 {
            1.0f32.copysign(r)
        } else {
            0.0
        };
        *q = (t + up) as i8;
    }
    f16::from_f32(d).to_f32()
}

/// Quantises `x` (length a multiple of 32) into `out`.
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        blk.d = quantize_block(xs, &mut blk.qs);
    }
}

/// Floats of expanded scales per row for [`quantize_row_u8`]: 16 per pair of blocks.
pub fn u8_scales_len(cols: usize) -> usize {
    (cols / 32).div_ceil(2) * 16
}

/// The VNNI kernels' layout of the same quantisation as [`quantize_row_q8`]: the quants offset by
/// +128 into `qs` (unsigned, as `vpdpbusd` wants its first operand; the kernel subtracts
/// 128·Σw back), and each block's scale repeated 8 times so that a pair of blocks has a ready
/// 16-lane scale vector (`scales[16p..16p+8]` = block 2p, `[16p+8..16p+16]` = block 2p+1).
pub fn quantize_row_u8(x: &[f32], qs: &mut [u8], scales: &mut [f32]) {
    let mut q = [0i8; 32];
    for (b, xs) in x.chunks_exact(32).enumerate() {
        let d = quantize_block(xs, &mut q);
        for (o, &v) in qs[b * 32..(b + 1) * 32].iter_mut().zip(&q) {
            *o = (v as i16 + 128) as u8;
        }
        let s0 = (b / 2) * 16 + (b % 2) * 8;
        scales[s0..s0 + 8].fill(d);
    }
}

/// The interleaved-weight VNNI kernel's layout of the same quantisation as [`quantize_row_q8`]:
/// signed quants in `qs`, one scale per block in `d`, and per block `−128·Σq` in `corr` — the
/// kernel's starting value, which cancels the +128 the repacked weights carry (see
/// [`crate::pack`]).
pub fn quantize_row_i8s(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa() >= crate::Isa::Avx512Vnni {
        let nb = x.len() / 32;
        assert!(qs.len() >= nb * 32 && d.len() >= nb && corr.len() >= nb);
        // SAFETY: AVX-512 detected; lengths asserted above.
        unsafe { quantize_row_i8s_avx512(x, qs, d, corr) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        let nb = x.len() / 32;
        assert!(qs.len() >= nb * 32 && d.len() >= nb && corr.len() >= nb);
        // SAFETY: AVX2 detected; lengths asserted above.
        unsafe { quantize_row_i8s_avx2(x, qs, d, corr) };
        return;
    }
    quantize_row_i8s_scalar(x, qs, d, corr);
}

/// Portable body of [`quantize_row_i8s`] (and the reference its AVX-512 body must match).
fn quantize_row_i8s_scalar(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32]) {
    let mut t = [0i8; 32];
    for ((xs, q), (d, c)) in x
        .chunks_exact(32)
        .zip(qs.chunks_exact_mut(32))
        .zip(d.iter_mut().zip(corr.iter_mut()))
    {
        *d = quantize_block(xs, &mut t);
        q.copy_from_slice(&t);
        *c = -128 * t.iter().map(|&v| v as i32).sum::<i32>();
    }
}

/// AVX-512 body of [`quantize_row_i8s`], bit-identical to [`quantize_block`]: the activations
/// are quantised once per matmul on one thread, so for a verification batch of a few rows the
/// scalar loop (~2 ns per value) was a serial cost comparable to a matmul's extra rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn quantize_row_i8s_avx512(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32]) {
    use std::arch::x86_64::*;
    unsafe {
        let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
        let sign_mask = _mm512_set1_epi32(i32::MIN);
        let one = _mm512_set1_ps(1.0);
        let half = _mm512_set1_ps(0.5);
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let v = [
                _mm512_loadu_ps(xs.as_ptr()),
                _mm512_loadu_ps(xs.as_ptr().add(16)),
            ];
            // max(|v|, m) returns m for a NaN |v|, as `f32::max` does.
            let mut m = _mm512_setzero_ps();
            for vv in v {
                let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(vv), abs_mask));
                m = _mm512_max_ps(a, m);
            }
            let amax = _mm512_reduce_max_ps(m);
            let dd = amax / 127.0;
            let id = _mm512_set1_ps(if dd != 0.0 { 1.0 / dd } else { 0.0 });
            let mut sum = _mm512_setzero_si512();
            for (h, vv) in v.into_iter().enumerate() {
                let r = _mm512_mul_ps(vv, id);
                // `(r as i32) as f32`, NaN → 0 (the conversion instruction would give i32::MIN).
                let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
                let t = _mm512_maskz_mov_ps(ordered, _mm512_cvtepi32_ps(_mm512_cvttps_epi32(r)));
                let frac = _mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_castps_si512(_mm512_sub_ps(r, t)),
                    abs_mask,
                ));
                let round_up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
                let signed_one = _mm512_castsi512_ps(_mm512_or_si512(
                    _mm512_and_si512(_mm512_castps_si512(r), sign_mask),
                    _mm512_castps_si512(one),
                ));
                let q = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, round_up, t, signed_one));
                sum = _mm512_add_epi32(sum, q);
                _mm_storeu_si128(
                    qs.as_mut_ptr().add(32 * b + 16 * h) as *mut __m128i,
                    _mm512_cvtepi32_epi8(q),
                );
            }
            d[b] = half::f16::from_f32(dd).to_f32();
            corr[b] = -128 * _mm512_reduce_add_epi32(sum);
        }
    }
}

/// AVX2 body of [`quantize_row_i8s`]: the AVX-512 body's steps on four vectors of eight per
/// block, bit-identical to [`quantize_block`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_i8s_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32]) {
    use std::arch::x86_64::*;
    unsafe {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
        let one = _mm256_set1_ps(1.0);
        let half = _mm256_set1_ps(0.5);
        // `vpackssdw` + `vpacksswb` interleave the four vectors by 128-bit lane; this puts the
        // 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xs.as_ptr().add(8 * i)));
            // max(|v|, m) returns m for a NaN |v|, as `f32::max` does.
            let mut m = _mm256_setzero_ps();
            for vv in v {
                m = _mm256_max_ps(_mm256_and_ps(vv, abs_mask), m);
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let dd = amax / 127.0;
            let id = _mm256_set1_ps(if dd != 0.0 { 1.0 / dd } else { 0.0 });
            let q = v.map(|vv| {
                let r = _mm256_mul_ps(vv, id);
                // `(r as i32) as f32`, NaN → 0 (the conversion instruction would give i32::MIN).
                let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(r, r);
                let t = _mm256_and_ps(_mm256_cvtepi32_ps(_mm256_cvttps_epi32(r)), ordered);
                let frac = _mm256_and_ps(_mm256_sub_ps(r, t), abs_mask);
                let round_up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
                let signed_one = _mm256_or_ps(_mm256_and_ps(r, sign_mask), one);
                _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(signed_one, round_up)))
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256(sum, 1),
            );
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            _mm256_storeu_si256(
                qs.as_mut_ptr().add(32 * b) as *mut __m256i,
                _mm256_permutevar8x32_epi32(bytes, order),
            );
            d[b] = half::f16::from_f32(dd).to_f32();
            corr[b] = -128 * _mm_cvtsi128_si32(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8s_levels_agree_bit_for_bit() {
        let mut s = 7u32;
        let mut x = vec![0f32; 32 * 64];
        for (i, v) in x.iter_mut().enumerate() {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let u = (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            // Blocks of every scale, exact halves, zero blocks and non-finite values.
            *v = match i / 32 % 8 {
                0 => 0.0,
                1 => u * 1e-30,
                2 => (u * 254.0).round() * 0.5,
                3 if i % 32 == 5 => f32::NAN,
                4 if i % 32 == 9 => f32::INFINITY,
                _ => u * 10f32.powi((i / 32 % 7) as i32 - 3),
            };
        }
        let nb = x.len() / 32;
        let (mut q0, mut d0, mut c0) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
        quantize_row_i8s_scalar(&x, &mut q0, &mut d0, &mut c0);
        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // The dispatch (this CPU's best level) and every SIMD body the CPU has, each on its own.
        type Body = fn(&[f32], &mut [i8], &mut [f32], &mut [i32]);
        let mut bodies: Vec<(&str, Body)> = vec![("dispatch", quantize_row_i8s)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
                // SAFETY: features detected; the buffers are sized for `x`.
                bodies.push(("avx2", |x, q, d, c| unsafe {
                    quantize_row_i8s_avx2(x, q, d, c)
                }));
            }
            if crate::Isa::available().contains(&crate::Isa::Avx512Vnni) {
                // SAFETY: as above.
                bodies.push(("avx512", |x, q, d, c| unsafe {
                    quantize_row_i8s_avx512(x, q, d, c)
                }));
            }
        }
        for (name, body) in bodies {
            let (mut q1, mut d1, mut c1) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
            body(&x, &mut q1, &mut d1, &mut c1);
            assert_eq!(q0, q1, "{name}");
            assert_eq!(c0, c1, "{name}");
            assert_eq!(bits(&d0), bits(&d1), "{name}");
        }
    }

    #[test]
    fn rounding_matches_roundf() {
        let mut s = 1u32;
        for _ in 0..2000 {
            let mut xs = [0f32; 32];
            for v in &mut xs {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                *v = (s >> 8) as f32 / (1u32 << 24) as f32 * 8.0 - 4.0;
            }
            // exact halves too
            xs[3] = 0.5 * xs[0].abs() / 127.0 * 3.0;
            let mut q = [0i8; 32];
            let d = quantize_block(&xs, &mut q);
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let id = 1.0 / (amax / 127.0);
            for (v, q) in xs.iter().zip(q) {
                assert_eq!((v * id).round() as i8, q, "{v}");
            }
            assert!(d > 0.0);
        }
    }
}
