//! qwen35moe and qwen3next files: the merged gate/up expert tensor (and qwen3next's older fused
//! `ssm_in`) computes what the separate ones do, the test presets route tokens to varied
//! experts, and malformed MoE files are named errors.

use specd_gguf::{GgufFile, GgufValue, GgufWriter};
use specd_memory::{MemoryConfig, RollbackKind};
use specd_models::layers::moe::route;
use specd_models::{Batch, Model, ModelError, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec};
use std::collections::BTreeSet;
use std::path::Path;

fn opts() -> ModelOptions {
    ModelOptions {
        n_threads: 2,
        n_ubatch: 16,
    }
}

fn tiny(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("moe.gguf");
    write_model(&TestModelSpec::preset(Preset::Qwen35MoeTiny), &p).unwrap();
    p
}

/// Logits of every position of `tokens`, decoded as one batch.
fn logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = Model::load(path, opts()).unwrap();
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 64,
        max_seqs: 1,
        rollback: RollbackKind::Replay,
        ..Default::default()
    });
    m.decode(&mut mem, &Batch::from_tokens(tokens, 0, 0, true))
        .unwrap()
        .into_logits()
}

/// Copies `src` with each block's `ffn_gate_exps` and `ffn_up_exps` merged into one
/// `ffn_gate_up_exps` (per expert: its gate rows, then its up rows), as newer converters write.
fn merge_gate_up(src: &Path, dst: &Path) {
    let g = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone());
    }
    for t in g.tensors() {
        if t.name.contains("ffn_up_exps") {
            continue;
        }
        let bytes = g.tensor(&t.name).unwrap().bytes().to_vec();
        if let Some(blk) = t.name.strip_suffix("ffn_gate_exps.weight") {
            let up_name = format!("{blk}ffn_up_exps.weight");
            let up = g.tensor(&up_name).unwrap().bytes().to_vec();
            let n = t.dims[2] as usize;
            let per = bytes.len() / n;
            let mut merged = Vec::with_capacity(2 * bytes.len());
            for e in 0..n {
                merged.extend_from_slice(&bytes[e * per..(e + 1) * per]);
                merged.extend_from_slice(&up[e * per..(e + 1) * per]);
            }
            let dims = [t.dims[0], 2 * t.dims[1], t.dims[2]];
            w.add_tensor(
                &format!("{blk}ffn_gate_up_exps.weight"),
                &dims,
                t.ttype,
                merged,
            )
            .unwrap();
        } else {
            w.add_tensor(&t.name, &t.dims, t.ttype, bytes).unwrap();
        }
    }
    w.write(dst).unwrap();
}

#[test]
fn merged_gate_up_experts_compute_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let split = tiny(dir.path());
    let merged = dir.path().join("merged.gguf");
    merge_gate_up(&split, &merged);
    let g = GgufFile::open(&merged).unwrap();
    assert!(g.has_tensor("blk.0.ffn_gate_up_exps.weight"));
    assert!(!g.has_tensor("blk.0.ffn_gate_exps.weight"));
    let tokens = [5u32, 77, 301, 9, 512, 3, 44];
    let a = logits(&split, &tokens);
    let b = logits(&merged, &tokens);
    assert!(a == b, "merged gate/up changed the logits");
}

#[test]
fn the_presets_route_tokens_to_varied_experts() {
    // Router logits of raw token embeddings (the FFN sees them normed and mixed, but a router
    // that sent everything to the same experts would show here too).
    let dir = tempfile::tempdir().unwrap();
    let p = tiny(dir.path());
    let g = GgufFile::open(&p).unwrap();
    let spec = TestModelSpec::preset(Preset::Qwen35MoeTiny);
    let (h, ne, k) = (spec.n_embd, spec.n_expert, spec.n_expert_used);
    let emb = g.tensor("token_embd.weight").unwrap().to_f32().unwrap();
    let router = g
        .tensor("blk.0.ffn_gate_inp.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let mut chosen = BTreeSet::new();
    let mut firsts = BTreeSet::new();
    let mut sel = Vec::new();
    for t in 0..200 {
        let x = &emb[t * h..(t + 1) * h];
        let l: Vec<f32> = (0..ne)
            .map(|e| (0..h).map(|i| router[e * h + i] * x[i]).sum())
            .collect();
        route(&l, k, &mut sel);
        firsts.insert(sel[0].0);
        chosen.insert(sel.iter().map(|s| s.0).collect::<Vec<_>>());
    }
    assert_eq!(
        firsts.len(),
        ne,
        "every expert is some token's first choice"
    );
    assert!(chosen.len() > ne, "{} expert pairs", chosen.len());
}

/// What [`rewrite_err`] does to a metadata key.
enum Edit {
    Keep,
    Drop,
    Set(GgufValue),
}

fn rewrite_err(src: &Path, dst: &Path, kv: impl Fn(&str) -> Edit, drop_tensor: &str) -> ModelError {
    let g = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        match kv(k) {
            Edit::Keep => w.add(k, v.clone()),
            Edit::Drop => {}
            Edit::Set(nv) => w.add(k, nv),
        }
    }
    for t in g.tensors() {
        if t.name != drop_tensor {
            let bytes = g.tensor(&t.name).unwrap().bytes().to_vec();
            w.add_tensor(&t.name, &t.dims, t.ttype, bytes).unwrap();
        }
    }
    w.write(dst).unwrap();
    match Model::load(dst, opts()) {
        Ok(_) => panic!("malformed MoE model loaded"),
        Err(e) => e,
    }
}

#[test]
fn malformed_moe_files_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path());
    let dst = dir.path().join("bad.gguf");
    let key = |name: &'static str, edit: fn() -> Edit| {
        move |k: &str| if k == name { edit() } else { Edit::Keep }
    };
    let e = rewrite_err(&src, &dst, key("qwen35moe.expert_count", || Edit::Drop), "");
    assert!(e.to_string().contains("qwen35moe.expert_count"), "{e}");
    // More experts used than there are.
    let e = rewrite_err(
        &src,
        &dst,
        key("qwen35moe.expert_used_count", || {
            Edit::Set(GgufValue::U32(9))
        }),
        "",
    );
    assert!(e.to_string().contains("expert_used_count"), "{e}");
    // A missing expert tensor.
    let e = rewrite_err(&src, &dst, |_| Edit::Keep, "blk.2.ffn_down_exps.weight");
    assert!(e.to_string().contains("blk.2.ffn_down_exps.weight"), "{e}");
}

fn next_tiny(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("next.gguf");
    let mut spec = TestModelSpec::preset(Preset::Qwen3NextTiny);
    spec.mtp = true;
    write_model(&spec, &p).unwrap();
    p
}

/// Copies a qwen3next file with each DeltaNet's `attn_qkv` and `attn_gate` fused into one
/// `ssm_in`, grouped by key head (`q | k | v | z` per key head), as earlier converters wrote.
fn fuse_ssm_in(src: &Path, dst: &Path, spec: &TestModelSpec) {
    let g = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone());
    }
    let (nk, dk) = (spec.ssm_n_group, spec.ssm_d_state);
    let vg = spec.ssm_inner() / nk;
    for t in g.tensors() {
        if t.name.contains("attn_gate") {
            continue;
        }
        let bytes = g.tensor(&t.name).unwrap().bytes().to_vec();
        let Some(blk) = t.name.strip_suffix("attn_qkv.weight") else {
            w.add_tensor(&t.name, &t.dims, t.ttype, bytes).unwrap();
            continue;
        };
        let z = g
            .tensor(&format!("{blk}attn_gate.weight"))
            .unwrap()
            .bytes()
            .to_vec();
        let rb = bytes.len() / t.dims[1] as usize;
        let rows = |m: &[u8], r0: usize, n: usize| m[r0 * rb..(r0 + n) * rb].to_vec();
        let mut fused = Vec::new();
        for k in 0..nk {
            fused.extend(rows(&bytes, k * dk, dk));
            fused.extend(rows(&bytes, nk * dk + k * dk, dk));
            fused.extend(rows(&bytes, 2 * nk * dk + k * vg, vg));
            fused.extend(rows(&z, k * vg, vg));
        }
        let dims = [t.dims[0], (fused.len() / rb) as u64];
        w.add_tensor(&format!("{blk}ssm_in.weight"), &dims, t.ttype, fused)
            .unwrap();
    }
    w.write(dst).unwrap();
}

#[test]
fn qwen3next_fused_ssm_in_computes_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let split = next_tiny(dir.path());
    let fused = dir.path().join("fused.gguf");
    let spec = TestModelSpec::preset(Preset::Qwen3NextTiny);
    fuse_ssm_in(&split, &fused, &spec);
    let g = GgufFile::open(&fused).unwrap();
    assert!(g.has_tensor("blk.0.ssm_in.weight"));
    assert!(!g.has_tensor("blk.0.attn_qkv.weight"));
    let tokens = [5u32, 77, 301, 9, 512, 3, 44];
    let a = logits(&split, &tokens);
    let b = logits(&fused, &tokens);
    assert!(a == b, "the fused ssm_in changed the logits");
    let m = Model::load(&split, opts()).unwrap();
    assert!(m.has_mtp());
}

#[test]
fn qwen3next_routes_tokens_to_varied_experts_and_names_missing_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let p = next_tiny(dir.path());
    let g = GgufFile::open(&p).unwrap();
    let spec = TestModelSpec::preset(Preset::Qwen3NextTiny);
    let (h, ne, k) = (spec.n_embd, spec.n_expert, spec.n_expert_used);
    let emb = g.tensor("token_embd.weight").unwrap().to_f32().unwrap();
    let router = g
        .tensor("blk.1.ffn_gate_inp.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let mut firsts = BTreeSet::new();
    let mut sel = Vec::new();
    for t in 0..200 {
        let x = &emb[t * h..(t + 1) * h];
        let l: Vec<f32> = (0..ne)
            .map(|e| (0..h).map(|i| router[e * h + i] * x[i]).sum())
            .collect();
        route(&l, k, &mut sel);
        firsts.insert(sel[0].0);
    }
    assert_eq!(
        firsts.len(),
        ne,
        "every expert is some token's first choice"
    );
    let dst = dir.path().join("bad.gguf");
    for t in [
        "blk.0.ssm_ba.weight",
        "blk.0.attn_qkv.weight",
        "blk.4.ffn_gate_inp.weight",
    ] {
        let e = rewrite_err(&p, &dst, |_| Edit::Keep, t);
        assert!(e.to_string().contains(t), "{e}");
    }
}

/// K-quant experts (the Q4_K_M mix of qwen35moe-small: Q4_K gate/up, Q4_K or Q6_K down): a
/// token decoded alone (the one-row path, every selected expert's gate/up in one call) gets
/// the bits it gets as a row of a batch (experts grouped by the rows that chose them).
#[test]
fn k_quant_experts_give_one_row_the_bits_of_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("moe-q4km.gguf");
    let mut spec = TestModelSpec::preset(Preset::Qwen35MoeSmall);
    spec.mix = Some(specd_testmodel::Mix::Q4_K_M);
    write_model(&spec, &p).unwrap();
    let tokens: Vec<u32> = (0..12).map(|i| (i * 337 + 11) % 4000).collect();
    let batched = logits(&p, &tokens);
    let m = Model::load(&p, opts()).unwrap();
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 64,
        max_seqs: 1,
        rollback: RollbackKind::Replay,
        ..Default::default()
    });
    let nv = batched.len() / tokens.len();
    for (i, &t) in tokens.iter().enumerate() {
        let one = m
            .decode(&mut mem, &Batch::from_tokens(&[t], i as u32, 0, true))
            .unwrap()
            .into_logits();
        assert!(
            one == batched[i * nv..(i + 1) * nv],
            "position {i}: one-row logits differ from the batch's"
        );
    }
}
