//! Test models shared by the speculation tests.

use specd_gguf::TensorType;
use specd_models::{Model, ModelOptions};
use specd_testmodel::{write_model, Mix, Preset, TestModelSpec, WeightStyle};
use std::path::Path;
use std::sync::Arc;

/// Writes a generated model (`preset`, weight `style`, `seed`, with an MTP head if `mtp`) to
/// `dir/name` and loads it with 2 threads and 64-row prompt chunks.
#[allow(dead_code)] // each test file uses its own part of this module
pub fn test_model(
    dir: &Path,
    name: &str,
    preset: Preset,
    style: WeightStyle,
    seed: u64,
    mtp: bool,
) -> Arc<Model> {
    let mut spec = TestModelSpec::preset(preset);
    spec.style = style;
    spec.seed = seed;
    spec.mtp = mtp;
    load(dir, name, &spec)
}

/// A qwen35 model 256 wide (every matrix row whole 256-weight super-blocks) in the
/// `q4_k_xl` mix: Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL and Q8_0 matrices — every
/// native quantised kernel runs in it. With an MTP head. Same tokenizer as the tiny preset.
#[allow(dead_code)] // used by the exactness tests only
pub fn kquant_test_model(dir: &Path, name: &str, seed: u64) -> Arc<Model> {
    let mut spec = kquant_spec(seed);
    spec.mix = Some(Mix::Q4KXl);
    load(dir, name, &spec)
}

/// [`kquant_test_model`]'s shape (rows of whole super-blocks) with every matrix of one type
/// (`wtype`: the formats no mix holds — Q2_K, Q3_K, Q4_1, Q5_0, Q5_1 — get their kernels
/// exercised this way).
#[allow(dead_code)] // each test file uses its own part of this module
pub fn kquant_type_test_model(dir: &Path, name: &str, seed: u64, wtype: TensorType) -> Arc<Model> {
    let mut spec = kquant_spec(seed);
    spec.wtype = wtype;
    load(dir, name, &spec)
}

fn kquant_spec(seed: u64) -> TestModelSpec {
    let mut spec = TestModelSpec::preset(Preset::Qwen35Tiny);
    spec.n_embd = 256;
    spec.n_ff = 256;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.head_dim = 64;
    spec.n_rot = 16;
    spec.rope_sections = [3, 3, 2, 0];
    spec.ssm_d_state = 32;
    spec.ssm_n_group = 4;
    spec.ssm_n_v_heads = 8;
    spec.seed = seed;
    spec.mtp = true;
    spec
}

fn load(dir: &Path, name: &str, spec: &TestModelSpec) -> Arc<Model> {
    load_ubatch(dir, name, spec, 64)
}

/// Writes `spec` to `dir/name` and loads it, prompts processed in pieces of `n_ubatch` rows.
pub fn load_ubatch(dir: &Path, name: &str, spec: &TestModelSpec, n_ubatch: usize) -> Arc<Model> {
    let p = dir.join(name);
    write_model(spec, &p).unwrap();
    let opts = ModelOptions {
        n_threads: 2,
        n_ubatch,
    };
    Arc::new(Model::load(p, opts).unwrap())
}
