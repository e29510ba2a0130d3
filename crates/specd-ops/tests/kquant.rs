//! The super-block kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS): decoding against gguf-py's dequantisation,
//! every instruction-set level against the scalar reference bit for bit and against a float
//! reference on the dequantised weights, and batch invariance (width, position, threads).

use proptest::prelude::*;
use specd_ops::kquant::{dot_reference, quantize_row_k, KActs, KFormat, QK_K};
use specd_ops::{matmul_many, matmul_with, Isa, Weight, WeightType};
use std::path::PathBuf;

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Random super-blocks of `fmt`: any bit pattern is a valid block once its f16 factors are
/// small finite numbers.
fn random_blocks(fmt: KFormat, n: usize, seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed);
    let mut b: Vec<u8> = (0..n * fmt.block_bytes())
        .map(|_| (r() >> 24) as u8)
        .collect();
    let at: &[usize] = match fmt {
        KFormat::Q4K | KFormat::Q5K => &[0, 2],
        KFormat::Q6K => &[208],
        KFormat::IQ4XS => &[0],
        KFormat::Q2K => &[80, 82],
        KFormat::Q3K => &[108],
    };
    for blk in b.chunks_exact_mut(fmt.block_bytes()) {
        for &p in at {
            let v = 2e-3 * (0.25 + (blk[p] as f32) / 256.0);
            blk[p..p + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    b
}

fn activations(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = xorshift(seed);
    (0..n * cols)
        .map(|i| {
            let u = (r() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            // Rows of different magnitudes, an outlier now and then.
            u * 10f32.powi((i / cols % 3) as i32 - 1) * if i % 97 == 0 { 8.0 } else { 1.0 }
        })
        .collect()
}

/// The matrix in ggml layout and its interleaved repack.
fn matrices(fmt: KFormat, rows: usize, cols: usize, seed: u64) -> (Weight, Weight) {
    let raw = random_blocks(fmt, rows * cols / QK_K, seed);
    let w = Weight::from_bytes(WeightType::K(fmt), rows, cols, raw).unwrap();
    let p = specd_ops::pack::for_current_isa(&w).unwrap();
    (w, p)
}

fn levels() -> Vec<Isa> {
    Isa::available()
}

#[test]
fn decoding_matches_gguf_py() {
    // Fixtures written by scripts/gen_kquant_fixtures.py: raw blocks and gguf-py's values,
    // computed with the same f32 operations as ours, so the comparison is exact.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../specd-gguf/tests/fixtures");
    for (name, fmt) in [
        ("q4_k", KFormat::Q4K),
        ("q5_k", KFormat::Q5K),
        ("q6_k", KFormat::Q6K),
        ("q2_k", KFormat::Q2K),
        ("q3_k", KFormat::Q3K),
    ] {
        let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let expected: Vec<f32> = std::fs::read(dir.join(format!("{name}.expected.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n = blocks.len() / fmt.block_bytes();
        let w = Weight::from_bytes(WeightType::K(fmt), n, QK_K, blocks).unwrap();
        let mut row = vec![0f32; QK_K];
        for r in 0..n {
            w.dequantize_row(r, &mut row);
            for (i, (a, b)) in row.iter().zip(&expected[r * QK_K..]).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{name} block {r} value {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn repacked_rows_dequantise_like_the_file() {
    for fmt in KFormat::ALL {
        let (w, p) = matrices(fmt, 40, 512, 11);
        assert_eq!(p.wtype, WeightType::KR16(fmt));
        let (mut a, mut b) = (vec![0f32; 512], vec![0f32; 512]);
        for r in 0..40 {
            w.dequantize_row(r, &mut a);
            p.dequantize_row(r, &mut b);
            assert_eq!(a, b, "{fmt:?} row {r}");
        }
    }
}

#[test]
fn iq4_xs_decodes_its_table() {
    // One hand-made block: d = 1, sub-block 0 scale 33 (33 − 32 = 1), all indices 15 (113) in the
    // low nibbles and 0 (−127) in the high ones.
    let mut b = vec![0u8; 136];
    b[0..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    b[2..4].copy_from_slice(&0b10u16.to_le_bytes()); // scales_h: sub-block 0 top bits = 2
    b[4] = 0x01; // scales_l: sub-block 0 low bits = 1 → ls = 33
    for q in &mut b[8..24] {
        *q = 0x0f;
    }
    let w = Weight::from_bytes(WeightType::K(KFormat::IQ4XS), 1, QK_K, b).unwrap();
    let mut row = vec![0f32; QK_K];
    w.dequantize_row(0, &mut row);
    assert!(row[..16].iter().all(|&v| v == 113.0), "{:?}", &row[..16]);
    assert!(
        row[16..32].iter().all(|&v| v == -127.0),
        "{:?}",
        &row[16..32]
    );
    // ls = 0 → scale −32; index 0 → −127.
    assert!(row[32..64].iter().all(|&v| v == -32.0 * -127.0));
}

/// Every level, every tile (AMX's included), tails included: bit-identical to the scalar
/// reference, and close to the float dot product of the dequantised weights with the dequantised
/// activations.
#[test]
fn kernels_match_reference_on_every_level() {
    for fmt in KFormat::ALL {
        for &(rows, cols, n) in &[
            (48, 256, 9),
            (37, 512, 3),
            (16, 768, 1),
            (5, 256, 2),
            (32, 256, 6),
            // The AMX level's wide tiles: 13 rows, 16, and 16 + 5 (AMX then VNNI).
            (32, 256, 13),
            (32, 512, 16),
            (16, 768, 21),
        ] {
            let (w, p) = matrices(fmt, rows, cols, (rows * cols + n) as u64);
            let x = activations(n, cols, 5);
            let acts = KActs::new(&x, n, cols);
            // The activations as the kernels see them.
            let mut xd = vec![0f32; n * cols];
            for i in 0..n {
                let (mut q, mut d) = (vec![0i8; cols], vec![0f32; cols / QK_K]);
                let (mut b16, mut b32) = (vec![0i16; cols / 16], vec![0i16; cols / 32]);
                quantize_row_k(
                    &x[i * cols..(i + 1) * cols],
                    &mut q,
                    &mut d,
                    &mut b16,
                    &mut b32,
                );
                for c in 0..cols {
                    xd[i * cols + c] = q[c] as f32 * d[c / QK_K];
                }
            }
            let mut wrow = vec![0f32; cols];
            for isa in levels() {
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
                            assert!(
                                (got as f64 - exact).abs() <= 1e-5 * scale + 1e-30,
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
    for fmt in KFormat::ALL {
        let (_, a) = matrices(fmt, 32, 512, 1);
        let (_, b) = matrices(fmt, 21, 512, 2);
        let n = 5;
        let x = activations(n, 512, 9);
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
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// A row's result does not depend on the batch around it, the thread count or the level.
    #[test]
    fn batch_invariant(
        f in 0usize..KFormat::ALL.len(),
        groups in 1usize..4,
        tail in 0usize..3,
        nbk in 1usize..4,
        n in 1usize..20,
        pick in 0usize..1000,
        threads in 1usize..4,
    ) {
        let fmt = KFormat::ALL[f];
        let (rows, cols) = (16 * groups + tail, nbk * QK_K);
        let (_, p) = matrices(fmt, rows, cols, (f * 1000 + pick) as u64);
        let x = activations(n, cols, pick as u64);
        let i = pick % n;
        let alone = &x[i * cols..(i + 1) * cols];
        let mut first: Option<Vec<f32>> = None;
        for isa in levels() {
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
