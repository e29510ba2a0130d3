//! The MTP drafter mirrors the target into the head's cache incrementally; its drafts must equal
//! what the head gives when run from scratch over the whole sequence in one pass — through the
//! backend's MTP context, with hidden states passed as the backend's handles.

use crate::BACKEND;
use specd_backend::{Backend, Batch, HiddenRows, MemoryConfig};
use specd_conformance::LoadOptions;
use specd_spec::drafter::mtp::MtpDrafter;
use specd_spec::drafter::Drafter;
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::Arc;

fn model(preset: Preset, mtp: bool) -> (tempfile::TempDir, Arc<dyn Backend>) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TestModelSpec::preset(preset);
    spec.style = WeightStyle::Varied;
    spec.mtp = mtp;
    let p = dir.path().join("m.gguf");
    write_model(&spec, &p).unwrap();
    let m = BACKEND(&p, LoadOptions::default());
    (dir, m)
}

fn cfg() -> MemoryConfig {
    MemoryConfig {
        n_ctx: 256,
        max_seqs: 1,
        ..Default::default()
    }
}

/// The head's greedy draft for `tokens` (last token not yet decoded by the target), from scratch.
fn reference_draft(m: &dyn Backend, tokens: &[u32], n: usize) -> Vec<u32> {
    let p = tokens.len() - 1;
    let mut ctx = m.new_context(cfg()).unwrap();
    let mut b = Batch::from_tokens(&tokens[..p], 0, 0, false);
    b.want_hidden = true;
    let out = ctx.decode_new(&b).unwrap();
    // Row j pairs token j with the target hidden of position j-1 (zeros at 0).
    let target_h = out.hidden().unwrap();
    assert_eq!(target_h.len(), p);
    let prev = [HiddenRows::zeros(1), target_h];
    let mut head = m.new_mtp_context(cfg()).unwrap();
    let out = head.decode(tokens, 0, &prev).unwrap();
    let mut drafts = vec![out.top(0).0];
    let mut last = out.hidden().unwrap().slice(p, 1).unwrap();
    while drafts.len() < n {
        let tok = *drafts.last().unwrap();
        let out = head
            .decode(&[tok], p + drafts.len(), std::slice::from_ref(&last))
            .unwrap();
        drafts.push(out.top(0).0);
        last = out.hidden().unwrap();
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
    let (_d, m) = model(preset, true);
    assert!(m.info().has_mtp);
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 500).collect();
    let mut d = MtpDrafter::new(m.as_ref(), 256, 0.0).unwrap();
    let mut ctx = m.new_context(cfg()).unwrap();
    // Prompt of 8 tokens, then rounds that keep 1..4 tokens each, drafting before every round.
    let mut kept = 0;
    for step in [8usize, 1, 3, 2, 4, 1, 1, 3] {
        let upto = kept + step;
        let mut b = Batch::from_tokens(&seq[kept..upto], kept as u32, 0, false);
        b.want_hidden = true;
        let out = ctx.decode_new(&b).unwrap();
        let hidden = out.hidden().unwrap();
        assert_eq!(hidden.len(), step, "one hidden row per batch row");
        d.observe_target(&seq[kept..upto], kept, &hidden);
        kept = upto;
        let tokens = &seq[..=kept];
        assert_eq!(
            d.draft(tokens, 3).unwrap(),
            reference_draft(m.as_ref(), tokens, 3),
            "after {kept} kept"
        );
    }
}

/// Hidden states the drafter cannot place (a gap in positions) stop it drafting instead of
/// drafting from the wrong context.
#[test]
fn a_gap_in_the_target_rows_stops_the_drafter() {
    let (_d, m) = model(Preset::Qwen35Tiny, true);
    let seq: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % 500).collect();
    let mut d = MtpDrafter::new(m.as_ref(), 256, 0.0).unwrap();
    let mut ctx = m.new_context(cfg()).unwrap();
    let mut b = Batch::from_tokens(&seq[..8], 0, 0, false);
    b.want_hidden = true;
    let out = ctx.decode_new(&b).unwrap();
    let h = out.hidden().unwrap();
    // Reported from position 2 although the head has seen nothing.
    d.observe_target(&seq[2..8], 2, &h.slice(2, 6).unwrap());
    assert!(d.draft(&seq[..9], 3).unwrap().is_empty());
}

#[test]
fn a_model_without_mtp_head_is_refused() {
    let (_d, m) = model(Preset::Qwen35Tiny, false);
    assert!(!m.info().has_mtp);
    let e = MtpDrafter::new(m.as_ref(), 64, 0.0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("MTP"), "{e}");
    assert!(m.new_mtp_context(cfg()).is_err());
}
