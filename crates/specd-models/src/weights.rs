//! Turning GGUF tensors into kernel-ready weights.
//!
//! Types with a native kernel stay quantised: F32, F16 and BF16 stay in the memory map (no copy);
//! Q8_0, Q4_0 and IQ4_NL are repacked once into 16-row interleaved groups on AVX2 and above
//! (`specd_ops::pack`; `SPECD_NO_REPACK` keeps ggml's layout); Q4_1, Q5_0 and Q5_1
//! (`specd_ops::legacy`) and the super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS;
//! `specd_ops::kquant`) are repacked the same way on every level. A quantised type without a
//! kernel is converted once at load to the nearest native type that holds it (block-32 types to
//! Q8_0, the other ≤ 4-bit super-block types to Q4_K), with a warning naming the tensor —
//! never to F32. See `docs/quantisation.md`.

use crate::ModelError;
use specd_gguf::{GgufFile, TensorType};
use specd_ops::{ByteSource, KFormat, LegacyFormat, Weight, WeightType};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
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
    /// Bytes of every weight handed out so far, as the kernels hold them.
    bytes: Cell<usize>,
    /// Names of the tensors handed out so far: a tensor the architecture never asks for is a
    /// renamed or foreign one ([`Loader::unused`]).
    used: RefCell<HashSet<String>>,
}

/// Tensors real files carry that specd knows and does not read: the frequency factors of
/// Llama 3.1's rotary scaling (llama.cpp applies them; specd's rotary has no scaling, so such a
/// file loads with a warning that long-context outputs differ).
const KNOWN_UNREAD: &[&str] = &["rope_freqs.weight"];

/// The kernel type that reads GGUF type `t` as it is.
fn native(t: TensorType) -> Option<WeightType> {
    Some(match t {
        TensorType::F32 => WeightType::F32,
        TensorType::F16 => WeightType::F16,
        TensorType::BF16 => WeightType::BF16,
        TensorType::Q8_0 => WeightType::Q8_0,
        TensorType::Q4_0 => WeightType::Q4_0,
        TensorType::IQ4_NL => WeightType::IQ4NL,
        TensorType::Q4_1 => WeightType::Legacy(LegacyFormat::Q4_1),
        TensorType::Q5_0 => WeightType::Legacy(LegacyFormat::Q5_0),
        TensorType::Q5_1 => WeightType::Legacy(LegacyFormat::Q5_1),
        TensorType::Q4_K => WeightType::K(KFormat::Q4K),
        TensorType::Q5_K => WeightType::K(KFormat::Q5K),
        TensorType::Q6_K => WeightType::K(KFormat::Q6K),
        TensorType::IQ4_XS => WeightType::K(KFormat::IQ4XS),
        TensorType::Q2_K => WeightType::K(KFormat::Q2K),
        TensorType::Q3_K => WeightType::K(KFormat::Q3K),
        _ => return None,
    })
}

/// The native type a quantised type without a kernel is converted to: one that holds at least
/// as many bits per weight. The IQ1 / IQ2 / IQ3 types go to Q4_K (requantised from their values;
/// IQ3_S re-expressed instead); MXFP4 becomes Q8_0 exactly (see [`exact_mxfp4_q8_0`]), the
/// ternary TQ1_0 / TQ2_0 Q4_0 (see [`exact_q4_0`]).
fn conversion_target(t: TensorType, cols: usize) -> TensorType {
    use TensorType::*;
    match t {
        // ≤ 4 bits per weight in super-blocks: Q4_K keeps the 256-weight structure.
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M if cols.is_multiple_of(256) => {
            Q4_K
        }
        // Levels −1, 0, 1 times an f16 per 256 weights: Q4_0 (levels −8..7 times an f16 per 32)
        // holds them exactly in as many bits as Q4_K; Q4_K's odd level count cannot hold 0.
        TQ1_0 | TQ2_0 => Q4_0,
        _ => Q8_0,
    }
}

/// Q4_0 holding exactly the values of a ternary type (TQ1_0, TQ2_0: levels −1, 0, 1 — TQ2_0's
/// 2-bit codes also allow 2 — times the block's f16 `d`, stored at byte `at`): each group of 32 weights keeps `d` and stores its levels
/// + 8 as nibbles — found by dequantising the block with `d = 1`. `None` for other types.
fn exact_q4_0(t: TensorType, bytes: &[u8]) -> Option<Result<Vec<u8>, ModelError>> {
    let at = match t {
        TensorType::TQ1_0 => 52,
        TensorType::TQ2_0 => 64,
        _ => return None,
    };
    let bb = t.type_size();
    let mut out = Vec::with_capacity(bytes.len() / bb * 8 * 18);
    let mut unit = vec![0u8; bb];
    let mut levels = [0f32; 256];
    for blk in bytes.chunks_exact(bb) {
        unit.copy_from_slice(blk);
        unit[at..at + 2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        if let Err(e) = specd_gguf::quant::dequantize(t, &unit, &mut levels) {
            return Some(Err(e.into()));
        }
        for g in levels.chunks_exact(32) {
            out.extend_from_slice(&blk[at..at + 2]);
            let q = |v: f32| (v as i8 + 8) as u8;
            out.extend((0..16).map(|j| q(g[j]) | q(g[j + 16]) << 4));
        }
    }
    Some(Ok(out))
}

/// Q8_0 holding exactly the values of MXFP4 (E2M1 levels, stored doubled as the integers
/// −12..12, times `2^(e−128)` per 32 weights): each block's step becomes the f16 `d` — exact for
/// e in 104..=143, the steps an f16 holds (real weights are far inside) — and its levels the i8
/// quants. `None` for other types, or when a block's step is outside that range (requantised).
fn exact_mxfp4_q8_0(t: TensorType, bytes: &[u8]) -> Option<Result<Vec<u8>, ModelError>> {
    if t != TensorType::MXFP4 || bytes.chunks_exact(17).any(|b| !(104..=143).contains(&b[0])) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 17 * 34);
    let mut unit = [0u8; 17];
    let mut levels = [0f32; 32];
    for blk in bytes.chunks_exact(17) {
        unit.copy_from_slice(blk);
        unit[0] = 128; // step 2^0: the decoded values are the levels
        if let Err(e) = specd_gguf::quant::dequantize(t, &unit, &mut levels) {
            return Some(Err(e.into()));
        }
        let step = half::f16::from_f32(2f32.powi(blk[0] as i32 - 128));
        out.extend_from_slice(&step.to_le_bytes());
        out.extend(levels.iter().map(|&v| v as i8 as u8));
    }
    Some(Ok(out))
}

impl<'a> Loader<'a> {
    /// A loader over `g`.
    pub fn new(g: &'a GgufFile) -> Self {
        Loader {
            g,
            bytes: Cell::new(0),
            used: RefCell::new(HashSet::new()),
        }
    }

    /// Tensor `name`, checked to have `ne` dims, marked as read.
    fn view(&self, name: &str, ne: &[u64]) -> Result<specd_gguf::TensorView<'a>, ModelError> {
        let view = self.g.expect_tensor(name, ne)?;
        self.used.borrow_mut().insert(name.to_string());
        Ok(view)
    }

    /// Checks that every tensor of the file was read: llama.cpp refuses a file with tensors its
    /// architecture does not define ("wrong number of tensors"), and so does specd — a renamed
    /// `output.weight` would otherwise load and silently run on the tied embedding instead.
    pub fn check_all_read(&self) -> Result<(), ModelError> {
        let used = self.used.borrow();
        let mut unread = self
            .g
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| !used.contains(*n));
        let mut extra: Vec<&str> = Vec::new();
        for n in unread.by_ref() {
            if KNOWN_UNREAD.contains(&n) {
                tracing::warn!(
                    "tensor {n} is not applied (rotary scaling factors): outputs differ from \
                     llama.cpp's, most at long context"
                );
            } else {
                extra.push(n);
            }
        }
        match extra.as_slice() {
            [] => Ok(()),
            [first, ..] => Err(ModelError::Invalid(format!(
                "tensor '{first}' is not part of a {} model{} (renamed, or from another \
                 architecture?)",
                self.g.architecture().unwrap_or("?"),
                match extra.len() {
                    1 => String::new(),
                    n => format!(", nor are {} more", n - 1),
                }
            ))),
        }
    }

    /// Bytes of all weights loaded so far, as held in memory for the kernels (mapped, repacked
    /// or converted).
    pub fn loaded_bytes(&self) -> usize {
        self.bytes.get()
    }

    fn count(&self, n: usize) {
        self.bytes.set(self.bytes.get() + n);
    }

    /// True if the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.g.has_tensor(name)
    }

    /// Matrix `name` with GGUF `ne = [cols, rows]` (math shape `[rows, cols]`).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, ModelError> {
        let view = self.view(name, &[cols as u64, rows as u64])?;
        let mut w = self.matrices(&view, name, 1, rows, cols)?;
        w.pop()
            .ok_or_else(|| ModelError::Invalid(format!("tensor {name}: no matrix")))
    }

    /// The `n` matrices of a 3-D tensor with GGUF `ne = [cols, rows, n]` (a mixture of experts'
    /// stacked experts): matrix `e` is expert `e`.
    pub fn stacked(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Weight>, ModelError> {
        let view = self.view(name, &[cols as u64, rows as u64, n as u64])?;
        self.matrices(&view, name, n, rows, cols)
    }

    /// [`Loader::stacked`] for a tensor whose matrices are `parts` matrices of `rows` rows each,
    /// one above the other (ne `[cols, parts · rows, n]`: a merged gate and up projection):
    /// matrix `e · parts + p` is part `p` of matrix `e`.
    pub fn stacked_parts(
        &self,
        name: &str,
        n: usize,
        parts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Weight>, ModelError> {
        let ne = [cols as u64, (parts * rows) as u64, n as u64];
        let view = self.view(name, &ne)?;
        self.matrices(&view, name, n * parts, rows, cols)
    }

    /// The `n` consecutive `rows × cols` matrices of tensor `view` (rows are stored one after
    /// the other, so a stack of matrices is a taller matrix cut at every `rows` rows).
    fn matrices(
        &self,
        view: &specd_gguf::TensorView<'_>,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Weight>, ModelError> {
        let tt = view.info().ttype;
        let mut out = Vec::with_capacity(n);
        match native(tt) {
            Some(wt) => {
                let bytes = view.bytes_arc();
                let per = wt.matrix_bytes(rows, cols);
                let src: Arc<dyn ByteSource> = Arc::new(TensorBytes(bytes));
                let mut repacked = true;
                for e in 0..n {
                    let w = Weight::new(wt, rows, cols, src.clone(), e * per, per)
                        .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))?;
                    // Repacked where the kernel level reads an interleaved layout (one copy, at
                    // most 2.8 % larger); the file's pages of a repacked tensor are then let go.
                    let packed = specd_ops::pack::for_current_isa(&w)?;
                    repacked &= packed.wtype != w.wtype;
                    out.push(packed);
                }
                if repacked {
                    drop(src);
                    view.release_pages();
                }
            }
            None => {
                let to = conversion_target(tt, cols);
                let wt = native(to).ok_or_else(|| {
                    ModelError::Invalid(format!("conversion target {to} has no kernel"))
                })?;
                // Blocks never straddle rows, so the converted tensor splits into its matrices.
                let exact = exact_q4_0(tt, view.bytes())
                    .or_else(|| exact_mxfp4_q8_0(tt, view.bytes()))
                    .or_else(|| match (tt, to) {
                        (TensorType::IQ3_S, TensorType::Q4_K) => {
                            crate::iq3s_q4k::iq3_s_as_q4_k(view.bytes())
                        }
                        _ => None,
                    });
                let bytes = match exact {
                    Some(b) => b?,
                    None => specd_gguf::quant::quantize(to, &view.to_f32()?)?,
                };
                let per = wt.matrix_bytes(rows, cols);
                if bytes.len() != n * per {
                    return Err(ModelError::Invalid(format!(
                        "tensor {name}: converted to {} bytes, expected {}",
                        bytes.len(),
                        n * per
                    )));
                }
                let size = bytes.len();
                for chunk in bytes.chunks_exact(per) {
                    let w = Weight::from_bytes(wt, rows, cols, chunk.to_vec())?;
                    out.push(specd_ops::pack::for_current_isa(&w)?);
                }
                tracing::warn!(
                    "tensor {name}: {tt} has no native kernel, converted to {to} at load \
                     ({} -> {size} bytes)",
                    view.info().n_bytes(),
                );
                view.release_pages();
            }
        }
        self.count(out.iter().map(|w| w.size_bytes()).sum());
        Ok(out)
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
        let view = self.view(name, &[len as u64])?;
        self.count(4 * len);
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
        let view = self.view(name, ne)?;
        let v = view.to_f32()?;
        self.count(4 * v.len());
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_gguf::quant::{dequantize, quantize};

    #[test]
    fn two_and_three_bit_k_quants_stay_native() {
        assert_eq!(native(TensorType::Q2_K), Some(WeightType::K(KFormat::Q2K)));
        assert_eq!(native(TensorType::Q3_K), Some(WeightType::K(KFormat::Q3K)));
        // The remaining ≤ 4-bit super-block types still go to Q4_K.
        assert_eq!(native(TensorType::IQ3_XXS), None);
        assert_eq!(
            conversion_target(TensorType::IQ3_XXS, 512),
            TensorType::Q4_K
        );
        assert_eq!(conversion_target(TensorType::IQ3_XXS, 96), TensorType::Q8_0);
    }

    /// Q4_1 / Q5_0 / Q5_1 stay native: repacked, same size, and every row dequantises to
    /// exactly the values of the GGUF reader's dequantisation.
    #[test]
    fn block32_types_stay_native_with_the_files_values() {
        let (rows, cols) = (40, 96);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 401) as f32 - 200.0) * 1e-3 * (1 + i / 320) as f32)
            .collect();
        for (t, f) in [
            (TensorType::Q4_1, LegacyFormat::Q4_1),
            (TensorType::Q5_0, LegacyFormat::Q5_0),
            (TensorType::Q5_1, LegacyFormat::Q5_1),
        ] {
            assert_eq!(native(t), Some(WeightType::Legacy(f)));
            let src = quantize(t, &x).unwrap();
            let mut want = vec![0f32; x.len()];
            dequantize(t, &src, &mut want).unwrap();
            let w = Weight::from_bytes(WeightType::Legacy(f), rows, cols, src.clone()).unwrap();
            let p = specd_ops::pack::for_current_isa(&w).unwrap();
            assert_eq!(p.wtype, WeightType::LegacyR16(f));
            assert_eq!(p.size_bytes(), src.len());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                p.dequantize_row(r, &mut row);
                assert_eq!(row, want[r * cols..(r + 1) * cols], "{t} row {r}");
            }
        }
    }

    #[test]
    fn ternary_types_become_q4_0_exactly() {
        // Every byte value (TQ1_0's base-3 bytes above 242 included), scales of both signs.
        for (t, at) in [(TensorType::TQ1_0, 52), (TensorType::TQ2_0, 64)] {
            let bb = t.type_size();
            let mut src: Vec<u8> = (0..bb * 12).map(|i| (i * 37 % 256) as u8).collect();
            for (k, blk) in src.chunks_exact_mut(bb).enumerate() {
                let d = [0.0123f32, -0.5, 0.0, 3e-6][k % 4];
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            }
            assert_eq!(conversion_target(t, 256), TensorType::Q4_0);
            let q4 = exact_q4_0(t, &src).unwrap().unwrap();
            let n = src.len() / bb * 256;
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            dequantize(t, &src, &mut a).unwrap();
            dequantize(TensorType::Q4_0, &q4, &mut b).unwrap();
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
        assert!(exact_q4_0(TensorType::IQ2_XXS, &[]).is_none());
    }

    #[test]
    fn mxfp4_becomes_q8_0_exactly_where_f16_holds_its_steps() {
        let t = TensorType::MXFP4;
        let mut src: Vec<u8> = (0..17 * 40).map(|i| (i * 53 % 256) as u8).collect();
        for (k, blk) in src.chunks_exact_mut(17).enumerate() {
            blk[0] = 104 + k as u8; // 104..=143: steps 2^-24 .. 2^15
        }
        let q8 = exact_mxfp4_q8_0(t, &src).unwrap().unwrap();
        let n = src.len() / 17 * 32;
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        dequantize(t, &src, &mut a).unwrap();
        dequantize(TensorType::Q8_0, &q8, &mut b).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        src[0] = 103;
        assert!(exact_mxfp4_q8_0(t, &src).is_none());
    }
}
