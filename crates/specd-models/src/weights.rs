//! Turning GGUF tensors into kernel-ready weights.
//!
//! Types with a native kernel (F32, F16, BF16, Q8_0, Q4_0) stay in the memory map: no copy, no
//! load-time cost — except Q8_0 on AVX-512 VNNI CPUs, which is repacked once into 16-row
//! interleaved groups (`specd_ops::pack`; `SPECD_NO_REPACK` keeps ggml's layout). Other
//! quantisations (Q4_1, Q5_x, K-quants) are dequantised to F32 once at load — exact, but 4× the
//! memory of F32; native kernels for them are future work.

use crate::ModelError;
use specd_gguf::{GgufFile, TensorType};
use specd_ops::{ByteSource, Weight, WeightType};
use std::sync::Arc;

/// Bytes of one tensor, kept alive by the memory map they live in.
struct TensorBytes(specd_gguf::SharedBytes);

impl ByteSource for TensorBytes {
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Loads tensors of one GGUF file.
pub struct Loader<'a> {
    pub g: &'a GgufFile,
}

fn native(t: TensorType) -> Option<WeightType> {
    Some(match t {
        TensorType::F32 => WeightType::F32,
        TensorType::F16 => WeightType::F16,
        TensorType::BF16 => WeightType::BF16,
        TensorType::Q8_0 => WeightType::Q8_0,
        TensorType::Q4_0 => WeightType::Q4_0,
        _ => return None,
    })
}

impl<'a> Loader<'a> {
    /// A loader over `g`.
    pub fn new(g: &'a GgufFile) -> Self {
        Loader { g }
    }

    /// True if the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.g.has_tensor(name)
    }

    /// Matrix `name` with GGUF `ne = [cols, rows]` (math shape `[rows, cols]`).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, ModelError> {
        let view = self.g.expect_tensor(name, &[cols as u64, rows as u64])?;
        let tt = view.info().ttype;
        match native(tt) {
            Some(wt) => {
                let bytes = view.bytes_arc();
                let len = bytes.len();
                let w = Weight::new(wt, rows, cols, Arc::new(TensorBytes(bytes)), 0, len)?;
                // Q8_0 is repacked for the AVX-512 VNNI kernel (a copy, same size).
                Ok(specd_ops::pack::for_current_isa(&w)?)
            }
            None => {
                let data = view.to_f32()?;
                Ok(Weight::from_f32(rows, cols, &data)?)
            }
        }
    }

    /// Optional matrix.
    pub fn matrix_opt(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Weight>, ModelError> {
        if self.has(name) {
            self.matrix(name, rows, cols).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Vector `name` of `len` floats (any type, dequantised).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let view = self.g.expect_tensor(name, &[len as u64])?;
        Ok(view.to_f32()?)
    }

    /// Optional vector.
    pub fn vector_opt(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A tensor with arbitrary `ne` dims, as f32 (conv kernels).
    pub fn tensor_f32(&self, name: &str, ne: &[u64]) -> Result<Vec<f32>, ModelError> {
        let view = self.g.expect_tensor(name, ne)?;
        Ok(view.to_f32()?)
    }
}
