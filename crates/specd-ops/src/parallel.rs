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
/// the shorter stretches cost more than the waiting saved (one-row and 8-row steps got slower).
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

/// Splits runs of independent items — `runs[i]` items in run `i`, one after another — into
/// chunks for the current pool's threads to claim in order: each chunk takes its share of what
/// is left of *all* runs (1 / (2 · threads) of it, at least `min` items, never past its run's
/// end), so a region starts with long chunks and ends with short ones. Returns `(run, range)`
/// pairs in claiming order. Equal chunks leave the thread that claims the last one working
/// alone for up to a whole chunk; shrinking chunks keep that to `min` items without cutting the
/// whole region into short stretches (each chunk of a matmul is a stretch of the weight stream
/// that starts cold).
pub fn guided_chunks(runs: &[usize], min: usize) -> Vec<(usize, std::ops::Range<usize>)> {
    let share = 2 * n_threads();
    let mut left: usize = runs.iter().sum();
    let mut out = Vec::new();
    for (i, &n) in runs.iter().enumerate() {
        let mut at = 0;
        while at < n {
            let len = left.div_ceil(share).max(min.max(1)).min(n - at);
            out.push((i, at..at + len));
            at += len;
            left -= len;
        }
    }
    out
}

/// Chunk length for splitting `n` independent items over the current pool: [`CHUNKS_PER_THREAD`]
/// chunks per thread, rounded up to `align`, at least `min`.
pub fn chunk_len(n: usize, align: usize, min: usize) -> usize {
    let per = n.div_ceil(n_threads() * CHUNKS_PER_THREAD).max(min);
    per.div_ceil(align) * align
}

#[cfg(test)]
mod tests {
    use super::guided_chunks;

    /// Every item of every run is in exactly one chunk, in order; chunks never cross a run's
    /// end, are at least `min` long unless their run ends, and shrink toward the region's end.
    #[test]
    fn guided_chunks_cover_each_run_once_and_shrink() {
        let pool = crate::pool::Pool::new(2).expect("pool");
        pool.install(|| {
            for runs in [vec![224], vec![64, 224, 224], vec![0, 3, 1], vec![1000, 5]] {
                let chunks = guided_chunks(&runs, 4);
                let mut next = vec![0; runs.len()];
                let mut last_run = 0;
                for (i, r) in &chunks {
                    assert!(*i >= last_run, "runs in order: {chunks:?}");
                    last_run = *i;
                    assert_eq!(r.start, next[*i], "{chunks:?}");
                    assert!(!r.is_empty() && r.end <= runs[*i]);
                    assert!(r.len() >= 4 || r.end == runs[*i], "{chunks:?}");
                    next[*i] = r.end;
                }
                assert_eq!(next, runs);
                // A thread is left alone for at most one shortest chunk at the end.
                let lens: Vec<usize> = chunks.iter().map(|(_, r)| r.len()).collect();
                if runs == [224] {
                    assert_eq!(lens[0], 56);
                    assert!(lens.windows(2).all(|w| w[1] <= w[0]), "{lens:?}");
                    assert!(*lens.last().unwrap_or(&0) <= 4, "{lens:?}");
                }
            }
        });
    }
}
