//! specd's block (de)quantisation against an independent implementation: the fixtures in
//! `tests/fixtures/` hold raw blocks and gguf-py's (llama.cpp's numpy library) dequantisation of
//! them, written by `scripts/gen_kquant_fixtures.py`.
//!
//! The comparison is bit-exact. Both sides compute each value with the same f32 operations in the
//! same order (`(d·sc)·q − dmin·m` and the like, no fused multiply-add: numpy never fuses and Rust
//! does not contract `a*b+c` into an FMA), so any difference is a real decoding bug, not rounding.

use specd_gguf::quant::{dequantize, quantize};
use specd_gguf::TensorType;
use std::path::PathBuf;

fn fixture(name: &str) -> Option<Vec<u8>> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(p).ok()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every type issue 2 requires, plus the other formats specd dequantises (the last ten only to
/// convert them at load: issue 15).
const TYPES: [&str; 24] = [
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "bf16", "f16",
    "iq4_nl", "iq4_xs", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
    "tq1_0", "tq2_0", "mxfp4",
];

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for name in TYPES {
        let t = TensorType::parse(name).unwrap();
        let blocks = fixture(&format!("{name}.blocks"))
            .unwrap_or_else(|| panic!("fixture {name}.blocks missing: run gen_kquant_fixtures.py"));
        let expected = f32s(&fixture(&format!("{name}.expected.f32")).unwrap());
        let (bs, ts) = t.block();
        assert_eq!(blocks.len() % ts, 0, "{name}: partial block in fixture");
        assert_eq!(expected.len(), blocks.len() / ts * bs, "{name}: sizes");
        assert!(
            expected.len() >= 200,
            "{name}: fixture too small to mean much"
        );

        let mut got = vec![f32::NAN; expected.len()];
        dequantize(t, &blocks, &mut got).unwrap();
        let mut bad = Vec::new();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            if g.to_bits() != e.to_bits() {
                bad.push(format!(
                    "[{i}] (block {}) specd {g:e} gguf-py {e:e}",
                    i / bs
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "{name}: {} of {} values differ, first: {:?}",
            bad.len(),
            got.len(),
            &bad[..bad.len().min(8)]
        );
        // The fixtures must exercise the sign and magnitude range, not just zeros.
        assert!(expected.iter().any(|v| *v > 0.0) && expected.iter().any(|v| *v < 0.0));
        assert!(t.can_dequantize(), "{name}");
    }
}

#[test]
fn quantize_matches_gguf_py_bytes() {
    // Types both gguf-py and specd quantise: ggml's reference rounding, so the bytes must be equal
    // (llama.cpp must read files specd writes exactly as specd does).
    for name in ["q8_0", "q4_0", "bf16"] {
        let t = TensorType::parse(name).unwrap();
        let input = f32s(&fixture(&format!("{name}.input.f32")).unwrap());
        let blocks = fixture(&format!("{name}.blocks")).unwrap();
        let mine = quantize(t, &input).unwrap();
        assert!(!mine.is_empty());
        assert_eq!(
            mine[..],
            blocks[..mine.len()],
            "{name}: specd's quantisation differs from gguf-py's"
        );
    }
}

#[test]
fn dequantize_rejects_wrong_sizes_without_panicking() {
    for name in TYPES {
        let t = TensorType::parse(name).unwrap();
        let blocks = fixture(&format!("{name}.blocks")).unwrap();
        let (bs, _) = t.block();
        let n = blocks.len() / t.type_size() * bs;
        // One byte short, one value too many, a partial block of output.
        let mut out = vec![0f32; n];
        assert!(dequantize(t, &blocks[..blocks.len() - 1], &mut out).is_err());
        let mut out = vec![0f32; n + bs];
        assert!(dequantize(t, &blocks, &mut out).is_err());
        if bs > 1 {
            let mut out = vec![0f32; n - 1];
            assert!(dequantize(t, &blocks, &mut out).is_err());
        }
    }
}

#[test]
fn unsupported_types_are_errors() {
    for t in [TensorType::Q8_1, TensorType::Q8_K] {
        assert!(!t.can_dequantize());
        let (bs, ts) = t.block();
        let mut out = vec![0f32; bs];
        let e = dequantize(t, &vec![0u8; ts], &mut out).unwrap_err();
        assert!(e.to_string().contains(&t.name()), "{e}");
    }
    // The types specd only decodes are not written.
    for t in [TensorType::IQ2_XXS, TensorType::TQ2_0, TensorType::MXFP4] {
        assert!(t.can_dequantize() && !t.can_quantize());
        let e = quantize(t, &[0.0; 256]).unwrap_err();
        assert!(e.to_string().contains(&t.name()), "{e}");
    }
}
