//! Splitting independent output elements across threads: [`for_each`] runs a parallel region
//! on the model's [`crate::pool::Pool`] where one is installed, on rayon's pool elsewhere.

/// A raw pointer that may be shared across threads. Used only where each thread writes a disjoint
/// set of elements (different output columns of a matmul, different heads of a recurrence) and
/// splitting the slice safely would need a strided view that `split_at_mut` cannot express.
pub struct SyncPtr<T>(pub *mut T);
// By hand: the derives would require `T: Copy`, and the pointer is copyable for any `T`.
impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
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

/// Number of threads of the pool we are running in.
pub fn n_threads() -> usize {
    crate::pool::current_threads()
        .unwrap_or_else(rayon::current_num_threads)
        .max(1)
}

/// Runs `f(i)` for every `i` in `0..n`, in parallel; returns when all are done. Items are
/// claimed one at a time, so uneven items balance themselves.
pub fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    match n {
        0 => {}
        1 => f(0),
        _ => {
            if crate::pool::run(n, &f).is_none() {
                use rayon::prelude::*;
                (0..n).into_par_iter().for_each(&f);
            }
        }
    }
}

/// Runs `f(i, piece)` over the consecutive `len`-long pieces of `buf` (the last one shorter if
/// `len` does not divide it), in parallel.
pub fn for_each_piece_mut<T: Send>(buf: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (total, len) = (buf.len(), len.max(1));
    let p = SyncPtr(buf.as_mut_ptr());
    for_each(total.div_ceil(len), |i| {
        let s = i * len;
        // SAFETY: piece i is inside `buf` and no other item's.
        f(i, unsafe { p.slice_mut(s, len.min(total - s)) })
    });
}

/// Chunks per thread a region is cut into. The threads claim chunks as they go, so more chunks
/// end a region more evenly — but a matmul's chunk is a stretch of the weight stream, and at 16
/// the shorter stretches cost more than the waiting saved (one-row and 8-row steps 6–7 % slower,
/// BENCHMARKS.md).
pub const CHUNKS_PER_THREAD: usize = 4;

/// Fewest values a task of row-wise work (activation quantisation) gets: a hand-off to a
/// spinning worker costs about a microsecond, a 4 Ki-value piece of work several.
pub const MIN_TASK_VALUES: usize = 4 * 1024;

/// Rows of `cols` values per task for row-wise work (see [`MIN_TASK_VALUES`]).
pub fn rows_per_task(cols: usize) -> usize {
    (MIN_TASK_VALUES / cols.max(1)).max(1)
}

/// [`for_each`] over `n` items taken `min_len` at a time (for items too small to be a task of
/// their own): a batch of at most `min_len` items runs inline, without a hand-off.
pub fn for_each_min(n: usize, min_len: usize, f: impl Fn(usize) + Sync) {
    let min_len = min_len.max(1);
    for_each(n.div_ceil(min_len), |t| {
        (t * min_len..((t + 1) * min_len).min(n)).for_each(&f)
    });
}

/// Chunk length for splitting `n` independent items over the current pool: [`CHUNKS_PER_THREAD`]
/// chunks per thread, rounded up to `align`, at least `min`.
pub fn chunk_len(n: usize, align: usize, min: usize) -> usize {
    let per = n.div_ceil(n_threads() * CHUNKS_PER_THREAD).max(min);
    per.div_ceil(align) * align
}
