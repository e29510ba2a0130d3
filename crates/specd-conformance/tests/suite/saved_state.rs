//! Slot save / restore at the engine level: a sequence's kept memory saved from one engine and
//! restored into another sequence (of another engine, with another KV type) continues exactly
//! as the original would — the same tokens and the same reuse of the prompt prefix — and a
//! restore that cannot be right is an error that leaves nothing half-loaded. The prompt cache in
//! RAM moves the same saved memory between conversations on one sequence: a conversation
//! continued from it is the conversation that never left, and scopes never share it.

use crate::BACKEND;
use specd_backend::Backend;
use specd_backend::{KvType, MemoryConfig};
use specd_conformance::LoadOptions;
use specd_spec::{Engine, RollbackKind, SeqOutput, SequenceRequest};
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::Arc;

fn load(dir: &std::path::Path, preset: Preset, name: &str) -> Arc<dyn Backend> {
    let mut spec = TestModelSpec::preset(preset);
    spec.style = WeightStyle::Varied;
    let p = dir.join(name);
    write_model(&spec, &p).unwrap();
    let opts = LoadOptions {
        n_threads: 2,
        n_ubatch: 16,
    };
    BACKEND(&p, opts)
}

fn engine(model: &Arc<dyn Backend>, kv: KvType) -> Engine {
    let cfg = MemoryConfig {
        n_ctx: 256,
        max_seqs: 2,
        kv_type_k: kv,
        kv_type_v: kv,
        ..Default::default()
    };
    let mut e = Engine::new(model.clone(), cfg, RollbackKind::Replay).unwrap();
    e.set_prompt_cache(true, 4);
    e
}

fn run(e: &mut Engine, seq: u32, prompt: &[u32], n: usize) -> SeqOutput {
    e.generate(seq, SequenceRequest::greedy(prompt.to_vec(), n))
        .unwrap()
}

fn prompts() -> (Vec<u32>, Vec<u32>) {
    let first: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 200 + 5).collect();
    // Shares the first prompt but not what was generated after it: on a hybrid model, reuse
    // goes through the prompt-end checkpoint the saved state carries.
    let mut second = first.clone();
    second.extend((0..12).map(|i| (i * 11 + 1) % 150 + 9));
    (first, second)
}

fn check_round_trip(preset: Preset) {
    let dir = tempfile::tempdir().unwrap();
    let model = load(dir.path(), preset, "m.gguf");
    let (first, second) = prompts();

    let mut a = engine(&model, KvType::F32);
    run(&mut a, 0, &first, 12);
    let (tokens, bytes) = a.save_kept(0, 0).unwrap();
    assert!(!tokens.is_empty());
    assert_eq!(&tokens[..first.len()], first.as_slice());

    // Restored into sequence 1 of another engine: saving it again gives the same bytes.
    let mut b = engine(&model, KvType::F32);
    b.restore_kept(1, 0, tokens.clone(), &bytes).unwrap();
    assert_eq!(b.cached_tokens(1), Some(tokens.as_slice()));
    assert_eq!(b.save_kept(1, 0).unwrap().1, bytes);

    // Both continue with a prompt sharing a prefix: same tokens, same reuse as the original.
    let out_a = run(&mut a, 0, &second, 16);
    let out_b = run(&mut b, 1, &second, 16);
    assert_eq!(out_a.tokens, out_b.tokens);
    assert_eq!(out_a.n_cached, out_b.n_cached);
    assert!(out_b.n_cached > 0, "the restored memory was not reused");
    // ...and the same as an engine that never saw the first prompt.
    let fresh = run(&mut engine(&model, KvType::F32), 0, &second, 16);
    assert_eq!(fresh.tokens, out_b.tokens);

    // A whole follow-up (the saved prompt plus more) reuses every saved position.
    let mut longer = tokens.clone();
    longer.extend([11, 12, 13]);
    let mut c = engine(&model, KvType::F32);
    c.restore_kept(0, 0, tokens.clone(), &bytes).unwrap();
    let out_c = run(&mut c, 0, &longer, 8);
    assert_eq!(out_c.n_cached, tokens.len());
    let fresh = run(&mut engine(&model, KvType::F32), 0, &longer, 8);
    assert_eq!(out_c.tokens, fresh.tokens);

    // Into an f16 cache: the KV is converted and the restored slot still serves.
    let mut h = engine(&model, KvType::F16);
    h.restore_kept(0, 0, tokens.clone(), &bytes).unwrap();
    assert_eq!(run(&mut h, 0, &longer, 4).n_cached, tokens.len());
}

#[test]
fn hybrid_sequence_round_trips() {
    check_round_trip(Preset::Qwen35Tiny);
}

#[test]
fn attention_only_sequence_round_trips() {
    check_round_trip(Preset::LlamaTiny);
}

#[test]
fn bad_saved_states_are_errors_and_free_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let model = load(dir.path(), Preset::Qwen35Tiny, "m.gguf");
    let other = load(dir.path(), Preset::LlamaTiny, "l.gguf");
    let (first, _) = prompts();
    let mut a = engine(&model, KvType::F32);
    run(&mut a, 0, &first, 8);
    let (tokens, bytes) = a.save_kept(0, 0).unwrap();

    let mut b = engine(&model, KvType::F32);
    for (what, toks, state) in [
        (
            "truncated",
            tokens.clone(),
            bytes[..bytes.len() - 3].to_vec(),
        ),
        (
            "trailing bytes",
            tokens.clone(),
            [bytes.clone(), vec![0]].concat(),
        ),
        ("not a state", tokens.clone(), b"hello".to_vec()),
        ("token count", tokens[1..].to_vec(), bytes.clone()),
        ("vocabulary", vec![u32::MAX; tokens.len()], bytes.clone()),
    ] {
        b.restore_kept(1, 0, tokens.clone(), &bytes).unwrap();
        let e = b.restore_kept(1, 0, toks, &state);
        assert!(e.is_err(), "{what}: accepted");
        assert_eq!(b.cached_tokens(1), None, "{what}: slot not freed");
        assert_eq!(b.memory().n_past(1), 0, "{what}: memory left behind");
    }

    // Another model's layout is refused by name.
    let mut l = engine(&other, KvType::F32);
    let e = l
        .restore_kept(0, 0, tokens, &bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another model"), "{e}");
}

/// Two conversations on one sequence with the RAM cache: A's memory is saved when B takes the
/// sequence and loaded back for A's follow-up, which reuses all of it and generates what an
/// engine that never ran B generates. Another scope sees none of it.
fn check_ram_cache(preset: Preset) {
    let dir = tempfile::tempdir().unwrap();
    let model = load(dir.path(), preset, "m.gguf");
    let (a1, _) = prompts();
    let b1: Vec<u32> = (0..30).map(|i| (i * 13 + 2) % 180 + 7).collect();
    let follow = |first: &[u32], out: &SeqOutput| {
        let mut p = first.to_vec();
        p.extend(&out.tokens);
        p.extend([21, 22, 23]);
        p
    };
    let mut e = engine(&model, KvType::F32);
    e.set_ram_cache(64 << 20);
    let out_a1 = run(&mut e, 0, &a1, 10);
    let out_b1 = run(&mut e, 0, &b1, 10);
    assert_eq!(out_b1.n_cached, 0);
    assert_eq!(e.ram_cache_stats().entries, 1);
    let a2 = follow(&a1, &out_a1);
    let out_a2 = run(&mut e, 0, &a2, 10);
    assert_eq!(out_a2.n_cached, a1.len() + out_a1.tokens.len() - 1);
    let s = e.ram_cache_stats();
    assert_eq!((s.hits, s.saves, s.entries), (1, 2, 1), "{s:?}");
    let mut fresh = engine(&model, KvType::F32);
    run(&mut fresh, 0, &a1, 10);
    assert_eq!(run(&mut fresh, 0, &a2, 10).tokens, out_a2.tokens);

    // B's memory is in the cache under scope 0: a request of scope 7 reuses nothing.
    let b2 = follow(&b1, &out_b1);
    let mut req = SequenceRequest::greedy(b2.clone(), 4);
    req.cache_scope = 7;
    assert_eq!(e.generate(0, req).unwrap().n_cached, 0);
    // ...and scope 0 still finds it.
    assert_eq!(
        run(&mut e, 0, &b2, 4).n_cached,
        b1.len() + out_b1.tokens.len() - 1
    );
}

#[test]
fn hybrid_conversation_comes_back_from_the_ram_cache() {
    check_ram_cache(Preset::Qwen35Tiny);
}

#[test]
fn attention_only_conversation_comes_back_from_the_ram_cache() {
    check_ram_cache(Preset::LlamaTiny);
}
