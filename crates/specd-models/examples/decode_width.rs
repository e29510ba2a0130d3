//! Profiling aid: decodes batches of one width over and over, so a profiler (`perf record`)
//! sees what a verification batch of that width spends its time on.
//! `cargo run --release -p specd-models --example decode_width -- FILE WIDTH [CALLS] [THREADS]`
use specd_models::{Batch, MemoryConfig, Model, ModelOptions};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_width FILE WIDTH [CALLS] [THREADS]")?;
    let width: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let calls: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let threads: usize = args.get(4).map_or(Ok(0), |s| s.parse())?;
    let model = Model::load(
        path,
        ModelOptions {
            n_threads: threads,
            n_ubatch: 512,
        },
    )?;
    let n_vocab = model.config().n_vocab as u32;
    let cfg = MemoryConfig {
        n_ctx: 64 + calls * width,
        max_seqs: 1,
        ..Default::default()
    };
    let toks: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let mut mem = model.new_memory(cfg);
    model.decode(&mut mem, &Batch::from_tokens(&toks[..32], 0, 0, false))?;
    let t0 = Instant::now();
    for c in 0..calls {
        let pos = 32 + c * width;
        model.decode(
            &mut mem,
            &Batch::from_tokens(&toks[..width], pos as u32, 0, true),
        )?;
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3 / calls as f64;
    println!("width {width}: {ms:.2} ms per decode call");
    Ok(())
}
