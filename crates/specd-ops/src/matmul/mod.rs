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
pub(crate) use avx2::store_halves;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;

use crate::kquant::{self, KActs};
use crate::legacy::{self, LegacyActs};
use crate::pack::GROUP;
use crate::parallel::{chunk_len, SyncPtr};
use crate::quant::{quantize_row_i8s, quantize_row_q8, quantize_row_u8, u8_scales_len, BlockQ8};
use crate::weight::{Weight, WeightType};
use crate::{Isa, OpsError};

/// Calls `$go!($ty, R)` with the tile height `$t` (1..=8, [`TILE`]) as a constant, so that each
/// kernel is compiled for every tile height.
#[cfg(target_arch = "x86_64")]
macro_rules! by_tile {
    ($t:expr, $go:ident, $ty:tt) => {
        match $t {
            8 => $go!($ty, 8),
            7 => $go!($ty, 7),
            6 => $go!($ty, 6),
            5 => $go!($ty, 5),
            4 => $go!($ty, 4),
            3 => $go!($ty, 3),
            2 => $go!($ty, 2),
            _ => $go!($ty, 1),
        }
    };
}

/// Activation rows processed per weight load (at most) by the SIMD kernels.
pub(crate) const TILE: usize = 8;
/// The fewest activation rows a tile needs to go to the AMX kernels: at 8 rows the VNNI kernels
/// were still faster (a tile's products and stores cost the same for 8 rows as for 16), at 12 the
/// AMX ones (`cargo bench -p specd-ops --bench matmul -- hot`).
pub(crate) const AMX_MIN_ROWS: usize = 12;

/// Activation rows kept hot in cache while a chunk of weight rows streams past (prefill).
const ROW_BLOCK: usize = 16;
const _: () = assert!(ROW_BLOCK.is_multiple_of(TILE), "tiles must stay aligned");
const _: () = assert!(ROW_BLOCK <= 16, "an AMX tile holds at most 16 rows");

/// The tile height for [`run_grouped`] on `isa` with `n` activation rows: whole row blocks on the
/// AMX level once a block is wide enough to reach the AMX kernels, else [`TILE`].
pub(crate) fn amx_tile(isa: Isa, n: usize) -> usize {
    if isa == Isa::Amx && n >= AMX_MIN_ROWS {
        ROW_BLOCK
    } else {
        TILE
    }
}

/// Computes `out[r][o] = Σ_i x[r][i] · W[o][i]` for `n` rows: `x` is `n × w.cols`, `out` is
/// `n × w.rows`, both row-major.
pub fn matmul(x: &[f32], n: usize, w: &Weight, out: &mut [f32]) -> Result<(), OpsError> {
    matmul_with(crate::isa(), x, n, w, out)
}

/// `outs[i] = x · ws[i]ᵀ` for matrices that read the same input (a layer's Q/K/V, gate/up, …):
/// same results as one [`matmul`] per matrix, but on the interleaved layouts the activations are
/// quantised once and every matrix is computed in one parallel region, so the threads are handed
/// work once instead of once per matrix (each hand-off can cost a thread wake-up).
pub fn matmul_many(
    x: &[f32],
    n: usize,
    ws: &[&Weight],
    outs: &mut [&mut [f32]],
) -> Result<(), OpsError> {
    if ws.len() != outs.len() {
        return Err(OpsError::Shape {
            op: "matmul_many",
            detail: format!("{} weights, {} outputs", ws.len(), outs.len()),
        });
    }
    let isa = crate::isa();
    let cols = ws.first().map_or(0, |w| w.cols);
    let superblocks = ws
        .iter()
        .all(|w| matches!(w.wtype, WeightType::KR16(_)) && w.cols == cols);
    let block32 = ws
        .iter()
        .all(|w| matches!(w.wtype, WeightType::LegacyR16(_)) && w.cols == cols);
    let fused = isa >= Isa::Avx2
        && ws
            .iter()
            .all(|w| w.wtype.interleaved_from().is_some() && w.cols == cols);
    if !(fused || superblocks || block32) || n == 0 {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            matmul_with(isa, x, n, w, out)?;
        }
        return Ok(());
    }
    for (w, out) in ws.iter().zip(outs.iter()) {
        if x.len() != n * w.cols || out.len() != n * w.rows {
            return Err(OpsError::Shape {
                op: "matmul_many",
                detail: format!("x {} (n={n}), weight {:?}, out {}", x.len(), w, out.len()),
            });
        }
    }
    let targets: Vec<(&Weight, SyncPtr<f32>)> = ws
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, o)| (*w, SyncPtr(o.as_mut_ptr())))
        .collect();
    if superblocks {
        kquant::run(isa, &targets, &KActs::new(x, n, cols), n);
    } else if block32 {
        legacy::run(isa, &targets, &LegacyActs::new(x, n, cols), n);
    } else {
        run_r16(isa, &targets, &I8Acts::new(x, n, cols), n);
    }
    Ok(())
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
    let isa = isa.supported();
    if let WeightType::K(_) | WeightType::KR16(_) = w.wtype {
        let targets = [(w, SyncPtr(out.as_mut_ptr()))];
        kquant::run(isa, &targets, &KActs::new(x, n, w.cols), n);
        return Ok(());
    }
    if let WeightType::Legacy(_) | WeightType::LegacyR16(_) = w.wtype {
        let targets = [(w, SyncPtr(out.as_mut_ptr()))];
        legacy::run(isa, &targets, &LegacyActs::new(x, n, w.cols), n);
        return Ok(());
    }
    // IQ4_NL's only kernels read the interleaved layout: a matrix left in ggml's layout (fewer
    // than 16 rows, or the scalar level) is all tail rows of the interleaved driver.
    if w.wtype.interleaved_from().is_some() || w.wtype == WeightType::IQ4NL {
        let targets = [(w, SyncPtr(out.as_mut_ptr()))];
        run_r16(isa, &targets, &I8Acts::new(x, n, w.cols), n);
        return Ok(());
    }
    let quantised = matches!(w.wtype, WeightType::Q8_0 | WeightType::Q4_0);
    #[cfg(target_arch = "x86_64")]
    if quantised && isa >= Isa::Avx512Vnni {
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
    crate::parallel::for_each(n_chunks, |c| {
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
            ($b:tt, $r:literal) => {{
                let mut q = [std::ptr::null(); $r];
                let mut s = [std::ptr::null(); $r];
                for ((qq, ss), &ri) in q.iter_mut().zip(s.iter_mut()).zip(rows) {
                    *qq = xq.as_ptr().add(ri * cols);
                    *ss = xs.as_ptr().add(ri * ns);
                }
                let v = avx512::dot::<avx512::$b, $r>(wrow.as_ptr(), nb, q, s);
                res.copy_from_slice(&v);
            }};
        }
        if wt == WeightType::Q8_0 {
            by_tile!(rows.len(), go, Q8_0)
        } else {
            by_tile!(rows.len(), go, Q4_0)
        }
    }
}

/// Activations for the interleaved weight types, each row quantised by
/// [`quantize_row_i8s`]: signed quants, one scale and one correction per block.
struct I8Acts {
    q: Vec<i8>,
    d: Vec<f32>,
    c: Vec<i32>,
    cols: usize,
    nb: usize,
}

impl I8Acts {
    fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let nb = cols / 32;
        let mut a = I8Acts {
            q: vec![0; n * cols],
            d: vec![0.0; n * nb],
            c: vec![0; n * nb],
            cols,
            nb,
        };
        for (((row, q), d), c) in x
            .chunks_exact(cols)
            .zip(a.q.chunks_exact_mut(cols))
            .zip(a.d.chunks_exact_mut(nb))
            .zip(a.c.chunks_exact_mut(nb))
        {
            quantize_row_i8s(row, q, d, c);
        }
        a
    }
}

/// Fewest groups of 16 rows a thread claims at a time in [`run_grouped`] (the last chunks of a
/// region; earlier ones are longer, see [`crate::parallel::guided_chunks`]).
const MIN_CHUNK_GROUPS: usize = 4;

/// Where a matrix in a 16-row interleaved layout keeps its groups and its tail rows.
pub(crate) struct Grouped<'a> {
    pub w: &'a Weight,
    /// Its `n × rows` output.
    pub out: SyncPtr<f32>,
    /// Whole groups of 16 rows, `group_bytes` each, from the start of the matrix.
    pub groups: usize,
    pub group_bytes: usize,
    /// Bytes of one tail row (rows `16·groups..`, in ggml layout after the groups).
    pub tail_row_bytes: usize,
}

/// The driver of every interleaved layout: threads split each matrix's groups of 16 output
/// columns, in chunks that shrink toward the end of the region ([`crate::parallel::guided_chunks`]),
/// plus one item per matrix for its tail rows, if any — all matrices' items in one parallel
/// region; activation rows are walked in cache-sized blocks and tiles of up to `tile`
/// rows (`TILE`, or [`ROW_BLOCK`] where the kernels take [`amx_tile`]'s wide tiles).
/// `group(ti, group_bytes, r, t, out, ostride)` computes activation rows `r..r+t` against one
/// group of matrix `ti`; `tail(ti, row_bytes, i)` one tail row against activation row `i`. Shapes
/// are checked by the callers.
pub(crate) fn run_grouped<G, T>(targets: &[Grouped], n: usize, tile: usize, group: G, tail: T)
where
    G: Fn(usize, &[u8], usize, usize, &mut [f32], usize) + Sync,
    T: Fn(usize, &[u8], usize) -> f32 + Sync,
{
    // (matrix, range of its groups), in claiming order; then one item per matrix with tail rows
    // (`None`).
    let runs: Vec<usize> = targets.iter().map(|t| t.groups).collect();
    let mut items: Vec<(usize, Option<std::ops::Range<usize>>)> =
        crate::parallel::guided_chunks(&runs, MIN_CHUNK_GROUPS)
            .into_iter()
            .map(|(ti, r)| (ti, Some(r)))
            .collect();
    items.extend(
        (0..targets.len())
            .filter(|&ti| targets[ti].groups * GROUP < targets[ti].w.rows)
            .map(|ti| (ti, None)),
    );
    crate::parallel::for_each(items.len(), |k| {
        let (ti, ref range) = items[k];
        let t = &targets[ti];
        let rows = t.w.rows;
        let (groups, gbytes) = (t.groups, t.group_bytes);
        let bytes = t.w.bytes();
        let out_ptr = t.out;
        let Some(range) = range.clone() else {
            let (base, rb) = (groups * gbytes, t.tail_row_bytes);
            for o in groups * GROUP..rows {
                let at = base + (o - groups * GROUP) * rb;
                let wrow = &bytes[at..at + rb];
                for i in 0..n {
                    let v = tail(ti, wrow, i);
                    // SAFETY: tail columns belong to this item only; `i < n`.
                    unsafe { out_ptr.write(i * rows + o, v) };
                }
            }
            return;
        };
        let (g0, g1) = (range.start, range.end);
        for r0 in (0..n).step_by(ROW_BLOCK) {
            let r1 = (r0 + ROW_BLOCK).min(n);
            for g in g0..g1 {
                let wg = &bytes[g * gbytes..(g + 1) * gbytes];
                let mut r = r0;
                while r < r1 {
                    let tl = (r1 - r).min(tile);
                    // SAFETY: columns `16g..16g+16` belong to this item only; rows `r..r+tl` < n.
                    let o =
                        unsafe { out_ptr.slice_mut(r * rows + g * GROUP, (tl - 1) * rows + GROUP) };
                    group(ti, wg, r, tl, o, rows);
                    r += tl;
                }
            }
        }
    });
}

/// Q8_0 / Q4_0 / IQ4_NL in their interleaved layouts, or IQ4_NL left in ggml's layout (all tail
/// rows); see [`run_grouped`].
fn run_r16(isa: Isa, targets: &[(&Weight, SyncPtr<f32>)], a: &I8Acts, n: usize) {
    let grouped: Vec<Grouped> = targets
        .iter()
        .map(|&(w, out)| Grouped {
            w,
            out,
            groups: if w.wtype.interleaved_from().is_some() {
                w.rows / GROUP
            } else {
                0
            },
            group_bytes: GROUP * w.row_bytes(),
            tail_row_bytes: w.row_bytes(),
        })
        .collect();
    let base = |ti: usize| {
        let wt = targets[ti].0.wtype;
        wt.interleaved_from().unwrap_or(wt)
    };
    run_grouped(
        &grouped,
        n,
        amx_tile(isa, n),
        |ti, wg, r, t, o, ostride| kernel_r16(isa, base(ti), wg, a, r, t, o, ostride),
        |ti, wrow, i| scalar::dot_tail_i8s(base(ti), wrow, a.row(i)),
    );
}

/// One group of 16 interleaved weight rows against activation rows `r..r+t`: row `r+i`'s 16
/// outputs go to `out[i·ostride..i·ostride+16]`.
#[allow(clippy::too_many_arguments)]
fn kernel_r16(
    isa: Isa,
    base: WeightType,
    wg: &[u8],
    a: &I8Acts,
    r: usize,
    t: usize,
    out: &mut [f32],
    ostride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && t >= AMX_MIN_ROWS {
        // SAFETY: AMX (and AVX-512 VNNI) detected; `wg` is one whole group of `nb` group blocks;
        // rows `r..r+t` (t ≤ 16) exist in `a`; `out` covers `(t-1)·ostride + 16` floats.
        unsafe {
            let (q, d, c) = (
                a.q.as_ptr().add(r * a.cols),
                a.d.as_ptr().add(r * a.nb),
                a.c.as_ptr().add(r * a.nb),
            );
            let (w, o) = (wg.as_ptr(), out.as_mut_ptr());
            macro_rules! go {
                ($g:ident) => {
                    avx512::dot_r16_amx::<avx512::$g>(w, a.nb, q, a.cols, d, c, a.nb, t, o, ostride)
                };
            }
            match base {
                WeightType::Q8_0 => go!(Q8_0),
                WeightType::IQ4NL => go!(IQ4NL),
                _ => go!(Q4_0),
            }
        }
        return;
    }
    if t > TILE {
        // A wide tile of the AMX level too narrow for AMX: in SIMD tiles.
        for r0 in (0..t).step_by(TILE) {
            let o = &mut out[r0 * ostride..];
            kernel_r16(isa, base, wg, a, r + r0, (t - r0).min(TILE), o, ostride);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: the level was detected (AVX-512 VNNI, AVX-VNNI or AVX2 as `isa` says); `wg`
        // is one whole group of `nb` group blocks; rows `r..r+t` exist in `a`; `out` covers
        // `(t-1)·ostride + 16` floats.
        unsafe {
            let (q, d, c) = (
                a.q.as_ptr().add(r * a.cols),
                a.d.as_ptr().add(r * a.nb),
                a.c.as_ptr().add(r * a.nb),
            );
            let (w, o) = (wg.as_ptr(), out.as_mut_ptr());
            macro_rules! go {
                ($g:tt, $r:literal) => {
                    match isa {
                        Isa::Avx512Vnni | Isa::Amx => avx512::dot_r16::<avx512::$g, $r>(
                            w, a.nb, q, a.cols, d, c, a.nb, o, ostride,
                        ),
                        Isa::AvxVnni => avx2::dot_r16_vnni::<avx2::$g, $r>(
                            w, a.nb, q, a.cols, d, c, a.nb, o, ostride,
                        ),
                        _ => avx2::dot_r16::<avx2::$g, $r>(
                            w, a.nb, q, a.cols, d, c, a.nb, o, ostride,
                        ),
                    }
                };
            }
            match base {
                WeightType::Q8_0 => by_tile!(t, go, Q8_0),
                WeightType::IQ4NL => by_tile!(t, go, IQ4NL),
                _ => by_tile!(t, go, Q4_0),
            }
        }
        return;
    }
    let _ = isa;
    for i in 0..t {
        for j in 0..GROUP {
            out[i * ostride + j] = scalar::dot_r16(base, wg, j, a.row(r + i));
        }
    }
}

impl I8Acts {
    /// Row `i`: quants and block scales.
    fn row(&self, i: usize) -> scalar::I8Row<'_> {
        (
            &self.q[i * self.cols..(i + 1) * self.cols],
            &self.d[i * self.nb..(i + 1) * self.nb],
        )
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
