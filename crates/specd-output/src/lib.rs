//! The output stage: the text a slot generates, turned into what a client reads. It sits
//! beside the speculative round (which decides tokens) and before the API dialects (which
//! only format): every dialect — OpenAI chat, Anthropic Messages, OpenAI Responses — reads the
//! same [`Delta`]s while streaming and the same [`AssistantMessage`] at the end.
//!
//! Text goes in as the engine emits it (complete UTF-8, stop strings already cut off); out
//! come reasoning, content and tool calls.

pub mod text;

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

/// What a generation's output is parsed for.
#[derive(Debug, Clone, Default)]
pub struct OutputConfig {}

/// The output stage of one generation: text in, deltas out.
#[derive(Debug)]
pub struct ChatOutput {
    message: AssistantMessage,
}

impl ChatOutput {
    pub fn new(_cfg: OutputConfig) -> Self {
        ChatOutput {
            message: AssistantMessage::default(),
        }
    }

    /// The deltas that newly generated `text` completes (text that may still turn out to be
    /// markup is held back until it is decided).
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let out = if text.is_empty() {
            Vec::new()
        } else {
            vec![Delta::Content(text.to_string())]
        };
        for d in &out {
            self.message.apply(d);
        }
        out
    }

    /// The deltas still held back when the generation ends.
    pub fn finish(&mut self) -> Vec<Delta> {
        Vec::new()
    }

    /// The message so far (all of it after [`ChatOutput::finish`]).
    pub fn message(&self) -> &AssistantMessage {
        &self.message
    }
}
