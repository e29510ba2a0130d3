//! Scalar activation functions, written out so every kernel uses the same formula.

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

/// In place `a[i] = silu(a[i]) * b[i]` (the SwiGLU FFN gate).
pub fn swiglu_inplace(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x = silu(*x) * y;
    }
}
