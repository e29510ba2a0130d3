//! Rollback and checkpoint restore must equal "never decoded those tokens", bit for bit.

use proptest::prelude::*;
use specd_memory::{Memory, MemoryConfig, MemoryError, MemoryLayout, RollbackKind};
use specd_ops::delta_net::{GdnGates, GdnShape};

const C: usize = 2 * 2 * 8 + 4 * 8; // conv channels: 2·key_dim + value_dim
const NV: usize = 4;

fn layout() -> MemoryLayout {
    MemoryLayout {
        attn_layers: 1,
        kv_row: 8,
        rec_layers: 2,
        conv_kernel: 4,
        conv_channels: C,
        gdn: GdnShape {
            n_k: 2,
            n_v: NV,
            d_k: 8,
            d_v: 8,
            tiled: true,
        },
    }
}

/// Deterministic pseudo-random features of a token (stands in for the model's projections).
fn feat(token: u32, layer: usize, n: usize) -> Vec<f32> {
    let mut s = (token as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (layer as u64 + 7).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Feeds `tokens` to `seq` as one batch; returns the per-token outputs of the last layer.
fn decode(mem: &mut Memory, seq: u32, tokens: &[u32]) -> Result<Vec<f32>, MemoryError> {
    let pos = mem.n_past(seq);
    mem.begin_batch(seq, pos, tokens.len())?;
    let conv_w = feat(999, 0, C * 4);
    let dt = feat(998, 0, NV);
    let a: Vec<f32> = feat(997, 0, NV).iter().map(|v| -v.abs() - 0.1).collect();
    let gates = GdnGates {
        dt_bias: &dt,
        a: &a,
        eps: 1e-6,
    };
    let mut last = Vec::new();
    for layer in 0..2 {
        let mixed: Vec<f32> = tokens.iter().flat_map(|&t| feat(t, layer, C)).collect();
        let alpha: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| feat(t + 1000, layer, NV))
            .collect();
        let beta: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| feat(t + 2000, layer, NV))
            .collect();
        last = mem
            .gdn_layer(seq, layer)?
            .forward(&conv_w, &mixed, &alpha, &beta, gates)
            .into_vec();
    }
    let k: Vec<f32> = tokens.iter().flat_map(|&t| feat(t + 3000, 0, 8)).collect();
    mem.kv_append(seq, 0, &k, &k)?;
    mem.end_batch(seq)?;
    Ok(last)
}

fn snapshot(mem: &Memory, seq: u32) -> Vec<Vec<f32>> {
    let mut v = Vec::new();
    for l in 0..2 {
        let (c, s) = mem.recurrent_state(seq, l).unwrap();
        v.push(c.to_vec());
        v.push(s.to_vec());
    }
    v.push(mem.kv(seq, 0).unwrap().k.to_f32_vec());
    v
}

fn mem(mode: RollbackKind, window: usize) -> Memory {
    Memory::new(
        layout(),
        MemoryConfig {
            rollback: mode,
            rollback_window: window,
            n_ctx: 512,
            ..Default::default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn rollback_equals_never_decoded(
        prefix in proptest::collection::vec(0u32..50, 1..12),
        draft in proptest::collection::vec(0u32..50, 1..10),
        reject in 0usize..10,
        snapshot_mode in any::<bool>(),
        window in 4usize..12,
    ) {
        let reject = reject.min(draft.len());
        let mode = if snapshot_mode { RollbackKind::Snapshot } else { RollbackKind::Replay };
        let window = window.max(draft.len());
        let mut a = mem(mode, window);
        decode(&mut a, 0, &prefix).unwrap();
        decode(&mut a, 0, &draft).unwrap();
        a.rollback(0, reject).unwrap();
        let keep = draft.len() - reject;
        // Reference: the accepted tokens decoded one at a time, never the rejected ones.
        let mut b = mem(RollbackKind::Checkpoint, window);
        decode(&mut b, 0, &prefix).unwrap();
        for &t in &draft[..keep] {
            decode(&mut b, 0, &[t]).unwrap();
        }
        prop_assert_eq!(a.n_past(0), b.n_past(0));
        prop_assert_eq!(snapshot(&a, 0), snapshot(&b, 0));
        // ... and the next step agrees too.
        let oa = decode(&mut a, 0, &[7, 8]).unwrap();
        let ob = decode(&mut b, 0, &[7, 8]).unwrap();
        prop_assert_eq!(oa, ob);
    }

    #[test]
    fn long_batch_rolls_back_within_window(
        prompt in proptest::collection::vec(0u32..50, 10..30),
        reject in 1usize..5,
        snapshot_mode in any::<bool>(),
    ) {
        // The batch is longer than the window: the record starts from a copied base state.
        let mode = if snapshot_mode { RollbackKind::Snapshot } else { RollbackKind::Replay };
        let mut a = mem(mode, 5);
        decode(&mut a, 0, &prompt).unwrap();
        a.rollback(0, reject).unwrap();
        let mut b = mem(RollbackKind::Checkpoint, 5);
        decode(&mut b, 0, &prompt[..prompt.len() - reject]).unwrap();
        prop_assert_eq!(snapshot(&a, 0), snapshot(&b, 0));
    }
}

#[test]
fn rollback_beyond_the_record_fails_and_changes_nothing() {
    let mut a = mem(RollbackKind::Replay, 8);
    decode(&mut a, 0, &[1, 2, 3]).unwrap();
    decode(&mut a, 0, &[4, 5]).unwrap();
    let before = snapshot(&a, 0);
    let err = a.rollback(0, 3).unwrap_err();
    assert!(
        matches!(
            err,
            MemoryError::RollbackUnavailable {
                n: 3,
                available: 2,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(snapshot(&a, 0), before);
    assert_eq!(a.n_past(0), 5);
    // Checkpoint: no rollback records at all.
    let mut c = mem(RollbackKind::Checkpoint, 8);
    decode(&mut c, 0, &[1, 2, 3]).unwrap();
    assert!(c.rollback(0, 1).is_err());
}

#[test]
fn repeated_rollbacks_within_one_record() {
    let mut a = mem(RollbackKind::Replay, 8);
    decode(&mut a, 0, &[1, 2]).unwrap();
    decode(&mut a, 0, &[3, 4, 5, 6]).unwrap();
    a.rollback(0, 1).unwrap();
    a.rollback(0, 2).unwrap();
    let mut b = mem(RollbackKind::Checkpoint, 8);
    decode(&mut b, 0, &[1, 2, 3]).unwrap();
    assert_eq!(snapshot(&a, 0), snapshot(&b, 0));
}

#[test]
fn checkpoint_restore_equals_never_decoded() {
    let mut a = mem(RollbackKind::Checkpoint, 8);
    decode(&mut a, 0, &[1, 2, 3, 4]).unwrap();
    let cp = a.checkpoint(0).unwrap().unwrap();
    decode(&mut a, 0, &[5, 6, 7]).unwrap();
    decode(&mut a, 0, &[8]).unwrap();
    a.restore(0, cp).unwrap();
    let mut b = mem(RollbackKind::Checkpoint, 8);
    decode(&mut b, 0, &[1, 2, 3, 4]).unwrap();
    assert_eq!(snapshot(&a, 0), snapshot(&b, 0));
    assert_eq!(a.n_past(0), 4);
}

#[test]
fn sequences_do_not_influence_each_other() {
    let mut a = mem(RollbackKind::Replay, 8);
    decode(&mut a, 0, &[1, 2, 3]).unwrap();
    decode(&mut a, 1, &[9, 9]).unwrap();
    decode(&mut a, 0, &[4]).unwrap();
    decode(&mut a, 1, &[9, 9, 9]).unwrap();
    a.rollback(1, 2).unwrap();
    let mut b = mem(RollbackKind::Replay, 8);
    decode(&mut b, 0, &[1, 2, 3]).unwrap();
    decode(&mut b, 0, &[4]).unwrap();
    assert_eq!(snapshot(&a, 0), snapshot(&b, 0));
}

#[test]
fn memory_returns_to_what_accepted_tokens_need() {
    let mut a = mem(RollbackKind::Snapshot, 8);
    decode(&mut a, 0, &[1, 2, 3]).unwrap();
    let base = a.usage();
    for round in 0..500u32 {
        decode(&mut a, 0, &[round % 50, 3, 4, 5]).unwrap();
        a.rollback(0, 3).unwrap();
    }
    let u = a.usage();
    assert_eq!(u.kv_cells, 3 + 500);
    assert_eq!(u.kv_bytes, (3 + 500) * 8 * 2 * 4);
    assert_eq!(u.recurrent_bytes, base.recurrent_bytes);
    // The record of the last batch holds exactly one token (the accepted one).
    assert_eq!(u.rollback_bytes, 2 * 4 * (3 * C + 4 * 8 * 8));
    a.clear(0);
    assert_eq!(a.usage(), Default::default());
}

#[test]
fn context_and_position_errors() {
    let mut a = Memory::new(
        layout(),
        MemoryConfig {
            n_ctx: 4,
            ..Default::default()
        },
    );
    decode(&mut a, 0, &[1, 2, 3]).unwrap();
    assert!(matches!(
        decode(&mut a, 0, &[1, 2]),
        Err(MemoryError::ContextFull { .. })
    ));
    assert!(matches!(
        a.begin_batch(0, 1, 1),
        Err(MemoryError::BadPosition { .. })
    ));
    assert_eq!(a.n_past(0), 3);
}
