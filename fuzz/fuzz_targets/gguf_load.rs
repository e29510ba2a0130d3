//! Any byte string as a GGUF file: parsed, then loaded as a model (tokenizer, hyper-parameters,
//! every tensor) — an error is fine, a panic, an abort or an allocation over libFuzzer's
//! `-rss_limit_mb` / `-malloc_limit_mb` is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specd_models::{Model, ModelOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = specd_gguf::GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let opts = ModelOptions {
        n_threads: 1,
        ..ModelOptions::default()
    };
    let _ = Model::from_gguf(&g, opts);
});
