//! Real models' chat templates (llama.cpp's models/templates/, copied to `real_templates/`)
//! render what llama-server renders: `real_templates.json` holds, for a set of conversations
//! (plain, system, tools, tool-call history, parallel calls, reasoning history, no-think,
//! multi-part content, …), the prompt llama-server's `/apply-template` returned, or the error
//! status when it refused the conversation (`scripts/real-chat-templates.py capture`), and the
//! capabilities its `/props` reported.
//!
//! `SPECD_TEMPLATE_RECORD=FILE SPECD_TEMPLATE_DIR=DIR` checks another record (e.g. every template
//! of llama.cpp's models/templates, `capture --all`).

use serde_json::{Map, Value};
use specd_tokenizer::{ChatInputs, ChatMessage, ChatTemplate, NaiveDateTime};
use std::path::PathBuf;

#[derive(serde::Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    tools: Option<Value>,
    #[serde(default)]
    chat_template_kwargs: Map<String, Value>,
    add_generation_prompt: Option<bool>,
}

#[derive(serde::Deserialize)]
struct Outcome {
    prompt: Option<String>,
    error: Option<String>,
}

#[derive(serde::Deserialize)]
struct Template {
    caps: Map<String, Value>,
    prompts: std::collections::BTreeMap<String, Outcome>,
}

#[derive(serde::Deserialize)]
struct Record {
    cases: std::collections::BTreeMap<String, Case>,
    now: String,
    bos_token: String,
    eos_token: String,
    templates: std::collections::BTreeMap<String, Template>,
}

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn record() -> Record {
    let path = std::env::var("SPECD_TEMPLATE_RECORD")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here().join("real_templates.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).expect("record")
}

fn source(name: &str) -> String {
    let dir = std::env::var("SPECD_TEMPLATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here().join("real_templates"));
    let path = dir.join(format!("{name}.jinja"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn compile(r: &Record, name: &str) -> Result<ChatTemplate, String> {
    ChatTemplate::with_special_tokens(&source(name), &r.bos_token, &r.eos_token)
        .map_err(|e| format!("{name}: {e}"))
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// The text around byte `at` (where two prompts part).
fn excerpt(s: &str, at: usize) -> String {
    let from = s.floor_char_boundary(at.saturating_sub(60));
    let to = s.ceil_char_boundary((at + 100).min(s.len()));
    s[from..to].to_string()
}

#[test]
fn every_conversation_renders_as_llama_server() {
    let r = record();
    let now = NaiveDateTime::parse_from_str(&r.now, "%Y-%m-%dT%H:%M:%S").expect("now");
    let mut bad = Vec::new();
    let mut checked = 0;
    for (name, t) in &r.templates {
        let tmpl = match compile(&r, name) {
            Ok(t) => t,
            Err(e) => {
                bad.push(e);
                continue;
            }
        };
        for (case_name, want) in &t.prompts {
            let case = &r.cases[case_name];
            let got = tmpl.render_inputs(&ChatInputs {
                messages: &case.messages,
                tools: case.tools.as_ref(),
                kwargs: case.chat_template_kwargs.clone(),
                add_generation_prompt: case.add_generation_prompt.unwrap_or(true),
                now: Some(now),
            });
            checked += 1;
            match (&want.prompt, got) {
                (Some(w), Ok(g)) if *w == g => {}
                (None, Err(_)) => {}
                (Some(w), Ok(g)) => bad.push(format!(
                    "{name} / {case_name}: prompts differ from byte {}:\n  llama-server: {:?}\n  specd:        {:?}",
                    common_prefix(w, &g),
                    excerpt(w, common_prefix(w, &g)),
                    excerpt(&g, common_prefix(w, &g)),
                )),
                (Some(_), Err(e)) => bad.push(format!(
                    "{name} / {case_name}: llama-server renders it, specd fails: {e}"
                )),
                (None, Ok(_)) => bad.push(format!(
                    "{name} / {case_name}: llama-server fails ({:?}), specd renders it",
                    want.error
                )),
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn capabilities_are_llama_servers() {
    let r = record();
    let mut bad = Vec::new();
    for (name, t) in &r.templates {
        let caps = match compile(&r, name) {
            Ok(t) => t.caps().to_json(),
            Err(e) => {
                bad.push(e);
                continue;
            }
        };
        for (k, want) in &t.caps {
            if caps.get(k) != Some(want) {
                bad.push(format!(
                    "{name}: {k} llama-server {want}, specd {:?}",
                    caps.get(k)
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Values as llama.cpp's Jinja engine writes them (`tojson` and its arguments, `string`, `safe`,
/// printing, `items`, `length`): `TEMPLATE` rendered by llama-server's `/apply-template` gave
/// `WANT`.
#[test]
fn values_are_written_as_llama_server_writes_them() {
    const TEMPLATE: &str = r##"{%- set d = {"b": 1, "a": [true, none, 0.5, 2.0, "é\"\n"], "c": {}} -%}
1[{{ d|tojson }}]
2[{{ d|tojson(indent=2) }}]
3[{{ d|tojson(separators=(",", ":")) }}]
4[{{ d|tojson(ensure_ascii=true) }}]
5[{{ d|string }}]
6[{{ true }}|{{ none }}|{{ 0.5 }}|{{ 2.0 }}|{{ [1, "x", [2]] }}|{{ d }}]
7[{{ true|string }}|{{ none|string }}|{{ 0.1234567|string }}|{{ 2.0|string }}|{{ 7|string }}|{{ ["a", "it's"]|string }}]
8[{% for k, v in d|items %}{{ k }}={{ v|tojson }};{% endfor %}]
9[{{ d.a|length }}|{{ undefined_thing|length }}|{{ d|length }}]
10[{{ d.a|tojson|safe }}|{{ 3|safe }}|{{ false|safe }}]
11[{{ "  x  "|trim }}|{{ "a,b"|split(",") is sequence }}|{{ "Hello".startswith("He") }}]
12[{{ tojson(d.c) }}|{{ d.b|tojson }}]
"##;
    const WANT: &str = r##"1[{"b": 1, "a": [true, null, 0.5, 2, "é\"\n"], "c": {}}]
2[{
  "b": 1,
  "a": [
    true,
    null,
    0.5,
    2,
    "é\"\n"
  ],
  "c": {}
}]
3[{"b":1,"a":[true,null,0.5,2,"é\"\n"],"c":{}}]
4[{"b": 1, "a": [true, null, 0.5, 2, "\u00e9\"\n"], "c": {}}]
5[{'b': 1, 'a': [True, None, 0.5, 2.0, 'é"
'], 'c': {}}]
6[True||0.5|2.0|1x2|]
7[True|None|0.123457|2|7|['a', "it's"]]
8[b=1;a=[true, null, 0.5, 2, "é\"\n"];c={};]
9[5|0|3]
10[[true, null, 0.5, 2, "é\"\n"]|3|False]
11[x|True|True]
12[{}|1]"##;
    let t = ChatTemplate::new(TEMPLATE).expect("compiles");
    let got = t
        .render(&[ChatMessage::new("user", "Hi")], true, &Map::new())
        .expect("renders");
    assert_eq!(got, WANT);
}
