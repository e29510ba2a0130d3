//! Models written in every mix: the file holds the planned type of every tensor and the
//! llama.cpp file type, and every quantised tensor decodes to the weights of the F32 model of the
//! same seed within its type's error.

use specd_gguf::{GgufFile, TensorType};
use specd_testmodel::{tensor_types, write_model, Mix, Preset, TestModelSpec, WeightStyle};

/// Relative RMS error a tensor of type `t` may show against the F32 weights (the block formats'
/// ~4-bit error is 0.07–0.08 on such data; see specd-gguf's round-trip bounds).
fn bound(t: TensorType) -> f32 {
    match t {
        TensorType::F32 => 0.0,
        TensorType::F16 => 1e-3,
        TensorType::Q2_K => 0.35,
        TensorType::Q3_K => 0.19,
        TensorType::Q8_0 => 0.01,
        TensorType::Q6_K => 0.03,
        TensorType::Q5_K | TensorType::Q5_0 | TensorType::Q5_1 => 0.06,
        _ => 0.1,
    }
}

fn check(spec: &TestModelSpec, reference: &GgufFile, dir: &std::path::Path) {
    let label = format!(
        "{} {:?}",
        spec.name,
        spec.mix
            .map(|m| m.name().to_string())
            .unwrap_or(spec.wtype.name())
    );
    let path = dir.join("m.gguf");
    write_model(spec, &path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let plan = tensor_types(spec).unwrap();
    assert_eq!(g.tensors().len(), plan.len(), "{label}");
    let ft = g.get_u32("general.file_type").unwrap();
    assert_eq!(ft, specd_testmodel::quant_of(spec).file_type(), "{label}");
    for (info, (name, t)) in g.tensors().iter().zip(&plan) {
        assert_eq!(&info.name, name, "{label}");
        assert_eq!(info.ttype, *t, "{label}: {name}");
        let got = g.tensor(name).unwrap().to_f32().unwrap();
        let want = reference.tensor(name).unwrap().to_f32().unwrap();
        let se: f32 = got.iter().zip(&want).map(|(a, b)| (a - b) * (a - b)).sum();
        let ss: f32 = want.iter().map(|a| a * a).sum();
        let rel = (se / ss).sqrt();
        assert!(
            rel <= bound(*t),
            "{label}: {name} ({t}) relative RMSE {rel}"
        );
    }
}

#[test]
fn every_mix_and_type_writes_what_it_plans() {
    let dir = tempfile::tempdir().unwrap();
    for (preset, style) in [
        (Preset::Qwen35Tiny, WeightStyle::Varied),
        (Preset::Qwen35Small, WeightStyle::Repetitive),
        (Preset::LlamaTiny, WeightStyle::Varied),
    ] {
        let mut base = TestModelSpec::preset(preset);
        base.style = style;
        base.mtp = preset == Preset::Qwen35Tiny;
        let f32_path = dir.path().join("f32.gguf");
        write_model(&base, &f32_path).unwrap();
        let reference = GgufFile::open(&f32_path).unwrap();
        for m in Mix::ALL {
            let spec = TestModelSpec {
                mix: Some(m),
                ..base.clone()
            };
            check(&spec, &reference, dir.path());
        }
        for t in [
            TensorType::Q4_1,
            TensorType::Q5_0,
            TensorType::Q2_K,
            TensorType::Q3_K,
            TensorType::Q4_K,
            TensorType::IQ4_NL,
            TensorType::IQ4_XS,
        ] {
            let spec = TestModelSpec {
                wtype: t,
                ..base.clone()
            };
            check(&spec, &reference, dir.path());
        }
    }
}

#[test]
fn mixed_files_use_the_fallbacks_on_small_rows() {
    // qwen35-tiny's rows are 64 or 128 long: no 256-block type fits.
    let spec = TestModelSpec {
        mix: Some(Mix::Q4KXl),
        ..TestModelSpec::preset(Preset::Qwen35Tiny)
    };
    let plan = tensor_types(&spec).unwrap();
    let has = |t| plan.iter().any(|(_, x)| *x == t);
    assert!(has(TensorType::Q5_0) && has(TensorType::IQ4_NL) && has(TensorType::Q8_0));
    assert!(!has(TensorType::Q4_K) && !has(TensorType::IQ4_XS) && !has(TensorType::Q6_K));
}

#[test]
fn qwen35_9b_plans_q4_k_m_without_fallbacks() {
    // The 9B preset is never written in tests (~5.5 GB); its plan is checked instead.
    let spec = TestModelSpec::preset(Preset::Qwen35_9B);
    assert_eq!(spec.mix, Some(Mix::Q4_K_M));
    let plan = tensor_types(&spec).unwrap();
    let count = |t| plan.iter().filter(|(_, x)| *x == t).count();
    // 24 DeltaNet layers × 5 matrices (qkv, gate, beta, alpha, out; conv1d stays F32) + 8
    // attention layers × 4 + 32 × 3 FFN + embedding + head.
    assert_eq!(
        count(TensorType::Q4_K) + count(TensorType::Q6_K),
        24 * 5 + 8 * 4 + 32 * 3 + 2
    );
    // Q6_K: the head, and attn_v/attn_qkv and ffn_down in the 16 use_more_bits layers of 32.
    assert_eq!(count(TensorType::Q6_K), 1 + 16 + 16);
    assert!(plan
        .iter()
        .all(|(_, t)| matches!(t, TensorType::F32 | TensorType::Q4_K | TensorType::Q6_K)));
}

#[test]
fn qwen35moe_35b_a3b_plans_q4_k_m() {
    // Never written in tests (~20 GB and ~2 GB); their plans are checked instead.
    for (preset, layers) in [
        (Preset::Qwen35Moe35bA3b, 40usize),
        (Preset::Qwen35Moe35bA3b4l, 4),
    ] {
        let spec = TestModelSpec::preset(preset);
        assert_eq!(spec.mix, Some(Mix::Q4_K_M));
        assert_eq!(spec.n_layer, layers);
        let plan = tensor_types(&spec).unwrap();
        let ty = |name: &str| plan.iter().find(|(n, _)| n == name).unwrap().1;
        for i in 0..layers {
            let more = specd_testmodel::mix::use_more_bits(i, layers);
            let down = if more {
                TensorType::Q6_K
            } else {
                TensorType::Q4_K
            };
            // The routed and the shared down projections of a layer are promoted together.
            assert_eq!(ty(&format!("blk.{i}.ffn_down_exps.weight")), down, "{i}");
            assert_eq!(ty(&format!("blk.{i}.ffn_down_shexp.weight")), down, "{i}");
            for t in [
                "ffn_gate_exps",
                "ffn_up_exps",
                "ffn_gate_shexp",
                "ffn_up_shexp",
            ] {
                assert_eq!(
                    ty(&format!("blk.{i}.{t}.weight")),
                    TensorType::Q4_K,
                    "{i} {t}"
                );
            }
            assert_eq!(ty(&format!("blk.{i}.ffn_gate_inp.weight")), TensorType::F32);
        }
        // Row lengths 2048, 512, 4096 and 8192 fit every K-quant block: no fallback types.
        assert!(plan
            .iter()
            .all(|(_, t)| matches!(t, TensorType::F32 | TensorType::Q4_K | TensorType::Q6_K)));
    }
}
