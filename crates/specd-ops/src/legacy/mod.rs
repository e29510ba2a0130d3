//! Native kernels for ggml's block-32 types with an offset or a fifth bit: `Q4_1`, `Q5_0`, `Q5_1`
//! (Q8_0, Q4_0 and IQ4_NL live in [`crate::pack`] / [`crate::matmul`]).
//!
//! # ggml's blocks (`ggml-common.h`)
//! Blocks of 32 weights, weight `w` with an unsigned level `u` (`u` = nibble, plus bit `w` of `qh`
//! as bit 4 for the 5-bit types; nibbles: byte `j` holds weight `j` low, `j + 16` high):
//!
//! | type | bytes | layout | value |
//! |---|---|---|---|
//! | Q4_1 | 20 | f16 `d`, f16 `m`, 16 nibble bytes | `d·u + m` |
//! | Q5_0 | 22 | f16 `d`, u32 `qh`, 16 nibble bytes | `d·(u − 16)` |
//! | Q5_1 | 24 | f16 `d`, f16 `m`, u32 `qh`, 16 nibble bytes | `d·u + m` |
//!
//! # One arithmetic on every level
//! Activations are quantised as for the interleaved Q8_0 kernels ([`quantize_row_i8s`]: i8 blocks
//! of 32 with an f16-rounded scale `dx`), plus per block `sx = dx · Σq` rounded to f16 as ggml's
//! `Q8_1` stores it (a block's offset term is `m · dx · Σq`). Per weight row and block:
//! `I = Σ u·q − OFF·Σq` (exact integers; `OFF` = 16 for Q5_0, else 0), then
//! `acc = fma(I, d·dx, acc)` and, for the types with `m`, `acc = fma(m, sx, acc)`.
//! Integer sums are exact however they are computed, and the float steps are the same per output
//! on the scalar, AVX2, AVX-VNNI and AVX-512 VNNI kernels, in block order whatever the batch: the
//! results are bit-identical across levels, batch widths, positions and thread counts.
//!
//! # The interleaved layout
//! As for Q4_0 ([`crate::pack`]), each matrix is repacked once at load into groups of 16 rows, on
//! every level (one layout; the scalar kernel reads it too). A group block (16 rows × 32
//! weights) holds, in this order:
//!
//! * `d` of the 16 rows as f16 (32 bytes), then `m` as f16 (32 bytes; Q4_1 / Q5_1);
//! * Q5_0 / Q5_1: 64 bytes of fifth bits, byte `4j + i` bit `c` = bit 4 of row `j`'s weight
//!   `4c + i` (so a shift and a mask put chunk `c`'s bits in place for all 16 rows);
//! * 4 chunks of 64 bytes of nibbles: chunk `k` byte `4j + i` holds row `j`'s weight `8k + i` in
//!   its low nibble and `8k + 4 + i` in its high nibble (Q4_0R16's layout: a mask and a shift
//!   give two registers of four weights per row, `vpdpbusd`'s unsigned operand).
//!
//! A group block is exactly 16 ggml blocks: sizes are unchanged. Rows past the last whole group
//! stay in ggml's layout after the groups and are computed by the scalar kernel.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use crate::huge_pages::HugeBuf;
use crate::matmul::{run_grouped, Grouped};
use crate::pack::GROUP;
use crate::parallel::SyncPtr;
use crate::quant::quantize_row_i8s;
use crate::weight::{Weight, WeightType};
use crate::{Isa, OpsError};
use half::f16;
use rayon::prelude::*;

/// Weights per block.
pub const QK: usize = 32;

/// The block-32 types of this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LegacyFormat {
    Q4_1,
    Q5_0,
    Q5_1,
}

impl LegacyFormat {
    /// All formats (tests iterate them).
    pub const ALL: [LegacyFormat; 3] = [LegacyFormat::Q4_1, LegacyFormat::Q5_0, LegacyFormat::Q5_1];

    /// Bytes of one ggml block.
    pub const fn block_bytes(self) -> usize {
        match self {
            LegacyFormat::Q4_1 => 20,
            LegacyFormat::Q5_0 => 22,
            LegacyFormat::Q5_1 => 24,
        }
    }
    /// Has an f16 offset `m` per block.
    pub const fn has_min(self) -> bool {
        !matches!(self, LegacyFormat::Q5_0)
    }
    /// Has a fifth bit per weight.
    pub const fn has_high(self) -> bool {
        !matches!(self, LegacyFormat::Q4_1)
    }
    /// The constant subtracted from `u` (`value = d·(u − OFF)`; types without `m`).
    pub const fn offset(self) -> i32 {
        match self {
            LegacyFormat::Q5_0 => 16,
            _ => 0,
        }
    }
    /// Offset of `qh` in a ggml block (5-bit types).
    const fn qh_at(self) -> usize {
        if self.has_min() {
            4
        } else {
            2
        }
    }
    /// Offset of the 16 nibble bytes in a ggml block.
    const fn qs_at(self) -> usize {
        self.block_bytes() - 16
    }
    /// Offset of the fifth-bit area in a group block.
    pub const fn group_qh_at(self) -> usize {
        if self.has_min() {
            64
        } else {
            32
        }
    }
    /// Offset of the nibble chunks in a group block.
    pub const fn group_qs_at(self) -> usize {
        self.group_block_bytes() - 256
    }
    /// Bytes of one group block (16 rows × 32 weights): 16 ggml blocks.
    pub const fn group_block_bytes(self) -> usize {
        GROUP * self.block_bytes()
    }
    /// Short name as llama.cpp prints it.
    pub const fn name(self) -> &'static str {
        match self {
            LegacyFormat::Q4_1 => "q4_1",
            LegacyFormat::Q5_0 => "q5_0",
            LegacyFormat::Q5_1 => "q5_1",
        }
    }
    /// Name of the interleaved layout.
    pub const fn name_r16(self) -> &'static str {
        match self {
            LegacyFormat::Q4_1 => "q4_1 (16-row interleaved)",
            LegacyFormat::Q5_0 => "q5_0 (16-row interleaved)",
            LegacyFormat::Q5_1 => "q5_1 (16-row interleaved)",
        }
    }
}

/// One row's block: f16 bits of `d` and `m` (`m` = 0 without one) and the unsigned levels.
#[derive(Clone)]
pub(crate) struct Decoded {
    pub d: u16,
    pub m: u16,
    pub u: [u8; QK],
}

fn f16_bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Decodes one ggml block (`b`: `fmt.block_bytes()` bytes).
pub(crate) fn decode(fmt: LegacyFormat, b: &[u8]) -> Decoded {
    let qs = &b[fmt.qs_at()..fmt.qs_at() + 16];
    let qh = if fmt.has_high() {
        let at = fmt.qh_at();
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    } else {
        0
    };
    let mut u = [0u8; QK];
    for (w, v) in u.iter_mut().enumerate() {
        let nib = if w < 16 {
            qs[w] & 0x0f
        } else {
            qs[w - 16] >> 4
        };
        *v = nib | ((((qh >> w) & 1) as u8) << 4);
    }
    Decoded {
        d: f16_bits(b, 0),
        m: if fmt.has_min() { f16_bits(b, 2) } else { 0 },
        u,
    }
}

/// Writes row `j`'s block into group block `blk`.
fn write_group_row(fmt: LegacyFormat, d: &Decoded, j: usize, blk: &mut [u8]) {
    blk[2 * j..2 * j + 2].copy_from_slice(&d.d.to_le_bytes());
    if fmt.has_min() {
        blk[32 + 2 * j..32 + 2 * j + 2].copy_from_slice(&d.m.to_le_bytes());
    }
    if fmt.has_high() {
        let qh = &mut blk[fmt.group_qh_at()..fmt.group_qh_at() + 64];
        for i in 0..4 {
            qh[4 * j + i] = (0..8).map(|c| ((d.u[4 * c + i] >> 4) & 1) << c).sum();
        }
    }
    let qs = &mut blk[fmt.group_qs_at()..];
    for k in 0..4 {
        for i in 0..4 {
            qs[64 * k + 4 * j + i] = (d.u[8 * k + i] & 0x0f) | ((d.u[8 * k + 4 + i] & 0x0f) << 4);
        }
    }
}

/// Reads row `j`'s block back from group block `blk`.
pub(crate) fn read_group_row(fmt: LegacyFormat, blk: &[u8], j: usize) -> Decoded {
    let mut u = [0u8; QK];
    let qs = &blk[fmt.group_qs_at()..];
    for (w, v) in u.iter_mut().enumerate() {
        let (c, i) = (w / 4, w % 4);
        let byte = qs[64 * (c / 2) + 4 * j + i];
        let nib = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let high = if fmt.has_high() {
            (blk[fmt.group_qh_at() + 4 * j + i] >> c) & 1
        } else {
            0
        };
        *v = nib | (high << 4);
    }
    Decoded {
        d: f16_bits(blk, 2 * j),
        m: if fmt.has_min() {
            f16_bits(blk, 32 + 2 * j)
        } else {
            0
        },
        u,
    }
}

/// A decoded block as floats, with the f32 operations of ggml's `dequantize_row_*`
/// (`(u − 16)·d` for Q5_0, `u·d + m` for the others).
fn fill_decoded(fmt: LegacyFormat, d: &Decoded, out: &mut [f32]) {
    let df = f16::from_bits(d.d).to_f32();
    let mf = f16::from_bits(d.m).to_f32();
    for (o, &u) in out.iter_mut().zip(&d.u) {
        *o = if fmt.has_min() {
            u as f32 * df + mf
        } else {
            (u as i32 - fmt.offset()) as f32 * df
        };
    }
}

/// Dequantises a run of ggml blocks of `fmt`.
pub(crate) fn dequantize_ggml(fmt: LegacyFormat, bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out
        .chunks_exact_mut(QK)
        .zip(bytes.chunks_exact(fmt.block_bytes()))
    {
        fill_decoded(fmt, &decode(fmt, b), o);
    }
}

/// Repacks a ggml-layout matrix of `fmt` (`src`: `rows` rows) into the interleaved layout (same
/// size).
pub(crate) fn pack(fmt: LegacyFormat, rows: usize, cols: usize, src: &[u8]) -> HugeBuf {
    let nb = cols / QK;
    let bb = fmt.block_bytes();
    let rb = nb * bb;
    let groups = rows / GROUP;
    let gbb = fmt.group_block_bytes();
    let mut out = HugeBuf::zeroed(src.len());
    let (grouped, tail) = out.split_at_mut(groups * GROUP * rb);
    grouped
        .par_chunks_mut(nb * gbb)
        .enumerate()
        .for_each(|(g, dst)| {
            for (b, blk) in dst.chunks_exact_mut(gbb).enumerate() {
                for j in 0..GROUP {
                    let at = (g * GROUP + j) * rb + b * bb;
                    write_group_row(fmt, &decode(fmt, &src[at..at + bb]), j, blk);
                }
            }
        });
    tail.copy_from_slice(&src[groups * GROUP * rb..]);
    out
}

/// Row `r` of an interleaved matrix as floats (embedding lookups), with the same f32 operations
/// as [`dequantize_ggml`].
pub(crate) fn dequantize_packed_row(
    fmt: LegacyFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let rb = nb * fmt.block_bytes();
    let groups = rows / GROUP;
    if r >= groups * GROUP {
        dequantize_ggml(fmt, &bytes[r * rb..(r + 1) * rb], out);
        return;
    }
    let (g, j) = (r / GROUP, r % GROUP);
    let gbb = fmt.group_block_bytes();
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        let at = (g * nb + b) * gbb;
        fill_decoded(fmt, &read_group_row(fmt, &bytes[at..at + gbb], j), o);
    }
}

/// Activation rows quantised for these kernels: i8 quants and f16-rounded scales per block of 32
/// (as for the interleaved Q8_0 kernels), `−128·Σq` per block, and `sx ≈ dx·Σq` per block (see
/// [`block_sum_term`]).
pub struct LegacyActs {
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) c: Vec<i32>,
    pub(crate) s: Vec<f32>,
    pub(crate) cols: usize,
    pub(crate) nb: usize,
}

impl LegacyActs {
    /// Quantises `n` rows of `cols` (a multiple of 32) values.
    pub fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let nb = cols / QK;
        let mut a = LegacyActs {
            q: vec![0; n * cols],
            d: vec![0.0; n * nb],
            c: vec![0; n * nb],
            s: vec![0.0; n * nb],
            cols,
            nb,
        };
        // Rows are independent and quantised in parallel, at least `parallel::MIN_TASK_VALUES`
        // values a task: a one-row step's input is one task, run inline.
        assert!(
            x.len() >= n * cols,
            "LegacyActs: {n} rows of {cols} need more values"
        );
        let (q, d) = (SyncPtr(a.q.as_mut_ptr()), SyncPtr(a.d.as_mut_ptr()));
        let (c, s) = (SyncPtr(a.c.as_mut_ptr()), SyncPtr(a.s.as_mut_ptr()));
        crate::parallel::for_each_min(n, crate::parallel::rows_per_task(cols), |r| {
            // SAFETY: row r's slices of the four buffers (sized for n rows above) are this
            // item's only.
            let (q, d, c, s) = unsafe {
                (
                    q.slice_mut(r * cols, cols),
                    d.slice_mut(r * nb, nb),
                    c.slice_mut(r * nb, nb),
                    s.slice_mut(r * nb, nb),
                )
            };
            let x = &x[r * cols..(r + 1) * cols];
            quantize_row_i8s(x, q, d, c);
            for ((s, xs), &c) in s.iter_mut().zip(x.chunks_exact(QK)).zip(c.iter()) {
                *s = block_sum_term(xs, c);
            }
        });
        a
    }
}

/// `sx` of one block of activations `xs` whose quants sum to `−c / 128`: ggml's `Q8_1` value,
/// `f16(dx · Σq)` with the scale before its f16 rounding (`dx = max|x| / 127`). Why not the
/// more precise `f16(dx)·Σq` in f32: the offset term `m·sx` is often larger than the result (the
/// `d` term cancels most of it), so the f16 rounding of `sx` is the largest error llama.cpp does
/// not share with a more precise product (computed in f32, it put agreement with llama.cpp on
/// Q4_1 / Q5_1 files well below Q5_0's, which has no offset: PARITY.md history).
fn block_sum_term(xs: &[f32], c: i32) -> f32 {
    // As `quant::quantize_block` computes it (`f32::max` skips NaN).
    let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // `c = −128·Σq` exactly, so `Σq = −c / 128` (|Σq| ≤ 32·127, exact in f32).
    f16::from_f32(amax / 127.0 * (-(c >> 7)) as f32).to_f32()
}

/// One row's blocks against activation row `i`, in the arithmetic of the module docs (the
/// reference every SIMD kernel must equal bit for bit).
fn dot_decoded(
    fmt: LegacyFormat,
    blocks: impl Iterator<Item = Decoded>,
    a: &LegacyActs,
    i: usize,
) -> f32 {
    let mut acc = 0f32;
    for (b, d) in blocks.enumerate() {
        let xq = &a.q[i * a.cols + b * QK..i * a.cols + (b + 1) * QK];
        let sum: i32 = xq.iter().map(|&q| q as i32).sum();
        let isum: i32 =
            d.u.iter()
                .zip(xq)
                .map(|(&u, &q)| u as i32 * q as i32)
                .sum::<i32>()
                - fmt.offset() * sum;
        let dx = a.d[i * a.nb + b];
        acc = (isum as f32).mul_add(f16::from_bits(d.d).to_f32() * dx, acc);
        if fmt.has_min() {
            acc = f16::from_bits(d.m).to_f32().mul_add(a.s[i * a.nb + b], acc);
        }
    }
    acc
}

fn fmt_of(w: &Weight) -> Option<LegacyFormat> {
    match w.wtype {
        WeightType::Legacy(f) | WeightType::LegacyR16(f) => Some(f),
        _ => None,
    }
}

/// Computes `out[i][o]` for every activation row `i` and weight row `o` of `targets` (matrices of
/// [`WeightType::Legacy`] or [`WeightType::LegacyR16`] reading the same `cols`) in one parallel
/// region (see [`crate::matmul::run_grouped`]; an unpacked matrix is all tail rows).
pub(crate) fn run(isa: Isa, targets: &[(&Weight, SyncPtr<f32>)], a: &LegacyActs, n: usize) {
    // Callers pass matrices of this module only; any format reads the shape checks the same.
    let fmt = |ti: usize| fmt_of(targets[ti].0).unwrap_or(LegacyFormat::Q4_1);
    let grouped: Vec<Grouped> = targets
        .iter()
        .enumerate()
        .map(|(ti, &(w, out))| {
            let nb = w.cols / QK;
            Grouped {
                w,
                out,
                groups: if matches!(w.wtype, WeightType::LegacyR16(_)) {
                    w.rows / GROUP
                } else {
                    0
                },
                group_bytes: nb * fmt(ti).group_block_bytes(),
                tail_row_bytes: nb * fmt(ti).block_bytes(),
            }
        })
        .collect();
    run_grouped(
        &grouped,
        n,
        crate::matmul::TILE,
        |ti, wg, r, t, o, ostride| kernel_group(isa, fmt(ti), wg, a, r, t, o, ostride),
        |ti, wrow, i| {
            let f = fmt(ti);
            dot_decoded(
                f,
                wrow.chunks_exact(f.block_bytes()).map(|b| decode(f, b)),
                a,
                i,
            )
        },
    );
}

/// Raw pointers to activation rows `r..` of a [`LegacyActs`] for the SIMD kernels: row `i`'s
/// quants at `q + i·qstride`, its per-block values at `d`/`c`/`s + i·nb`.
#[derive(Clone, Copy)]
pub(crate) struct ActPtrs {
    pub q: *const i8,
    pub qstride: usize,
    pub d: *const f32,
    pub c: *const i32,
    pub s: *const f32,
    pub nb: usize,
}

/// One group of 16 interleaved rows (`wg`: all its blocks) against activation rows `r..r+t`:
/// row `r+i`'s 16 outputs go to `out[i·ostride..i·ostride+16]`.
#[allow(clippy::too_many_arguments)]
fn kernel_group(
    isa: Isa,
    fmt: LegacyFormat,
    wg: &[u8],
    a: &LegacyActs,
    r: usize,
    t: usize,
    out: &mut [f32],
    ostride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        let p = ActPtrs {
            q: a.q[r * a.cols..].as_ptr(),
            qstride: a.cols,
            d: a.d[r * a.nb..].as_ptr(),
            c: a.c[r * a.nb..].as_ptr(),
            s: a.s[r * a.nb..].as_ptr(),
            nb: a.nb,
        };
        // SAFETY: the level was detected; `wg` holds `nb` group blocks of `fmt`; rows `r..r+t`
        // exist in `a`; `out` covers `(t-1)·ostride + 16` floats.
        unsafe {
            if isa >= Isa::Avx512Vnni {
                avx512::dot_group(fmt, wg.as_ptr(), p, t, out.as_mut_ptr(), ostride);
            } else {
                let vnni = isa == Isa::AvxVnni;
                avx2::dot_group(fmt, vnni, wg.as_ptr(), p, t, out.as_mut_ptr(), ostride);
            }
        }
        return;
    }
    let _ = isa;
    let gbb = fmt.group_block_bytes();
    for j in 0..GROUP {
        for i in 0..t {
            let blocks = wg.chunks_exact(gbb).map(|g| read_group_row(fmt, g, j));
            out[i * ostride + j] = dot_decoded(fmt, blocks, a, r + i);
        }
    }
}

/// Scalar reference for tests: one weight row (`w`, either layout) against activation row `i`.
pub fn dot_reference(w: &Weight, o: usize, a: &LegacyActs, i: usize) -> Result<f32, OpsError> {
    let fmt = fmt_of(w).ok_or_else(|| OpsError::UnsupportedType(w.wtype.name().into()))?;
    let nb = w.cols / QK;
    let rb = nb * fmt.block_bytes();
    let bytes = w.bytes();
    let groups = if matches!(w.wtype, WeightType::LegacyR16(_)) {
        w.rows / GROUP
    } else {
        0
    };
    if o >= groups * GROUP {
        let blocks = bytes[o * rb..(o + 1) * rb]
            .chunks_exact(fmt.block_bytes())
            .map(|b| decode(fmt, b));
        return Ok(dot_decoded(fmt, blocks, a, i));
    }
    let (g, j) = (o / GROUP, o % GROUP);
    let gbb = fmt.group_block_bytes();
    let wg = &bytes[g * nb * gbb..(g + 1) * nb * gbb];
    let blocks = wg.chunks_exact(gbb).map(|blk| read_group_row(fmt, blk, j));
    Ok(dot_decoded(fmt, blocks, a, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn group_rows_round_trip() {
        for fmt in LegacyFormat::ALL {
            let raw = rand_bytes(GROUP * fmt.block_bytes(), 3);
            let mut blk = vec![0u8; fmt.group_block_bytes()];
            for j in 0..GROUP {
                let d = decode(
                    fmt,
                    &raw[j * fmt.block_bytes()..(j + 1) * fmt.block_bytes()],
                );
                write_group_row(fmt, &d, j, &mut blk);
            }
            for j in 0..GROUP {
                let a = decode(
                    fmt,
                    &raw[j * fmt.block_bytes()..(j + 1) * fmt.block_bytes()],
                );
                let b = read_group_row(fmt, &blk, j);
                assert_eq!((a.d, a.m, a.u), (b.d, b.m, b.u), "{fmt:?} row {j}");
                assert!(a
                    .u
                    .iter()
                    .all(|&u| u < if fmt.has_high() { 32 } else { 16 }));
            }
        }
    }

    #[test]
    fn decodes_ggml_bit_order() {
        // Q5_0: nibble byte 0 = 0x21 (weight 0 → 1, weight 16 → 2), qh bits 0 and 16 set.
        let mut b = vec![0u8; 22];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..6].copy_from_slice(&(1u32 | 1 << 16).to_le_bytes());
        b[6] = 0x21;
        let mut out = [0f32; 32];
        dequantize_ggml(LegacyFormat::Q5_0, &b, &mut out);
        assert_eq!(out[0], (17 - 16) as f32 * 0.5);
        assert_eq!(out[16], (18 - 16) as f32 * 0.5);
        assert_eq!(out[1], -8.0);
        // Q4_1: d = 2, m = −1: weight 0 → 2·1 − 1, weight 16 → 2·2 − 1.
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        b[4] = 0x21;
        dequantize_ggml(LegacyFormat::Q4_1, &b, &mut out);
        assert_eq!((out[0], out[16], out[1]), (1.0, 3.0, -1.0));
    }
}
