//! Grammar-constrained generation through the engine: outputs follow the grammar, forced
//! tokens are drafted for free, speculation stays exact, invalid grammars are refused.

use crate::BACKEND;
use specd_backend::Backend;
use specd_backend::MemoryConfig;
use specd_conformance::models::test_model;
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::{DrafterKind, Engine, FinishReason, RollbackKind, SequenceRequest, SpecParams};
use specd_testmodel::{Preset, WeightStyle};
use std::sync::Arc;

fn model() -> (tempfile::TempDir, Arc<dyn Backend>) {
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
}

fn schema() -> GrammarSpec {
    GrammarSpec::JsonSchema(serde_json::json!({
        "x-guidance": {"whitespace_flexible": false},
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "integer", "minimum": 0, "maximum": 999},
            "ok": {"type": "boolean"}
        },
        "required": ["color", "size", "ok"],
        "additionalProperties": false
    }))
}

fn run(m: &Arc<dyn Backend>, spec: SpecParams, sampler: SamplerParams) -> specd_spec::SeqOutput {
    let prompt = m
        .tokenizer()
        .encode("answer in JSON:", false, false)
        .unwrap();
    let mut r = SequenceRequest::greedy(prompt, 120);
    r.sampler = sampler;
    r.grammar = Some(schema());
    r.spec = spec;
    let cfg = MemoryConfig {
        n_ctx: 512,
        max_seqs: 1,
        ..Default::default()
    };
    Engine::new(m.clone(), cfg, RollbackKind::Replay)
        .unwrap()
        .generate(0, r)
        .unwrap()
}

#[test]
fn json_schema_output_validates_and_speculation_is_exact() {
    let (_d, m) = model();
    for seed in [1u32, 7, 42] {
        let sampler = SamplerParams {
            temperature: 0.9,
            seed,
            ..SamplerParams::default()
        };
        let plain = run(&m, SpecParams::default(), sampler);
        assert_eq!(
            plain.reason,
            FinishReason::Eos,
            "the grammar ends the output: {:?}",
            plain.text
        );
        let v: serde_json::Value =
            serde_json::from_str(&plain.text).unwrap_or_else(|e| panic!("{:?}: {e}", plain.text));
        assert!(
            ["red", "green", "blue"].contains(&v["color"].as_str().unwrap()),
            "{v}"
        );
        assert!(
            v["size"].as_u64().unwrap() <= 999 && v["ok"].is_boolean(),
            "{v}"
        );
        let spec = SpecParams {
            drafters: vec![DrafterKind::NgramSimple],
            n_max: 6,
            adaptive: false,
            ngram_n: 1,
            ..SpecParams::default()
        };
        let fast = run(&m, spec, sampler);
        assert_eq!(fast.tokens, plain.tokens, "seed {seed}");
        assert!(
            fast.stats.grammar_forced_tokens > 0,
            "the object's keys are forced: {:?}",
            fast.stats
        );
        assert!(
            fast.stats.rounds < plain.stats.rounds,
            "forced tokens save rounds: {:?} vs {:?} {:?}",
            fast.stats,
            plain.stats,
            fast.text
        );
    }
}

#[test]
fn invalid_grammar_is_refused_at_add() {
    let (_d, m) = model();
    let cfg = MemoryConfig {
        n_ctx: 128,
        max_seqs: 1,
        ..Default::default()
    };
    let mut e = Engine::new(m.clone(), cfg, RollbackKind::Replay).unwrap();
    let mut r = SequenceRequest::greedy(vec![1, 2, 3], 8);
    r.grammar = Some(GrammarSpec::Gbnf("root ::= nowhere".into()));
    let err = e.add(0, r).unwrap_err().to_string();
    assert!(err.contains("grammar") && err.contains("nowhere"), "{err}");
    assert!(e.is_idle());
}
