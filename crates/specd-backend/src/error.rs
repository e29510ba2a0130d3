//! Errors at the seam.

use specd_memory::MemoryError;

/// Errors of a backend call. None leaves a sequence half-changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The sequence memory refused (context full, unknown sequence, …).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A row the model cannot take (token out of vocabulary, position out of order).
    #[error("invalid batch: {0}")]
    BadBatch(String),
    /// The model cannot do what was asked (no MTP head, …).
    #[error("{0}")]
    Unsupported(String),
    /// The backend failed (a kernel's error, a lost device), in its words.
    #[error("{0}")]
    Failed(String),
}
