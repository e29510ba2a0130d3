//! The block-32 kernels with an offset or a fifth bit (Q4_1, Q5_0, Q5_1): the interleaved repack
//! against ggml's layout, every instruction-set level against the scalar reference bit for bit
//! and against a float reference on the dequantised weights, and batch invariance (width,
//! position, threads, level).

use proptest::prelude::*;
use specd_ops::legacy::{dot_reference, LegacyActs, LegacyFormat, QK};
use specd_ops::quant::quantize_row_i8s;
use specd_ops::{matmul_many, matmul_with, Isa, Weight, WeightType};

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Random blocks of `fmt`: any bit pattern is a valid block once its f16 `d` (and `m`) are
/// small finite numbers; `m` negative as quantisers make it.
fn random_blocks(fmt: LegacyFormat, n: usize, seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed);
    let mut b: Vec<u8> = (0..n * fmt.block_bytes())
        .map(|_| (r() >> 24) as u8)
        .collect();
    for blk in b.chunks_exact_mut(fmt.block_bytes()) {
        let d = 2e-3 * (0.25 + (blk[0] as f32) / 256.0);
        blk[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        if fmt.has_min() {
            let m = -d * (blk[2] as f32) / 16.0;
            blk[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
        }
    }
    b
}

fn activations(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = xorshift(seed);
    (0..n * cols)
        .map(|i| {
            let u = (r() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            // Rows of different magnitudes, an outlier now and then, a block of one sign.
            let v = u * 10f32.powi((i / cols % 3) as i32 - 1) * if i % 97 == 0 { 8.0 } else { 1.0 };
            if i % cols < 32 {
                v.abs()
            } else {
                v
            }
        })
        .collect()
}

/// The matrix in ggml layout and its interleaved repack.
fn matrices(fmt: LegacyFormat, rows: usize, cols: usize, seed: u64) -> (Weight, Weight) {
    let raw = random_blocks(fmt, rows * cols / QK, seed);
    let w = Weight::from_bytes(WeightType::Legacy(fmt), rows, cols, raw).unwrap();
    let p = specd_ops::pack::for_current_isa(&w).unwrap();
    (w, p)
}

#[test]
fn repacked_rows_dequantise_like_the_file() {
    for fmt in LegacyFormat::ALL {
        let (w, p) = matrices(fmt, 40, 352, 11);
        assert_eq!(p.wtype, WeightType::LegacyR16(fmt));
        assert_eq!(p.size_bytes(), w.size_bytes(), "same size");
        let (mut a, mut b) = (vec![0f32; 352], vec![0f32; 352]);
        for r in 0..40 {
            w.dequantize_row(r, &mut a);
            p.dequantize_row(r, &mut b);
            assert_eq!(a, b, "{fmt:?} row {r}");
        }
    }
}

/// Every level, every tile, tails included, both layouts: bit-identical to the scalar
/// reference, and close to the float dot product of the dequantised weights with the
/// dequantised activations.
#[test]
fn kernels_match_reference_on_every_level() {
    for fmt in LegacyFormat::ALL {
        for &(rows, cols, n) in &[(48, 256, 9), (37, 352, 3), (16, 96, 1), (5, 64, 2)] {
            let (w, p) = matrices(fmt, rows, cols, (rows * cols + n) as u64);
            let x = activations(n, cols, 5);
            let acts = LegacyActs::new(&x, n, cols);
            // The activations as the kernels see them.
            let mut xd = vec![0f32; n * cols];
            for i in 0..n {
                let nb = cols / QK;
                let (mut q, mut d, mut c) = (vec![0i8; cols], vec![0f32; nb], vec![0i32; nb]);
                quantize_row_i8s(&x[i * cols..(i + 1) * cols], &mut q, &mut d, &mut c);
                for k in 0..cols {
                    xd[i * cols + k] = q[k] as f32 * d[k / QK];
                }
            }
            let mut wrow = vec![0f32; cols];
            for isa in Isa::available() {
                for m in [&w, &p] {
                    let mut out = vec![0f32; n * rows];
                    matmul_with(isa, &x, n, m, &mut out).unwrap();
                    for o in 0..rows {
                        w.dequantize_row(o, &mut wrow);
                        for i in 0..n {
                            let want = dot_reference(m, o, &acts, i).unwrap();
                            let got = out[i * rows + o];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{fmt:?} {isa:?} {:?} {rows}x{cols} n={n} row {i} col {o}: {got} vs {want}",
                                m.wtype
                            );
                            let exact: f64 = wrow
                                .iter()
                                .zip(&xd[i * cols..(i + 1) * cols])
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum();
                            let scale: f64 = wrow
                                .iter()
                                .zip(&xd[i * cols..(i + 1) * cols])
                                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                                .sum();
                            // The offset term uses `sx` rounded to f16 as ggml's Q8_1 stores it
                            // (relative error ≤ 2⁻¹¹, plus 2⁻¹¹ from the unrounded `dx`).
                            let bb = fmt.block_bytes();
                            let offset_err: f64 = (0..cols / QK)
                                .map(|b| {
                                    if !fmt.has_min() {
                                        return 0.0;
                                    }
                                    let at = o * (cols / QK) * bb + b * bb;
                                    let raw = &w.bytes()[at..at + 4];
                                    let m = half::f16::from_le_bytes([raw[2], raw[3]]).to_f64();
                                    let sx: f64 = xd[i * cols + b * QK..i * cols + (b + 1) * QK]
                                        .iter()
                                        .map(|&v| v as f64)
                                        .sum();
                                    (m * sx).abs() * 2f64.powi(-10)
                                })
                                .sum();
                            assert!(
                                (got as f64 - exact).abs() <= 1e-5 * scale + offset_err + 1e-30,
                                "{fmt:?} {isa:?} row {i} col {o}: {got} vs {exact} (scale {scale})"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_matrices_equal_one_by_one() {
    for fmt in LegacyFormat::ALL {
        let (_, a) = matrices(fmt, 32, 256, 1);
        let (_, b) = matrices(fmt, 21, 256, 2);
        let n = 5;
        let x = activations(n, 256, 9);
        let (mut oa, mut ob) = (vec![0f32; n * 32], vec![0f32; n * 21]);
        matmul_many(&x, n, &[&a, &b], &mut [&mut oa, &mut ob]).unwrap();
        let (mut ea, mut eb) = (vec![0f32; n * 32], vec![0f32; n * 21]);
        specd_ops::matmul(&x, n, &a, &mut ea).unwrap();
        specd_ops::matmul(&x, n, &b, &mut eb).unwrap();
        assert_eq!(oa, ea);
        assert_eq!(ob, eb);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// A row's result does not depend on the batch around it (widths 1..16, any position), the
    /// thread count or the level.
    #[test]
    fn batch_invariant(
        f in 0usize..3,
        groups in 1usize..4,
        tail in 0usize..3,
        nb in 1usize..12,
        n in 1usize..17,
        pick in 0usize..1000,
        threads in 1usize..4,
    ) {
        let fmt = LegacyFormat::ALL[f];
        let (rows, cols) = (16 * groups + tail, nb * QK);
        let (_, p) = matrices(fmt, rows, cols, (f * 1000 + pick) as u64);
        let x = activations(n, cols, pick as u64);
        let i = pick % n;
        let alone = &x[i * cols..(i + 1) * cols];
        let mut first: Option<Vec<f32>> = None;
        for isa in Isa::available() {
            let pool = specd_ops::pool::Pool::new(threads).unwrap();
            let (mut batch, mut one) = (vec![0f32; n * rows], vec![0f32; rows]);
            pool.install(|| {
                matmul_with(isa, &x, n, &p, &mut batch).unwrap();
                matmul_with(isa, alone, 1, &p, &mut one).unwrap();
            });
            prop_assert_eq!(&batch[i * rows..(i + 1) * rows], &one[..], "{:?} {:?}", fmt, isa);
            match &first {
                None => first = Some(one),
                Some(f) => prop_assert_eq!(f, &one, "levels disagree: {:?}", isa),
            }
        }
    }
}
