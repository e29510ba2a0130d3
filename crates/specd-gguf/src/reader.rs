//! Reading GGUF files: header, metadata and tensor index are parsed and validated up front;
//! tensor data stays in the memory map and is handed out without copying.

use crate::quant::dequantize;
use crate::value::{GgufValue, ValueType};
use crate::{GgufError, TensorType, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A byte range of a GGUF file that keeps the file's memory map alive.
#[derive(Clone)]
pub struct SharedBytes {
    storage: Arc<Storage>,
    start: usize,
    len: usize,
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.storage.bytes()[self.start..self.start + self.len]
    }
}

/// Where a tensor is and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml `ne` order (ne0 fastest).
    pub dims: Vec<u64>,
    /// Element type.
    pub ttype: TensorType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Bytes of data.
    pub fn n_bytes(&self) -> u64 {
        let (bs, ts) = self.ttype.block();
        self.n_elements() / bs as u64 * ts as u64
    }
}

/// A tensor's metadata and data.
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    file: &'a GgufFile,
}

impl<'a> TensorView<'a> {
    /// Name, shape, type, offset.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }
    /// Raw bytes in the file.
    pub fn bytes(&self) -> &'a [u8] {
        let s = self.file.data_start + self.info.offset as usize;
        &self.file.storage.bytes()[s..s + self.info.n_bytes() as usize]
    }
    /// Raw bytes that keep the file mapped (for zero-copy weights).
    pub fn bytes_arc(&self) -> SharedBytes {
        SharedBytes {
            storage: self.file.storage.clone(),
            start: self.file.data_start + self.info.offset as usize,
            len: self.info.n_bytes() as usize,
        }
    }
    /// Tells the kernel that this process no longer needs the tensor's pages in memory (after the
    /// data was copied elsewhere, e.g. repacked): they leave the process's resident set, so a
    /// repacked model is held once, not twice. Harmless to call on anything: the mapping is
    /// read-only and private, so a later read simply faults the file's bytes back in.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Storage::Mmap(m) = &*self.file.storage {
            let page = 4096;
            let s = self.file.data_start + self.info.offset as usize;
            let e = s + self.info.n_bytes() as usize;
            // Only whole pages inside the tensor: neighbours may share its first and last page.
            let (a, b) = (s.div_ceil(page) * page, e / page * page);
            if b > a {
                // SAFETY: MADV_DONTNEED on a private read-only file mapping that is never
                // written only drops clean pages; their contents are re-read from the file on
                // the next access, so no reference into the map observes a change.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
                };
            }
        }
    }

    /// All elements as f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, GgufError> {
        let mut out = vec![0f32; self.info.n_elements() as usize];
        dequantize(self.info.ttype, self.bytes(), &mut out).map_err(|e| match e {
            GgufError::Invalid(d) => GgufError::BadTensor {
                name: self.info.name.clone(),
                detail: d,
            },
            GgufError::UnsupportedTensorType { ttype, .. } => GgufError::UnsupportedTensorType {
                name: self.info.name.clone(),
                ttype,
            },
            e => e,
        })?;
        Ok(out)
    }
}

/// An opened GGUF file.
pub struct GgufFile {
    storage: Arc<Storage>,
    /// GGUF version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_start: usize,
    alignment: u64,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if self.b.len() - self.pos < n {
            return Err(GgufError::Truncated { what: what() });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    /// A count that must be plausible given that each item needs at least `min_item` bytes.
    fn count(
        &mut self,
        v2: bool,
        min_item: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let n = if v2 {
            self.u32(what)? as u64
        } else {
            self.u64(what)?
        };
        if n.saturating_mul(min_item as u64) > self.remaining() as u64 {
            // The items cannot all be in the file: it is cut short (or the count is corrupt).
            return Err(GgufError::Truncated {
                what: format!(
                    "{}: {n} items of at least {min_item} bytes, {} bytes left",
                    what(),
                    self.remaining()
                ),
            });
        }
        Ok(n as usize)
    }
    /// A section count (tensors, metadata entries) and the capacity to reserve for it. The count
    /// is not checked against the bytes left: if the entries cannot all be in the file, reading
    /// them fails at the exact entry that is cut, which names it. The capacity is bounded by what
    /// the bytes left can hold, so a corrupt count cannot trigger a huge allocation.
    fn section_count(
        &mut self,
        min_item: usize,
        what: &dyn Fn() -> String,
    ) -> Result<(usize, usize), GgufError> {
        let n = self.u64(what)?;
        let n = usize::try_from(n)
            .map_err(|_| GgufError::Invalid(format!("{}: {n} does not fit in memory", what())))?;
        Ok((n, n.min(self.remaining() / min_item)))
    }
    fn string(&mut self, v2: bool, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.count(v2, 1, what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec())
            .map_err(|_| GgufError::Invalid(format!("{}: string is not UTF-8", what())))
    }
    fn value(
        &mut self,
        t: ValueType,
        v2: bool,
        key: &str,
        depth: usize,
    ) -> Result<GgufValue, GgufError> {
        let w = || format!("value of '{key}'");
        Ok(match t {
            ValueType::U8 => GgufValue::U8(self.take(1, &w)?[0]),
            ValueType::I8 => GgufValue::I8(self.take(1, &w)?[0] as i8),
            ValueType::U16 => {
                let s = self.take(2, &w)?;
                GgufValue::U16(u16::from_le_bytes([s[0], s[1]]))
            }
            ValueType::I16 => {
                let s = self.take(2, &w)?;
                GgufValue::I16(i16::from_le_bytes([s[0], s[1]]))
            }
            ValueType::U32 => GgufValue::U32(self.u32(&w)?),
            ValueType::I32 => GgufValue::I32(self.u32(&w)? as i32),
            ValueType::F32 => GgufValue::F32(f32::from_bits(self.u32(&w)?)),
            ValueType::Bool => match self.take(1, &w)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(GgufError::Invalid(format!("'{key}': bool byte {b}"))),
            },
            ValueType::String => GgufValue::String(self.string(v2, &w)?),
            ValueType::U64 => GgufValue::U64(self.u64(&w)?),
            ValueType::I64 => GgufValue::I64(self.u64(&w)? as i64),
            ValueType::F64 => GgufValue::F64(f64::from_bits(self.u64(&w)?)),
            ValueType::Array => {
                if depth > 2 {
                    return Err(GgufError::Invalid(format!(
                        "'{key}': arrays nested too deep"
                    )));
                }
                let et_id = self.u32(&w)?;
                let et = ValueType::from_id(et_id).ok_or_else(|| {
                    GgufError::Invalid(format!("'{key}': unknown array element type {et_id}"))
                })?;
                // Each element takes at least its type's encoded size, so a count the file
                // cannot hold is refused here, and the vector's capacity is bounded by the bytes
                // left (a value in memory is at most 32 bytes: a bounded multiple of the file).
                let n = self.count(v2, et.min_encoded_size(), &w)?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(et, v2, key, depth + 1)?);
                }
                GgufValue::Array(et, v)
            }
        })
    }
}

/// Tensor names are shorter than ggml's `GGML_MAX_NAME` (64 bytes), which llama.cpp's reader
/// requires too.
const MAX_TENSOR_NAME: usize = 64;

/// The data section's layout as llama.cpp's reader requires it (`gguf.cpp`: each tensor's offset
/// is the end of the one before it in index order, padded to the alignment), so every file that
/// llama.cpp loads passes. A tensor whose type or shape in the index does not match its bytes (a
/// type id changed from F32 to Q4_0 keeps the data in bounds but shrinks its size) then shows as
/// a gap, an overlap, or bytes left after the last tensor, and is named.
fn check_layout(
    tensors: &[TensorInfo],
    data_start: u64,
    file_len: u64,
    alignment: u64,
) -> Result<(), GgufError> {
    let mut expected = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in tensors {
        if t.offset != expected {
            return Err(match prev {
                // The tensor before is the suspect: its size in the index is not what it holds.
                Some(p) => GgufError::BadTensor {
                    name: p.name.clone(),
                    detail: format!(
                        "its {} data of shape {:?} ({} bytes) ends at offset {expected} with \
                         padding, but the next tensor '{}' starts at {} (tensors follow each \
                         other in index order, each padded to {alignment} bytes): its type or \
                         shape in the index does not match the data",
                        p.ttype,
                        p.dims,
                        p.n_bytes(),
                        t.name,
                        t.offset
                    ),
                },
                None => GgufError::BadTensor {
                    name: t.name.clone(),
                    detail: format!(
                        "data offset {} for the first tensor (expected 0: tensors follow each \
                         other in index order)",
                        t.offset
                    ),
                },
            });
        }
        // In bounds (checked before), so neither sum overflows.
        expected = (t.offset + t.n_bytes()).div_ceil(alignment) * alignment;
        prev = Some(t);
    }
    if let Some(last) = tensors.last() {
        let end = data_start + last.offset + last.n_bytes();
        let left = file_len - end;
        if left >= alignment {
            return Err(GgufError::BadTensor {
                name: last.name.clone(),
                detail: format!(
                    "{left} bytes follow its data, the last tensor's ({} of shape {:?}, {} \
                     bytes; at most {} of padding expected): its type or shape in the index \
                     does not match the data",
                    last.ttype,
                    last.dims,
                    last.n_bytes(),
                    alignment - 1
                ),
            });
        }
    }
    Ok(())
}

impl GgufFile {
    /// Opens and memory-maps `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the file is mapped read-only; specd never writes model files while they are
        // open, and the map lives as long as any weight borrowed from it.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
        Self::parse(Storage::Mmap(m))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let b = storage.bytes();
        let mut c = Cursor { b, pos: 0 };
        let magic = c.u32(&|| "magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let v2 = false; // v2 and v3 both use 64-bit counts (v1 used 32-bit)
                        // Minimum entry sizes: a tensor info is a name length (8), a dimension count (4), one
                        // dimension (8), a type (4) and an offset (8); a metadata entry a key length (8) and a
                        // type (4).
        let (n_tensors, cap_tensors) = c.section_count(32, &|| "tensor count".into())?;
        let (n_kv, cap_kv) = c.section_count(12, &|| "metadata count".into())?;
        let mut metadata = Vec::with_capacity(cap_kv);
        let mut index = HashMap::with_capacity(cap_kv);
        for i in 0..n_kv {
            let key = c.string(v2, &|| format!("key of metadata entry {i}"))?;
            let t_id = c.u32(&|| format!("type of '{key}'"))?;
            let t = ValueType::from_id(t_id)
                .ok_or_else(|| GgufError::Invalid(format!("'{key}': unknown value type {t_id}")))?;
            let v = c.value(t, v2, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, v));
        }
        let alignment = match metadata.get(
            index
                .get("general.alignment")
                .copied()
                .unwrap_or(usize::MAX),
        ) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_i128() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(GgufError::Invalid(format!(
                        "general.alignment {v:?} is not a power of two"
                    )))
                }
            },
        };
        let mut tensors = Vec::with_capacity(cap_tensors);
        let mut tensor_index = HashMap::with_capacity(cap_tensors);
        for i in 0..n_tensors {
            let name = c.string(v2, &|| format!("name of tensor {i}"))?;
            if name.is_empty() {
                // Typically zeros where a tensor info should be: a corrupt tensor count.
                return Err(GgufError::Invalid(format!("tensor {i} has an empty name")));
            }
            if name.len() >= MAX_TENSOR_NAME {
                let shown: String = name.chars().take(MAX_TENSOR_NAME).collect();
                return Err(GgufError::Invalid(format!(
                    "tensor {i}: name of {} bytes ('{shown}…'; at most {} allowed)",
                    name.len(),
                    MAX_TENSOR_NAME - 1
                )));
            }
            let nd = c.u32(&|| format!("dimension count of '{name}'"))? as usize;
            if nd == 0 || nd > 4 {
                return Err(GgufError::BadTensor {
                    name,
                    detail: format!("{nd} dimensions"),
                });
            }
            let mut dims = Vec::with_capacity(nd);
            for _ in 0..nd {
                dims.push(c.u64(&|| format!("dimensions of '{name}'"))?);
            }
            let tid = c.u32(&|| format!("type of '{name}'"))?;
            let ttype = TensorType::from_id(tid).ok_or_else(|| GgufError::UnknownTensorType {
                name: name.clone(),
                id: tid,
            })?;
            let offset = c.u64(&|| format!("offset of '{name}'"))?;
            if dims.contains(&0) {
                return Err(GgufError::BadTensor {
                    name,
                    detail: format!("zero dimension in {dims:?}"),
                });
            }
            let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if n.is_none_or(|n| n > (1u64 << 40)) {
                return Err(GgufError::BadTensor {
                    name,
                    detail: format!("dimensions {dims:?} overflow"),
                });
            }
            if !dims[0].is_multiple_of(ttype.block_size() as u64) {
                return Err(GgufError::BadTensor {
                    name,
                    detail: format!(
                        "row of {} is not a multiple of the {ttype} block ({})",
                        dims[0],
                        ttype.block_size()
                    ),
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ttype,
                offset,
            });
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = b.len() as u64;
        if let Some(first) = tensors.first().filter(|_| data_start > file_len) {
            return Err(GgufError::Truncated {
                what: format!("the padding before the data of tensor '{}'", first.name),
            });
        }
        for t in &tensors {
            if !t.offset.is_multiple_of(alignment) {
                return Err(GgufError::TensorMisaligned {
                    name: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data_start.saturating_add(t.offset);
            let end = start.saturating_add(t.n_bytes());
            // `end == u64::MAX` can only come from saturation: no file is that long.
            if end > file_len || end == u64::MAX {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start,
                    end,
                    file_len,
                });
            }
        }
        check_layout(&tensors, data_start, file_len, alignment)?;
        Ok(GgufFile {
            storage: Arc::new(storage),
            version,
            metadata,
            index,
            tensors,
            tensor_index,
            data_start: data_start as usize,
            alignment,
        })
    }

    /// Data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }
    fn req(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }
    fn wrong(key: &str, expected: &str, v: &GgufValue) -> GgufError {
        GgufError::WrongKeyType {
            key: key.into(),
            expected: expected.into(),
            found: v.type_name(),
        }
    }
    fn int<T: TryFrom<i128>>(key: &str, v: &GgufValue, name: &str) -> Result<T, GgufError> {
        v.as_i128()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, name, v))
    }
    /// Integer key as u32 (any integer type that fits).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        Self::int(key, self.req(key)?, "u32")
    }
    /// Integer key as u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        Self::int(key, self.req(key)?, "u64")
    }
    /// Integer key as i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        Self::int(key, self.req(key)?, "i64")
    }
    /// Float key (f32 or f64).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.req(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| Self::wrong(key, "f32", v))
    }
    /// Bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.req(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }
    /// String key.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.req(key)? {
            GgufValue::String(s) => Ok(s),
            v => Err(Self::wrong(key, "string", v)),
        }
    }
    /// Optional u32 key.
    pub fn get_opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|v| Self::int(key, v, "u32")).transpose()
    }
    /// Optional float key.
    pub fn get_opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| Self::wrong(key, "f32", v)),
        }
    }
    /// Optional bool key.
    pub fn get_opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(key, "bool", v)),
        }
    }
    /// Optional string key.
    pub fn get_opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(key, "string", v)),
        }
    }
    fn array(&self, key: &str) -> Result<&[GgufValue], GgufError> {
        match self.req(key)? {
            GgufValue::Array(_, a) => Ok(a),
            v => Err(Self::wrong(key, "array", v)),
        }
    }
    /// Array of integers as u32.
    pub fn get_array_u32(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.array(key)?
            .iter()
            .map(|v| Self::int(key, v, "array of u32"))
            .collect()
    }
    /// Array of integers as i32.
    pub fn get_array_i32(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.array(key)?
            .iter()
            .map(|v| Self::int(key, v, "array of i32"))
            .collect()
    }
    /// Array of floats.
    pub fn get_array_f32(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.array(key)?
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| Self::wrong(key, "array of f32", v))
            })
            .collect()
    }
    /// Array of bools.
    pub fn get_array_bool(&self, key: &str) -> Result<Vec<bool>, GgufError> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                GgufValue::Bool(b) => Ok(*b),
                v => Err(Self::wrong(key, "array of bool", v)),
            })
            .collect()
    }
    /// Array of strings.
    pub fn get_array_str(&self, key: &str) -> Result<Vec<String>, GgufError> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                GgufValue::String(s) => Ok(s.clone()),
                v => Err(Self::wrong(key, "array of string", v)),
            })
            .collect()
    }
    /// A key that is either one integer for all layers or an array with one per layer.
    pub fn get_u32_per_layer(&self, key: &str, n_layers: usize) -> Result<Vec<u32>, GgufError> {
        match self.req(key)? {
            GgufValue::Array(..) => {
                let v = self.get_array_u32(key)?;
                if v.len() < n_layers {
                    return Err(GgufError::Invalid(format!(
                        "'{key}' has {} entries for {n_layers} layers",
                        v.len()
                    )));
                }
                Ok(v)
            }
            _ => Ok(vec![self.get_u32(key)?; n_layers]),
        }
    }
    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// True if the file has tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }
    /// Metadata of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor { name: name.into() })
    }
    /// Tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        Ok(TensorView {
            info: self.tensor_info(name)?,
            file: self,
        })
    }
    /// Tensor `name` if present.
    pub fn tensor_opt(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensor(name).ok()
    }
    /// Tensor `name`, checking its `ne` dims.
    pub fn expect_tensor(&self, name: &str, ne: &[u64]) -> Result<TensorView<'_>, GgufError> {
        let t = self.tensor(name)?;
        if t.info.dims != ne {
            return Err(GgufError::TensorShape {
                name: name.into(),
                expected: ne.to_vec(),
                found: t.info.dims.clone(),
            });
        }
        Ok(t)
    }
}
