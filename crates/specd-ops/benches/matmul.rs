//! Matmul kernel cost by batch width and kernel level, on one thread:
//! `cargo bench -p specd-ops --bench matmul [-- hot [tiles] [TYPE..] | -- stream]`.
//!
//! Prints the best-of-N time per call (the minimum is the figure least disturbed by other load on
//! the machine) for a Qwen3.5-0.8B FFN-shaped matrix of every native quantised type, and each
//! width's cost relative to one row — the number that decides whether a verification batch costs
//! about one plain step.

use specd_ops::legacy::LegacyFormat;
use specd_ops::{matmul_with, Isa, KFormat, Weight, WeightType};
use std::time::Instant;

fn weight(wt: WeightType, rows: usize, cols: usize) -> Weight {
    if let WeightType::K(f) | WeightType::KR16(f) = wt {
        return kweight(f, rows, cols);
    }
    let nb = rows * cols / 32;
    let bb = wt.block_bytes();
    let mut bytes = vec![0u8; nb * bb];
    let mut s = 0x9e3779b97f4a7c15u64;
    for b in bytes.chunks_exact_mut(bb) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        for v in &mut b[2..] {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v = s as u8;
        }
    }
    Weight::from_bytes(wt, rows, cols, bytes).expect("weight")
}

/// A super-block matrix of random quants (small finite f16 factors), repacked.
fn kweight(f: KFormat, rows: usize, cols: usize) -> Weight {
    let bb = f.block_bytes();
    let mut bytes = vec![0u8; rows * cols / 256 * bb];
    let mut s = 0x9e3779b97f4a7c15u64;
    for v in bytes.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *v = s as u8;
    }
    let fields: &[usize] = match f {
        KFormat::Q4K | KFormat::Q5K => &[0, 2],
        KFormat::Q6K => &[208],
        KFormat::IQ4XS => &[0],
        KFormat::Q2K => &[80, 82],
        KFormat::Q3K => &[108],
    };
    for b in bytes.chunks_exact_mut(bb) {
        for &p in fields {
            b[p..p + 2].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
        }
    }
    let w = Weight::from_bytes(WeightType::K(f), rows, cols, bytes).expect("weight");
    specd_ops::pack::for_current_isa(&w).expect("pack")
}

/// Fastest of `reps` timings of `f`, in seconds.
fn best_of(reps: usize, f: &mut dyn FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A timed call: `(rows n, activations x, output out)`.
type WidthRun<'a> = &'a mut dyn FnMut(usize, &[f32], &mut [f32]);

/// `label`, then the time of `run(n, x, out)` for 1, 2, 4 and 8 activation rows of `cols`
/// (`out`: `n × rows`): one row as ms and GB/s over `bytes`, wider ones relative to it.
fn width_line(
    label: String,
    bytes: usize,
    (rows, cols): (usize, usize),
    reps: usize,
    run: WidthRun<'_>,
) -> String {
    let mut line = label;
    let mut base = 0.0;
    for n in [1usize, 2, 4, 8] {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let mut out = vec![0f32; n * rows];
        let best = best_of(reps, &mut || run(n, &x, &mut out));
        if n == 1 {
            base = best;
            line += &format!(
                " n=1 {:.2} ms ({:.1} GB/s)",
                best * 1e3,
                bytes as f64 / best / 1e9
            );
        } else {
            line += &format!("  n={n} {:.2} ms ({:.2}×)", best * 1e3, best / base);
        }
    }
    line
}

/// Decode-shaped passes over a matrix far larger than the caches (the 0.8B model's output
/// projection), on every thread: one row is memory bandwidth as the kernel sees it (next to a
/// plain read of the same bytes); 2, 4, 8 rows show what a verification batch adds on top.
fn streaming() {
    let (rows, cols) = (248_320, 1024);
    let q = weight(WeightType::Q8_0, rows, cols);
    let p = specd_ops::pack::pack(&q).expect("pack");
    // The floor: every thread sums its share of the bytes as u64 words.
    let bytes = q.bytes();
    let read = best_of(7, &mut || {
        let sum = std::sync::atomic::AtomicU64::new(0);
        specd_ops::parallel::for_each(bytes.len().div_ceil(1 << 20), |i| {
            let c = &bytes[i << 20..((i + 1) << 20).min(bytes.len())];
            let s = c
                .chunks_exact(64)
                .map(|l| u64::from_le_bytes(l[..8].try_into().unwrap_or([0; 8])))
                .fold(0u64, u64::wrapping_add);
            sum.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        std::hint::black_box(sum);
    });
    println!(
        "stream {rows}x{cols} plain read: {:.2} ms, {:.1} GB/s ({} threads)",
        read * 1e3,
        bytes.len() as f64 / read / 1e9,
        specd_ops::parallel::n_threads()
    );
    let q4k = weight(WeightType::KR16(KFormat::Q4K), rows, cols);
    let q6k = weight(WeightType::KR16(KFormat::Q6K), rows, cols);
    for (w, isa) in [
        (&q, Isa::Avx2),
        (&q, Isa::Avx512Vnni),
        (&p, Isa::Avx512Vnni),
        (&p, Isa::Avx2),
        (&q4k, Isa::Avx512Vnni),
        (&q6k, Isa::Avx512Vnni),
        (&q4k, Isa::Avx2),
        (&q6k, Isa::Avx2),
    ] {
        if !Isa::available().contains(&isa) {
            continue;
        }
        let label = format!("stream {rows}x{cols} {:13} {isa:?}:", w.wtype.name());
        let line = width_line(label, w.size_bytes(), (rows, cols), 7, &mut |n, x, out| {
            matmul_with(isa, x, n, w, out).expect("matmul");
        });
        println!("{line}");
    }
}

/// The same bytes as a model's layers hold them: many FFN-sized matrices, each far smaller
/// than the model, called one after another (each call splits its rows over the threads), for
/// the interleaved types a decode step streams most.
fn layer_streaming() {
    let (rows, cols, count) = (3584, 1024, 160);
    for (name, make) in [
        ("q8_0", WeightType::Q8_0),
        ("q4_K", WeightType::KR16(KFormat::Q4K)),
        ("q6_K", WeightType::KR16(KFormat::Q6K)),
    ] {
        let ws: Vec<Weight> = (0..count)
            .map(|_| match make {
                WeightType::KR16(_) => weight(make, rows, cols),
                _ => specd_ops::pack::pack(&weight(make, rows, cols)).expect("pack"),
            })
            .collect();
        let total: usize = ws.iter().map(|w| w.size_bytes()).sum();
        for isa in [Isa::Avx512Vnni, Isa::Avx2] {
            if !Isa::available().contains(&isa) {
                continue;
            }
            let label = format!("layers {count}x({rows}x{cols}) {name} {isa:?}:");
            let line = width_line(label, total, (rows, cols), 5, &mut |n, x, out| {
                for w in &ws {
                    matmul_with(isa, x, n, w, out).expect("matmul");
                }
            });
            println!("{line}");
        }
    }
}

fn main() {
    // `-- hot`: the in-cache table only; `-- stream`: the streaming tables only.
    let arg = |name: &str| std::env::args().any(|a| a == name);
    if !arg("hot") {
        // On a compute pool of one thread per CPU, as a model runs its kernels.
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = specd_ops::pool::Pool::new(n).expect("pool");
        pool.install(|| {
            streaming();
            layer_streaming();
        });
    }
    if arg("stream") {
        return;
    }
    let (rows, cols) = (3584, 1024);
    let pool = specd_ops::pool::Pool::new(1).expect("pool");
    // `-- hot tiles`: every tile height of the SIMD kernels (1..=8 rows) instead.
    let widths: &[usize] = if std::env::args().any(|a| a == "tiles") {
        &[1, 2, 3, 4, 5, 6, 7, 8]
    } else {
        &[1, 2, 4, 8, 12, 16, 32]
    };
    // Any other argument names the types to time (by the start of their name: `q6_K`, `q8_0`).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !["hot", "tiles", "stream", "--bench"].contains(&a.as_str()))
        .collect();
    println!("matmul {rows}x{cols}, 1 thread, best of 15 (ms per call; × = vs 1 row)");
    for wt in [
        WeightType::Q8_0,
        WeightType::Q8_0R16,
        WeightType::Q4_0,
        WeightType::Q4_0R16,
        WeightType::IQ4NLR16,
        WeightType::Legacy(LegacyFormat::Q4_1),
        WeightType::Legacy(LegacyFormat::Q5_0),
        WeightType::Legacy(LegacyFormat::Q5_1),
        WeightType::KR16(KFormat::Q4K),
        WeightType::KR16(KFormat::Q5K),
        WeightType::KR16(KFormat::Q6K),
        WeightType::KR16(KFormat::IQ4XS),
        WeightType::KR16(KFormat::Q2K),
        WeightType::KR16(KFormat::Q3K),
    ] {
        if !only.is_empty() && !only.iter().any(|o| wt.name().starts_with(o.as_str())) {
            continue;
        }
        let w = match (wt, wt.interleaved_from()) {
            (_, Some(base)) => specd_ops::pack::pack(&weight(base, rows, cols)).expect("pack"),
            // Q4_1 / Q5_0 / Q5_1 are read in their 16-row interleaved layout on every level.
            (WeightType::Legacy(_), None) => {
                specd_ops::pack::for_current_isa(&weight(wt, rows, cols)).expect("pack")
            }
            _ => weight(wt, rows, cols),
        };
        for isa in Isa::available().into_iter().filter(|i| *i != Isa::Scalar) {
            let mut line = format!("{:13} {:11}", wt.name(), format!("{isa:?}"));
            let mut base = 0.0;
            for &n in widths {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
                    .collect();
                let mut out = vec![0f32; n * rows];
                let best = pool.install(|| {
                    (0..15)
                        .map(|_| {
                            let t = Instant::now();
                            matmul_with(isa, &x, n, &w, &mut out).expect("matmul");
                            t.elapsed().as_secs_f64() * 1e3
                        })
                        .fold(f64::INFINITY, f64::min)
                });
                if n == 1 {
                    base = best;
                }
                line += &format!("  n={n}: {best:.3} ({:.2}×)", best / base);
            }
            println!("{line}");
        }
    }
}
