//! Profiling aid: decodes batches of one width over and over, so a profiler (`perf record`)
//! sees what a verification batch of that width spends its time on.
//! `cargo run --release -p specd-models --example decode_width -- FILE WIDTH [CALLS] [THREADS] [DEPTH]`
//! DEPTH: tokens already in memory before the timed calls (attention cost grows with it); each
//! call is rolled back, so every call runs at the same depth.
use specd_models::{Batch, MemoryConfig, Model, ModelOptions};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_width FILE WIDTH [CALLS] [THREADS] [DEPTH]")?;
    let width: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let calls: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let threads: usize = args.get(4).map_or(Ok(0), |s| s.parse())?;
    let depth: usize = args.get(5).map_or(Ok(32), |s| s.parse())?;
    let model = Model::load(
        path,
        ModelOptions {
            n_threads: threads,
            n_ubatch: 512,
        },
    )?;
    let n_vocab = model.config().n_vocab as u32;
    let cfg = MemoryConfig {
        n_ctx: depth + width,
        max_seqs: 1,
        ..Default::default()
    };
    let toks: Vec<u32> = (0..(depth + width) as u32)
        .map(|i| (i * 7919 + 13) % n_vocab)
        .collect();
    let mut mem = model.new_memory(cfg);
    model.decode(&mut mem, &Batch::from_tokens(&toks[..depth], 0, 0, false))?;
    let call = Batch::from_tokens(&toks[depth..], depth as u32, 0, true);
    let mut secs = 0.0;
    for _ in 0..calls {
        let t0 = Instant::now();
        model.decode(&mut mem, &call)?;
        secs += t0.elapsed().as_secs_f64();
        model.install(|| mem.rollback(0, width))?;
    }
    let ms = secs * 1e3 / calls as f64;
    println!("width {width} at depth {depth}: {ms:.2} ms per decode call");
    Ok(())
}
