//! A backend: a model loaded for one kind of hardware, which makes contexts.

use crate::{BackendError, Context, MtpContext};
use specd_memory::MemoryConfig;
use specd_tokenizer::Tokenizer;

/// What the engine and the server know of a model, whatever runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `general.architecture` (`qwen35`, `llama`, …).
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    /// Trunk layers (without an MTP block).
    pub n_layer: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// Elements of all the file's tensors (llama.cpp's `n_params`).
    pub n_params: u64,
    /// Bytes of the tensors in the file.
    pub file_weight_bytes: usize,
    /// The file type's name, as llama.cpp gives it ("Q4_K - Medium").
    pub file_type: String,
    /// True if the file carries an MTP (NextN) head.
    pub has_mtp: bool,
    /// True if the model has recurrent (Gated DeltaNet) layers.
    pub hybrid: bool,
}

/// Where a backend runs and what it holds there.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The backend's name (`cpu`, …).
    pub backend: &'static str,
    /// The device, in words ("CPU, 2 threads").
    pub name: String,
    /// Bytes of weights as the kernels hold them (mapped, repacked or converted).
    pub weight_bytes: usize,
}

/// A model loaded for one kind of hardware. Contexts made by one backend share its weights;
/// draft models are backends too.
pub trait Backend: Send + Sync {
    /// The model's shape and file.
    fn info(&self) -> &ModelInfo;
    /// The tokenizer from the file.
    fn tokenizer(&self) -> &Tokenizer;
    /// Where it runs.
    fn device(&self) -> DeviceInfo;
    /// A context for up to `cfg.max_seqs` sequences of `cfg.n_ctx` positions.
    fn new_context(&self, cfg: MemoryConfig) -> Result<Box<dyn Context>, BackendError>;
    /// The MTP head's context for one sequence (an error if the file has no head).
    fn new_mtp_context(&self, cfg: MemoryConfig) -> Result<Box<dyn MtpContext>, BackendError>;

    /// One line for logs: weight memory against the file's tensor bytes.
    fn weights_summary(&self) -> String {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        let (held, file) = (self.device().weight_bytes, self.info().file_weight_bytes);
        format!(
            "weights: {:.1} MiB in memory for {:.1} MiB of tensors in the file ({:.3}x)",
            mib(held),
            mib(file),
            held as f64 / file.max(1) as f64
        )
    }
}
