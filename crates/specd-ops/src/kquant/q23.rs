//! Q2_K and Q3_K: the 2- and 3-bit K-quants of llama-quantize's `Q2_K` and `Q3_K_S/M/L` files.
//!
//! Both split a super-block of 256 weights into 16 sub-blocks of 16 and fit the common form of
//! the module docs of [`super`]:
//!
//! | format | ggml block | `u` | `sc_s` | offset |
//! |---|---|---|---|---|
//! | Q2_K | `scales[16]` (low nibble `sc`, high nibble `m`), `qs[64]`, `d`, `dmin` (84 bytes) | 2-bit | 4-bit | `dB·m_s` (4-bit `m_s`) |
//! | Q3_K | `hmask[32]`, `qs[64]`, `scales[12]` (16 × 6 bits), `d` (110 bytes) | 2 bits + high bit | 6-bit − 32 | `dA·sc_s·4` |
//!
//! ggml's weight `w` of a super-block sits in byte `qs[32·(w/128) + w%32]` at bits
//! `2·((w%128)/32)`; Q3_K's high bit is bit `4·(w/128) + (w%128)/32` of `hmask[w%32]`, and ggml's
//! value is `(low − 4·(1 − high))`, i.e. `u − 4` with `u = low + 4·high`.
//!
//! # The interleaved layouts
//! The quants are already small, so they are interleaved without widening: per sub-block, 64
//! bytes where lane `j` (4 bytes) byte `i` holds at bits `2c, 2c+1` the low two bits of weight
//! `4c + i` of row `j` — one load, a shift and a mask give `vpdpbusd` four weights per row.
//!
//! * Q2_K (1344 bytes per group super-block = 16 ggml blocks, ±0 %): `dA` (16 f16), `dB` (16
//!   f16), the scale bytes as the file has them (row `j`'s `scales[s]` at `16s + j`), then the
//!   16 sub-blocks' quants.
//! * Q3_K (1824 bytes for 1760, +3.6 %: the 6-bit scales are stored unpacked): `sc_s` as i8 at
//!   `16s + j` (256 bytes), then per pair `k` of sub-blocks 192 bytes: the quants of sub-blocks
//!   `2k` and `2k+1` (64 bytes each) and 64 bytes of high bits, byte `4j+i` bit `4e + c` = high
//!   bit of weight `4c + i` of sub-block `2k + e`; `dA` (16 f16) last, so that the quants of the
//!   first super-block of a group start on a cache line.

use super::{Decoded, KFormat, QK_K};
use crate::pack::GROUP;

/// Bytes of a Q2_K group super-block.
pub(crate) const Q2K_GROUP_BYTES: usize = 64 + 256 + 16 * 64;
/// Bytes of a Q3_K group super-block.
pub(crate) const Q3K_GROUP_BYTES: usize = 32 + 256 + 8 * 192;
/// Offset of the scale bytes in a group super-block.
pub(crate) const fn sc_offset(fmt: KFormat) -> usize {
    match fmt {
        KFormat::Q2K => 64,
        _ => 0,
    }
}
/// Offset of the quants in a group super-block (a multiple of 64: whole cache lines).
pub(crate) const fn quant_offset(fmt: KFormat) -> usize {
    sc_offset(fmt) + 256
}
/// Offset of the 16 `dA` (then Q2_K's 16 `dB`).
pub(crate) const fn da_offset(fmt: KFormat) -> usize {
    match fmt {
        KFormat::Q2K => 0,
        _ => quant_offset(fmt) + 8 * 192,
    }
}

fn f16_bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The low two bits of each of ggml's 256 weights (same order for Q2_K and Q3_K).
fn low_bits(qs: &[u8], u: &mut [u8; QK_K]) {
    for (w, o) in u.iter_mut().enumerate() {
        *o = (qs[32 * (w / 128) + w % 32] >> (2 * ((w % 128) / 32))) & 3;
    }
}

/// Decodes one ggml Q2_K block (84 bytes).
pub(crate) fn decode_q2k(b: &[u8]) -> Decoded {
    let mut d = Decoded {
        da: f16_bits(b, 80),
        db: f16_bits(b, 82),
        sc: [0; 16],
        m: [0; 16],
        u: [0; QK_K],
    };
    for (s, &byte) in b[..16].iter().enumerate() {
        d.sc[s] = (byte & 0x0f) as i8;
        d.m[s] = (byte >> 4) as i8;
    }
    low_bits(&b[16..80], &mut d.u);
    d
}

/// Sub-block `s`'s 6-bit scale from Q3_K's 12 packed bytes: the low four bits are the nibbles
/// of bytes 0..8 (sub-blocks 0..8 the low nibbles, 8..16 the high ones), the top two bits the
/// bit pairs of bytes 8..12 (pair `s/4` of byte `8 + s%4`).
fn scale_q3k(s: usize, b: &[u8]) -> u8 {
    let low = (b[s % 8] >> (4 * (s / 8))) & 0x0f;
    let high = (b[8 + s % 4] >> (2 * (s / 4))) & 3;
    low | (high << 4)
}

/// Decodes one ggml Q3_K block (110 bytes).
pub(crate) fn decode_q3k(b: &[u8]) -> Decoded {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let mut d = Decoded {
        da: f16_bits(b, 108),
        db: 0,
        sc: [0; 16],
        m: [0; 16],
        u: [0; QK_K],
    };
    for s in 0..16 {
        d.sc[s] = scale_q3k(s, scales) as i8 - 32;
    }
    d.m = d.sc;
    low_bits(qs, &mut d.u);
    for (w, o) in d.u.iter_mut().enumerate() {
        let high = (hmask[w % 32] >> (4 * (w / 128) + (w % 128) / 32)) & 1;
        *o |= high << 2;
    }
    d
}

/// Where weight `w` (0..16) of sub-block `s`, row `j`, keeps its low two bits: byte, shift.
fn low_at(fmt: KFormat, s: usize, j: usize, w: usize) -> (usize, u32) {
    let q0 = quant_offset(fmt);
    let base = match fmt {
        KFormat::Q2K => q0 + 64 * s,
        _ => q0 + 192 * (s / 2) + 64 * (s % 2),
    };
    (base + 4 * j + w % 4, 2 * (w / 4) as u32)
}

/// Where Q3_K's high bit of weight `w` of sub-block `s`, row `j`, is: byte, bit.
fn high_at(s: usize, j: usize, w: usize) -> (usize, u32) {
    let at = quant_offset(KFormat::Q3K) + 192 * (s / 2) + 128 + 4 * j + w % 4;
    (at, (4 * (s % 2) + w / 4) as u32)
}

/// Writes `d` as row `j` of a group super-block `g` of `fmt` (Q2_K or Q3_K).
pub(crate) fn write_group_row(fmt: KFormat, d: &Decoded, j: usize, g: &mut [u8]) {
    let da = da_offset(fmt);
    g[da + 2 * j..da + 2 * j + 2].copy_from_slice(&d.da.to_le_bytes());
    if fmt == KFormat::Q2K {
        g[32 + 2 * j..32 + 2 * j + 2].copy_from_slice(&d.db.to_le_bytes());
    }
    let sc0 = sc_offset(fmt);
    for s in 0..16 {
        g[sc0 + 16 * s + j] = match fmt {
            KFormat::Q2K => (d.sc[s] as u8 & 0x0f) | ((d.m[s] as u8) << 4),
            _ => d.sc[s] as u8,
        };
        for w in 0..16 {
            let u = d.u[16 * s + w];
            let (at, sh) = low_at(fmt, s, j, w);
            g[at] = (g[at] & !(3 << sh)) | ((u & 3) << sh);
            if fmt == KFormat::Q3K {
                let (at, bit) = high_at(s, j, w);
                g[at] = (g[at] & !(1 << bit)) | (((u >> 2) & 1) << bit);
            }
        }
    }
}

/// Reads row `j` of a group super-block back into the common form (inverse of
/// [`write_group_row`]).
pub(crate) fn read_group_row(fmt: KFormat, g: &[u8], j: usize) -> Decoded {
    let mut d = Decoded {
        da: f16_bits(g, da_offset(fmt) + 2 * j),
        db: 0,
        sc: [0; 16],
        m: [0; 16],
        u: [0; QK_K],
    };
    if fmt == KFormat::Q2K {
        d.db = f16_bits(g, 32 + 2 * j);
    }
    let sc0 = sc_offset(fmt);
    for s in 0..16 {
        let b = g[sc0 + 16 * s + j];
        if fmt == KFormat::Q2K {
            d.sc[s] = (b & 0x0f) as i8;
            d.m[s] = (b >> 4) as i8;
        } else {
            d.sc[s] = b as i8;
            d.m[s] = b as i8;
        }
        for w in 0..16 {
            let (at, sh) = low_at(fmt, s, j, w);
            let mut u = (g[at] >> sh) & 3;
            if fmt == KFormat::Q3K {
                let (at, bit) = high_at(s, j, w);
                u |= ((g[at] >> bit) & 1) << 2;
            }
            d.u[16 * s + w] = u;
        }
    }
    d
}

/// Group super-block bytes of 16 rows of `fmt`.
pub(crate) const fn group_block_bytes(fmt: KFormat) -> usize {
    match fmt {
        KFormat::Q2K => Q2K_GROUP_BYTES,
        _ => Q3K_GROUP_BYTES,
    }
}

const _: () = assert!(Q2K_GROUP_BYTES == GROUP * 84);
const _: () = assert!(Q3K_GROUP_BYTES * 100 <= GROUP * 110 * 104);
