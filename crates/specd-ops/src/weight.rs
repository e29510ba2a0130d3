//! Weight matrices as the kernels see them: raw bytes in one of the natively supported layouts,
//! usually borrowed from the memory-mapped model file without a copy.

use crate::kquant::{self, KFormat};
use crate::legacy::{self, LegacyFormat};
use crate::OpsError;
use half::{bf16, f16};
use std::sync::Arc;

/// Weight layouts with a native matmul kernel. Other GGUF types are dequantised at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    /// ggml Q8_0: blocks of 32 weights = f16 scale + 32 × i8.
    Q8_0,
    /// ggml Q4_0: blocks of 32 weights = f16 scale + 16 bytes of nibbles (value = nibble − 8).
    Q4_0,
    /// Q8_0 repacked at load time for the AVX-512 VNNI kernel (see [`crate::pack`]): groups of
    /// 16 rows interleaved block by block, quants offset to unsigned (`q + 128`); rows past the
    /// last whole group stay in Q8_0 layout after the groups. Same size as Q8_0; rows are
    /// dequantised with [`Weight::dequantize_row`] only.
    Q8_0R16,
    /// Q4_0 repacked the same way for the AVX-512 VNNI kernel: 16-row groups, nibbles re-paired
    /// so that one 64-byte load yields two registers of four weights per row (see
    /// [`crate::pack`]). Same size as Q4_0.
    Q4_0R16,
    /// ggml IQ4_NL: blocks of 32 weights = f16 scale + 16 bytes of nibbles indexing the
    /// non-linear levels [`crate::kquant::IQ4_VALUES`] (low nibbles = weights 0..16).
    IQ4NL,
    /// IQ4_NL repacked like [`WeightType::Q4_0R16`] (the nibbles are moved, not decoded; the
    /// kernels look the levels up). Same size as IQ4_NL.
    IQ4NLR16,
    /// A super-block format (K-quants, IQ4_XS) in ggml's layout: what the file holds, before the
    /// load-time repack (see [`crate::kquant`]).
    K(KFormat),
    /// A super-block format in the 16-row interleaved layout its kernels read (see
    /// [`crate::kquant`]): up to 2.8 % larger than ggml's layout.
    KR16(KFormat),
    /// A block-32 type with an offset or a fifth bit (Q4_1, Q5_0, Q5_1) in ggml's layout, before
    /// the load-time repack (see [`crate::legacy`]).
    Legacy(LegacyFormat),
    /// Such a type in its 16-row interleaved layout (see [`crate::legacy`]); same size.
    LegacyR16(LegacyFormat),
}

impl WeightType {
    /// Weights per block.
    pub fn block_elems(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q8_0
            | WeightType::Q4_0
            | WeightType::Q8_0R16
            | WeightType::Q4_0R16
            | WeightType::IQ4NL
            | WeightType::IQ4NLR16
            | WeightType::Legacy(_)
            | WeightType::LegacyR16(_) => 32,
            WeightType::K(_) | WeightType::KR16(_) => kquant::QK_K,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::Q8_0 | WeightType::Q8_0R16 => 34,
            WeightType::Q4_0 | WeightType::Q4_0R16 | WeightType::IQ4NL | WeightType::IQ4NLR16 => 18,
            WeightType::K(f) | WeightType::KR16(f) => f.block_bytes(),
            WeightType::Legacy(f) | WeightType::LegacyR16(f) => f.block_bytes(),
        }
    }
    /// Bytes of one row of `cols` weights in ggml's layout.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }
    /// Bytes of a whole `rows × cols` matrix in this layout.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WeightType::KR16(f) => kquant::packed_bytes(f, rows, cols),
            _ => self.row_bytes(cols) * rows,
        }
    }
    /// For the 16-row interleaved layouts: the ggml type they were repacked from.
    pub fn interleaved_from(self) -> Option<WeightType> {
        match self {
            WeightType::Q8_0R16 => Some(WeightType::Q8_0),
            WeightType::Q4_0R16 => Some(WeightType::Q4_0),
            WeightType::IQ4NLR16 => Some(WeightType::IQ4NL),
            _ => None,
        }
    }
    /// Short name as llama.cpp prints it.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::BF16 => "bf16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q8_0R16 => "q8_0 (16-row interleaved)",
            WeightType::Q4_0R16 => "q4_0 (16-row interleaved)",
            WeightType::IQ4NL => "iq4_nl",
            WeightType::IQ4NLR16 => "iq4_nl (16-row interleaved)",
            WeightType::K(f) => f.name(),
            WeightType::KR16(f) => f.name_r16(),
            WeightType::Legacy(f) => f.name(),
            WeightType::LegacyR16(f) => f.name_r16(),
        }
    }
}

/// Anything that owns a byte buffer the weights live in (a memory map, a `Vec<u8>`).
pub trait ByteSource: Send + Sync {
    fn as_bytes(&self) -> &[u8];
}

impl ByteSource for Vec<u8> {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

/// A `rows × cols` weight matrix (math shape `[out, in]`, i.e. GGUF `ne = [cols, rows]`): row `o`
/// holds the `cols` weights that produce output `o`.
#[derive(Clone)]
pub struct Weight {
    pub wtype: WeightType,
    pub rows: usize,
    pub cols: usize,
    src: Arc<dyn ByteSource>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Weight({} {}x{})",
            self.wtype.name(),
            self.rows,
            self.cols
        )
    }
}

impl Weight {
    /// Wraps `len` bytes at `offset` of `src`, checking that they hold exactly `rows × cols`
    /// weights of `wtype`.
    pub fn new(
        wtype: WeightType,
        rows: usize,
        cols: usize,
        src: Arc<dyn ByteSource>,
        offset: usize,
        len: usize,
    ) -> Result<Self, OpsError> {
        if !cols.is_multiple_of(wtype.block_elems()) {
            return Err(OpsError::Shape {
                op: "weight",
                detail: format!(
                    "{cols} columns is not a multiple of the {} block",
                    wtype.name()
                ),
            });
        }
        let want = wtype.matrix_bytes(rows, cols);
        let have = src.as_bytes().len();
        if len != want || offset.checked_add(len).is_none_or(|e| e > have) {
            return Err(OpsError::Shape {
                op: "weight",
                detail: format!(
                    "{rows}x{cols} {} needs {want} bytes, got {len}",
                    wtype.name()
                ),
            });
        }
        Ok(Weight {
            wtype,
            rows,
            cols,
            src,
            offset,
            len,
        })
    }

    /// An owned F32 matrix (used for dequantised weights and in tests).
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Self, OpsError> {
        if data.len() != rows * cols {
            return Err(OpsError::Shape {
                op: "weight",
                detail: format!("{rows}x{cols} from {} floats", data.len()),
            });
        }
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.len();
        Weight::new(WeightType::F32, rows, cols, Arc::new(bytes), 0, len)
    }

    /// Owned matrix from raw bytes of the given type (a `Vec<u8>`, or the
    /// [`crate::huge_pages::HugeBuf`] a repack writes into).
    pub fn from_bytes(
        wtype: WeightType,
        rows: usize,
        cols: usize,
        bytes: impl ByteSource + 'static,
    ) -> Result<Self, OpsError> {
        let len = bytes.as_bytes().len();
        Weight::new(wtype, rows, cols, Arc::new(bytes), 0, len)
    }

    /// All bytes of the matrix.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.src.as_bytes()[self.offset..self.offset + self.len]
    }

    /// Bytes of one row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.wtype.row_bytes(self.cols)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len
    }

    /// Dequantises row `r` into `out` (`cols` floats). Used for embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if let WeightType::KR16(f) = self.wtype {
            kquant::dequantize_packed_row(f, self.bytes(), self.rows, self.cols, r, out);
            return;
        }
        if let WeightType::LegacyR16(f) = self.wtype {
            legacy::dequantize_packed_row(f, self.bytes(), self.rows, self.cols, r, out);
            return;
        }
        let rb = self.row_bytes();
        if let Some(base) = self.wtype.interleaved_from() {
            crate::pack::dequantize_r16_row(base, self.bytes(), self.rows, self.cols, r, out);
            return;
        }
        let row = &self.bytes()[r * rb..(r + 1) * rb];
        dequantize(self.wtype, row, out);
    }
}

/// Dequantises a run of whole blocks of `wtype` into `out` (not for the interleaved types, whose
/// rows are spread over their group: use [`Weight::dequantize_row`]).
pub(crate) fn dequantize(wtype: WeightType, bytes: &[u8], out: &mut [f32]) {
    match wtype {
        WeightType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(34)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (v, &q) in o.iter_mut().zip(&b[2..34]) {
                    *v = d * (q as i8) as f32;
                }
            }
        }
        WeightType::K(f) => kquant::dequantize_ggml(f, bytes, out),
        WeightType::Legacy(f) => legacy::dequantize_ggml(f, bytes, out),
        WeightType::IQ4NL => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for j in 0..16 {
                    o[j] = d * kquant::IQ4_VALUES[(b[2 + j] & 0x0f) as usize] as f32;
                    o[j + 16] = d * kquant::IQ4_VALUES[(b[2 + j] >> 4) as usize] as f32;
                }
            }
        }
        WeightType::Q8_0R16
        | WeightType::Q4_0R16
        | WeightType::IQ4NLR16
        | WeightType::KR16(_)
        | WeightType::LegacyR16(_) => {
            // Rows are interleaved in groups: only `Weight::dequantize_row` knows where a row is.
            out.fill(f32::NAN);
            debug_assert!(false, "dequantize an interleaved matrix by row");
        }
        WeightType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for j in 0..16 {
                    o[j] = d * ((b[2 + j] & 0x0f) as i32 - 8) as f32;
                    o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
        }
    }
}
