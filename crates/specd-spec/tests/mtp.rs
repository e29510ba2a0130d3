//! The MTP drafter mirrors the target into the head's cache incrementally; its drafts must equal
//! what the head gives when run from scratch over the whole sequence in one pass.

use specd_memory::MemoryConfig;
use specd_models::{Batch, Model, ModelOptions};
use specd_spec::drafter::mtp::MtpDrafter;
use specd_spec::drafter::Drafter;
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::Arc;

fn model(preset: Preset) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TestModelSpec::preset(preset);
    spec.style = WeightStyle::Varied;
    spec.mtp = true;
    let p = dir.path().join("m.gguf");
    write_model(&spec, &p).unwrap();
    (
        dir,
        Arc::new(
            Model::load(
                &p,
                ModelOptions {
                    n_threads: 2,
                    n_ubatch: 64,
                },
            )
            .unwrap(),
        ),
    )
}

/// The head's greedy draft for `tokens` (last token not yet decoded by the target), from scratch.
fn reference_draft(m: &Model, tokens: &[u32], n: usize) -> Vec<u32> {
    let h = m.config().n_embd;
    let p = tokens.len() - 1;
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 256,
        max_seqs: 1,
        ..Default::default()
    });
    let mut b = Batch::from_tokens(&tokens[..p], 0, 0, false);
    b.want_hidden = true;
    let out = m.decode(&mut mem, &b).unwrap();
    // Row j pairs token j with the target hidden of position j-1 (zeros at 0).
    let mut hs = vec![0f32; h];
    hs.extend_from_slice(&out.hidden[..p * h]);
    let mut mtp_mem = m
        .new_mtp_memory(MemoryConfig {
            n_ctx: 256,
            max_seqs: 1,
            ..Default::default()
        })
        .unwrap();
    let (hm, logits) = m.decode_mtp(&mut mtp_mem, 0, tokens, 0, &hs).unwrap();
    let argmax = |l: &[f32]| {
        l.iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32
    };
    let mut drafts = vec![argmax(&logits)];
    let mut prev = hm[p * h..].to_vec();
    while drafts.len() < n {
        let (hm, logits) = m
            .decode_mtp(
                &mut mtp_mem,
                0,
                &[*drafts.last().unwrap()],
                p + drafts.len(),
                &prev,
            )
            .unwrap();
        prev = hm;
        drafts.push(argmax(&logits));
    }
    drafts
}

#[test]
fn incremental_mirror_equals_one_pass() {
    mirror_equals_one_pass(Preset::Qwen35Tiny);
}

/// The MoE MTP block (router, experts, gated shared expert as its FFN).
#[test]
fn incremental_mirror_equals_one_pass_on_moe() {
    mirror_equals_one_pass(Preset::Qwen35MoeTiny);
}

/// Qwen3-Next's MTP block (NEOX rotary, MoE FFN).
#[test]
fn incremental_mirror_equals_one_pass_on_qwen3next() {
    mirror_equals_one_pass(Preset::Qwen3NextTiny);
}

fn mirror_equals_one_pass(preset: Preset) {
    let (_d, m) = model(preset);
    assert!(m.has_mtp());
    let h = m.config().n_embd;
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 500).collect();
    let mut d = MtpDrafter::new(m.clone(), 256, 0.0).unwrap();
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 256,
        max_seqs: 1,
        ..Default::default()
    });
    // Prompt of 9 tokens, then rounds that keep 1..4 tokens each, drafting before every round.
    let mut kept = 0;
    let mut n_prompt = 9;
    for step in [8usize, 1, 3, 2, 4, 1, 1, 3] {
        let upto = kept + step;
        let mut b = Batch::from_tokens(&seq[kept..upto], kept as u32, 0, false);
        b.want_hidden = true;
        let out = m.decode(&mut mem, &b).unwrap();
        d.observe_target(&seq[kept..upto], kept, &out.hidden[..step * h]);
        kept = upto;
        let tokens = &seq[..=kept];
        assert_eq!(
            d.draft(tokens, 3).unwrap(),
            reference_draft(&m, tokens, 3),
            "after {kept} kept"
        );
        n_prompt = n_prompt.max(kept);
    }
    assert!(n_prompt > 9);
}

#[test]
fn a_model_without_mtp_head_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TestModelSpec::preset(Preset::Qwen35Tiny);
    let p = dir.path().join("m.gguf");
    write_model(&spec, &p).unwrap();
    let m = Arc::new(
        Model::load(
            &p,
            ModelOptions {
                n_threads: 1,
                n_ubatch: 64,
            },
        )
        .unwrap(),
    );
    assert!(!m.has_mtp());
    let e = MtpDrafter::new(m, 64, 0.0).err().unwrap().to_string();
    assert!(e.contains("MTP"), "{e}");
}
