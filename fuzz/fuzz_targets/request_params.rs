//! Any byte string as a request body: parsed as JSON, then read as the generation parameters of
//! each API (sampling, speculation, grammar, logit bias, `n`) — an error is fine, a panic is a
//! finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specd_server::params::{parse_gen, parse_n_cmpl, Api, Defaults, Fields};

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if !v.is_object() {
        return;
    }
    let d = Defaults {
        n_predict: None,
        sampler: Default::default(),
        spec: Default::default(),
        spec_named: false,
        cache_prompt: true,
        grammar: None,
        ignore_eos: false,
        logit_bias: Vec::new(),
    };
    let f = Fields::of(&v);
    for api in [Api::Llama, Api::OaiCompletion, Api::OaiChat] {
        let _ = parse_gen(&f, &d, api);
    }
    let _ = parse_n_cmpl(&f, 4);
});
