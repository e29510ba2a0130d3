//! Gated delta rule cost per decode step and per verification batch, on every thread:
//! `cargo bench -p specd-ops --bench delta`.
//!
//! Runs the recurrence of the Qwen3.5-0.8B shape (16 heads of 128 × 128) over as many layers'
//! states as the model has (18), so the states stream from L2/L3 as in a real step, for 1, 2, 4
//! and 8 tokens; prints the best-of-N time per step (all layers) and each width relative to one
//! token.

use specd_ops::delta_net::{gated_delta_rule, GdnInputs, GdnShape};
use std::time::Instant;

fn main() {
    // On a compute pool of one thread per CPU, as a model runs its kernels.
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = specd_ops::pool::Pool::new(n).expect("pool");
    pool.install(run);
}

fn run() {
    let shape = GdnShape {
        n_k: 16,
        n_v: 16,
        d_k: 128,
        d_v: 128,
        tiled: true,
    };
    let layers = 18;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut gen = |n: usize, a: f32, b: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                a + b * ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect()
    };
    let states: Vec<Vec<f32>> = (0..layers)
        .map(|_| gen(shape.state_len(), 0.0, 1.0))
        .collect();
    let mut outs: Vec<Vec<f32>> = vec![vec![0f32; shape.state_len()]; layers];
    println!(
        "gated delta rule, {layers} layers of {}x{}x{}, {} threads (best of 15, ms per step)",
        shape.n_v,
        shape.d_v,
        shape.d_k,
        specd_ops::parallel::n_threads()
    );
    let mut line = String::new();
    let mut base = 0.0;
    for t in [1usize, 2, 4, 8] {
        let q = gen(t * shape.n_k * shape.d_k, 0.0, 0.1);
        let k = gen(t * shape.n_k * shape.d_k, 0.0, 0.1);
        let v = gen(t * shape.n_v * shape.d_v, 0.0, 1.0);
        let decay = gen(t * shape.n_v, 0.9, 0.1);
        let beta = gen(t * shape.n_v, 0.5, 0.5);
        let mut y = vec![0f32; t * shape.n_v * shape.d_v];
        let inp = GdnInputs {
            q: &q,
            k: &k,
            v: &v,
            decay: &decay,
            beta: &beta,
        };
        let best = (0..15)
            .map(|_| {
                let t0 = Instant::now();
                for (s, o) in states.iter().zip(outs.iter_mut()) {
                    gated_delta_rule(shape, s, o, inp, &mut y, None);
                }
                t0.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min);
        if t == 1 {
            base = best;
        }
        line += &format!("  t={t}: {best:.3} ({:.2}×)", best / base);
    }
    println!("{line}");
}
