//! Load-time repacking of weights into layouts that a kernel level reads faster.
//!
//! Why: in ggml's Q8_0 each row is a run of (f16 scale, 32 quants) blocks, so a dot product
//! leaves each block's 32 products spread over 8 integer lanes, and every lane then needs its own
//! convert, scale and add — three float instructions per 16 lanes that hold only two blocks'
//! worth of information. That float work, per activation row, is what made a 4-row verification
//! batch cost 2.3 plain steps. Interleaving 16 weight rows block by block (one 512-bit register
//! holds four weights of each of the 16 rows) lets one `vpdpbusd` against four broadcast
//! activation bytes advance 16 different outputs, so the per-row float work drops to three
//! instructions per block *for 16 outputs* (the approach of llama.cpp's and ik_llama.cpp's
//! repacked "_r8"/"x16" CPU layouts; the code here is specd's own).
//!
//! Layout of [`WeightType::Q8_0R16`]: for each group of 16 rows and each block `b`: the 16 rows'
//! f16 scales (32 bytes), then 8 chunks of 64 bytes where chunk `c` lane `j` (4 bytes) holds
//! weights `4c..4c+4` of row `j`, each offset by +128 so that they are `vpdpbusd`'s unsigned
//! operand (the activations are the signed one; the kernel removes `128·Σx` per block). A group
//! block is 544 bytes = 16 Q8_0 blocks, so the size is unchanged. Rows past the last whole group
//! (only in small test matrices) follow in plain Q8_0 layout.

use crate::weight::{Weight, WeightType};
use crate::OpsError;
use half::f16;
use rayon::prelude::*;

/// Rows per interleaved group.
pub const GROUP: usize = 16;
/// Bytes of one group block: 16 scales + 16 × 32 quants.
pub const GROUP_BLOCK_BYTES: usize = GROUP * 34;

/// `w` in the layout the current kernel level prefers: Q8_0 becomes [`WeightType::Q8_0R16`] on
/// AVX-512 VNNI (set `SPECD_NO_REPACK` to keep ggml's layout, for A/B measurements); everything
/// else is returned as is (cheap clone, no copy). Costs one copy of each Q8_0 matrix at load.
pub fn for_current_isa(w: &Weight) -> Result<Weight, OpsError> {
    if w.wtype == WeightType::Q8_0
        && w.rows >= GROUP
        && crate::isa() == crate::Isa::Avx512Vnni
        && std::env::var_os("SPECD_NO_REPACK").is_none()
    {
        pack_q8_0(w)
    } else {
        Ok(w.clone())
    }
}

/// Repacks a Q8_0 matrix into [`WeightType::Q8_0R16`] (see the module docs for the layout).
pub fn pack_q8_0(w: &Weight) -> Result<Weight, OpsError> {
    if w.wtype != WeightType::Q8_0 {
        return Err(OpsError::UnsupportedType(format!(
            "pack {}",
            w.wtype.name()
        )));
    }
    let nb = w.cols / 32;
    let rb = w.row_bytes();
    let groups = w.rows / GROUP;
    let gb = GROUP * rb;
    let src = w.bytes();
    let mut out = vec![0u8; src.len()];
    let (grouped, tail) = out.split_at_mut(groups * gb);
    grouped
        .par_chunks_mut(gb)
        .zip(src[..groups * gb].par_chunks(gb))
        .for_each(|(dst, src)| {
            for (b, blk) in dst.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
                let (scales, quants) = blk.split_at_mut(2 * GROUP);
                for j in 0..GROUP {
                    let s = &src[j * rb + b * 34..j * rb + (b + 1) * 34];
                    scales[2 * j..2 * j + 2].copy_from_slice(&s[..2]);
                    for c in 0..8 {
                        let d = &mut quants[64 * c + 4 * j..64 * c + 4 * j + 4];
                        for (d, &q) in d.iter_mut().zip(&s[2 + 4 * c..6 + 4 * c]) {
                            *d = q ^ 0x80; // (q as i8) + 128 as u8
                        }
                    }
                }
            }
        });
    tail.copy_from_slice(&src[groups * gb..]);
    debug_assert_eq!(nb * 34, rb);
    Weight::from_bytes(WeightType::Q8_0R16, w.rows, w.cols, out)
}

/// Row `r` of a [`WeightType::Q8_0R16`] matrix (`bytes`, `rows × cols`) as floats.
pub(crate) fn dequantize_r16_row(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    out: &mut [f32],
) {
    let nb = cols / 32;
    let rb = nb * 34;
    let groups = rows / GROUP;
    if r >= groups * GROUP {
        let row = &bytes[r * rb..(r + 1) * rb];
        crate::weight::dequantize(WeightType::Q8_0, row, out);
        return;
    }
    let (g, j) = (r / GROUP, r % GROUP);
    let group = &bytes[g * GROUP * rb..(g + 1) * GROUP * rb];
    for (o, blk) in out
        .chunks_exact_mut(32)
        .zip(group.chunks_exact(GROUP_BLOCK_BYTES))
    {
        let d = f16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f32();
        for c in 0..8 {
            let q = &blk[2 * GROUP + 64 * c + 4 * j..2 * GROUP + 64 * c + 4 * j + 4];
            for (v, &q) in o[4 * c..4 * c + 4].iter_mut().zip(q) {
                *v = d * (q as i32 - 128) as f32;
            }
        }
    }
}
