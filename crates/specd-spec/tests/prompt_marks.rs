//! Checkpoint marks and prompt scoring at the engine level.
//!
//! * A prompt processed with marks (where the chat renderer says the next request will part from
//!   it) gives the same tokens as without, and a later prompt that shares it only up to a mark
//!   reuses exactly that much on a hybrid model — where without the mark it reuses nothing —
//!   and continues as a fresh engine would.
//! * Prompt scoring: the log-probabilities returned for a prompt equal teacher-forced decoding
//!   (each prompt position decoded alone, its logits' log-softmax at the next prompt token),
//!   whatever the size of the pieces the prompt is scored in.

use specd_memory::MemoryConfig;
use specd_models::{Batch, Model, ModelOptions};
use specd_spec::{Engine, RollbackKind, SeqOutput, SequenceRequest};
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::{Arc, OnceLock};

fn model() -> Arc<Model> {
    static M: OnceLock<(tempfile::TempDir, Arc<Model>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = TestModelSpec::preset(Preset::Qwen35Tiny);
        spec.style = WeightStyle::Varied;
        let p = dir.path().join("m.gguf");
        write_model(&spec, &p).unwrap();
        let opts = ModelOptions {
            n_threads: 2,
            n_ubatch: 16,
        };
        (dir, Arc::new(Model::load(&p, opts).unwrap()))
    })
    .1
    .clone()
}

fn engine(reuse: bool) -> Engine {
    let cfg = MemoryConfig {
        n_ctx: 256,
        max_seqs: 2,
        ..Default::default()
    };
    let mut e = Engine::new(model(), cfg, RollbackKind::Fast);
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
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 256,
        max_seqs: 1,
        ..Default::default()
    });
    let mut expected = Vec::new();
    for (i, &t) in p[..p.len() - 1].iter().enumerate() {
        let out = m
            .decode(&mut mem, &Batch::from_tokens(&[t], i as u32, 0, true))
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
