//! Writing GGUF files (version 3). Tensor data is streamed to disk; the file appears atomically
//! (written to `path.tmp`, then renamed).
//!
//! Tensors are either added with their data ([`GgufWriter::add_tensor`]) or only declared
//! ([`GgufWriter::declare_tensor`]) and produced while the file is written
//! ([`GgufWriter::write_streaming`]): the header needs only names, shapes and types, so a
//! generator can make and quantise one tensor (or a few rows) at a time and a model far larger
//! than memory can be written.

use crate::value::{GgufValue, ValueType};
use crate::{quant, GgufError, TensorType, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ttype: TensorType,
    /// `None` for a declared tensor whose bytes come from the streaming callback.
    data: Option<Vec<u8>>,
    /// Byte size of the data.
    nbytes: u64,
}

/// Where a streaming callback writes one tensor's bytes (in order, any number of calls).
pub struct TensorSink<'a> {
    out: &'a mut dyn Write,
    name: &'a str,
    want: u64,
    written: u64,
}

impl TensorSink<'_> {
    /// Appends bytes of the current tensor.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.written += bytes.len() as u64;
        if self.written > self.want {
            return Err(GgufError::BadTensor {
                name: self.name.into(),
                detail: format!("more than the {} bytes declared", self.want),
            });
        }
        self.out.write_all(bytes).map_err(|e| GgufError::BadTensor {
            name: self.name.into(),
            detail: format!("writing: {e}"),
        })
    }
    /// Bytes still expected.
    pub fn remaining(&self) -> u64 {
        self.want - self.written
    }
}

/// Builds a GGUF file.
#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds (or replaces) a metadata entry.
    pub fn add(&mut self, key: &str, v: GgufValue) {
        if let Some(e) = self.kv.iter_mut().find(|(k, _)| k == key) {
            e.1 = v;
        } else {
            self.kv.push((key.to_string(), v));
        }
    }
    /// Adds a `u32` entry.
    pub fn add_u32(&mut self, key: &str, v: u32) {
        self.add(key, GgufValue::U32(v));
    }
    /// Adds an `i32` entry.
    pub fn add_i32(&mut self, key: &str, v: i32) {
        self.add(key, GgufValue::I32(v));
    }
    /// Adds an `f32` entry.
    pub fn add_f32(&mut self, key: &str, v: f32) {
        self.add(key, GgufValue::F32(v));
    }
    /// Adds a `bool` entry.
    pub fn add_bool(&mut self, key: &str, v: bool) {
        self.add(key, GgufValue::Bool(v));
    }
    /// Adds a string entry.
    pub fn add_string(&mut self, key: &str, v: &str) {
        self.add(key, GgufValue::String(v.to_string()));
    }
    /// Adds an array of `i32`.
    pub fn add_array_i32(&mut self, key: &str, v: &[i32]) {
        self.add(
            key,
            GgufValue::Array(
                ValueType::I32,
                v.iter().map(|&x| GgufValue::I32(x)).collect(),
            ),
        );
    }
    /// Adds an array of `u32`.
    pub fn add_array_u32(&mut self, key: &str, v: &[u32]) {
        self.add(
            key,
            GgufValue::Array(
                ValueType::U32,
                v.iter().map(|&x| GgufValue::U32(x)).collect(),
            ),
        );
    }
    /// Adds an array of `f32`.
    pub fn add_array_f32(&mut self, key: &str, v: &[f32]) {
        self.add(
            key,
            GgufValue::Array(
                ValueType::F32,
                v.iter().map(|&x| GgufValue::F32(x)).collect(),
            ),
        );
    }
    /// Adds an array of `bool`.
    pub fn add_array_bool(&mut self, key: &str, v: &[bool]) {
        self.add(
            key,
            GgufValue::Array(
                ValueType::Bool,
                v.iter().map(|&x| GgufValue::Bool(x)).collect(),
            ),
        );
    }
    /// Adds an array of strings.
    pub fn add_array_str(&mut self, key: &str, v: &[String]) {
        self.add(
            key,
            GgufValue::Array(
                ValueType::String,
                v.iter().map(|x| GgufValue::String(x.clone())).collect(),
            ),
        );
    }

    /// Adds a tensor from raw bytes of type `ttype` (`dims` in ggml `ne` order).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ttype: TensorType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        self.push(name, dims, ttype, Some(data))
    }

    /// Declares a tensor whose bytes the callback of [`GgufWriter::write_streaming`] produces.
    pub fn declare_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ttype: TensorType,
    ) -> Result<(), GgufError> {
        self.push(name, dims, ttype, None)
    }

    fn push(
        &mut self,
        name: &str,
        dims: &[u64],
        ttype: TensorType,
        data: Option<Vec<u8>>,
    ) -> Result<(), GgufError> {
        if !self.names.insert(name.to_string()) {
            return Err(GgufError::DuplicateTensor(name.into()));
        }
        let bad = |d: String| GgufError::BadTensor {
            name: name.into(),
            detail: d,
        };
        if dims.is_empty() || dims.len() > 4 || dims.contains(&0) {
            return Err(bad(format!("dimensions {dims:?}")));
        }
        if !dims[0].is_multiple_of(ttype.block_size() as u64) {
            return Err(bad(format!(
                "row of {} is not a multiple of the {ttype} block",
                dims[0]
            )));
        }
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        let want = n / ttype.block_size() as u64 * ttype.type_size() as u64;
        if let Some(data) = &data {
            if data.len() as u64 != want {
                return Err(bad(format!("{} bytes given, {want} needed", data.len())));
            }
        }
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ttype,
            data,
            nbytes: want,
        });
        Ok(())
    }

    /// Adds a tensor from f32 values, quantising them to `ttype`.
    pub fn add_tensor_f32(
        &mut self,
        name: &str,
        dims: &[u64],
        ttype: TensorType,
        x: &[f32],
    ) -> Result<(), GgufError> {
        let n: u64 = dims.iter().product();
        if n != x.len() as u64 {
            return Err(GgufError::BadTensor {
                name: name.into(),
                detail: format!("{} values for dims {dims:?}", x.len()),
            });
        }
        let data = quant::quantize(ttype, x).map_err(|e| GgufError::BadTensor {
            name: name.into(),
            detail: e.to_string(),
        })?;
        self.add_tensor(name, dims, ttype, data)
    }

    fn write_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
        w.write_all(&(s.len() as u64).to_le_bytes())?;
        w.write_all(s.as_bytes())
    }

    fn write_value(w: &mut impl Write, v: &GgufValue) -> std::io::Result<()> {
        match v {
            GgufValue::U8(x) => w.write_all(&[*x]),
            GgufValue::I8(x) => w.write_all(&[*x as u8]),
            GgufValue::U16(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::I16(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::U32(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::I32(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::F32(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::Bool(x) => w.write_all(&[*x as u8]),
            GgufValue::String(s) => Self::write_str(w, s),
            GgufValue::U64(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::I64(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::F64(x) => w.write_all(&x.to_le_bytes()),
            GgufValue::Array(t, items) => {
                w.write_all(&(*t as u32).to_le_bytes())?;
                w.write_all(&(items.len() as u64).to_le_bytes())?;
                for it in items {
                    Self::write_value(w, it)?;
                }
                Ok(())
            }
        }
    }

    /// Writes the file (every tensor must have been added with its data).
    pub fn write(self, path: &Path) -> Result<(), GgufError> {
        self.write_streaming(path, |name, _| {
            Err(GgufError::BadTensor {
                name: name.into(),
                detail: "declared without data; use write_streaming".into(),
            })
        })
    }

    /// Writes the file, calling `fill` for each declared tensor, in declaration order, to write
    /// its bytes into the sink (exactly the declared size).
    pub fn write_streaming(
        self,
        path: &Path,
        mut fill: impl FnMut(&str, &mut TensorSink<'_>) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        let r = self.write_impl(path, &mut fill);
        if r.is_err() {
            // Best effort: a half-written temporary file is useless.
            let _ = std::fs::remove_file(path.with_extension("gguf.tmp"));
        }
        r
    }

    fn write_impl(
        self,
        path: &Path,
        fill: &mut dyn FnMut(&str, &mut TensorSink<'_>) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        for (k, v) in &self.kv {
            if let GgufValue::Array(t, items) = v {
                if items.iter().any(|i| i.value_type() != *t) {
                    return Err(GgufError::Invalid(format!(
                        "'{k}': array elements of mixed types"
                    )));
                }
            }
        }
        let align = DEFAULT_ALIGNMENT;
        let tmp = path.with_extension("gguf.tmp");
        let f = std::fs::File::create(&tmp).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut counter = CountingWriter {
            inner: &mut w,
            n: 0,
        };
        let r: std::io::Result<()> = (|| {
            counter.write_all(&GGUF_MAGIC.to_le_bytes())?;
            counter.write_all(&3u32.to_le_bytes())?;
            counter.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
            counter.write_all(&(self.kv.len() as u64).to_le_bytes())?;
            for (k, v) in &self.kv {
                Self::write_str(&mut counter, k)?;
                counter.write_all(&(v.value_type() as u32).to_le_bytes())?;
                Self::write_value(&mut counter, v)?;
            }
            let mut offset = 0u64;
            for t in &self.tensors {
                Self::write_str(&mut counter, &t.name)?;
                counter.write_all(&(t.dims.len() as u32).to_le_bytes())?;
                for d in &t.dims {
                    counter.write_all(&d.to_le_bytes())?;
                }
                counter.write_all(&t.ttype.id().to_le_bytes())?;
                counter.write_all(&offset.to_le_bytes())?;
                offset = (offset + t.nbytes).div_ceil(align) * align;
            }
            let pad = counter.n.div_ceil(align) * align - counter.n;
            counter.write_all(&vec![0u8; pad as usize])
        })();
        r.map_err(io)?;
        for t in &self.tensors {
            match &t.data {
                Some(d) => counter.write_all(d).map_err(io)?,
                None => {
                    let mut sink = TensorSink {
                        out: &mut counter,
                        name: &t.name,
                        want: t.nbytes,
                        written: 0,
                    };
                    fill(&t.name, &mut sink)?;
                    if sink.written != t.nbytes {
                        return Err(GgufError::BadTensor {
                            name: t.name.clone(),
                            detail: format!(
                                "{} bytes written, {} declared",
                                sink.written, t.nbytes
                            ),
                        });
                    }
                }
            }
            let pad = t.nbytes.div_ceil(align) * align - t.nbytes;
            counter.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        }
        counter.flush().map_err(io)?;
        // On disk before the rename, so a crash leaves the old file or the whole new one.
        w.get_ref().sync_all().map_err(io)?;
        drop(w);
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
