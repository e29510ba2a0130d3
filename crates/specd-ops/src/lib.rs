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
//! `docs/speculative.md` §8.

/// `$kernel::<$fmt, R>(args)` with the tile height `R = $t`, one of `$heights`, or `$last` for
/// any other value. The SIMD kernels take their number of activation rows as a constant, so that
/// each tile height is its own instantiation with its accumulators in registers; every kernel
/// family dispatches through this one match.
macro_rules! for_tile_height {
    ($t:expr, [$($h:literal),+], $last:literal, $kernel:ident::<$f:ty> $args:tt) => {
        match $t {
            $($h => $kernel::<$f, $h> $args,)+
            _ => $kernel::<$f, $last> $args,
        }
    };
}
pub(crate) use for_tile_height;

pub mod activation;
#[cfg(target_arch = "x86_64")]
mod amx;
pub mod attention;
pub mod conv;
pub mod delta_net;
pub mod huge_pages;
pub mod kquant;
pub mod legacy;
pub mod matmul;
pub mod norm;
pub mod pack;
pub mod parallel;
pub mod pool;
mod prefetch;
pub mod quant;
pub mod rope;
pub mod scratch;
pub mod vec;
pub mod weight;

pub use kquant::KFormat;
pub use legacy::LegacyFormat;
pub use matmul::{matmul, matmul_many, matmul_with};
pub use weight::{ByteSource, Weight, WeightType};

/// Errors raised by kernels on inconsistent shapes or unsupported weight types.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("unsupported weight type {0} for a native kernel")]
    UnsupportedType(String),
}

/// Instruction-set level of the kernels. Detected once per process; the answer never changes
/// during a run, so every call takes the same path (needed for batch invariance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust (`SPECD_NO_SIMD` set, or a CPU without AVX2).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with AVX-VNNI (the 256-bit `vpdpbusd` of recent Intel client CPUs and AMD Zen 4):
    /// the AVX2 kernels with the integer dot products in one instruction.
    AvxVnni,
    /// AVX-512 (F, BW, VL, DQ) with VNNI: 64-byte integer dot products in one instruction.
    /// `SPECD_NO_AVX512` forces [`Isa::Avx2`] instead.
    Avx512Vnni,
    /// AVX-512 VNNI plus AMX-INT8 tiles (the `amx` module) for the matmul tiles of many activation rows
    /// (prompt processing); few-row tiles stay on the VNNI kernels. Results are bit-identical to
    /// [`Isa::Avx512Vnni`]'s.
    Amx,
}

impl Isa {
    /// Name as `SPECD_ISA` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The highest level this CPU can run that is not above `self`.
    pub fn supported(self) -> Isa {
        Isa::available()
            .into_iter()
            .rfind(|l| *l <= self)
            .unwrap_or(Isa::Scalar)
    }

    /// Every level this CPU can run, lowest first (tests compare them).
    pub fn available() -> Vec<Isa> {
        let f = features();
        let mut v = vec![Isa::Scalar];
        if f.avx2 {
            v.push(Isa::Avx2);
            if f.avxvnni {
                v.push(Isa::AvxVnni);
            }
            if f.avx512 {
                v.push(Isa::Avx512Vnni);
                if f.amx {
                    v.push(Isa::Amx);
                }
            }
        }
        v
    }
}

/// The level the kernels use in this process: the best the CPU has, capped by `SPECD_ISA`
/// (`scalar`, `avx2`, `avxvnni`, `avx512`, `amx`), `SPECD_NO_AVX512` (plain AVX2, as a CPU without
/// AVX-512 or VNNI) or `SPECD_NO_SIMD` (scalar).
#[inline]
pub fn isa() -> Isa {
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let levels = Isa::available();
        let cap = if std::env::var_os("SPECD_NO_SIMD").is_some() {
            Isa::Scalar
        } else if std::env::var_os("SPECD_NO_AVX512").is_some() {
            Isa::Avx2
        } else {
            std::env::var("SPECD_ISA")
                .ok()
                .and_then(|v| {
                    [
                        Isa::Scalar,
                        Isa::Avx2,
                        Isa::AvxVnni,
                        Isa::Avx512Vnni,
                        Isa::Amx,
                    ]
                    .into_iter()
                    .find(|i| i.name().eq_ignore_ascii_case(v.trim()))
                })
                .unwrap_or(Isa::Amx)
        };
        levels
            .into_iter()
            .rfind(|l| *l <= cap)
            .unwrap_or(Isa::Scalar)
    })
}

/// Instruction-set extensions the kernels use, as detected on this CPU.
struct Features {
    /// AVX2 + FMA + F16C.
    avx2: bool,
    /// AVX-VNNI (VEX-encoded 256-bit `vpdpbusd`).
    avxvnni: bool,
    /// AVX-512 F/BW/VL/DQ + VNNI.
    avx512: bool,
    /// AMX-TILE + AMX-INT8, with the OS's permission to use the tiles.
    amx: bool,
}

fn features() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        Features {
            avx2: is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
            avxvnni: is_x86_feature_detected!("avxvnni"),
            avx512: is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vnni"),
            amx: amx::available(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Features {
            avx2: false,
            avxvnni: false,
            avx512: false,
            amx: false,
        }
    }
}

/// Does this process use the AVX2/FMA/F16C kernels (or better)?
#[inline]
pub fn has_avx2() -> bool {
    isa() >= Isa::Avx2
}
