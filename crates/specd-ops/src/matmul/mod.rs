//! `out = x · Wᵀ` for a batch of activation rows against one weight matrix.
//!
//! Why hand-written (see the crate docs): a verification batch of a few rows must cost about one
//! plain step, so the kernels load each weight block once and use it for a tile of activation
//! rows (up to eight), and each output element is reduced in the same fixed order whatever the
//! batch size. Threads split output columns only.
//!
//! One kernel family per instruction-set level ([`Isa`]): `scalar` (portable), `avx2`, `avx512`
//! (VNNI). The level is fixed per process.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;

use crate::parallel::{chunk_len, SyncPtr};
use crate::quant::{quantize_row_i8c, quantize_row_q8, quantize_row_u8, u8_scales_len, BlockQ8};
use crate::weight::{Weight, WeightType};
use crate::{Isa, OpsError};
use rayon::prelude::*;

/// Activation rows processed per weight load (at most).
const TILE: usize = 8;
/// Activation rows kept hot in cache while a chunk of weight rows streams past (prefill).
const ROW_BLOCK: usize = 16;
const _: () = assert!(ROW_BLOCK.is_multiple_of(TILE), "tiles must stay aligned");

/// Computes `out[r][o] = Σ_i x[r][i] · W[o][i]` for `n` rows: `x` is `n × w.cols`, `out` is
/// `n × w.rows`, both row-major.
pub fn matmul(x: &[f32], n: usize, w: &Weight, out: &mut [f32]) -> Result<(), OpsError> {
    matmul_with(crate::isa(), x, n, w, out)
}

/// [`matmul`] on an explicit kernel level (for tests that compare levels; a level above what the
/// CPU supports falls back to the best supported one).
pub fn matmul_with(
    isa: Isa,
    x: &[f32],
    n: usize,
    w: &Weight,
    out: &mut [f32],
) -> Result<(), OpsError> {
    if x.len() != n * w.cols || out.len() != n * w.rows {
        return Err(OpsError::Shape {
            op: "matmul",
            detail: format!("x {} (n={n}), weight {:?}, out {}", x.len(), w, out.len()),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let isa = isa.min(*Isa::available().last().unwrap_or(&Isa::Scalar));
    if w.wtype == WeightType::Q8_0Packed {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni {
            let acts = PackedActs::new(x, n, w.cols);
            run(w, n, out, |wrow, rows, res| {
                kernel_packed(wrow, &acts, rows, res)
            });
            return Ok(());
        }
        // A packed matrix on a lower level (tests only: packing happens for VNNI): dequantise
        // the row and use the portable float dot.
        let cols = w.cols;
        run(w, n, out, |wrow, rows, res| {
            let mut wf = vec![0f32; cols];
            crate::weight::dequantize(w.wtype, wrow, &mut wf);
            let wb: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
            for (r, &ri) in res.iter_mut().zip(rows) {
                *r = scalar::dot_float(WeightType::F32, &wb, &x[ri * cols..(ri + 1) * cols]);
            }
        });
        return Ok(());
    }
    let quantised = matches!(w.wtype, WeightType::Q8_0 | WeightType::Q4_0);
    #[cfg(target_arch = "x86_64")]
    if quantised && isa == Isa::Avx512Vnni {
        let cols = w.cols;
        let ns = u8_scales_len(cols);
        let mut xq = vec![0u8; n * cols];
        let mut xs = vec![0f32; n * ns];
        for ((row, q), s) in x
            .chunks_exact(cols)
            .zip(xq.chunks_exact_mut(cols))
            .zip(xs.chunks_exact_mut(ns))
        {
            quantize_row_u8(row, q, s);
        }
        run(w, n, out, |wrow, rows, res| {
            kernel_vnni(w.wtype, wrow, cols, &xq, &xs, rows, res)
        });
        return Ok(());
    }
    if quantised {
        let nb = w.cols / 32;
        let mut xq = vec![BlockQ8::default(); n * nb];
        for (row, q) in x.chunks_exact(w.cols).zip(xq.chunks_exact_mut(nb)) {
            quantize_row_q8(row, q);
        }
        run(w, n, out, |wrow, rows, res| {
            for (r4, o4) in rows.chunks(4).zip(res.chunks_mut(4)) {
                kernel_q(isa, w.wtype, wrow, nb, &xq, r4, o4);
            }
        });
    } else {
        let cols = w.cols;
        run(w, n, out, |wrow, rows, res| {
            for (r4, o4) in rows.chunks(4).zip(res.chunks_mut(4)) {
                kernel_float(isa, w.wtype, wrow, cols, x, r4, o4);
            }
        });
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

/// Quantised weights on the AVX-512 VNNI level: up to `TILE` rows per call.
#[cfg(target_arch = "x86_64")]
fn kernel_vnni(
    wt: WeightType,
    wrow: &[u8],
    cols: usize,
    xq: &[u8],
    xs: &[f32],
    rows: &[usize],
    res: &mut [f32],
) {
    let nb = cols / 32;
    let ns = u8_scales_len(cols);
    // SAFETY: the caller chose this level only after detecting AVX-512 F/BW/VL/DQ/VNNI; `wrow`
    // holds `nb` blocks; every row index addresses `cols` quants and `ns` scales (shapes checked
    // in `matmul_with`).
    unsafe {
        macro_rules! go {
            ($b:ty, $r:literal) => {{
                let mut q = [std::ptr::null(); $r];
                let mut s = [std::ptr::null(); $r];
                for ((qq, ss), &ri) in q.iter_mut().zip(s.iter_mut()).zip(rows) {
                    *qq = xq.as_ptr().add(ri * cols);
                    *ss = xs.as_ptr().add(ri * ns);
                }
                let v = avx512::dot::<$b, $r>(wrow.as_ptr(), nb, q, s);
                res.copy_from_slice(&v);
            }};
        }
        macro_rules! by_rows {
            ($b:ty) => {
                match rows.len() {
                    8 => go!($b, 8),
                    7 => go!($b, 7),
                    6 => go!($b, 6),
                    5 => go!($b, 5),
                    4 => go!($b, 4),
                    3 => go!($b, 3),
                    2 => go!($b, 2),
                    _ => go!($b, 1),
                }
            };
        }
        if wt == WeightType::Q8_0 {
            by_rows!(avx512::Q8_0)
        } else {
            by_rows!(avx512::Q4_0)
        }
    }
}

/// Activations for the packed kernel: each row quantised by [`quantize_row_i8c`], then
/// interleaved per tile of `TILE` rows so that one pointer addresses a whole tile (see
/// [`avx512::dot_packed`]). Tiles start at multiples of `TILE` (the row walk in [`run`] keeps
/// them there); the last one may be shorter.
#[cfg(target_arch = "x86_64")]
struct PackedActs {
    qs: Vec<i8>,
    scales: Vec<f32>,
    corr: Vec<f32>,
    n: usize,
    /// Pairs per row (the odd last block gets a whole pair slot).
    pairs: usize,
    /// Blocks per row.
    nb: usize,
    /// Correction groups (16 blocks) per row.
    groups: usize,
}

#[cfg(target_arch = "x86_64")]
impl PackedActs {
    fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let nb = cols / 32;
        let (pairs, groups) = (nb.div_ceil(2), nb.div_ceil(16));
        let mut a = PackedActs {
            qs: vec![0; n * pairs * 64],
            scales: vec![0.0; n * pairs * 16],
            corr: vec![0.0; n * groups * 16],
            n,
            pairs,
            nb,
            groups,
        };
        let (mut q, mut s, mut c) = (
            vec![0i8; pairs * 64],
            vec![0f32; pairs * 16],
            vec![0f32; groups * 16],
        );
        for (r, row) in x.chunks_exact(cols).enumerate() {
            quantize_row_i8c(row, &mut q[..cols], &mut s, &mut c);
            let (t0, t) = a.tile(r);
            let i = r - t0;
            for p in 0..pairs {
                let dq = (t0 * pairs + p * t + i) * 64;
                a.qs[dq..dq + 64].copy_from_slice(&q[p * 64..p * 64 + 64]);
                let ds = (t0 * pairs + p * t + i) * 16;
                a.scales[ds..ds + 16].copy_from_slice(&s[p * 16..p * 16 + 16]);
            }
            for g in 0..groups {
                let dc = (t0 * groups + g * t + i) * 16;
                a.corr[dc..dc + 16].copy_from_slice(&c[g * 16..g * 16 + 16]);
            }
        }
        a
    }

    /// First row and length of the tile holding row `r`.
    fn tile(&self, r: usize) -> (usize, usize) {
        let t0 = r / TILE * TILE;
        (t0, TILE.min(self.n - t0))
    }
}

/// Packed Q8_0 weights on the AVX-512 VNNI level: one tile of rows per call.
#[cfg(target_arch = "x86_64")]
fn kernel_packed(wrow: &[u8], a: &PackedActs, rows: &[usize], res: &mut [f32]) {
    let t0 = rows[0];
    debug_assert_eq!(a.tile(t0), (t0, rows.len()), "tiles must be aligned");
    // SAFETY: VNNI level detected; `wrow` is one packed row of `nb` blocks; the tile at `t0`
    // holds `rows.len()` rows of `pairs` pair slots and `groups` correction groups (built by
    // `PackedActs::new` for this matrix's column count).
    unsafe {
        let q = a.qs.as_ptr().add(t0 * a.pairs * 64);
        let s = a.scales.as_ptr().add(t0 * a.pairs * 16);
        let c = a.corr.as_ptr().add(t0 * a.groups * 16);
        macro_rules! go {
            ($r:literal) => {{
                let v = avx512::dot_packed::<$r>(wrow.as_ptr(), a.nb, q, s, c);
                res.copy_from_slice(&v);
            }};
        }
        match rows.len() {
            8 => go!(8),
            7 => go!(7),
            6 => go!(6),
            5 => go!(5),
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
    }
}

/// Quantised weights on the AVX2 or scalar level: up to 4 rows per call.
fn kernel_q(
    isa: Isa,
    wt: WeightType,
    wrow: &[u8],
    nb: usize,
    xq: &[BlockQ8],
    rows: &[usize],
    res: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
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
    let _ = isa;
    for (r, &ri) in res.iter_mut().zip(rows) {
        *r = scalar::dot_q(wt, wrow, &xq[ri * nb..(ri + 1) * nb]);
    }
}

/// Float weights (F32/F16/BF16) on the AVX2 or scalar level: up to 4 rows per call.
fn kernel_float(
    isa: Isa,
    wt: WeightType,
    wrow: &[u8],
    cols: usize,
    x: &[f32],
    rows: &[usize],
    res: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
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
    let _ = isa;
    for (r, &ri) in res.iter_mut().zip(rows) {
        *r = scalar::dot_float(wt, wrow, &x[ri * cols..(ri + 1) * cols]);
    }
}
