//! Activation functions, written out so every kernel uses the same formula.
//!
//! The slice functions ([`silu_inplace`], [`swiglu_inplace`], [`mul_silu_inplace`]) run every
//! element through one formula whatever its position or the slice's length (on AVX-512 and AVX2
//! a polynomial `exp` with masked tails, else the scalar functions below), so a row's result
//! does not depend on the batch around it. They are vectorised by hand because a verification batch
//! pays them once per row (the FFN gate, the conv and the gated norm), and libm's `expf` runs
//! them one element at a time.

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU (swish): x·σ(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Softplus with PyTorch's/llama.cpp's threshold of 20 (linear above it).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Which SiLU product a slice function computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// a = silu(a)
    Silu,
    /// a = silu(a)·b
    SiluTimes,
    /// a = a·silu(b)
    TimesSiluOf,
}

impl Op {
    /// The scalar formula (the portable path).
    fn scalar(self, x: f32, y: f32) -> f32 {
        match self {
            Op::Silu => silu(x),
            Op::SiluTimes => silu(x) * y,
            Op::TimesSiluOf => x * silu(y),
        }
    }
}

/// Runs `op` over `a` (with `b`, as long as `a`, where the op has a second operand), split over
/// the threads when it is long (a verification batch's FFN: rows × n_ff values; one row stays on
/// its thread). The pieces are multiples of 64 values, so every value goes through the same body
/// (vector or tail) as in one call, and gets the same bits.
fn apply(a: &mut [f32], b: Option<&[f32]>, op: Op) {
    if let Some(b) = b {
        assert_eq!(a.len(), b.len());
    }
    const PARALLEL_FROM: usize = 8192;
    let len = a.len();
    if len < PARALLEL_FROM || crate::parallel::n_threads() == 1 {
        return apply_on(a, b, op);
    }
    let chunk = crate::parallel::chunk_len(len, 64, 2048);
    crate::parallel::for_each_piece_mut(a, chunk, |i, a| {
        let s = i * chunk;
        apply_on(a, b.map(|b| &b[s..s + a.len()]), op);
    });
}

/// [`apply`] on one thread: the AVX-512 or AVX2 body where the CPU has one, else the scalar
/// formula.
fn apply_on(a: &mut [f32], b: Option<&[f32]>, op: Op) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa() >= crate::Isa::Avx512Vnni {
        // SAFETY: AVX-512 detected; `b`, when given, is as long as `a` (asserted above).
        unsafe { avx512::apply(a, b, op) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: AVX2 and FMA detected; `b` as above.
        unsafe { avx2::apply(a, b, op) };
        return;
    }
    for (i, x) in a.iter_mut().enumerate() {
        *x = op.scalar(*x, b.map_or(0.0, |b| b[i]));
    }
}

/// In place `a[i] = silu(a[i])`.
pub fn silu_inplace(a: &mut [f32]) {
    apply(a, None, Op::Silu);
}

/// In place `a[i] = silu(a[i]) * b[i]` (the SwiGLU FFN gate).
pub fn swiglu_inplace(a: &mut [f32], b: &[f32]) {
    apply(a, Some(b), Op::SiluTimes);
}

/// In place `a[i] = a[i] * silu(b[i])` (the gated RMSNorm's output gate).
pub fn mul_silu_inplace(a: &mut [f32], b: &[f32]) {
    apply(a, Some(b), Op::TimesSiluOf);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Op;

    /// e^x: range reduction by ln 2 and Cephes' degree-6 polynomial (max relative error about
    /// 1e-7), scaled back with `vscalefps`, which handles overflow and underflow.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp(x: __m512) -> __m512 {
        // Clamped where the result is already 0 or ∞ (`vscalefps` then saturates), so that ±∞ in
        // gives 0 / ∞ out rather than NaN.
        let x = _mm512_max_ps(
            _mm512_min_ps(x, _mm512_set1_ps(100.0)),
            _mm512_set1_ps(-104.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let p = _mm512_fmadd_ps(
            p,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        _mm512_scalef_ps(p, n)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn silu(x: __m512) -> __m512 {
        let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
    }

    /// # Safety
    /// AVX-512F available; `b`, when given, is at least as long as `a`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn apply(a: &mut [f32], b: Option<&[f32]>, op: Op) {
        let len = a.len();
        let mut i = 0;
        while i < len {
            // Full vectors and the tail go through the same arithmetic (masked lanes).
            let m: __mmask16 = if len - i >= 16 {
                0xffff
            } else {
                (1u16 << (len - i)) - 1
            };
            // SAFETY: masked lanes stay within `a` (and `b`, as long as `a`).
            unsafe {
                let pa = a.as_mut_ptr().add(i);
                let x = _mm512_maskz_loadu_ps(m, pa);
                let y = match b {
                    Some(b) => _mm512_maskz_loadu_ps(m, b.as_ptr().add(i)),
                    None => _mm512_setzero_ps(),
                };
                let r = match op {
                    Op::Silu => silu(x),
                    Op::SiluTimes => _mm512_mul_ps(silu(x), y),
                    Op::TimesSiluOf => _mm512_mul_ps(x, silu(y)),
                };
                _mm512_mask_storeu_ps(pa, m, r);
            }
            i += 16;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Op;

    /// e^x with the AVX-512 body's range reduction and polynomial; the power of two is built in
    /// the exponent bits (AVX2 has no `vscalefps`), so the input is clamped to where 2^n is a
    /// normal float: e^x saturates at about 1.6e38 and bottoms out at about 1.6e-38, which leaves
    /// SiLU unchanged at those magnitudes (x·σ(x) is x or ±0 there to f32 precision).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(88.0)),
            _mm256_set1_ps(-87.0),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let p = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        // 2^n for n in −126..=127: (n + 127) in the exponent field.
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(p, two_n)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn silu(x: __m256) -> __m256 {
        let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// # Safety
    /// AVX2 and FMA available; `b`, when given, is at least as long as `a`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn apply(a: &mut [f32], b: Option<&[f32]>, op: Op) {
        let len = a.len();
        let mut i = 0;
        while i < len {
            // Full vectors and the tail go through the same arithmetic (masked lanes).
            let left = (len - i).min(8) as i32;
            let m = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(left),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            // SAFETY: masked lanes stay within `a` (and `b`, as long as `a`).
            unsafe {
                let pa = a.as_mut_ptr().add(i);
                let x = _mm256_maskload_ps(pa, m);
                let y = match b {
                    Some(b) => _mm256_maskload_ps(b.as_ptr().add(i), m),
                    None => _mm256_setzero_ps(),
                };
                let r = match op {
                    Op::Silu => silu(x),
                    Op::SiluTimes => _mm256_mul_ps(silu(x), y),
                    Op::TimesSiluOf => _mm256_mul_ps(x, silu(y)),
                };
                _mm256_maskstore_ps(pa, m, r);
            }
            i += 8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice body: `apply`'s signature.
    type Body = fn(&mut [f32], Option<&[f32]>, Op);

    /// Every body this CPU can run, each checked on its own (the dispatch uses one per level).
    fn bodies() -> Vec<(&'static str, Body)> {
        let mut v: Vec<(&'static str, Body)> = vec![("dispatch", apply)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: features detected; the test passes `b` as long as `a`.
                v.push(("avx2", |a, b, op| unsafe { avx2::apply(a, b, op) }));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: as above.
                v.push(("avx512", |a, b, op| unsafe { avx512::apply(a, b, op) }));
            }
        }
        v
    }

    #[test]
    fn slice_functions_match_the_scalar_formulas() {
        let n = 16 * 9 + 7; // a masked tail
        let a: Vec<f32> = (0..n)
            .map(|i| (i as f32 - 70.0) * 0.37 + if i % 13 == 0 { 60.0 } else { 0.0 })
            .chain([-120.0, 95.0, 0.0, -0.0, 1e-30])
            .collect();
        let b: Vec<f32> = a.iter().map(|v| 0.5 - v * 0.21).collect();
        let close = |got: f32, want: f32| (got - want).abs() <= 2e-6 * want.abs() + 1e-30;
        for (name, body) in bodies() {
            let mut s = a.clone();
            body(&mut s, None, Op::Silu);
            let mut g = a.clone();
            body(&mut g, Some(&b), Op::SiluTimes);
            let mut m = a.clone();
            body(&mut m, Some(&b), Op::TimesSiluOf);
            for i in 0..a.len() {
                assert!(
                    close(s[i], silu(a[i])),
                    "{name}: silu({}) = {} vs {}",
                    a[i],
                    s[i],
                    silu(a[i])
                );
                assert!(close(g[i], silu(a[i]) * b[i]), "{name}: swiglu at {}", a[i]);
                assert!(close(m[i], a[i] * silu(b[i])), "{name}: gate at {}", a[i]);
            }
            // A value gets the same result wherever it sits in the slice (batch invariance).
            for (i, &v) in a.iter().enumerate() {
                let mut one = [v];
                body(&mut one, None, Op::Silu);
                assert_eq!(one[0].to_bits(), s[i].to_bits(), "{name}: position {i}");
            }
        }
    }
}
