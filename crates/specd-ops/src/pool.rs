//! The compute threads of a model: a fork-join pool whose idle workers spin for a while before
//! they park.
//!
//! Written here rather than taken from rayon because of one setting rayon does not expose. A
//! decode step is a few hundred parallel regions (every matmul, the recurrence, attention)
//! separated by serial stretches of tens to hundreds of microseconds (norms, the conv, gathers).
//! Rayon parks an idle worker after about 32 `sched_yield`s, so most regions began by waking a
//! parked thread — a futex call and a trip through the scheduler — a cost every one-row decode
//! step paid hundreds of times. Here an idle worker spins (`pause`) for
//! [`spin_limit`] before it parks, as llama.cpp's thread pool does, and a region's caller works on
//! it too. Rayon stays for work outside a model's pool (loading, repacking, the kernel benches).
//!
//! One region runs at a time per pool; a region started while another thread's is running runs
//! on its caller alone (same results: threads only ever split independent outputs), and a region
//! started from inside a region's item runs inline.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks: `SPECD_SPIN_US` microseconds, default 1000
/// (long enough to bridge the serial stretches of a step and the sampling between steps; 0 parks
/// at once, like a plain condition-variable pool).
pub fn spin_limit() -> Duration {
    use std::sync::OnceLock;
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("SPECD_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1000);
        Duration::from_micros(us)
    })
}

/// The region state word: epoch in the high 32 bits, [`CLOSED`], and the number of workers
/// inside the region in the low bits. Joining and closing are one atomic step each, so a worker
/// either joins an open region (and the caller waits for it) or never touches it.
const CLOSED: u64 = 1 << 31;
const COUNT: u64 = CLOSED - 1;

fn epoch(s: u64) -> u64 {
    s >> 32
}

/// One parallel region: items `0..n` of `f`, claimed one at a time.
struct Region<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
}

impl Region<'_> {
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            (self.f)(i);
        }
    }
}

struct Shared {
    /// Threads including the caller.
    n: usize,
    state: AtomicU64,
    /// The open region (a `Region` on its caller's stack, valid while it is open or joined).
    region: AtomicPtr<()>,
    /// Some thread is running a region.
    running: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    panicked: AtomicBool,
    spin: Duration,
}

thread_local! {
    /// The pool installed on this thread ([`Pool::install`], or the worker's own).
    static CURRENT: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// Inside a region's item (or a worker thread): a nested region runs inline.
    static IN_REGION: Cell<bool> = const { Cell::new(false) };
}

/// A model's compute threads (see the module docs). Dropping it stops and joins the workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `n` threads: the thread that runs a region and `n − 1` workers, named
    /// `specd-compute-{i}`.
    pub fn new(n: usize) -> std::io::Result<Pool> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            state: AtomicU64::new(0),
            region: AtomicPtr::new(std::ptr::null_mut()),
            running: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            spin: spin_limit(),
        });
        let mut pool = Pool {
            shared,
            workers: Vec::with_capacity(n - 1),
        };
        for i in 1..n {
            let sh = pool.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("specd-compute-{i}"))
                .spawn(move || worker(sh))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// Threads in the pool (the caller of a region included).
    pub fn n_threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `f` on this thread with this pool installed: the parallel regions it starts
    /// ([`crate::parallel::for_each`]) run on the pool.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Shared);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let prev = CURRENT.with(|c| c.replace(Arc::as_ptr(&self.shared)));
        let _restore = Restore(prev);
        f()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self
                .shared
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Threads of the pool installed on this thread, if any.
pub(crate) fn current_threads() -> Option<usize> {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: a non-null pointer was set by `install` (whose `&Pool` keeps the `Shared` alive
    // until it restores the previous value) or by the worker owning an `Arc` of it.
    (!p.is_null()).then(|| unsafe { (*p).n })
}

/// Runs `f(i)` for `i` in `0..n` on the installed pool (`None` if there is none: the caller then
/// uses another way), inline when nested or when another thread's region holds the pool.
pub(crate) fn run(n: usize, f: &(dyn Fn(usize) + Sync)) -> Option<()> {
    let p = CURRENT.with(|c| c.get());
    if p.is_null() {
        return None;
    }
    // SAFETY: as in `current_threads`.
    let sh = unsafe { &*p };
    if sh.n == 1
        || n == 1
        || IN_REGION.with(|c| c.get())
        || sh.running.swap(true, Ordering::Acquire)
    {
        (0..n).for_each(f);
        return Some(());
    }
    let region = Region {
        f,
        n,
        next: AtomicUsize::new(0),
    };
    sh.region
        .store(&region as *const Region<'_> as *mut (), Ordering::Relaxed);
    let e = epoch(sh.state.load(Ordering::Relaxed)).wrapping_add(1) & 0xffff_ffff;
    // Opens the region (count 0) and publishes `region` with it.
    sh.state.store(e << 32, Ordering::SeqCst);
    if sh.sleepers.load(Ordering::SeqCst) > 0 {
        let _g = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
        sh.wake.notify_all();
    }
    IN_REGION.with(|c| c.set(true));
    let mine = catch_unwind(AssertUnwindSafe(|| region.work()));
    IN_REGION.with(|c| c.set(false));
    // Close the region, then wait for the workers inside it: `region` lives on this stack.
    sh.state.fetch_or(CLOSED, Ordering::AcqRel);
    while sh.state.load(Ordering::Acquire) & COUNT != 0 {
        std::hint::spin_loop();
    }
    sh.running.store(false, Ordering::Release);
    if let Err(p) = mine {
        resume_unwind(p);
    }
    if sh.panicked.swap(false, Ordering::AcqRel) {
        panic!("a compute thread panicked");
    }
    Some(())
}

fn worker(sh: Arc<Shared>) {
    CURRENT.with(|c| c.set(Arc::as_ptr(&sh)));
    IN_REGION.with(|c| c.set(true));
    // The pool's first epoch (0), not the current one: a region may open before this thread
    // gets here.
    let mut last = 0;
    loop {
        // Wait for a new region: spin, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        let s = loop {
            let s = sh.state.load(Ordering::Acquire);
            if epoch(s) != last {
                break s;
            }
            if sh.stop.load(Ordering::Relaxed) {
                return;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() >= sh.spin {
                park(&sh, last);
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        };
        last = epoch(s);
        // Join it if it is still open.
        let mut cur = s;
        let joined = loop {
            if epoch(cur) != last || cur & CLOSED != 0 {
                break false;
            }
            match sh
                .state
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(x) => cur = x,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: the region is open and this worker is counted in it: its caller keeps it
        // alive until the count is back to zero.
        let region = unsafe { &*(sh.region.load(Ordering::Acquire) as *const Region<'static>) };
        if catch_unwind(AssertUnwindSafe(|| region.work())).is_err() {
            sh.panicked.store(true, Ordering::Release);
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

/// Parks the worker until the epoch moves past `last` or the pool stops.
fn park(sh: &Shared, last: u64) {
    // Counted before the epoch is checked under the lock, and the caller reads the count after
    // moving the epoch (both sequentially consistent): one of them sees the other, so either
    // the worker sees the new region or the caller notifies it.
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    let mut g = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
    while epoch(sh.state.load(Ordering::SeqCst)) == last && !sh.stop.load(Ordering::SeqCst) {
        g = sh.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
    drop(g);
    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_once_across_many_regions() {
        for n in [1, 2, 3, 4] {
            let pool = Pool::new(n).expect("pool");
            pool.install(|| {
                for len in [0usize, 1, 2, 7, 64, 1000] {
                    let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
                    crate::parallel::for_each(len, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(
                        hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                        "n={n} len={len}"
                    );
                }
            });
        }
    }

    #[test]
    fn workers_take_part_and_parked_workers_wake() {
        let pool = Pool::new(2).expect("pool");
        pool.install(|| {
            for round in 0..3 {
                if round > 0 {
                    // Longer than the spin: the worker parks and must be woken.
                    std::thread::sleep(spin_limit() + Duration::from_millis(5));
                }
                let caller = std::thread::current().id();
                let other = AtomicBool::new(false);
                // Items that wait for each other: finishes only if a second thread runs one.
                let started = AtomicUsize::new(0);
                crate::parallel::for_each(2, |_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    let t = Instant::now();
                    while started.load(Ordering::SeqCst) < 2 {
                        assert!(t.elapsed() < Duration::from_secs(10), "no second thread");
                        std::hint::spin_loop();
                    }
                    if std::thread::current().id() != caller {
                        other.store(true, Ordering::SeqCst);
                    }
                });
                assert!(other.load(Ordering::SeqCst));
            }
        });
    }

    #[test]
    fn nested_and_concurrent_regions_run_inline() {
        let pool = Arc::new(Pool::new(2).expect("pool"));
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                let pool = pool.clone();
                let total = &total;
                s.spawn(move || {
                    pool.install(|| {
                        for _ in 0..200 {
                            crate::parallel::for_each(4, |_| {
                                crate::parallel::for_each(3, |_| {
                                    total.fetch_add(1, Ordering::Relaxed);
                                });
                            });
                        }
                    })
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 4 * 3);
    }

    #[test]
    fn a_panicking_item_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2).expect("pool");
        pool.install(|| {
            let r = catch_unwind(AssertUnwindSafe(|| {
                crate::parallel::for_each(64, |i| {
                    if i == 40 {
                        panic!("item 40");
                    }
                })
            }));
            assert!(r.is_err());
            let hits = AtomicUsize::new(0);
            crate::parallel::for_each(64, |_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 64);
        });
    }
}
