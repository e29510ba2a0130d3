//! Block (de)quantisation. Q8_0 and Q4_0 are written here to match ggml's reference rounding bit
//! for bit (files specd writes must read the same in llama.cpp); IQ4_NL and IQ4_XS are specd's
//! own ([`crate::iq4`]); the other block types go through candle's `k_quants` implementations.

use crate::{GgufError, TensorType};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use half::{bf16, f16};
use std::mem::{size_of, MaybeUninit};

/// Bytes of a Q8_0 block: f16 scale then 32 × i8.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Weights per Q8_0 / Q4_0 block.
pub const QK: usize = 32;

/// Copies raw bytes into a vector of candle blocks (the file data need not be aligned for them).
fn to_blocks<B: GgmlType>(bytes: &[u8]) -> Result<Vec<B>, GgufError> {
    let bs = size_of::<B>();
    if bs == 0 || !bytes.len().is_multiple_of(bs) {
        return Err(GgufError::Invalid(format!(
            "{} bytes is not a whole number of {bs}-byte blocks",
            bytes.len()
        )));
    }
    let n = bytes.len() / bs;
    let mut v: Vec<MaybeUninit<B>> = Vec::with_capacity(n);
    // SAFETY: candle's block types are `#[repr(C)]` plain data (integers, f16) for which every
    // bit pattern is valid; we copy exactly n·size_of::<B>() bytes into the allocation.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len());
        v.set_len(n);
        Ok(std::mem::transmute::<Vec<MaybeUninit<B>>, Vec<B>>(v))
    }
}

fn from_blocks<B: GgmlType>(blocks: &[B]) -> Vec<u8> {
    let n = std::mem::size_of_val(blocks);
    let mut out = vec![0u8; n];
    // SAFETY: see `to_blocks`; the blocks are plain data without padding.
    unsafe { std::ptr::copy_nonoverlapping(blocks.as_ptr() as *const u8, out.as_mut_ptr(), n) };
    out
}

fn deq<B: GgmlType>(bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    let blocks = to_blocks::<B>(bytes)?;
    if blocks.len() * B::BLCK_SIZE != out.len() {
        return Err(GgufError::Invalid(format!(
            "{} blocks for {} values",
            blocks.len(),
            out.len()
        )));
    }
    B::to_float(&blocks, out);
    Ok(())
}

fn quant<B: GgmlType>(x: &[f32]) -> Vec<u8> {
    let nb = x.len() / B::BLCK_SIZE;
    let mut blocks: Vec<MaybeUninit<B>> = Vec::with_capacity(nb);
    // SAFETY: zeroed plain-data blocks are valid; from_float overwrites every block.
    let mut blocks: Vec<B> = unsafe {
        std::ptr::write_bytes(blocks.as_mut_ptr(), 0, nb);
        blocks.set_len(nb);
        std::mem::transmute::<Vec<MaybeUninit<B>>, Vec<B>>(blocks)
    };
    B::from_float(x, &mut blocks);
    from_blocks(&blocks)
}

/// Dequantises `bytes` of type `t` into `out` (whose length fixes the element count).
pub fn dequantize(t: TensorType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    let (bs, ts) = t.block();
    if !out.len().is_multiple_of(bs) || bytes.len() != out.len() / bs * ts {
        return Err(GgufError::Invalid(format!(
            "{} bytes of {t} for {} values",
            bytes.len(),
            out.len()
        )));
    }
    match t {
        TensorType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        TensorType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        TensorType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        TensorType::Q8_0 => {
            for (o, b) in out
                .chunks_exact_mut(QK)
                .zip(bytes.chunks_exact(Q8_0_BLOCK_BYTES))
            {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (v, &q) in o.iter_mut().zip(&b[2..]) {
                    *v = d * (q as i8) as f32;
                }
            }
        }
        TensorType::Q4_0 => deq::<BlockQ4_0>(bytes, out)?,
        TensorType::Q4_1 => deq::<BlockQ4_1>(bytes, out)?,
        TensorType::Q5_0 => deq::<BlockQ5_0>(bytes, out)?,
        TensorType::Q5_1 => deq::<BlockQ5_1>(bytes, out)?,
        TensorType::Q2_K => deq::<BlockQ2K>(bytes, out)?,
        TensorType::Q3_K => deq::<BlockQ3K>(bytes, out)?,
        TensorType::Q4_K => deq::<BlockQ4K>(bytes, out)?,
        TensorType::Q5_K => deq::<BlockQ5K>(bytes, out)?,
        TensorType::Q6_K => deq::<BlockQ6K>(bytes, out)?,
        TensorType::IQ4_NL => crate::iq4::dequantize_iq4_nl(bytes, out),
        TensorType::IQ4_XS => crate::iq4::dequantize_iq4_xs(bytes, out),
        TensorType::IQ2_XXS => crate::iq::dequantize_iq2_xxs(bytes, out),
        TensorType::IQ2_XS => crate::iq::dequantize_iq2_xs(bytes, out),
        TensorType::IQ2_S => crate::iq::dequantize_iq2_s(bytes, out),
        TensorType::IQ3_XXS => crate::iq::dequantize_iq3_xxs(bytes, out),
        TensorType::IQ3_S => crate::iq::dequantize_iq3_s(bytes, out),
        TensorType::IQ1_S => crate::iq::dequantize_iq1_s(bytes, out),
        TensorType::IQ1_M => crate::iq::dequantize_iq1_m(bytes, out),
        TensorType::TQ1_0 => crate::iq::dequantize_tq1_0(bytes, out),
        TensorType::TQ2_0 => crate::iq::dequantize_tq2_0(bytes, out),
        TensorType::MXFP4 => crate::iq::dequantize_mxfp4(bytes, out),
        _ => {
            return Err(GgufError::UnsupportedTensorType {
                name: String::new(),
                ttype: t.name(),
            })
        }
    }
    Ok(())
}

/// Quantises `x` to type `t`: every type [`TensorType::can_quantize`] accepts (F32, F16, BF16,
/// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS).
pub fn quantize(t: TensorType, x: &[f32]) -> Result<Vec<u8>, GgufError> {
    if !x.len().is_multiple_of(t.block_size()) {
        return Err(GgufError::Invalid(format!(
            "{} values is not a multiple of the {t} block",
            x.len()
        )));
    }
    Ok(match t {
        TensorType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        TensorType::F16 => x
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        TensorType::BF16 => x
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        TensorType::Q8_0 => {
            let mut out = Vec::with_capacity(x.len() / QK * Q8_0_BLOCK_BYTES);
            for b in x.chunks_exact(QK) {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                // `round` is half-away-from-zero, like C's roundf in ggml's reference.
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
            out
        }
        TensorType::Q4_0 => {
            let mut out = Vec::with_capacity(x.len() / QK * 18);
            for b in x.chunks_exact(QK) {
                // The value of largest magnitude, with its sign, maps to -8.
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in b {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..QK / 2 {
                    let q0 = ((b[j] * id + 8.5) as i8).min(15) as u8;
                    let q1 = ((b[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
            out
        }
        TensorType::Q4_1 => quant::<BlockQ4_1>(x),
        TensorType::Q5_0 => quant::<BlockQ5_0>(x),
        TensorType::Q5_1 => quant::<BlockQ5_1>(x),
        TensorType::Q2_K => quant::<BlockQ2K>(x),
        TensorType::Q3_K => quant::<BlockQ3K>(x),
        TensorType::Q4_K => quant::<BlockQ4K>(x),
        TensorType::Q5_K => quant::<BlockQ5K>(x),
        TensorType::Q6_K => quant::<BlockQ6K>(x),
        TensorType::IQ4_NL => crate::iq4::quantize_iq4_nl(x),
        TensorType::IQ4_XS => crate::iq4::quantize_iq4_xs(x),
        _ => {
            return Err(GgufError::UnsupportedTensorType {
                name: String::new(),
                ttype: t.name(),
            })
        }
    })
}

#[allow(dead_code)]
fn _assert_layouts() {
    // candle's blocks must have ggml's sizes for the byte casts above.
    const _: () = assert!(size_of::<BlockQ4K>() == 144);
    const _: () = assert!(size_of::<BlockQ6K>() == 210);
    const _: () = assert!(size_of::<BlockQ8_0>() == 34);
    const _: () = assert!(size_of::<BlockQ4_0>() == 18);
    const _: () = assert!(size_of::<BlockQ4_1>() == 20);
    const _: () = assert!(size_of::<BlockQ5_0>() == 22);
    const _: () = assert!(size_of::<BlockQ5_1>() == 24);
    const _: () = assert!(size_of::<BlockQ2K>() == 84);
    const _: () = assert!(size_of::<BlockQ3K>() == 110);
    const _: () = assert!(size_of::<BlockQ5K>() == 176);
}
