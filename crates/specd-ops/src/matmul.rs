//! `out = x · Wᵀ` for a batch of activation rows against one weight matrix.
//!
//! Why hand-written (see the crate docs): a verification batch of a few rows must cost about one
//! plain step, so the kernels load each weight block once and use it for up to four activation
//! rows (`TILE`), and each output element is reduced in the same fixed order whatever the batch
//! size. Threads split output columns only.

use crate::parallel::{chunk_len, SyncPtr};
use crate::quant::{quantize_row_q8, BlockQ8};
use crate::weight::{Weight, WeightType};
use crate::OpsError;
use rayon::prelude::*;

/// Activation rows processed per weight load.
const TILE: usize = 4;
/// Activation rows kept hot in cache while a chunk of weight rows streams past (prefill).
const ROW_BLOCK: usize = 32;

/// Computes `out[r][o] = Σ_i x[r][i] · W[o][i]` for `n` rows: `x` is `n × w.cols`, `out` is
/// `n × w.rows`, both row-major.
pub fn matmul(x: &[f32], n: usize, w: &Weight, out: &mut [f32]) -> Result<(), OpsError> {
    if x.len() != n * w.cols || out.len() != n * w.rows {
        return Err(OpsError::Shape {
            op: "matmul",
            detail: format!("x {} (n={n}), weight {:?}, out {}", x.len(), w, out.len()),
        });
    }
    if n == 0 {
        return Ok(());
    }
    match w.wtype {
        WeightType::Q8_0 | WeightType::Q4_0 => {
            let nb = w.cols / 32;
            let mut xq = vec![BlockQ8::default(); n * nb];
            for (row, q) in x.chunks_exact(w.cols).zip(xq.chunks_exact_mut(nb)) {
                quantize_row_q8(row, q);
            }
            run(w, n, out, |wrow, rows, res| {
                kernel_q(w.wtype, wrow, nb, &xq, rows, res)
            });
        }
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => {
            let cols = w.cols;
            run(w, n, out, |wrow, rows, res| {
                kernel_float(w.wtype, wrow, cols, x, rows, res)
            });
        }
    }
    Ok(())
}

/// Splits the output columns over threads and walks the activation rows in cache-sized blocks.
/// `k(weight_row_bytes, row_indices, results)` computes one weight row against up to `TILE` rows.
fn run<K>(w: &Weight, n: usize, out: &mut [f32], k: K)
where
    K: Fn(&[u8], &[usize], &mut [f32]) + Sync,
{
    let rows = w.rows;
    let rb = w.row_bytes();
    let bytes = w.bytes();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let chunk = chunk_len(rows, 4, 16);
    let n_chunks = rows.div_ceil(chunk);
    (0..n_chunks).into_par_iter().for_each(|c| {
        let o0 = c * chunk;
        let o1 = (o0 + chunk).min(rows);
        let mut idx = [0usize; TILE];
        let mut res = [0f32; TILE];
        for r0 in (0..n).step_by(ROW_BLOCK) {
            let r1 = (r0 + ROW_BLOCK).min(n);
            for o in o0..o1 {
                let wrow = &bytes[o * rb..(o + 1) * rb];
                let mut r = r0;
                while r < r1 {
                    let t = (r1 - r).min(TILE);
                    for (i, v) in idx[..t].iter_mut().enumerate() {
                        *v = r + i;
                    }
                    k(wrow, &idx[..t], &mut res[..t]);
                    for (i, &v) in res[..t].iter().enumerate() {
                        // SAFETY: column `o` belongs to this chunk only; rows are in range.
                        unsafe { out_ptr.write((r + i) * rows + o, v) };
                    }
                    r += t;
                }
            }
        }
    });
}

fn kernel_q(
    wt: WeightType,
    wrow: &[u8],
    nb: usize,
    xq: &[BlockQ8],
    rows: &[usize],
    res: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: AVX2/FMA/F16C verified at run time; `wrow` holds `nb` blocks and each row index
        // addresses `nb` blocks of `xq` (checked by the caller's shape validation).
        unsafe {
            macro_rules! go {
                ($f:ident, $r:literal) => {{
                    let mut p = [std::ptr::null(); $r];
                    for (pp, &ri) in p.iter_mut().zip(rows) {
                        *pp = xq.as_ptr().add(ri * nb);
                    }
                    let v = avx2::$f::<$r>(wrow.as_ptr(), nb, p);
                    res.copy_from_slice(&v);
                }};
            }
            match (wt, rows.len()) {
                (WeightType::Q8_0, 4) => go!(dot_q8_0, 4),
                (WeightType::Q8_0, 3) => go!(dot_q8_0, 3),
                (WeightType::Q8_0, 2) => go!(dot_q8_0, 2),
                (WeightType::Q8_0, _) => go!(dot_q8_0, 1),
                (_, 4) => go!(dot_q4_0, 4),
                (_, 3) => go!(dot_q4_0, 3),
                (_, 2) => go!(dot_q4_0, 2),
                (_, _) => go!(dot_q4_0, 1),
            }
        }
        return;
    }
    for (r, &ri) in res.iter_mut().zip(rows) {
        *r = scalar::dot_q(wt, wrow, &xq[ri * nb..(ri + 1) * nb]);
    }
}

fn kernel_float(
    wt: WeightType,
    wrow: &[u8],
    cols: usize,
    x: &[f32],
    rows: &[usize],
    res: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: AVX2/FMA/F16C verified; `wrow` holds `cols` weights, each row `cols` floats.
        unsafe {
            macro_rules! go {
                ($r:literal) => {{
                    let mut p = [std::ptr::null(); $r];
                    for (pp, &ri) in p.iter_mut().zip(rows) {
                        *pp = x.as_ptr().add(ri * cols);
                    }
                    let v = avx2::dot_float::<$r>(wt, wrow.as_ptr(), cols, p);
                    res.copy_from_slice(&v);
                }};
            }
            match rows.len() {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }
        return;
    }
    for (r, &ri) in res.iter_mut().zip(rows) {
        *r = scalar::dot_float(wt, wrow, &x[ri * cols..(ri + 1) * cols]);
    }
}

/// Portable kernels (used where AVX2 is absent, or with `SPECD_NO_SIMD`). Deterministic, with the
/// same per-element order for any batch.
mod scalar {
    use super::BlockQ8;
    use crate::weight::{dequantize, WeightType};

    pub fn dot_q(wt: WeightType, w: &[u8], x: &[BlockQ8]) -> f32 {
        let bb = wt.block_bytes();
        let mut acc = 0f32;
        for (b, xb) in x.iter().enumerate() {
            let wb = &w[b * bb..(b + 1) * bb];
            let dw = half::f16::from_le_bytes([wb[0], wb[1]]).to_f32();
            let mut isum = 0i32;
            match wt {
                WeightType::Q8_0 => {
                    for (q, &xq) in wb[2..34].iter().zip(&xb.qs) {
                        isum += (*q as i8 as i32) * xq as i32;
                    }
                }
                _ => {
                    for j in 0..16 {
                        let lo = (wb[2 + j] & 0x0f) as i32 - 8;
                        let hi = (wb[2 + j] >> 4) as i32 - 8;
                        isum += lo * xb.qs[j] as i32 + hi * xb.qs[j + 16] as i32;
                    }
                }
            }
            acc += isum as f32 * (dw * xb.d);
        }
        acc
    }

    pub fn dot_float(wt: WeightType, w: &[u8], x: &[f32]) -> f32 {
        let mut acc = 0f32;
        let mut tmp = [0f32; 64];
        let bb = wt.block_bytes();
        for (xs, wc) in x.chunks(64).zip(w.chunks(64 * bb)) {
            let t = &mut tmp[..xs.len()];
            dequantize(wt, wc, t);
            for (a, b) in xs.iter().zip(t.iter()) {
                acc += a * b;
            }
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::BlockQ8;
    use crate::weight::WeightType;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        unsafe {
            let bits = std::ptr::read_unaligned(p as *const u16);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }
    }

    /// Signed i8·i8 dot of 32 pairs, as 8 i32 lanes converted to f32. `aw` = |w|.
    #[inline(always)]
    unsafe fn dot_i8(aw: __m256i, w: __m256i, x: __m256i) -> __m256 {
        unsafe {
            let sx = _mm256_sign_epi8(x, w);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
            _mm256_cvtepi32_ps(p)
        }
    }

    /// One Q8_0 weight row against `R` quantised activation rows. Block `b` accumulates into
    /// `acc[b % 2]`; the order is the same for every `R`, which is what batch invariance needs.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0<const R: usize>(
        w: *const u8,
        nb: usize,
        x: [*const BlockQ8; R],
    ) -> [f32; R] {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for b in 0..nb {
                let wb = w.add(b * 34);
                let dw = f16_at(wb);
                let wq = _mm256_loadu_si256(wb.add(2) as *const __m256i);
                let aw = _mm256_sign_epi8(wq, wq);
                for r in 0..R {
                    let xb = &*x[r].add(b);
                    let xq = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                    let p = dot_i8(aw, wq, xq);
                    let a = &mut acc[r][b & 1];
                    *a = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * xb.d), *a);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
            }
            out
        }
    }

    /// One Q4_0 weight row against `R` quantised activation rows (same order rules as Q8_0).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_0<const R: usize>(
        w: *const u8,
        nb: usize,
        x: [*const BlockQ8; R],
    ) -> [f32; R] {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            let mask = _mm_set1_epi8(0x0f);
            let eight = _mm256_set1_epi8(8);
            for b in 0..nb {
                let wb = w.add(b * 18);
                let dw = f16_at(wb);
                let raw = _mm_loadu_si128(wb.add(2) as *const __m128i);
                let lo = _mm_and_si128(raw, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                let wq = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
                let aw = _mm256_sign_epi8(wq, wq);
                for r in 0..R {
                    let xb = &*x[r].add(b);
                    let xq = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                    let p = dot_i8(aw, wq, xq);
                    let a = &mut acc[r][b & 1];
                    *a = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * xb.d), *a);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
            }
            out
        }
    }

    #[inline(always)]
    unsafe fn load8(wt: WeightType, w: *const u8, i: usize) -> __m256 {
        unsafe {
            match wt {
                WeightType::F32 => _mm256_loadu_ps((w as *const f32).add(i)),
                WeightType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(i * 2) as *const __m128i)),
                _ => {
                    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(i * 2) as *const __m128i));
                    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn load1(wt: WeightType, w: *const u8, i: usize) -> f32 {
        unsafe {
            match wt {
                WeightType::F32 => std::ptr::read_unaligned((w as *const f32).add(i)),
                WeightType::F16 => f16_at(w.add(i * 2)),
                _ => f32::from_bits(
                    (std::ptr::read_unaligned(w.add(i * 2) as *const u16) as u32) << 16,
                ),
            }
        }
    }

    /// One float weight row (F32/F16/BF16) against `R` f32 activation rows: two 8-lane
    /// accumulators per row over 16-wide steps, then an 8-wide step, then a scalar tail — the same
    /// sequence for every `R`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_float<const R: usize>(
        wt: WeightType,
        w: *const u8,
        cols: usize,
        x: [*const f32; R],
    ) -> [f32; R] {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            let mut i = 0;
            while i + 16 <= cols {
                let w0 = load8(wt, w, i);
                let w1 = load8(wt, w, i + 8);
                for r in 0..R {
                    acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r].add(i)), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r].add(i + 8)), acc[r][1]);
                }
                i += 16;
            }
            if i + 8 <= cols {
                let w0 = load8(wt, w, i);
                for r in 0..R {
                    acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r].add(i)), acc[r][0]);
                }
                i += 8;
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
            }
            while i < cols {
                let wv = load1(wt, w, i);
                for r in 0..R {
                    out[r] += wv * *x[r].add(i);
                }
                i += 1;
            }
            out
        }
    }
}
