//! The model file's type (`general.file_type`, llama.cpp's `llama_ftype`) as llama.cpp names
//! it: "all F32", "Q4_K - Medium", … — what llama-server shows as `ftype` in `/v1/models`.

use crate::{GgufFile, TensorType};
use std::collections::HashMap;

/// llama.cpp's name of a `general.file_type` value.
pub fn file_type_name(ftype: u32) -> &'static str {
    match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        _ => "unknown, may not work",
    }
}

/// The file type's name: from `general.file_type`, else guessed from the type most tensors
/// have and prefixed with "(guessed) ", as llama.cpp does.
pub fn file_type_of(g: &GgufFile) -> String {
    if let Ok(t) = g.get_u32("general.file_type") {
        return file_type_name(t).to_string();
    }
    let mut count: HashMap<TensorType, usize> = HashMap::new();
    let mut most: Option<(TensorType, usize)> = None;
    for t in g.tensors() {
        let n = count.entry(t.ttype).or_default();
        *n += 1;
        if most.is_none_or(|(_, m)| *n > m) {
            most = Some((t.ttype, *n));
        }
    }
    use TensorType::*;
    let ftype = match most.map(|(t, _)| t) {
        Some(F16) => 1,
        Some(BF16) => 32,
        Some(Q4_0) => 2,
        Some(Q4_1) => 3,
        Some(Q5_0) => 8,
        Some(Q5_1) => 9,
        Some(Q8_0) => 7,
        Some(Q2_K) => 10,
        Some(Q3_K) => 12,
        Some(Q4_K) => 15,
        Some(Q5_K) => 17,
        Some(Q6_K) => 18,
        Some(TQ1_0) => 36,
        Some(TQ2_0) => 37,
        Some(IQ2_XXS) => 19,
        Some(IQ2_XS) => 20,
        Some(IQ2_S) => 28,
        Some(IQ3_XXS) => 23,
        Some(IQ1_S) => 24,
        Some(IQ1_M) => 31,
        Some(IQ4_NL) => 25,
        Some(IQ4_XS) => 30,
        Some(IQ3_S) => 26,
        _ => 0,
    };
    format!("(guessed) {}", file_type_name(ftype))
}
