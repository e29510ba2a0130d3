//! Files whose matrices are in a type specd can decode but has no kernel for (IQ1 / IQ2 / IQ3
//! codebooks, ternary TQ1_0 / TQ2_0, MXFP4) load by conversion: each such matrix becomes the
//! native type that holds it (Q4_K for the IQ types, Q4_0 — exactly — for the ternary ones, Q8_0
//! for MXFP4), with one warning per tensor, never F32 — and the loaded model computes exactly what a file holding the
//! converted matrices computes (the decoded values requantised; TQ, MXFP4 and IQ3_S re-expressed
//! without requantising).

use specd_gguf::quant::{dequantize, quantize};
use specd_gguf::{GgufFile, GgufWriter, TensorType};
use specd_memory::MemoryConfig;
use specd_models::{Batch, Model, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

const TYPES: [TensorType; 10] = [
    TensorType::IQ2_XXS,
    TensorType::IQ2_XS,
    TensorType::IQ2_S,
    TensorType::IQ3_XXS,
    TensorType::IQ3_S,
    TensorType::IQ1_S,
    TensorType::IQ1_M,
    TensorType::TQ1_0,
    TensorType::TQ2_0,
    TensorType::MXFP4,
];

/// The native type a file's `t` matrix is converted to.
fn target(t: TensorType) -> TensorType {
    match t {
        TensorType::MXFP4 => TensorType::Q8_0,
        TensorType::TQ1_0 | TensorType::TQ2_0 => TensorType::Q4_0,
        _ => TensorType::Q4_K,
    }
}

/// Q4_0 holding the ternary values `x` (levels −1, 0, 1, and 2 in TQ2_0, times each 256-block's scale `d`) exactly:
/// built here from the decoded values, independently of the loader's conversion.
fn ternary_as_q4_0(x: &[f32], scales: &[half::f16]) -> Vec<u8> {
    let mut out = Vec::new();
    for (g, chunk) in x.chunks_exact(32).enumerate() {
        let d = scales[g / 8];
        out.extend_from_slice(&d.to_le_bytes());
        let q = |v: f32| {
            let l = if d.to_f32() == 0.0 {
                0.0
            } else {
                v / d.to_f32()
            };
            // TQ2_0's 2-bit codes also allow level 2 (llama.cpp never writes it; random blocks do).
            assert!(
                l == l.round() && (-1.0..=2.0).contains(&l),
                "{v} is not ternary"
            );
            (l as i8 + 8) as u8
        };
        out.extend((0..16).map(|j| q(chunk[j]) | q(chunk[j + 16]) << 4));
    }
    out
}

/// splitmix64: deterministic test bytes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// `n` elements of type `t` as random blocks (every payload bit pattern is a valid block) whose
/// scales are set so the weights stay below about 0.05, like a real model's.
fn random_blocks(t: TensorType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let (bs, ts) = t.block();
    let mut out = Vec::with_capacity(n / bs * ts);
    for _ in 0..n / bs {
        let mut b: Vec<u8> = (0..ts).map(|_| rng.next() as u8).collect();
        // (byte offset of the f16 scale, its value): the largest step × grid value ≈ 0.05.
        let (at, d) = match t {
            TensorType::IQ2_XXS | TensorType::IQ2_XS | TensorType::IQ2_S => (0, 3e-4),
            TensorType::IQ3_XXS | TensorType::IQ3_S => (0, 1e-4),
            TensorType::IQ1_S => (0, 3e-3),
            TensorType::TQ1_0 => (52, 0.05),
            TensorType::TQ2_0 => (64, 0.05),
            TensorType::IQ1_M => {
                // The f16 is spread over the top nibbles of the four u16 scale words.
                let bits = half::f16::from_f32(3e-3).to_bits();
                for k in 0..4 {
                    let hi = 48 + 2 * k + 1;
                    b[hi] = (b[hi] & 0x0f) | (((bits >> (4 * k)) & 0xf) as u8) << 4;
                }
                out.extend_from_slice(&b);
                continue;
            }
            TensorType::MXFP4 => {
                b[0] = 120; // step 2^-8: weights up to 12·2^-8 ≈ 0.047
                out.extend_from_slice(&b);
                continue;
            }
            _ => unreachable!("{t} is not a decode-only type"),
        };
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out
}

/// Copies `src` to `dst` with every tensor passed through `f(name, dims, type, bytes)`.
fn rewrite(
    src: &Path,
    dst: &Path,
    mut f: impl FnMut(&str, &[u64], TensorType, Vec<u8>) -> (TensorType, Vec<u8>),
) {
    let g = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone());
    }
    for t in g.tensors() {
        let bytes = g.tensor(&t.name).unwrap().bytes().to_vec();
        let (tt, b) = f(&t.name, &t.dims, t.ttype, bytes);
        w.add_tensor(&t.name, &t.dims, tt, b).unwrap();
    }
    w.write(dst).unwrap();
}

/// Captures what the code under `f` logs on this thread.
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf(Arc::new(Mutex::new(Vec::new())));
    let w = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    let out = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (out, text)
}

fn opts() -> ModelOptions {
    ModelOptions {
        n_threads: 1,
        n_ubatch: 16,
    }
}

/// Greedy continuation of `prompt` (`n` tokens) and every logit row computed on the way.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 64,
        max_seqs: 1,
        ..Default::default()
    });
    let out = m
        .decode(&mut mem, &Batch::from_tokens(prompt, 0, 0, true))
        .unwrap();
    let mut rows: Vec<Vec<f32>> = (0..prompt.len()).map(|i| out.logits(i).to_vec()).collect();
    let mut toks = Vec::new();
    for step in 0..n {
        let last = rows.last().unwrap();
        let next = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap() as u32;
        toks.push(next);
        let pos = (prompt.len() + step) as u32;
        let out = m
            .decode(&mut mem, &Batch::from_tokens(&[next], pos, 0, true))
            .unwrap();
        rows.push(out.logits(0).to_vec());
    }
    (toks, rows)
}

#[test]
fn decode_only_types_load_by_conversion_to_native_types() {
    let dir = tempfile::tempdir().unwrap();
    // 256 wide, so the matrices are whole super-blocks.
    let mut spec = TestModelSpec::preset(Preset::LlamaTiny);
    spec.n_embd = 256;
    spec.n_ff = 256;
    let base = dir.path().join("base.gguf");
    write_model(&spec, &base).unwrap();

    // The file under test: the layers' matrices in the ten types, round robin.
    let iq = dir.path().join("iq.gguf");
    let mut rng = Rng(15);
    // (tensor, type, bytes in the file, elements)
    let mut placed: Vec<(String, TensorType, usize, usize)> = Vec::new();
    rewrite(&base, &iq, |name, dims, tt, b| {
        if dims.len() == 2 && dims[0] % 256 == 0 && name.starts_with("blk.") {
            let t = TYPES[placed.len() % TYPES.len()];
            let n = (dims[0] * dims[1]) as usize;
            let bytes = random_blocks(t, n, &mut rng);
            placed.push((name.to_string(), t, bytes.len(), n));
            (t, bytes)
        } else {
            (tt, b)
        }
    });
    for t in TYPES {
        assert!(placed.iter().any(|p| p.1 == t), "no {t} matrix placed");
    }
    // The reference: the same matrices decoded and quantised to their conversion target.
    let reference = dir.path().join("reference.gguf");
    rewrite(&iq, &reference, |_, dims, tt, b| {
        if TYPES.contains(&tt) {
            let mut x = vec![0f32; (dims[0] * dims[1]) as usize];
            dequantize(tt, &b, &mut x).unwrap();
            assert!(x.iter().all(|v| v.is_finite() && v.abs() < 0.1));
            let to = target(tt);
            if to == TensorType::Q4_0 {
                let at = if tt == TensorType::TQ1_0 { 52 } else { 64 };
                let scales: Vec<half::f16> = b
                    .chunks_exact(tt.type_size())
                    .map(|blk| half::f16::from_le_bytes([blk[at], blk[at + 1]]))
                    .collect();
                return (to, ternary_as_q4_0(&x, &scales));
            }
            if tt == TensorType::MXFP4 {
                // Q8_0 with each block's power-of-two step as `d` and the E2M1 levels as quants.
                let mut q8 = Vec::new();
                for (blk, vals) in b.chunks_exact(17).zip(x.chunks_exact(32)) {
                    let step = 2f32.powi(blk[0] as i32 - 128);
                    q8.extend_from_slice(&half::f16::from_f32(step).to_le_bytes());
                    for &v in vals {
                        let l = v / step;
                        assert!(
                            l == l.round() && l.abs() <= 12.0,
                            "{v} is not an E2M1 level"
                        );
                        q8.push(l as i8 as u8);
                    }
                }
                return (to, q8);
            }
            if tt == TensorType::IQ3_S {
                // Converted by re-expressing its scales (checked against the decoded values in
                // specd-models' unit tests), not requantised.
                let q4 = specd_models::iq3s_q4k::iq3_s_as_q4_k(&b).unwrap().unwrap();
                let mut y = vec![0f32; x.len()];
                dequantize(to, &q4, &mut y).unwrap();
                let off = x
                    .iter()
                    .zip(&y)
                    .fold(0f32, |m, (a, c)| m.max((a - c).abs()));
                // Only Q4_K's f16 dmin = 15·d is rounded: ≤ 465·d·2^-11 (d = 1e-4), against
                // ~3e-3 (half a Q4_K step) for a requantisation.
                assert!(
                    off <= 465.0 * 1e-4 * 2f32.powi(-11),
                    "IQ3_S as Q4_K off by {off}"
                );
                return (to, q4);
            }
            (to, quantize(to, &x).unwrap())
        } else {
            (tt, b)
        }
    });

    let (m, log) = logged(|| Model::load(&iq, opts()));
    let m = m.unwrap();
    // One warning per converted tensor: tensor, from-type, to-type, bytes before -> after.
    for (name, t, n_bytes, _) in &placed {
        let to = target(*t);
        let line = log
            .lines()
            .find(|l| l.contains(&format!("tensor {name}: ")))
            .unwrap_or_else(|| panic!("no warning for {name} in:\n{log}"));
        assert!(line.contains("WARN"), "{line}");
        let want = format!("{t} has no native kernel, converted to {to} at load ({n_bytes} -> ");
        assert!(line.contains(&want), "{line}\nwanted: {want}");
    }
    assert_eq!(
        log.lines().filter(|l| l.contains("converted to")).count(),
        placed.len(),
        "{log}"
    );

    let r = Model::load(&reference, opts()).unwrap();
    // Held as the native types, not widened to F32.
    assert_eq!(m.weight_bytes(), r.weight_bytes());
    // The converted matrices take well under half their F32 size (Q4_K, Q4_0: 4.5 bits, Q8_0: 8.5).
    let f32_model = Model::load(&base, opts()).unwrap();
    let as_f32: usize = placed.iter().map(|p| 4 * p.3).sum();
    assert!(
        m.weight_bytes() + as_f32 / 2 < f32_model.weight_bytes(),
        "{} bytes converted vs {} as F32 ({as_f32} of them the converted matrices)",
        m.weight_bytes(),
        f32_model.weight_bytes()
    );

    // Decodes, without NaN, exactly what the reference file computes.
    let prompt = [5, 77, 300, 12, 900, 4];
    let (toks, rows) = greedy(&m, &prompt, 6);
    let (rtoks, rrows) = greedy(&r, &prompt, 6);
    assert!(rows.iter().flatten().all(|v| v.is_finite()));
    assert_eq!(toks, rtoks);
    for (a, b) in rows.iter().zip(&rrows) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    // And the weights matter: the model is not the F32 one it was made from.
    assert_ne!(rows, greedy(&f32_model, &prompt, 6).1);
}
