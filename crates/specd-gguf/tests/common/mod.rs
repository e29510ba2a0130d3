//! An independent, byte-level GGUF encoder for the tests: it follows the format description
//! (ggml's `docs/gguf.md`) directly instead of going through [`specd_gguf::GgufWriter`], so the
//! tests can (a) check the writer's output against it and (b) build files that are wrong in one
//! precise way.

#![allow(dead_code)]

/// One metadata entry as raw bytes: key, type id, encoded value.
pub struct RawKv {
    pub key: String,
    pub type_id: u32,
    pub value: Vec<u8>,
}

/// One tensor-info entry.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
}

/// A GGUF file described field by field.
pub struct RawGguf {
    pub magic: u32,
    pub version: u32,
    pub kvs: Vec<RawKv>,
    pub tensors: Vec<RawTensor>,
    pub alignment: u64,
    /// The data section (after the alignment padding).
    pub data: Vec<u8>,
}

/// Byte offsets of the sections of an encoded [`RawGguf`].
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// End of magic, version and the two counts (24).
    pub header_end: usize,
    /// End of each metadata entry.
    pub kv_ends: [usize; 2],
    pub metadata_end: usize,
    pub tensor_infos_end: usize,
    pub data_start: usize,
    pub file_end: usize,
}

pub fn str_bytes(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl RawGguf {
    /// An empty version-3 file with the default alignment.
    pub fn new() -> Self {
        RawGguf {
            magic: 0x4655_4747,
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            data: Vec::new(),
        }
    }
    pub fn kv(&mut self, key: &str, type_id: u32, value: Vec<u8>) -> &mut Self {
        self.kvs.push(RawKv {
            key: key.into(),
            type_id,
            value,
        });
        self
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv(key, 4, v.to_le_bytes().to_vec())
    }
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.kv(key, 8, str_bytes(v))
    }
    /// Appends a tensor whose data goes at the next aligned offset of the data section.
    pub fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, bytes: &[u8]) -> &mut Self {
        let a = self.alignment as usize;
        let off = self.data.len().div_ceil(a) * a;
        self.data.resize(off, 0);
        self.data.extend_from_slice(bytes);
        self.tensors.push(RawTensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id,
            offset: off as u64,
        });
        self
    }
    /// Pads the data section to the alignment (what writers do after the last tensor).
    pub fn pad_data(&mut self) -> &mut Self {
        let a = self.alignment as usize;
        let n = self.data.len().div_ceil(a) * a;
        self.data.resize(n, 0);
        self
    }

    /// The file's bytes and where its sections are.
    pub fn encode(&self) -> (Vec<u8>, Layout) {
        let mut b = Vec::new();
        b.extend_from_slice(&self.magic.to_le_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        let header_end = b.len();
        let mut kv_ends = [0; 2];
        for (i, kv) in self.kvs.iter().enumerate() {
            b.extend_from_slice(&str_bytes(&kv.key));
            b.extend_from_slice(&kv.type_id.to_le_bytes());
            b.extend_from_slice(&kv.value);
            if i < 2 {
                kv_ends[i] = b.len();
            }
        }
        let metadata_end = b.len();
        for t in &self.tensors {
            b.extend_from_slice(&str_bytes(&t.name));
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.type_id.to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        let tensor_infos_end = b.len();
        let a = self.alignment as usize;
        b.resize(b.len().div_ceil(a) * a, 0);
        let data_start = b.len();
        b.extend_from_slice(&self.data);
        let file_end = b.len();
        (
            b,
            Layout {
                header_end,
                kv_ends,
                metadata_end,
                tensor_infos_end,
                data_start,
                file_end,
            },
        )
    }
}

/// F32 values as little-endian bytes.
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A small valid file with metadata of several kinds (a string array, a scalar, a string) and
/// three tensors of different types: the base the malformed-file tests corrupt.
pub fn sample() -> RawGguf {
    let mut g = RawGguf::new();
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&3u64.to_le_bytes());
    for s in ["a", "bc", "<|im_end|>"] {
        arr.extend_from_slice(&str_bytes(s));
    }
    g.kv_str("general.architecture", "llama")
        .kv("tokenizer.ggml.tokens", 9, arr)
        .kv_u32("llama.block_count", 2)
        .kv("llama.rope.freq_base", 6, 10000f32.to_le_bytes().to_vec());
    let w: Vec<f32> = (0..8 * 3).map(|i| i as f32 * 0.25 - 2.0).collect();
    g.tensor("blk.0.attn_q.weight", &[8, 3], 0, &f32_bytes(&w));
    // Q8_0: one block, scale 0.5 (f16 0x3800), values -16..15.
    let mut q8 = 0x3800u16.to_le_bytes().to_vec();
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    g.tensor("blk.0.ffn_up.weight", &[32, 1], 8, &q8);
    g.tensor("output_norm.weight", &[5], 1, &[0u8; 10]);
    g.pad_data();
    g
}
