//! Load-time repacking of weights into layouts that a kernel level reads faster.
//!
//! Why: in ggml's Q8_0 / Q4_0 each row is a run of (f16 scale, 32 quants) blocks, so a dot
//! product leaves each block's 32 products spread over 8 integer lanes, and every lane then needs
//! its own convert, scale and add — three float instructions per 16 lanes that hold only two
//! blocks' worth of information. That float work, per activation row, is what made a 4-row
//! verification batch cost 2.3 plain steps. Interleaving 16 weight rows block by block (one
//! 512-bit register holds four weights of each of the 16 rows) lets one `vpdpbusd` against four
//! broadcast activation bytes advance 16 different outputs, so the per-row float work drops to
//! three instructions per block *for 16 outputs* (the idea behind llama.cpp's and ik_llama.cpp's
//! repacked CPU layouts; the code here is specd's own).
//!
//! [`WeightType::Q8_0R16`]: for each group of 16 rows and each block `b`: the 16 rows' f16 scales
//! (32 bytes), then 8 chunks of 64 bytes where chunk `c` lane `j` (4 bytes) holds weights
//! `4c..4c+4` of row `j`, each offset by +128 so that they are `vpdpbusd`'s unsigned operand (the
//! activations are the signed one; the kernel starts from `−128·Σx` per block). A group block is
//! 544 bytes = 16 Q8_0 blocks.
//!
//! [`WeightType::Q4_0R16`]: the same scales, then 4 chunks of 64 bytes where byte `i` of chunk `k`
//! lane `j` holds row `j`'s weight `8k+i` in its low nibble and `8k+4+i` in its high nibble (ggml's
//! unsigned nibbles, `q + 8`), so that a mask and a shift turn one chunk into the Q8_0 layout's
//! chunks `2k` and `2k+1`; the kernel starts from `−8·Σx`. A group block is 288 bytes = 16 Q4_0
//! blocks.
//!
//! Sizes are unchanged. Rows past the last whole group (only in small test matrices) follow in
//! the plain ggml layout.

use crate::huge_pages::HugeBuf;
use crate::weight::{Weight, WeightType};
use crate::OpsError;
use half::f16;
use rayon::prelude::*;

/// Rows per interleaved group.
pub const GROUP: usize = 16;

/// Bytes of one group block of an interleaved type (16 blocks of its ggml type).
pub fn group_block_bytes(wt: WeightType) -> usize {
    GROUP * wt.block_bytes()
}

/// `w` in the layout the current kernel level prefers: the super-block formats become their
/// 16-row interleaved types on every level; Q8_0 / Q4_0 become theirs on AVX2 and above (set `SPECD_NO_REPACK` to keep ggml's layout, for A/B
/// measurements); everything else is returned as is (cheap clone, no copy). Costs one copy of
/// each such matrix at load.
pub fn for_current_isa(w: &Weight) -> Result<Weight, OpsError> {
    if let WeightType::K(f) = w.wtype {
        // The super-block formats' kernels read the interleaved layout on every level.
        if w.rows >= GROUP {
            let bytes = crate::kquant::pack(f, w.rows, w.cols, w.bytes());
            return Weight::from_bytes(WeightType::KR16(f), w.rows, w.cols, bytes);
        }
        return Ok(w.clone());
    }
    if let WeightType::Legacy(f) = w.wtype {
        // Like the super-block formats: one interleaved layout, read on every level.
        if w.rows >= GROUP {
            let bytes = crate::legacy::pack(f, w.rows, w.cols, w.bytes());
            return Weight::from_bytes(WeightType::LegacyR16(f), w.rows, w.cols, bytes);
        }
        return Ok(w.clone());
    }
    if matches!(
        w.wtype,
        WeightType::Q8_0 | WeightType::Q4_0 | WeightType::IQ4NL
    ) && w.rows >= GROUP
        && crate::isa() >= crate::Isa::Avx2
        && std::env::var_os("SPECD_NO_REPACK").is_none()
    {
        pack(w)
    } else {
        Ok(w.clone())
    }
}

/// Repacks a Q8_0 or Q4_0 matrix into its 16-row interleaved type (see the module docs).
pub fn pack(w: &Weight) -> Result<Weight, OpsError> {
    let (to, fill): (WeightType, FillRow) = match w.wtype {
        WeightType::Q8_0 => (WeightType::Q8_0R16, fill_q8_0),
        WeightType::Q4_0 => (WeightType::Q4_0R16, fill_q4_0),
        // The same nibble moves: the kernels decode IQ4_NL's indices with a table lookup.
        WeightType::IQ4NL => (WeightType::IQ4NLR16, fill_q4_0),
        other => {
            return Err(OpsError::UnsupportedType(format!(
                "repack {}",
                other.name()
            )))
        }
    };
    let rb = w.row_bytes();
    let bb = w.wtype.block_bytes();
    let groups = w.rows / GROUP;
    let gb = GROUP * rb;
    let src = w.bytes();
    let mut out = HugeBuf::zeroed(src.len());
    let (grouped, tail) = out.split_at_mut(groups * gb);
    grouped
        .par_chunks_mut(gb)
        .zip(src[..groups * gb].par_chunks(gb))
        .for_each(|(dst, src)| {
            for (b, blk) in dst.chunks_exact_mut(GROUP * bb).enumerate() {
                let (scales, quants) = blk.split_at_mut(2 * GROUP);
                for j in 0..GROUP {
                    let s = &src[j * rb + b * bb..j * rb + (b + 1) * bb];
                    scales[2 * j..2 * j + 2].copy_from_slice(&s[..2]);
                    fill(&s[2..], j, quants);
                }
            }
        });
    tail.copy_from_slice(&src[groups * gb..]);
    Weight::from_bytes(to, w.rows, w.cols, out)
}

/// Writes one row's quants of a block (after its scale) into lane `j` of a group block's quant
/// area.
type FillRow = fn(&[u8], usize, &mut [u8]);

/// Writes row `j`'s 32 Q8_0 quants `q` into a group block's quant area.
fn fill_q8_0(q: &[u8], j: usize, quants: &mut [u8]) {
    for c in 0..8 {
        for i in 0..4 {
            quants[64 * c + 4 * j + i] = q[4 * c + i] ^ 0x80; // (q as i8) + 128 as u8
        }
    }
}

/// Nibble (0..16) of weight `w` (0..32) of a Q4_0 block's 16 quant bytes.
fn q4_nibble(q: &[u8], w: usize) -> u8 {
    if w < 16 {
        q[w] & 0x0f
    } else {
        q[w - 16] >> 4
    }
}

/// Writes row `j`'s Q4_0 nibbles (16 bytes `q`) into a group block's quant area.
fn fill_q4_0(q: &[u8], j: usize, quants: &mut [u8]) {
    for k in 0..4 {
        for i in 0..4 {
            quants[64 * k + 4 * j + i] =
                q4_nibble(q, 8 * k + i) | (q4_nibble(q, 8 * k + 4 + i) << 4);
        }
    }
}

/// Quant (as the signed weight value) of row `j`, weight `w` of an interleaved group block's
/// quant area.
pub(crate) fn r16_quant(base: WeightType, quants: &[u8], j: usize, w: usize) -> i32 {
    let (c, i) = (w / 4, w % 4);
    if base == WeightType::Q8_0 {
        quants[64 * c + 4 * j + i] as i32 - 128
    } else {
        let byte = quants[64 * (c / 2) + 4 * j + i];
        let nib = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        if base == WeightType::IQ4NL {
            crate::kquant::IQ4_VALUES[nib as usize] as i32
        } else {
            nib as i32 - 8
        }
    }
}

/// Row `r` of an interleaved matrix repacked from `base` (`bytes`, `rows × cols`) as floats.
pub(crate) fn dequantize_r16_row(
    base: WeightType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    out: &mut [f32],
) {
    let rb = base.row_bytes(cols);
    let groups = rows / GROUP;
    if r >= groups * GROUP {
        crate::weight::dequantize(base, &bytes[r * rb..(r + 1) * rb], out);
        return;
    }
    let (g, j) = (r / GROUP, r % GROUP);
    let group = &bytes[g * GROUP * rb..(g + 1) * GROUP * rb];
    for (o, blk) in out
        .chunks_exact_mut(32)
        .zip(group.chunks_exact(group_block_bytes(base)))
    {
        let d = f16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f32();
        for (w, v) in o.iter_mut().enumerate() {
            *v = d * r16_quant(base, &blk[2 * GROUP..], j, w) as f32;
        }
    }
}
