//! IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 values (ggml's
//! `kvalues_iq4nl`), which places more levels near zero where most weights are.
//!
//! Layouts (ggml-common.h, checked against ggml-quants.c's `dequantize_row_iq4_*` and gguf-py):
//! * IQ4_NL, 32 weights in 18 bytes: f16 `d`, then 16 bytes of nibbles; weight `j` is
//!   `d·T[qs[j] & 15]`, weight `j + 16` is `d·T[qs[j] >> 4]`.
//! * IQ4_XS, 256 weights in 136 bytes: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of
//!   nibbles. Sub-block `ib` (32 weights) has the 6-bit scale
//!   `ls = ((scales_l[ib/2] >> 4·(ib%2)) & 15) | (((scales_h >> 2·ib) & 3) << 4)`, step
//!   `dl = d·(ls − 32)`, and its weights are decoded like an IQ4_NL block from `qs[16·ib..][..16]`.
//!
//! The dequantisers compute every value with the same f32 operations in the same order as ggml, so
//! they match it bit for bit. The quantisers are specd's own (not llama.cpp's search): per 32
//! weights they try a range of scales, assign each weight its nearest table entry, refit the scale
//! by least squares and keep the scale with the smallest squared error.

use half::f16;

/// ggml's `kvalues_iq4nl`.
pub const IQ4NL_TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// Weights per IQ4_NL block and per IQ4_XS sub-block.
const QK: usize = 32;
/// Weights per IQ4_XS super-block.
const QK_K: usize = 256;
/// Bytes of an IQ4_NL block.
pub const IQ4_NL_BYTES: usize = 18;
/// Bytes of an IQ4_XS super-block.
pub const IQ4_XS_BYTES: usize = 136;

/// Midpoints between neighbouring table entries.
const MIDPOINTS: [f32; 15] = {
    let mut m = [0f32; 15];
    let mut i = 0;
    while i < 15 {
        m[i] = (IQ4NL_TABLE[i] as f32 + IQ4NL_TABLE[i + 1] as f32) * 0.5;
        i += 1;
    }
    m
};

/// Index of the table entry nearest to `v` (in table units): the number of midpoints below it.
/// Counted without branches — a search here mispredicts on random weights and dominated the
/// quantisation time.
fn nearest(v: f32) -> u8 {
    MIDPOINTS.iter().map(|&m| u8::from(v > m)).sum()
}

/// Squared error of `x` coded with step `d` (each weight takes its nearest table entry).
fn error_at(x: &[f32], d: f32) -> f32 {
    if d == 0.0 {
        return x.iter().map(|v| v * v).sum();
    }
    let id = 1.0 / d;
    x.iter()
        .map(|&v| {
            let e = v - d * IQ4NL_TABLE[nearest(v * id) as usize] as f32;
            e * e
        })
        .sum()
}

/// The step (possibly negative: the table is not symmetric) that codes the 32 weights `x` best.
fn best_scale(x: &[f32]) -> f32 {
    // The weight of largest magnitude, with its sign.
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if max == 0.0 {
        return 0.0;
    }
    let sxx: f32 = x.iter().map(|v| v * v).sum();
    let mut best = (f32::INFINITY, 0f32);
    // Candidates: the largest weight mapped onto either outer table entry, stretched by up to
    // ±18 %; each assignment's step is refitted by least squares, whose residual is
    // Σx² − (Σxq)²/Σq² (no second pass over the weights needed).
    for &end in &[IQ4NL_TABLE[0] as f32, IQ4NL_TABLE[15] as f32] {
        for step in -6..=6 {
            let id = end * (1.0 + 0.03 * step as f32) / max;
            let (mut sxq, mut sqq) = (0f32, 0f32);
            for &v in x {
                let q = IQ4NL_TABLE[nearest(v * id) as usize] as f32;
                sxq += v * q;
                sqq += q * q;
            }
            if sqq > 0.0 {
                let e = sxx - sxq * sxq / sqq;
                if e < best.0 {
                    best = (e, sxq / sqq);
                }
            }
        }
    }
    best.1
}

/// Writes the 16 nibble bytes of 32 weights coded with step `d`.
fn pack(x: &[f32], d: f32, qs: &mut [u8]) {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for j in 0..QK / 2 {
        let lo = nearest(x[j] * id);
        let hi = nearest(x[j + QK / 2] * id);
        qs[j] = lo | (hi << 4);
    }
}

/// Quantises `x` (a multiple of 32 values) to IQ4_NL blocks.
pub fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / QK * IQ4_NL_BYTES];
    for (b, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(IQ4_NL_BYTES)) {
        let d = f16::from_f32(best_scale(b));
        o[..2].copy_from_slice(&d.to_le_bytes());
        // Indices are chosen for the stored (f16-rounded) step, which is what decoding uses.
        pack(b, d.to_f32(), &mut o[2..]);
    }
    out
}

/// Quantises `x` (a multiple of 256 values) to IQ4_XS super-blocks.
pub fn quantize_iq4_xs(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / QK_K * IQ4_XS_BYTES];
    for (sb, o) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(IQ4_XS_BYTES)) {
        let scales: Vec<f32> = sb.chunks_exact(QK).map(best_scale).collect();
        // The sub-scale of largest magnitude, with its sign, maps to ls − 32 = −32 (the 6-bit
        // range is −32..=31, so the negative end is the one that fits it exactly).
        let smax = scales
            .iter()
            .fold(0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
        let d = f16::from_f32(-smax / 32.0);
        let df = d.to_f32();
        let id = if df != 0.0 { 1.0 / df } else { 0.0 };
        let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
        for (ib, (&s, xb)) in scales.iter().zip(sb.chunks_exact(QK)).enumerate() {
            let mut ls = ((s * id).round() as i32 + 32).clamp(0, 63);
            // Rounding the sub-scale can make it worse than a neighbour; try both neighbours.
            let mut best = (error_at(xb, df * (ls - 32) as f32), ls);
            for cand in [ls - 1, ls + 1] {
                if (0..=63).contains(&cand) {
                    let e = error_at(xb, df * (cand - 32) as f32);
                    if e < best.0 {
                        best = (e, cand);
                    }
                }
            }
            ls = best.1;
            scales_l[ib / 2] |= ((ls & 15) as u8) << (4 * (ib % 2));
            scales_h |= (((ls >> 4) & 3) as u16) << (2 * ib);
            let dl = df * (ls - 32) as f32;
            pack(xb, dl, &mut o[8 + 16 * ib..8 + 16 * (ib + 1)]);
        }
        o[..2].copy_from_slice(&d.to_le_bytes());
        o[2..4].copy_from_slice(&scales_h.to_le_bytes());
        o[4..8].copy_from_slice(&scales_l);
    }
    out
}

/// Decodes one 32-weight group of nibbles with step `d` (ggml's operation order).
fn decode(qs: &[u8], d: f32, y: &mut [f32]) {
    for j in 0..QK / 2 {
        y[j] = d * IQ4NL_TABLE[(qs[j] & 15) as usize] as f32;
        y[j + QK / 2] = d * IQ4NL_TABLE[(qs[j] >> 4) as usize] as f32;
    }
}

/// Dequantises IQ4_NL blocks (`bytes` and `out` sizes already checked by the caller).
pub fn dequantize_iq4_nl(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes
        .chunks_exact(IQ4_NL_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        decode(&b[2..], d, y);
    }
}

/// Dequantises IQ4_XS super-blocks (`bytes` and `out` sizes already checked by the caller).
pub fn dequantize_iq4_xs(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes
        .chunks_exact(IQ4_XS_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        for (ib, ys) in y.chunks_exact_mut(QK).enumerate() {
            let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let ls = (lo | (hi << 4)) as i32;
            let dl = d * (ls - 32) as f32;
            decode(&b[8 + 16 * ib..8 + 16 * (ib + 1)], dl, ys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_picks_the_closest_entry() {
        for (i, &t) in IQ4NL_TABLE.iter().enumerate() {
            assert_eq!(nearest(t as f32) as usize, i);
        }
        assert_eq!(nearest(-1000.0), 0);
        assert_eq!(nearest(1000.0), 15);
        assert_eq!(nearest(0.0), 8); // 1 is nearer to 0 than -10
    }

    #[test]
    fn zero_blocks_round_trip_to_zero() {
        let x = [0f32; 256];
        let mut y = [1f32; 256];
        dequantize_iq4_nl(&quantize_iq4_nl(&x), &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
        let mut y = [1f32; 256];
        dequantize_iq4_xs(&quantize_iq4_xs(&x), &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn table_values_are_exact() {
        // A block made of table entries times a power of two is coded without error.
        let x: Vec<f32> = (0..32).map(|i| IQ4NL_TABLE[i % 16] as f32 / 64.0).collect();
        let mut y = vec![0f32; 32];
        dequantize_iq4_nl(&quantize_iq4_nl(&x), &mut y);
        assert_eq!(x, y);
    }
}
