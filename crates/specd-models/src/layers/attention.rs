//! Self-attention: the Llama/Qwen3 form and Qwen3.5's gated form (q_proj emits per head a query
//! and a sigmoid output gate, interleaved; docs/qwen35.md §3.4).

use super::{gather, scatter, SeqRows};
use crate::weights::Loader;
use crate::ModelError;
use specd_memory::kv::KvBuf;
use specd_memory::Memory;
use specd_ops::activation::sigmoid;
use specd_ops::attention::{attention, AttnShape};
use specd_ops::norm::rms_norm_inplace;
use specd_ops::rope::Rope;
use specd_ops::scratch::Buf;
use specd_ops::{matmul, matmul_many, Weight};

/// Weights of one attention layer.
pub struct Attention {
    pub q: Weight,
    pub k: Weight,
    pub v: Weight,
    pub o: Weight,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Qwen3.5 output gate interleaved in `q`.
    pub gated: bool,
    pub shape: AttnShape,
    pub eps: f32,
}

impl Attention {
    /// Loads `blk.{i}.attn_*`. `qk_norm`: the file must carry `attn_q_norm`/`attn_k_norm`.
    pub fn load(
        l: &Loader,
        i: usize,
        n_embd: usize,
        shape: AttnShape,
        gated: bool,
        qk_norm: bool,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let qd = shape.n_head * shape.d_head;
        let kvd = shape.n_kv * shape.d_head;
        let p = |s: &str| format!("blk.{i}.{s}");
        let (q_norm, k_norm) = if qk_norm {
            (
                Some(l.vector(&p("attn_q_norm.weight"), shape.d_head)?),
                Some(l.vector(&p("attn_k_norm.weight"), shape.d_head)?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            q: l.matrix(&p("attn_q.weight"), if gated { 2 * qd } else { qd }, n_embd)?,
            k: l.matrix(&p("attn_k.weight"), kvd, n_embd)?,
            v: l.matrix(&p("attn_v.weight"), kvd, n_embd)?,
            o: l.matrix(&p("attn_output.weight"), n_embd, qd)?,
            q_norm,
            k_norm,
            gated,
            shape,
            eps,
        })
    }

    /// Runs the layer for all rows (`a`: `n × n_embd`, normed), appending K/V to layer
    /// `kv_layer` of each sequence's memory. Returns `n × n_embd`.
    pub fn forward(
        &self,
        a: &[f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
        kv_layer: usize,
    ) -> Result<Buf, ModelError> {
        let AttnShape {
            n_head,
            n_kv,
            d_head,
        } = self.shape;
        let qd = n_head * d_head;
        let kvd = n_kv * d_head;
        let mut qg = Buf::output(n * self.q.rows);
        let mut k = Buf::output(n * kvd);
        let mut v = Buf::output(n * kvd);
        matmul_many(
            a,
            n,
            &[&self.q, &self.k, &self.v],
            &mut [&mut qg, &mut k, &mut v],
        )?;
        // Split query and gate (interleaved per head in the gated form).
        let (mut q, gate) = if self.gated {
            let mut q = Buf::output(n * qd);
            let mut g = Buf::output(n * qd);
            for r in 0..n {
                for h in 0..n_head {
                    let src = &qg[r * 2 * qd + 2 * h * d_head..];
                    q[r * qd + h * d_head..][..d_head].copy_from_slice(&src[..d_head]);
                    g[r * qd + h * d_head..][..d_head].copy_from_slice(&src[d_head..2 * d_head]);
                }
            }
            (q, Some(g))
        } else {
            (qg, None)
        };
        if let Some(w) = &self.q_norm {
            for h in q.chunks_exact_mut(d_head) {
                rms_norm_inplace(h, w, self.eps);
            }
        }
        if let Some(w) = &self.k_norm {
            for h in k.chunks_exact_mut(d_head) {
                rms_norm_inplace(h, w, self.eps);
            }
        }
        // Every row belongs to one group: the scatters write all of `o`.
        let mut o = Buf::output(n * qd);
        let scale = 1.0 / (d_head as f32).sqrt();
        for g in groups {
            let mut qs = gather(&q, qd, &g.rows).into_owned();
            let mut ks = gather(&k, kvd, &g.rows).into_owned();
            let vs = gather(&v, kvd, &g.rows);
            for (j, &pos) in g.positions.iter().enumerate() {
                rope.apply_heads(&mut qs[j * qd..(j + 1) * qd], d_head, pos);
                rope.apply_heads(&mut ks[j * kvd..(j + 1) * kvd], d_head, pos);
            }
            mem.kv_append(g.seq, kv_layer, &ks, &vs)?;
            let cache = mem.kv(g.seq, kv_layer)?;
            let mut os = Buf::output(qs.len());
            let (pos, sh) = (&g.positions, self.shape);
            match (&cache.k, &cache.v) {
                (KvBuf::F32(k), KvBuf::F32(v)) => attention(&qs, pos, k, v, sh, scale, &mut os),
                (KvBuf::F16(k), KvBuf::F16(v)) => attention(&qs, pos, k, v, sh, scale, &mut os),
                (KvBuf::F32(k), KvBuf::F16(v)) => attention(&qs, pos, k, v, sh, scale, &mut os),
                (KvBuf::F16(k), KvBuf::F32(v)) => attention(&qs, pos, k, v, sh, scale, &mut os),
            }
            scatter(&os, qd, &g.rows, &mut o);
        }
        if let Some(g) = gate {
            for (x, &gv) in o.iter_mut().zip(g.iter()) {
                *x *= sigmoid(gv);
            }
        }
        let mut out = Buf::output(n * self.o.rows);
        matmul(&o, n, &self.o, &mut out)?;
        Ok(out)
    }
}
