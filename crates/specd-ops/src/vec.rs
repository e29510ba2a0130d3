//! Vector primitives with a fixed reduction order (8 lanes × 4 accumulators, then a fixed
//! horizontal sum, then a scalar tail), used by attention and the delta rule.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Dot product.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2() {
        // SAFETY: features checked; lengths equal.
        return unsafe { dot_avx2(a, b) };
    }
    let mut lanes = [0f32; 32];
    let n = a.len() / 32 * 32;
    for i in (0..n).step_by(32) {
        for l in 0..32 {
            lanes[l] += a[i + l] * b[i + l];
        }
    }
    let mut s: f32 = lanes.iter().sum();
    for i in n..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    unsafe {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (j, ac) in acc.iter_mut().enumerate() {
                let o = i + 8 * j;
                *ac = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), _mm256_loadu_ps(pb.add(o)), *ac);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }
}

/// `y += a·x`.
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// `y *= a`.
#[inline]
pub fn scale(a: f32, y: &mut [f32]) {
    for v in y.iter_mut() {
        *v *= a;
    }
}

/// One delta-rule row step, fused so the state row is read once per pass:
/// `row *= decay; u = row·k`, returns `u`.
#[inline]
pub fn decay_dot(row: &mut [f32], decay: f32, k: &[f32]) -> f32 {
    scale(decay, row);
    dot(row, k)
}

/// `row += delta·k`, returns `row·q` (the updated row read against the query).
#[inline]
pub fn update_dot(row: &mut [f32], delta: f32, k: &[f32], q: &[f32]) -> f32 {
    axpy(delta, k, row);
    dot(row, q)
}
