//! Vector primitives with a fixed reduction order (8 lanes × 4 accumulators, then a fixed
//! horizontal sum, then a scalar tail), used by attention and the delta rule.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Dot product.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_kv(a, b)
}

/// [`dot`] of an `f32` vector with a cached row of any [`KvElem`] type: an `f16` row is widened
/// on load and reduced exactly as its `f32` widening would be.
#[inline]
pub fn dot_kv<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: features checked (the AVX2 level includes F16C); lengths equal.
        return unsafe { dot_avx2(a, b) };
    }
    let mut lanes = [0f32; 32];
    let n = a.len() / 32 * 32;
    for i in (0..n).step_by(32) {
        for l in 0..32 {
            lanes[l] += a[i + l] * b[i + l].to_f32();
        }
    }
    let mut s: f32 = lanes.iter().sum();
    for i in n..a.len() {
        s += a[i] * b[i].to_f32();
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// AVX2 body of [`dot`] (`b` widened on load when it is `f16`: the same result as widening it
/// first).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    unsafe {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (j, ac) in acc.iter_mut().enumerate() {
                let o = i + 8 * j;
                *ac = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), T::load8(pb.add(o)), *ac);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc[0]);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += a[i] * b[i].to_f32();
            i += 1;
        }
        s
    }
}

/// `y += a·x` (multiply, then add: elementwise, so every width rounds the same).
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: features checked; lengths equal. Without this the loop compiles to SSE, which
        // halves attention's value accumulation speed on long contexts.
        unsafe { axpy_avx2(a, x, y) };
        return;
    }
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
    unsafe {
        let n8 = y.len() / 8 * 8;
        let av = _mm256_set1_ps(a);
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let mut i = 0;
        while i < n8 {
            let r = _mm256_add_ps(
                _mm256_loadu_ps(py.add(i)),
                _mm256_mul_ps(av, _mm256_loadu_ps(px.add(i))),
            );
            _mm256_storeu_ps(py.add(i), r);
            i += 8;
        }
        for (yv, &xv) in y[n8..].iter_mut().zip(&x[n8..]) {
            *yv += a * xv;
        }
    }
}

/// `y += Σ_s w[s]·x_s` over rows `x_s = x[s·stride..][..y.len()]`, accumulated per element in
/// row order with fused multiply-adds (the scalar path uses `mul_add`, so both round alike).
///
/// Attention's value pass: `y` (a slice of the output) is held in registers while the rows
/// stream past, instead of being loaded and stored once per row, which made the value pass the
/// largest cost of an extra verification row on long contexts. The order per element is fixed
/// (row order), so how the caller blocks rows or outputs never changes the result.
#[inline]
pub fn axpy_rows<T: KvElem>(w: &[f32], x: &[T], stride: usize, y: &mut [f32]) {
    let n = y.len();
    if w.is_empty() {
        return;
    }
    assert!(
        (w.len() - 1) * stride + n <= x.len(),
        "axpy_rows: {} rows of {n} at stride {stride} exceed {} values",
        w.len(),
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: features checked; every row read is in bounds (asserted above).
        unsafe { axpy_rows_avx2(w, x, stride, y) };
        return;
    }
    for (s, &ws) in w.iter().enumerate() {
        let row = &x[s * stride..][..n];
        for (yv, &xv) in y.iter_mut().zip(row) {
            *yv = ws.mul_add(xv.to_f32(), *yv);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_rows_avx2<T: KvElem>(w: &[f32], x: &[T], stride: usize, y: &mut [f32]) {
    unsafe {
        let n = y.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let mut d = 0;
        // Eight independent accumulator chains: enough to keep both FMA pipes busy.
        while d + 64 <= n {
            let mut acc = [_mm256_setzero_ps(); 8];
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(py.add(d + 8 * j));
            }
            for (s, &ws) in w.iter().enumerate() {
                let e = _mm256_set1_ps(ws);
                let row = px.add(s * stride + d);
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(e, T::load8(row.add(8 * j)), *a);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(py.add(d + 8 * j), *a);
            }
            d += 64;
        }
        while d + 8 <= n {
            let mut a = _mm256_loadu_ps(py.add(d));
            for (s, &ws) in w.iter().enumerate() {
                a = _mm256_fmadd_ps(_mm256_set1_ps(ws), T::load8(px.add(s * stride + d)), a);
            }
            _mm256_storeu_ps(py.add(d), a);
            d += 8;
        }
        while d < n {
            let mut a = *py.add(d);
            for (s, &ws) in w.iter().enumerate() {
                a = ws.mul_add((*px.add(s * stride + d)).to_f32(), a);
            }
            *py.add(d) = a;
            d += 1;
        }
    }
}

/// An element type a KV cache may store (`f32`, or `f16` like llama.cpp's default cache).
/// [`dot_kv`] and [`axpy_rows`] read either with the same reduction order: an `f16` row is
/// widened to `f32` on load and then reduced exactly as an `f32` row would be.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Stores `src` in this type (rounding to nearest for `f16`).
    fn extend_from_f32(dst: &mut Vec<Self>, src: &[f32]);
    /// The value as `f32`.
    fn to_f32(self) -> f32;
    /// Eight values from `p`, widened to `f32`.
    ///
    /// # Safety
    /// AVX2 and F16C available; eight values readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

impl KvElem for f32 {
    fn extend_from_f32(dst: &mut Vec<f32>, src: &[f32]) {
        dst.extend_from_slice(src);
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl KvElem for half::f16 {
    fn extend_from_f32(dst: &mut Vec<half::f16>, src: &[f32]) {
        dst.extend(src.iter().map(|&x| half::f16::from_f32(x)));
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// `y *= a`.
#[inline]
pub fn scale(a: f32, y: &mut [f32]) {
    for v in y.iter_mut() {
        *v *= a;
    }
}

/// One token of the delta rule for one head whose state is `d_v` rows of `d_k` (see
/// `delta_net`): for every row, `row = decay·src_row; u = row·k; row += β(v_row − u)·k;
/// out_row = row·q`. `src` is the state before the token (`None`: `state` itself, updated in
/// place); reading it here instead of copying it into `state` first saves a pass over the state,
/// which for decode is the largest memory stream after the weights.
///
/// Rounding is the same as [`dot`] plus separate multiply and add, so the SIMD and scalar paths
/// of one machine agree with the unfused form. Every path of the recurrence runs through
/// `delta_net::gated_delta_rule`, which uses this function or a rows-outer kernel (the AVX2 one
/// built on [`delta_rows_avx2`], the AVX-512 one on the same arithmetic; tested to agree bit for
/// bit): that is what keeps single-token and batched
/// recurrences, and the rollback's replay, bit-identical.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn delta_head_step(
    src: Option<&[f32]>,
    state: &mut [f32],
    d_k: usize,
    decay: f32,
    beta: f32,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    out: Option<&mut [f32]>,
) {
    assert!(k.len() == d_k && q.len() == d_k && state.len() == v.len() * d_k);
    if let Some(s) = src {
        assert_eq!(s.len(), state.len());
    }
    if let Some(o) = &out {
        assert_eq!(o.len(), v.len());
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: features checked; lengths asserted above.
        unsafe { delta_head_step_avx2(src, state, d_k, decay, beta, k, v, q, out) };
        return;
    }
    let mut out = out;
    for (vi, row) in state.chunks_exact_mut(d_k).enumerate() {
        match src {
            Some(s) => {
                for (r, &x) in row.iter_mut().zip(&s[vi * d_k..(vi + 1) * d_k]) {
                    *r = x * decay;
                }
            }
            None => scale(decay, row),
        }
        let u = dot(row, k);
        let delta = beta * (v[vi] - u);
        axpy(delta, k, row);
        let o = dot(row, q);
        if let Some(out) = out.as_deref_mut() {
            out[vi] = o;
        }
    }
}

/// AVX2 body of [`delta_head_step`]: each row is loaded once, scaled, reduced against `k`,
/// updated and reduced against `q` while it sits in L1 ([`delta_rows_avx2`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn delta_head_step_avx2(
    src: Option<&[f32]>,
    state: &mut [f32],
    d_k: usize,
    decay: f32,
    beta: f32,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    mut out: Option<&mut [f32]>,
) {
    unsafe {
        for (vi, &v) in v.iter().enumerate() {
            let dst = state.as_mut_ptr().add(vi * d_k);
            let from = src.map_or(dst as *const f32, |s| s.as_ptr().add(vi * d_k));
            let [o] = delta_rows_avx2([from], [dst], d_k, decay, beta, k.as_ptr(), q.as_ptr(), [v]);
            if let Some(out) = out.as_deref_mut() {
                out[vi] = o;
            }
        }
    }
}

/// One token of the delta rule on AVX2 for `R` rows at once (independent dependency chains
/// that keep the pipes busy while each row waits on its own reductions): for each row,
/// `dst = decay·from; u = dst·k; dst += β(v − u)·k; returns dst·q` — [`dot_avx2`]'s reduction
/// order, multiply then add for the update (axpy's rounding). A row's arithmetic does not
/// depend on `R` or on the other rows, and the token-by-token kernel (`R = 1`) and the
/// rows-outer one (`delta_net`) share this function, so every path gives the same bits.
/// `from[r]` may equal `dst[r]` (the state updated in place).
///
/// # Safety
/// AVX2 and FMA must be available; `from[r]`, `dst[r]`, `pk`, `pq` hold `d_k` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // rows in lockstep
#[inline(always)]
pub(crate) unsafe fn delta_rows_avx2<const R: usize>(
    from: [*const f32; R],
    dst: [*mut f32; R],
    d_k: usize,
    decay: f32,
    beta: f32,
    pk: *const f32,
    pq: *const f32,
    v: [f32; R],
) -> [f32; R] {
    unsafe {
        let n32 = d_k / 32 * 32;
        let n8 = d_k / 8 * 8;
        let g = _mm256_set1_ps(decay);
        // row = decay·src; u = row·k
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i < n32 {
            for j in 0..4 {
                let o = i + 8 * j;
                let kv = _mm256_loadu_ps(pk.add(o));
                for r in 0..R {
                    let x = _mm256_mul_ps(_mm256_loadu_ps(from[r].add(o)), g);
                    _mm256_storeu_ps(dst[r].add(o), x);
                    acc[r][j] = _mm256_fmadd_ps(x, kv, acc[r][j]);
                }
            }
            i += 32;
        }
        while i < n8 {
            let kv = _mm256_loadu_ps(pk.add(i));
            for r in 0..R {
                let x = _mm256_mul_ps(_mm256_loadu_ps(from[r].add(i)), g);
                _mm256_storeu_ps(dst[r].add(i), x);
                acc[r][0] = _mm256_fmadd_ps(x, kv, acc[r][0]);
            }
            i += 8;
        }
        let mut delta = [0f32; R];
        for r in 0..R {
            let a = &acc[r];
            let mut u = hsum(_mm256_add_ps(
                _mm256_add_ps(a[0], a[1]),
                _mm256_add_ps(a[2], a[3]),
            ));
            for t in i..d_k {
                let x = *from[r].add(t) * decay;
                *dst[r].add(t) = x;
                u += x * *pk.add(t);
            }
            delta[r] = beta * (v[r] - u);
        }
        // row += delta·k (multiply, then add: axpy's rounding); o = row·q
        let dv = delta.map(|d| _mm256_set1_ps(d));
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i < n32 {
            for j in 0..4 {
                let o = i + 8 * j;
                let (kv, qv) = (_mm256_loadu_ps(pk.add(o)), _mm256_loadu_ps(pq.add(o)));
                for r in 0..R {
                    let x = _mm256_add_ps(_mm256_loadu_ps(dst[r].add(o)), _mm256_mul_ps(dv[r], kv));
                    _mm256_storeu_ps(dst[r].add(o), x);
                    acc[r][j] = _mm256_fmadd_ps(x, qv, acc[r][j]);
                }
            }
            i += 32;
        }
        while i < n8 {
            let (kv, qv) = (_mm256_loadu_ps(pk.add(i)), _mm256_loadu_ps(pq.add(i)));
            for r in 0..R {
                let x = _mm256_add_ps(_mm256_loadu_ps(dst[r].add(i)), _mm256_mul_ps(dv[r], kv));
                _mm256_storeu_ps(dst[r].add(i), x);
                acc[r][0] = _mm256_fmadd_ps(x, qv, acc[r][0]);
            }
            i += 8;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let a = &acc[r];
            let mut o = hsum(_mm256_add_ps(
                _mm256_add_ps(a[0], a[1]),
                _mm256_add_ps(a[2], a[3]),
            ));
            for t in i..d_k {
                let x = *dst[r].add(t) + delta[r] * *pk.add(t);
                *dst[r].add(t) = x;
                o += x * *pq.add(t);
            }
            out[r] = o;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unfused reference: copy, scale, dot, axpy, dot.
    fn reference(
        src: &[f32],
        d_k: usize,
        g: f32,
        b: f32,
        k: &[f32],
        v: &[f32],
        q: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let mut st = src.to_vec();
        let mut out = vec![0f32; v.len()];
        for (vi, row) in st.chunks_exact_mut(d_k).enumerate() {
            scale(g, row);
            let u = dot(row, k);
            axpy(b * (v[vi] - u), k, row);
            out[vi] = dot(row, q);
        }
        (st, out)
    }

    #[test]
    fn axpy_matches_the_scalar_loop() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let y0: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y = y0.clone();
        axpy(0.3, &x, &mut y);
        let want: Vec<f32> = y0.iter().zip(&x).map(|(&y, &x)| y + 0.3 * x).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn axpy_rows_matches_fused_scalar_loop_in_row_order() {
        // Lengths that exercise the 64-, 8- and 1-wide parts; rows at a stride wider than `y`.
        for n in [1, 7, 8, 63, 64, 72, 200, 256] {
            let stride = n + 5;
            let rows = 9;
            let x: Vec<f32> = (0..(rows - 1) * stride + n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let w: Vec<f32> = (0..rows).map(|s| (s as f32 - 3.5) / 2.3).collect();
            let y0: Vec<f32> = (0..n).map(|i| (i % 13) as f32 / 7.0).collect();
            let mut y = y0.clone();
            axpy_rows(&w, &x, stride, &mut y);
            for d in 0..n {
                let mut want = y0[d];
                for (s, &ws) in w.iter().enumerate() {
                    want = ws.mul_add(x[s * stride + d], want);
                }
                assert_eq!(y[d].to_bits(), want.to_bits(), "n {n}, element {d}");
            }
        }
    }

    /// An `f16` cache row gives exactly what the same row widened to `f32` first gives.
    #[test]
    fn f16_rows_reduce_like_their_f32_widening() {
        use half::f16;
        for n in [5, 8, 40, 64, 72, 256] {
            let q: Vec<f32> = (0..n)
                .map(|i| ((i * 29 % 53) as f32 - 26.0) / 9.0)
                .collect();
            let stride = n + 3;
            let rows = 7;
            let x: Vec<f16> = (0..(rows - 1) * stride + n)
                .map(|i| f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 17.0))
                .collect();
            let wide: Vec<f32> = x.iter().map(|h| h.to_f32()).collect();
            assert_eq!(
                dot_kv(&q, &x[..n]).to_bits(),
                dot(&q, &wide[..n]).to_bits(),
                "dot, n {n}"
            );
            let w: Vec<f32> = (0..rows).map(|s| (s as f32 - 3.0) / 2.1).collect();
            let (mut a, mut b) = (q.clone(), q.clone());
            axpy_rows(&w, &x, stride, &mut a);
            axpy_rows(&w, &wide, stride, &mut b);
            assert_eq!(a, b, "axpy_rows, n {n}");
        }
    }

    #[test]
    fn fused_delta_step_equals_unfused_bit_for_bit() {
        let mut x = 0x1234_5678u32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        };
        for d_k in [128usize, 64, 45, 8, 3] {
            let d_v = 5;
            let src: Vec<f32> = (0..d_k * d_v).map(|_| rnd()).collect();
            let k: Vec<f32> = (0..d_k).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..d_k).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..d_v).map(|_| rnd()).collect();
            let (want_st, want_out) = reference(&src, d_k, 0.93, 0.6, &k, &v, &q);
            // From a separate source buffer.
            let mut st = vec![f32::NAN; src.len()];
            let mut out = vec![0f32; d_v];
            delta_head_step(
                Some(&src),
                &mut st,
                d_k,
                0.93,
                0.6,
                &k,
                &v,
                &q,
                Some(&mut out),
            );
            assert_eq!(st, want_st, "d_k {d_k}");
            assert_eq!(out, want_out, "d_k {d_k}");
            // In place, without outputs.
            let mut st = src.clone();
            delta_head_step(None, &mut st, d_k, 0.93, 0.6, &k, &v, &q, None);
            assert_eq!(st, want_st, "d_k {d_k} in place");
        }
    }
}
