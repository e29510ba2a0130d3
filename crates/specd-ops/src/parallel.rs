//! Small helpers for splitting independent output elements across rayon threads.

/// A raw pointer that may be shared across threads. Used only where each thread writes a disjoint
/// set of elements (different output columns of a matmul, different heads of a recurrence) and
/// splitting the slice safely would need a strided view that `split_at_mut` cannot express.
#[derive(Clone, Copy)]
pub struct SyncPtr<T>(pub *mut T);
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// # Safety
    /// The caller guarantees `i` is in bounds and no other thread touches element `i`.
    #[inline]
    pub unsafe fn write(self, i: usize, v: T) {
        unsafe { self.0.add(i).write(v) }
    }
    /// The pointer `n` elements on (through a method, so that closures capture the `Sync`
    /// wrapper and not the raw pointer).
    ///
    /// # Safety
    /// The offset must stay inside the allocation.
    #[inline]
    pub unsafe fn add(self, n: usize) -> *mut T {
        unsafe { self.0.add(n) }
    }

    /// # Safety
    /// Same contract as [`SyncPtr::write`]; the returned slice must not overlap another thread's.
    #[inline]
    pub unsafe fn slice_mut<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// Number of threads of the rayon pool we are running in.
pub fn n_threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Chunk length for splitting `n` independent items over the current pool: a few chunks per thread
/// for load balance, rounded up to `align`, at least `min`.
pub fn chunk_len(n: usize, align: usize, min: usize) -> usize {
    let per = n.div_ceil(n_threads() * 4).max(min);
    per.div_ceil(align) * align
}
