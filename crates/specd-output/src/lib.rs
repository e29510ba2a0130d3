//! The output stage: the text a slot generates, turned into what a client reads. It sits
//! beside the speculative round (which decides tokens) and before the API dialects (which
//! only format): every dialect — OpenAI chat, Anthropic Messages, OpenAI Responses — reads the
//! same [`Delta`]s while streaming and the same [`AssistantMessage`] at the end.
//!
//! Text goes in as the engine emits it (complete UTF-8, stop strings already cut off); out
//! come reasoning, content and tool calls.
//!
//! # Why the parsers are written here
//!
//! SGLang's model gateway publishes `tool-parser` 1.10 and `reasoning-parser` 1.10, which we
//! evaluated first. Their Qwen XML and Hermes parsers are sound (schema-typed XML values,
//! string values streamed before a parameter closes), but they do not fit this stage:
//! - `tool-parser`'s API is async (`async_trait`, tokio) while this stage is called
//!   synchronously from the streaming loop, once per emitted piece of text;
//! - its tool type is `openai-protocol`'s request type, a second copy of the whole OpenAI
//!   request model beside the server's own, and it builds every parser it knows, pulling in
//!   `rustpython-parser` (for the pythonic format) and `malachite`: 192 crates for the two
//!   together (minutes of extra build on a small CI machine; the measurement is in the issue
//!   note), for two formats that take a few hundred lines;
//! - `reasoning-parser` alone is lighter, but the split is a few dozen lines that must share
//!   one buffer with the tool-call parser (in Qwen3.5's output a call may end the thinking);
//! - neither builds the grammar that makes `tool_choice: required` hold, which must know the
//!   exact same markup the parser reads — one module owning both keeps them in step.
//!
//! What is written by hand is only the markup of the two formats and the JSON-schema type of a
//! parameter; JSON itself is read and written by `serde_json`.

mod grammar;
mod parse;
mod schema;
pub mod text;

pub use grammar::tool_grammar;
pub use text::TextStage;

use serde::{Deserialize, Serialize};

/// One piece of an assistant message as it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Text of the reasoning (`reasoning_content`, Anthropic `thinking`).
    Reasoning(String),
    /// Text of the answer.
    Content(String),
    /// A tool call begins: its place among the message's calls, id and function name.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of a tool call's arguments (JSON text; the pieces of one call concatenate to its
    /// `arguments`).
    ToolCallArguments { index: usize, arguments: String },
}

/// A tool call of an assistant message: `arguments` is a JSON object as text (OpenAI's form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A whole assistant message: what the deltas of a generation add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssistantMessage {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// Adds a delta to the message.
    pub fn apply(&mut self, d: &Delta) {
        match d {
            Delta::Reasoning(t) => self.reasoning.push_str(t),
            Delta::Content(t) => self.content.push_str(t),
            Delta::ToolCallStart { id, name, .. } => self.tool_calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            Delta::ToolCallArguments { index, arguments } => {
                if let Some(c) = self.tool_calls.get_mut(*index) {
                    c.arguments.push_str(arguments);
                }
            }
        }
    }
}

/// Where reasoning goes (llama-server's `--reasoning-format`; `auto` reads as `deepseek`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Thoughts stay in the content, tags and all.
    #[default]
    None,
    /// Thoughts go to `reasoning_content`.
    Deepseek,
    /// llama-server documents it as keeping the tags in the content too, but its parser (the
    /// one for Qwen3.5 templates included) answers exactly as `Deepseek`; so does specd.
    DeepseekLegacy,
}

impl ReasoningFormat {
    /// llama-server's names: `none`, `deepseek`, `deepseek-legacy`, `auto`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Self::None),
            "deepseek" | "auto" => Some(Self::Deepseek),
            "deepseek-legacy" => Some(Self::DeepseekLegacy),
            _ => None,
        }
    }
}

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen3-Coder / Qwen3.5: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
    /// </function>\n</tool_call>`, values raw text typed by the tool's schema.
    QwenXml,
    /// Hermes (Qwen2.5, Qwen3): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`.
    Hermes,
}

impl ToolFormat {
    /// The format a chat template teaches its model, read off the template's source as
    /// llama.cpp does. A template that shows no tool-call markup gets Hermes, the most common
    /// JSON form.
    pub fn of_template(src: &str) -> Self {
        if src.contains("<tool_call>") && src.contains("<function=") && src.contains("<parameter=")
        {
            ToolFormat::QwenXml
        } else {
            ToolFormat::Hermes
        }
    }
}

/// A function the request offers (`tools[].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// The JSON schema of its arguments (an object schema; `{}` when the tool gives none).
    pub parameters: serde_json::Value,
}

/// What a generation's output is parsed for. The default passes all text through as content.
#[derive(Debug, Clone, Default)]
pub struct OutputConfig {
    /// Whether and how `<think>…</think>` is split off.
    pub reasoning: ReasoningFormat,
    /// The prompt already opened the thinking block (it ends with `<think>`): the output starts
    /// inside the reasoning.
    pub in_reasoning: bool,
    /// Tool calls are parsed in this format (None: no tools offered, or `tool_choice: none`).
    pub tool_format: Option<ToolFormat>,
    /// The tools offered (names and argument schemas, for typing XML argument values).
    pub tools: Vec<ToolSpec>,
}

/// The output stage of one generation: text in, deltas out.
#[derive(Debug)]
pub struct ChatOutput {
    parser: parse::Parser,
    message: AssistantMessage,
}

impl ChatOutput {
    pub fn new(cfg: OutputConfig) -> Self {
        ChatOutput {
            parser: parse::Parser::new(cfg),
            message: AssistantMessage::default(),
        }
    }

    /// The deltas that newly generated `text` completes (text that may still turn out to be
    /// markup is held back until it is decided).
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let out = self.parser.push(text);
        self.record(out)
    }

    /// The deltas still held back when the generation ends.
    pub fn finish(&mut self) -> Vec<Delta> {
        let out = self.parser.finish();
        self.record(out)
    }

    /// The whole message of a finished generation's text (what the deltas of its stream add
    /// up to).
    pub fn parse(cfg: OutputConfig, text: &str) -> AssistantMessage {
        let mut o = ChatOutput::new(cfg);
        o.push(text);
        o.finish();
        o.message
    }

    /// The message so far (all of it after [`ChatOutput::finish`]).
    pub fn message(&self) -> &AssistantMessage {
        &self.message
    }

    fn record(&mut self, out: Vec<Delta>) -> Vec<Delta> {
        for d in &out {
            self.message.apply(d);
        }
        out
    }
}

#[cfg(test)]
mod tests;
