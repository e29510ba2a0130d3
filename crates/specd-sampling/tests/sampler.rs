//! Behavioural tests of the public sampler API.

use proptest::prelude::*;
use specd_sampling::{
    draw, top_logprobs, Sampler, SamplerParams, SamplingError, Verdict, RANDOM_SEED,
};

/// Deterministic pseudo-random logits in roughly [-scale, scale].
fn logits(n: usize, salt: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 29;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn unfiltered(seed: u32) -> SamplerParams {
    SamplerParams::unfiltered(seed)
}

fn penalised(seed: u32) -> SamplerParams {
    SamplerParams {
        repeat_penalty: 1.3,
        repeat_last_n: 6,
        frequency_penalty: 0.4,
        presence_penalty: 0.2,
        seed,
        ..SamplerParams::default()
    }
}

fn argmax_lowest(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn same_seed_and_position_give_same_token() {
    let l = logits(500, 1, 3.0);
    let a = Sampler::new(unfiltered(42), &[]).unwrap();
    let b = Sampler::new(unfiltered(42), &[]).unwrap();
    let forward: Vec<u32> = (0..200).map(|p| a.sample(&l, p)).collect();
    // Another sampler, positions visited backwards and twice: same tokens,
    // because nothing depends on how often sampling ran.
    let mut backward: Vec<u32> = (0..200).rev().map(|p| b.sample(&l, p)).collect();
    backward.reverse();
    assert_eq!(forward, backward);
    assert_eq!(
        forward,
        (0..200).map(|p| b.sample(&l, p)).collect::<Vec<_>>()
    );
    // Different positions are independent draws, not one repeated token.
    let distinct: std::collections::HashSet<_> = forward.iter().collect();
    assert!(distinct.len() > 50, "{}", distinct.len());
    // Another seed changes the draws.
    let c = Sampler::new(unfiltered(43), &[]).unwrap();
    let other: Vec<u32> = (0..200).map(|p| c.sample(&l, p)).collect();
    assert_ne!(forward, other);
}

#[test]
fn random_seed_is_resolved_and_repeatable() {
    let s = Sampler::new(unfiltered(RANDOM_SEED), &[]).unwrap();
    assert_ne!(s.seed(), RANDOM_SEED);
    let again = Sampler::new(unfiltered(s.seed()), &[]).unwrap();
    let l = logits(100, 2, 2.0);
    for pos in 0..50 {
        assert_eq!(s.sample(&l, pos), again.sample(&l, pos));
    }
}

#[test]
fn rollback_resamples_identically() {
    let prompt = [3u32, 5, 3, 7];
    let n_vocab = 12;
    let step_logits = |pos: u64| logits(n_vocab, pos, 2.0);
    let start = prompt.len() as u64;

    // Reference: plain decode.
    let mut plain = Sampler::new(penalised(9), &prompt).unwrap();
    let mut reference = Vec::new();
    for pos in start..start + 40 {
        let t = plain.sample(&step_logits(pos), pos);
        plain.accept(t).unwrap();
        reference.push(t);
    }

    // Speculative decode: before each real step, accept up to three wrong
    // "draft" tokens and sample them too, then roll back.
    let mut spec = Sampler::new(penalised(9), &prompt).unwrap();
    for (i, pos) in (start..start + 40).enumerate() {
        let len = spec.history_len();
        for d in 0..(i % 4) as u64 {
            let draft = (reference[i] + 1 + d as u32) % n_vocab as u32;
            spec.accept(draft).unwrap();
            let _ = spec.sample(&step_logits(pos + d + 1), pos + d + 1);
        }
        spec.truncate_history(len).unwrap();
        let t = spec.sample(&step_logits(pos), pos);
        assert_eq!(t, reference[i], "position {pos}");
        spec.accept(t).unwrap();
    }
    assert_eq!(spec.history(), plain.history());
    // Rolling back all generated tokens restores the first distribution.
    let first = Sampler::new(penalised(9), &prompt).unwrap();
    spec.truncate_history(prompt.len()).unwrap();
    assert_eq!(
        spec.distribution(&step_logits(start)),
        first.distribution(&step_logits(start))
    );
}

#[test]
fn greedy_is_argmax_with_lowest_id_ties() {
    let s = Sampler::new(SamplerParams::greedy(), &[]).unwrap();
    for salt in 0..50 {
        let l = logits(1000, salt, 5.0);
        assert_eq!(s.sample(&l, salt), argmax_lowest(&l));
        assert_eq!(s.distribution(&l), vec![(argmax_lowest(&l), 1.0)]);
    }
    assert_eq!(s.sample(&[1.0, 4.0, 2.0, 4.0], 0), 1);
    // Negative temperature is greedy too (llama.cpp: temp <= 0).
    let neg = Sampler::new(
        SamplerParams {
            temperature: -0.5,
            ..SamplerParams::default()
        },
        &[],
    )
    .unwrap();
    assert_eq!(neg.sample(&[1.0, 4.0, 2.0, 4.0], 0), 1);
}

#[test]
fn top_k_one_equals_greedy() {
    let greedy = Sampler::new(SamplerParams::greedy(), &[]).unwrap();
    let k1 = Sampler::new(
        SamplerParams {
            top_k: 1,
            temperature: 1.5,
            seed: 1,
            ..SamplerParams::default()
        },
        &[],
    )
    .unwrap();
    for salt in 0..50 {
        let mut l = logits(2000, salt, 4.0);
        l[(salt * 37) as usize] = l[argmax_lowest(&l) as usize]; // force a tie sometimes
        assert_eq!(k1.sample(&l, salt), greedy.sample(&l, salt));
    }
}

#[test]
fn filters_select_expected_candidates() {
    // p at temperature 1: ids 0..5 → 0.04, 0.40, 0.11, 0.30, 0.15.
    let l: Vec<f32> = [0.04f32, 0.40, 0.11, 0.30, 0.15]
        .iter()
        .map(|p| p.ln())
        .collect();
    let support = |p: SamplerParams| -> Vec<u32> {
        let mut ids: Vec<u32> = Sampler::new(p, &[])
            .unwrap()
            .distribution(&l)
            .iter()
            .map(|x| x.0)
            .collect();
        ids.sort_unstable();
        ids
    };
    let base = unfiltered(0);
    assert_eq!(support(base), [0, 1, 2, 3, 4]);
    assert_eq!(support(SamplerParams { top_k: 2, ..base }), [1, 3]);
    // top-p 0.8: 0.40 + 0.30 + 0.15 = 0.85 ≥ 0.8 after three.
    assert_eq!(support(SamplerParams { top_p: 0.8, ..base }), [1, 3, 4]);
    // min-p 0.3: keep p ≥ 0.12.
    assert_eq!(support(SamplerParams { min_p: 0.3, ..base }), [1, 3, 4]);
    // Chain: top-k 4 drops id 0; top-p 0.7 of the renormalised top-4
    // (0.417, 0.313, 0.156, 0.115) keeps two.
    assert_eq!(
        support(SamplerParams {
            top_k: 4,
            top_p: 0.7,
            ..base
        }),
        [1, 3]
    );
    // Defaults: top-k 40, top-p 0.95 (0.96 after four) drops the 0.04 token;
    // min-p 0.05 (p ≥ 0.02) keeps the rest.
    assert_eq!(
        support(SamplerParams {
            seed: 0,
            ..SamplerParams::default()
        }),
        [1, 2, 3, 4]
    );

    // Temperature applies after the filters: probabilities of the survivors
    // are softmax(logit / T) renormalised.
    let s = Sampler::new(
        SamplerParams {
            top_k: 2,
            temperature: 0.5,
            ..base
        },
        &[],
    )
    .unwrap();
    let d = s.distribution(&l);
    assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]); // descending
    let (a, b) = (0.4f32 * 0.4, 0.3f32 * 0.3);
    assert!((d[0].1 - a / (a + b)).abs() < 1e-6 && (d[1].1 - b / (a + b)).abs() < 1e-6);
}

#[test]
fn penalties_follow_llama_cpp_formulas() {
    let params = SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        typical_p: 1.0,
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        repeat_last_n: 4,
        seed: 0,
    };
    let l = [2.0f32, -1.0, 1.0, 0.5];
    // Window (last 4 of the prompt) = [0, 1, 0, 3]: counts 0→2, 1→1, 3→1.
    let s = Sampler::new(params, &[2, 2, 0, 1, 0, 3]).unwrap();
    let d = s.distribution(&l);
    let expected_logits: [f32; 4] = [
        2.0 / 2.0 - (2.0 * 0.5 + 0.25), // positive: divided  → -0.25
        -2.0 - (0.5 + 0.25),            // negative: -1 multiplied by 2 → -2.75
        1.0,                            // token 2 slid out of the window
        0.5 / 2.0 - 0.75,               // → -0.5
    ];
    let z: f32 = expected_logits.iter().map(|x| x.exp()).sum();
    for (id, p) in d {
        assert!(
            (p - expected_logits[id as usize].exp() / z).abs() < 1e-6,
            "token {id}"
        );
    }
    // Greedy sees penalties too: token 0 is the raw argmax, 2 wins after.
    let g = Sampler::new(
        SamplerParams {
            temperature: 0.0,
            ..params
        },
        &[2, 2, 0, 1, 0, 3],
    )
    .unwrap();
    assert_eq!(g.sample(&l, 0), 2);
    // repeat_last_n 0 disables penalties entirely.
    let off = Sampler::new(
        SamplerParams {
            repeat_last_n: 0,
            temperature: 0.0,
            ..params
        },
        &[0, 0, 0],
    )
    .unwrap();
    assert_eq!(off.sample(&l, 0), 0);
    // -1 covers the whole history: token 2 is penalised now.
    let all = Sampler::new(
        SamplerParams {
            repeat_last_n: -1,
            ..params
        },
        &[2, 2, 0, 1, 0, 3],
    )
    .unwrap();
    let d = all.distribution(&l);
    let p2 = d.iter().find(|x| x.0 == 2).unwrap().1;
    let l2 = 1.0f32 / 2.0 - (2.0 * 0.5 + 0.25);
    let z: f32 = [-0.25f32, -2.75, l2, -0.5].iter().map(|x| x.exp()).sum();
    assert!((p2 - l2.exp() / z).abs() < 1e-6);
}

#[test]
fn penalties_depend_on_window_contents_not_order() {
    let params = penalised(3);
    let l = logits(10, 77, 2.0);
    let a = Sampler::new(params, &[1, 4, 1, 2, 9, 1]).unwrap();
    let b = Sampler::new(params, &[9, 1, 1, 4, 2, 1]).unwrap();
    let mut c = Sampler::new(params, &[]).unwrap();
    for t in [2, 1, 1, 9, 1, 4] {
        c.accept(t).unwrap();
    }
    let mut da = a.distribution(&l);
    let mut db = b.distribution(&l);
    let mut dc = c.distribution(&l);
    for d in [&mut da, &mut db, &mut dc] {
        d.sort_by_key(|x| x.0);
    }
    assert_eq!(da, db);
    assert_eq!(da, dc);
    for pos in 0..100 {
        assert_eq!(a.sample(&l, pos), b.sample(&l, pos));
    }
}

#[test]
fn penalised_tokens_outside_the_vocabulary_are_ignored() {
    let s = Sampler::new(penalised(0), &[1_000_000, 3]).unwrap();
    let d = s.distribution(&[0.0, 1.0, 2.0, 3.0]);
    assert!(!d.is_empty());
}

#[test]
fn logit_bias_shifts_bans_and_adds_up() {
    let l = [1.0f32, 3.0, 2.0, 0.5];
    let greedy = |bias: &[(u32, f32)]| {
        Sampler::new(SamplerParams::greedy(), &[])
            .unwrap()
            .with_logit_bias(bias)
            .unwrap()
            .sample(&l, 0)
    };
    assert_eq!(greedy(&[]), 1);
    // A bias moves the argmax; -inf bans; a token listed twice gets both biases.
    assert_eq!(greedy(&[(3, 2.6)]), 3);
    assert_eq!(greedy(&[(1, f32::NEG_INFINITY)]), 2);
    assert_eq!(greedy(&[(0, 1.5), (0, 1.5)]), 0);
    assert_eq!(greedy(&[(0, 1.5), (0, 1.5), (0, -1.5)]), 1);
    // Every token banned: the argmax of nothing is token 0, never a panic.
    let all: Vec<(u32, f32)> = (0..4).map(|t| (t, f32::NEG_INFINITY)).collect();
    assert_eq!(greedy(&all), 0);
    // Ids past the vocabulary are ignored.
    assert_eq!(greedy(&[(4, 100.0), (u32::MAX, 100.0)]), 1);
    // The distribution is the softmax of the biased logits.
    let s = Sampler::new(unfiltered(7), &[])
        .unwrap()
        .with_logit_bias(&[(1, -2.0), (2, f32::NEG_INFINITY)])
        .unwrap();
    let biased = [1.0f32, 1.0, f32::NEG_INFINITY, 0.5];
    let z: f32 = biased.iter().map(|x| x.exp()).sum();
    let mut d = s.distribution(&l);
    d.sort_by_key(|x| x.0);
    assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 3]);
    for (id, p) in d {
        assert!(
            (p - biased[id as usize].exp() / z).abs() < 1e-6,
            "token {id}"
        );
    }
    for pos in 0..200 {
        assert_ne!(s.sample(&l, pos), 2);
    }
    // Kept by clones; a NaN bias is refused.
    assert_eq!(s.clone().logit_bias(), s.logit_bias());
    let err = Sampler::new(unfiltered(7), &[])
        .unwrap()
        .with_logit_bias(&[(0, f32::NAN)])
        .unwrap_err();
    assert!(err.to_string().contains("logit_bias"), "{err}");
}

#[test]
fn logit_bias_applies_before_penalties() {
    // llama.cpp runs the bias first: a positive biased logit is then divided by the repeat
    // penalty, so the bias is divided too.
    let params = SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 2.0,
        repeat_last_n: 8,
        seed: 0,
        ..SamplerParams::default()
    };
    let l = [0.0f32, 1.0];
    let s = Sampler::new(params, &[1])
        .unwrap()
        .with_logit_bias(&[(1, 3.0)])
        .unwrap();
    let mut d = s.distribution(&l);
    d.sort_by_key(|x| x.0);
    // Token 1: (1 + 3) / 2 = 2 (penalising first would give 1 / 2 + 3 = 3.5).
    let want = 1.0 / (1.0 + (-2.0f32).exp());
    assert!((d[1].1 - want).abs() < 1e-6, "{d:?}");
}

/// Empirical frequencies over 20k positions against the expected
/// distribution. Deterministic (fixed seed); the tolerance is ~5 standard
/// deviations, so it checks the mapping from uniforms to tokens, not luck.
fn check_frequencies(params: SamplerParams, l: &[f32], expected: &[f64]) {
    let s = Sampler::new(params, &[]).unwrap();
    let n = 20_000u64;
    let mut counts = vec![0u64; l.len()];
    for pos in 0..n {
        counts[s.sample(l, pos) as usize] += 1;
    }
    for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        let freq = c as f64 / n as f64;
        let tol = 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-9;
        assert!(
            (freq - p).abs() <= tol,
            "token {id}: freq {freq}, expected {p} ± {tol}"
        );
    }
}

#[test]
fn empirical_frequencies_match_distribution() {
    let probs = [0.5f64, 0.2, 0.15, 0.1, 0.05];
    let l: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    check_frequencies(unfiltered(2024), &l, &probs);

    // Temperature 0.5 squares the probabilities; top-k 3 keeps the first three.
    let sq: Vec<f64> = probs[..3].iter().map(|p| p * p).collect();
    let z: f64 = sq.iter().sum();
    let mut expected: Vec<f64> = sq.iter().map(|x| x / z).collect();
    expected.extend([0.0, 0.0]);
    check_frequencies(
        SamplerParams {
            top_k: 3,
            temperature: 0.5,
            ..unfiltered(7)
        },
        &l,
        &expected,
    );

    // Returned distribution agrees with the same numbers.
    let s = Sampler::new(
        SamplerParams {
            top_k: 3,
            temperature: 0.5,
            ..unfiltered(7)
        },
        &[],
    )
    .unwrap();
    for ((id, p), e) in s.distribution(&l).iter().zip(&expected) {
        assert!((f64::from(*p) - e).abs() < 1e-6, "token {id}");
    }
}

#[test]
fn nan_and_infinite_logits_are_deterministic() {
    let s = Sampler::new(unfiltered(5), &[]).unwrap();
    // NaN never sampled.
    let l = [f32::NAN, 0.0, f32::NAN, 0.0];
    for pos in 0..500 {
        let t = s.sample(&l, pos);
        assert!(t == 1 || t == 3);
    }
    // +inf tokens share all the mass.
    let l = [1.0, f32::INFINITY, 100.0, f32::INFINITY];
    assert_eq!(s.distribution(&l), vec![(1, 0.5), (3, 0.5)]);
    // All garbage: lowest id, for both greedy and sampling.
    let l = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
    assert_eq!(s.sample(&l, 0), 0);
    assert_eq!(s.distribution(&l), vec![(0, 1.0)]);
    let g = Sampler::new(SamplerParams::greedy(), &[]).unwrap();
    assert_eq!(g.sample(&l, 0), 0);
    assert_eq!(g.sample(&[f32::NAN, 1.0, f32::INFINITY], 0), 2);
    // Default chain on the same garbage.
    let d = Sampler::new(
        SamplerParams {
            seed: 1,
            ..SamplerParams::default()
        },
        &[],
    )
    .unwrap();
    assert_eq!(d.sample(&l, 0), 0);
    // Empty logits: no token exists, 0 is returned rather than panicking.
    assert_eq!(s.sample(&[], 0), 0);
    assert!(s.distribution(&[]).is_empty());
}

#[test]
fn invalid_params_are_rejected_at_construction() {
    let bad = SamplerParams {
        top_p: -0.1,
        ..SamplerParams::default()
    };
    assert!(matches!(
        Sampler::new(bad, &[]),
        Err(SamplingError::InvalidParam { name: "top_p", .. })
    ));
    let bad = SamplerParams {
        temperature: f32::NAN,
        ..SamplerParams::default()
    };
    assert!(matches!(
        Sampler::new(bad, &[]),
        Err(SamplingError::InvalidParam {
            name: "temperature",
            ..
        })
    ));
}

#[test]
fn sampler_is_send_and_clone_keeps_state() {
    fn is_send<T: Send>() {}
    is_send::<Sampler>();
    let mut s = Sampler::new(penalised(11), &[1, 2]).unwrap();
    s.accept(3).unwrap();
    let c = s.clone();
    assert_eq!(c.history(), [1, 2, 3]);
    let l = logits(50, 5, 2.0);
    for pos in 0..20 {
        assert_eq!(c.sample(&l, pos), s.sample(&l, pos));
    }
}

#[test]
fn top_logprobs_is_raw_log_softmax() {
    let l = logits(300, 8, 4.0);
    let top = top_logprobs(&l, 5);
    assert_eq!(top.len(), 5);
    assert_eq!(top[0].0, argmax_lowest(&l));
    let z: f64 = l.iter().map(|&x| f64::from(x).exp()).sum();
    for &(id, lp) in &top {
        let want = f64::from(l[id as usize]) - z.ln();
        assert!((f64::from(lp) - want).abs() < 1e-5);
    }
    assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
}

fn arb_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        20 => -20.0f32..20.0,
        1 => Just(f32::NAN),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(0.0f32),
    ]
}

fn arb_params() -> impl Strategy<Value = SamplerParams> {
    (
        (
            -0.5f32..2.5,
            -1i32..12,
            0.0f32..=1.0,
            0.0f32..=1.0,
            prop_oneof![Just(1.0f32), 0.0f32..=1.0],
        ),
        (
            0.5f32..2.0,
            -1i32..8,
            -1.0f32..1.0,
            -1.0f32..1.0,
            any::<u32>(),
        ),
    )
        .prop_map(
            |((temperature, top_k, top_p, min_p, typical_p), (rp, last_n, pres, freq, seed))| {
                SamplerParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    typical_p,
                    repeat_penalty: rp,
                    repeat_last_n: last_n,
                    presence_penalty: pres,
                    frequency_penalty: freq,
                    seed,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sampled_token_is_in_the_distribution(
        l in prop::collection::vec(arb_logit(), 1..64),
        params in arb_params(),
        prompt in prop::collection::vec(0u32..70, 0..20),
        pos in any::<u64>(),
        bias in prop::collection::vec((0u32..70, prop_oneof![4 => -30.0f32..30.0, 1 => Just(f32::NEG_INFINITY)]), 0..6),
    ) {
        let s = Sampler::new(params, &prompt).unwrap().with_logit_bias(&bias).unwrap();
        let dist = s.distribution(&l);
        let t = s.sample(&l, pos);
        prop_assert!(!dist.is_empty());
        let entry = dist.iter().find(|x| x.0 == t);
        prop_assert!(entry.is_some_and(|e| e.1 > 0.0), "token {} not in {:?}", t, dist);
        prop_assert!(dist.iter().all(|x| x.1 > 0.0 && (x.0 as usize) < l.len()));
        let total: f32 = dist.iter().map(|x| x.1).sum();
        prop_assert!((total - 1.0).abs() < 1e-4, "total {}", total);
        // `sample` is exactly "distribution, then draw".
        prop_assert_eq!(t, s.sample_from_distribution(&dist, pos));
        prop_assert_eq!(t, draw(&dist, s.uniform(pos, 0)));
        // No duplicate ids.
        let mut ids: Vec<u32> = dist.iter().map(|x| x.0).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), dist.len());
    }
}

/// Timing on a full-size vocabulary. Run with
/// `cargo test --release -p specd-sampling -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_full_vocabulary() {
    let n = 248_320;
    let l = logits(n, 99, 12.0);
    let prompt: Vec<u32> = (0..64).map(|i| i * 997 % n as u32).collect();
    let cases = [
        ("greedy", SamplerParams::greedy()),
        (
            "default",
            SamplerParams {
                seed: 1,
                ..SamplerParams::default()
            },
        ),
        (
            "default+penalties",
            SamplerParams {
                repeat_penalty: 1.1,
                ..SamplerParams {
                    seed: 1,
                    ..Default::default()
                }
            },
        ),
        (
            "top_k=0 top_p=0.95",
            SamplerParams {
                top_k: 0,
                seed: 1,
                ..SamplerParams::default()
            },
        ),
        (
            "top_k=0 top_p=0.95 flat",
            SamplerParams {
                top_k: 0,
                min_p: 0.0,
                seed: 1,
                ..SamplerParams::default()
            },
        ),
        ("unfiltered", unfiltered(1)),
    ];
    for (name, params) in cases {
        let s = Sampler::new(params, &prompt).unwrap();
        let flat = logits(n, 5, 0.5);
        let input = if name.ends_with("flat") { &flat } else { &l };
        let _ = s.sample(input, 0);
        let iters = 50;
        let t0 = std::time::Instant::now();
        let mut acc = 0u64;
        for pos in 0..iters {
            acc += u64::from(s.sample(input, pos));
        }
        let per = t0.elapsed() / iters as u32;
        println!("{name:28} {per:?} per sample (checksum {acc})");
    }
}

#[test]
fn draft_sampling_and_verification_are_keyed_and_consistent() {
    let l = logits(200, 11, 4.0);
    let s = Sampler::new(penalised(77), &[3, 4, 5, 3]).unwrap();
    for pos in 0..200u64 {
        let (x, q) = s.sample_draft(&l, pos);
        // Keyed by (seed, position): drawing again gives the same token and distribution.
        assert_eq!(s.sample_draft(&l, pos), (x, q.clone()));
        // q is the sampler's own chain, penalties included, and x is in its support.
        assert_eq!(q, s.distribution(&l));
        assert!(q.iter().any(|&(t, p)| t == x && p > 0.0));
        // The target with the very same distribution keeps every draft.
        assert_eq!(s.verify_draft(&l, pos, x, &q), Verdict::Accepted);
    }
    // The draft lane is not the sampling lane: over many positions the two draws differ.
    let differ = (0..200u64)
        .filter(|&pos| s.sample_draft(&l, pos).0 != s.sample(&l, pos))
        .count();
    assert!(
        differ > 50,
        "draft and target draws coincide too often: {differ}"
    );
}

#[test]
fn verification_rejects_what_the_target_filters_out() {
    // The target keeps only its top token (top-k 1); a flat draft proposes others.
    let l = logits(50, 3, 4.0);
    let target = Sampler::new(
        SamplerParams {
            top_k: 1,
            seed: 5,
            ..SamplerParams::default()
        },
        &[],
    )
    .unwrap();
    let best = target.sample(&l, 0);
    let flat = Sampler::new(unfiltered(5), &[]).unwrap();
    let flat_logits = vec![0.0f32; 50];
    for pos in 0..100u64 {
        let (x, q) = flat.sample_draft(&flat_logits, pos);
        let v = target.verify_draft(&l, pos, x, &q);
        if x == best {
            assert_eq!(v, Verdict::Accepted);
        } else {
            // The only residual mass is on the target's token.
            assert_eq!(v, Verdict::Rejected(best));
        }
    }
}
