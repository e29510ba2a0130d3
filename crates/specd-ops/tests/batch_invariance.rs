//! Every kernel must give bit-identical per-row results whatever the batch around the row.

use proptest::prelude::*;
use specd_ops::attention::{attention, AttnShape};
use specd_ops::delta_net::{gated_delta_rule, GdnInputs, GdnShape};
use specd_ops::{matmul, matmul_with, Isa, Weight, WeightType};

fn lcg(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for v in b {
            out.push(((v * id).round() as i8) as u8);
        }
    }
    out
}

fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in b {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16 {
            let q0 = ((b[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((b[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
            out.push(q0 | (q1 << 4));
        }
    }
    out
}

/// IQ4_NL blocks: scale amax / 127, each value to its nearest level.
fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    let levels = specd_ops::kquant::IQ4_VALUES;
    let nearest = |v: f32| {
        (0..16)
            .min_by(|&a, &b| {
                (levels[a] as f32 - v)
                    .abs()
                    .total_cmp(&(levels[b] as f32 - v).abs())
            })
            .unwrap_or(0) as u8
    };
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16 {
            out.push(nearest(b[j] * id) | (nearest(b[j + 16] * id) << 4));
        }
    }
    out
}

fn weight(wt: WeightType, rows: usize, cols: usize, seed: u64) -> Weight {
    let mut r = lcg(seed);
    let data: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
    let bytes = match wt {
        WeightType::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        WeightType::F16 => data
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        WeightType::BF16 => data
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        WeightType::Q8_0 => quantize_q8_0(&data),
        WeightType::Q4_0 => quantize_q4_0(&data),
        WeightType::Q8_0R16 => {
            let q = Weight::from_bytes(WeightType::Q8_0, rows, cols, quantize_q8_0(&data)).unwrap();
            return specd_ops::pack::pack(&q).unwrap();
        }
        WeightType::Q4_0R16 => {
            let q = Weight::from_bytes(WeightType::Q4_0, rows, cols, quantize_q4_0(&data)).unwrap();
            return specd_ops::pack::pack(&q).unwrap();
        }
        WeightType::IQ4NL => quantize_iq4_nl(&data),
        WeightType::IQ4NLR16 => {
            let q =
                Weight::from_bytes(WeightType::IQ4NL, rows, cols, quantize_iq4_nl(&data)).unwrap();
            return specd_ops::pack::pack(&q).unwrap();
        }
        WeightType::K(_) | WeightType::KR16(_) => {
            unreachable!("the super-block formats have their own tests (tests/kquant.rs)")
        }
        WeightType::Legacy(_) | WeightType::LegacyR16(_) => {
            unreachable!("Q4_1 / Q5_0 / Q5_1 have their own tests (tests/legacy.rs)")
        }
    };
    Weight::from_bytes(wt, rows, cols, bytes).unwrap()
}

const TYPES: [WeightType; 9] = [
    WeightType::Q8_0R16,
    WeightType::Q4_0R16,
    WeightType::IQ4NLR16,
    WeightType::IQ4NL,
    WeightType::F32,
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q8_0,
    WeightType::Q4_0,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn matmul_rows_do_not_depend_on_the_batch(n in 1usize..40, ti in 0usize..TYPES.len(), seed in 0u64..1000, pick in 0usize..40, wide in any::<bool>()) {
        let wt = TYPES[ti];
        // 96 columns = an odd number of 32-blocks (the VNNI kernel's single-block tail).
        let (rows, cols) = (37, if wide { 128 } else { 96 });
        let w = weight(wt, rows, cols, seed);
        let mut r = lcg(seed + 7);
        let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
        let i = pick % n;
        for isa in Isa::available() {
            let mut all = vec![0f32; n * rows];
            matmul_with(isa, &x, n, &w, &mut all).unwrap();
            let mut one = vec![0f32; rows];
            matmul_with(isa, &x[i * cols..(i + 1) * cols], 1, &w, &mut one).unwrap();
            prop_assert_eq!(&all[i * rows..(i + 1) * rows], &one[..], "{:?}", isa);
        }
    }
}

#[test]
fn matmul_matches_dequantised_reference() {
    for (wt, isa, cols) in TYPES
        .into_iter()
        .flat_map(|t| Isa::available().into_iter().map(move |i| (t, i)))
        .flat_map(|(t, i)| [(t, i, 128), (t, i, 96)])
    {
        let (rows, n) = (19, 11);
        let w = weight(wt, rows, cols, 3);
        let mut r = lcg(11);
        let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
        let mut out = vec![0f32; n * rows];
        matmul_with(isa, &x, n, &w, &mut out).unwrap();
        let mut wf = vec![0f32; cols];
        for o in 0..rows {
            w.dequantize_row(o, &mut wf);
            for i in 0..n {
                let exact: f32 = wf.iter().zip(&x[i * cols..]).map(|(a, b)| a * b).sum();
                let got = out[i * rows + o];
                // Quantised types also quantise the activations to 8 bits.
                let tol = match wt {
                    WeightType::Q8_0
                    | WeightType::Q4_0
                    | WeightType::Q8_0R16
                    | WeightType::Q4_0R16
                    | WeightType::IQ4NL
                    | WeightType::IQ4NLR16 => 0.05 * (1.0 + exact.abs()),
                    _ => 1e-4 * (1.0 + exact.abs()),
                };
                assert!(
                    (got - exact).abs() < tol,
                    "{wt:?} {isa:?} {cols} row {i} out {o}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn interleaved_layouts_match_ggml_layouts_on_every_level() {
    // 16 and 48 rows: whole groups only; 23 and 37: a ggml-layout tail after the groups.
    for base in [WeightType::Q8_0, WeightType::Q4_0, WeightType::IQ4NL] {
        for (rows, cols) in [(16, 96), (23, 128), (37, 544), (48, 1056)] {
            let n = 19; // SIMD tiles of 8, 8, 3; on the AMX level tiles of 16 and 3
            let mut r = lcg(cols as u64);
            let data: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
            let bytes = match base {
                WeightType::Q8_0 => quantize_q8_0(&data),
                WeightType::IQ4NL => quantize_iq4_nl(&data),
                _ => quantize_q4_0(&data),
            };
            let q = Weight::from_bytes(base, rows, cols, bytes).unwrap();
            let p = specd_ops::pack::pack(&q).unwrap();
            assert_eq!(p.wtype.interleaved_from(), Some(base));
            assert_eq!(p.size_bytes(), q.size_bytes());
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for o in 0..rows {
                q.dequantize_row(o, &mut a);
                p.dequantize_row(o, &mut b);
                assert_eq!(a, b, "{base:?} row {o}");
            }
            let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
            let mut reference = vec![0f32; n * rows];
            matmul_with(Isa::Scalar, &x, n, &p, &mut reference).unwrap();
            for isa in Isa::available() {
                let (mut oq, mut op) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                matmul_with(isa, &x, n, &q, &mut oq).unwrap();
                matmul_with(isa, &x, n, &p, &mut op).unwrap();
                // Every level computes the interleaved layout with the same arithmetic.
                assert_eq!(op, reference, "{base:?} {isa:?} {rows}x{cols}");
                // Against ggml's layout: the same integer products, only the float summation
                // order differs.
                for (u, v) in oq.iter().zip(&op) {
                    assert!(
                        (u - v).abs() <= 1e-4 * (1.0 + u.abs()),
                        "{base:?} {isa:?} {rows}x{cols}: {u} vs {v}"
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let w = weight(WeightType::F32, 4, 8, 1);
    let mut out = vec![0f32; 4];
    assert!(matmul(&[0.0; 7], 1, &w, &mut out).is_err());
}

#[test]
fn attention_row_is_independent_of_other_rows() {
    let shape = AttnShape {
        n_head: 4,
        n_kv: 2,
        d_head: 16,
    };
    let n_pos = 9;
    let mut r = lcg(5);
    let kc: Vec<f32> = (0..n_pos * 2 * 16).map(|_| r()).collect();
    let vc: Vec<f32> = (0..n_pos * 2 * 16).map(|_| r()).collect();
    let q: Vec<f32> = (0..4 * 4 * 16).map(|_| r()).collect();
    let positions = [5u32, 6, 7, 8];
    let mut all = vec![0f32; q.len()];
    attention(&q, &positions, &kc, &vc, shape, 0.25, &mut all);
    for t in 0..4 {
        let mut one = vec![0f32; 64];
        attention(
            &q[t * 64..(t + 1) * 64],
            &positions[t..t + 1],
            &kc,
            &vc,
            shape,
            0.25,
            &mut one,
        );
        assert_eq!(&all[t * 64..(t + 1) * 64], &one[..]);
    }
}

/// Random queries for `t_len` rows at positions `depth..depth+t_len` over a random K/V cache.
struct AttnCase {
    q: Vec<f32>,
    kc: Vec<f32>,
    vc: Vec<f32>,
    positions: Vec<u32>,
    q_row: usize,
}

fn attn_case(shape: AttnShape, depth: usize, t_len: usize, seed: u64, q_scale: f32) -> AttnCase {
    let n_pos = depth + t_len;
    let kv_row = shape.n_kv * shape.d_head;
    let q_row = shape.n_head * shape.d_head;
    let mut r = lcg(seed);
    let kc: Vec<f32> = (0..n_pos * kv_row).map(|_| r()).collect();
    let vc: Vec<f32> = (0..n_pos * kv_row).map(|_| r()).collect();
    let q: Vec<f32> = (0..t_len * q_row).map(|_| q_scale * r()).collect();
    let positions: Vec<u32> = (depth..n_pos).map(|p| p as u32).collect();
    AttnCase {
        q,
        kc,
        vc,
        positions,
        q_row,
    }
}

/// A prefill-sized batch is cut into work units (KV head × chunk of queries, chunk boundaries
/// inside a row's GQA group); whatever the split — thread count, batch size — every row must
/// come out as when it is decoded alone.
#[test]
fn attention_is_independent_of_work_split() {
    let shape = AttnShape {
        n_head: 8,
        n_kv: 2,
        d_head: 24,
    };
    let t_len = 37;
    let c = attn_case(shape, 11, t_len, 17, 4.0);
    let (q, kc, vc, positions, q_row) = (c.q, c.kc, c.vc, c.positions, c.q_row);
    let alone: Vec<Vec<f32>> = (0..t_len)
        .map(|t| {
            let mut one = vec![0f32; q_row];
            attention(
                &q[t * q_row..(t + 1) * q_row],
                &positions[t..t + 1],
                &kc,
                &vc,
                shape,
                0.2,
                &mut one,
            );
            one
        })
        .collect();
    for threads in [1, 2, 3, 7] {
        let pool = specd_ops::pool::Pool::new(threads).expect("thread pool");
        for &(a, b) in &[(0, t_len), (3, 4), (5, 9), (20, t_len)] {
            let mut all = vec![0f32; (b - a) * q_row];
            pool.install(|| {
                attention(
                    &q[a * q_row..b * q_row],
                    &positions[a..b],
                    &kc,
                    &vc,
                    shape,
                    0.2,
                    &mut all,
                )
            });
            for t in a..b {
                let got = &all[(t - a) * q_row..(t - a + 1) * q_row];
                assert_eq!(got, &alone[t][..], "row {t} of {a}..{b}, {threads} threads");
            }
        }
    }
}

/// With an `f16` cache (keys, values or both), a row of a batch is still what it is alone, and
/// the result is what the same cache widened to `f32` gives.
#[test]
fn attention_over_an_f16_cache() {
    use half::f16;
    let shape = AttnShape {
        n_head: 4,
        n_kv: 2,
        d_head: 40,
    };
    let t_len = 5;
    let c = attn_case(shape, 70, t_len, 23, 3.0);
    let (q, kc, vc, positions, q_row) = (c.q, c.kc, c.vc, c.positions, c.q_row);
    let kh: Vec<f16> = kc.iter().map(|&x| f16::from_f32(x)).collect();
    let vh: Vec<f16> = vc.iter().map(|&x| f16::from_f32(x)).collect();
    let kw: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
    let vw: Vec<f32> = vh.iter().map(|x| x.to_f32()).collect();
    let mut wide = vec![0f32; t_len * q_row];
    attention(&q, &positions, &kw, &vw, shape, 0.3, &mut wide);
    let mut half_kv = vec![0f32; t_len * q_row];
    attention(&q, &positions, &kh, &vh, shape, 0.3, &mut half_kv);
    assert_eq!(wide, half_kv, "f16 cache = the same cache widened");
    let mut mixed = vec![0f32; t_len * q_row];
    attention(&q, &positions, &kh, &vw, shape, 0.3, &mut mixed);
    assert_eq!(wide, mixed, "f16 keys, f32 values");
    for t in 0..t_len {
        let mut one = vec![0f32; q_row];
        let qt = &q[t * q_row..(t + 1) * q_row];
        attention(qt, &positions[t..t + 1], &kh, &vh, shape, 0.3, &mut one);
        assert_eq!(&half_kv[t * q_row..(t + 1) * q_row], &one[..], "row {t}");
    }
}

#[test]
fn delta_rule_batch_equals_token_by_token() {
    let shape = GdnShape {
        n_k: 2,
        n_v: 4,
        d_k: 16,
        d_v: 16,
        tiled: true,
    };
    let t_len = 6;
    let mut r = lcg(9);
    let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| r()).collect() };
    let q = gen(t_len * 32);
    let k = gen(t_len * 32);
    let v = gen(t_len * 64);
    let decay: Vec<f32> = gen(t_len * 4).iter().map(|x| 0.5 + 0.4 * x).collect();
    let beta: Vec<f32> = gen(t_len * 4).iter().map(|x| 0.5 + 0.4 * x).collect();
    let s0 = gen(shape.state_len());
    let mut s_batch = vec![0f32; shape.state_len()];
    let mut o_batch = vec![0f32; t_len * 64];
    let mut snaps = vec![0f32; t_len * shape.state_len()];
    let inp = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        decay: &decay,
        beta: &beta,
    };
    gated_delta_rule(
        shape,
        &s0,
        &mut s_batch,
        inp,
        &mut o_batch,
        Some((&mut snaps, 0)),
    );
    let mut s = s0.clone();
    for t in 0..t_len {
        let inp = GdnInputs {
            q: &q[t * 32..(t + 1) * 32],
            k: &k[t * 32..(t + 1) * 32],
            v: &v[t * 64..(t + 1) * 64],
            decay: &decay[t * 4..(t + 1) * 4],
            beta: &beta[t * 4..(t + 1) * 4],
        };
        let mut next = vec![0f32; s.len()];
        let mut o = vec![0f32; 64];
        gated_delta_rule(shape, &s, &mut next, inp, &mut o, None);
        assert_eq!(&o[..], &o_batch[t * 64..(t + 1) * 64], "token {t}");
        assert_eq!(
            &next[..],
            &snaps[t * s.len()..(t + 1) * s.len()],
            "snapshot {t}"
        );
        s = next;
    }
    assert_eq!(s, s_batch);
}

#[test]
fn matmul_many_equals_one_matmul_per_matrix() {
    // Several matrices reading one input, as a layer's projections do: interleaved Q8_0 and
    // Q4_0 (with and without ggml-layout tails) fused into one region, and a set with an
    // un-interleaved matrix, which takes the one-call-per-matrix path.
    let cols = 160;
    let mut r = lcg(99);
    let mut make = |base: WeightType, rows: usize, pack: bool| {
        let data: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let bytes = match base {
            WeightType::Q8_0 => quantize_q8_0(&data),
            _ => quantize_q4_0(&data),
        };
        let q = Weight::from_bytes(base, rows, cols, bytes).unwrap();
        if pack {
            specd_ops::pack::pack(&q).unwrap()
        } else {
            q
        }
    };
    let fused = vec![
        make(WeightType::Q8_0, 48, true),
        make(WeightType::Q4_0, 23, true),
        make(WeightType::Q8_0, 16, true),
        make(WeightType::Q8_0, 5, true),
    ];
    let mixed = vec![
        make(WeightType::Q8_0, 32, true),
        make(WeightType::Q4_0, 19, false),
    ];
    for ws in [fused, mixed] {
        for n in [1, 3, 11] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
            let mut outs: Vec<&mut [f32]> = many.iter_mut().map(|v| v.as_mut_slice()).collect();
            let refs: Vec<&Weight> = ws.iter().collect();
            specd_ops::matmul_many(&x, n, &refs, &mut outs).unwrap();
            for (w, got) in ws.iter().zip(&many) {
                let mut one = vec![0f32; n * w.rows];
                specd_ops::matmul(&x, n, w, &mut one).unwrap();
                assert_eq!(&one, got, "{:?} {}x{} n={n}", w.wtype, w.rows, w.cols);
            }
        }
    }
    // Mismatched outputs are an error, not a panic.
    let w = make(WeightType::Q8_0, 16, true);
    let mut o = vec![0f32; 3];
    assert!(specd_ops::matmul_many(&[0.0; 160], 1, &[&w], &mut [&mut o]).is_err());
    assert!(specd_ops::matmul_many(&[0.0; 160], 1, &[&w, &w], &mut [&mut o]).is_err());
}
