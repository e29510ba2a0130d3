//! Portable kernels (used where AVX2 is absent, or with `SPECD_NO_SIMD`). Deterministic, with the
//! same per-element order for any batch.

use crate::quant::BlockQ8;
use crate::weight::{dequantize, WeightType};

pub fn dot_q(wt: WeightType, w: &[u8], x: &[BlockQ8]) -> f32 {
    let bb = wt.block_bytes();
    let mut acc = 0f32;
    for (b, xb) in x.iter().enumerate() {
        let wb = &w[b * bb..(b + 1) * bb];
        let dw = half::f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        let mut isum = 0i32;
        match wt {
            WeightType::Q8_0 => {
                for (q, &xq) in wb[2..34].iter().zip(&xb.qs) {
                    isum += (*q as i8 as i32) * xq as i32;
                }
            }
            _ => {
                for j in 0..16 {
                    let lo = (wb[2 + j] & 0x0f) as i32 - 8;
                    let hi = (wb[2 + j] >> 4) as i32 - 8;
                    isum += lo * xb.qs[j] as i32 + hi * xb.qs[j + 16] as i32;
                }
            }
        }
        acc += isum as f32 * (dw * xb.d);
    }
    acc
}

pub fn dot_float(wt: WeightType, w: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    let mut tmp = [0f32; 64];
    let bb = wt.block_bytes();
    for (xs, wc) in x.chunks(64).zip(w.chunks(64 * bb)) {
        let t = &mut tmp[..xs.len()];
        dequantize(wt, wc, t);
        for (a, b) in xs.iter().zip(t.iter()) {
            acc += a * b;
        }
    }
    acc
}
