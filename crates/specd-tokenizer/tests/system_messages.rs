//! System and developer messages anywhere in a conversation (Claude Code's mid-conversation
//! system messages, Codex's leading developer items) reach the real templates as
//! `docs/chat-messages.md` says, and the checkpoint marks fall on message boundaries.

use serde_json::{json, Map};
use specd_tokenizer::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};

fn template(name: &str) -> ChatTemplate {
    let path = format!(
        "{}/tests/real_templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(&path).expect("template file");
    ChatTemplate::new(&src).expect("compiles")
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are Codex."),
        ChatMessage::new("developer", "Sandbox: read-only."),
        ChatMessage::new("user", "List the files."),
        ChatMessage::new("assistant", "Here they are."),
        ChatMessage::new("system", "Reminder: be brief."),
        ChatMessage::new("user", "Thanks."),
    ]
}

#[test]
fn qwen_templates_take_system_messages_anywhere() {
    let no_kwargs = Map::new();
    for name in ["Qwen3.5-4B", "Qwen3-Coder", "Qwen-Qwen3-0.6B"] {
        let t = template(name);
        let out = t
            .render(&conversation(), true, &no_kwargs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if t.caps().system_anywhere {
            // Qwen3-Coder and Qwen3 write system messages wherever they are; Qwen3.5 refuses.
            assert_ne!(name, "Qwen3.5-4B");
            continue;
        }
        // The leading run is one system message, the later one a user message in its place.
        assert!(
            out.starts_with("<|im_start|>system\nYou are Codex.\n\nSandbox: read-only.<|im_end|>"),
            "{name}: {out}"
        );
        assert_eq!(out.matches("<|im_start|>system").count(), 1, "{name}");
        let later = out.find("<|im_start|>user\nReminder: be brief.<|im_end|>");
        let answer = out.find("Here they are.");
        assert!(later.is_some() && answer < later, "{name}: {out}");
    }
}

#[test]
fn a_template_that_takes_them_gets_them_as_sent() {
    let t = ChatTemplate::new(CHATML_TEMPLATE).expect("compiles");
    assert!(t.caps().system_anywhere);
    let out = t
        .render(&conversation(), true, &Map::new())
        .expect("renders");
    assert_eq!(out.matches("<|im_start|>system").count(), 3, "{out}");
}

#[test]
fn marks_fall_where_the_next_turn_parts() {
    let t = template("Qwen3.5-4B");
    let mut msgs = conversation();
    let mut answer = ChatMessage::new("assistant", "Done.");
    answer
        .extra
        .insert("reasoning_content".into(), json!("The user thanked me."));
    let (turn1, marks) = t.render_marked(&msgs, true, &Map::new()).expect("renders");
    // Marks: after the leading system messages, and at the end of the last (user) message —
    // before the generation prompt.
    let gen_start = turn1
        .rfind("<|im_start|>assistant\n")
        .expect("generation prompt");
    assert!(marks.contains(&gen_start), "{marks:?} {gen_start}");
    // The system prompt's end: where any conversation's first user message starts (Qwen3.5
    // refuses to render the system messages alone, so the mark is the common start of a user
    // turn).
    let user_text = turn1.find("List the files.").expect("the user message");
    assert!(marks.contains(&user_text), "{marks:?} {user_text}");
    assert!(marks.iter().all(|&m| m < turn1.len()));
    // The next turn re-renders the answer without its thinking: it shares the text up to the
    // generation prompt's start, the mark.
    msgs.push(answer);
    msgs.push(ChatMessage::new("user", "One more."));
    let turn2 = t.render(&msgs, true, &Map::new()).expect("renders");
    assert!(turn2.starts_with(&turn1[..gen_start]));
    assert!(!turn2.starts_with(&turn1));
}
