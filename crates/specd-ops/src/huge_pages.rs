//! Memory for the weights specd copies at load (the repacked layouts of [`crate::pack`]), backed
//! by the kernel's transparent huge pages where it has them.
//!
//! Why: a decode step streams every weight once, hundreds of MiB, and on 4 KiB pages that is a
//! TLB miss — a page walk — every 64 cache lines, and a page boundary at which the hardware
//! prefetchers stop every 4 KiB. On 2 MiB pages both go away. Linux backs anonymous memory with
//! huge pages only where asked (`MADV_HUGEPAGE`) under its common `madvise` setting, and only in
//! 2 MiB-aligned runs, which a `Vec` of that size does not start on; so the buffer is mapped
//! here, on a huge-page boundary, and advised. Written by hand (one `mmap`, one `madvise`): no
//! well-kept crate maps anonymous memory at a chosen alignment. Elsewhere — another OS, a kernel
//! without transparent huge pages, buffers smaller than one huge page, `SPECD_NO_HUGE_PAGES` set
//! (A/B measurements) — the buffer is an ordinary `Vec`. Either way the bytes and the resident
//! size are the same: only the pages touched are resident, and the mapping ends at the buffer's
//! last 4 KiB page, so a huge page never extends past it.

use crate::weight::ByteSource;

/// A zero-initialised byte buffer for weights, on huge pages where the system provides them
/// (see the module docs).
pub struct HugeBuf(Inner);

enum Inner {
    Heap(Vec<u8>),
    #[cfg(target_os = "linux")]
    Mapped(mapped::Mapping),
}

impl HugeBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> HugeBuf {
        #[cfg(target_os = "linux")]
        if let Some(huge) = mapped::huge_page_size().filter(|&h| len >= h) {
            if let Some(m) = mapped::Mapping::new(len, huge) {
                return HugeBuf(Inner::Mapped(m));
            }
        }
        HugeBuf(Inner::Heap(vec![0u8; len]))
    }

    /// Whether the buffer is its own huge-page-aligned mapping (rather than heap memory).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.0, Inner::Heap(_))
    }
}

impl std::ops::Deref for HugeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped(m) => m.as_slice(),
        }
    }
}

impl std::ops::DerefMut for HugeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped(m) => m.as_mut_slice(),
        }
    }
}

impl ByteSource for HugeBuf {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

#[cfg(target_os = "linux")]
mod mapped {
    use std::ptr::NonNull;
    use std::sync::OnceLock;

    /// The size of a transparent huge page (`hpage_pmd_size`: 2 MiB on x86-64), or `None` where
    /// the kernel has none or `SPECD_NO_HUGE_PAGES` is set. Read once per process.
    pub(super) fn huge_page_size() -> Option<usize> {
        static SIZE: OnceLock<Option<usize>> = OnceLock::new();
        *SIZE.get_or_init(|| {
            if std::env::var_os("SPECD_NO_HUGE_PAGES").is_some() {
                return None;
            }
            let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
                .ok()?;
            let size: usize = s.trim().parse().ok()?;
            (size.is_power_of_two() && size.is_multiple_of(page_size())).then_some(size)
        })
    }

    fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
    }

    /// An anonymous private mapping of `len` bytes starting on a huge-page boundary.
    pub(super) struct Mapping {
        ptr: NonNull<u8>,
        len: usize,
        /// `len` rounded up to whole pages: what is mapped, and unmapped on drop.
        mapped: usize,
    }

    // SAFETY: the mapping is owned by this value alone; `&Mapping` only reads it.
    unsafe impl Send for Mapping {}
    // SAFETY: as above, shared references give read-only access.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// Maps `len` (> 0) bytes aligned to `huge` and asks for huge pages; `None` if the
        /// system refuses the mapping.
        pub(super) fn new(len: usize, huge: usize) -> Option<Mapping> {
            let mapped = len.checked_next_multiple_of(page_size())?;
            let total = mapped.checked_add(huge)?;
            // SAFETY: a fresh anonymous mapping; no existing memory is touched.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    total,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let b = base as usize;
            let start = b.next_multiple_of(huge);
            let (head, tail) = (start - b, total - (start - b) - mapped);
            // SAFETY: both ranges lie inside the mapping made above, on page boundaries (`huge`
            // and `mapped` are multiples of the page size), and nothing refers to them.
            unsafe {
                if head > 0 {
                    libc::munmap(base, head);
                }
                if tail > 0 {
                    libc::munmap((start + mapped) as *mut libc::c_void, tail);
                }
                // Advice only: where the kernel declines, the pages are ordinary ones.
                libc::madvise(start as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE);
            }
            Some(Mapping {
                ptr: NonNull::new(start as *mut u8)?,
                len,
                mapped,
            })
        }

        pub(super) fn as_slice(&self) -> &[u8] {
            // SAFETY: `ptr` is valid for `len` bytes (zero-filled by the kernel) while `self`
            // lives.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }

        pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
            // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: exactly the range mapped in `new`, no longer referenced.
            unsafe {
                libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.mapped);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HugeBuf;

    #[test]
    fn small_and_large_buffers_start_zeroed_and_keep_what_is_written() {
        for len in [0, 1, 4095, 100_000, (4 << 20) + 12_345] {
            let mut b = HugeBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0));
            for (i, v) in b.iter_mut().enumerate() {
                *v = (i * 31 % 251) as u8;
            }
            assert!(b
                .iter()
                .enumerate()
                .all(|(i, &v)| v == (i * 31 % 251) as u8));
        }
    }

    /// Where the kernel has transparent huge pages, a buffer of a few huge pages is its own
    /// aligned mapping and carries the advice (`hg` in its `VmFlags`), which the common
    /// `madvise` setting needs before it backs anything with huge pages.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_aligned_and_advised() {
        let Some(huge) = super::mapped::huge_page_size() else {
            return;
        };
        let mut b = HugeBuf::zeroed(3 * huge + 100);
        assert!(b.is_mapped());
        let start = b.as_ptr() as usize;
        assert_eq!(start % huge, 0);
        b.fill(1);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let mut lines = smaps.lines();
        let head = format!("{start:x}-");
        assert!(
            lines.by_ref().any(|l| l.starts_with(&head)),
            "mapping at {head} not in /proc/self/smaps"
        );
        let flags = lines
            .take_while(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|k| k.ends_with(':'))
            })
            .find(|l| l.starts_with("VmFlags:"))
            .unwrap_or_default();
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }
}
