//! Chat templates (`tokenizer.chat_template`), rendered with minijinja.

use crate::TokenizerError;
use minijinja::{Environment, Value};
use serde::{Deserialize, Serialize};

/// A ChatML template, the one the synthetic test models carry (and a fallback for files
/// without a template).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// One chat message as in the OpenAI API: `content` is a string or a list of parts
/// (`{"type": "text", "text": ...}`); other fields (`name`, `tool_calls`, …) pass through to the
/// template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: serde_json::Value,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: serde_json::Value::String(content.to_string()),
            extra: Default::default(),
        }
    }

    /// The text of the content: the string, or the text parts joined by a newline (as
    /// llama.cpp hands parts to templates that take string content).
    pub fn content_text(&self) -> String {
        self.content_joined("\n")
    }

    /// The text of the content, text parts joined by `sep`.
    pub fn content_joined(&self, sep: &str) -> String {
        match &self.content {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                .collect::<Vec<_>>()
                .join(sep),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        }
    }

    /// Content checked for what a text model can take: a string, null, or text parts only.
    pub fn validate(&self) -> Result<(), TokenizerError> {
        match &self.content {
            serde_json::Value::String(_) | serde_json::Value::Null => Ok(()),
            serde_json::Value::Array(parts) => {
                for p in parts {
                    match p.get("type").and_then(|t| t.as_str()) {
                        Some("text") if p.get("text").is_some_and(|t| t.is_string()) => {}
                        Some(t) => {
                            return Err(TokenizerError::Template(format!(
                                "content part of type '{t}' is not supported by a text model"
                            )))
                        }
                        None => {
                            return Err(TokenizerError::Template(
                                "content part without a type".into(),
                            ))
                        }
                    }
                }
                Ok(())
            }
            _ => Err(TokenizerError::Template(
                "message content must be a string or a list of parts".into(),
            )),
        }
    }
}

/// Which part of a final message a continuation extends (vLLM's `continue_final_message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// The content (after any reasoning, closed).
    Content,
    /// The reasoning, left open.
    Reasoning,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// Compiles `source` (HF / Jinja syntax) without BOS/EOS texts.
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        Self::with_special_tokens(source, "", "")
    }

    /// Compiles `source`; `bos_token` / `eos_token` are visible to the template.
    pub fn with_special_tokens(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        // HF renders chat templates with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string methods (`.strip()`, `.startswith()`, …) that real templates call.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |_fmt: String| -> String {
            // Templates use it for a "today is" line; a fixed date keeps prompts reproducible.
            "01 Jan 2026".to_string()
        });
        env.add_template_owned("chat", source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders `messages`; `extra` adds variables (`tools`, `enable_thinking`, …).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let msgs: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                m.validate()?;
                let mut o = m.extra.clone();
                o.insert("role".into(), m.role.clone().into());
                o.insert("content".into(), m.content_text().into());
                Ok(serde_json::Value::Object(o))
            })
            .collect::<Result<_, TokenizerError>>()?;
        let mut ctx = extra.clone();
        ctx.insert("messages".into(), msgs.into());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.entry("bos_token")
            .or_insert_with(|| self.bos.clone().into());
        ctx.entry("eos_token")
            .or_insert_with(|| self.eos.clone().into());
        let t = self.env.get_template("chat")?;
        Ok(t.render(Value::from_serialize(&ctx))?)
    }

    /// Renders `messages` so that generation continues the last one instead of answering it
    /// (assistant prefill): the earlier messages, the assistant turn's opening as the generation
    /// prompt writes it, then the last message's text, left open. Where the template writes
    /// reasoning in assistant turns, the turn is laid out as the template lays out reasoning and
    /// content (reasoning closed before content, or left open for [`Continuation::Reasoning`]).
    /// Text parts of the continued message are joined by a blank line.
    pub fn render_continuation(
        &self,
        messages: &[ChatMessage],
        part: Continuation,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let Some((last, head)) = messages.split_last() else {
            return self.render(&[], false, extra);
        };
        last.validate()?;
        let base = self.render(head, false, extra)?;
        let with_prompt = self.render(head, true, extra)?;
        let same = base
            .char_indices()
            .zip(with_prompt.chars())
            .find(|((_, a), b)| a != b)
            .map_or(base.len().min(with_prompt.len()), |((i, _), _)| i);
        let generation_prompt = &with_prompt[same..];
        let content = last.content_joined("\n\n");
        let reasoning = last
            .extra
            .get("reasoning_content")
            .and_then(|r| r.as_str())
            .unwrap_or("");
        // How the template writes an assistant turn that has reasoning: render one with marker
        // texts and read what comes before the reasoning and between reasoning and content.
        const R: &str = "\u{1}specd-reasoning\u{1}";
        const C: &str = "\u{1}specd-content\u{1}";
        let mut probe = ChatMessage::new("assistant", C);
        probe.extra.insert("reasoning_content".into(), R.into());
        let mut with_probe = head.to_vec();
        with_probe.push(probe);
        let layout = self
            .render(&with_probe, false, extra)
            .ok()
            .and_then(|full| {
                let turn = full.strip_prefix(base.as_str())?;
                let (r, c) = (turn.find(R)?, turn.find(C)?);
                (r < c).then(|| (turn[..r].to_string(), turn[r + R.len()..c].to_string()))
            });
        let mut out = base.clone();
        match (layout, part) {
            (Some((before, between)), part) => {
                out.push_str(&before);
                out.push_str(reasoning);
                if part == Continuation::Content {
                    out.push_str(&between);
                    out.push_str(&content);
                }
            }
            (None, Continuation::Content) => {
                out.push_str(generation_prompt);
                out.push_str(&content);
            }
            // A template without reasoning has no reasoning to continue.
            (None, Continuation::Reasoning) => out.push_str(generation_prompt),
        }
        Ok(out)
    }
}
