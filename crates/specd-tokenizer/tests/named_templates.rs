//! Every built-in template name renders what llama-server renders for it: the prompts in
//! `named_templates.json` were captured from llama-server's `/apply-template`
//! (`scripts/named-chat-templates.py capture`).

use specd_tokenizer::{templates, ChatMessage, ChatTemplate};

#[derive(serde::Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: Option<bool>,
}

#[derive(serde::Deserialize)]
struct Record {
    cases: Vec<Case>,
    prompts: std::collections::BTreeMap<String, Vec<String>>,
}

fn record() -> Record {
    serde_json::from_str(include_str!("named_templates.json")).expect("named_templates.json")
}

#[test]
fn every_name_renders_as_llama_server() {
    let r = record();
    let mut bad = Vec::new();
    for (name, prompts) in &r.prompts {
        let src = templates::named(name).unwrap_or_else(|| panic!("no template '{name}'"));
        let t = ChatTemplate::new(src).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (case, want) in r.cases.iter().zip(prompts) {
            let agp = case.add_generation_prompt.unwrap_or(true);
            let got = t
                .render(&case.messages, agp, &Default::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if &got != want {
                bad.push(format!(
                    "{name}: {:?}\n  want {want:?}\n  got  {got:?}",
                    case.messages
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_names_are_llama_servers() {
    let r = record();
    let ours: Vec<&str> = templates::names().collect();
    let theirs: Vec<&str> = r.prompts.keys().map(String::as_str).collect();
    assert_eq!(ours, theirs);
}
