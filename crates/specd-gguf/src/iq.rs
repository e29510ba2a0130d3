//! Decoders (bytes → f32) of the ggml types specd has no kernel for and reads only to convert at
//! load: the lattice codebooks IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, the ternary
//! TQ1_0 and TQ2_0, and MXFP4 (gpt-oss).
//!
//! Layouts (ggml-common.h; formulas as in ggml-quants.c's `dequantize_row_*` and gguf-py). Every
//! super-block holds 256 weights in 8 sub-blocks of 32, each cut into groups of 8 (or 4) weights
//! that are one point of a fixed grid (tables in [`crate::iq_grids`]):
//! * IQ2_XXS (66 bytes): f16 `d`; per sub-block 8 bytes — four 8-bit E8 grid indices, then a u32
//!   whose top 4 bits are the scale `s` (step `d·(0.5+s)·0.25`) and whose low 28 bits are four
//!   7-bit indices into the even-parity sign table.
//! * IQ2_XS (74 bytes): f16 `d`; 32 u16 (9-bit grid index, 7-bit sign index); 8 bytes of two
//!   4-bit scales each (one per 16 weights, same step formula).
//! * IQ2_S (82 bytes): f16 `d`; 32 low bytes of 10-bit grid indices; 32 bytes of plain sign bits;
//!   8 bytes of the indices' high 2 bits; 8 bytes of 4-bit scales.
//! * IQ3_XXS (98 bytes): f16 `d`; 64 bytes of 8-bit D4 grid indices (4 weights each); per
//!   sub-block a u32 of 4-bit scale (step `d·(0.5+s)·0.5`) and four 7-bit sign indices.
//! * IQ3_S (110 bytes): f16 `d`; 64 low bytes of 9-bit grid indices; 8 bytes of their high bits;
//!   32 bytes of sign bits; 4 bytes of 4-bit scales (step `d·(1+2s)`).
//! * IQ1_S (50 bytes): f16 `d`; 32 low bytes of 11-bit grid indices (coordinates −1, 0, 1); per
//!   sub-block a u16 with the indices' high 3 bits, a 3-bit scale (step `d·(2s+1)`) and the sign
//!   of a shift `±1/8` added to every coordinate.
//! * IQ1_M (56 bytes): as IQ1_S without the f16: 32 index bytes, 16 bytes of (3 high index bits,
//!   shift sign) nibbles, and 4 u16 holding twelve bits of 3-bit scales (one per 16 weights) plus
//!   one nibble of the f16 `d` each (top nibbles, lowest u16 first).
//! * TQ1_0 (54 bytes): 48 bytes of five base-3 digits each, 4 bytes of four digits each, f16 `d`;
//!   a byte `q` holds its digits as the fixed-point fraction `q/256 ≈ Σ t_k·3^-k`, digit `n` is
//!   `((q·3^n mod 256)·3) >> 8`; weight = `(t − 1)·d`.
//! * TQ2_0 (66 bytes): 64 bytes of four 2-bit digits, f16 `d`; weight = `(t − 1)·d`.
//! * MXFP4 (17 bytes, 32 weights): an E8M0 exponent byte `e` (step `2^(e−128)`, halved because
//!   the E2M1 table is stored doubled as integers) and 16 bytes of 4-bit E2M1 codes; weight `j` is
//!   the low nibble of byte `j`, weight `j + 16` its high nibble.
//!
//! Each value is computed with the same f32 operations in the same order as ggml (step first,
//! then `step·grid·sign`), so the decoders match ggml and gguf-py bit for bit. The caller
//! ([`crate::quant::dequantize`]) has checked that the byte and value counts fit.

use crate::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use half::f16;

/// Weights per super-block.
const QK_K: usize = 256;
/// The shift of IQ1_S / IQ1_M grid coordinates.
const IQ1_DELTA: f32 = 0.125;
/// E2M1 values times two (ggml's `kvalues_mxfp4`).
const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Coordinate `j` of a grid entry (its little-endian byte `j`).
fn coord(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// −1 where bit `j` of `signs` is set, else 1 (a multiplication, as in ggml, so a NaN step keeps
/// its bits).
fn sign(signs: u8, j: usize) -> f32 {
    if signs >> j & 1 == 1 {
        -1.0
    } else {
        1.0
    }
}

/// Writes the 8 weights of one E8 grid point: `step·coordinate·sign`.
fn put8(y: &mut [f32], step: f32, entry: u64, signs: u8) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = step * coord(entry, j) as f32 * sign(signs, j);
    }
}

/// Decodes super-blocks of `bytes_per` bytes with `f(block, out)`.
fn per_block(bytes: &[u8], out: &mut [f32], bytes_per: usize, f: impl Fn(&[u8], &mut [f32])) {
    for (b, y) in bytes
        .chunks_exact(bytes_per)
        .zip(out.chunks_exact_mut(QK_K))
    {
        f(b, y);
    }
}

pub(crate) fn dequantize_iq2_xxs(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 66, |b, y| {
        let d = f16_at(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let q = &b[2 + 8 * ib..2 + 8 * ib + 8];
            let aux = u32_at(q, 4);
            let step = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                put8(y, step, IQ2XXS_GRID[q[l] as usize], signs);
            }
        }
    });
}

pub(crate) fn dequantize_iq2_xs(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 74, |b, y| {
        let d = f16_at(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = b[66 + ib];
            let steps = [
                d * (0.5 + (sc & 15) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let q = u16_at(b, 2 + 2 * (4 * ib + l));
                let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                put8(y, steps[l / 2], IQ2XS_GRID[(q & 511) as usize], signs);
            }
        }
    });
}

pub(crate) fn dequantize_iq2_s(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 82, |b, y| {
        let d = f16_at(b, 0);
        let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let steps = [
                d * (0.5 + (scales[ib] & 15) as f32) * 0.25,
                d * (0.5 + (scales[ib] >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let idx = qs[4 * ib + l] as usize | ((qh[ib] as usize) << (8 - 2 * l) & 0x300);
                put8(y, steps[l / 2], IQ2S_GRID[idx], signs[4 * ib + l]);
            }
        }
    });
}

pub(crate) fn dequantize_iq3_xxs(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 98, |b, y| {
        let d = f16_at(b, 0);
        let qs = &b[2..66];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let aux = u32_at(b, 66 + 4 * ib);
            let step = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                // Two D4 points of 4 weights make the group of 8 the signs cover.
                let lo = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize] as u64;
                let hi = IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize] as u64;
                put8(y, step, lo | hi << 32, signs);
            }
        }
    });
}

pub(crate) fn dequantize_iq3_s(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 110, |b, y| {
        let d = f16_at(b, 0);
        let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = scales[ib / 2] >> (4 * (ib % 2)) & 15;
            let step = d * (1 + 2 * s as i32) as f32;
            let h = qh[ib] as usize;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                // Bit 2l of qh is the 9th bit of the first index, bit 2l+1 of the second.
                let i1 = qs[8 * ib + 2 * l] as usize | (h << (8 - 2 * l) & 256);
                let i2 = qs[8 * ib + 2 * l + 1] as usize | (h << (7 - 2 * l) & 256);
                let entry = IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32;
                put8(y, step, entry, signs[4 * ib + l]);
            }
        }
    });
}

/// Writes the 8 weights of one IQ1 grid point: `step·(coordinate + shift)`.
fn put8_iq1(y: &mut [f32], step: f32, entry: u64, delta: f32) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = step * (coord(entry, j) as i8 as f32 + delta);
    }
}

pub(crate) fn dequantize_iq1_s(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 50, |b, y| {
        let d = f16_at(b, 0);
        let qs = &b[2..34];
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qh = u16_at(b, 34 + 2 * ib);
            let step = d * (2 * (qh >> 12 & 7) as i32 + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let idx = qs[4 * ib + l] as usize | ((qh >> (3 * l) & 7) as usize) << 8;
                put8_iq1(y, step, IQ1S_GRID[idx], delta);
            }
        }
    });
}

pub(crate) fn dequantize_iq1_m(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 56, |b, y| {
        let (qs, qh) = (&b[0..32], &b[32..48]);
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        let d_bits =
            (sc[0] >> 12) | (sc[1] >> 8 & 0x00f0) | (sc[2] >> 4 & 0x0f00) | (sc[3] & 0xf000);
        let d = f16::from_bits(d_bits).to_f32();
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                // Scale per 16 weights: 3 bits at 6·(ib%2) (first half) or 6·(ib%2)+3.
                let s = sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2)) & 7;
                let step = d * (2 * s as i32 + 1) as f32;
                // One nibble per group of 8: 3 high index bits, then the shift's sign.
                let nib = qh[2 * ib + l / 2] >> (4 * (l % 2)) & 15;
                let idx = qs[4 * ib + l] as usize | ((nib & 7) as usize) << 8;
                let delta = if nib & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
                put8_iq1(y, step, IQ1S_GRID[idx], delta);
            }
        }
    });
}

/// Ternary digit `n` (0..5) of a TQ1_0 byte.
fn trit(q: u8, n: u32) -> f32 {
    let shifted = q.wrapping_mul(3u8.pow(n));
    ((shifted as u16 * 3) >> 8) as f32 - 1.0
}

pub(crate) fn dequantize_tq1_0(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 54, |b, y| {
        let d = f16_at(b, 52);
        let mut k = 0;
        // 32 bytes × 5 digits, then 16 bytes × 5 digits (digit-major within each run), then the
        // 4 `qh` bytes × 4 digits.
        for (start, len, digits) in [(0usize, 32usize, 5u32), (32, 16, 5), (48, 4, 4)] {
            for n in 0..digits {
                for &q in &b[start..start + len] {
                    y[k] = trit(q, n) * d;
                    k += 1;
                }
            }
        }
    });
}

pub(crate) fn dequantize_tq2_0(bytes: &[u8], out: &mut [f32]) {
    per_block(bytes, out, 66, |b, y| {
        let d = f16_at(b, 64);
        for (half, y) in y.chunks_exact_mut(128).enumerate() {
            for (l, y) in y.chunks_exact_mut(32).enumerate() {
                for (v, &q) in y.iter_mut().zip(&b[32 * half..32 * half + 32]) {
                    *v = ((q >> (2 * l) & 3) as i32 - 1) as f32 * d;
                }
            }
        }
    });
}

/// The MXFP4 step `2^(e−128)` (half the E8M0 scale), built from its bits: subnormal for e < 2.
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) fn dequantize_mxfp4(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(17).zip(out.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for (j, &q) in b[1..].iter().enumerate() {
            y[j] = MXFP4_VALUES[(q & 15) as usize] as f32 * d;
            y[j + 16] = MXFP4_VALUES[(q >> 4) as usize] as f32 * d;
        }
    }
}
