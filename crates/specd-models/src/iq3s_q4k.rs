//! IQ3_S → Q4_K without requantising. An IQ3_S weight is `d·(1+2s)·g·sign` with `g` odd in
//! 1..15 (the D4 grid's coordinates) and one 4-bit `s` per 32 weights, so each sub-block holds the
//! 16 evenly spaced levels `d·(1+2s)·(2q−15)`, q = 0..15 — exactly Q4_K's `d'·sc·q − dmin·m` with
//! `d' = 2d`, `dmin = 15d`, `sc = m = 1+2s` (≤ 31, fits 6 bits). Only `dmin` is rounded (to f16:
//! a relative 2^-12 of the sub-block's offset); a generic requantisation instead searches new
//! scales and moves most weights by up to half a Q4_K step.

use crate::ModelError;
use half::f16;
use specd_gguf::{quant::dequantize, TensorType};

const IQ3_S_BYTES: usize = 110;
/// Byte offset of IQ3_S's f16 `d` and of its 4 bytes of 4-bit sub-block scales.
const D_AT: usize = 0;
const SCALES_AT: usize = 106;

/// The Q4_K bytes of IQ3_S `bytes`, or `None` where a block's `d` is too large for `15·d` to be
/// an f16 (then the caller requantises).
pub fn iq3_s_as_q4_k(bytes: &[u8]) -> Option<Result<Vec<u8>, ModelError>> {
    let mut out = Vec::with_capacity(bytes.len() / IQ3_S_BYTES * 144);
    let mut unit = [0u8; IQ3_S_BYTES];
    let mut v = [0f32; 256];
    for blk in bytes.chunks_exact(IQ3_S_BYTES) {
        let d = f16::from_le_bytes([blk[D_AT], blk[D_AT + 1]]).to_f32();
        let (d2, dmin) = (f16::from_f32(2.0 * d), f16::from_f32(15.0 * d));
        if !d.is_finite() || !dmin.is_finite() || !d2.is_finite() {
            return None;
        }
        // The levels `(1+2s)·g·sign`: the block decoded with d = 1.
        unit.copy_from_slice(blk);
        unit[D_AT..D_AT + 2].copy_from_slice(&f16::ONE.to_le_bytes());
        if let Err(e) = dequantize(TensorType::IQ3_S, &unit, &mut v) {
            return Some(Err(e.into()));
        }
        let mut sc = [0u8; 8];
        let mut qs = [0u8; 128];
        for (j, sub) in v.chunks_exact(32).enumerate() {
            let s = blk[SCALES_AT + j / 2] >> (4 * (j % 2)) & 15;
            sc[j] = 1 + 2 * s;
            for (l, &x) in sub.iter().enumerate() {
                // x / (1+2s) is an odd integer in −15..15: q = (x/(1+2s) + 15) / 2.
                let q = ((x / sc[j] as f32) as i32 + 15) / 2;
                let at = 32 * (j / 2) + l;
                qs[at] |= (q as u8) << (4 * (j % 2));
            }
        }
        out.extend_from_slice(&d2.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        // Q4_K's 12 scale bytes: 6-bit scales and mins, sub-blocks 4..7 split over the top bits
        // of bytes 0..7 and the nibbles of bytes 8..11 (ggml's get_scale_min_k4).
        let m = sc; // the offset's multiplier is the scale's (see the module comment)
        let mut packed = [0u8; 12];
        for j in 0..4 {
            packed[j] = sc[j] | (sc[j + 4] >> 4) << 6;
            packed[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
            packed[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
        }
        out.extend_from_slice(&packed);
        out.extend_from_slice(&qs);
    }
    Some(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq3_s_becomes_q4_k_up_to_the_rounding_of_dmin() {
        // Every byte value in the payload, scales of both signs and magnitudes.
        let mut src: Vec<u8> = (0..IQ3_S_BYTES * 16)
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        for (k, blk) in src.chunks_exact_mut(IQ3_S_BYTES).enumerate() {
            let d = [1.2e-4f32, -3e-3, 0.0, 7.0, 6e-8][k % 5];
            blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
        let q4 = iq3_s_as_q4_k(&src).unwrap().unwrap();
        let n = src.len() / IQ3_S_BYTES * 256;
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        dequantize(TensorType::IQ3_S, &src, &mut a).unwrap();
        dequantize(TensorType::Q4_K, &q4, &mut b).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let blk = &src[i / 256 * IQ3_S_BYTES..];
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32().abs();
            // The offset 15·d·(1+2s) ≤ 465·d is off by at most 2^-11 of itself.
            assert!(
                (x - y).abs() <= 465.0 * d * 2f32.powi(-11),
                "[{i}] {x} vs {y}"
            );
        }
        let too_large = {
            let mut b = src[..IQ3_S_BYTES].to_vec();
            b[..2].copy_from_slice(&f16::from_f32(30000.0).to_le_bytes());
            b
        };
        assert!(iq3_s_as_q4_k(&too_large).is_none());
    }
}
