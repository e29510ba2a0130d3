//! GGUF model files: a memory-mapped reader that validates everything before trusting it, a
//! streaming writer, tensor types and block (de)quantisation.
//!
//! Written here rather than taken from candle's `gguf_file` because specd needs (a) zero-copy
//! weights borrowed from a shared memory map, (b) errors that name the key or tensor at fault for
//! every malformed file instead of panics or generic messages, and (c) a writer that streams
//! ~1 GB synthetic models to disk. Block (de)quantisation of the K-quants does come from candle.

mod error;
mod file_type;
mod iq;
mod iq4;
mod iq_grids;
pub mod quant;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file_type::{file_type_name, file_type_of};
pub use reader::{GgufFile, SharedBytes, TensorInfo, TensorView};
pub use types::TensorType;
pub use value::{GgufValue, ValueType};
pub use writer::{GgufWriter, TensorSink};

/// `GGUF` in little-endian.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default data alignment.
pub const DEFAULT_ALIGNMENT: u64 = 32;
