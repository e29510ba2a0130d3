//! The gated delta rule (Gated DeltaNet recurrence), token by token.
//!
//! Used for single-token decode, verification batches, prefill *and* the fast rollback (which
//! replays this recurrence over cached per-token inputs): one entry point, [`gated_delta_rule`],
//! means the replayed state is bit-identical to the state a plain decode would have produced.
//! Behind it, the token-by-token kernel (`vec::delta_head_step`: every row for one token, then
//! the next token) and, on x86, rows-outer kernels that take each row through a whole run of
//! tokens — held in registers on AVX-512 ([`avx512`]), in L1 on AVX2 ([`avx2`]) — doing the same
//! arithmetic in the same order, which a unit test checks bit for bit.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use crate::parallel::SyncPtr;
use crate::vec::delta_head_step;

/// Head layout of one Gated DeltaNet layer.
#[derive(Debug, Clone, Copy)]
pub struct GdnShape {
    pub n_k: usize,
    pub n_v: usize,
    pub d_k: usize,
    pub d_v: usize,
    /// Value head `j` uses key head `j % n_k` (tiled, qwen35 GGUFs) instead of `j / (n_v/n_k)`
    /// (grouped, qwen3next).
    pub tiled: bool,
}

impl GdnShape {
    /// f32 elements of one sequence's state (`n_v × d_v × d_k`).
    pub fn state_len(&self) -> usize {
        self.n_v * self.d_v * self.d_k
    }
    fn key_head(&self, j: usize) -> usize {
        if self.tiled {
            j % self.n_k
        } else {
            j / (self.n_v / self.n_k)
        }
    }
}

/// Per-token inputs of the recurrence for `T` tokens: `q`, `k` are `T × n_k × d_k` (q already
/// L2-normalised and scaled by 1/√d_k, k L2-normalised), `v` is `T × n_v × d_v`, `decay` (γ = e^g)
/// and `beta` are `T × n_v`.
#[derive(Debug, Clone, Copy)]
pub struct GdnInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub decay: &'a [f32],
    pub beta: &'a [f32],
}

/// Runs the recurrence from `state_in` over all tokens of `inp`, writing the final state to
/// `state_out` and the per-token outputs to `out` (`T × n_v × d_v`, pass an empty slice to skip).
/// With `snapshots = Some((buf, first))`, the state after each token `t ≥ first` is stored in
/// slot `t − first` of `buf` (`slots × state_len`).
///
/// State layout per head `j`: `d_v` rows of `d_k` (row `vi` is column `vi` of the math state
/// S ∈ R^{d_k×d_v}), so every step is a contiguous row pass.
pub fn gated_delta_rule(
    shape: GdnShape,
    state_in: &[f32],
    state_out: &mut [f32],
    inp: GdnInputs<'_>,
    out: &mut [f32],
    snapshots: Option<(&mut [f32], usize)>,
) {
    run(
        shape,
        state_in,
        state_out,
        inp,
        out,
        snapshots,
        Rows::best(shape.d_k),
    );
}

/// How [`run`] goes through a head: every row for one token, then the next token (the
/// token-by-token kernel); or each row through every token, held in registers (AVX-512, the
/// row lengths [`avx512::supports`]) or in L1 (AVX2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rows {
    TokenByToken,
    #[cfg(target_arch = "x86_64")]
    InRegisters,
    #[cfg(target_arch = "x86_64")]
    InL1,
}

impl Rows {
    /// The fastest kernel this CPU's level has for rows of `d_k`.
    fn best(d_k: usize) -> Rows {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::isa() >= crate::Isa::Avx512Vnni && avx512::supports(d_k) {
                return Rows::InRegisters;
            }
            if crate::has_avx2() {
                return Rows::InL1;
            }
        }
        let _ = d_k; // no rows-outer kernel off x86
        Rows::TokenByToken
    }
}

/// [`gated_delta_rule`] on a chosen kernel, one this CPU can run (tests compare them).
fn run(
    shape: GdnShape,
    state_in: &[f32],
    state_out: &mut [f32],
    inp: GdnInputs<'_>,
    out: &mut [f32],
    snapshots: Option<(&mut [f32], usize)>,
    rows: Rows,
) {
    let GdnShape {
        n_k, n_v, d_k, d_v, ..
    } = shape;
    let t_len = inp.decay.len() / n_v;
    let head_len = d_v * d_k;
    let want_out = !out.is_empty();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let snap_first = snapshots.as_ref().map_or(0, |s| s.1);
    assert!(
        snapshots
            .as_ref()
            .is_none_or(|s| s.0.len() >= t_len.saturating_sub(s.1) * shape.state_len()),
        "gated_delta_rule: snapshot buffer too small"
    );
    let snap_ptr = snapshots.map(|s| SyncPtr(s.0.as_mut_ptr()));
    let state_len = shape.state_len();
    assert!(
        inp.q.len() >= t_len * n_k * d_k
            && inp.k.len() >= t_len * n_k * d_k
            && inp.v.len() >= t_len * n_v * d_v
            && inp.beta.len() >= t_len * n_v
            && (!want_out || out.len() >= t_len * n_v * d_v),
        "gated_delta_rule: inputs shorter than {t_len} tokens"
    );
    #[cfg(target_arch = "x86_64")]
    assert!(
        match rows {
            Rows::TokenByToken => true,
            Rows::InL1 => crate::has_avx2(),
            Rows::InRegisters => crate::isa() >= crate::Isa::Avx512Vnni && avx512::supports(d_k),
        },
        "gated_delta_rule: no {rows:?} kernel for d_k {d_k} on this CPU"
    );
    let rows = if t_len == 0 { Rows::TokenByToken } else { rows };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows; // only the token-by-token kernel off x86
    assert!(
        state_out.len() == n_v * head_len && state_in.len() == n_v * head_len,
        "gated_delta_rule: state is not {n_v} heads of {head_len}"
    );
    let state_ptr = SyncPtr(state_out.as_mut_ptr());
    crate::parallel::for_each(n_v, |j| {
        // SAFETY: head j's slice of the output state belongs to this item only.
        let s = unsafe { state_ptr.slice_mut(j * head_len, head_len) };
        let s_in = &state_in[j * head_len..(j + 1) * head_len];
        if t_len == 0 {
            s.copy_from_slice(s_in);
        }
        let kh = shape.key_head(j);
        #[cfg(target_arch = "x86_64")]
        if rows != Rows::TokenByToken {
            let tok = HeadTokens {
                n: t_len,
                q: &inp.q[kh * d_k..],
                k: &inp.k[kh * d_k..],
                qk_stride: n_k * d_k,
                v: &inp.v[j * d_v..],
                v_stride: n_v * d_v,
                decay: &inp.decay[j..],
                beta: &inp.beta[j..],
                gb_stride: n_v,
            };
            let outs = HeadOutputs {
                // SAFETY (both): offsets inside the buffers; head j writes only its part.
                out: if want_out {
                    unsafe { out_ptr.add(j * d_v) }
                } else {
                    std::ptr::null_mut()
                },
                out_stride: n_v * d_v,
                snap: snap_ptr.map_or(std::ptr::null_mut(), |p| unsafe { p.add(j * head_len) }),
                snap_stride: state_len,
                snap_first,
            };
            // SAFETY: the kernel's features and row length were checked above; input lengths
            // asserted above; outputs sized by the caller's contract.
            unsafe {
                if rows == Rows::InRegisters {
                    avx512::run(s_in, s, d_k, &tok, &outs)
                } else {
                    avx2::run(s_in, s, d_k, &tok, &outs)
                }
            };
            return;
        }
        for t in 0..t_len {
            let q = &inp.q[(t * n_k + kh) * d_k..][..d_k];
            let k = &inp.k[(t * n_k + kh) * d_k..][..d_k];
            let v = &inp.v[(t * n_v + j) * d_v..][..d_v];
            let g = inp.decay[t * n_v + j];
            let b = inp.beta[t * n_v + j];
            // SAFETY: outputs (t, j, ·) are written by this head's task only.
            let o = want_out.then(|| unsafe { out_ptr.slice_mut((t * n_v + j) * d_v, d_v) });
            // The first token reads the input state directly (no copy into `s` first).
            let from = (t == 0).then_some(s_in);
            delta_head_step(from, s, d_k, g, b, k, v, q, o);
            if let (Some(sp), true) = (snap_ptr, t >= snap_first) {
                let slot = t - snap_first;
                // SAFETY: head j's slice of each snapshot belongs to this task only.
                let dst = unsafe { sp.slice_mut(slot * state_len + j * head_len, head_len) };
                dst.copy_from_slice(s);
            }
        }
    });
}

/// Drives a rows-outer kernel over a head's `d_v` state rows of `d_k` (read from `src`):
/// `rows(vi, 2)` for rows `vi, vi + 1`, then `rows(vi, 1)` for an odd last row. Two rows at a time because each
/// row's tokens form one dependency chain (the dot product feeds the update), so a second
/// independent chain keeps the pipes busy; the state of the pair after next is prefetched while a
/// pair runs its tokens, since a run of several tokens keeps the core busy long enough that the
/// out-of-order window no longer reaches the next rows' loads by itself (see `prefetch`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn row_pairs(src: &[f32], d_k: usize, d_v: usize, mut rows: impl FnMut(usize, usize)) {
    let pair_bytes = 2 * d_k * 4;
    let ahead = |vi: usize| src.as_ptr().wrapping_add(vi * d_k) as *const u8;
    let l2 = crate::prefetch::intel_l2();
    crate::prefetch::whole(ahead(2), pair_bytes, l2);
    let mut vi = 0;
    while vi + 2 <= d_v {
        crate::prefetch::whole(ahead(vi + 4), pair_bytes, l2);
        rows(vi, 2);
        vi += 2;
    }
    if vi < d_v {
        rows(vi, 1);
    }
}

/// Per-token inputs of one head for the rows-outer kernels, as strided views into the layer's
/// token-major inputs: token `t`'s key is `k[t·qk_stride..][..d_k]`, its value for row `vi` is
/// `v[t·v_stride + vi]`, its decay and β are `decay[t·gb_stride]`, `beta[t·gb_stride]`.
#[cfg(target_arch = "x86_64")]
struct HeadTokens<'a> {
    pub n: usize,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub qk_stride: usize,
    pub v: &'a [f32],
    pub v_stride: usize,
    pub decay: &'a [f32],
    pub beta: &'a [f32],
    pub gb_stride: usize,
}

/// Where a rows-outer run's per-token results go, as raw pointers (each head writes only its
/// own part).
#[cfg(target_arch = "x86_64")]
struct HeadOutputs {
    /// Output of token `t`, row `vi` at `out + t·out_stride + vi`; null for none.
    pub out: *mut f32,
    pub out_stride: usize,
    /// State after token `t ≥ snap_first` at `snap + (t − snap_first)·snap_stride` (the head's
    /// part of that snapshot slot); null for none.
    pub snap: *mut f32,
    pub snap_stride: usize,
    pub snap_first: usize,
}

/// Owned per-token inputs of the recurrence (see [`GdnInputs`]).
#[derive(Debug, Clone, Default)]
pub struct GdnInputsOwned {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub decay: Vec<f32>,
    pub beta: Vec<f32>,
}

impl GdnInputsOwned {
    /// Borrowed view of tokens `a..b`.
    pub fn range(&self, shape: GdnShape, a: usize, b: usize) -> GdnInputs<'_> {
        let (qk, vv, nv) = (shape.n_k * shape.d_k, shape.n_v * shape.d_v, shape.n_v);
        GdnInputs {
            q: &self.q[a * qk..b * qk],
            k: &self.k[a * qk..b * qk],
            v: &self.v[a * vv..b * vv],
            decay: &self.decay[a * nv..b * nv],
            beta: &self.beta[a * nv..b * nv],
        }
    }
    /// Owned copy of tokens `a..b`.
    pub fn range_owned(&self, shape: GdnShape, a: usize, b: usize) -> GdnInputsOwned {
        let r = self.range(shape, a, b);
        GdnInputsOwned {
            q: r.q.to_vec(),
            k: r.k.to_vec(),
            v: r.v.to_vec(),
            decay: r.decay.to_vec(),
            beta: r.beta.to_vec(),
        }
    }
    /// Keeps tokens `0..n`.
    pub fn truncate(&mut self, shape: GdnShape, n: usize) {
        let (qk, vv) = (shape.n_k * shape.d_k, shape.n_v * shape.d_v);
        self.q.truncate(n * qk);
        self.k.truncate(n * qk);
        self.v.truncate(n * vv);
        self.decay.truncate(n * shape.n_v);
        self.beta.truncate(n * shape.n_v);
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.q.len() + self.k.len() + self.v.len() + self.decay.len() + self.beta.len())
    }
}

/// Per-layer constants that turn projections into recurrence inputs.
#[derive(Debug, Clone, Copy)]
pub struct GdnGates<'a> {
    /// `ssm_dt.bias`, `n_v`.
    pub dt_bias: &'a [f32],
    /// `ssm_a` = −exp(A_log), `n_v`.
    pub a: &'a [f32],
    /// RMS epsilon, also used by the q/k L2 norm.
    pub eps: f32,
}

/// Builds the recurrence inputs from the conv output (`T × conv_dim`, after SiLU, ordered
/// `[q | k | v]`) and the `alpha`/`beta` projections (`T × n_v`), per docs/qwen35.md §3.5
/// steps 3–5: L2-normalise q and k per key head, scale q by 1/√d_k, β = σ(b),
/// γ = exp(a·softplus(α + dt)).
pub fn prepare_inputs(
    shape: GdnShape,
    conv_out: &[f32],
    alpha: &[f32],
    beta_logits: &[f32],
    gates: GdnGates<'_>,
) -> GdnInputsOwned {
    use crate::activation::{sigmoid, softplus};
    use crate::norm::l2_norm_inplace;
    let key_dim = shape.n_k * shape.d_k;
    let val_dim = shape.n_v * shape.d_v;
    let conv_dim = 2 * key_dim + val_dim;
    let t_len = conv_out.len() / conv_dim;
    let mut r = GdnInputsOwned {
        q: Vec::with_capacity(t_len * key_dim),
        k: Vec::with_capacity(t_len * key_dim),
        v: Vec::with_capacity(t_len * val_dim),
        decay: Vec::with_capacity(t_len * shape.n_v),
        beta: Vec::with_capacity(t_len * shape.n_v),
    };
    let q_scale = 1.0 / (shape.d_k as f32).sqrt();
    for t in 0..t_len {
        let row = &conv_out[t * conv_dim..(t + 1) * conv_dim];
        let q0 = r.q.len();
        r.q.extend_from_slice(&row[..key_dim]);
        r.k.extend_from_slice(&row[key_dim..2 * key_dim]);
        r.v.extend_from_slice(&row[2 * key_dim..]);
        for h in 0..shape.n_k {
            let qh = &mut r.q[q0 + h * shape.d_k..q0 + (h + 1) * shape.d_k];
            l2_norm_inplace(qh, gates.eps);
            for v in qh.iter_mut() {
                *v *= q_scale;
            }
            l2_norm_inplace(
                &mut r.k[q0 + h * shape.d_k..q0 + (h + 1) * shape.d_k],
                gates.eps,
            );
        }
        for j in 0..shape.n_v {
            let i = t * shape.n_v + j;
            r.beta.push(sigmoid(beta_logits[i]));
            r.decay
                .push((gates.a[j] * softplus(alpha[i] + gates.dt_bias[j])).exp());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        }
    }

    /// Every rows-outer kernel this CPU can run (rows in registers on AVX-512 where the row
    /// length allows, in L1 on AVX2 — fused sweeps without snapshots, two passes per token with
    /// them) must give the token-by-token kernel's state, outputs and snapshots bit for bit:
    /// decode, verification batches and the rollback replay take either path depending on the
    /// level and the row length.
    #[test]
    fn rows_outer_equal_token_by_token() {
        for d in [32, 40, 64, 96, 128] {
            for (n_k, n_v, t_len, d_v) in
                [(2, 4, 1, d), (1, 2, 3, d + 1), (2, 2, 7, 5), (1, 1, 2, 3)]
            {
                let shape = GdnShape {
                    n_k,
                    n_v,
                    d_k: d,
                    d_v,
                    tiled: true,
                };
                let mut r = lcg((d * 31 + t_len) as u64);
                let mut gen = |n: usize, a: f32, b: f32| -> Vec<f32> {
                    (0..n).map(|_| a + b * r()).collect()
                };
                let q = gen(t_len * n_k * d, 0.0, 0.3);
                let k = gen(t_len * n_k * d, 0.0, 0.3);
                let v = gen(t_len * n_v * d_v, 0.0, 2.0);
                let decay = gen(t_len * n_v, 0.8, 0.3);
                let beta = gen(t_len * n_v, 0.5, 0.8);
                let s0 = gen(shape.state_len(), 0.0, 1.0);
                let inp = GdnInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    decay: &decay,
                    beta: &beta,
                };
                let first = t_len / 2;
                let slots = t_len - first;
                // (snapshots, outputs) asked for or not
                let go = |rows: Rows, snaps: bool, outs: bool| {
                    let mut st = vec![0f32; shape.state_len()];
                    let mut out = vec![0f32; if outs { t_len * n_v * d_v } else { 0 }];
                    let mut snap = vec![0f32; slots * shape.state_len()];
                    run(
                        shape,
                        &s0,
                        &mut st,
                        inp,
                        &mut out,
                        snaps.then_some((&mut snap, first)),
                        rows,
                    );
                    (st, out, snap)
                };
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for (snaps, outs) in [(true, true), (false, true), (false, false)] {
                    let want = go(Rows::TokenByToken, snaps, outs);
                    for rows in kernels(d) {
                        let got = go(rows, snaps, outs);
                        let what = format!(
                            "{rows:?}, d_k {d}, d_v {d_v}, {t_len} tokens, snapshots {snaps}, outputs {outs}"
                        );
                        assert_eq!(bits(&got.0), bits(&want.0), "state, {what}");
                        assert_eq!(bits(&got.1), bits(&want.1), "outputs, {what}");
                        assert_eq!(bits(&got.2), bits(&want.2), "snapshots, {what}");
                    }
                }
            }
        }
    }

    /// The rows-outer kernels this CPU can run for rows of `d_k`.
    fn kernels(d_k: usize) -> Vec<Rows> {
        #[allow(unused_mut)] // pushed to on x86 only
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::has_avx2() {
                all.push(Rows::InL1);
            }
            if crate::isa() >= crate::Isa::Avx512Vnni && avx512::supports(d_k) {
                all.push(Rows::InRegisters);
            }
        }
        let _ = d_k;
        all
    }
}
