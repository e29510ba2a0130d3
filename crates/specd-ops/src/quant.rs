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

/// Quantises `x` (length a multiple of 32) into `out`.
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk.d = f16::from_f32(d).to_f32();
        for (q, &v) in blk.qs.iter_mut().zip(xs) {
            // round half away from zero, as ggml's reference `roundf`
            *q = (v * id).round() as i8;
        }
    }
}
