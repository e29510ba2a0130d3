//! The grammar that makes `tool_choice: required` (or a named function) hold: the output is a
//! well-formed call of one of the offered tools, in the model's own markup, arguments as their
//! schemas say. Written in llguidance's Lark dialect (the grammar engine of `specd-sampling`);
//! the parser in `parse.rs` reads exactly this markup back.
//!
//! Free text is allowed only where the model thinks: a prompt that opened `<think>` lets the
//! model reason freely up to `</think>`, and the grammar bites once the call starts — its fixed
//! markup and the function name are then forced tokens, which the engine takes as free drafts.

use crate::schema::Types;
use crate::{ToolFormat, ToolSpec};
use serde_json::{json, Value};

/// A Lark string literal.
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A JSON schema as an inline `%json` value, generated without free whitespace (a model could
/// otherwise emit blanks forever between tokens).
fn json_rule(schema: &Value) -> String {
    let mut s = match schema {
        Value::Object(o) if !o.is_empty() => schema.clone(),
        _ => json!({}),
    };
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    format!("%json {s}")
}

/// The schema of a tool's arguments, always an object.
fn args_schema(t: &ToolSpec) -> Value {
    match &t.parameters {
        Value::Object(o) if !o.is_empty() => t.parameters.clone(),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The Lark grammar of one or more calls (`parallel`) of `tools`, after free reasoning when the
/// prompt opened it (`in_reasoning`).
pub fn tool_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
    in_reasoning: bool,
) -> String {
    let mut rules = Vec::new();
    let head = if in_reasoning {
        rules.push(format!(r#"think[suffix={}]: /(?s:.*)/"#, lit("</think>")));
        rules.push(r#"ws: /[ \t\n]*/"#.to_string());
        "think ws "
    } else {
        ""
    };
    let calls = if parallel {
        "call (\"\\n\" call)*"
    } else {
        "call"
    };
    rules.insert(0, format!("start: {head}{calls}"));
    let fns: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    match format {
        ToolFormat::Hermes => {
            rules.push(format!(
                "call: {} ({}) {}",
                lit("<tool_call>\n"),
                fns.join(" | "),
                lit("\n</tool_call>")
            ));
            for (i, t) in tools.iter().enumerate() {
                rules.push(format!(
                    "fn_{i}: {} {} \"}}\"",
                    lit(&format!(r#"{{"name": {}, "arguments": "#, lit(&t.name))),
                    json_rule(&args_schema(t))
                ));
            }
        }
        ToolFormat::QwenXml => {
            rules.push(format!(
                "call: {} ({}) {}",
                lit("<tool_call>\n"),
                fns.join(" | "),
                lit("</tool_call>")
            ));
            for (i, t) in tools.iter().enumerate() {
                let schema = args_schema(t);
                let required: Vec<&str> = schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let props: Vec<(String, Value)> = schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                let mut req = Vec::new();
                let mut opt = Vec::new();
                for (j, (key, s)) in props.iter().enumerate() {
                    let name = format!("p_{i}_{j}");
                    let value = xml_value(&mut rules, &name, s);
                    rules.push(format!(
                        "{name}: {} {value}",
                        lit(&format!("<parameter={key}>\n")),
                    ));
                    if required.contains(&key.as_str()) {
                        req.push(name);
                    } else {
                        opt.push(name);
                    }
                }
                // Required arguments in the schema's order, then any optional ones.
                let mut args = req.join(" ");
                if !opt.is_empty() {
                    args = format!("{args} ({})*", opt.join(" | "));
                }
                rules.push(format!(
                    "fn_{i}: {} {args} {}",
                    lit(&format!("<function={}>\n", t.name)),
                    lit("</function>\n")
                ));
            }
        }
    }
    rules.join("\n")
}

/// An XML argument value and the markup that closes it: text for string arguments (one of the
/// listed values for an enum), JSON for the others.
fn xml_value(rules: &mut Vec<String>, name: &str, schema: &Value) -> String {
    let close = lit("\n</parameter>\n");
    let types = Types::of(schema);
    if types.only_string() {
        if let Some(vals) = schema.get("enum").and_then(Value::as_array) {
            let alts: Vec<String> = vals.iter().filter_map(Value::as_str).map(lit).collect();
            if !alts.is_empty() {
                return format!("({}) {close}", alts.join(" | "));
            }
        }
    }
    if types.unknown() || types.has("string") {
        // Any text up to the closing markup.
        rules.push(format!("{name}_text[suffix={close}]: /(?s:.*)/",));
        return format!("{name}_text");
    }
    format!("{} {close}", json_rule(schema))
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_sampling::{GrammarSpec, GrammarVocab};

    /// A byte vocabulary (token i = byte i) and EOS = 256.
    fn vocab() -> GrammarVocab {
        let mut pieces: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        pieces.push(None);
        GrammarVocab::new(
            pieces,
            |_| "<eos>".into(),
            256,
            |b| b.iter().map(|&x| x as u32).collect(),
        )
        .expect("vocab")
    }

    /// Whether the grammar takes `text` whole and then allows EOS.
    fn accepts(g: &str, text: &str) -> bool {
        let mut m = match vocab().compile(&GrammarSpec::Lark(g.to_string())) {
            Ok(m) => m,
            Err(e) => panic!("grammar does not compile: {e}\n{g}"),
        };
        for &b in text.as_bytes() {
            if !m.mask().is_allowed(b as u32) || m.accept(b as u32).is_err() {
                return false;
            }
        }
        m.mask().is_allowed(256)
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "integer"}},
                    "required": ["location"]}),
            },
            ToolSpec {
                name: "noop".into(),
                parameters: json!({}),
            },
        ]
    }

    #[test]
    fn xml_grammar_takes_well_formed_calls_only() {
        let g = tool_grammar(ToolFormat::QwenXml, &tools(), false, false);
        let ok = "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\nFrance\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
        assert!(accepts(&g, ok), "{g}");
        assert!(accepts(
            &g,
            "<tool_call>\n<function=noop>\n</function>\n</tool_call>"
        ));
        // Required argument missing, bad integer, bad enum value, unknown function.
        assert!(!accepts(
            &g,
            "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"
        ));
        assert!(!accepts(&g, "<tool_call>\n<function=get_weather>\n<parameter=location>\nP\n</parameter>\n<parameter=days>\nx\n</parameter>\n</function>\n</tool_call>"));
        assert!(!accepts(&g, "<tool_call>\n<function=get_weather>\n<parameter=location>\nP\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n</tool_call>"));
        assert!(!accepts(
            &g,
            "<tool_call>\n<function=other>\n</function>\n</tool_call>"
        ));
        // One call only unless parallel.
        let two = "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";
        assert!(!accepts(&g, two));
        assert!(accepts(
            &tool_grammar(ToolFormat::QwenXml, &tools(), true, false),
            two
        ));
    }

    #[test]
    fn reasoning_before_the_call_is_free() {
        let g = tool_grammar(ToolFormat::QwenXml, &tools()[1..], false, true);
        assert!(accepts(&g, "let me <b>think</b>\n</think>\n\n<tool_call>\n<function=noop>\n</function>\n</tool_call>"));
        assert!(!accepts(
            &g,
            "<tool_call>\n<function=noop>\n</function>\n</tool_call>"
        ));
    }

    #[test]
    fn hermes_grammar_takes_well_formed_calls_only() {
        let g = tool_grammar(ToolFormat::Hermes, &tools(), false, false);
        let ok = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\":\"Paris\",\"days\":3}}\n</tool_call>";
        assert!(accepts(&g, ok), "{g}");
        assert!(!accepts(
            &g,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\":3}}\n</tool_call>"
        ));
        assert!(accepts(
            &g,
            "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"
        ));
    }
}
