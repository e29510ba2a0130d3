//! A sequence's memory as bytes ([`Memory::save_sequence`] / [`Memory::load_sequence`]): what
//! the server's slot save writes to a file and slot restore reads back into any sequence of a
//! memory with the same layout. It holds the attention KV of every position, the current
//! recurrent state and the sequence's checkpoints (so a restored slot can still reuse a prompt
//! prefix that ends before its last position). Rollback records are not saved: a restored
//! sequence starts like one whose last batch is settled.
//!
//! Format (little-endian): magic `SPCDMEM\0`, version u32, the layout (attention layers, KV row,
//! recurrent layers, conv floats, state floats: u32 each), positions u64, K and V element types
//! (u8 each), then per attention layer the K then V values of every position in their stored
//! type, per recurrent layer its conv then delta-rule floats, the checkpoint count u32 and per
//! checkpoint its position u64 and per recurrent layer its conv then state floats. Written by
//! hand: the bulk is flat float arrays, and a reader that checks every length against the
//! layout before touching the memory is short.

use crate::checkpoint::Checkpoint;
use crate::kv::{KvBuf, KvLayer, KvType};
use crate::recurrent::RecLayer;
use crate::sequence::Sequence;
use crate::{Memory, MemoryError, SeqId};
use half::f16;

const MAGIC: &[u8; 8] = b"SPCDMEM\0";
const VERSION: u32 = 1;

fn bad(msg: impl Into<String>) -> MemoryError {
    MemoryError::BadSavedState(msg.into())
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.0.reserve(v.len() * 4);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    fn kv(&mut self, b: &KvBuf) {
        match b {
            KvBuf::F32(v) => self.f32s(v),
            KvBuf::F16(v) => {
                self.0.reserve(v.len() * 2);
                for x in v {
                    self.0.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MemoryError> {
        if self.0.len() < n {
            return Err(bad("the saved state ends early"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, MemoryError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, MemoryError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, MemoryError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, MemoryError> {
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| bad("a length in the saved state overflows"))?;
        Ok(self
            .take(bytes)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    /// `n` stored values of type `t`, widened to f32 (the memory re-stores them in its own type).
    fn kv(&mut self, t: KvType, n: usize) -> Result<Vec<f32>, MemoryError> {
        match t {
            KvType::F32 => self.f32s(n),
            KvType::F16 => {
                let bytes = n
                    .checked_mul(2)
                    .ok_or_else(|| bad("a length in the saved state overflows"))?;
                Ok(self
                    .take(bytes)?
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect())
            }
        }
    }
}

fn kv_type_code(t: KvType) -> u8 {
    match t {
        KvType::F32 => 0,
        KvType::F16 => 1,
    }
}

fn kv_type_of(code: u8) -> Result<KvType, MemoryError> {
    match code {
        0 => Ok(KvType::F32),
        1 => Ok(KvType::F16),
        c => Err(bad(format!("unknown KV element type {c}"))),
    }
}

impl Memory {
    /// `seq`'s memory as bytes (an unknown sequence saves as empty). Fails while a batch of
    /// `seq` is in progress.
    pub fn save_sequence(&self, seq: SeqId) -> Result<Vec<u8>, MemoryError> {
        let lay = *self.layout();
        let (conv_len, state_len) = rec_lens(&lay);
        let (tk, tv) = (self.config().kv_type_k, self.config().kv_type_v);
        let s = self.seq(seq);
        if s.is_some_and(|s| s.in_batch.is_some()) {
            return Err(MemoryError::BatchInProgress { seq });
        }
        let n_past = s.map_or(0, |s| s.n_past);
        let mut w = Writer(Vec::with_capacity(
            64 + n_past * lay.kv_bytes_per_pos() + lay.recurrent_state_bytes(),
        ));
        w.0.extend_from_slice(MAGIC);
        w.u32(VERSION);
        for v in [
            lay.attn_layers,
            lay.kv_row,
            lay.rec_layers,
            conv_len,
            state_len,
        ] {
            w.u32(v as u32);
        }
        w.u64(n_past as u64);
        let (tk, tv) = match s.and_then(|s| s.kv.first()) {
            Some(l) => (buf_type(&l.k), buf_type(&l.v)),
            None => (tk, tv),
        };
        w.u8(kv_type_code(tk));
        w.u8(kv_type_code(tv));
        let fresh = (lay.rec_layers > 0).then(|| RecLayer::new(&lay));
        for i in 0..lay.attn_layers {
            if let Some(l) = s.and_then(|s| s.kv.get(i)) {
                w.kv(&l.k);
                w.kv(&l.v);
            }
        }
        for i in 0..lay.rec_layers {
            if let Some(l) = s.and_then(|s| s.rec.get(i)).or(fresh.as_ref()) {
                let (c, st) = l.current();
                w.f32s(c);
                w.f32s(st);
            }
        }
        let cps: Vec<&Checkpoint> = self
            .checkpoints_of(seq)
            .into_iter()
            .filter_map(|(id, _)| self.checkpoint_ref(id))
            .collect();
        w.u32(cps.len() as u32);
        for cp in cps {
            w.u64(cp.pos as u64);
            for (c, st) in &cp.layers {
                w.f32s(c);
                w.f32s(st);
            }
        }
        Ok(w.0)
    }

    /// Replaces `seq`'s memory (and checkpoints) with saved bytes; returns the positions it now
    /// holds. Everything is checked against this memory's layout and context before anything
    /// changes: on error `seq` is as it was. KV values saved in another element type are
    /// converted to this memory's.
    pub fn load_sequence(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, MemoryError> {
        let lay = *self.layout();
        let (conv_len, state_len) = rec_lens(&lay);
        let mut r = Reader(bytes);
        if r.take(MAGIC.len()).ok() != Some(MAGIC.as_slice()) {
            return Err(bad("not a specd sequence state"));
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(bad(format!(
                "sequence state version {version} (this build reads {VERSION})"
            )));
        }
        let want = [
            lay.attn_layers,
            lay.kv_row,
            lay.rec_layers,
            conv_len,
            state_len,
        ];
        for (what, &w) in [
            "attention layers",
            "KV row",
            "recurrent layers",
            "conv state",
            "delta-rule state",
        ]
        .iter()
        .zip(&want)
        {
            let got = r.u32()? as usize;
            if got != w {
                return Err(bad(format!(
                    "saved for another model: {what} {got}, this model has {w}"
                )));
            }
        }
        let n_past = usize::try_from(r.u64()?).map_err(|_| bad("position count overflows"))?;
        let n_ctx = self.config().n_ctx;
        if n_past > n_ctx {
            return Err(bad(format!(
                "{n_past} positions do not fit the context of {n_ctx}"
            )));
        }
        if !self.has_seq(seq) && n_past > 0 && self.n_seqs() >= self.config().max_seqs {
            return Err(MemoryError::TooManySequences(self.config().max_seqs));
        }
        let (tk, tv) = (kv_type_of(r.u8()?)?, kv_type_of(r.u8()?)?);
        let (mk, mv) = (self.config().kv_type_k, self.config().kv_type_v);
        let n_vals = n_past
            .checked_mul(lay.kv_row)
            .ok_or_else(|| bad("KV size overflows"))?;
        let mut kv = Vec::with_capacity(lay.attn_layers);
        for _ in 0..lay.attn_layers {
            let mut l = KvLayer::new(mk, mv);
            let k = r.kv(tk, n_vals)?;
            let v = r.kv(tv, n_vals)?;
            l.append(&k, &v);
            kv.push(l);
        }
        let mut rec = Vec::with_capacity(lay.rec_layers);
        for _ in 0..lay.rec_layers {
            let c = r.f32s(conv_len)?;
            let st = r.f32s(state_len)?;
            let mut l = RecLayer::new(&lay);
            l.set_current(&c, &st);
            rec.push(l);
        }
        let n_cp = r.u32()? as usize;
        let mut cps = Vec::new();
        for _ in 0..n_cp {
            let pos = usize::try_from(r.u64()?).map_err(|_| bad("position overflows"))?;
            if pos > n_past {
                return Err(bad(format!(
                    "checkpoint at {pos} lies after the last position {n_past}"
                )));
            }
            let mut layers = Vec::with_capacity(lay.rec_layers);
            for _ in 0..lay.rec_layers {
                layers.push((r.f32s(conv_len)?, r.f32s(state_len)?));
            }
            cps.push(Checkpoint { seq, pos, layers });
        }
        if !r.0.is_empty() {
            return Err(bad(format!(
                "{} bytes after the end of the sequence state",
                r.0.len()
            )));
        }
        self.clear(seq);
        if n_past > 0 {
            self.put_seq(
                seq,
                Sequence {
                    n_past,
                    kv,
                    rec,
                    record: None,
                    in_batch: None,
                },
            );
            for cp in cps {
                self.insert_checkpoint(cp);
            }
        }
        Ok(n_past)
    }
}

/// Floats of one recurrent layer's conv and delta-rule state (0 without recurrent layers).
fn rec_lens(lay: &crate::MemoryLayout) -> (usize, usize) {
    if lay.rec_layers == 0 {
        return (0, 0);
    }
    (
        (lay.conv_kernel - 1) * lay.conv_channels,
        lay.gdn.state_len(),
    )
}

fn buf_type(b: &KvBuf) -> KvType {
    match b {
        KvBuf::F32(_) => KvType::F32,
        KvBuf::F16(_) => KvType::F16,
    }
}
