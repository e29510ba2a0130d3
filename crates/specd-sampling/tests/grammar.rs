//! Grammar-constrained sampling: outputs follow the grammar whatever the logits say, rollback
//! restores the matcher exactly, and invalid grammars are errors.

use proptest::prelude::*;
use specd_sampling::{GrammarSpec, GrammarVocab, Sampler, SamplerParams};

/// A small byte-level vocabulary: every printable ASCII byte, a few multi-byte words, one EOS.
fn vocab() -> (GrammarVocab, Vec<Vec<u8>>, u32) {
    let mut pieces: Vec<Vec<u8>> = (0x20u8..0x7f).map(|b| vec![b]).collect();
    for w in [
        "true", "false", "null", "\"name\"", "\": ", "{\"", "\"}", "12", "yes", "no", "\n",
    ] {
        pieces.push(w.as_bytes().to_vec());
    }
    let eos = pieces.len() as u32;
    let mut all: Vec<Option<Vec<u8>>> = pieces.iter().cloned().map(Some).collect();
    all.push(None);
    let p2 = pieces.clone();
    // Greedy longest-match tokenization is enough for forced text in these tests.
    let tokenize = move |s: &[u8]| {
        let mut out = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let (id, len) = p2
                .iter()
                .enumerate()
                .filter(|(_, p)| s[i..].starts_with(p))
                .map(|(id, p)| (id as u32, p.len()))
                .max_by_key(|x| x.1)
                .unwrap_or((0, 1));
            out.push(id);
            i += len;
        }
        out
    };
    let gv = GrammarVocab::new(all, |_| "<|eos|>".to_string(), eos, tokenize).unwrap();
    (gv, pieces, eos)
}

fn logits(seed: u64, pos: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((seed ^ (pos * 0x9e37_79b9) ^ (i as u64 * 0x85eb_ca6b)).wrapping_mul(0xc2b2_ae35)
                >> 40)
                % 1000) as f32
                / 100.0
        })
        .collect()
}

/// Samples until EOS (or `max` tokens) and returns the text.
fn generate(
    spec: &GrammarSpec,
    params: SamplerParams,
    seed: u64,
    max: usize,
) -> (String, Vec<u32>) {
    let (gv, pieces, eos) = vocab();
    let mut s = Sampler::new(params, &[])
        .unwrap()
        .with_grammar(gv.compile(spec).unwrap());
    let mut toks = Vec::new();
    for pos in 0..max as u64 {
        let t = s.sample(&logits(seed, pos, pieces.len() + 1), pos);
        s.accept(t).unwrap();
        if t == eos {
            break;
        }
        toks.push(t);
    }
    (
        toks.iter()
            .map(|&t| String::from_utf8_lossy(&pieces[t as usize]).into_owned())
            .collect(),
        toks,
    )
}

#[test]
fn gbnf_output_matches_the_grammar() {
    let g =
        GrammarSpec::Gbnf("root ::= answer \"!\"\nanswer ::= \"yes\" | \"no\" | [0-9]{2,3}".into());
    for seed in 0..20 {
        let (text, _) = generate(
            &g,
            SamplerParams {
                temperature: 1.0,
                seed: seed as u32,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..Default::default()
            },
            seed,
            20,
        );
        let ok = text == "yes!"
            || text == "no!"
            || (text.ends_with('!')
                && (3..=4).contains(&text.len())
                && text[..text.len() - 1].chars().all(|c| c.is_ascii_digit()));
        assert!(ok, "seed {seed}: {text:?}");
    }
}

#[test]
fn json_schema_output_parses_and_validates() {
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}}, "required": ["name", "ok"], "additionalProperties": false});
    for seed in 0..10 {
        let (text, _) = generate(
            &GrammarSpec::JsonSchema(schema.clone()),
            SamplerParams::greedy(),
            seed,
            200,
        );
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["name"].is_string() && v["ok"].is_boolean(), "{text}");
    }
    let (text, _) = generate(&GrammarSpec::JsonObject, SamplerParams::greedy(), 3, 200);
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text) {
        Ok(_) => {}
        // JSON's grammar allows numbers like 1e99999 that serde_json cannot hold in an f64.
        Err(e) => assert!(
            e.to_string().contains("number out of range"),
            "{text:?}: {e}"
        ),
    }
}

/// Schemas without `type` are read as llama.cpp reads them: the keywords imply the type, and an
/// array of `items` is a tuple of exactly those items.
#[test]
fn schema_keywords_imply_the_type() {
    for seed in 0..6 {
        let tuple = serde_json::json!({"items": [{"type": "integer"}, {"const": "yes"}]});
        let (text, _) = generate(
            &GrammarSpec::JsonSchema(tuple),
            SamplerParams::greedy(),
            seed,
            200,
        );
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let a = v
            .as_array()
            .unwrap_or_else(|| panic!("not an array: {text}"));
        assert!(a.len() == 2 && a[0].is_i64() && a[1] == "yes", "{text}");

        let object = serde_json::json!({"properties": {"n": {"maxLength": 2}}, "required": ["n"]});
        let (text, _) = generate(
            &GrammarSpec::JsonSchema(object),
            SamplerParams::greedy(),
            seed,
            200,
        );
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v["n"].as_str().is_some_and(|n| n.chars().count() <= 2),
            "{text}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Accepting tokens, rolling some back and sampling again gives exactly the tokens that
    /// sampling without the detour gives: the grammar state rolls back with the history.
    #[test]
    fn rollback_then_sampling_again_equals_never_drafted(seed in 0u64..1000, detour in 1usize..6) {
        let g = GrammarSpec::Regex("[a-z]{1,8}( [a-z]{1,8}){0,6}\\.".into());
        let params = SamplerParams { temperature: 0.8, seed: seed as u32, ..Default::default() };
        let (_, plain) = generate(&g, params, seed, 40);
        let (gv, pieces, _) = vocab();
        let mut s = Sampler::new(params, &[]).unwrap().with_grammar(gv.compile(&g).unwrap());
        let mut out = Vec::new();
        for (pos, _) in plain.iter().enumerate() {
            // Detour: accept up to `detour` grammar-valid tokens sampled at other positions, then roll back.
            let len = s.history_len();
            for k in 0..detour {
                let t = s.sample(&logits(seed + 77, (pos + k) as u64, pieces.len() + 1), (pos + 1000 + k) as u64);
                if s.accept(t).is_err() { break; }
            }
            s.truncate_history(len).unwrap();
            let t = s.sample(&logits(seed, pos as u64, pieces.len() + 1), pos as u64);
            s.accept(t).unwrap();
            out.push(t);
        }
        prop_assert_eq!(out, plain);
    }
}

#[test]
fn forced_tokens_and_draft_validation() {
    let (gv, pieces, _) = vocab();
    let id = |w: &str| pieces.iter().position(|p| p == w.as_bytes()).unwrap() as u32;
    let mut g = gv
        .compile(&GrammarSpec::Lark("start: \"yes\" \"12\" /[a-z]+/".into()))
        .unwrap();
    assert_eq!(g.forced_tokens()[0], id("yes"));
    assert_eq!(g.valid_prefix(&[id("yes"), id("12"), id("no")]), 3);
    assert_eq!(g.valid_prefix(&[id("yes"), id("no")]), 1);
    assert_eq!(g.consumed(), 0, "validation does not advance");
}

#[test]
fn invalid_grammars_are_errors() {
    let (gv, _, _) = vocab();
    for bad in [
        GrammarSpec::Gbnf("root ::= undefined-rule".into()),
        GrammarSpec::Gbnf("root ::= \"unterminated".into()),
        GrammarSpec::Lark("start: nothing_here".into()),
        GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"})),
        GrammarSpec::Regex("(unclosed".into()),
    ] {
        assert!(gv.compile(&bad).is_err(), "{bad:?} compiled");
    }
}

#[test]
fn a_ban_on_everything_the_grammar_allows_yields_to_the_grammar() {
    let (gv, pieces, eos) = vocab();
    let n = pieces.len() + 1;
    let g = gv
        .compile(&GrammarSpec::Gbnf("root ::= \"yes\"".into()))
        .unwrap();
    let mut s = Sampler::new(SamplerParams::greedy(), &[])
        .unwrap()
        .with_logit_bias(&[(eos, f32::NEG_INFINITY), (0, 50.0)])
        .unwrap()
        .with_grammar(g);
    let l = logits(3, 0, n);
    // A ban the grammar leaves room for still steers: "no" rather than "yes".
    let yes = pieces.iter().position(|p| p == b"yes").unwrap() as u32;
    let no = pieces.iter().position(|p| p == b"no").unwrap() as u32;
    let either = GrammarSpec::Gbnf("root ::= \"yes\" | \"no\"".into());
    let s2 = Sampler::new(SamplerParams::greedy(), &[])
        .unwrap()
        .with_logit_bias(&[(yes, f32::NEG_INFINITY)])
        .unwrap()
        .with_grammar(gv.compile(&either).unwrap());
    assert_eq!(s2.sample(&l, 0), no);
    let s3 = Sampler::new(SamplerParams::greedy(), &[])
        .unwrap()
        .with_logit_bias(&[(no, f32::NEG_INFINITY)])
        .unwrap()
        .with_grammar(gv.compile(&either).unwrap());
    assert_eq!(s3.sample(&l, 0), yes);
    // The grammar is complete after "yes": only EOS may follow, and it is banned. The grammar
    // wins (EOS), instead of a token it forbids.
    s.accept(yes).unwrap();
    assert_eq!(s.sample(&l, 1), eos);
    s.accept(eos).unwrap();
}
