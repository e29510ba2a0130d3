//! Intel AMX (Advanced Matrix Extensions) INT8 tiles: the primitives the prompt's wide tiles use
//! on the [`crate::Isa::Amx`] level (Xeon Sapphire Rapids and later).
//!
//! Why: a prompt's matmuls are bound by integer multiply-adds, not by the weight stream. One
//! `tdpbsud` multiplies a tile of up to 16 activation rows × 32 bytes by a 32 × 16 block of
//! weights — 8192 multiply-adds — where AVX-512 VNNI needs 16 rows × 8 `vpdpbusd` plus a
//! broadcast each. The 16-row interleaved weight layouts ([`crate::pack`]) already store a block
//! as AMX wants its right-hand tile ("VNNI format": row `c` holds weights `4c..4c+4` of each of
//! the 16 output rows), so a Q8_0 block is loaded as it lies and the nibble formats are unpacked
//! once per block into a 512-byte buffer.
//!
//! Exactness: a tile's i32 sums are exact, the same integers `vpdpbusd` accumulates, and the
//! kernels that use them apply every scale and float operation in the AVX-512 kernels' order. So
//! a row's result is bit-identical whichever level or tile height computed it: the batch
//! invariance of the crate docs holds across the AMX and VNNI paths (tested per format).
//!
//! Rust's AMX intrinsics are unstable, so the tile instructions are written as inline assembly.
//! The compiler does not allocate `tmm` registers: a kernel asks for its tile shape
//! ([`configure`]) and uses the tiles within one call on its own thread; no tile *data* lives
//! across calls, only the thread's configuration.

use std::arch::asm;

/// Does this CPU have AMX-TILE and AMX-INT8, and has the kernel (Linux) granted this process the
/// tile data state? Asked once per process.
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_int8() && request_tile_permission())
}

fn cpu_has_amx_int8() -> bool {
    // Leaf 0 says how many leaves there are; leaf 7 has the structured extended features.
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    // EDX bit 24: AMX-TILE, bit 25: AMX-INT8.
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Linux hands out the 8 KiB tile data state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`); without it the first tile instruction faults. The permission is
/// process-wide, so every thread of the pool may use tiles afterwards.
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes which extended states the process may
    // use; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// A tile configuration (palette 1): tile `i` has `rows[i]` rows of `colsb[i]` bytes.
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    bytes: [u8; 64],
}

impl TileConfig {
    pub(crate) fn new() -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        TileConfig { bytes }
    }

    /// Tile `t` (0..8): `rows` rows (≤ 16) of `colsb` bytes (≤ 64).
    pub(crate) fn tile(mut self, t: usize, rows: usize, colsb: usize) -> Self {
        debug_assert!(t < 8 && (1..=16).contains(&rows) && (1..=64).contains(&colsb));
        self.bytes[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
        self.bytes[48 + t] = rows as u8;
        self
    }

    /// Makes this the thread's tile configuration (`ldtilecfg`; zeroes every tile).
    ///
    /// # Safety
    /// [`available`] must have returned true.
    #[inline(always)]
    pub(crate) unsafe fn load(&self) {
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.bytes.as_ptr(), options(nostack, readonly)) }
    }
}

/// Four independent tile products `C_j = A_j · B_j` (j = 0..4): tiles 0..4 are the C tiles (i32,
/// rows × 64 bytes), 4 and 5 the A tiles (signed bytes, rows × K bytes; A_j at `a[j]`, rows
/// `a_stride` apart), 6 and 7 the B tiles (unsigned bytes, K/4 rows × 64 bytes, contiguous at
/// `b[j]`). C_j is stored to `c + 1024·j` (rows × 16 i32, contiguous). `tdpbsud` multiplies signed
/// A by unsigned B: exactly `vpdpbusd(acc, B, A)` per output.
///
/// Four at a time because one product's chain (tile loads, multiply, store, the vector loads
/// that read the sums) is long: a single chain per call left the tile unit idle most of the time,
/// and then AMX was slower than the VNNI kernels. With four C tiles and two A / B tiles each the
/// chains overlap.
///
/// # Safety
/// [`available`] is true; the configuration loaded on this thread gives tiles 0..8 the shapes
/// above; the pointers cover them and `c` 4 KiB.
#[inline(always)]
pub(crate) unsafe fn dot4_su(a: [*const i8; 4], a_stride: usize, b: [*const u8; 4], c: *mut i32) {
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{a0} + {sa} * 1]",
            "tileloadd tmm6, [{b0} + {sb} * 1]",
            "tdpbsud tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {sa} * 1]",
            "tileloadd tmm7, [{b1} + {sb} * 1]",
            "tdpbsud tmm1, tmm5, tmm7",
            "tileloadd tmm4, [{a2} + {sa} * 1]",
            "tileloadd tmm6, [{b2} + {sb} * 1]",
            "tdpbsud tmm2, tmm4, tmm6",
            "tileloadd tmm5, [{a3} + {sa} * 1]",
            "tileloadd tmm7, [{b3} + {sb} * 1]",
            "tdpbsud tmm3, tmm5, tmm7",
            "tilestored [{c} + {sb} * 1], tmm0",
            "tilestored [{c} + {sb} * 1 + 1024], tmm1",
            "tilestored [{c} + {sb} * 1 + 2048], tmm2",
            "tilestored [{c} + {sb} * 1 + 3072], tmm3",
            a0 = in(reg) a[0],
            a1 = in(reg) a[1],
            a2 = in(reg) a[2],
            a3 = in(reg) a[3],
            sa = in(reg) a_stride,
            b0 = in(reg) b[0],
            b1 = in(reg) b[1],
            b2 = in(reg) b[2],
            b3 = in(reg) b[3],
            sb = in(reg) 64usize,
            c = in(reg) c,
            options(nostack),
        )
    }
}

/// One tile product, as [`dot4_su`]'s first (tiles 0, 4 and 6; C to `c`): for a count of
/// blocks that is not a multiple of four.
///
/// # Safety
/// As [`dot4_su`] for j = 0.
#[inline(always)]
pub(crate) unsafe fn dot_su(a: *const i8, a_stride: usize, b: *const u8, c: *mut i32) {
    unsafe {
        asm!(
            "tilezero tmm0",
            "tileloadd tmm4, [{a} + {sa} * 1]",
            "tileloadd tmm6, [{b} + {sb} * 1]",
            "tdpbsud tmm0, tmm4, tmm6",
            "tilestored [{c} + {sb} * 1], tmm0",
            a = in(reg) a,
            sa = in(reg) a_stride,
            b = in(reg) b,
            sb = in(reg) 64usize,
            c = in(reg) c,
            options(nostack),
        )
    }
}

/// The configuration [`dot4_su`] and [`dot_su`] expect: `rows` activation rows, `k` bytes of
/// each per product.
pub(crate) fn config(rows: usize, k: usize) -> TileConfig {
    let mut cfg = TileConfig::new();
    for t in 0..4 {
        cfg = cfg.tile(t, rows, 64);
    }
    cfg.tile(4, rows, k)
        .tile(5, rows, k)
        .tile(6, k / 4, 64)
        .tile(7, k / 4, 64)
}

/// Makes [`config`]`(rows, k)` this thread's tile configuration, unless it already is.
///
/// `ldtilecfg` zeroes every tile and waits for the tile unit; loading the configuration in every
/// call (and releasing the tiles after it) cost up to 15 % of a 32-row call, so a thread keeps its
/// tiles configured between calls: the kernels are the only users of tiles in the process, and
/// each asks for its shape here first.
///
/// # Safety
/// [`available`] must have returned true.
#[inline(always)]
pub(crate) unsafe fn configure(rows: usize, k: usize) {
    use std::cell::Cell;
    thread_local! {
        static SHAPE: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }
    SHAPE.with(|s| {
        if s.get() != (rows, k) {
            // SAFETY: the caller checked `available`.
            unsafe { config(rows, k).load() };
            s.set((rows, k));
        }
    });
}

/// A 64-byte aligned scratch buffer for tiles a kernel writes before it reads them (right-hand
/// tiles unpacked from nibbles, tiles of sums stored), left uninitialised: zeroing the 6–12 KiB of
/// a kernel call cost 5 % of prompt processing.
#[repr(C, align(64))]
pub(crate) struct Scratch<const N: usize>(std::mem::MaybeUninit<[u8; N]>);

impl<const N: usize> Scratch<N> {
    pub(crate) fn new() -> Self {
        Scratch(std::mem::MaybeUninit::uninit())
    }

    /// The buffer's first byte; write a byte before reading it.
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile products against the plain definition, for every row count and K of the kernels.
    #[test]
    fn tile_product_is_the_integer_dot_product() {
        if !available() {
            eprintln!("skipped: no AMX-INT8 on this CPU");
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        };
        for m in [1usize, 3, 8, 16] {
            for k in [16usize, 32] {
                let a: Vec<i8> = (0..m * 40).map(|_| next() as i8).collect();
                let b: Vec<u8> = (0..k / 4 * 64 + 192).map(|_| next()).collect();
                let (mut c, mut c1) = ([0u8; 4096], [0u8; 1024]);
                // Product j: A from byte 2j of each row, B from byte 64j.
                let aj = |j: usize| a[2 * j..].as_ptr();
                let bj = |j: usize| b[64 * j..].as_ptr();
                // SAFETY: AMX available; shapes as configured; buffers cover them (A rows 40
                // bytes apart, K ≤ 32 from byte ≤ 6; B K/4 rows of 64 from byte ≤ 192, which
                // `b` covers with its 64 bytes per row of the largest K plus 192).
                unsafe {
                    configure(m, k);
                    dot4_su(
                        [aj(0), aj(1), aj(2), aj(3)],
                        40,
                        [bj(0), bj(1), bj(2), bj(3)],
                        c.as_mut_ptr() as *mut i32,
                    );
                    dot_su(aj(1), 40, bj(1), c1.as_mut_ptr() as *mut i32);
                }
                let at = |buf: &[u8], i: usize| {
                    i32::from_le_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]])
                };
                for j in 0..4 {
                    for r in 0..m {
                        for n in 0..16 {
                            let want: i32 = (0..k)
                                .map(|i| {
                                    a[r * 40 + 2 * j + i] as i32
                                        * b[64 * j + (i / 4) * 64 + 4 * n + i % 4] as i32
                                })
                                .sum();
                            let got = at(&c, 256 * j + r * 16 + n);
                            assert_eq!(got, want, "m {m} k {k} product {j} row {r} col {n}");
                            if j == 1 {
                                assert_eq!(at(&c1, r * 16 + n), want, "single product");
                            }
                        }
                    }
                }
            }
        }
    }
}
