//! Attention KV storage of one sequence and layer: K and V rows by position in two contiguous
//! buffers. Positions are always `0..len`, so removing a tail is a truncation and a
//! (sequence, position) pair can never be stored twice.

/// K and V of one attention layer of one sequence.
#[derive(Debug, Clone, Default)]
pub struct KvLayer {
    /// `len × kv_row` keys (after norm and RoPE).
    pub k: Vec<f32>,
    /// `len × kv_row` values.
    pub v: Vec<f32>,
}

impl KvLayer {
    /// Appends rows for new positions.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }
    /// Keeps positions `0..n_pos`. Memory beyond twice what is used is returned to the allocator,
    /// so a long sequence that is cut back does not pin its peak.
    pub fn truncate(&mut self, n_pos: usize, kv_row: usize) {
        self.k.truncate(n_pos * kv_row);
        self.v.truncate(n_pos * kv_row);
        if self.k.capacity() > 2 * self.k.len().max(1024) {
            self.k.shrink_to(self.k.len() * 3 / 2);
            self.v.shrink_to(self.v.len() * 3 / 2);
        }
    }
    /// Bytes in use (not capacity).
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }
}
