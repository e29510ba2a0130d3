//! Loading a model from a file that is wrong at the model level (shapes, architecture, keys,
//! tensor types) fails with an error naming the tensor or key — and a K-quant file loads and
//! computes exactly what its dequantised weights compute.

use specd_gguf::quant::{dequantize, quantize};
use specd_gguf::{GgufFile, GgufValue, GgufWriter, TensorType};
use specd_memory::MemoryConfig;
use specd_models::{Batch, Model, ModelError, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

type Tensor = (Vec<u64>, TensorType, Vec<u8>);

/// Copies a GGUF file, letting `kv` and `tensor` change or drop (`None`) entries.
fn rewrite(
    src: &Path,
    dst: &Path,
    mut kv: impl FnMut(&str, GgufValue) -> Option<GgufValue>,
    mut tensor: impl FnMut(&str, Tensor) -> Option<Tensor>,
) {
    let g = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if let Some(v) = kv(k, v.clone()) {
            w.add(k, v);
        }
    }
    for t in g.tensors() {
        let bytes = g.tensor(&t.name).unwrap().bytes().to_vec();
        if let Some((dims, tt, b)) = tensor(&t.name, (t.dims.clone(), t.ttype, bytes)) {
            w.add_tensor(&t.name, &dims, tt, b).unwrap();
        }
    }
    w.write(dst).unwrap();
}

struct Files {
    dir: tempfile::TempDir,
    llama: PathBuf,
    qwen: PathBuf,
}

fn files() -> &'static Files {
    static F: OnceLock<Files> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let llama = dir.path().join("llama.gguf");
        let qwen = dir.path().join("qwen.gguf");
        write_model(&TestModelSpec::preset(Preset::LlamaTiny), &llama).unwrap();
        write_model(&TestModelSpec::preset(Preset::Qwen35Tiny), &qwen).unwrap();
        Files { dir, llama, qwen }
    })
}

fn opts() -> ModelOptions {
    ModelOptions {
        n_threads: 1,
        n_ubatch: 16,
    }
}

/// Loads `src` rewritten by `kv`/`tensor` and returns the error.
fn load_err(
    src: &Path,
    tag: &str,
    kv: impl FnMut(&str, GgufValue) -> Option<GgufValue>,
    tensor: impl FnMut(&str, Tensor) -> Option<Tensor>,
) -> ModelError {
    let dst = files().dir.path().join(format!("{tag}.gguf"));
    rewrite(src, &dst, kv, tensor);
    match Model::load(&dst, opts()) {
        Ok(_) => panic!("{tag}: malformed model loaded"),
        Err(e) => e,
    }
}

fn keep_kv(_: &str, v: GgufValue) -> Option<GgufValue> {
    Some(v)
}
fn keep_t(_: &str, t: Tensor) -> Option<Tensor> {
    Some(t)
}

fn assert_names(e: &ModelError, what: &str) {
    assert!(
        e.to_string().contains(what),
        "error '{e}' does not name '{what}'"
    );
}

#[test]
fn unmodified_copies_load() {
    let f = files();
    for src in [&f.llama, &f.qwen] {
        let dst = f.dir.path().join("copy.gguf");
        rewrite(src, &dst, keep_kv, keep_t);
        assert!(Model::load(&dst, opts()).is_ok());
    }
}

#[test]
fn tensor_of_the_wrong_shape_is_named() {
    let f = files();
    // llama: blk.0.attn_q.weight is [64, 64]; give it [64, 32].
    let e = load_err(&f.llama, "shape-llama", keep_kv, |n, (dims, tt, b)| {
        if n == "blk.0.attn_q.weight" {
            assert_eq!(dims, vec![64, 64]);
            Some((vec![64, 32], tt, b[..b.len() / 2].to_vec()))
        } else {
            Some((dims, tt, b))
        }
    });
    assert!(
        matches!(
            &e,
            ModelError::Gguf(specd_gguf::GgufError::TensorShape { .. })
        ),
        "{e:?}"
    );
    assert_names(&e, "blk.0.attn_q.weight");
    assert_names(&e, "[64, 64]");
    assert_names(&e, "[64, 32]");
    // qwen35: the gated query of the attention layer (blk.3) without its gate half, and a GDN
    // projection with its rows and columns swapped.
    for name in ["blk.3.attn_q.weight", "blk.0.attn_qkv.weight"] {
        let e = load_err(&f.qwen, "shape-qwen", keep_kv, |n, (dims, tt, b)| {
            if n == name {
                if name.contains("attn_q.") {
                    Some((vec![dims[0], dims[1] / 2], tt, b[..b.len() / 2].to_vec()))
                } else {
                    Some((vec![dims[1], dims[0]], tt, b))
                }
            } else {
                Some((dims, tt, b))
            }
        });
        assert_names(&e, name);
    }
}

#[test]
fn missing_tensor_is_named() {
    let f = files();
    for (src, name) in [
        (&f.llama, "blk.1.ffn_down.weight"),
        (&f.qwen, "blk.2.ssm_conv1d.weight"),
        (&f.qwen, "output_norm.weight"),
    ] {
        let e = load_err(src, "missing-tensor", keep_kv, |n, t| {
            (n != name).then_some(t)
        });
        assert_names(&e, name);
        assert_names(&e, "missing");
    }
}

#[test]
fn unknown_and_unsupported_architectures() {
    let f = files();
    let with_arch = |arch: &'static str| {
        move |k: &str, v: GgufValue| {
            Some(if k == "general.architecture" {
                GgufValue::String(arch.into())
            } else {
                v
            })
        }
    };
    let e = load_err(&f.qwen, "arch-unknown", with_arch("gpt-foo"), keep_t);
    assert!(matches!(e, ModelError::UnknownArch(_)), "{e:?}");
    assert_names(&e, "'gpt-foo'");
    for arch in ["qwen3moe", "gemma3"] {
        let e = load_err(&f.qwen, "arch-moe", with_arch(arch), keep_t);
        assert!(matches!(e, ModelError::UnsupportedArch(_)), "{e:?}");
        assert_names(&e, arch);
        assert_names(&e, "not supported yet");
    }
    // No architecture at all.
    let e = load_err(
        &f.llama,
        "arch-none",
        |k, v| (k != "general.architecture").then_some(v),
        keep_t,
    );
    assert_names(&e, "general.architecture");
}

#[test]
fn missing_and_mistyped_keys_are_named() {
    let f = files();
    for (src, key) in [
        (&f.llama, "llama.embedding_length"),
        (&f.qwen, "qwen35.ssm.state_size"),
        (&f.qwen, "qwen35.rope.dimension_sections"),
        (&f.qwen, "qwen35.attention.layer_norm_rms_epsilon"),
        (&f.qwen, "tokenizer.ggml.tokens"),
    ] {
        let e = load_err(src, "missing-key", |k, v| (k != key).then_some(v), keep_t);
        assert_names(&e, key);
        assert_names(&e, "missing");
    }
    for (src, key) in [
        (&f.qwen, "qwen35.block_count"),
        (&f.qwen, "qwen35.attention.layer_norm_rms_epsilon"),
        (&f.llama, "llama.attention.head_count"),
    ] {
        let e = load_err(
            src,
            "mistyped-key",
            |k, v| {
                Some(if k == key {
                    GgufValue::String("4".into())
                } else {
                    v
                })
            },
            keep_t,
        );
        assert_names(&e, key);
    }
}

#[test]
fn hyper_parameters_that_would_load_but_generate_nothing_are_named() {
    let f = files();
    for (key, bad, tag) in [
        (
            "qwen35.attention.layer_norm_rms_epsilon",
            GgufValue::F32(f32::NAN),
            "eps-nan",
        ),
        (
            "qwen35.attention.layer_norm_rms_epsilon",
            GgufValue::F32(0.0),
            "eps-0",
        ),
        ("qwen35.rope.freq_base", GgufValue::F32(0.0), "rope-base-0"),
        (
            "qwen35.rope.freq_base",
            GgufValue::F32(f32::INFINITY),
            "rope-base-inf",
        ),
        ("qwen35.context_length", GgufValue::U32(0), "ctx-0"),
        (
            "qwen35.rope.dimension_count",
            GgufValue::U32(0),
            "rope-dims-0",
        ),
    ] {
        let e = load_err(
            &f.qwen,
            tag,
            |k, v| Some(if k == key { bad.clone() } else { v }),
            keep_t,
        );
        assert_names(&e, key);
    }
}

#[test]
fn unsupported_tensor_type_is_named() {
    let f = files();
    // Q8_1: a real ggml type (36-byte blocks of 32) that specd cannot decode (llama.cpp uses it
    // only for activations).
    let e = load_err(&f.llama, "q8_1", keep_kv, |n, (dims, tt, b)| {
        if n == "blk.0.ffn_up.weight" {
            let blocks = (dims[0] * dims[1] / 32) as usize;
            Some((dims, TensorType::Q8_1, vec![0; blocks * 36]))
        } else {
            Some((dims, tt, b))
        }
    });
    assert_names(&e, "blk.0.ffn_up.weight");
    assert_names(&e, "q8_1");
}

/// Logits of `tokens` decoded as one batch from a fresh sequence.
fn logits(path: &Path, tokens: &[u32]) -> Vec<Vec<f32>> {
    let m = Model::load(path, opts()).unwrap();
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 64,
        max_seqs: 1,
        ..Default::default()
    });
    let out = m
        .decode(&mut mem, &Batch::from_tokens(tokens, 0, 0, true))
        .unwrap();
    (0..tokens.len()).map(|i| out.logits(i).to_vec()).collect()
}

#[test]
fn k_quant_weights_load_and_compute_their_dequantised_values() {
    // Native kernels: the super-block formats, IQ4_NL, Q4_1 / Q5_0 / Q5_1.
    let types = [
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
        TensorType::IQ4_XS,
        TensorType::IQ4_NL,
        TensorType::Q2_K,
        TensorType::Q3_K,
    ];
    quantised_model_matches_its_values("native", &types, 0.03);
}

/// A llama model 256 wide, so its matrices are whole super-blocks. Two copies: one with the
/// matrices in `types` (round robin), one with F32 matrices holding exactly the values those
/// blocks dequantise to. The quantised kernels quantise activations to 8 bits (as llama.cpp
/// does), so the logits must be close to the F32 model's — within `tol` of the largest logit —
/// not identical.
fn quantised_model_matches_its_values(tag: &str, types: &[TensorType], tol: f32) {
    let f = files();
    let mut spec = TestModelSpec::preset(Preset::LlamaTiny);
    spec.n_embd = 256;
    spec.n_ff = 256;
    let base = f.dir.path().join(format!("llama256-{tag}.gguf"));
    write_model(&spec, &base).unwrap();
    let kq = f.dir.path().join(format!("llama256-{tag}-q.gguf"));
    let deq = f.dir.path().join(format!("llama256-{tag}-deq.gguf"));
    let mut i = 0;
    let mut converted = Vec::new();
    rewrite(&base, &kq, keep_kv, |n, (dims, tt, b)| {
        if dims.len() == 2 && dims[0] % 256 == 0 && n.starts_with("blk.") {
            let t = types[i % types.len()];
            i += 1;
            let mut x = vec![0f32; b.len() / 4];
            dequantize(tt, &b, &mut x).unwrap();
            converted.push(n.to_string());
            Some((dims, t, quantize(t, &x).unwrap()))
        } else {
            Some((dims, tt, b))
        }
    });
    assert!(
        converted.len() >= types.len(),
        "too few matrices converted: {converted:?}"
    );
    rewrite(&kq, &deq, keep_kv, |_, (dims, tt, b)| {
        if types.contains(&tt) {
            let n = dims.iter().product::<u64>() as usize;
            let mut x = vec![0f32; n];
            dequantize(tt, &b, &mut x).unwrap();
            Some((
                dims,
                TensorType::F32,
                x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ))
        } else {
            Some((dims, tt, b))
        }
    });
    let g = GgufFile::open(&kq).unwrap();
    for t in types {
        assert!(g.tensors().iter().any(|i| i.ttype == *t), "no {t} tensor");
    }
    let tokens = [5, 77, 300, 12, 900, 4];
    let a = logits(&kq, &tokens);
    let b = logits(&deq, &tokens);
    for (ra, rb) in a.iter().zip(&b) {
        let scale = rb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = ra
            .iter()
            .zip(rb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{tag}: max |logit error| {err} (max |logit| {scale})");
        assert!(
            err <= tol * scale,
            "{tag}: logits off by {err} (scale {scale})"
        );
    }
    // And the quantisation is visible: the quantised model is not the original one.
    assert_ne!(a, logits(&base, &tokens));
}
