//! The CPU backend: [`Model`] (weights as the CPU kernels hold them, the thread pool, scratch)
//! and [`Memory`] (KV and recurrent state in host memory) behind the seam's interfaces.

use crate::output::{DecodeOutput, HostHidden};
use crate::{Model, ModelError};
use specd_backend::{
    Backend, BackendError, Batch, CheckpointId, Context, Decoded, DeviceInfo, HiddenRows,
    MemoryConfig, MemoryError, MemoryUsage, ModelInfo, MtpContext, Output, SeqId, SequenceMemory,
};
use specd_memory::Memory;
use specd_tokenizer::Tokenizer;
use std::any::Any;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

impl From<ModelError> for BackendError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Memory(m) => BackendError::Memory(m),
            ModelError::BadBatch(s) => BackendError::BadBatch(s),
            e => BackendError::Failed(e.to_string()),
        }
    }
}

/// A model on the CPU.
pub struct CpuBackend {
    model: Arc<Model>,
    info: ModelInfo,
}

impl CpuBackend {
    /// The backend of a loaded model.
    pub fn new(model: Arc<Model>) -> Self {
        let c = model.config();
        let info = ModelInfo {
            arch: c.arch.name().to_string(),
            n_vocab: c.n_vocab,
            n_embd: c.n_embd,
            n_layer: c.n_layer,
            n_ctx_train: c.n_ctx_train,
            n_params: model.n_params(),
            file_weight_bytes: model.file_weight_bytes(),
            file_type: model.file_type().to_string(),
            has_mtp: model.has_mtp(),
            hybrid: model.memory_layout().is_hybrid(),
        };
        CpuBackend { model, info }
    }
    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn tokenizer(&self) -> &Tokenizer {
        self.model.tokenizer()
    }
    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            backend: "cpu",
            name: format!("CPU, {} threads", self.model.n_threads()),
            weight_bytes: self.model.weight_bytes(),
        }
    }
    fn new_context(&self, cfg: MemoryConfig) -> Result<Box<dyn Context>, BackendError> {
        Ok(Box::new(CpuContext {
            mem: self.model.new_memory(cfg),
            model: self.model.clone(),
        }))
    }
    fn new_mtp_context(&self, cfg: MemoryConfig) -> Result<Box<dyn MtpContext>, BackendError> {
        Ok(Box::new(CpuMtp {
            mem: self.model.new_mtp_memory(cfg)?,
            model: self.model.clone(),
            out: MtpOutput::default(),
            prev: Vec::new(),
        }))
    }
}

/// Sequences of a CPU model: a [`Memory`] in host memory.
pub struct CpuContext {
    model: Arc<Model>,
    mem: Memory,
}

impl CpuContext {
    /// The memory (tests and tools that read state directly).
    pub fn memory(&self) -> &Memory {
        &self.mem
    }
}

impl SequenceMemory for CpuContext {
    fn config(&self) -> &MemoryConfig {
        self.mem.config()
    }
    fn is_hybrid(&self) -> bool {
        self.mem.layout().is_hybrid()
    }
    fn n_past(&self, seq: SeqId) -> usize {
        self.mem.n_past(seq)
    }
    fn sequences(&self) -> Vec<SeqId> {
        self.mem.sequences()
    }
    fn rollback_capacity(&self, seq: SeqId) -> usize {
        self.mem.rollback_capacity(seq)
    }
    fn rollback(&mut self, seq: SeqId, n: usize) -> Result<(), MemoryError> {
        self.model.rollback(&mut self.mem, seq, n)
    }
    fn remove_from(&mut self, seq: SeqId, p0: usize) -> Result<(), MemoryError> {
        self.mem.remove_from(seq, p0)
    }
    fn clear(&mut self, seq: SeqId) {
        self.mem.clear(seq)
    }
    fn checkpoint(&mut self, seq: SeqId) -> Result<Option<CheckpointId>, MemoryError> {
        self.mem.checkpoint(seq)
    }
    fn restore(&mut self, seq: SeqId, id: CheckpointId) -> Result<(), MemoryError> {
        self.mem.restore(seq, id)
    }
    fn drop_checkpoint(&mut self, id: CheckpointId) {
        self.mem.drop_checkpoint(id)
    }
    fn checkpoints_of(&self, seq: SeqId) -> Vec<(CheckpointId, usize)> {
        self.mem.checkpoints_of(seq)
    }
    fn save_sequence(&self, seq: SeqId) -> Result<Vec<u8>, MemoryError> {
        self.mem.save_sequence(seq)
    }
    fn load_sequence(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, MemoryError> {
        self.mem.load_sequence(seq, bytes)
    }
    fn usage(&self) -> MemoryUsage {
        self.mem.usage()
    }
}

impl Context for CpuContext {
    fn new_output(&self) -> Box<dyn Output> {
        Box::new(DecodeOutput::default())
    }
    fn decode(
        &mut self,
        batch: &Batch,
        out: &mut dyn Output,
        on_chunk: &mut dyn FnMut(usize) -> ControlFlow<()>,
    ) -> Result<Decoded, BackendError> {
        let out = (out as &mut dyn Any)
            .downcast_mut::<DecodeOutput>()
            .ok_or_else(|| BackendError::Failed("an output of another backend".into()))?;
        // The CPU kernels return when their work is done: the wall time is the cost.
        let t0 = Instant::now();
        let rows = self
            .model
            .decode_chunks(&mut self.mem, batch, out, on_chunk)?;
        Ok(Decoded {
            rows,
            secs: t0.elapsed().as_secs_f64(),
        })
    }
}

/// The MTP head's output: the last row's logits and every row's hidden state.
#[derive(Default)]
struct MtpOutput {
    logits: Vec<f32>,
    hidden: Option<Arc<HostHidden>>,
    rows: [usize; 1],
}

impl Output for MtpOutput {
    fn rows(&self) -> &[usize] {
        &self.rows
    }
    fn logits(&self, _i: usize) -> &[f32] {
        &self.logits
    }
    fn hidden(&self) -> Option<HiddenRows> {
        let h = self.hidden.clone()?;
        let n = h.data.len() / h.n_embd.max(1);
        Some(HiddenRows::new(h, n))
    }
}

/// The MTP head of a CPU model with its one-layer memory (sequence 0).
struct CpuMtp {
    model: Arc<Model>,
    mem: Memory,
    out: MtpOutput,
    /// The rows' previous hidden states gathered into one host buffer (kept for its capacity).
    prev: Vec<f32>,
}

const MTP_SEQ: SeqId = 0;

impl CpuMtp {
    /// Gathers `prev` into `self.prev`: rows of this backend's host buffers, or zeros.
    fn gather(&mut self, prev: &[HiddenRows]) -> Result<(), BackendError> {
        let h = self.model.config().n_embd;
        self.prev.clear();
        for part in prev {
            if part.is_zeros() {
                self.prev.resize(self.prev.len() + part.len() * h, 0.0);
                continue;
            }
            let (store, rows) = part.store::<HostHidden>().ok_or_else(|| {
                BackendError::Failed("MTP: hidden states of another backend".into())
            })?;
            if store.n_embd != h {
                return Err(BackendError::BadBatch(format!(
                    "MTP: hidden states of width {} for a model of {h}",
                    store.n_embd
                )));
            }
            self.prev
                .extend_from_slice(&store.data[rows.start * h..rows.end * h]);
        }
        Ok(())
    }
}

impl MtpContext for CpuMtp {
    fn decode(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        prev: &[HiddenRows],
    ) -> Result<&dyn Output, BackendError> {
        self.gather(prev)?;
        let (hidden, logits) =
            self.model
                .decode_mtp(&mut self.mem, MTP_SEQ, tokens, pos0, &self.prev)?;
        self.out = MtpOutput {
            logits,
            hidden: Some(Arc::new(HostHidden {
                data: hidden,
                n_embd: self.model.config().n_embd,
            })),
            rows: [tokens.len().saturating_sub(1)],
        };
        Ok(&self.out)
    }
    fn n_past(&self) -> usize {
        self.mem.n_past(MTP_SEQ)
    }
    fn n_ctx(&self) -> usize {
        self.mem.config().n_ctx
    }
    fn remove_from(&mut self, p0: usize) -> Result<(), BackendError> {
        Ok(self.mem.remove_from(MTP_SEQ, p0)?)
    }
}
