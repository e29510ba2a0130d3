//! Native kernels for the super-block quantisations people download: K-quants (`Q2_K`, `Q3_K`,
//! `Q4_K`, `Q5_K`, `Q6_K`) and `IQ4_XS` — the types of llama-quantize's `Q2_K` / `Q3_K_M` /
//! `Q4_K_M` / `Q5_K_M` / `Q6_K` / `IQ4_XS` files and of the "dynamic" mixes. Q2_K and Q3_K keep
//! their 2-bit quants packed and have their own layout and kernels ([`q23`]).
//!
//! # One arithmetic for every format
//! Every format here stores super-blocks of 256 weights split into sub-blocks of 16 or 32, and
//! every weight decodes to `dA·sc_s·u − dB·m_s` with an unsigned integer `u`, integer sub-block
//! scales `sc_s` and offsets `m_s`, and f16 super-block factors `dA`, `dB`:
//!
//! | format | sub-block | `u` | `sc_s` | offset |
//! |---|---|---|---|---|
//! | Q4_K | 32 | 4-bit | 6-bit | `dB·m_s` (`dmin`, 6-bit `m_s`) |
//! | Q5_K | 32 | 5-bit | 6-bit | `dB·m_s` (`dmin`, 6-bit `m_s`) |
//! | Q6_K | 16 | 6-bit | i8 | `dA·sc_s·32` |
//! | Q2_K | 16 | 2-bit | 4-bit | `dB·m_s` (`dmin`, 4-bit `m_s`) |
//! | Q3_K | 16 | 3-bit | 6-bit − 32 | `dA·sc_s·4` |
//! | IQ4_XS | 32 | table value + 128 | 6-bit − 32 | `dA·sc_s·128` |
//!
//! Activations are quantised per 256 values to i8 with one f32 scale `dy` and the integer sums of
//! every 16 (ggml's `Q8_K` rule, see [`quantize_row_k`]). A super-block's contribution to a dot
//! product is then exact integer work followed by one or two float operations:
//! `I = Σ_s sc_s · (Σ u·x − OFF·Σx)` (the `OFF` term only for formats without `dB`),
//! `M = Σ_s m_s · Σx`, and `acc = fma(I, dA·dy, acc)`, then `acc = fma(−M, dB·dy, acc)`.
//! Integer sums are exact however they are computed, so the scalar, AVX2 and AVX-512 VNNI kernels
//! give the same bits, and each output adds its super-blocks in order whatever the batch: results
//! are batch-invariant and ISA-invariant by construction.
//!
//! # The interleaved layout (why a repack)
//! As for Q8_0 / Q4_0 ([`crate::pack`]), 16 weight rows are interleaved so that one 512-bit
//! register holds four weights of each of 16 rows and one `vpdpbusd` against four broadcast
//! activation bytes advances 16 outputs: the per-row work of a few-row verification batch is a
//! handful of instructions per 32 weights. Each matrix is repacked once at load, on every
//! instruction-set level (one layout, so the levels agree trivially). A group super-block holds,
//! for 16 rows:
//!
//! * `dA` as 16 f16 (32 bytes), then `dB` as 16 f16 for formats that have it;
//! * `sc`: per sub-block `s`, 16 bytes (row `j`'s `sc_s` as i8 at `16s + j`);
//! * `m` (formats with `dB`): per pair `k` of sub-blocks, 32 bytes (row `j`'s `m_2k`, `m_2k+1` at
//!   `2j`, `2j+1`), the operand layout of `vpdpwssd` / `vpmaddwd` after widening to i16;
//! * quants, sub-block after sub-block: the low four bits of `u` in chunks of 64 bytes where lane
//!   `j` (4 bytes) byte `i` of chunk `k` holds weight `8k+i` of row `j` in its low nibble and
//!   `8k+4+i` in its high nibble (a mask and a shift give two registers of four weights per row);
//!   Q5_K adds 64 bytes whose byte `4j+i` has bit `c` = bit 4 of weight `4c+i`; Q6_K adds 64
//!   bytes whose byte `4j+i` has bits `2c, 2c+1` = bits 4, 5 of weight `4c+i`.
//!
//! Sizes: Q4_K +2.8 %, Q5_K +2.3 %, Q6_K ±0, IQ4_XS +1.5 % (the unpacked 6-bit scales). Rows past
//! the last whole group stay in ggml's layout and are computed by the scalar kernel.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod q23;
#[cfg(target_arch = "x86_64")]
mod q23_avx2;
#[cfg(target_arch = "x86_64")]
mod q23_avx512;

use crate::huge_pages::HugeBuf;
use crate::matmul::{run_grouped, Grouped, AMX_MIN_ROWS, TILE};
use crate::pack::GROUP;
use crate::parallel::SyncPtr;
use crate::weight::{Weight, WeightType};
use crate::{Isa, OpsError};
use half::f16;
use rayon::prelude::*;

/// Weights per super-block.
pub const QK_K: usize = 256;

/// IQ4_NL / IQ4_XS's 16 non-linear quantisation levels.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The super-block formats with a native kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KFormat {
    Q4K,
    Q5K,
    Q6K,
    IQ4XS,
    Q2K,
    Q3K,
}

impl KFormat {
    /// All formats (tests iterate them).
    pub const ALL: [KFormat; 6] = [
        KFormat::Q4K,
        KFormat::Q5K,
        KFormat::Q6K,
        KFormat::IQ4XS,
        KFormat::Q2K,
        KFormat::Q3K,
    ];

    /// Bytes of one ggml super-block.
    pub const fn block_bytes(self) -> usize {
        match self {
            KFormat::Q4K => 144,
            KFormat::Q5K => 176,
            KFormat::Q6K => 210,
            KFormat::IQ4XS => 136,
            KFormat::Q2K => 84,
            KFormat::Q3K => 110,
        }
    }
    /// Weights per sub-block (one integer scale each).
    pub const fn sub(self) -> usize {
        match self {
            KFormat::Q6K | KFormat::Q2K | KFormat::Q3K => 16,
            _ => 32,
        }
    }
    /// Sub-blocks per super-block.
    pub const fn nsub(self) -> usize {
        QK_K / self.sub()
    }
    /// Has a separate f16 offset factor `dB` (ggml's `dmin`) and 6-bit offsets `m_s`.
    pub const fn has_dmin(self) -> bool {
        matches!(self, KFormat::Q4K | KFormat::Q5K | KFormat::Q2K)
    }
    /// Q2_K / Q3_K: the 2-bit formats with their own layout and kernels ([`q23`]); the layout
    /// helpers below (`sub_quant_bytes` .. `m_offset`) describe the other formats only.
    pub const fn is_q23(self) -> bool {
        matches!(self, KFormat::Q2K | KFormat::Q3K)
    }
    /// For formats without `dB`: the constant subtracted from `u` (`value = dA·sc·(u − OFF)`).
    pub const fn offset(self) -> i32 {
        match self {
            KFormat::Q6K => 32,
            KFormat::IQ4XS => 128,
            KFormat::Q3K => 4,
            _ => 0,
        }
    }
    /// Quant bytes of one sub-block of the group layout (16 rows).
    pub const fn sub_quant_bytes(self) -> usize {
        let nib = GROUP * self.sub() / 2;
        match self {
            KFormat::Q5K | KFormat::Q6K => nib + 64,
            _ => nib,
        }
    }
    /// Bytes of the header (`dA`, `dB`, `sc`, `m`) of a group super-block.
    pub const fn header_bytes(self) -> usize {
        let d = if self.has_dmin() { 64 } else { 32 };
        let m = if self.has_dmin() { 16 * self.nsub() } else { 0 };
        d + 16 * self.nsub() + m
    }
    /// Offset of the `sc` area in a group super-block.
    pub const fn sc_offset(self) -> usize {
        if self.has_dmin() {
            64
        } else {
            32
        }
    }
    /// Offset of the `m` pair area (formats with `dB`).
    pub const fn m_offset(self) -> usize {
        self.sc_offset() + 16 * self.nsub()
    }
    /// Bytes of one group super-block (16 rows × 256 weights).
    pub const fn group_block_bytes(self) -> usize {
        if self.is_q23() {
            return q23::group_block_bytes(self);
        }
        self.header_bytes() + self.nsub() * self.sub_quant_bytes()
    }
    /// Short name as llama.cpp prints it.
    pub const fn name(self) -> &'static str {
        match self {
            KFormat::Q4K => "q4_K",
            KFormat::Q5K => "q5_K",
            KFormat::Q6K => "q6_K",
            KFormat::IQ4XS => "iq4_xs",
            KFormat::Q2K => "q2_K",
            KFormat::Q3K => "q3_K",
        }
    }
    /// Name of the interleaved layout.
    pub const fn name_r16(self) -> &'static str {
        match self {
            KFormat::Q4K => "q4_K (16-row interleaved)",
            KFormat::Q5K => "q5_K (16-row interleaved)",
            KFormat::Q6K => "q6_K (16-row interleaved)",
            KFormat::IQ4XS => "iq4_xs (16-row interleaved)",
            KFormat::Q2K => "q2_K (16-row interleaved)",
            KFormat::Q3K => "q3_K (16-row interleaved)",
        }
    }
}

/// One row's super-block in the common form of the module docs.
#[derive(Clone)]
pub(crate) struct Decoded {
    /// `dA`, `dB` as f16 bits (`dB` = 0 for formats without it).
    pub da: u16,
    pub db: u16,
    /// `sc_s` and `m_s` (only the first `nsub` entries are used).
    pub sc: [i8; 16],
    pub m: [i8; 16],
    /// `u` of each weight.
    pub u: [u8; QK_K],
}

/// 6-bit scale and offset of sub-block `j` (0..8) of Q4_K / Q5_K's 12 packed bytes: sub-blocks
/// 0..4 keep theirs in the low 6 bits of bytes `j` and `j+4`; sub-blocks 4..8 in the nibbles of
/// byte `j+4` with their top two bits in the spare bits of bytes `j-4` and `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn f16_bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Decodes one ggml super-block (`b`: `fmt.block_bytes()` bytes).
pub(crate) fn decode(fmt: KFormat, b: &[u8]) -> Decoded {
    match fmt {
        KFormat::Q2K => return q23::decode_q2k(b),
        KFormat::Q3K => return q23::decode_q3k(b),
        _ => {}
    }
    let mut d = Decoded {
        da: 0,
        db: 0,
        sc: [0; 16],
        m: [0; 16],
        u: [0; QK_K],
    };
    match fmt {
        KFormat::Q4K | KFormat::Q5K => {
            // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
            d.da = f16_bits(b, 0);
            d.db = f16_bits(b, 2);
            let scales = &b[4..16];
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, scales);
                d.sc[j] = s as i8;
                d.m[j] = m as i8;
            }
            let (qh, qs) = if fmt == KFormat::Q5K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            // 64 weights per 32 bytes of qs: low nibbles first, then high nibbles.
            for p in 0..4 {
                for l in 0..32 {
                    let byte = qs[32 * p + l];
                    let (mut lo, mut hi) = (byte & 0x0f, byte >> 4);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * p)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * p + 1)) & 1) << 4;
                    }
                    d.u[64 * p + l] = lo;
                    d.u[64 * p + 32 + l] = hi;
                }
            }
        }
        KFormat::Q6K => {
            // ql[128], qh[64], scales[16] (i8), d
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            d.da = f16_bits(b, 208);
            for (o, &s) in d.sc.iter_mut().zip(sc) {
                *o = s as i8;
            }
            d.m = d.sc;
            for n in 0..2 {
                for l in 0..32 {
                    let (a, c, h) = (ql[64 * n + l], ql[64 * n + 32 + l], qh[32 * n + l]);
                    let y = &mut d.u[128 * n..128 * n + 128];
                    y[l] = (a & 0x0f) | ((h & 3) << 4);
                    y[l + 32] = (c & 0x0f) | (((h >> 2) & 3) << 4);
                    y[l + 64] = (a >> 4) | (((h >> 4) & 3) << 4);
                    y[l + 96] = (c >> 4) | (((h >> 6) & 3) << 4);
                }
            }
        }
        KFormat::IQ4XS => {
            // d, scales_h (u16), scales_l[4], qs[128]
            d.da = f16_bits(b, 0);
            let sh = u16::from_le_bytes([b[2], b[3]]);
            let (sl, qs) = (&b[4..8], &b[8..136]);
            for ib in 0..8 {
                let ls =
                    ((sl[ib / 2] >> (4 * (ib % 2))) & 0x0f) | ((((sh >> (2 * ib)) & 3) as u8) << 4);
                d.sc[ib] = ls as i8 - 32;
                for j in 0..16 {
                    let q = qs[16 * ib + j];
                    d.u[32 * ib + j] = IQ4_UNSIGNED[(q & 0x0f) as usize];
                    d.u[32 * ib + 16 + j] = IQ4_UNSIGNED[(q >> 4) as usize];
                }
            }
            d.m = d.sc;
        }
        KFormat::Q2K | KFormat::Q3K => {}
    }
    d
}

/// The IQ4 levels offset by +128: the unsigned operand `vpdpbusd` takes (the kernels start
/// from `−128·Σx`). One constant for every kernel that looks the levels up.
pub(crate) const IQ4_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// `u` → table index for IQ4_XS (the inverse of [`IQ4_UNSIGNED`]).
const IQ4_INDEX: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 16 {
        t[IQ4_UNSIGNED[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// The 4-bit part of `u` that the interleaved layout stores in nibbles (IQ4_XS: the table index).
fn nibble_of(fmt: KFormat, u: u8) -> u8 {
    if fmt == KFormat::IQ4XS {
        IQ4_INDEX[u as usize]
    } else {
        u & 0x0f
    }
}

/// Dequantises one ggml row of `fmt` (`row`: whole super-blocks) into `out`, with the same f32
/// operations as llama.cpp's reference (`(dA·sc)·u − dB·m`, `(dA·sc)·(u − OFF)`).
pub(crate) fn dequantize_ggml(fmt: KFormat, row: &[u8], out: &mut [f32]) {
    for (o, b) in out
        .chunks_exact_mut(QK_K)
        .zip(row.chunks_exact(fmt.block_bytes()))
    {
        fill_decoded(fmt, &decode(fmt, b), o);
    }
}

fn fill_decoded(fmt: KFormat, d: &Decoded, o: &mut [f32]) {
    let da = f16::from_bits(d.da).to_f32();
    let db = f16::from_bits(d.db).to_f32();
    let sub = fmt.sub();
    for (w, v) in o.iter_mut().enumerate() {
        let s = w / sub;
        let scale = da * d.sc[s] as f32;
        *v = if fmt.has_dmin() {
            scale * d.u[w] as f32 - db * d.m[s] as f32
        } else {
            scale * (d.u[w] as i32 - fmt.offset()) as f32
        };
    }
}

/// Writes `d` as row `j` of a group super-block `g` (`fmt.group_block_bytes()` bytes).
fn write_group_row(fmt: KFormat, d: &Decoded, j: usize, g: &mut [u8]) {
    if fmt.is_q23() {
        return q23::write_group_row(fmt, d, j, g);
    }
    g[2 * j..2 * j + 2].copy_from_slice(&d.da.to_le_bytes());
    if fmt.has_dmin() {
        g[32 + 2 * j..32 + 2 * j + 2].copy_from_slice(&d.db.to_le_bytes());
    }
    let nsub = fmt.nsub();
    let sc0 = fmt.sc_offset();
    for s in 0..nsub {
        g[sc0 + 16 * s + j] = d.sc[s] as u8;
    }
    if fmt.has_dmin() {
        let m0 = fmt.m_offset();
        for k in 0..nsub / 2 {
            g[m0 + 32 * k + 2 * j] = d.m[2 * k] as u8;
            g[m0 + 32 * k + 2 * j + 1] = d.m[2 * k + 1] as u8;
        }
    }
    let sub = fmt.sub();
    let qb = fmt.sub_quant_bytes();
    let q0 = fmt.header_bytes();
    for s in 0..nsub {
        let q = &mut g[q0 + s * qb..q0 + (s + 1) * qb];
        let u = &d.u[s * sub..(s + 1) * sub];
        for k in 0..sub / 8 {
            for i in 0..4 {
                let lo = nibble_of(fmt, u[8 * k + i]);
                let hi = nibble_of(fmt, u[8 * k + 4 + i]);
                q[64 * k + 4 * j + i] = lo | (hi << 4);
            }
        }
        let extra = &mut q[GROUP * sub / 2..];
        match fmt {
            KFormat::Q5K => {
                let mut bits = [0u8; 4];
                for c in 0..8 {
                    for (i, b) in bits.iter_mut().enumerate() {
                        *b |= ((u[4 * c + i] >> 4) & 1) << c;
                    }
                }
                extra[4 * j..4 * j + 4].copy_from_slice(&bits);
            }
            KFormat::Q6K => {
                let mut bits = [0u8; 4];
                for c in 0..4 {
                    for (i, b) in bits.iter_mut().enumerate() {
                        *b |= ((u[4 * c + i] >> 4) & 3) << (2 * c);
                    }
                }
                extra[4 * j..4 * j + 4].copy_from_slice(&bits);
            }
            _ => {}
        }
    }
}

/// Reads row `j` of a group super-block back into the common form (inverse of
/// [`write_group_row`]; used to dequantise embedding rows and by the scalar kernel).
fn read_group_row(fmt: KFormat, g: &[u8], j: usize) -> Decoded {
    if fmt.is_q23() {
        return q23::read_group_row(fmt, g, j);
    }
    let mut d = Decoded {
        da: f16_bits(g, 2 * j),
        db: if fmt.has_dmin() {
            f16_bits(g, 32 + 2 * j)
        } else {
            0
        },
        sc: [0; 16],
        m: [0; 16],
        u: [0; QK_K],
    };
    let nsub = fmt.nsub();
    for s in 0..nsub {
        d.sc[s] = g[fmt.sc_offset() + 16 * s + j] as i8;
    }
    if fmt.has_dmin() {
        let m0 = fmt.m_offset();
        for k in 0..nsub / 2 {
            d.m[2 * k] = g[m0 + 32 * k + 2 * j] as i8;
            d.m[2 * k + 1] = g[m0 + 32 * k + 2 * j + 1] as i8;
        }
    } else {
        d.m = d.sc;
    }
    let sub = fmt.sub();
    let qb = fmt.sub_quant_bytes();
    let q0 = fmt.header_bytes();
    for s in 0..nsub {
        let q = &g[q0 + s * qb..q0 + (s + 1) * qb];
        for w in 0..sub {
            let (k, i, high) = (w / 8, w % 4, (w % 8) >= 4);
            let byte = q[64 * k + 4 * j + i];
            let nib = if high { byte >> 4 } else { byte & 0x0f };
            let extra = q.get(GROUP * sub / 2 + 4 * j + w % 4).copied().unwrap_or(0);
            let c = w / 4;
            d.u[s * sub + w] = match fmt {
                KFormat::IQ4XS => IQ4_UNSIGNED[nib as usize],
                KFormat::Q5K => nib | (((extra >> c) & 1) << 4),
                KFormat::Q6K => nib | (((extra >> (2 * c)) & 3) << 4),
                KFormat::Q4K | KFormat::Q2K | KFormat::Q3K => nib,
            };
        }
    }
    d
}

/// Repacks a ggml-layout matrix of `fmt` (`bytes`: `rows` rows) into the interleaved layout.
pub(crate) fn pack(fmt: KFormat, rows: usize, cols: usize, src: &[u8]) -> HugeBuf {
    let nbk = cols / QK_K;
    let rb = nbk * fmt.block_bytes();
    let groups = rows / GROUP;
    let gbb = fmt.group_block_bytes();
    let mut out = HugeBuf::zeroed(groups * nbk * gbb + (rows - groups * GROUP) * rb);
    let (grouped, tail) = out.split_at_mut(groups * nbk * gbb);
    grouped
        .par_chunks_mut(nbk * gbb)
        .enumerate()
        .for_each(|(g, dst)| {
            for (b, blk) in dst.chunks_exact_mut(gbb).enumerate() {
                for j in 0..GROUP {
                    let r = g * GROUP + j;
                    let s =
                        &src[r * rb + b * fmt.block_bytes()..r * rb + (b + 1) * fmt.block_bytes()];
                    write_group_row(fmt, &decode(fmt, s), j, blk);
                }
            }
        });
    tail.copy_from_slice(&src[groups * GROUP * rb..]);
    out
}

/// Bytes of a `rows × cols` matrix of `fmt` in the interleaved layout.
pub(crate) fn packed_bytes(fmt: KFormat, rows: usize, cols: usize) -> usize {
    let nbk = cols / QK_K;
    let groups = rows / GROUP;
    groups * nbk * fmt.group_block_bytes() + (rows - groups * GROUP) * nbk * fmt.block_bytes()
}

/// Row `r` of an interleaved matrix as floats (embedding lookups), with the same f32 operations
/// as [`dequantize_ggml`].
pub(crate) fn dequantize_packed_row(
    fmt: KFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    out: &mut [f32],
) {
    let nbk = cols / QK_K;
    let groups = rows / GROUP;
    let gbb = fmt.group_block_bytes();
    if r >= groups * GROUP {
        let rb = nbk * fmt.block_bytes();
        let at = groups * nbk * gbb + (r - groups * GROUP) * rb;
        dequantize_ggml(fmt, &bytes[at..at + rb], out);
        return;
    }
    let (g, j) = (r / GROUP, r % GROUP);
    for (b, o) in out.chunks_exact_mut(QK_K).enumerate() {
        let at = (g * nbk + b) * gbb;
        fill_decoded(fmt, &read_group_row(fmt, &bytes[at..at + gbb], j), o);
    }
}

/// Activation rows quantised for the super-block kernels (ggml's `Q8_K` rule): per 256 values an
/// f32 scale, 256 i8 quants, and the sums of every 16 and every 32 quants.
pub struct KActs {
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) bs16: Vec<i16>,
    pub(crate) bs32: Vec<i16>,
    pub(crate) cols: usize,
    pub(crate) nbk: usize,
}

impl KActs {
    /// Quantises `n` rows of `cols` (a multiple of 256) values.
    pub fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let nbk = cols / QK_K;
        let mut a = KActs {
            q: vec![0; n * cols],
            d: vec![0.0; n * nbk],
            bs16: vec![0; n * nbk * 16],
            bs32: vec![0; n * nbk * 8],
            cols,
            nbk,
        };
        // Rows are independent and quantised in parallel, at least `parallel::MIN_TASK_VALUES`
        // values a task: a one-row step's input is one task, run inline.
        assert!(
            x.len() >= n * cols,
            "KActs: {n} rows of {cols} need more values"
        );
        let (q, d) = (SyncPtr(a.q.as_mut_ptr()), SyncPtr(a.d.as_mut_ptr()));
        let (b16, b32) = (SyncPtr(a.bs16.as_mut_ptr()), SyncPtr(a.bs32.as_mut_ptr()));
        crate::parallel::for_each_min(n, crate::parallel::rows_per_task(cols), |r| {
            // SAFETY: row r's slices of the four buffers (sized for n rows above) are this
            // item's only.
            let (q, d, b16, b32) = unsafe {
                (
                    q.slice_mut(r * cols, cols),
                    d.slice_mut(r * nbk, nbk),
                    b16.slice_mut(r * 16 * nbk, 16 * nbk),
                    b32.slice_mut(r * 8 * nbk, 8 * nbk),
                )
            };
            quantize_row_k(&x[r * cols..(r + 1) * cols], q, d, b16, b32);
        });
        a
    }
}

/// Quantises one row (ggml's `Q8_K` rule): the value of largest magnitude maps to −127, the
/// others to `round_half_even(x · −127 / max)` capped at 127 (NaN to 0), `d = 1 / (−127 / max)`;
/// a block of zeros gets `d = 0`. Also the sums of every 16 and 32 quants.
///
/// Written here rather than taken from ggml, but with its rule, so that activations round like
/// llama.cpp's and greedy output stays close to llama.cpp's on the same file. The SIMD bodies are
/// bit-identical to the scalar one (tested): a prompt quantises every matmul input on one thread
/// per matrix, where the scalar loop (a libm `rintf` per value) cost 15 % of prompt processing.
pub fn quantize_row_k(x: &[f32], q: &mut [i8], d: &mut [f32], bs16: &mut [i16], bs32: &mut [i16]) {
    let nbk = x.len() / QK_K;
    assert!(
        q.len() >= nbk * QK_K && d.len() >= nbk && bs16.len() >= 16 * nbk && bs32.len() >= 8 * nbk
    );
    for b in 0..nbk {
        let xs = &x[b * QK_K..(b + 1) * QK_K];
        let qb = &mut q[b * QK_K..(b + 1) * QK_K];
        let b16 = &mut bs16[b * 16..(b + 1) * 16];
        #[cfg(target_arch = "x86_64")]
        {
            let isa = crate::isa();
            // SAFETY: the level was detected; the slices have the lengths asserted above.
            if isa >= Isa::Avx512Vnni {
                d[b] = unsafe { avx512::quantize_block(xs, qb, b16) };
            } else if isa >= Isa::Avx2 {
                d[b] = unsafe { avx2::quantize_block(xs, qb, b16) };
            } else {
                d[b] = quantize_block_scalar(xs, qb, b16);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            d[b] = quantize_block_scalar(xs, qb, b16);
        }
        for s in 0..8 {
            bs32[b * 8 + s] = b16[2 * s] + b16[2 * s + 1];
        }
    }
}

/// The value of largest magnitude (the first one on ties), ignoring NaN.
fn signed_max(xs: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Portable body of [`quantize_row_k`] for one block of 256: returns `d`.
pub(crate) fn quantize_block_scalar(xs: &[f32], q: &mut [i8], bs16: &mut [i16]) -> f32 {
    let max = signed_max(xs);
    if max == 0.0 {
        q.fill(0);
        bs16.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(xs) {
        // `as i32` maps NaN to 0 and saturates, so the result is defined for any input.
        *o = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, o) in bs16.iter_mut().enumerate() {
        *o = q[16 * s..16 * s + 16].iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

/// One row of a super-block against activation row `i`, in the exact integer + float arithmetic
/// of the module docs (the reference every SIMD kernel must equal bit for bit).
fn dot_decoded(fmt: KFormat, blocks: impl Iterator<Item = Decoded>, a: &KActs, i: usize) -> f32 {
    let mut acc = 0f32;
    let sub = fmt.sub();
    for (b, d) in blocks.enumerate() {
        let xq = &a.q[i * a.cols + b * QK_K..i * a.cols + (b + 1) * QK_K];
        let bs: &[i16] = if sub == 16 {
            &a.bs16[(i * a.nbk + b) * 16..(i * a.nbk + b + 1) * 16]
        } else {
            &a.bs32[(i * a.nbk + b) * 8..(i * a.nbk + b + 1) * 8]
        };
        let mut isum = 0i32;
        let mut msum = 0i32;
        for (s, &bsum) in bs.iter().enumerate().take(fmt.nsub()) {
            let p: i32 = (s * sub..(s + 1) * sub)
                .map(|w| d.u[w] as i32 * xq[w] as i32)
                .sum::<i32>()
                - fmt.offset() * bsum as i32;
            isum += d.sc[s] as i32 * p;
            msum += d.m[s] as i32 * bsum as i32;
        }
        let dy = a.d[i * a.nbk + b];
        let da = f16::from_bits(d.da).to_f32();
        acc = (isum as f32).mul_add(da * dy, acc);
        if fmt.has_dmin() {
            let db = f16::from_bits(d.db).to_f32();
            acc = (-(msum as f32)).mul_add(db * dy, acc);
        }
    }
    acc
}

/// Computes `out[i][o]` for every activation row `i` and weight row `o` of `targets` (matrices of
/// [`WeightType::K`] or [`WeightType::KR16`] reading the same `cols`) in one parallel region
/// (see [`crate::matmul::run_grouped`]; an unpacked matrix is all tail rows).
pub(crate) fn run(isa: Isa, targets: &[(&Weight, SyncPtr<f32>)], a: &KActs, n: usize) {
    let fmt_of = |w: &Weight| match w.wtype {
        WeightType::K(f) | WeightType::KR16(f) => f,
        // Callers pass super-block matrices only; any format reads the shape checks the same.
        _ => KFormat::Q4K,
    };
    let grouped: Vec<Grouped> = targets
        .iter()
        .map(|&(w, out)| {
            let fmt = fmt_of(w);
            let nbk = w.cols / QK_K;
            Grouped {
                w,
                out,
                groups: if matches!(w.wtype, WeightType::KR16(_)) {
                    w.rows / GROUP
                } else {
                    0
                },
                group_bytes: nbk * fmt.group_block_bytes(),
                tail_row_bytes: nbk * fmt.block_bytes(),
            }
        })
        .collect();
    let fmt = |ti: usize| fmt_of(targets[ti].0);
    run_grouped(
        &grouped,
        n,
        crate::matmul::amx_tile(isa, n),
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

/// One group of 16 interleaved rows (`wg`: all its super-blocks) against activation rows
/// `r..r+t`: row `r+i`'s 16 outputs go to `out[i·ostride..i·ostride+16]`.
#[allow(clippy::too_many_arguments)]
fn kernel_group(
    isa: Isa,
    fmt: KFormat,
    wg: &[u8],
    a: &KActs,
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
            d: a.d[r * a.nbk..].as_ptr(),
            bs16: a.bs16[r * a.nbk * 16..].as_ptr(),
            bs32: a.bs32[r * a.nbk * 8..].as_ptr(),
            nbk: a.nbk,
        };
        // SAFETY: the level was detected; `wg` holds `nbk` group super-blocks of `fmt`; rows
        // `r..r+t` exist in `a`; `out` covers `(t-1)·ostride + 16` floats.
        unsafe {
            if isa == Isa::Amx && t >= AMX_MIN_ROWS && avx512::has_amx(fmt) {
                avx512::dot_group_amx(fmt, wg.as_ptr(), p, t, out.as_mut_ptr(), ostride);
            } else if isa >= Isa::Avx512Vnni {
                // Tiles of up to 16 rows reach here on the AMX level: in VNNI tiles of ≤ 8.
                for r0 in (0..t).step_by(TILE) {
                    let pr = p.rows_from(r0);
                    let o = out.as_mut_ptr().add(r0 * ostride);
                    avx512::dot_group(fmt, wg.as_ptr(), pr, (t - r0).min(TILE), o, ostride);
                }
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

/// Raw pointers to activation rows `r..` of a [`KActs`] for the SIMD kernels: row `i`'s quants
/// at `q + i·qstride`, its block scales at `d + i·nbk`, its sums at `bs16 + 16·i·nbk` and
/// `bs32 + 8·i·nbk`.
#[derive(Clone, Copy)]
pub(crate) struct ActPtrs {
    pub q: *const i8,
    pub qstride: usize,
    pub d: *const f32,
    pub bs16: *const i16,
    pub bs32: *const i16,
    pub nbk: usize,
}

impl ActPtrs {
    /// The same rows from row `r` on.
    ///
    /// # Safety
    /// Row `r` must exist.
    pub(crate) unsafe fn rows_from(self, r: usize) -> Self {
        unsafe {
            ActPtrs {
                q: self.q.add(r * self.qstride),
                d: self.d.add(r * self.nbk),
                bs16: self.bs16.add(r * self.nbk * 16),
                bs32: self.bs32.add(r * self.nbk * 8),
                ..self
            }
        }
    }
}

/// Scalar reference for tests: one weight row (`w`, any layout) against activation row `i`.
pub fn dot_reference(w: &Weight, o: usize, a: &KActs, i: usize) -> Result<f32, OpsError> {
    let fmt = match w.wtype {
        WeightType::K(f) | WeightType::KR16(f) => f,
        other => return Err(OpsError::UnsupportedType(other.name().into())),
    };
    let nbk = w.cols / QK_K;
    let bytes = w.bytes();
    let groups = if matches!(w.wtype, WeightType::KR16(_)) {
        w.rows / GROUP
    } else {
        0
    };
    let gbb = fmt.group_block_bytes();
    if o >= groups * GROUP {
        let rb = nbk * fmt.block_bytes();
        let at = groups * nbk * gbb + (o - groups * GROUP) * rb;
        let blocks = bytes[at..at + rb]
            .chunks_exact(fmt.block_bytes())
            .map(|b| decode(fmt, b));
        return Ok(dot_decoded(fmt, blocks, a, i));
    }
    let (g, j) = (o / GROUP, o % GROUP);
    let wg = &bytes[g * nbk * gbb..(g + 1) * nbk * gbb];
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

    /// Random but finite super-blocks: any bit pattern is a valid block once the f16 factors
    /// are made small finite numbers.
    pub(crate) fn random_blocks(fmt: KFormat, n: usize, seed: u64) -> Vec<u8> {
        let mut b = rand_bytes(n * fmt.block_bytes(), seed);
        for blk in b.chunks_exact_mut(fmt.block_bytes()) {
            let positions: &[usize] = match fmt {
                KFormat::Q4K | KFormat::Q5K => &[0, 2],
                KFormat::Q6K => &[208],
                KFormat::IQ4XS => &[0],
                KFormat::Q2K => &[80, 82],
                KFormat::Q3K => &[108],
            };
            for &p in positions {
                let v = 1e-3 * (1.0 + (blk[p] as f32) / 64.0);
                blk[p..p + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn group_rows_round_trip() {
        for fmt in KFormat::ALL {
            let rows = 16;
            let src = random_blocks(fmt, rows, 3);
            let packed = pack(fmt, rows, QK_K, &src);
            assert_eq!(packed.len(), packed_bytes(fmt, rows, QK_K));
            for j in 0..rows {
                let a = decode(
                    fmt,
                    &src[j * fmt.block_bytes()..(j + 1) * fmt.block_bytes()],
                );
                let b = read_group_row(fmt, &packed, j);
                assert_eq!(
                    (a.da, a.db, a.sc, a.u),
                    (b.da, b.db, b.sc, b.u),
                    "{fmt:?} row {j}"
                );
                if fmt.has_dmin() {
                    assert_eq!(a.m, b.m);
                }
            }
        }
    }

    #[test]
    fn sizes_stay_within_five_percent() {
        for fmt in KFormat::ALL {
            let g = fmt.group_block_bytes() as f64;
            let orig = (GROUP * fmt.block_bytes()) as f64;
            // Q3_K's unpacked 6-bit scales: +3.6 %; the others ≤ 2.8 %.
            assert!(g / orig <= 1.04, "{fmt:?}: {g} vs {orig}");
        }
    }

    #[test]
    fn quantisation_levels_agree_bit_for_bit() {
        let mut st = 7u32;
        let mut x = vec![0f32; QK_K * 12];
        for (i, v) in x.iter_mut().enumerate() {
            st = st.wrapping_mul(1664525).wrapping_add(1013904223);
            let u = (st >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            // Blocks of every scale, exact halves, ties of opposite sign, zeros, non-finite.
            *v = match i / QK_K {
                0 => 0.0,
                1 => u * 1e-30,
                2 => (u * 254.0).round() * 0.5,
                3 if i % QK_K == 5 => f32::NAN,
                4 if i % QK_K == 9 => f32::INFINITY,
                5 => [1.0, -1.0, 0.5][i % 3],
                6 => -((i % 17) as f32),
                _ => u * 10f32.powi((i / QK_K % 7) as i32 - 3),
            };
        }
        let nbk = x.len() / QK_K;
        type Quantiser<'a> = &'a dyn Fn(&[f32], &mut [i8], &mut [i16]) -> f32;
        let run = |f: Quantiser| {
            let (mut q, mut d, mut b) = (vec![0i8; x.len()], vec![0f32; nbk], vec![0i16; 16 * nbk]);
            for k in 0..nbk {
                d[k] = f(
                    &x[k * QK_K..(k + 1) * QK_K],
                    &mut q[k * QK_K..(k + 1) * QK_K],
                    &mut b[k * 16..(k + 1) * 16],
                );
            }
            (q, d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b)
        };
        let want = run(&quantize_block_scalar);
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::available().contains(&Isa::Avx2) {
                // SAFETY: AVX2 detected.
                assert_eq!(
                    want,
                    run(&|x, q, b| unsafe { avx2::quantize_block(x, q, b) })
                );
            }
            if Isa::available().contains(&Isa::Avx512Vnni) {
                // SAFETY: AVX-512 detected.
                assert_eq!(
                    want,
                    run(&|x, q, b| unsafe { avx512::quantize_block(x, q, b) })
                );
            }
        }
    }

    #[test]
    fn q8k_quantisation_rule() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) * 0.01).collect();
        let mut q = vec![0i8; QK_K];
        let (mut d, mut b16, mut b32) = ([0f32; 1], [0i16; 16], [0i16; 8]);
        quantize_row_k(&x, &mut q, &mut d, &mut b16, &mut b32);
        // max |x| is 1.55 (i = 255, positive): it maps to −127.
        assert_eq!(q[255], -127);
        assert!((d[0] - 1.55 / -127.0).abs() < 1e-7);
        assert_eq!(b16[0], q[..16].iter().map(|&v| v as i16).sum::<i16>());
        assert_eq!(b32[3], b16[6] + b16[7]);
    }
}
