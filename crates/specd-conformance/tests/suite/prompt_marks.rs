//! Checkpoint marks and prompt scoring at the engine level.
//!
//! * A prompt processed with marks (where the chat renderer says the next request will part from
//!   it) gives the same tokens as without, and a later prompt that shares it only up to a mark
//!   reuses exactly that much on a hybrid model — where without the mark it reuses nothing —
//!   and continues as a fresh engine would.
//! * Prompt scoring: the log-probabilities returned for a prompt equal teacher-forced decoding
//!   (each prompt position decoded alone, its logits' log-softmax at the next prompt token),
//!   whatever the size of the pieces the prompt is scored in.
//! * Speculation stays exact through it: a turn that resumes from a mark and then decodes
//!   speculatively gives the tokens a fresh engine gives without speculation (property test).

use crate::BACKEND;
use proptest::prelude::*;
use specd_backend::MemoryConfig;
use specd_backend::{Backend, Batch};
use specd_spec::{DrafterKind, Engine, RollbackKind, SeqOutput, SequenceRequest, SpecParams};
use specd_testmodel::{Preset, TestModelSpec, WeightStyle};
use std::sync::{Arc, OnceLock};

/// A tiny Qwen3.5 with an MTP head, prompts processed in pieces of 16 rows (so marks fall
/// inside pieces and pieces are cut at them).
fn model() -> Arc<dyn Backend> {
    static M: OnceLock<(tempfile::TempDir, Arc<dyn Backend>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = TestModelSpec::preset(Preset::Qwen35Tiny);
        spec.style = WeightStyle::Varied;
        spec.mtp = true;
        let m = specd_conformance::models::load_ubatch(BACKEND, dir.path(), "m.gguf", &spec, 16);
        (dir, m)
    })
    .1
    .clone()
}

fn engine(reuse: bool) -> Engine {
    engine_with(reuse, RollbackKind::Replay)
}

fn engine_with(reuse: bool, rollback: RollbackKind) -> Engine {
    let cfg = MemoryConfig {
        n_ctx: 256,
        max_seqs: 2,
        ..Default::default()
    };
    let mut e = Engine::new(model(), cfg, rollback).unwrap();
    e.set_prompt_cache(reuse, 8);
    e
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7 + 3 + salt) % 200 + 5)
        .collect()
}

fn run(e: &mut Engine, p: &[u32], marks: &[usize]) -> SeqOutput {
    let mut r = SequenceRequest::greedy(p.to_vec(), 8);
    r.checkpoints = marks.to_vec();
    e.generate(0, r).unwrap()
}

#[test]
fn marks_change_nothing_but_what_the_next_prompt_reuses() {
    let first = prompt(50, 0);
    let mark = 31;
    // The next turn shares the first prompt up to the mark, then parts.
    let mut second = first[..mark].to_vec();
    second.extend(prompt(20, 90));

    let mut plain = engine(true);
    let a = run(&mut plain, &first, &[]);
    let b = run(&mut plain, &second, &[]);
    assert_eq!(b.n_cached, 0, "no checkpoint within the shared prefix");

    let mut marked = engine(true);
    let a2 = run(&mut marked, &first, &[0, mark, 200]);
    assert_eq!(a.tokens, a2.tokens);
    let b2 = run(&mut marked, &second, &[]);
    assert_eq!(b2.n_cached, mark);
    assert_eq!(b.tokens, b2.tokens);

    // Without reuse marks are ignored.
    let mut off = engine(false);
    assert_eq!(run(&mut off, &first, &[mark]).tokens, a.tokens);
}

/// Log-softmax of `logits` at `token`, in f64.
fn logprob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[token as usize] as f64 - max - sum.ln()
}

#[test]
fn scored_prompts_match_teacher_forced_decoding() {
    let m = model();
    let p = prompt(70, 5);
    // Teacher forcing: one position at a time, the logits of each.
    let mut ctx = m
        .new_context(MemoryConfig {
            n_ctx: 256,
            max_seqs: 1,
            ..Default::default()
        })
        .unwrap();
    let mut expected = Vec::new();
    for (i, &t) in p[..p.len() - 1].iter().enumerate() {
        let out = ctx
            .decode_new(&Batch::from_tokens(&[t], i as u32, 0, true))
            .unwrap();
        expected.push(logprob(out.logits(0), p[i + 1]));
    }
    let mut e = engine(true);
    // Warm the slot: a scored prompt must not take reused positions (they have no logits).
    run(&mut e, &p, &[]);
    let mut r = SequenceRequest::greedy(p.clone(), 1);
    r.prompt_logprobs = Some(3);
    r.checkpoints = vec![20];
    let out = e.generate(0, r).unwrap();
    assert_eq!(out.n_cached, 0);
    assert_eq!(out.prompt_probs.len(), p.len() - 1);
    for (i, (got, want)) in out.prompt_probs.iter().zip(&expected).enumerate() {
        assert_eq!(got.token, p[i + 1]);
        assert!(
            (got.logprob as f64 - want).abs() < 1e-4,
            "position {i}: {} vs {want}",
            got.logprob
        );
        assert_eq!(got.top.len(), 3);
        assert!(got.top[0].1 >= got.logprob - 1e-6);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// A follow-up turn that shares the first prompt up to a mark reuses exactly that much and,
    /// decoded speculatively with any drafter and rollback kind, gives the tokens a fresh engine
    /// gives plainly.
    #[test]
    fn a_turn_resumed_from_a_mark_decodes_speculatively_as_a_fresh_one_plainly(
        first_len in 20usize..70,
        mark_at in 0.2f64..0.95,
        tail_len in 1usize..30,
        salt in 0u32..500,
        drafter in 0usize..3,
        rollback in 0usize..3,
        seed in proptest::option::of(0u32..1000),
        n_max in 1usize..6,
    ) {
        let first = prompt(first_len, salt);
        let mark = ((first_len as f64 * mark_at) as usize).max(1);
        let mut second = first[..mark].to_vec();
        second.extend(prompt(tail_len, salt + 77));
        // The next turn parts right at the mark (a tail may happen to continue the prompt).
        if second[mark] == first[mark] {
            second[mark] += 1;
        }
        let request = |p: &[u32]| {
            let mut r = SequenceRequest::greedy(p.to_vec(), 16);
            r.ignore_eos = true;
            if let Some(seed) = seed {
                r.sampler.temperature = 0.9;
                r.sampler.seed = seed;
            }
            r
        };

        let mut fresh = engine(false);
        let want = fresh.generate(0, request(&second)).unwrap();

        let rollback = [RollbackKind::Replay, RollbackKind::Snapshot, RollbackKind::Checkpoint][rollback];
        let mut e = engine_with(true, rollback);
        let mut r = request(&first);
        r.checkpoints = vec![mark];
        e.generate(0, r).unwrap();
        let mut r = request(&second);
        r.spec = SpecParams {
            n_max,
            adaptive: false,
            p_min: 0.0,
            ngram_n: 2,
            drafters: vec![DrafterKind::parse(["draft-mtp", "ngram-simple", "ngram-mod"][drafter]).unwrap()],
            ..SpecParams::default()
        };
        let got = e.generate(0, r).unwrap();
        prop_assert_eq!(got.n_cached, mark);
        prop_assert_eq!(got.tokens, want.tokens);
    }
}
