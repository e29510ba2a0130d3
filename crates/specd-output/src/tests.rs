//! The output stage on each format, whole and streamed in arbitrary pieces.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "location": {"type": "string"},
                "days": {"type": "integer"},
                "opts": {"type": "object"},
                "note": {"anyOf": [{"type": "number"}, {"type": "string"}]}},
                "required": ["location"]}),
        },
        ToolSpec {
            name: "noop".into(),
            parameters: json!({}),
        },
    ]
}

fn cfg(reasoning: ReasoningFormat, in_reasoning: bool, tf: Option<ToolFormat>) -> OutputConfig {
    OutputConfig {
        reasoning,
        in_reasoning,
        tool_format: tf,
        tools: tools(),
    }
}

/// The message of `text` pushed in `pieces` (byte cuts moved to char boundaries), with the
/// call ids (random) blanked.
fn run(cfg: OutputConfig, text: &str, cuts: &[usize]) -> AssistantMessage {
    let mut o = ChatOutput::new(cfg);
    let mut last = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c % (text.len() + 1)).collect();
    cuts.sort();
    let mut all = Vec::new();
    for c in cuts.into_iter().chain([text.len()]) {
        let mut c = c.max(last);
        while !text.is_char_boundary(c) {
            c += 1;
        }
        all.extend(o.push(&text[last..c]));
        last = c;
    }
    all.extend(o.finish());
    // The deltas add up to the message.
    let mut m = AssistantMessage::default();
    for d in &all {
        m.apply(d);
    }
    let mut got = o.message().clone();
    assert_eq!(m, got);
    for c in &mut got.tool_calls {
        c.id.clear();
    }
    got
}

fn whole(cfg: OutputConfig, text: &str) -> AssistantMessage {
    run(cfg, text, &[])
}

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: args.into(),
    }
}

const XML: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, \"FR\"\nnear </par\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2], \"b\": null}\n</parameter>\n<parameter=note>\n2.5\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";

#[test]
fn default_passes_text_through() {
    let m = whole(OutputConfig::default(), "<think>a</think> <tool_call>x");
    assert_eq!(m.content, "<think>a</think> <tool_call>x");
    assert!(m.reasoning.is_empty() && m.tool_calls.is_empty());
}

#[test]
fn reasoning_split() {
    let d = ReasoningFormat::Deepseek;
    let m = whole(cfg(d, false, None), "<think>\nhmm  \n</think>\n\nAnswer");
    assert_eq!(
        (m.reasoning.as_str(), m.content.as_str()),
        ("hmm  \n", "Answer")
    );
    // The prompt opened the block.
    let m = whole(cfg(d, true, None), "\nhmm\n</think>\n\nAnswer");
    assert_eq!(
        (m.reasoning.as_str(), m.content.as_str()),
        ("hmm\n", "Answer")
    );
    // Cut off while thinking: all reasoning.
    let m = whole(cfg(d, true, None), "still </thi");
    assert_eq!(
        (m.reasoning.as_str(), m.content.as_str()),
        ("still </thi", "")
    );
    // `<think>` only opens the message.
    let m = whole(cfg(d, false, None), "x <think>y</think>");
    assert_eq!(m.content, "x <think>y</think>");
    // none: untouched, with the tag the prompt opened (llama-server).
    let m = whole(cfg(ReasoningFormat::None, true, None), "a</think>b");
    assert_eq!(m.content, "<think>\na</think>b");
    let m = whole(cfg(ReasoningFormat::None, false, None), "a</think>b");
    assert_eq!(m.content, "a</think>b");
    // deepseek-legacy answers as deepseek (llama-server).
    let m = whole(
        cfg(ReasoningFormat::DeepseekLegacy, true, None),
        "a\n</think>\n\nb",
    );
    assert_eq!((m.reasoning.as_str(), m.content.as_str()), ("a\n", "b"));
}

#[test]
fn xml_calls_typed_by_schema() {
    let m = whole(
        cfg(ReasoningFormat::Deepseek, false, Some(ToolFormat::QwenXml)),
        XML,
    );
    // The text before a call keeps its whitespace (llama-server).
    assert_eq!(m.content, "Let me check.\n\n");
    assert_eq!(
        m.tool_calls,
        vec![
            call(
                "get_weather",
                r#"{"location":"Paris, \"FR\"\nnear </par","days":3,"opts":{"a":[1,2],"b":null},"note":2.5}"#
            ),
            call("noop", "{}"),
        ]
    );
    for c in &m.tool_calls {
        serde_json::from_str::<serde_json::Value>(&c.arguments).expect("arguments are JSON");
    }
}

#[test]
fn a_call_may_end_the_thinking() {
    let m = whole(
        cfg(ReasoningFormat::Deepseek, true, Some(ToolFormat::QwenXml)),
        "I will call.\n<tool_call>\n<function=noop>\n</function>\n</tool_call>",
    );
    assert_eq!(m.reasoning, "I will call.\n");
    assert_eq!(m.tool_calls, vec![call("noop", "{}")]);
}

#[test]
fn hermes_calls() {
    let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": \"{}\"}\n</tool_call>";
    let m = whole(
        cfg(ReasoningFormat::Deepseek, false, Some(ToolFormat::Hermes)),
        text,
    );
    assert_eq!(m.content, "Sure.\n");
    assert_eq!(
        m.tool_calls,
        vec![
            call("get_weather", r#"{"location":"Paris","days":3}"#),
            call("noop", "{}")
        ]
    );
}

#[test]
fn malformed_calls_are_content() {
    let x = Some(ToolFormat::QwenXml);
    let d = ReasoningFormat::Deepseek;
    // Unknown function, no function at all, a name that never closes.
    for text in [
        "a <tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
        "a <tool_call> is a tag",
        "a <tool_call>\n<function=get_weather\nmore text",
    ] {
        let m = whole(cfg(d, false, x), text);
        assert!(m.tool_calls.is_empty(), "{text}");
        assert_eq!(m.content, text, "{text}");
    }
    let h = Some(ToolFormat::Hermes);
    for text in [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{not json}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
    ] {
        let m = whole(cfg(d, false, h), text);
        assert!(m.tool_calls.is_empty(), "{text}");
        assert_eq!(m.content, text, "{text}");
    }
}

#[test]
fn a_call_cut_off_still_has_json_arguments() {
    let m = whole(
        cfg(ReasoningFormat::Deepseek, false, Some(ToolFormat::QwenXml)),
        "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar",
    );
    assert_eq!(
        m.tool_calls,
        vec![call("get_weather", r#"{"location":"Par"}"#)]
    );
}

#[test]
fn string_values_stream_before_they_close() {
    let mut o = ChatOutput::new(cfg(ReasoningFormat::None, false, Some(ToolFormat::QwenXml)));
    o.push("<tool_call>\n<function=get_weather>\n<parameter=location>\n");
    let d = o.push("Paris and");
    assert_eq!(
        d,
        vec![Delta::ToolCallArguments {
            index: 0,
            arguments: "Paris and".into()
        }]
    );
}

const SAMPLES: &[&str] = &[
    XML,
    "<think>\nwhy </thin not\n</think>\n\nThe answer is <b>42</b> éè 😀 <tool_ca",
    "thinking é\n</think>\n\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call> tail",
    "a <tool_call> b <tool_call>\n<function=noop>\n<parameter=x>\n[1,\n2]\n</parameter>\n</function>\n</tool_call>",
];

proptest! {
    #[test]
    fn streamed_in_any_pieces_equals_whole(
        sample in 0..SAMPLES.len(),
        cuts in proptest::collection::vec(0usize..400, 0..12),
        reasoning in prop_oneof![Just(ReasoningFormat::None), Just(ReasoningFormat::Deepseek), Just(ReasoningFormat::DeepseekLegacy)],
        in_reasoning in any::<bool>(),
        tf in prop_oneof![Just(None), Just(Some(ToolFormat::QwenXml)), Just(Some(ToolFormat::Hermes))],
    ) {
        let text = SAMPLES[sample];
        let c = || cfg(reasoning, in_reasoning, tf);
        prop_assert_eq!(run(c(), text, &cuts), whole(c(), text));
    }
}
