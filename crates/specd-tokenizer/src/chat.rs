//! Chat templates (`tokenizer.chat_template`), rendered with minijinja as llama-server renders
//! them: the conversation prepared as llama-server prepares it ([`crate::template_inputs`]) and
//! values written as its Jinja engine writes them ([`crate::template_text`]).

use crate::template_caps::{self, TemplateCaps};
use crate::{template_env, template_inputs, TokenizerError};
use chrono::NaiveDateTime;
use minijinja::{Environment, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

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

/// A compiled chat template, with what it does with its inputs ([`TemplateCaps`]).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    caps: TemplateCaps,
    /// One of llama.cpp's built-in templates ([`crate::templates`]): llama-server renders those
    /// in C++ from each message's role and text, without the preparation real templates get.
    builtin: bool,
    /// GPT-OSS templates have a `developer` role of their own; others see it as `system`.
    keep_developer: bool,
    /// kwargs every render starts from (llama-server's `--chat-template-kwargs`).
    defaults: Map<String, Json>,
    /// Drop a BOS text the template writes first / an EOS text it writes last, for a tokenizer
    /// that adds them itself (as llama-server does).
    strip_bos: bool,
    strip_eos: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

/// Content bytes between the spaced checkpoint marks of a long conversation
/// ([`ChatTemplate::render_marked`]): about 4k tokens.
pub const MARK_SPACING: usize = 16 << 10;
/// Spaced marks per render (each costs a render of a prefix of the conversation).
const MAX_SPACED_MARKS: usize = 3;

/// Bytes two texts share at their start, if they part before either ends (and after their
/// first character).
fn common_prefix(a: &str, b: &str) -> Option<usize> {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .filter(|&i| i > 0)
}

/// The inputs of one render.
#[derive(Debug, Clone, Default)]
pub struct ChatInputs<'a> {
    /// The conversation, as the OpenAI API sends it.
    pub messages: &'a [ChatMessage],
    /// The request's `tools` (OpenAI function tools).
    pub tools: Option<&'a Json>,
    /// The request's `chat_template_kwargs` (over the template's defaults).
    pub kwargs: Map<String, Json>,
    pub add_generation_prompt: bool,
    /// The local time the template sees (`strftime_now`, `date_string`); none: now.
    pub now: Option<NaiveDateTime>,
}

/// Templates llama.cpp patches when it loads them, because a guard in them refuses
/// conversations llama-server hands them: (the template family's marker, guard, replacement).
const SOURCE_PATCHES: &[(&str, &str, &str)] = &[
    // GPT-OSS: refuses history that holds its channel markers.
    (
        "<|channel|>",
        "{%- if \"<|channel|>analysis<|message|>\" in message.content or \"<|channel|>final<|message|>\" in message.content %}",
        "{%- if false %}",
    ),
    // Mistral with [TOOL_CALLS]: refuses an assistant message with neither content nor calls.
    (
        "[TOOL_CALLS]",
        "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and (message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
        "{%- if false %}",
    ),
];

impl ChatTemplate {
    /// Compiles `source` (HF / Jinja syntax) without BOS/EOS texts.
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        Self::with_special_tokens(source, "", "")
    }

    /// Compiles `source`; `bos_token` / `eos_token` are visible to the template.
    pub fn with_special_tokens(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut source = source.to_string();
        for (family, guard, replacement) in SOURCE_PATCHES {
            if source.contains(family) {
                source = source.replace(guard, replacement);
            }
        }
        let builtin = crate::templates::is_builtin(&source);
        let keep_developer = source.contains("<|channel|>");
        let env = template_env::environment(source.clone())?;
        let caps = { template_caps::probe(&source, |ctx| template_env::render(&env, ctx)) };
        let mut defaults = Map::new();
        // llama-server keeps the reasoning of earlier turns unless told not to
        // (`--no-reasoning-preserve`).
        defaults.insert("preserve_reasoning".into(), true.into());
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
            caps,
            builtin,
            keep_developer,
            defaults,
            strip_bos: false,
            strip_eos: false,
        })
    }

    /// What the template does with its inputs.
    pub fn caps(&self) -> &TemplateCaps {
        &self.caps
    }

    /// Sets kwargs every render starts from (a request's `chat_template_kwargs` override them).
    pub fn set_default_kwargs(&mut self, kwargs: &Map<String, Json>) {
        for (k, v) in kwargs {
            self.defaults.insert(k.clone(), v.clone());
        }
    }

    /// For a tokenizer that adds BOS / EOS itself: drop the BOS text a prompt starts with and
    /// the EOS text it ends with.
    pub fn set_added_special_tokens(&mut self, add_bos: bool, add_eos: bool) {
        self.strip_bos = add_bos && !self.bos.is_empty();
        self.strip_eos = add_eos && !self.eos.is_empty();
    }

    /// Renders `messages`; `extra` holds the request's `tools` and its `chat_template_kwargs`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, TokenizerError> {
        let mut kwargs = extra.clone();
        let tools = kwargs.remove("tools");
        self.render_inputs(&ChatInputs {
            messages,
            tools: tools.as_ref(),
            kwargs,
            add_generation_prompt,
            now: None,
        })
    }

    /// [`ChatTemplate::render`], with the byte offsets in the text where a later request of the
    /// same conversation is likely to part from this one — worth a recurrent-state checkpoint
    /// on a hybrid model (`docs/prompt-cache.md`). They are the ends of message prefixes whose
    /// own render starts the full one: all messages (the start of the generation prompt: the
    /// next turn re-renders the answer, often differently, e.g. without its thinking), the
    /// generation prompt as far as a plain answer's opening shares it, through
    /// the last user message (thinking templates drop the reasoning of the turns after it once
    /// a new user message comes), the leading system messages (a shared system prompt and
    /// tools), and in a long conversation a few more message ends, spaced by
    /// [`MARK_SPACING`] bytes of content, counted back from the end.
    pub fn render_marked(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<(String, Vec<usize>), TokenizerError> {
        let full = self.render(messages, add_generation_prompt, extra)?;
        let mut ends = std::collections::BTreeSet::new();
        ends.insert(messages.len());
        if let Some(u) = messages.iter().rposition(|m| m.role == "user") {
            ends.insert(u + 1);
        }
        let lead = messages
            .iter()
            .take_while(|m| m.role == "system" || m.role == "developer")
            .count();
        ends.insert(lead);
        let mut since = 0;
        let mut spaced = 0;
        for k in (1..messages.len()).rev() {
            since += messages[k].content_text().len();
            if since >= MARK_SPACING && spaced < MAX_SPACED_MARKS {
                ends.insert(k);
                since = 0;
                spaced += 1;
            }
        }
        let mut marks = ends
            .into_iter()
            .filter(|&k| k > 0)
            .filter_map(|k| self.render(&messages[..k], false, extra).ok())
            .filter(|head| head.len() < full.len() && full.starts_with(head.as_str()))
            .map(|head| head.len())
            .collect::<std::collections::BTreeSet<_>>();
        // Where a probe message of `role` after `head` starts its text: the text every
        // continuation of `head` with such a message shares with this prompt.
        let probe_mark = |head: &[ChatMessage], role: &str| {
            let mut probe = head.to_vec();
            probe.push(ChatMessage::new(role, "\u{1}"));
            self.render(&probe, false, extra)
                .ok()
                .and_then(|p| common_prefix(&p, &full))
        };
        // The generation prompt as far as the next turn's re-rendered answer will share it
        // (`<|im_start|>assistant\n`).
        if add_generation_prompt && !messages.is_empty() {
            marks.extend(probe_mark(messages, "assistant"));
        }
        // Templates that refuse a conversation of system messages alone (Qwen3.5: "No user
        // query found"): the system prompt then ends where a user message's text starts.
        if lead > 0 && lead < messages.len() {
            marks.extend(probe_mark(&messages[..lead], "user"));
        }
        Ok((full, marks.into_iter().collect()))
    }

    /// Renders a conversation as llama-server renders it.
    pub fn render_inputs(&self, inputs: &ChatInputs) -> Result<String, TokenizerError> {
        let now = inputs
            .now
            .unwrap_or_else(|| chrono::Local::now().naive_local());
        let ctx = self.context(inputs, now)?;
        let mut out = template_env::at(now, || {
            template_env::render(&self.env, Value::from_serialize(&ctx))
        })?;
        if self.strip_bos && out.starts_with(&self.bos) {
            out.drain(..self.bos.len());
        }
        if self.strip_eos && out.ends_with(&self.eos) {
            out.truncate(out.len() - self.eos.len());
        }
        Ok(out)
    }

    /// The variables the template sees.
    fn context(
        &self,
        inputs: &ChatInputs,
        now: NaiveDateTime,
    ) -> Result<Map<String, Json>, TokenizerError> {
        if self.builtin {
            return self.builtin_context(inputs);
        }
        let mut kwargs = self.defaults.clone();
        for (k, v) in &inputs.kwargs {
            kwargs.insert(k.clone(), v.clone());
        }
        let enable_thinking =
            template_inputs::enable_thinking(&kwargs)?.unwrap_or(self.caps.thinking);
        let mut ctx = Map::new();
        // Names templates use for keeping earlier reasoning and for the effort level.
        if let Some(Json::Bool(keep)) = kwargs.get("preserve_reasoning") {
            ctx.insert("preserve_thinking".into(), (*keep).into());
            for name in [
                "clear_thinking",
                "truncate_history_thinking",
                "drop_thinking",
            ] {
                ctx.insert(name.into(), (!keep).into());
            }
        }
        if let Some(Json::String(level)) = kwargs.get("reasoning_effort") {
            if !level.is_empty() {
                ctx.insert("reasoning_effort".into(), level.clone().into());
                ctx.insert("reasoning_strength".into(), level.clone().into());
            }
        }
        let messages = template_inputs::messages(inputs.messages, &self.caps, self.keep_developer)?;
        ctx.insert("messages".into(), messages.into());
        ctx.insert("bos_token".into(), self.bos.clone().into());
        ctx.insert("eos_token".into(), self.eos.clone().into());
        ctx.insert("enable_thinking".into(), enable_thinking.into());
        if let Some(tools) = template_inputs::tools(inputs.tools)? {
            ctx.insert("tools".into(), tools);
        }
        ctx.insert("datetime".into(), now.format("%b %d %Y").to_string().into());
        ctx.insert(
            "date_string".into(),
            now.format("%d %b %Y").to_string().into(),
        );
        for (k, v) in kwargs {
            ctx.insert(k, v);
        }
        if inputs.add_generation_prompt {
            ctx.insert("add_generation_prompt".into(), true.into());
        }
        Ok(ctx)
    }

    /// The variables a built-in template sees: the messages with their text, the kwargs.
    fn builtin_context(&self, inputs: &ChatInputs) -> Result<Map<String, Json>, TokenizerError> {
        let messages = inputs
            .messages
            .iter()
            .map(|m| {
                m.validate()?;
                let mut o = m.extra.clone();
                o.insert("role".into(), m.role.clone().into());
                o.insert("content".into(), m.content_text().into());
                Ok(Json::Object(o))
            })
            .collect::<Result<Vec<_>, TokenizerError>>()?;
        let mut ctx = inputs.kwargs.clone();
        ctx.insert("messages".into(), messages.into());
        ctx.insert(
            "add_generation_prompt".into(),
            inputs.add_generation_prompt.into(),
        );
        ctx.entry("bos_token")
            .or_insert_with(|| self.bos.clone().into());
        ctx.entry("eos_token")
            .or_insert_with(|| self.eos.clone().into());
        Ok(ctx)
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
