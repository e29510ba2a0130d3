//! Every way a GGUF file can be malformed gives an error that names the key or tensor at fault,
//! never a panic — checked on files wrong in one precise way, on every truncation length, and on
//! random corruption (proptest).

mod common;

use common::{f32_bytes, sample, str_bytes, RawGguf};
use proptest::prelude::*;
use specd_gguf::{GgufError, GgufFile, TensorType};

fn parse(b: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(b.to_vec())
}

fn err(b: &[u8]) -> GgufError {
    match parse(b) {
        Ok(_) => panic!("malformed file accepted"),
        Err(e) => e,
    }
}

fn assert_names(e: &GgufError, what: &str) {
    assert!(
        e.to_string().contains(what),
        "error '{e}' does not name '{what}'"
    );
}

#[test]
fn the_sample_is_valid() {
    let (b, l) = sample().encode();
    let g = parse(&b).unwrap();
    assert_eq!(g.tensors().len(), 3);
    assert_eq!(l.data_start % 32, 0);
    assert_eq!(
        g.tensor("blk.0.ffn_up.weight").unwrap().to_f32().unwrap()[0],
        -8.0
    );
}

#[test]
fn wrong_magic() {
    let (mut b, _) = sample().encode();
    b[..4].copy_from_slice(b"GGML");
    let e = err(&b);
    assert!(matches!(e, GgufError::BadMagic(0x4c4d_4747)), "{e}");
    assert_names(&e, "magic");
    // A text file, and an empty one.
    assert!(matches!(
        err(b"hello world, not a model"),
        GgufError::BadMagic(_)
    ));
    assert!(matches!(err(b""), GgufError::Truncated { .. }));
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 0xFFFF_FFFF] {
        let mut g = sample();
        g.version = v;
        let e = err(&g.encode().0);
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e}"
        );
        assert_names(&e, &v.to_string());
    }
    let mut g = sample();
    g.version = 2; // v2 has the same layout as v3
    assert!(parse(&g.encode().0).is_ok());
}

#[test]
fn truncation_at_each_section() {
    let (b, l) = sample().encode();
    let tok_key_end = l.kv_ends[0] + 8 + "tokenizer.ggml.tokens".len() + 4;
    // (cut length, text the error must contain)
    let cuts: Vec<(usize, &str)> = vec![
        (0, "magic"),
        (3, "magic"),
        (6, "version"),
        (12, "tensor count"),
        (20, "metadata count"),
        (l.header_end + 4, "key of metadata entry 0"),
        (l.kv_ends[0] - 2, "'general.architecture'"),
        (tok_key_end + 2, "'tokenizer.ggml.tokens'"), // in the array header
        (tok_key_end + 20, "'tokenizer.ggml.tokens'"), // in the array's strings
        (l.kv_ends[1] + 5, "key of metadata entry 2"),
        (l.metadata_end + 3, "name of tensor 0"),
        (l.metadata_end + 8 + 19 + 2, "'blk.0.attn_q.weight'"), // dimension count
        (l.metadata_end + 8 + 19 + 4 + 9, "'blk.0.attn_q.weight'"), // dimensions
        (l.tensor_infos_end - 3, "'output_norm.weight'"),       // offset of the last tensor
        (l.data_start + 10, "'blk.0.attn_q.weight'"),           // in the first tensor's data
        (l.data_start + 96 + 12, "'blk.0.ffn_up.weight'"),      // in the second
        (l.data_start + 160 + 9, "'output_norm.weight'"),       // one byte short of the end
    ];
    for (n, what) in cuts {
        assert!(n < b.len());
        let e = err(&b[..n]);
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }
            ),
            "cut at {n}: unexpected kind {e:?}"
        );
        assert_names(&e, what);
    }
    // Cutting inside the padding before the data section.
    if l.data_start > l.tensor_infos_end + 1 {
        let e = err(&b[..l.tensor_infos_end + 1]);
        assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
        assert_names(&e, "'blk.0.attn_q.weight'");
    }
}

#[test]
fn every_truncation_length_is_an_error_until_the_data_is_complete() {
    let (b, l) = sample().encode();
    let g = parse(&b).unwrap();
    let last = g.tensors().last().unwrap();
    let needed = l.data_start + (last.offset + last.n_bytes()) as usize;
    for n in 0..b.len() {
        let r = parse(&b[..n]);
        // The padding after the last tensor is optional.
        assert_eq!(r.is_ok(), n >= needed, "cut at {n}: {:?}", r.err());
    }
}

#[test]
fn missing_keys_through_the_typed_getters() {
    let g = parse(&sample().encode().0).unwrap();
    let k = "llama.context_length";
    for e in [
        g.get_u32(k).unwrap_err(),
        g.get_u64(k).unwrap_err(),
        g.get_i64(k).unwrap_err(),
        g.get_f32(k).unwrap_err(),
        g.get_bool(k).unwrap_err(),
        g.get_str(k).unwrap_err(),
        g.get_array_u32(k).unwrap_err(),
        g.get_array_str(k).unwrap_err(),
        g.get_u32_per_layer(k, 2).unwrap_err(),
    ] {
        assert!(
            matches!(&e, GgufError::MissingKey { key } if key == k),
            "{e}"
        );
        assert_names(&e, k);
    }
    // Optional getters report absence as None.
    assert_eq!(g.get_opt_u32(k).unwrap(), None);
    assert_eq!(g.get_opt_f32(k).unwrap(), None);
    assert_eq!(g.get_opt_bool(k).unwrap(), None);
    assert_eq!(g.get_opt_str(k).unwrap(), None);
    let e = g.tensor("blk.9.attn_q.weight").err().unwrap();
    assert!(matches!(e, GgufError::MissingTensor { .. }));
    assert_names(&e, "blk.9.attn_q.weight");
}

#[test]
fn wrong_value_types() {
    let mut raw = sample();
    raw.kv("neg", 5, (-3i32).to_le_bytes().to_vec());
    raw.kv("big", 10, (1u64 << 40).to_le_bytes().to_vec());
    let g = parse(&raw.encode().0).unwrap();
    let cases: Vec<(GgufError, &str, &str)> = vec![
        (
            g.get_u32("general.architecture").unwrap_err(),
            "general.architecture",
            "u32",
        ),
        (
            g.get_f32("general.architecture").unwrap_err(),
            "general.architecture",
            "f32",
        ),
        (
            g.get_bool("general.architecture").unwrap_err(),
            "general.architecture",
            "bool",
        ),
        (
            g.get_str("llama.block_count").unwrap_err(),
            "llama.block_count",
            "string",
        ),
        (
            g.get_f32("llama.block_count").unwrap_err(),
            "llama.block_count",
            "f32",
        ),
        (
            g.get_u32("llama.rope.freq_base").unwrap_err(),
            "llama.rope.freq_base",
            "u32",
        ),
        (g.get_u32("neg").unwrap_err(), "neg", "u32"),
        (g.get_u32("big").unwrap_err(), "big", "u32"),
        (
            g.get_opt_u32("general.architecture").unwrap_err(),
            "general.architecture",
            "u32",
        ),
        (
            g.get_opt_str("llama.block_count").unwrap_err(),
            "llama.block_count",
            "string",
        ),
        (
            g.get_opt_bool("llama.block_count").unwrap_err(),
            "llama.block_count",
            "bool",
        ),
        (
            g.get_opt_f32("general.architecture").unwrap_err(),
            "general.architecture",
            "f32",
        ),
        (
            g.get_array_u32("llama.block_count").unwrap_err(),
            "llama.block_count",
            "array",
        ),
        (
            g.get_array_u32("tokenizer.ggml.tokens").unwrap_err(),
            "tokenizer.ggml.tokens",
            "u32",
        ),
        (
            g.get_array_i32("tokenizer.ggml.tokens").unwrap_err(),
            "tokenizer.ggml.tokens",
            "i32",
        ),
        (
            g.get_array_f32("tokenizer.ggml.tokens").unwrap_err(),
            "tokenizer.ggml.tokens",
            "f32",
        ),
        (
            g.get_array_bool("tokenizer.ggml.tokens").unwrap_err(),
            "tokenizer.ggml.tokens",
            "bool",
        ),
        (
            g.get_u32_per_layer("tokenizer.ggml.tokens", 3).unwrap_err(),
            "tokenizer.ggml.tokens",
            "u32",
        ),
    ];
    for (e, key, expected) in cases {
        assert!(matches!(e, GgufError::WrongKeyType { .. }), "{key}: {e:?}");
        assert_names(&e, key);
        assert_names(&e, expected);
    }
    assert_eq!(g.get_u64("big").unwrap(), 1 << 40);
    assert_eq!(g.get_i64("neg").unwrap(), -3);
    // Too few per-layer entries.
    let e = g.get_u32_per_layer("tokenizer.ggml.tokens", 5).unwrap_err();
    assert_names(&e, "tokenizer.ggml.tokens");
}

#[test]
fn tensor_data_out_of_bounds() {
    // Offset past the end of the file (aligned, so the bounds check is what fires).
    for off in [4096u64, u64::MAX - 31] {
        let mut g = sample();
        g.tensors[1].offset = off;
        let e = err(&g.encode().0);
        assert!(
            matches!(e, GgufError::TensorOutOfBounds { .. }),
            "{off}: {e}"
        );
        assert_names(&e, "'blk.0.ffn_up.weight'");
    }
    // Dimensions larger than the data present.
    let mut g = sample();
    g.tensors[2].dims = vec![5, 1000];
    let e = err(&g.encode().0);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    assert_names(&e, "'output_norm.weight'");
    // Dimensions whose product overflows.
    let mut g = sample();
    g.tensors[0].dims = vec![1 << 32, 1 << 32, 1 << 32];
    let e = err(&g.encode().0);
    assert_names(&e, "'blk.0.attn_q.weight'");
    // Two tensors claiming the same bytes: the one before the misplaced one is named.
    let mut g = sample();
    g.tensors[2].offset = g.tensors[0].offset;
    let e = err(&g.encode().0);
    assert_names(&e, "'blk.0.ffn_up.weight'");
    assert_names(&e, "next tensor 'output_norm.weight' starts at 0");
    // A type in the index that does not match the data (F32 read as F16: half the size, in
    // bounds) leaves a gap before the next tensor.
    let mut g = sample();
    g.tensors[0].type_id = TensorType::F16.id();
    let e = err(&g.encode().0);
    assert_names(&e, "'blk.0.attn_q.weight'");
    assert_names(&e, "does not match the data");
}

#[test]
fn bad_alignment() {
    let mut g = sample();
    g.tensors[1].offset += 8;
    let e = err(&g.encode().0);
    assert!(
        matches!(
            e,
            GgufError::TensorMisaligned {
                offset: 104,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, "'blk.0.ffn_up.weight'");
    for (tid, v) in [
        (4u32, 3u32.to_le_bytes().to_vec()),
        (4, 0u32.to_le_bytes().to_vec()),
        (5, (-32i32).to_le_bytes().to_vec()),
        (8, str_bytes("32")),
    ] {
        let mut g = sample();
        g.kv("general.alignment", tid, v);
        let e = err(&g.encode().0);
        assert_names(&e, "general.alignment");
    }
    // A valid non-default alignment is honoured.
    let mut g = RawGguf::new();
    g.alignment = 64;
    g.kv("general.alignment", 4, 64u32.to_le_bytes().to_vec());
    g.tensor("a", &[3], 0, &f32_bytes(&[1.0, 2.0, 3.0]));
    g.tensor("b", &[2], 0, &f32_bytes(&[4.0, 5.0]));
    let f = parse(&g.encode().0).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.tensor_info("b").unwrap().offset, 64);
    assert_eq!(f.tensor("b").unwrap().to_f32().unwrap(), vec![4.0, 5.0]);
    // An offset aligned for the default (32) but not for the file's 64 is rejected.
    g.tensors[1].offset = 32;
    let e = err(&g.encode().0);
    assert!(
        matches!(
            e,
            GgufError::TensorMisaligned {
                offset: 32,
                alignment: 64,
                ..
            }
        ),
        "{e}"
    );
    assert_names(&e, "'b'");
}

#[test]
fn unknown_and_unsupported_tensor_types() {
    for id in [4u32, 5, 31, 1234] {
        let mut g = sample();
        g.tensors[2].type_id = id;
        let e = err(&g.encode().0);
        assert!(
            matches!(&e, GgufError::UnknownTensorType { id: i, .. } if *i == id),
            "{e}"
        );
        assert_names(&e, "'output_norm.weight'");
        assert_names(&e, &id.to_string());
    }
    // A known type specd cannot dequantise (Q8_K: llama.cpp's activation type): loading
    // succeeds, converting names the tensor.
    let mut g = RawGguf::new();
    g.tensor(
        "blk.0.ffn_up.weight",
        &[256],
        TensorType::Q8_K.id(),
        &[0u8; 292],
    );
    let f = parse(&g.encode().0).unwrap();
    let e = f
        .tensor("blk.0.ffn_up.weight")
        .unwrap()
        .to_f32()
        .unwrap_err();
    assert!(matches!(e, GgufError::UnsupportedTensorType { .. }), "{e}");
    assert_names(&e, "'blk.0.ffn_up.weight'");
    assert_names(&e, "q8_k");
    // Rows that are not whole blocks.
    let mut g = sample();
    g.tensors[1].dims = vec![16, 2];
    let e = err(&g.encode().0);
    assert_names(&e, "'blk.0.ffn_up.weight'");
    assert_names(&e, "block");
}

#[test]
fn malformed_metadata_and_tensor_index() {
    // Unknown value type.
    let mut g = sample();
    g.kvs[2].type_id = 13;
    assert_names(&err(&g.encode().0), "'llama.block_count'");
    // Unknown array element type.
    let mut g = sample();
    g.kvs[1].value[0] = 77;
    assert_names(&err(&g.encode().0), "'tokenizer.ggml.tokens'");
    // A bool that is neither 0 nor 1.
    let mut g = sample();
    g.kv("tokenizer.ggml.add_bos_token", 7, vec![2]);
    assert_names(&err(&g.encode().0), "'tokenizer.ggml.add_bos_token'");
    // A string that is not UTF-8.
    let mut g = sample();
    g.kvs[0].value = vec![2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe];
    assert_names(&err(&g.encode().0), "'general.architecture'");
    // An array count far beyond the file: an error, not a huge allocation.
    let mut g = sample();
    g.kvs[1].value[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_names(&err(&g.encode().0), "'tokenizer.ggml.tokens'");
    // Arrays nested deeper than any real file.
    let mut nested = Vec::new();
    for _ in 0..5 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&4u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    let mut g = sample();
    g.kv("deep", 9, nested);
    assert_names(&err(&g.encode().0), "'deep'");
    // Duplicate key and duplicate tensor.
    let mut g = sample();
    g.kv_u32("llama.block_count", 3);
    let e = err(&g.encode().0);
    assert!(matches!(e, GgufError::DuplicateKey(_)), "{e}");
    assert_names(&e, "'llama.block_count'");
    let mut g = sample();
    g.tensors[2].name = "blk.0.attn_q.weight".into();
    let e = err(&g.encode().0);
    assert!(matches!(e, GgufError::DuplicateTensor(_)), "{e}");
    assert_names(&e, "'blk.0.attn_q.weight'");
    // Dimension counts and zero dimensions.
    for dims in [vec![], vec![1, 1, 1, 1, 5], vec![5, 0]] {
        let mut g = sample();
        g.tensors[2].dims = dims.clone();
        assert_names(&err(&g.encode().0), "'output_norm.weight'");
    }
    // Section counts far beyond the file: the reader runs out of entries and names where.
    let (mut b, _) = sample().encode();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_names(&err(&b), "tensor 3");
    let (mut b, _) = sample().encode();
    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_names(&err(&b), "metadata entry");
}

#[test]
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let e = GgufFile::open(&missing).err().unwrap();
    assert!(matches!(e, GgufError::Io { .. }));
    assert_names(&e, "no-such-model.gguf");
    // A directory.
    assert!(GgufFile::open(dir.path()).is_err());
    // An empty file (zero-length memory map).
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    // The same truncated bytes through the memory map as through memory.
    let (b, l) = sample().encode();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &b[..l.data_start + 10]).unwrap();
    let e = GgufFile::open(&cut).err().unwrap();
    assert_names(&e, "'blk.0.attn_q.weight'");
}

/// Uses everything a loader would use, so a corrupt file that parses is also read in full.
fn exercise(g: &GgufFile) {
    for (k, _) in g.metadata() {
        let _ = (g.get_u32(k), g.get_f32(k), g.get_str(k), g.get_bool(k));
        let _ = (
            g.get_array_u32(k),
            g.get_array_str(k),
            g.get_u32_per_layer(k, 4),
        );
    }
    for t in g.tensors() {
        let v = g.tensor(&t.name).unwrap();
        assert_eq!(v.bytes().len() as u64, t.n_bytes());
        if t.ttype.can_dequantize() {
            assert_eq!(v.to_f32().unwrap().len() as u64, t.n_elements());
        } else {
            assert!(v.to_f32().is_err());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Random byte overwrites (biased towards the header and index, where the parser makes
    /// decisions) and truncation never panic the reader.
    #[test]
    fn corruption_never_panics(
        edits in prop::collection::vec((0.0f64..1.0, any::<u8>(), any::<bool>()), 1..8),
        cut in prop::option::of(0.0f64..1.0),
    ) {
        let (mut b, l) = sample().encode();
        for (pos, val, in_index) in edits {
            let span = if in_index { l.data_start } else { b.len() };
            let i = ((pos * span as f64) as usize).min(span - 1);
            b[i] = val;
        }
        if let Some(c) = cut {
            b.truncate((c * b.len() as f64) as usize);
        }
        if let Ok(g) = GgufFile::from_bytes(b) {
            exercise(&g);
        }
    }

    /// Plausible-but-wrong values in the fields that drive allocation and offsets.
    #[test]
    fn corrupt_fields_never_panic(which in 0usize..6, v in any::<u64>()) {
        let mut g = sample();
        match which {
            0 => g.tensors[0].offset = v,
            1 => g.tensors[1].dims[0] = v,
            2 => g.tensors[2].dims = vec![v % 4096 + 1, v >> 52],
            3 => g.tensors[0].type_id = (v % 64) as u32,
            4 => {
                g.kv("general.alignment", 10, v.to_le_bytes().to_vec());
            }
            _ => g.kvs[1].value[4..12].copy_from_slice(&v.to_le_bytes()),
        };
        if let Ok(f) = GgufFile::from_bytes(g.encode().0) {
            exercise(&f);
        }
    }
}
