//! CPU compute kernels for specd.
//!
//! Every kernel here obeys one rule that the whole engine depends on: **the value computed for one
//! output element does not depend on how many other rows are processed at the same time.** A token
//! decoded alone, as one row of a verification batch, or next to other sequences' rows gets
//! bit-identical results, which is what makes speculative output equal plain output. Concretely:
//! one fixed reduction order per output element (no batch-size-dependent blocking of the reduction
//! dimension), threads split only *independent* output elements, and multi-row tiles run the same
//! per-element instruction sequence as single rows.
//!
//! The matmul kernels are written by hand (not taken from candle) because they must (a) read the
//! quantised weights once for all rows of a small batch, so a verification batch costs about one
//! plain step, and (b) keep the reduction order fixed across batch shapes. See
//! `shared/docs/speculative.md` §8.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod delta_net;
pub mod matmul;
pub mod norm;
pub mod parallel;
pub mod quant;
pub mod rope;
pub mod vec;
pub mod weight;

pub use matmul::matmul;
pub use weight::{ByteSource, Weight, WeightType};

/// Errors raised by kernels on inconsistent shapes or unsupported weight types.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("unsupported weight type {0} for a native kernel")]
    UnsupportedType(String),
}

/// Does this CPU have the AVX2/FMA/F16C kernels? Checked once; the answer never changes during
/// a run, so every call takes the same path (needed for batch invariance).
#[inline]
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::env::var_os("SPECD_NO_SIMD").is_none()
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
