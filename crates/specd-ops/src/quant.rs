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

#[cfg(test)]
mod tests {
    use super::*;

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
