//! Attention KV storage of one sequence and layer: K and V rows by position in two contiguous
//! buffers. Positions are always `0..len`, so removing a tail is a truncation and a
//! (sequence, position) pair can never be stored twice.

use half::f16;
use std::str::FromStr;

/// Element type of the KV cache (llama.cpp's `--cache-type-k` / `--cache-type-v`). `f16` halves
/// the cache and the memory attention streams on long contexts, at the price of rounding each
/// cached value once; `f32` (the default) keeps the activations exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

impl KvType {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            other => Err(format!(
                "unsupported KV cache type '{other}' (supported: f32, f16)"
            )),
        }
    }
}

/// One stored stream (all K or all V rows of a layer) in its element type.
#[derive(Debug, Clone, PartialEq)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvBuf {
    fn new(t: KvType) -> Self {
        match t {
            KvType::F32 => KvBuf::F32(Vec::new()),
            KvType::F16 => KvBuf::F16(Vec::new()),
        }
    }
    /// Values stored.
    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
        }
    }
    /// True if nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values widened to `f32` (tests and inspection).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            KvBuf::F32(v) => v.clone(),
            KvBuf::F16(v) => v.iter().map(|h| h.to_f32()).collect(),
        }
    }
    fn append(&mut self, x: &[f32]) {
        use specd_ops::vec::KvElem;
        match self {
            KvBuf::F32(v) => f32::extend_from_f32(v, x),
            KvBuf::F16(v) => f16::extend_from_f32(v, x),
        }
    }
    /// Keeps `n` values; memory beyond twice what is used goes back to the allocator.
    fn truncate(&mut self, n: usize) {
        fn cut<T>(v: &mut Vec<T>, n: usize) {
            v.truncate(n);
            if v.capacity() > 2 * v.len().max(1024) {
                v.shrink_to(v.len() * 3 / 2);
            }
        }
        match self {
            KvBuf::F32(v) => cut(v, n),
            KvBuf::F16(v) => cut(v, n),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len() * 4,
            KvBuf::F16(v) => v.len() * 2,
        }
    }
}

/// K and V of one attention layer of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct KvLayer {
    /// `len × kv_row` keys (after norm and RoPE).
    pub k: KvBuf,
    /// `len × kv_row` values.
    pub v: KvBuf,
}

impl KvLayer {
    /// An empty layer storing K and V in the given types.
    pub fn new(k: KvType, v: KvType) -> Self {
        KvLayer {
            k: KvBuf::new(k),
            v: KvBuf::new(v),
        }
    }
    /// Appends rows for new positions.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.append(k);
        self.v.append(v);
    }
    /// Keeps positions `0..n_pos`. Memory beyond twice what is used is returned to the allocator,
    /// so a long sequence that is cut back does not pin its peak.
    pub fn truncate(&mut self, n_pos: usize, kv_row: usize) {
        self.k.truncate(n_pos * kv_row);
        self.v.truncate(n_pos * kv_row);
    }
    /// Bytes in use (not capacity).
    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_layers_hold_half_the_bytes_and_truncate_by_position() {
        let k: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
        let mut a = KvLayer::new(KvType::F32, KvType::F32);
        let mut b = KvLayer::new(KvType::F16, KvType::F16);
        a.append(&k, &k);
        b.append(&k, &k);
        assert_eq!(a.bytes(), 2 * b.bytes());
        // Quarter steps are exact in f16: the widened values are the originals.
        assert_eq!(b.k.to_f32_vec(), k);
        b.truncate(2, 4);
        assert_eq!(b.k.len(), 8);
        assert_eq!(b.v.to_f32_vec(), k[..8].to_vec());
    }

    #[test]
    fn cache_types_parse_like_llama_cpp_and_reject_the_rest() {
        assert_eq!("f16".parse::<KvType>(), Ok(KvType::F16));
        assert_eq!("F32".parse::<KvType>(), Ok(KvType::F32));
        let e = "q8_0".parse::<KvType>().unwrap_err();
        assert!(e.contains("q8_0") && e.contains("f16"), "{e}");
    }
}
