//! Working buffers of a forward pass, reused from step to step.
//!
//! A decode step fills a few dozen f32 buffers that live for one layer: projections, the FFN's
//! hidden rows, the recurrence's outputs. Allocating each with `vec![0.0; n]` costs an allocation
//! and a pass of zeroes over memory that the next kernel overwrites anyway, on the thread that
//! drives the step while the other compute threads wait. [`Buf::output`] instead takes a buffer from this thread's free list and
//! leaves its values as an earlier use left them: for outputs a kernel writes in full. In debug
//! builds those values are NaN, so a kernel that leaves an element unwritten shows in the tests
//! (NaN reaches the logits) instead of passing stale values on.
//!
//! Buffers return to the list when dropped. The list keeps at most [`MAX_KEPT`] buffers of at most
//! [`MAX_KEPT_FLOATS`] floats each (at most 128 MiB per thread; a decode step's or a verification
//! batch's buffers are a few MiB in all): a long prompt's larger chunks are allocated afresh, their
//! allocation spread over hundreds of rows.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps for reuse.
pub const MAX_KEPT: usize = 32;
/// Largest buffer kept for reuse (4 MiB of f32).
pub const MAX_KEPT_FLOATS: usize = 1 << 20;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A working buffer of `len()` floats; returns to this thread's free list when dropped.
pub struct Buf {
    /// Every element initialised; `v.len() ≥ n` (the part past `n` is kept for a later, longer use).
    v: Vec<f32>,
    n: usize,
}

impl Buf {
    /// `n` floats whose values are unspecified (NaN in debug builds): for an output that the
    /// caller writes in full before reading it.
    pub fn output(n: usize) -> Buf {
        let mut b = Buf::take(n);
        if cfg!(debug_assertions) {
            b.fill(f32::NAN);
        }
        b
    }

    /// `n` zeros.
    pub fn zeroed(n: usize) -> Buf {
        let mut b = Buf::take(n);
        b.fill(0.0);
        b
    }

    /// `v` as a buffer (it joins the free list when dropped).
    pub fn from_vec(v: Vec<f32>) -> Buf {
        Buf { n: v.len(), v }
    }

    /// The values as a vector that leaves the free list.
    pub fn into_vec(mut self) -> Vec<f32> {
        let mut v = std::mem::take(&mut self.v);
        v.truncate(self.n);
        v
    }

    /// A kept buffer that holds `n` floats without growing (the smallest such), else the
    /// largest kept one grown to `n`, else a new one.
    fn take(n: usize) -> Buf {
        let kept = if n <= MAX_KEPT_FLOATS {
            FREE.try_with(|f| {
                let mut f = f.borrow_mut();
                let fits = (0..f.len())
                    .filter(|&i| f[i].len() >= n)
                    .min_by_key(|&i| f[i].len());
                let i = fits.or_else(|| (0..f.len()).max_by_key(|&i| f[i].len()))?;
                Some(f.swap_remove(i))
            })
            .ok()
            .flatten()
        } else {
            None
        };
        let v = match kept {
            Some(mut v) => {
                if v.len() < n {
                    v.resize(n, 0.0);
                }
                v
            }
            None => vec![0.0; n],
        };
        Buf { v, n }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.capacity() == 0 || v.len() > MAX_KEPT_FLOATS {
            return;
        }
        // During thread exit the list may be gone already: the buffer is then freed.
        let _ = FREE.try_with(|f| {
            if let Ok(mut f) = f.try_borrow_mut() {
                if f.len() < MAX_KEPT {
                    f.push(v);
                }
            }
        });
    }
}

impl Deref for Buf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.v[..self.n]
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.v[..self.n]
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> Vec<usize> {
        FREE.with(|f| f.borrow().iter().map(|v| v.len()).collect())
    }

    #[test]
    fn buffers_are_reused_best_fit_and_bounded() {
        // A fresh thread: its own free list.
        std::thread::spawn(|| {
            let (a, b) = (Buf::zeroed(100), Buf::zeroed(1000));
            assert_eq!((a.len(), b.len()), (100, 1000));
            assert!(a.iter().all(|&x| x == 0.0));
            let pa = a.as_ptr();
            drop((a, b));
            assert_eq!(kept().len(), 2);
            // The smallest buffer that holds 50 floats is the 100-float one.
            let c = Buf::output(50);
            assert_eq!((c.as_ptr(), c.len()), (pa, 50));
            // None holds 2000: the largest grows.
            let d = Buf::zeroed(2000);
            assert_eq!(d.len(), 2000);
            assert!(d.iter().all(|&x| x == 0.0));
            drop(d);
            drop(c);
            // The 100-float buffer came back whole: its length past 50 is kept.
            let mut lens = kept();
            lens.sort_unstable();
            assert_eq!(lens, vec![100, 2000]);
            // Over the size limit: allocated afresh and not kept.
            drop(Buf::zeroed(MAX_KEPT_FLOATS + 1));
            assert_eq!(kept().len(), 2);
            // At most MAX_KEPT buffers.
            let many: Vec<Buf> = (0..MAX_KEPT + 5).map(|_| Buf::output(8)).collect();
            drop(many);
            assert_eq!(kept().len(), MAX_KEPT);
            // A vector taken out leaves the list for good.
            let v = Buf::zeroed(3).into_vec();
            assert_eq!(v, vec![0.0; 3]);
            assert_eq!(kept().len(), MAX_KEPT - 1);
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn outputs_are_nan_in_debug_builds() {
        if cfg!(debug_assertions) {
            drop(Buf::zeroed(16));
            assert!(Buf::output(16).iter().all(|x| x.is_nan()));
        }
    }
}
