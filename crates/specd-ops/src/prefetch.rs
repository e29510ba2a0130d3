//! Software prefetch of the weight stream, shared by every SIMD matmul kernel family (and used by
//! the delta rule's row kernel for the recurrent state).
//!
//! A decode step reads each weight once, from memory. The kernels ask for the bytes [`ahead`] of
//! the block they are working on, so that a few-row tile's arithmetic and the weight stream
//! overlap instead of taking turns. *How* the requests are issued matters as much as how far
//! ahead: a super-block of 16 interleaved rows spans 36 (Q4_K) to 53 (Q6_K) cache lines, and
//! issuing all of them in one burst at the top of each super-block left the 8-row tile waiting on
//! its own loads: it streamed at about a third of what one row streams. Issued a slice per
//! sub-block instead ([`slice`]), the same requests keep the stream flowing, for one row and for
//! eight (`docs/quantisation.md`, "Streaming the weights"; figures in BENCHMARKS.md).

/// Bytes ahead of the current block that a kernel prefetches: 4 KiB, or 8 KiB for a tile of at
/// least `wide_from` activation rows. A wide tile spends long enough on each block that 4 KiB
/// ahead is too close in time for the memory's latency, so it looks twice as far; one- and
/// two-row tiles, bound by the stream itself, do best at 4 KiB. Prefetching past the end of the
/// weights is harmless: a prefetch never faults.
pub(crate) const fn ahead(rows: usize, wide_from: usize) -> usize {
    if rows >= wide_from {
        8192
    } else {
        4096
    }
}

/// `wide_from` for kernels over blocks of 32 columns (Q8_0, Q4_0, IQ4_NL, the legacy types):
/// 4 and 8 rows were both faster at 8 KiB.
pub(crate) const WIDE_BLOCKS: usize = 4;
/// `wide_from` for the super-block kernels, which do more arithmetic per byte: 8 rows were faster
/// at 8 KiB, 4 rows not.
pub(crate) const WIDE_SUPER_BLOCKS: usize = 8;

/// Prefetches (into L1) slice `part` of `parts` of the cache lines of the `bytes` bytes at `at`;
/// the slices `0..parts` together cover every line once. Any address may be given: the pointer
/// is only offset (`wrapping_add`) and prefetched, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn slice(at: *const u8, bytes: usize, part: usize, parts: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let lines = bytes.div_ceil(64);
    for l in part * lines / parts..(part + 1) * lines / parts {
        // SAFETY: prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * l) as *const i8) };
    }
}
