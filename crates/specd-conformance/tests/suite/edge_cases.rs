//! Edge cases of speculative rounds (docs/speculative.md §6) and the no-leak property.

use crate::BACKEND;
use specd_backend::MemoryConfig;
use specd_backend::{Backend, Batch};
use specd_conformance::models::test_model;
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::{
    DrafterKind, Engine, FinishReason, RollbackKind, SeqOutput, SequenceRequest, SpecParams,
    StepEvent,
};
use specd_testmodel::{Preset, WeightStyle};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

fn model() -> Arc<dyn Backend> {
    static M: OnceLock<(tempfile::TempDir, Arc<dyn Backend>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let m = test_model(
            BACKEND,
            dir.path(),
            "m.gguf",
            Preset::Qwen35Tiny,
            WeightStyle::Varied,
            42,
            false,
        );
        (dir, m)
    })
    .1
    .clone()
}

fn cfg(n_ctx: usize, max_seqs: usize) -> MemoryConfig {
    MemoryConfig {
        n_ctx,
        max_seqs,
        ..Default::default()
    }
}

fn synthetic(reference: Vec<u32>, rate: f32, n_max: usize) -> (SpecParams, Option<Arc<Vec<u32>>>) {
    let p = SpecParams {
        drafters: vec![DrafterKind::Synthetic],
        synth_rates: vec![rate; n_max],
        n_max,
        adaptive: false,
        ..SpecParams::default()
    };
    (p, Some(Arc::new(reference)))
}

fn generate(n_ctx: usize, req: SequenceRequest, rb: RollbackKind) -> SeqOutput {
    Engine::new(model(), cfg(n_ctx, 1), rb)
        .unwrap()
        .generate(0, req)
        .unwrap()
}

fn prompt() -> Vec<u32> {
    (0..12u32).map(|i| (i * 97 + 5) % 400).collect()
}

#[test]
fn draft_is_capped_by_context_and_token_budget() {
    for rb in [
        RollbackKind::Replay,
        RollbackKind::Snapshot,
        RollbackKind::Checkpoint,
    ] {
        // Context: 12 prompt tokens in a context of 30; drafts of 16 would overflow it.
        let mut plain = SequenceRequest::greedy(prompt(), 100);
        plain.ignore_eos = true;
        let base = generate(30, plain.clone(), rb);
        assert_eq!(base.reason, FinishReason::Context);
        let mut reference = prompt();
        reference.extend_from_slice(&base.tokens);
        reference.extend(std::iter::repeat_n(7, 40)); // drafts could run past the context
        let mut r = plain.clone();
        (r.spec, r.reference) = synthetic(reference.clone(), 1.0, 16);
        let out = generate(30, r, rb);
        assert_eq!(out.tokens, base.tokens, "{rb:?}");
        assert_eq!(out.reason, FinishReason::Context);
        // Budget: 5 tokens, drafts of 16.
        let mut r = plain.clone();
        r.n_predict = 5;
        (r.spec, r.reference) = synthetic(reference, 1.0, 16);
        let out = generate(256, r, rb);
        assert_eq!(out.tokens, base.tokens[..5], "{rb:?}");
        assert_eq!(out.reason, FinishReason::Limit);
    }
}

#[test]
fn stop_string_inside_a_draft_ends_there() {
    let mut plain = SequenceRequest::greedy(prompt(), 40);
    plain.ignore_eos = true;
    let base = generate(256, plain.clone(), RollbackKind::Replay);
    // A stop string taken from the middle of the plain output.
    let cut = base
        .text
        .char_indices()
        .nth(base.text.chars().count() / 2)
        .unwrap()
        .0;
    let stop: String = base.text[cut..].chars().take(3).collect();
    let mut stopped = plain.clone();
    stopped.stop = vec![stop.clone()];
    let expect = generate(256, stopped.clone(), RollbackKind::Replay);
    assert_eq!(expect.reason, FinishReason::Stop);
    assert!(!expect.text.contains(&stop) && base.text.starts_with(&expect.text));
    let mut reference = prompt();
    reference.extend_from_slice(&base.tokens);
    for rb in [RollbackKind::Replay, RollbackKind::Checkpoint] {
        let mut r = stopped.clone();
        (r.spec, r.reference) = synthetic(reference.clone(), 1.0, 12);
        let out = generate(256, r, rb);
        assert_eq!(
            (out.tokens.clone(), out.text.clone(), out.reason),
            (
                expect.tokens.clone(),
                expect.text.clone(),
                FinishReason::Stop
            )
        );
        assert_eq!(out.stop_word.as_deref(), Some(stop.as_str()));
    }
}

#[test]
fn end_of_generation_inside_a_draft_ends_there() {
    // A grammar makes the model end with EOS; the drafts continue past it with junk.
    let schema = GrammarSpec::JsonSchema(
        serde_json::json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}),
    );
    let mut plain = SequenceRequest::greedy(prompt(), 60);
    plain.grammar = Some(schema);
    let base = generate(256, plain.clone(), RollbackKind::Replay);
    assert_eq!(base.reason, FinishReason::Eos, "{:?}", base.text);
    let eos = model().tokenizer().eos_id().unwrap();
    let mut reference = prompt();
    reference.extend_from_slice(&base.tokens);
    reference.push(eos);
    reference.extend([11, 12, 13, 14, 15]);
    let mut r = plain.clone();
    (r.spec, r.reference) = synthetic(reference, 1.0, 16);
    let out = generate(256, r, RollbackKind::Replay);
    assert_eq!(
        (out.tokens, out.text, out.reason),
        (base.tokens, base.text, FinishReason::Eos)
    );
}

#[test]
fn a_refused_request_does_not_disturb_running_ones() {
    let mut a = SequenceRequest::greedy(prompt(), 24);
    a.ignore_eos = true;
    a.sampler = SamplerParams {
        temperature: 0.8,
        seed: 9,
        ..SamplerParams::default()
    };
    let alone = generate(256, a.clone(), RollbackKind::Replay);
    let mut e = Engine::new(model(), cfg(256, 4), RollbackKind::Replay).unwrap();
    e.add(0, a).unwrap();
    let mut out = None;
    let mut step = 0;
    while out.is_none() {
        if step == 3 {
            let mut bad = SequenceRequest::greedy(vec![1, 2, 3], 8);
            bad.grammar = Some(GrammarSpec::Regex("(".into()));
            assert!(e.add(1, bad).is_err());
            assert!(
                e.add(2, SequenceRequest::greedy(vec![u32::MAX], 8))
                    .is_err(),
                "token outside the vocabulary"
            );
            assert!(
                e.add(3, SequenceRequest::greedy(vec![1; 300], 8)).is_err(),
                "prompt over the context"
            );
        }
        for ev in e.step() {
            if let StepEvent::Finished { seq: 0, output } = ev {
                out = Some(output);
            }
        }
        step += 1;
    }
    assert_eq!(out.unwrap().tokens, alone.tokens);
}

/// Thousands of rounds with rejections on several sequences: after every step, the KV holds
/// exactly the accepted positions, no checkpoint outlives its round, and at the end nothing is
/// left.
#[test]
fn no_leaks_after_thousands_of_rounds() {
    let m = model();
    // KV bytes of one position, read off a context holding one.
    let per_pos = {
        let mut c = m.new_context(cfg(8, 1)).unwrap();
        c.decode_new(&Batch::from_tokens(&[1], 0, 0, false))
            .unwrap();
        c.usage().kv_bytes
    };
    for rb in [
        RollbackKind::Replay,
        RollbackKind::Snapshot,
        RollbackKind::Checkpoint,
    ] {
        let mut e = Engine::new(m.clone(), cfg(1024, 3), rb).unwrap();
        let mut expected: BTreeMap<u32, usize> = BTreeMap::new();
        for seq in 0..3u32 {
            let p: Vec<u32> = prompt().iter().map(|t| t + seq).collect();
            let mut r = SequenceRequest::greedy(p.clone(), 400);
            r.ignore_eos = true;
            // Random drafts over a reference that is mostly wrong: many partial rejections.
            let reference: Vec<u32> = p
                .iter()
                .copied()
                .chain((0..500u32).map(|i| (i * 31 + seq) % 300))
                .collect();
            (r.spec, r.reference) = synthetic(reference, 0.5, 6);
            e.add(seq, r).unwrap();
            expected.insert(seq, p.len());
        }
        let mut rounds = 0;
        while !e.is_idle() {
            for ev in e.step() {
                match ev {
                    StepEvent::Tokens { seq, tokens, .. } => {
                        *expected.get_mut(&seq).unwrap() += tokens.len()
                    }
                    StepEvent::Finished { seq, .. } => {
                        expected.remove(&seq);
                    }
                    StepEvent::Failed { error, .. } => panic!("{error}"),
                }
            }
            rounds += 1;
            let u = e.memory().usage();
            // Each live sequence holds its tokens but the last (not yet decoded).
            let want: usize = expected.values().map(|n| n - 1).sum();
            assert_eq!(u.kv_cells, want, "{rb:?} round {rounds}");
            assert_eq!(
                u.kv_bytes,
                want * per_pos,
                "KV rows match positions ({rb:?})"
            );
            assert_eq!(
                u.checkpoint_bytes, 0,
                "checkpoints are dropped each round ({rb:?})"
            );
        }
        assert!(rounds > 150, "{rounds}");
        let u = e.memory().usage();
        assert_eq!(
            (u.sequences, u.kv_cells, u.kv_bytes, u.checkpoints),
            (0, 0, 0, 0),
            "{rb:?}"
        );
    }
}

/// Prompt progress: two new sequences share one prefill batch processed in chunks of n_ubatch
/// (64) rows; each hears its start, every chunk that left it unfinished, and the first round
/// that fed its last prompt token — before its first token.
#[test]
fn prompt_progress_per_chunk() {
    use specd_spec::PromptProgress;
    let mut e = Engine::new(model(), cfg(512, 2), RollbackKind::Replay).unwrap();
    let p0: Vec<u32> = (0..100u32).map(|i| (i * 7 + 3) % 400).collect();
    let p1: Vec<u32> = (0..50u32).map(|i| (i * 11 + 1) % 400).collect();
    e.add(0, SequenceRequest::greedy(p0, 4)).unwrap();
    e.add(1, SequenceRequest::greedy(p1, 4)).unwrap();
    let mut seen: Vec<PromptProgress> = Vec::new();
    let events = e.step_with(&mut |p| seen.push(p), &|_| false);
    let of = |s: u32| -> Vec<usize> {
        seen.iter()
            .filter(|p| p.seq == s)
            .map(|p| p.processed)
            .collect()
    };
    // Batch rows: seq 0's 99 prefill rows, then seq 1's 49; chunks end at 64 and 128 (and 148).
    assert_eq!(of(0), vec![0, 64, 100]);
    assert_eq!(of(1), vec![0, 128 - 99, 50]);
    assert!(seen.iter().all(|p| p.cache == 0 && p.secs >= 0.0));
    assert!(seen.iter().filter(|p| p.seq == 0).all(|p| p.total == 100));
    assert!(events
        .iter()
        .any(|ev| matches!(ev, StepEvent::Tokens { seq: 0, .. })));
    // Later steps report nothing.
    let mut later = 0;
    e.step_with(&mut |_| later += 1, &|_| false);
    assert_eq!(later, 0);
}

#[test]
fn ignore_eos_bans_end_of_generation_tokens() {
    let m = model();
    let eog = m.tokenizer().eog_ids().to_vec();
    assert!(!eog.is_empty());
    let pull: Vec<(u32, f32)> = eog.iter().map(|&t| (t, 100.0)).collect();
    // A bias pulling hard towards EOG ends the generation at once…
    let mut req = SequenceRequest::greedy(vec![5, 9, 14], 8);
    req.logit_bias = pull.clone();
    let out = generate(64, req.clone(), RollbackKind::Replay);
    assert_eq!(out.reason, FinishReason::Eos);
    assert!(out.tokens.is_empty());
    // …but ignore_eos adds -inf to every EOG token (llama.cpp): they are never sampled.
    req.ignore_eos = true;
    let out = generate(64, req, RollbackKind::Replay);
    assert_eq!(out.reason, FinishReason::Limit);
    assert_eq!(out.tokens.len(), 8);
    assert!(
        out.tokens.iter().all(|t| !eog.contains(t)),
        "{:?}",
        out.tokens
    );
    assert_eq!(
        specd_spec::engine::logit_bias_with_eog(&[(3, 1.0)], true, &eog)[1..],
        eog.iter()
            .map(|&t| (t, f32::NEG_INFINITY))
            .collect::<Vec<_>>()[..]
    );
}

/// A client that leaves during prefill: the batch stops at the chunk where that is seen (here
/// the first, 64 rows), before any other sequence's rows are all in memory; the caller cancels
/// the one that left, and the other — part of its prompt in memory, the rest not — resumes in
/// the next step and generates exactly what it generates alone, plain and speculative, with
/// each rollback kind, and with an MTP-style drafter that reads the prompt's hidden states.
#[test]
fn a_prefill_stopped_for_a_client_that_left_resumes_the_others_exactly() {
    let stay: Vec<u32> = (0..150u32).map(|i| (i * 13 + 5) % 400).collect();
    let leave: Vec<u32> = (0..300u32).map(|i| (i * 7 + 2) % 400).collect();
    let ngram = SpecParams {
        drafters: vec![DrafterKind::NgramSimple],
        n_max: 4,
        ..SpecParams::default()
    };
    for (spec, rb) in [
        (SpecParams::default(), RollbackKind::Replay),
        (ngram.clone(), RollbackKind::Replay),
        (ngram, RollbackKind::Snapshot),
    ] {
        let req = || SequenceRequest {
            spec: spec.clone(),
            ..SequenceRequest::greedy(stay.clone(), 24)
        };
        let alone = generate(512, req(), rb);
        let mut e = Engine::new(model(), cfg(512, 2), rb).unwrap();
        e.add(0, req()).unwrap();
        e.add(1, SequenceRequest::greedy(leave.clone(), 4)).unwrap();
        let mut seen = Vec::new();
        // Seq 1's client has gone from the start; the first chunk still runs.
        let events = e.step_with(&mut |p| seen.push(p), &|s| s == 1);
        assert!(events.is_empty(), "{rb:?}: {events:?}");
        assert_eq!(
            seen.iter()
                .map(|p| (p.seq, p.processed))
                .collect::<Vec<_>>(),
            vec![(0, 0), (1, 0), (0, 64)],
            "{rb:?}"
        );
        e.cancel(1);
        let mut out = None;
        while out.is_none() {
            for ev in e.step() {
                match ev {
                    StepEvent::Finished { seq: 0, output } => out = Some(output),
                    StepEvent::Failed { error, .. } => panic!("{rb:?}: {error}"),
                    _ => {}
                }
            }
        }
        let out = out.unwrap();
        assert_eq!(out.tokens, alone.tokens, "{rb:?}");
        assert_eq!(out.n_prompt, 150);
        assert_eq!(out.n_cached, 0);
    }
}
