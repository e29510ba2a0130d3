//! Software prefetch of the weight stream, shared by every SIMD matmul kernel family (and used by
//! the delta rule's row kernel for the recurrent state).
//!
//! A decode step reads each weight once, from memory. The kernels ask for the bytes [`ahead`] of
//! the block they are working on, so that a few-row tile's arithmetic and the weight stream
//! overlap instead of taking turns. *How* the requests are issued matters as much as how far
//! ahead: a super-block of 16 interleaved rows spans 36 (Q4_K) to 53 (Q6_K) cache lines, and
//! issuing all of them in one burst at the top of each super-block left the 8-row tile waiting on
//! its own loads: it streamed at about a third of what one row streams. Issued a slice per
//! sub-block instead ([`spread`], [`stream`]), the same requests keep the stream flowing, for
//! one row and for eight. *Where* the lines go is the CPU's: on Intel into L2 ([`intel_l2`],
//! [`into_l2`]) — with a second, short-range request into L1 ([`near_l1`]) — on AMD into L1
//! (`docs/quantisation.md`, "Streaming the weights").

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
/// 8 rows are faster at 8 KiB; 4 rows were too on 4 KiB pages, but on huge pages
/// ([`crate::huge_pages`]), with the [`NEAR`] request, they are faster at 4 KiB.
pub(crate) const WIDE_BLOCKS: usize = 5;
/// `wide_from` for the super-block kernels, which do more arithmetic per byte: 8 rows were faster
/// at 8 KiB, 4 rows not.
pub(crate) const WIDE_SUPER_BLOCKS: usize = 8;

/// Whether the kernels prefetch into L2 (`prefetcht1`) rather than L1 (`prefetcht0`), decided
/// once per process: on Intel CPUs yes, on the others no; `SPECD_PREFETCH=l1|l2` overrides (A/B
/// measurements). On Intel the L1 prefetches hold up the tiles' own loads (one-row steps and
/// 4-row tiles run faster into L2). On AMD, L1: Zen 5 measured the two alike, Zen 4 generates
/// faster into L1.
#[cfg(target_arch = "x86_64")]
pub(crate) fn intel_l2() -> bool {
    use std::sync::OnceLock;
    static TO_L2: OnceLock<bool> = OnceLock::new();
    *TO_L2.get_or_init(|| match std::env::var("SPECD_PREFETCH").as_deref() {
        Ok("l1") => false,
        Ok("l2") => true,
        _ => {
            let id = std::arch::x86_64::__cpuid(0);
            // "GenuineIntel" in EBX, EDX, ECX.
            (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
        }
    })
}

/// Whether a tile of `rows` activation rows of a kernel family whose wide tiles start at
/// `wide_from` ([`WIDE_BLOCKS`], [`WIDE_SUPER_BLOCKS`]) prefetches into L2: where
/// [`intel_l2`] says so, except the super-block kernels' wide tiles, whose 8 rows measured
/// slower from L2 than from L1 on the same Xeon.
pub(crate) fn into_l2(rows: usize, wide_from: usize) -> bool {
    intel_l2() && !(wide_from == WIDE_SUPER_BLOCKS && rows >= wide_from)
}

/// Bytes ahead of the current block that a kernel also prefetches into L1 where [`near_l1`]
/// says so: a second, short-range request for lines the far one has brought to L2.
pub(crate) const NEAR: usize = 1024;

/// Whether the kernels add the [`NEAR`] L1 prefetch to their stream, in every tile but the AMX
/// ones: where the stream goes to L2 ([`intel_l2`]). From L2 alone, a tile waits for each line's
/// move into L1 and its arithmetic and the stream take turns; from L1 alone they overlap but the
/// stream is slower. With the short L1 request on top, the tiles overlap again
/// and the one-row step keeps the L2 stream's speed. (On 4 KiB pages the 32-column kernels' wide
/// tiles measured no faster with it and went without; on the huge pages the weights now live on
/// ([`crate::huge_pages`]) their 8-row tiles are faster with it at AVX-512.)
pub(crate) fn near_l1() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        intel_l2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Slice `part` of `parts` equal byte ranges of the `bytes` bytes at `at`, prefetched with one
/// request per started 64 bytes (into L2 if `l2`, else L1): the same number of requests in
/// every slice, at offsets known when the kernel is compiled. Consecutive slices' requests are
/// at most 64 bytes apart, so every line of a run of blocks is requested (a line shared by two
/// slices may be requested twice; the run's very last line perhaps not). Exact line ranges per
/// slice would need a division and a loop of varying length per slice: that bookkeeping, not the
/// requests, cost the super-block kernels up to two fifths of an in-cache tile's time
/// (docs/quantisation.md, "Streaming the weights"). Any address may be given, as for [`whole`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn spread(at: *const u8, bytes: usize, part: usize, parts: usize, l2: bool) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    for off in spread_offsets(bytes, part, parts) {
        let p = at.wrapping_add(off) as *const i8;
        // SAFETY: prefetch never faults, whatever the address.
        unsafe {
            if l2 {
                _mm_prefetch::<_MM_HINT_T1>(p)
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p)
            }
        }
    }
}

/// The byte offsets (from the block's start) that [`spread`] requests for slice `part` of
/// `parts`: one per started 64 bytes of an equal share.
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
fn spread_offsets(bytes: usize, part: usize, parts: usize) -> impl Iterator<Item = usize> {
    let stride = bytes.div_ceil(parts);
    (0..stride.div_ceil(64)).map(move |j| part * stride + 64 * j)
}

/// A kernel's share of the stream for one step: slice `part` of `parts` of the
/// `bytes` bytes at `far` (into L2 if `l2`, see [`into_l2`]) and, if `near` ([`near_l1`]), the
/// same slice [`NEAR`] bytes past the block at `blk` into L1 — each issued by [`spread`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn stream(
    blk: *const u8,
    far: *const u8,
    bytes: usize,
    (part, parts): (usize, usize),
    l2: bool,
    near: bool,
) {
    spread(far, bytes, part, parts, l2);
    if near {
        spread(blk.wrapping_add(NEAR), bytes, part, parts, false);
    }
}

/// Prefetches every cache line of the `bytes` bytes at `at` (a block small enough to request in
/// one go), into L2 if `l2` (see [`into_l2`]) else L1. Any address may be given: the pointer is
/// only offset (`wrapping_add`) and prefetched, never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn whole(at: *const u8, bytes: usize, l2: bool) {
    spread(at, bytes, 0, 1, l2);
}

#[cfg(test)]
mod tests {
    use super::spread_offsets;

    /// Every cache line of a run of blocks gets a request, whatever the run's alignment, for the
    /// slicings the kernels use (bytes of a group block, slices per block) — but perhaps the
    /// run's very last line, as documented.
    #[test]
    fn spread_requests_every_line_of_a_run_of_blocks() {
        let slicings = [
            (544, 2),   // Q8_0 group block, AVX2 halves
            (288, 2),   // Q4_0 / IQ4_NL
            (320, 2),   // Q4_1
            (2304, 16), // Q4_K, AVX2: both halves' sub-blocks
            (2304, 8),  // Q4_K, AVX-512
            (3360, 32), // Q6_K
            (2176, 16), // IQ4_XS
            (1344, 16), // Q2_K
            (1760, 16), // Q3_K
            (1024, 1),  // a delta-rule row pair, whole
        ];
        for (bytes, parts) in slicings {
            for align in 0..64 {
                let blocks = 3;
                let mut requested = std::collections::BTreeSet::new();
                for b in 0..blocks {
                    for part in 0..parts {
                        for off in spread_offsets(bytes, part, parts) {
                            requested.insert((align + b * bytes + off) / 64);
                        }
                    }
                }
                let first = align / 64;
                let last = (align + blocks * bytes - 1) / 64;
                for line in first..last {
                    assert!(
                        requested.contains(&line),
                        "{bytes} bytes in {parts} slices, alignment {align}: line {line} missed"
                    );
                }
                // No request strays further than one line past the run.
                assert!(requested.iter().all(|&l| l <= last + 1));
            }
        }
    }
}
