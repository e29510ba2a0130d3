//! Writer → reader round trips: metadata of every value type and tensors of every type, checked
//! against values written independently (the byte-level encoder in `common`) and, for quantised
//! types, against the error a correct quantiser may make.

mod common;

use common::{str_bytes, RawGguf};
use half::{bf16, f16};
use specd_gguf::quant::{dequantize, quantize};
use specd_gguf::{GgufError, GgufFile, GgufValue, GgufWriter, TensorType, ValueType};

/// Metadata covering every value type, empty and non-ASCII strings, and arrays of every kind.
fn all_values() -> Vec<(&'static str, GgufValue)> {
    use GgufValue as V;
    let arr = |t: ValueType, v: Vec<GgufValue>| V::Array(t, v);
    vec![
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(60_000)),
        ("t.i16", V::I16(-30_000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(-1.5e-7)),
        ("t.bool_true", V::Bool(true)),
        ("t.bool_false", V::Bool(false)),
        ("t.string", V::String("héllo ✓ \"quoted\"\n".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(-1.0e300)),
        ("a.u8", arr(ValueType::U8, vec![V::U8(0), V::U8(255)])),
        ("a.i8", arr(ValueType::I8, vec![V::I8(-128), V::I8(127)])),
        ("a.u16", arr(ValueType::U16, vec![V::U16(1), V::U16(65535)])),
        ("a.i16", arr(ValueType::I16, vec![V::I16(-1)])),
        (
            "a.u32",
            arr(ValueType::U32, vec![V::U32(7), V::U32(8), V::U32(9)]),
        ),
        (
            "a.i32",
            arr(ValueType::I32, vec![V::I32(11), V::I32(-11), V::I32(0)]),
        ),
        (
            "a.f32",
            arr(ValueType::F32, vec![V::F32(0.5), V::F32(f32::MAX)]),
        ),
        (
            "a.bool",
            arr(
                ValueType::Bool,
                vec![V::Bool(true), V::Bool(false), V::Bool(true)],
            ),
        ),
        (
            "a.string",
            arr(
                ValueType::String,
                vec![
                    V::String("Ġthe".into()),
                    V::String(String::new()),
                    V::String("<|im_end|>".into()),
                ],
            ),
        ),
        ("a.u64", arr(ValueType::U64, vec![V::U64(1 << 40)])),
        ("a.i64", arr(ValueType::I64, vec![V::I64(-(1 << 40))])),
        (
            "a.f64",
            arr(ValueType::F64, vec![V::F64(std::f64::consts::PI)]),
        ),
        ("a.empty", arr(ValueType::U32, vec![])),
        (
            "a.nested",
            arr(
                ValueType::Array,
                vec![
                    arr(ValueType::I32, vec![V::I32(1), V::I32(2)]),
                    arr(ValueType::I32, vec![]),
                ],
            ),
        ),
    ]
}

/// The GGUF encoding of a value, written from the format description (not by the writer).
fn encode(v: &GgufValue) -> (u32, Vec<u8>) {
    use GgufValue as V;
    match v {
        V::U8(x) => (0, vec![*x]),
        V::I8(x) => (1, vec![*x as u8]),
        V::U16(x) => (2, x.to_le_bytes().to_vec()),
        V::I16(x) => (3, x.to_le_bytes().to_vec()),
        V::U32(x) => (4, x.to_le_bytes().to_vec()),
        V::I32(x) => (5, x.to_le_bytes().to_vec()),
        V::F32(x) => (6, x.to_le_bytes().to_vec()),
        V::Bool(x) => (7, vec![u8::from(*x)]),
        V::String(s) => (8, str_bytes(s)),
        V::Array(t, items) => {
            let mut b = (*t as u32).to_le_bytes().to_vec();
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                b.extend(encode(it).1);
            }
            (9, b)
        }
        V::U64(x) => (10, x.to_le_bytes().to_vec()),
        V::I64(x) => (11, x.to_le_bytes().to_vec()),
        V::F64(x) => (12, x.to_le_bytes().to_vec()),
    }
}

/// Deterministic pseudo-random normal-ish values (sum of uniforms).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| ((0..4).map(|_| next()).sum::<f32>() - 2.0) * scale * 1.7)
        .collect()
}

struct Case {
    name: &'static str,
    dims: Vec<u64>,
    ttype: TensorType,
    input: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let c = |name, dims: &[u64], ttype, seed| {
        let n = dims.iter().product::<u64>() as usize;
        Case {
            name,
            dims: dims.to_vec(),
            ttype,
            input: values(n, seed, 0.3),
        }
    };
    vec![
        c("f32.1d", &[7], TensorType::F32, 1),
        c("f32.4d", &[3, 2, 2, 2], TensorType::F32, 2),
        c("f16.2d", &[5, 3], TensorType::F16, 3),
        c("bf16.3d", &[4, 3, 2], TensorType::BF16, 4),
        c("q8_0.2d", &[64, 3], TensorType::Q8_0, 5),
        c("q4_0.2d", &[96, 2], TensorType::Q4_0, 6),
        c("q4_k.2d", &[256, 3], TensorType::Q4_K, 7),
        c("q5_k.2d", &[512, 2], TensorType::Q5_K, 8),
        c("q6_k.2d", &[256, 3], TensorType::Q6_K, 9),
        c("q4_1.2d", &[64, 3], TensorType::Q4_1, 10),
        c("q5_0.2d", &[96, 2], TensorType::Q5_0, 11),
        c("q5_1.2d", &[64, 3], TensorType::Q5_1, 12),
        c("q2_k.2d", &[256, 3], TensorType::Q2_K, 13),
        c("q3_k.2d", &[256, 3], TensorType::Q3_K, 14),
        c("iq4_nl.2d", &[128, 3], TensorType::IQ4_NL, 15),
        c("iq4_xs.2d", &[512, 2], TensorType::IQ4_XS, 16),
    ]
}

/// Root mean square error of a quantised type's round trip, relative to the data's RMS, that a
/// correct quantiser stays under on this data. Uniform rounding over a block's ±3σ range gives
/// step/√12: 4 bits ≈ 0.1, 5 bits ≈ 0.05, 6 bits ≈ 0.025, 8 bits ≈ 0.007 (the K-quants' fitted
/// scales and mins do a little better); f16 / bf16 round to 11 / 8 significant bits. Measured:
/// Q4_0 0.080, Q4_1 0.075, Q5_0 0.043, Q5_1 0.038, Q2_K 0.28, Q3_K 0.15, Q4_K 0.073, Q5_K 0.035,
/// Q6_K 0.018, Q8_0 0.0052, IQ4_NL 0.071, IQ4_XS 0.072, F16 1.6e-4, BF16 1.1e-3 — the bounds
/// leave ~25 % headroom, so a quantiser that loses one bit fails.
fn max_rel_rmse(t: TensorType) -> f32 {
    match t {
        TensorType::F32 => 0.0,
        TensorType::F16 => 2e-4,
        TensorType::BF16 => 1.4e-3,
        TensorType::Q8_0 => 0.0065,
        TensorType::Q4_0 => 0.10,
        TensorType::Q4_K => 0.09,
        TensorType::Q5_K => 0.045,
        TensorType::Q6_K => 0.022,
        TensorType::Q4_1 => 0.094,
        TensorType::Q5_0 => 0.055,
        TensorType::Q5_1 => 0.048,
        TensorType::Q2_K => 0.35,
        TensorType::Q3_K => 0.19,
        TensorType::IQ4_NL => 0.09,
        TensorType::IQ4_XS => 0.09,
        t => panic!("no bound for {t}"),
    }
}

fn build_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add(k, v);
    }
    for c in cases() {
        w.add_tensor_f32(c.name, &c.dims, c.ttype, &c.input)
            .unwrap();
    }
    w
}

#[test]
fn writer_output_is_the_format_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    build_writer().write(&path).unwrap();
    let written = std::fs::read(&path).unwrap();

    let mut raw = RawGguf::new();
    for (k, v) in all_values() {
        let (t, b) = encode(&v);
        raw.kv(k, t, b);
    }
    for c in cases() {
        let bytes = quantize(c.ttype, &c.input).unwrap();
        raw.tensor(c.name, &c.dims, c.ttype.id(), &bytes);
    }
    raw.pad_data();
    let (expected, _) = raw.encode();
    assert_eq!(written.len(), expected.len());
    let first_diff = written.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(
        first_diff, None,
        "writer output differs from the GGUF layout"
    );
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

fn check_file(g: &GgufFile) {
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment(), 32);
    let want = all_values();
    assert_eq!(g.metadata().len(), want.len());
    for ((k, v), (wk, wv)) in g.metadata().iter().zip(&want) {
        assert_eq!(k, wk);
        // NaN-free, so `==` is exact equality of every value.
        assert_eq!(v, wv, "{k}");
        assert_eq!(g.get(k), Some(v));
    }
    // Typed getters on the values they fit.
    assert_eq!(g.get_u32("t.u8").unwrap(), 200);
    assert_eq!(g.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_i64("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(g.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get_f32("t.f32").unwrap(), -1.5e-7);
    assert_eq!(g.get_f32("t.f64").unwrap(), f32::NEG_INFINITY); // −1e300 does not fit an f32
    assert!(g.get_bool("t.bool_true").unwrap());
    assert!(!g.get_bool("t.bool_false").unwrap());
    assert_eq!(g.get_str("t.string").unwrap(), "héllo ✓ \"quoted\"\n");
    assert_eq!(g.get_str("t.empty_string").unwrap(), "");
    assert_eq!(
        g.get_opt_str("t.string").unwrap(),
        Some("héllo ✓ \"quoted\"\n")
    );
    assert_eq!(g.get_opt_u32("t.u16").unwrap(), Some(60_000));
    assert_eq!(g.get_opt_f32("t.f32").unwrap(), Some(-1.5e-7));
    assert_eq!(g.get_opt_bool("t.bool_true").unwrap(), Some(true));
    assert_eq!(g.get_array_u32("a.u32").unwrap(), vec![7, 8, 9]);
    assert_eq!(g.get_array_u32("a.u8").unwrap(), vec![0, 255]);
    assert_eq!(g.get_array_i32("a.i32").unwrap(), vec![11, -11, 0]);
    assert_eq!(g.get_array_i32("a.i8").unwrap(), vec![-128, 127]);
    assert_eq!(g.get_array_f32("a.f32").unwrap(), vec![0.5, f32::MAX]);
    assert_eq!(g.get_array_bool("a.bool").unwrap(), vec![true, false, true]);
    assert_eq!(
        g.get_array_str("a.string").unwrap(),
        vec!["Ġthe".to_string(), String::new(), "<|im_end|>".to_string()]
    );
    assert!(g.get_array_u32("a.empty").unwrap().is_empty());
    assert_eq!(
        g.get_u32_per_layer("t.u32", 3).unwrap(),
        vec![4_000_000_000; 3]
    );
    assert_eq!(g.get_u32_per_layer("a.u32", 3).unwrap(), vec![7, 8, 9]);

    let cs = cases();
    assert_eq!(g.tensors().len(), cs.len());
    let mut prev_end = 0;
    for (info, c) in g.tensors().iter().zip(&cs) {
        assert_eq!(info.name, c.name);
        assert_eq!(info.dims, c.dims);
        assert_eq!(info.ttype, c.ttype);
        assert_eq!(info.offset % 32, 0, "{}: unaligned", c.name);
        assert!(info.offset >= prev_end, "{}: overlaps", c.name);
        prev_end = info.offset + info.n_bytes();
        let t = g.tensor(c.name).unwrap();
        let stored = quantize(c.ttype, &c.input).unwrap();
        assert_eq!(t.bytes(), &stored[..], "{}: bytes", c.name);
        assert_eq!(&t.bytes_arc()[..], &stored[..], "{}: shared bytes", c.name);
        let back = t.to_f32().unwrap();
        assert_eq!(back.len(), c.input.len());
        match c.ttype {
            TensorType::F32 => assert_eq!(back, c.input),
            TensorType::F16 => {
                let want: Vec<f32> = c.input.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
                assert_eq!(back, want);
            }
            TensorType::BF16 => {
                let want: Vec<f32> = c
                    .input
                    .iter()
                    .map(|&x| bf16::from_f32(x).to_f32())
                    .collect();
                assert_eq!(back, want);
            }
            _ => {}
        }
        let se: f32 = back
            .iter()
            .zip(&c.input)
            .map(|(a, b)| (a - b) * (a - b))
            .sum();
        let ss: f32 = c.input.iter().map(|a| a * a).sum();
        let rel = (se / ss).sqrt();
        assert!(
            rel <= max_rel_rmse(c.ttype),
            "{}: relative RMSE {rel} above {}",
            c.name,
            max_rel_rmse(c.ttype)
        );
        // The per-block bounds of the two formats llama.cpp quantises activations to.
        if matches!(c.ttype, TensorType::Q8_0 | TensorType::Q4_0) {
            for (bi, (x, y)) in c.input.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Q8_0: step amax/127, error ≤ step/2; Q4_0: step amax/8, the side opposite the
                // extreme clamps at +7, so error ≤ one step. Plus f16 rounding of the scale.
                let step = if c.ttype == TensorType::Q8_0 {
                    amax / 127.0 * 0.5
                } else {
                    amax / 8.0
                };
                let tol = step * 1.01 + amax * 2f32.powi(-10);
                for (a, b) in x.iter().zip(y) {
                    assert!((a - b).abs() <= tol, "{} block {bi}: {a} vs {b}", c.name);
                }
            }
        }
    }
    assert!(g.has_tensor("q4_k.2d") && !g.has_tensor("nope"));
    assert!(g.tensor_opt("nope").is_none());
    assert!(g.expect_tensor("q8_0.2d", &[64, 3]).is_ok());
}

#[test]
fn round_trip_through_a_file_and_through_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    build_writer().write(&path).unwrap();
    check_file(&GgufFile::open(&path).unwrap());
    check_file(&GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap());
}

#[test]
fn raw_tensors_of_every_dequantisable_type_round_trip() {
    // Blocks straight from the gguf-py fixtures, stored with `add_tensor`: the reader must hand
    // back the same bytes and dequantise them to gguf-py's values.
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let names = [
        "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "iq4_nl",
        "iq4_xs",
    ];
    let mut w = GgufWriter::new();
    let mut want = Vec::new();
    for n in names {
        let t = TensorType::parse(n).unwrap();
        let blocks = std::fs::read(fixtures.join(format!("{n}.blocks"))).unwrap();
        let exp = std::fs::read(fixtures.join(format!("{n}.expected.f32"))).unwrap();
        let (bs, ts) = t.block();
        let nb = blocks.len() / ts;
        // Two rows of nb/2 blocks.
        let blocks = blocks[..nb / 2 * 2 * ts].to_vec();
        let dims = [(nb / 2 * bs) as u64, 2];
        w.add_tensor(&format!("{n}.w"), &dims, t, blocks.clone())
            .unwrap();
        want.push((n, t, blocks, exp[..nb / 2 * 2 * bs * 4].to_vec()));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.gguf");
    w.write(&path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    for (n, t, blocks, exp) in want {
        let v = g.tensor(&format!("{n}.w")).unwrap();
        assert_eq!(v.info().ttype, t);
        assert_eq!(v.bytes(), &blocks[..]);
        let got: Vec<u8> = v
            .to_f32()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(got, exp, "{n}");
    }
}

#[test]
fn quantised_round_trip_is_stable() {
    // Dequantising and quantising again reproduces the same blocks (the quantisers pick the
    // scale from the block's own values, which are now exactly representable).
    for t in [TensorType::Q8_0, TensorType::F16, TensorType::BF16] {
        let x = values(256, 77, 1.0);
        let q = quantize(t, &x).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize(t, &q, &mut y).unwrap();
        assert_eq!(quantize(t, &y).unwrap(), q, "{t}");
    }
}

#[test]
fn writer_rejects_inconsistent_input() {
    let mut w = GgufWriter::new();
    w.add_tensor_f32("a", &[4], TensorType::F32, &[0.0; 4])
        .unwrap();
    let e = w
        .add_tensor_f32("a", &[4], TensorType::F32, &[0.0; 4])
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::DuplicateTensor(n) if n == "a"),
        "{e}"
    );
    let e = w
        .add_tensor_f32("b", &[4, 2], TensorType::F32, &[0.0; 4])
        .unwrap_err();
    assert!(e.to_string().contains("'b'"), "{e}");
    let e = w
        .add_tensor("c", &[33], TensorType::Q8_0, vec![0; 34])
        .unwrap_err();
    assert!(
        e.to_string().contains("'c'") && e.to_string().contains("block"),
        "{e}"
    );
    let e = w
        .add_tensor("d", &[32], TensorType::Q8_0, vec![0; 33])
        .unwrap_err();
    assert!(e.to_string().contains("'d'"), "{e}");
    let e = w
        .add_tensor("e", &[2, 0], TensorType::F32, vec![])
        .unwrap_err();
    assert!(e.to_string().contains("'e'"), "{e}");
    let e = w
        .add_tensor("f", &[1, 1, 1, 1, 1], TensorType::F32, vec![0; 4])
        .unwrap_err();
    assert!(e.to_string().contains("'f'"), "{e}");
    let e = w
        .add_tensor_f32("g", &[32], TensorType::Q2_K, &[0.0; 32])
        .unwrap_err();
    assert!(e.to_string().contains("'g'"), "{e}");

    // Mixed-type arrays cannot be written.
    let mut w = GgufWriter::new();
    w.add(
        "mixed",
        GgufValue::Array(ValueType::U32, vec![GgufValue::U32(1), GgufValue::I32(2)]),
    );
    let dir = tempfile::tempdir().unwrap();
    let e = w.write(&dir.path().join("x.gguf")).unwrap_err();
    assert!(e.to_string().contains("mixed"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn add_replaces_an_existing_key() {
    let mut w = GgufWriter::new();
    w.add_u32("k", 1);
    w.add_string("other", "x");
    w.add_u32("k", 2);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k.gguf");
    w.write(&p).unwrap();
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.metadata().len(), 2);
    assert_eq!(g.get_u32("k").unwrap(), 2);
    assert!(g.tensors().is_empty());
}

#[test]
fn streamed_tensors_write_the_same_file() {
    // Declared tensors filled in pieces by the streaming callback give exactly the bytes of the
    // same tensors added with their data.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    build_writer().write(&a).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add(k, v);
    }
    let cs = cases();
    for c in &cs {
        w.declare_tensor(c.name, &c.dims, c.ttype).unwrap();
    }
    w.write_streaming(&b, |name, sink| {
        let c = cs.iter().find(|c| c.name == name).unwrap();
        let bytes = quantize(c.ttype, &c.input).unwrap();
        let (first, rest) = bytes.split_at(bytes.len() / 2);
        sink.write(first)?;
        sink.write(rest)?;
        assert_eq!(sink.remaining(), 0);
        Ok(())
    })
    .unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    // Too few or too many bytes are errors naming the tensor, and leave no file behind.
    for extra in [-1i64, 1] {
        let mut w = GgufWriter::new();
        w.declare_tensor("t", &[32, 2], TensorType::Q8_0).unwrap();
        let p = dir.path().join("bad.gguf");
        let e = w
            .write_streaming(&p, |_, sink| {
                let n = (2 * 34 + extra) as usize;
                sink.write(&vec![0u8; n])
            })
            .unwrap_err();
        assert!(e.to_string().contains('t'), "{e}");
        assert!(!p.exists() && !p.with_extension("gguf.tmp").exists());
    }
    // A plain `write` refuses declared tensors.
    let mut w = GgufWriter::new();
    w.declare_tensor("t", &[32], TensorType::Q8_0).unwrap();
    assert!(w.write(&dir.path().join("c.gguf")).is_err());
}
