//! 1400 seeded, deterministic mutations of a tiny generated model file — bit flips, truncations and
//! corrupted header fields (tensor / metadata counts, string lengths, value types, array
//! lengths, tensor dimension counts, dimensions, types and offsets) — each loaded as a model:
//! every one must give a clean error, or load and then tokenise and run a forward pass without
//! a panic. A capped allocator (below) makes any single allocation over 256 MiB, or more than
//! 1 GiB live at once, a failure: a length field of 2^60 must be refused, not allocated.
//!
//! `SPECD_MUTATION_TRACE=1` writes each mutation to stderr before it runs (uncaptured), to find
//! the one behind an abort.

use specd_gguf::GgufFile;
use specd_memory::MemoryConfig;
use specd_models::{Batch, Model, ModelOptions};
use specd_testmodel::{write_model, Preset, TestModelSpec};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest single allocation allowed (the tiny model's biggest tensor is far below).
const MAX_ONE: usize = 256 << 20;
/// The most bytes live at once.
const MAX_LIVE: usize = 1 << 30;

/// The system allocator, refusing allocations over the caps. A refused allocation aborts the
/// test binary (`handle_alloc_error`) after a line on stderr naming the size and mutation.
struct Capped;

static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Index of the mutation being run, for the over-cap message.
static CASE: AtomicUsize = AtomicUsize::new(usize::MAX);

unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if !admit(l.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(l) };
        if p.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if !admit(l.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(l) };
        if p.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() && !admit(new - l.size()) {
            return std::ptr::null_mut();
        }
        let q = unsafe { System.realloc(p, l, new) };
        if q.is_null() {
            if new > l.size() {
                LIVE.fetch_sub(new - l.size(), Ordering::Relaxed);
            }
        } else if new < l.size() {
            LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
        }
        q
    }
}

/// Counts `size` more bytes live, unless that breaks a cap (then says so on stderr).
fn admit(size: usize) -> bool {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    if size <= MAX_ONE && live <= MAX_LIVE {
        return true;
    }
    LIVE.fetch_sub(size, Ordering::Relaxed);
    // Formatted into a stack buffer: no allocation inside the allocator.
    let mut buf = [0u8; 160];
    let mut w = std::io::Cursor::new(&mut buf[..]);
    let _ = writeln!(
        w,
        "mutation {}: refused an allocation of {size} bytes ({live} live)",
        CASE.load(Ordering::Relaxed) as isize
    );
    let n = w.position() as usize;
    let _ = std::io::stderr().write_all(&buf[..n]);
    false
}

#[global_allocator]
static ALLOC: Capped = Capped;

/// SplitMix64: the mutations are the same on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What a header field is, for choosing its corrupt values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Field {
    TensorCount,
    KvCount,
    StringLen,
    ValueType,
    ArrayType,
    ArrayLen,
    DimCount,
    Dim,
    TensorType,
    Offset,
}

impl Field {
    /// Width in bytes.
    fn width(self) -> usize {
        match self {
            Field::ValueType | Field::ArrayType | Field::DimCount | Field::TensorType => 4,
            _ => 8,
        }
    }
}

/// Where each header field of a GGUF file lies, found by walking the file the way the format
/// defines it (written here because the reader keeps no offsets).
struct Layout2 {
    fields: Vec<(usize, Field)>,
    /// End of the tensor index (start of padding and data).
    header_end: usize,
}

fn walk(b: &[u8]) -> Layout2 {
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap());
    let mut fields = vec![(8, Field::TensorCount), (16, Field::KvCount)];
    let n_tensors = u64_at(8);
    let n_kv = u64_at(16);
    let mut p = 24;
    let string = |p: &mut usize, fields: &mut Vec<(usize, Field)>| {
        fields.push((*p, Field::StringLen));
        *p += 8 + u64_at(*p) as usize;
    };
    // Size of a scalar value type (GGUF ids 0..=12, 8 = string, 9 = array).
    let scalar = |t: u32| match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => panic!("type {t} is not a scalar"),
    };
    for _ in 0..n_kv {
        string(&mut p, &mut fields);
        fields.push((p, Field::ValueType));
        let t = u32_at(p);
        p += 4;
        match t {
            8 => string(&mut p, &mut fields),
            9 => {
                fields.push((p, Field::ArrayType));
                let at = u32_at(p);
                fields.push((p + 4, Field::ArrayLen));
                let n = u64_at(p + 4) as usize;
                p += 12;
                if at == 8 {
                    for _ in 0..n {
                        string(&mut p, &mut fields);
                    }
                } else {
                    p += n * scalar(at);
                }
            }
            t => p += scalar(t),
        }
    }
    for _ in 0..n_tensors {
        string(&mut p, &mut fields);
        fields.push((p, Field::DimCount));
        let nd = u32_at(p) as usize;
        p += 4;
        for _ in 0..nd {
            fields.push((p, Field::Dim));
            p += 8;
        }
        fields.push((p, Field::TensorType));
        fields.push((p + 4, Field::Offset));
        p += 12;
    }
    Layout2 {
        fields,
        header_end: p,
    }
}

/// A corrupt value for a field: the classic edge values, huge lengths, off-by-one, random.
fn corrupt(field: Field, old: u64, rng: &mut Rng) -> u64 {
    let max = if field.width() == 4 {
        u32::MAX as u64
    } else {
        u64::MAX
    };
    let choices = [
        0,
        1,
        max,
        max - 1,
        1 << 31,
        1 << 60,
        1 << 40,
        old.wrapping_add(1) & max,
        old.wrapping_sub(1) & max,
        old.wrapping_mul(2) & max,
        old / 2,
        rng.next() & max,
        rng.next() % 64,
    ];
    choices[rng.below(choices.len())]
}

fn put(b: &mut [u8], at: usize, width: usize, v: u64) {
    b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

fn get(b: &[u8], at: usize, width: usize) -> u64 {
    let mut x = [0u8; 8];
    x[..width].copy_from_slice(&b[at..at + width]);
    u64::from_le_bytes(x)
}

/// One mutation of `orig`, described.
fn mutate(orig: &[u8], l: &Layout2, rng: &mut Rng, kind: usize) -> (Vec<u8>, String) {
    let mut b = orig.to_vec();
    let desc = match kind {
        // Bit flips, mostly in the header (where they change meaning), some in tensor data.
        0 => {
            let n = 1 + rng.below(4);
            let mut at = Vec::new();
            for _ in 0..n {
                let i = if rng.below(4) == 0 {
                    rng.below(b.len())
                } else {
                    rng.below(l.header_end)
                };
                let bit = rng.below(8);
                b[i] ^= 1 << bit;
                at.push(format!("{i}:{bit}"));
            }
            format!("bit flips at {}", at.join(","))
        }
        // Truncation anywhere.
        1 => {
            let n = if rng.below(2) == 0 {
                rng.below(l.header_end + 64)
            } else {
                rng.below(b.len())
            };
            b.truncate(n);
            format!("truncated to {n} bytes")
        }
        // A header field set to a corrupt value.
        _ => {
            let wanted: Vec<&(usize, Field)> = match kind {
                2 => l
                    .fields
                    .iter()
                    .filter(|(_, f)| matches!(f, Field::TensorCount | Field::KvCount))
                    .collect(),
                3 => l
                    .fields
                    .iter()
                    .filter(|(_, f)| *f == Field::StringLen)
                    .collect(),
                4 => l
                    .fields
                    .iter()
                    .filter(|(_, f)| matches!(f, Field::ValueType | Field::ArrayType))
                    .collect(),
                5 => l
                    .fields
                    .iter()
                    .filter(|(_, f)| *f == Field::ArrayLen)
                    .collect(),
                _ => l
                    .fields
                    .iter()
                    .filter(|(_, f)| {
                        matches!(
                            f,
                            Field::DimCount | Field::Dim | Field::TensorType | Field::Offset
                        )
                    })
                    .collect(),
            };
            let &(at, field) = wanted[rng.below(wanted.len())];
            let old = get(&b, at, field.width());
            let v = corrupt(field, old, rng);
            put(&mut b, at, field.width(), v);
            format!("{field:?} at {at}: {old} -> {v}")
        }
    };
    (b, desc)
}

/// Loads `bytes` as a model; if it loads, tokenises, detokenises and decodes a few tokens.
/// Errors are fine; the caller catches panics.
fn exercise(bytes: Vec<u8>) -> &'static str {
    let Ok(g) = GgufFile::from_bytes(bytes) else {
        return "gguf error";
    };
    let opts = ModelOptions {
        n_threads: 1,
        n_ubatch: 8,
    };
    let Ok(m) = Model::from_gguf(&g, opts) else {
        return "model error";
    };
    let tok = m.tokenizer();
    let ids = tok
        .encode("def add(a, b):\n    return a + b\n", false, true)
        .unwrap_or_default();
    let _ = tok.decode(&ids, true);
    let n_vocab = m.config().n_vocab as u32;
    let mut ids: Vec<u32> = ids.into_iter().filter(|&t| t < n_vocab).take(6).collect();
    if ids.is_empty() {
        ids.push(0);
    }
    let mut mem = m.new_memory(MemoryConfig {
        n_ctx: 32,
        max_seqs: 1,
        ..Default::default()
    });
    match m.decode(&mut mem, &Batch::from_tokens(&ids, 0, 0, true)) {
        Ok(out) => {
            let _ = out
                .logits(ids.len() - 1)
                .iter()
                .copied()
                .fold(0.0, f32::max);
            "loaded and decoded"
        }
        Err(_) => "decode error",
    }
}

#[test]
fn seeded_mutations_never_panic_nor_allocate_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let mut spec = TestModelSpec::preset(Preset::Qwen35Tiny);
    spec.mtp = true;
    write_model(&spec, &path).unwrap();
    let orig = std::fs::read(&path).unwrap();
    let layout = walk(&orig);
    assert_eq!(exercise(orig.clone()), "loaded and decoded", "the original");
    let trace = std::env::var_os("SPECD_MUTATION_TRACE").is_some();

    // Panics are collected (with their mutation), not printed one by one.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Rng(0x5eed_6767);
    let mut panics = Vec::new();
    let mut outcomes = std::collections::BTreeMap::<&str, usize>::new();
    const N: usize = 1400;
    for i in 0..N {
        let (bytes, desc) = mutate(&orig, &layout, &mut rng, i % 7);
        if trace {
            let _ = writeln!(std::io::stderr(), "mutation {i}: {desc}");
        }
        CASE.store(i, Ordering::Relaxed);
        match std::panic::catch_unwind(AssertUnwindSafe(|| exercise(bytes))) {
            Ok(what) => *outcomes.entry(what).or_default() += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panics.push(format!("mutation {i} ({desc}): {msg}"));
            }
        }
    }
    std::panic::set_hook(hook);
    println!("{N} mutations: {outcomes:?}");
    assert!(
        panics.is_empty(),
        "{} of {N} mutations panicked:\n{}",
        panics.len(),
        panics.join("\n")
    );
    // The mutations reach every stage: parse errors, model errors and loads that decode.
    assert!(
        outcomes.get("gguf error").copied().unwrap_or(0) > 50,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("model error").copied().unwrap_or(0) > 5,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("loaded and decoded").copied().unwrap_or(0) > 5,
        "{outcomes:?}"
    );
}
