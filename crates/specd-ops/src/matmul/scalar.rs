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

/// Activation row in the [`crate::quant::quantize_row_i8s`] layout: quants and block scales (the
/// corrections are only needed by the VNNI kernel's unsigned weights).
pub type I8Row<'a> = (&'a [i8], &'a [f32]);

/// Row `j` of one [`WeightType::Q8_0R16`] group (`g`: the group's bytes) against `x`, with the
/// VNNI kernel's arithmetic (exact integer block sums, then `acc = fma(sum, dw·dx, acc)` block by
/// block), so every level gives the same bits.
pub fn dot_r16(g: &[u8], j: usize, x: I8Row) -> f32 {
    let (xq, xd) = x;
    let mut acc = 0f32;
    for (b, blk) in g.chunks_exact(crate::pack::GROUP_BLOCK_BYTES).enumerate() {
        let dw = half::f16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f32();
        let mut isum = 0i32;
        for c in 0..8 {
            let w = &blk[32 + 64 * c + 4 * j..32 + 64 * c + 4 * j + 4];
            for (&w, &q) in w.iter().zip(&xq[32 * b + 4 * c..32 * b + 4 * c + 4]) {
                isum += (w as i32 - 128) * q as i32;
            }
        }
        acc = (isum as f32).mul_add(dw * xd[b], acc);
    }
    acc
}

/// A plain Q8_0 row (the tail of a [`WeightType::Q8_0R16`] matrix) with the same arithmetic as
/// [`dot_r16`].
pub fn dot_q8_0_i8s(w: &[u8], x: I8Row) -> f32 {
    let (xq, xd) = x;
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(34).enumerate() {
        let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let isum: i32 = blk[2..]
            .iter()
            .zip(&xq[32 * b..32 * b + 32])
            .map(|(&w, &q)| (w as i8 as i32) * q as i32)
            .sum();
        acc = (isum as f32).mul_add(dw * xd[b], acc);
    }
    acc
}
