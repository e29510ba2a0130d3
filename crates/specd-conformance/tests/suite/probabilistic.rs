//! Probabilistic verification (speculative rejection sampling) through the engine: model
//! drafters sample their drafts, runs repeat for a seed, rollback leaves exactly the emitted
//! tokens in memory, and every round it does not apply to stays exact.

use specd_backend::Backend;
use specd_backend::MemoryConfig;
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::{
    DrafterKind, Engine, RollbackKind, SeqOutput, SequenceRequest, SpecParams, StepEvent,
    VerifyKind,
};
use specd_testmodel::{Preset, WeightStyle};
use std::sync::{Arc, OnceLock};

use crate::BACKEND;
use specd_conformance::models::test_model;

struct Models {
    _dir: tempfile::TempDir,
    /// Qwen3.5 target with an MTP head.
    target: Arc<dyn Backend>,
    /// A different model with the same vocabulary, for `draft-simple`.
    draft: Arc<dyn Backend>,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        Models {
            target: test_model(
                BACKEND,
                d,
                "t.gguf",
                Preset::Qwen35Tiny,
                WeightStyle::Varied,
                1,
                true,
            ),
            // Varied like the target: a Repetitive model is near-deterministic where the target
            // is near-flat, and their distributions would hardly overlap (nothing accepted).
            draft: test_model(
                BACKEND,
                d,
                "d.gguf",
                Preset::Qwen35Tiny,
                WeightStyle::Varied,
                2,
                false,
            ),
            _dir: dir,
        }
    })
}

fn sampling(seed: u32) -> SamplerParams {
    SamplerParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        seed,
        ..SamplerParams::default()
    }
}

/// Sampling over the whole vocabulary: two random-weight models rarely share a top-40, and
/// disjoint supports reject every draft.
fn wide_sampling(seed: u32) -> SamplerParams {
    SamplerParams::unfiltered(seed)
}

fn spec(drafter: DrafterKind, verify: VerifyKind) -> SpecParams {
    SpecParams {
        drafters: vec![drafter],
        n_max: 4,
        // Fixed lengths: the adaptive controller's choices follow measured timings, and under
        // probabilistic verification the tokens depend on where rounds start.
        adaptive: false,
        // Random weights make the drafts unconfident: draft anyway.
        p_min: 0.0,
        ngram_n: 2,
        verify,
        ..SpecParams::default()
    }
}

fn request(sampler: SamplerParams, spec: SpecParams, draft: &Arc<dyn Backend>) -> SequenceRequest {
    let prompt: Vec<u32> = (0..10u32).map(|i| (i * 97 + 5) % 400).collect();
    let mut r = SequenceRequest::greedy(prompt, 40);
    r.sampler = sampler;
    r.ignore_eos = true;
    r.spec = spec;
    r.draft_model = Some(draft.clone());
    r
}

/// Runs one request step by step, checking after every step that the KV holds exactly the
/// emitted tokens (all but the last, which the next round feeds) and no checkpoint outlives
/// its round; at the end nothing is left.
fn run_checked(req: SequenceRequest, rb: RollbackKind) -> SeqOutput {
    let m = &models().target;
    let cfg = MemoryConfig {
        n_ctx: 256,
        max_seqs: 1,
        ..Default::default()
    };
    let mut e = Engine::new(m.clone(), cfg, rb).unwrap();
    let mut n_tokens = req.prompt.len();
    e.add(0, req).unwrap();
    let mut rounds = 0;
    loop {
        let mut done = None;
        for ev in e.step() {
            match ev {
                StepEvent::Tokens { tokens, .. } => n_tokens += tokens.len(),
                StepEvent::Finished { output, .. } => done = Some(*output),
                StepEvent::Failed { error, .. } => panic!("{error}"),
            }
        }
        rounds += 1;
        let u = e.memory().usage();
        if let Some(out) = done {
            assert_eq!(
                (u.sequences, u.kv_cells, u.checkpoints),
                (0, 0, 0),
                "{rb:?}: nothing left after the end"
            );
            return out;
        }
        assert_eq!(u.kv_cells, n_tokens - 1, "{rb:?} round {rounds}");
        assert_eq!(u.checkpoint_bytes, 0, "{rb:?} round {rounds}");
    }
}

fn check_stats(out: &SeqOutput, what: &str) {
    let s = &out.stats;
    assert!(s.drafts > 0, "{what}: {s:?}");
    assert_eq!(
        s.probabilistic_rounds, s.drafts,
        "{what}: every draft round is probabilistic: {s:?}"
    );
    assert!(s.accepted_tokens <= s.draft_tokens, "{what}: {s:?}");
    assert_eq!(
        s.accepted_per_position.iter().sum::<u64>(),
        s.accepted_tokens,
        "{what}: {s:?}"
    );
    assert!(
        s.accepted_per_position
            .iter()
            .zip(&s.drafted_per_position)
            .all(|(a, d)| a <= d),
        "{what}: {s:?}"
    );
    assert_eq!(out.tokens.len(), 40, "{what}");
}

#[test]
fn model_drafters_sample_and_runs_repeat_for_a_seed() {
    let m = models();
    for drafter in [DrafterKind::DraftSimple, DrafterKind::DraftMtp] {
        for rb in [
            RollbackKind::Replay,
            RollbackKind::Snapshot,
            RollbackKind::Checkpoint,
        ] {
            let what = format!("{} {rb:?}", drafter.name());
            let req = request(
                wide_sampling(11),
                spec(drafter, VerifyKind::Probabilistic),
                &m.draft,
            );
            let a = run_checked(req.clone(), rb);
            let b = run_checked(req, rb);
            assert_eq!(a.tokens, b.tokens, "{what}: same seed, same tokens");
            assert_eq!(a.stats, b.stats, "{what}");
            check_stats(&a, &what);
            // Both outcomes occur with random weights: the test exercises accept and reject.
            assert!(a.stats.accepted_tokens > 0, "{what}: {:?}", a.stats);
            assert!(a.stats.rollbacks_fast + a.stats.rollbacks_checkpoint > 0);
        }
        // Another seed gives another continuation.
        let with_seed = |seed| {
            run_checked(
                request(
                    wide_sampling(seed),
                    spec(drafter, VerifyKind::Probabilistic),
                    &m.draft,
                ),
                RollbackKind::Replay,
            )
        };
        assert_ne!(
            with_seed(11).tokens,
            with_seed(12).tokens,
            "{}",
            drafter.name()
        );
    }
}

#[test]
fn a_draft_model_equal_to_the_target_is_always_accepted() {
    // q = p at every position (penalties included, since the drafter's q sees the same
    // history), so min(1, p/q) = 1: a misaligned or differently shaped q would be rejected.
    let m = models();
    let sampler = SamplerParams {
        repeat_penalty: 1.3,
        repeat_last_n: 16,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        ..sampling(5)
    };
    let out = run_checked(
        request(
            sampler,
            spec(DrafterKind::DraftSimple, VerifyKind::Probabilistic),
            &m.target,
        ),
        RollbackKind::Replay,
    );
    check_stats(&out, "draft = target");
    assert_eq!(
        out.stats.accepted_tokens, out.stats.draft_tokens,
        "{:?}",
        out.stats
    );
}

#[test]
fn the_adaptive_controller_works_with_probabilistic_rounds() {
    let m = models();
    let mut sp = spec(DrafterKind::DraftSimple, VerifyKind::Probabilistic);
    sp.adaptive = true;
    let out = run_checked(request(sampling(3), sp, &m.draft), RollbackKind::Replay);
    let s = &out.stats;
    assert!(s.accepted_tokens <= s.draft_tokens, "{s:?}");
    assert!(s.probabilistic_rounds <= s.drafts, "{s:?}");
    assert_eq!(out.tokens.len(), 40);
}

/// Plain decoding of the same request.
fn plain(mut req: SequenceRequest) -> Vec<u32> {
    req.spec = SpecParams::default();
    run_checked(req, RollbackKind::Replay).tokens
}

#[test]
fn rounds_it_does_not_apply_to_stay_exact() {
    let m = models();
    // The default is exact: draft-model speculation reproduces plain decoding.
    for drafter in [DrafterKind::DraftSimple, DrafterKind::DraftMtp] {
        let req = request(sampling(21), spec(drafter, VerifyKind::Exact), &m.draft);
        let out = run_checked(req.clone(), RollbackKind::Replay);
        assert_eq!(out.tokens, plain(req), "{}", drafter.name());
        assert_eq!(out.stats.probabilistic_rounds, 0);
        assert!(out.stats.drafts > 0);
    }
    let cases = [
        // Greedy: rejection sampling degenerates to matching.
        (
            "greedy",
            SamplerParams::greedy(),
            DrafterKind::DraftSimple,
            None,
        ),
        // n-gram drafters have no distribution.
        ("ngram", sampling(21), DrafterKind::NgramSimple, None),
        // A grammar keeps exact matching.
        (
            "grammar",
            sampling(21),
            DrafterKind::DraftSimple,
            Some(GrammarSpec::Gbnf(
                "root ::= (word \" \")* \nword ::= [a-z_]+ | \"(\" | \")\" | [0-9]".into(),
            )),
        ),
    ];
    for (name, sampler, drafter, grammar) in cases {
        let mut req = request(sampler, spec(drafter, VerifyKind::Probabilistic), &m.draft);
        req.grammar = grammar;
        let out = run_checked(req.clone(), RollbackKind::Replay);
        assert_eq!(out.stats.probabilistic_rounds, 0, "{name}");
        assert_eq!(out.tokens, plain(req), "{name}");
    }
}

#[test]
fn banned_tokens_never_come_under_rejection_sampling() {
    let m = models();
    // The plain run's most frequent tokens, banned: drafts and residual draws must avoid them.
    let plain_out = plain(request(wide_sampling(21), SpecParams::default(), &m.draft));
    let mut banned: Vec<u32> = plain_out.clone();
    banned.sort_unstable();
    banned.dedup();
    banned.truncate(8);
    for drafter in [DrafterKind::DraftSimple, DrafterKind::DraftMtp] {
        let mut req = request(
            wide_sampling(21),
            spec(drafter, VerifyKind::Probabilistic),
            &m.draft,
        );
        req.logit_bias = banned.iter().map(|&t| (t, f32::NEG_INFINITY)).collect();
        let out = run_checked(req, RollbackKind::Replay);
        check_stats(&out, drafter.name());
        assert!(
            out.tokens.iter().all(|t| !banned.contains(t)),
            "{}: {:?} has one of {banned:?}",
            drafter.name(),
            out.tokens
        );
    }
}
