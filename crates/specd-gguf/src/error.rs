//! Errors: each names what is wrong and where.

/// Everything that can be wrong with a GGUF file or a request for its contents.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("io error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic {0:#010x})")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (2 and 3 are supported)")]
    UnsupportedVersion(u32),
    #[error("file truncated while reading {what}")]
    Truncated { what: String },
    #[error("invalid GGUF: {0}")]
    Invalid(String),
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongKeyType {
        key: String,
        expected: String,
        found: String,
    },
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("tensor '{name}' is missing")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor '{name}' has type {ttype}, which is not supported")]
    UnsupportedTensorType { name: String, ttype: String },
    #[error("tensor '{name}': unknown type id {id}")]
    UnknownTensorType { name: String, id: u32 },
    /// The tensor's data range ends past the end of the file (truncated file or corrupt offset).
    #[error(
        "tensor '{name}': data [{start}, {end}) lies outside the file ({file_len} bytes; truncated?)"
    )]
    TensorOutOfBounds {
        name: String,
        /// Absolute byte range the tensor index claims (`end` saturates on overflow).
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// The tensor's offset is not a multiple of the file's data alignment.
    #[error(
        "tensor '{name}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    TensorMisaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("duplicate tensor '{0}'")]
    DuplicateTensor(String),
    #[error("tensor '{name}': {detail}")]
    BadTensor { name: String, detail: String },
}
