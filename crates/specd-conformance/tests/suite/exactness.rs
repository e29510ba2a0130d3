//! The property that sells specd: generated tokens are identical with and without speculation,
//! for every drafter, every rollback path, every sampler, any number of parallel sequences.

use proptest::prelude::*;
use specd_backend::Backend;
use specd_backend::{KvType, MemoryConfig};
use specd_gguf::TensorType;
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::{DrafterKind, Engine, RollbackKind, SequenceRequest, SpecParams, StepEvent};
use specd_testmodel::{Preset, WeightStyle};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::BACKEND;
use specd_conformance::models::{kquant_test_model, kquant_type_test_model, test_model};

struct Models {
    _dir: tempfile::TempDir,
    hybrid: Arc<dyn Backend>,
    repetitive: Arc<dyn Backend>,
    llama: Arc<dyn Backend>,
    /// Quantised in a K-quant mix: every native quantised kernel.
    kquant: Arc<dyn Backend>,
    /// All Q2_K / all Q3_K matrices.
    q2_k: Arc<dyn Backend>,
    q3_k: Arc<dyn Backend>,
    /// Every matrix Q4_1, Q5_0, Q5_1 (one model each).
    block32: [Arc<dyn Backend>; 3],
    /// qwen35moe: the rows of a verification batch route to different experts.
    moe: Arc<dyn Backend>,
    /// qwen3next: MoE, NEOX rotary, DeltaNet value heads grouped by key head.
    next: Arc<dyn Backend>,
    draft: Arc<dyn Backend>,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // The Qwen3.5 family's models (dense, MoE, Qwen3-Next) carry an MTP head, so
        // `draft-mtp` is exercised too.
        Models {
            hybrid: test_model(
                BACKEND,
                d,
                "h.gguf",
                Preset::Qwen35Tiny,
                WeightStyle::Varied,
                1,
                true,
            ),
            repetitive: test_model(
                BACKEND,
                d,
                "r.gguf",
                Preset::Qwen35Tiny,
                WeightStyle::Repetitive,
                2,
                true,
            ),
            llama: test_model(
                BACKEND,
                d,
                "l.gguf",
                Preset::LlamaTiny,
                WeightStyle::Repetitive,
                3,
                false,
            ),
            kquant: kquant_test_model(BACKEND, d, "k.gguf", 5),
            q2_k: kquant_type_test_model(BACKEND, d, "k2.gguf", 7, TensorType::Q2_K),
            q3_k: kquant_type_test_model(BACKEND, d, "k3.gguf", 8, TensorType::Q3_K),
            block32: [TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1]
                .map(|t| kquant_type_test_model(BACKEND, d, &format!("{t}.gguf"), 9, t)),
            moe: test_model(
                BACKEND,
                d,
                "m.gguf",
                Preset::Qwen35MoeTiny,
                WeightStyle::Varied,
                6,
                true,
            ),
            next: test_model(
                BACKEND,
                d,
                "n.gguf",
                Preset::Qwen3NextTiny,
                WeightStyle::Varied,
                7,
                true,
            ),
            draft: test_model(
                BACKEND,
                d,
                "d.gguf",
                Preset::Qwen35Tiny,
                WeightStyle::Repetitive,
                4,
                true,
            ),
            _dir: dir,
        }
    })
}

fn sampler(kind: usize, seed: u32) -> SamplerParams {
    match kind {
        0 => SamplerParams::greedy(),
        1 => SamplerParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed,
            ..SamplerParams::default()
        },
        2 => SamplerParams {
            temperature: 1.2,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerParams::default()
        },
        _ => SamplerParams {
            temperature: 0.7,
            repeat_penalty: 1.3,
            repeat_last_n: 16,
            presence_penalty: 0.4,
            frequency_penalty: 0.2,
            seed,
            ..SamplerParams::default()
        },
    }
}

/// Runs all requests together in one engine; returns each sequence's tokens.
fn run(
    model: &Arc<dyn Backend>,
    reqs: Vec<SequenceRequest>,
    rollback: RollbackKind,
) -> Vec<Vec<u32>> {
    run_kv(model, reqs, rollback, KvType::F32, false)
}

/// [`run`] with the KV cache stored as `kv` (keys and values); `reuse`: with the prompt cache
/// on, so that the requests' checkpoint marks take effect (finished sequences then keep their
/// memory).
fn run_kv(
    model: &Arc<dyn Backend>,
    reqs: Vec<SequenceRequest>,
    rollback: RollbackKind,
    kv: KvType,
    reuse: bool,
) -> Vec<Vec<u32>> {
    let cfg = MemoryConfig {
        n_ctx: 256,
        max_seqs: 8,
        kv_type_k: kv,
        kv_type_v: kv,
        ..Default::default()
    };
    let mut e = Engine::new(model.clone(), cfg, rollback).unwrap();
    e.set_prompt_cache(reuse, 4);
    let n = reqs.len();
    for (i, r) in reqs.into_iter().enumerate() {
        e.add(i as u32, r).unwrap();
    }
    let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    while out.len() < n {
        for ev in e.step() {
            match ev {
                StepEvent::Finished { seq, output } => {
                    out.insert(seq, output.tokens);
                }
                StepEvent::Failed { error, .. } => panic!("{error}"),
                StepEvent::Tokens { .. } => {}
            }
        }
    }
    if !reuse {
        assert_eq!(
            e.memory().usage().kv_cells,
            0,
            "finished sequences keep no memory"
        );
    }
    out.into_values().collect()
}

const DRAFTERS: [&str; 10] = [
    "draft-mtp",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "synthetic-right",
    "synthetic-wrong",
    "synthetic-half",
    "draft-simple",
];

fn spec_for(name: &str, n_max: usize) -> SpecParams {
    let mut p = SpecParams {
        n_max,
        adaptive: false,
        ngram_n: 2,
        ..SpecParams::default()
    };
    match name {
        "synthetic-right" => {
            p.drafters = vec![DrafterKind::Synthetic];
            p.synth_rates = vec![1.0; n_max];
        }
        "synthetic-wrong" => {
            p.drafters = vec![DrafterKind::Synthetic];
            p.synth_rates = vec![0.0; n_max];
        }
        "synthetic-half" => {
            p.drafters = vec![DrafterKind::Synthetic];
            p.synth_rates = specd_spec::drafter::synthetic::rates_for_per_token(0.5, n_max);
        }
        "draft-simple" | "draft-mtp" => {
            p.drafters = vec![DrafterKind::parse(name).unwrap()];
            // Random weights make the drafts unconfident: draft anyway, so rollbacks happen.
            p.p_min = 0.0;
        }
        other => p.drafters = vec![DrafterKind::parse(other).unwrap()],
    }
    p
}

/// No grammar, or one that leaves the model real choices (so drafts are rejected too).
fn grammar_spec(kind: usize) -> Option<GrammarSpec> {
    match kind {
        1 => Some(GrammarSpec::Gbnf(
            "root ::= (word \" \")* \nword ::= [a-z_]+ | \"(\" | \")\" | [0-9]".into(),
        )),
        2 => Some(GrammarSpec::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["name", "count"]
        }))),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn speculative_equals_plain(
        prompts in proptest::collection::vec(proptest::collection::vec(0u32..1000, 1..24), 1..=4),
        drafter in 0usize..DRAFTERS.len(),
        rollback in 0usize..3,
        model_kind in 0usize..11,
        samp in 0usize..4,
        seed in 0u32..10_000,
        n_max in 1usize..10,
        n_min in 0usize..4,
        adaptive in any::<bool>(),
        grammar in 0usize..4,
        f16_cache in any::<bool>(),
        // Ids up to a little past the tiny vocabularies (1030): those are ignored.
        logit_bias in proptest::collection::vec(
            (0u32..1100, prop_oneof![3 => -8.0f32..8.0, 1 => Just(f32::NEG_INFINITY), 1 => Just(30.0f32)]),
            0..6,
        ),
        // Checkpoint marks in the prompts (the chat renderer's message ends) and prompt
        // scoring, on the speculative side only: neither may change a token.
        marks in proptest::collection::vec(0usize..26, 0..3),
        score in any::<bool>(),
    ) {
        let m = models();
        let model = match model_kind {
            0 => &m.hybrid,
            1 => &m.repetitive,
            2 => &m.llama,
            3 => &m.kquant,
            4 => &m.moe,
            5 => &m.next,
            6 => &m.q2_k,
            7 => &m.q3_k,
            k => &m.block32[k - 8],
        };
        // Only the Qwen3.5 family's files (dense, MoE, Qwen3-Next) have an MTP head.
        let model = if DRAFTERS[drafter] == "draft-mtp" && !model.info().has_mtp { &m.hybrid } else { model };
        let rollback = [RollbackKind::Replay, RollbackKind::Snapshot, RollbackKind::Checkpoint][rollback];
        let n_predict = 24;
        let base: Vec<SequenceRequest> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = SequenceRequest::greedy(p.clone(), n_predict);
                r.sampler = sampler(samp, seed + i as u32);
                r.ignore_eos = true;
                r.grammar = grammar_spec(grammar);
                r.logit_bias = logit_bias.clone();
                r
            })
            .collect();
        let kv = if f16_cache { KvType::F16 } else { KvType::F32 };
        let plain = run_kv(model, base.clone(), RollbackKind::Replay, kv, false);
        let name = DRAFTERS[drafter];
        let mut spec = spec_for(name, n_max);
        spec.adaptive = adaptive;
        // Drafts shorter than n_min are dropped; the controller's first decision drafts n_min.
        spec.n_min = n_min.min(n_max);
        let reqs: Vec<SequenceRequest> = base
            .into_iter()
            .zip(&plain)
            .map(|(mut r, out)| {
                let mut reference = r.prompt.clone();
                reference.extend_from_slice(out);
                r.reference = Some(Arc::new(reference));
                r.spec = spec.clone();
                r.draft_model = Some(m.draft.clone());
                r.checkpoints = marks.clone();
                r.prompt_logprobs = score.then_some(2);
                r
            })
            .collect();
        let specd = run_kv(model, reqs, rollback, kv, !marks.is_empty());
        prop_assert_eq!(plain, specd, "drafter {} rollback {:?} kv {:?}", name, rollback, kv);
    }
}

#[test]
fn always_right_drafts_are_all_accepted_and_always_wrong_none() {
    let m = models();
    let prompt = vec![5u32, 9, 14, 3];
    let mut plain_req = SequenceRequest::greedy(prompt.clone(), 32);
    plain_req.ignore_eos = true;
    let plain = run(&m.hybrid, vec![plain_req], RollbackKind::Replay);
    let mut reference = prompt.clone();
    reference.extend_from_slice(&plain[0]);
    for (rate, expect_all) in [(1.0f32, true), (0.0, false)] {
        let mut r = SequenceRequest::greedy(prompt.clone(), 32);
        r.ignore_eos = true;
        r.reference = Some(Arc::new(reference.clone()));
        r.spec = SpecParams {
            drafters: vec![DrafterKind::Synthetic],
            synth_rates: vec![rate; 4],
            n_max: 4,
            adaptive: false,
            ..SpecParams::default()
        };
        let cfg = MemoryConfig {
            n_ctx: 256,
            max_seqs: 1,
            ..Default::default()
        };
        let mut e = Engine::new(m.hybrid.clone(), cfg, RollbackKind::Replay).unwrap();
        let out = e.generate(0, r).unwrap();
        assert_eq!(out.tokens, plain[0]);
        if expect_all {
            assert_eq!(out.stats.accepted_tokens, out.stats.draft_tokens);
            assert!(out.stats.acceptance_length() > 4.5);
        } else {
            assert_eq!(out.stats.accepted_tokens, 0);
            assert!(out.stats.rollbacks_fast > 0);
        }
    }
}

#[test]
fn logit_bias_and_post_sampling_probs_are_the_same_with_speculation() {
    let m = models();
    let prompt = vec![5u32, 9, 14, 3, 5, 9, 14];
    let run_one = |spec: SpecParams| {
        let mut r = SequenceRequest::greedy(prompt.clone(), 24);
        r.sampler = sampler(1, 77);
        r.ignore_eos = true;
        r.logit_bias = vec![(9, 4.0), (14, f32::NEG_INFINITY), (3, 1.5)];
        r.n_probs = 5;
        r.post_sampling_probs = true;
        r.spec = spec;
        let cfg = MemoryConfig {
            n_ctx: 256,
            max_seqs: 1,
            ..Default::default()
        };
        let mut e = Engine::new(m.repetitive.clone(), cfg, RollbackKind::Replay).unwrap();
        e.generate(0, r).unwrap()
    };
    let plain = run_one(SpecParams::default());
    // The MTP head drafts every round (p_min 0): verification meets the bias often.
    let specd = run_one(spec_for("draft-mtp", 4));
    assert_eq!(plain.tokens, specd.tokens);
    assert!(specd.stats.draft_tokens > 0, "{:?}", specd.stats);
    // The banned token never comes; probabilities are of the sampler's distribution.
    assert!(!plain.tokens.contains(&14));
    assert_eq!(plain.probs.len(), plain.tokens.len());
    for (a, b) in plain.probs.iter().zip(&specd.probs) {
        assert_eq!(a.token, b.token);
        assert_eq!(a.logprob.to_bits(), b.logprob.to_bits());
        assert_eq!(a.top, b.top);
        assert!(a.top.len() <= 5 && !a.top.is_empty());
        assert!(a.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(a.top.iter().all(|&(t, lp)| t != 14 && lp <= 0.0));
        // top-k 40 / top-p / min-p leave few candidates: the chosen one is among them.
        assert!(a.logprob <= 0.0 && a.logprob > f32::NEG_INFINITY);
    }
}

/// The MoE models' MTP heads (qwen35moe, qwen3next) under every rollback mode and sampler, two
/// sequences at once: the proptest above reaches each of these combinations only by chance.
#[test]
fn moe_mtp_heads_keep_speculation_exact() {
    let m = models();
    let prompts = [vec![5u32, 9, 14, 3, 200, 31], vec![77u32, 8, 512, 40]];
    for model in [&m.moe, &m.next] {
        assert!(model.info().has_mtp);
        for samp in 0..4 {
            let base: Vec<SequenceRequest> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut r = SequenceRequest::greedy(p.clone(), 24);
                    r.sampler = sampler(samp, 11 + i as u32);
                    r.ignore_eos = true;
                    r
                })
                .collect();
            let plain = run(model, base.clone(), RollbackKind::Replay);
            for rollback in [
                RollbackKind::Replay,
                RollbackKind::Snapshot,
                RollbackKind::Checkpoint,
            ] {
                let reqs: Vec<SequenceRequest> = base
                    .iter()
                    .cloned()
                    .map(|mut r| {
                        r.spec = spec_for("draft-mtp", 4);
                        r
                    })
                    .collect();
                let specd = run(model, reqs, rollback);
                assert_eq!(plain, specd, "sampler {samp} rollback {rollback:?}");
            }
        }
    }
}
