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

/// Row `j` of one interleaved group (`g`: the group's bytes, repacked from `base`) against `x`,
/// with the VNNI kernel's arithmetic (exact integer block sums, then `acc = fma(sum, dw·dx, acc)`
/// block by block), so every level gives the same bits.
pub fn dot_r16(base: WeightType, g: &[u8], j: usize, x: I8Row) -> f32 {
    let (xq, xd) = x;
    let mut acc = 0f32;
    let gbb = crate::pack::group_block_bytes(base);
    for (b, blk) in g.chunks_exact(gbb).enumerate() {
        let dw = half::f16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f32();
        let quants = &blk[2 * crate::pack::GROUP..];
        let isum: i32 = (0..32)
            .map(|w| crate::pack::r16_quant(base, quants, j, w) * xq[32 * b + w] as i32)
            .sum();
        acc = (isum as f32).mul_add(dw * xd[b], acc);
    }
    acc
}

/// A plain Q8_0 / Q4_0 / IQ4_NL row (the tail of an interleaved matrix) with the same arithmetic as
/// [`dot_r16`].
pub fn dot_tail_i8s(base: WeightType, w: &[u8], x: I8Row) -> f32 {
    let (xq, xd) = x;
    let mut acc = 0f32;
    let mut wf = [0f32; 32];
    for (b, blk) in w.chunks_exact(base.block_bytes()).enumerate() {
        let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        // The quants as integers: dequantise with a unit scale (exact for these small values).
        let mut unit = blk.to_vec();
        unit[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        dequantize(base, &unit, &mut wf);
        let isum: i32 = wf
            .iter()
            .zip(&xq[32 * b..32 * b + 32])
            .map(|(&w, &q)| w as i32 * q as i32)
            .sum();
        acc = (isum as f32).mul_add(dw * xd[b], acc);
    }
    acc
}
