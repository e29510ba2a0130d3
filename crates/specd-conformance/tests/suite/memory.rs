//! The context's guarantees on real (synthetic) model files, through the backend interface:
//! batch invariance, chunked prefill, rollback, checkpoint restore and save / load equal to
//! "never decoded", sequence isolation, bad batches refused without a change, and the top-token
//! shortcut equal to the row's argmax.

use crate::BACKEND;
use proptest::prelude::*;
use specd_backend::{argmax_prob, Backend, Batch, Context, MemoryConfig, RollbackKind};
use specd_conformance::LoadOptions;
use specd_gguf::TensorType;
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::{Arc, OnceLock};

struct Fixture {
    _dir: tempfile::TempDir,
    /// qwen35 F32 and Q8_0, llama, qwen35moe F32 and Q8_0 (rows of a batch route to different
    /// experts), qwen3next (MoE, NEOX rotary, DeltaNet inputs from fused projections).
    models: Vec<Arc<dyn Backend>>,
}

fn models() -> &'static [Arc<dyn Backend>] {
    static F: OnceLock<Fixture> = OnceLock::new();
    &F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, p: Preset, wt: Option<TensorType>| {
            let mut s = TestModelSpec::preset(p);
            s.style = WeightStyle::Varied;
            if let Some(t) = wt {
                s.wtype = t;
            }
            let path = dir.path().join(name);
            write_model(&s, &path).unwrap();
            // Prompts in chunks of 7 rows: chunk edges fall inside every test's batches.
            BACKEND(
                &path,
                LoadOptions {
                    n_threads: 2,
                    n_ubatch: 7,
                },
            )
        };
        let models = vec![
            mk("q.gguf", Preset::Qwen35Tiny, None),
            mk("q8.gguf", Preset::Qwen35Tiny, Some(TensorType::Q8_0)),
            mk("l.gguf", Preset::LlamaTiny, None),
            mk("m.gguf", Preset::Qwen35MoeTiny, None),
            mk("m8.gguf", Preset::Qwen35MoeTiny, Some(TensorType::Q8_0)),
            mk("n.gguf", Preset::Qwen3NextTiny, None),
        ];
        Fixture { _dir: dir, models }
    })
    .models
}

fn ctx(m: &dyn Backend, rollback: RollbackKind) -> Box<dyn Context> {
    m.new_context(MemoryConfig {
        n_ctx: 128,
        max_seqs: 8,
        rollback,
        ..Default::default()
    })
    .unwrap()
}

/// Logits of each token of `tokens` decoded one at a time from a fresh sequence.
fn one_by_one(m: &dyn Backend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut c = ctx(m, RollbackKind::Replay);
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            c.decode_new(&Batch::from_tokens(&[t], i as u32, 0, true))
                .unwrap()
                .logits(0)
                .to_vec()
        })
        .collect()
}

/// The logits of the token after `prefix + rest`, where `c` holds `prefix` followed by `rest`
/// taken back in some way: decoding `next` at the position after what `c` now holds.
fn next_logits(c: &mut dyn Context, next: u32) -> Vec<f32> {
    let pos = c.n_past(0) as u32;
    c.decode_new(&Batch::from_tokens(&[next], pos, 0, true))
        .unwrap()
        .logits(0)
        .to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A token's logits are bit-identical alone, inside a multi-token batch of its sequence
    /// (chunked by n_ubatch = 7), and next to other sequences' rows; the backend's top token is
    /// the argmax of each row.
    #[test]
    fn batch_invariance(tokens in proptest::collection::vec(0u32..1000, 2..20),
                        other in proptest::collection::vec(0u32..1000, 1..10),
                        mi in 0usize..6) {
        let m = models()[mi].as_ref();
        let reference = one_by_one(m, &tokens);
        // All tokens in one batch, interleaved with another sequence's rows.
        let mut c = ctx(m, RollbackKind::Replay);
        let mut b = Batch::new();
        let mut j = 0;
        for (i, &t) in tokens.iter().enumerate() {
            b.push(t, i as u32, 0, true);
            if j < other.len() {
                b.push(other[j], j as u32, 1, j % 2 == 0);
                j += 1;
            }
        }
        let out = c.decode_new(&b).unwrap();
        let mine: Vec<usize> = (0..out.len())
            .filter(|&i| b.rows[out.rows()[i]].seq == 0)
            .collect();
        prop_assert_eq!(mine.len(), tokens.len());
        for (k, &i) in mine.iter().enumerate() {
            prop_assert!(out.logits(i) == &reference[k][..], "token {} differs", k);
            prop_assert_eq!(out.top(i), argmax_prob(out.logits(i)));
        }
    }

    /// Rollback of rejected tokens (replay or snapshot) and checkpoint restore both leave the
    /// sequence exactly as if the rejected tokens had never been decoded.
    #[test]
    fn rollback_equals_never_decoded(prefix in proptest::collection::vec(0u32..1000, 1..12),
                                     draft in proptest::collection::vec(0u32..1000, 1..8),
                                     reject in 1usize..8, mode in 0usize..3, mi in 0usize..6) {
        let m = models()[mi].as_ref();
        let reject = reject.min(draft.len());
        let keep = draft.len() - reject;
        let mut accepted = prefix.clone();
        accepted.extend_from_slice(&draft[..keep]);
        accepted.push(7); // the next token after the rollback
        let reference = one_by_one(m, &accepted);
        let rmode = [RollbackKind::Replay, RollbackKind::Snapshot, RollbackKind::Checkpoint][mode];
        let mut c = ctx(m, rmode);
        c.decode_new(&Batch::from_tokens(&prefix, 0, 0, false)).unwrap();
        let cp = c.checkpoint(0).unwrap();
        prop_assert_eq!(cp.is_some(), m.info().hybrid);
        c.decode_new(&Batch::from_tokens(&draft, prefix.len() as u32, 0, true)).unwrap();
        if rmode == RollbackKind::Checkpoint && m.info().hybrid {
            // Checkpoint + redecode of the accepted part.
            c.restore(0, cp.unwrap()).unwrap();
            if keep > 0 {
                c.decode_new(&Batch::from_tokens(&draft[..keep], prefix.len() as u32, 0, false)).unwrap();
            }
        } else {
            prop_assert!(c.rollback_capacity(0) >= reject);
            c.rollback(0, reject).unwrap();
        }
        prop_assert_eq!(c.n_past(0), prefix.len() + keep);
        prop_assert!(next_logits(c.as_mut(), 7) == *reference.last().unwrap());
    }

    /// A sequence saved and loaded into another context (and another sequence id) goes on
    /// exactly as the original does.
    #[test]
    fn save_and_load_equal_the_original(prefix in proptest::collection::vec(0u32..1000, 1..20),
                                        next in 0u32..1000, mi in 0usize..6) {
        let m = models()[mi].as_ref();
        let mut a = ctx(m, RollbackKind::Replay);
        a.decode_new(&Batch::from_tokens(&prefix, 0, 0, false)).unwrap();
        let bytes = a.save_sequence(0).unwrap();
        let mut b = ctx(m, RollbackKind::Replay);
        prop_assert_eq!(b.load_sequence(5, &bytes).unwrap(), prefix.len());
        prop_assert_eq!(b.n_past(5), prefix.len());
        let want = next_logits(a.as_mut(), next);
        let pos = prefix.len() as u32;
        let got = b.decode_new(&Batch::from_tokens(&[next], pos, 5, true)).unwrap();
        prop_assert!(got.logits(0) == &want[..]);
    }
}

#[test]
fn chunked_prefill_matches_token_by_token() {
    for m in models() {
        let m = m.as_ref();
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
        let reference = one_by_one(m, &tokens);
        let mut c = ctx(m, RollbackKind::Replay);
        // n_ubatch is 7: the prompt goes through in 6 chunks.
        let out = c
            .decode_new(&Batch::from_tokens(&tokens, 0, 0, false))
            .unwrap();
        assert_eq!(out.len(), 1);
        let last = reference.last().unwrap();
        assert_eq!(out.top(0).0, argmax_prob(last).0);
        let max_diff = out
            .logits(0)
            .iter()
            .zip(last)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max_diff < 1e-4, "max diff {max_diff}");
    }
}

/// A prompt stopped after a chunk keeps the chunks done, and goes on from there as if it had
/// never stopped.
#[test]
fn a_stopped_prefill_keeps_its_chunks() {
    let m = models()[0].as_ref();
    let tokens: Vec<u32> = (0..30).map(|i| (i * 13 + 5) % 1000).collect();
    let mut c = ctx(m, RollbackKind::Replay);
    let mut out = c.new_output();
    let b = Batch::from_tokens(&tokens, 0, 0, false);
    let d = c
        .decode(&b, out.as_mut(), &mut |done| {
            if done >= 14 {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(d.rows, 14);
    assert!(d.secs >= 0.0);
    assert_eq!(c.n_past(0), 14);
    c.decode_new(&Batch::from_tokens(&tokens[14..29], 14, 0, false))
        .unwrap();
    let reference = one_by_one(m, &tokens);
    assert!(next_logits(c.as_mut(), tokens[29]) == *reference.last().unwrap());
}

#[test]
fn sequences_do_not_influence_each_other() {
    let m = models()[0].as_ref();
    let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let reference = one_by_one(m, &a);
    let mut c = ctx(m, RollbackKind::Replay);
    for (i, &t) in a.iter().enumerate() {
        let mut b = Batch::new();
        b.push(t, i as u32, 0, true);
        b.push(999 - t, i as u32, 3, true);
        let out = c.decode_new(&b).unwrap();
        assert_eq!(out.logits(0), &reference[i][..]);
        if i == 3 {
            c.clear(3);
            break;
        }
    }
}

#[test]
fn bad_batches_are_errors_and_change_nothing() {
    let m = models()[0].as_ref();
    let mut c = ctx(m, RollbackKind::Replay);
    c.decode_new(&Batch::from_tokens(&[1, 2, 3], 0, 0, true))
        .unwrap();
    let before = c.usage();
    // Wrong position, out-of-vocabulary token, context overflow.
    assert!(c.decode_new(&Batch::from_tokens(&[4], 5, 0, true)).is_err());
    assert!(c
        .decode_new(&Batch::from_tokens(&[100_000], 3, 0, true))
        .is_err());
    let long: Vec<u32> = vec![1; 200];
    assert!(c
        .decode_new(&Batch::from_tokens(&long, 3, 0, true))
        .is_err());
    assert_eq!(c.usage(), before);
    // Hidden states of rows are handles of this backend, one per row.
    let mut b = Batch::from_tokens(&[4, 5], 3, 0, false);
    b.want_hidden = true;
    let out = c.decode_new(&b).unwrap();
    assert_eq!(out.hidden().map(|h| h.len()), Some(2));
}
