//! Load-time repacking of weights into layouts that a kernel level reads faster.
//!
//! Why: ggml's Q8_0 interleaves a 2-byte scale with every 32 quants and stores them signed. The
//! VNNI instruction wants unsigned × signed bytes, so with that layout every block pair costs a
//! correction (−128·Σw), a lane insert and two scalar scale conversions — as much work as the dot
//! product itself on a one-row decode step. Repacked, a row is 64-byte runs of unsigned quants
//! followed by its scales (16 converted per instruction), and the +128 correction moves to the
//! activation side where it is computed once per row (see [`crate::quant::quantize_row_i8c`]).
//! The size is unchanged, so decode streams the same number of bytes.

use crate::weight::{Weight, WeightType};
use crate::OpsError;
use rayon::prelude::*;

/// `w` in the layout the current kernel level prefers: Q8_0 becomes [`WeightType::Q8_0Packed`]
/// on AVX-512 VNNI when `SPECD_REPACK` is set; everything else is returned as is (cheap clone,
/// no copy). Opt-in because end to end it was not faster (decode is memory-bound; A/B on the
/// 0.8B model: pp 67 vs 72 tok/s, tg 11.3 vs 12.2 — within noise, but not a gain) while it
/// costs a copy of every Q8_0 matrix at load.
pub fn for_current_isa(w: &Weight) -> Result<Weight, OpsError> {
    if w.wtype == WeightType::Q8_0
        && crate::isa() == crate::Isa::Avx512Vnni
        && std::env::var_os("SPECD_REPACK").is_some()
    {
        pack_q8_0(w)
    } else {
        Ok(w.clone())
    }
}

/// Repacks a Q8_0 matrix: per row, `q + 128` for every block in order (32·nb bytes), then the nb
/// f16 scales.
pub fn pack_q8_0(w: &Weight) -> Result<Weight, OpsError> {
    if w.wtype != WeightType::Q8_0 {
        return Err(OpsError::UnsupportedType(format!(
            "pack {}",
            w.wtype.name()
        )));
    }
    let nb = w.cols / 32;
    let rb = w.row_bytes();
    let mut out = vec![0u8; w.bytes().len()];
    out.par_chunks_mut(rb)
        .zip(w.bytes().par_chunks(rb))
        .for_each(|(dst, src)| {
            let (qs, scales) = dst.split_at_mut(nb * 32);
            for (b, blk) in src.chunks_exact(34).enumerate() {
                scales[2 * b..2 * b + 2].copy_from_slice(&blk[..2]);
                for (d, &q) in qs[b * 32..(b + 1) * 32].iter_mut().zip(&blk[2..]) {
                    *d = q ^ 0x80; // (q as i8) + 128 as u8
                }
            }
        });
    Weight::from_bytes(WeightType::Q8_0Packed, w.rows, w.cols, out)
}
