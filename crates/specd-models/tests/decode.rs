//! The decode API's guarantees on real (synthetic) model files: batch invariance, chunked
//! prefill, rollback and checkpoint restore equal "never decoded", sequence isolation.

use proptest::prelude::*;
use specd_memory::{Memory, MemoryConfig, RollbackKind};
use specd_models::{Batch, Model, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::sync::{Arc, OnceLock};

struct Fixture {
    _dir: tempfile::TempDir,
    qwen: Arc<Model>,
    qwen_q8: Arc<Model>,
    llama: Arc<Model>,
    /// qwen35moe: rows of a batch route to different experts.
    moe: Arc<Model>,
    moe_q8: Arc<Model>,
    /// qwen3next: MoE, NEOX rotary, DeltaNet inputs from fused grouped projections.
    next: Arc<Model>,
}

fn fx() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, p: Preset, wt: Option<specd_gguf::TensorType>| {
            let mut s = TestModelSpec::preset(p);
            s.style = WeightStyle::Varied;
            if let Some(t) = wt {
                s.wtype = t;
            }
            let path = dir.path().join(name);
            write_model(&s, &path).unwrap();
            Arc::new(
                Model::load(
                    &path,
                    ModelOptions {
                        n_threads: 2,
                        n_ubatch: 7,
                    },
                )
                .unwrap(),
            )
        };
        Fixture {
            qwen: mk("q.gguf", Preset::Qwen35Tiny, None),
            qwen_q8: mk(
                "q8.gguf",
                Preset::Qwen35Tiny,
                Some(specd_gguf::TensorType::Q8_0),
            ),
            llama: mk("l.gguf", Preset::LlamaTiny, None),
            moe: mk("m.gguf", Preset::Qwen35MoeTiny, None),
            moe_q8: mk(
                "m8.gguf",
                Preset::Qwen35MoeTiny,
                Some(specd_gguf::TensorType::Q8_0),
            ),
            next: mk("n.gguf", Preset::Qwen3NextTiny, None),
            _dir: dir,
        }
    })
}

fn mem(m: &Model, mode: RollbackKind) -> Memory {
    m.new_memory(MemoryConfig {
        n_ctx: 128,
        max_seqs: 8,
        rollback: mode,
        ..Default::default()
    })
}

/// Logits of each token of `tokens` decoded one at a time from a fresh sequence.
fn one_by_one(m: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut mm = mem(m, RollbackKind::Replay);
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            m.decode(&mut mm, &Batch::from_tokens(&[t], i as u32, 0, true))
                .unwrap()
                .logits(0)
                .to_vec()
        })
        .collect()
}

fn models() -> [&'static Arc<Model>; 6] {
    let f = fx();
    [&f.qwen, &f.qwen_q8, &f.llama, &f.moe, &f.moe_q8, &f.next]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A token's logits are bit-identical alone, inside a multi-token batch of its sequence
    /// (chunked by n_ubatch = 7), and next to other sequences' rows.
    #[test]
    fn batch_invariance(tokens in proptest::collection::vec(0u32..1000, 2..20),
                        other in proptest::collection::vec(0u32..1000, 1..10),
                        mi in 0usize..6) {
        let m = models()[mi];
        let reference = one_by_one(m, &tokens);
        // All tokens in one batch, interleaved with another sequence's rows.
        let mut mm = mem(m, RollbackKind::Replay);
        let mut b = Batch::new();
        let mut j = 0;
        for (i, &t) in tokens.iter().enumerate() {
            b.push(t, i as u32, 0, true);
            if j < other.len() {
                b.push(other[j], j as u32, 1, j % 2 == 0);
                j += 1;
            }
        }
        let out = m.decode(&mut mm, &b).unwrap();
        let mine: Vec<&[f32]> = out.rows.iter().enumerate()
            .filter(|(_, &r)| b.rows[r].seq == 0)
            .map(|(i, _)| out.logits(i))
            .collect();
        prop_assert_eq!(mine.len(), tokens.len());
        for (i, l) in mine.iter().enumerate() {
            prop_assert!(*l == &reference[i][..], "token {} differs", i);
        }
    }

    /// Rollback of rejected tokens (fast replay or snapshot) and checkpoint restore both leave
    /// the sequence exactly as if the rejected tokens had never been decoded.
    #[test]
    fn rollback_equals_never_decoded(prefix in proptest::collection::vec(0u32..1000, 1..12),
                                     draft in proptest::collection::vec(0u32..1000, 1..8),
                                     reject in 1usize..8, mode in 0usize..3, mi in 0usize..6) {
        let m = models()[mi];
        let reject = reject.min(draft.len());
        let keep = draft.len() - reject;
        let mut accepted = prefix.clone();
        accepted.extend_from_slice(&draft[..keep]);
        accepted.push(7); // the next token after the rollback
        let reference = one_by_one(m, &accepted);
        let rmode = [RollbackKind::Replay, RollbackKind::Snapshot, RollbackKind::Checkpoint][mode];
        let mut mm = mem(m, rmode);
        m.decode(&mut mm, &Batch::from_tokens(&prefix, 0, 0, false)).unwrap();
        let cp = mm.checkpoint(0).unwrap();
        m.decode(&mut mm, &Batch::from_tokens(&draft, prefix.len() as u32, 0, true)).unwrap();
        if rmode == RollbackKind::Checkpoint && m.memory_layout().is_hybrid() {
            // Checkpoint + redecode of the accepted part.
            mm.restore(0, cp.unwrap()).unwrap();
            if keep > 0 {
                m.decode(&mut mm, &Batch::from_tokens(&draft[..keep], prefix.len() as u32, 0, false)).unwrap();
            }
        } else {
            mm.rollback(0, reject).unwrap();
        }
        prop_assert_eq!(mm.n_past(0), prefix.len() + keep);
        let out = m.decode(&mut mm, &Batch::from_tokens(&[7], (prefix.len() + keep) as u32, 0, true)).unwrap();
        prop_assert!(out.logits(0) == &reference.last().unwrap()[..]);
    }
}

#[test]
fn chunked_prefill_matches_token_by_token() {
    for m in models() {
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
        let reference = one_by_one(m, &tokens);
        let mut mm = mem(m, RollbackKind::Replay);
        // n_ubatch is 7: the prompt goes through in 6 chunks.
        let out = m
            .decode(&mut mm, &Batch::from_tokens(&tokens, 0, 0, false))
            .unwrap();
        assert_eq!(out.len(), 1);
        let last = reference.last().unwrap();
        let argmax = |l: &[f32]| {
            l.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0
        };
        assert_eq!(argmax(out.logits(0)), argmax(last));
        let max_diff = out
            .logits(0)
            .iter()
            .zip(last)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max_diff < 1e-4, "max diff {max_diff}");
    }
}

#[test]
fn sequences_do_not_influence_each_other() {
    let m = &fx().qwen;
    let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let reference = one_by_one(m, &a);
    let mut mm = mem(m, RollbackKind::Replay);
    for (i, &t) in a.iter().enumerate() {
        let mut b = Batch::new();
        b.push(t, i as u32, 0, true);
        b.push(999 - t, i as u32, 3, true);
        let out = m.decode(&mut mm, &b).unwrap();
        assert_eq!(out.logits(0), &reference[i][..]);
        if i == 3 {
            mm.clear(3);
            break;
        }
    }
}

#[test]
fn bad_batches_are_errors_and_change_nothing() {
    let m = &fx().qwen;
    let mut mm = mem(m, RollbackKind::Replay);
    m.decode(&mut mm, &Batch::from_tokens(&[1, 2, 3], 0, 0, true))
        .unwrap();
    let before = mm.usage();
    // Wrong position, out-of-vocabulary token, context overflow.
    assert!(m
        .decode(&mut mm, &Batch::from_tokens(&[4], 5, 0, true))
        .is_err());
    assert!(m
        .decode(&mut mm, &Batch::from_tokens(&[100_000], 3, 0, true))
        .is_err());
    let long: Vec<u32> = vec![1; 200];
    assert!(m
        .decode(&mut mm, &Batch::from_tokens(&long, 3, 0, true))
        .is_err());
    assert_eq!(mm.usage(), before);
}
