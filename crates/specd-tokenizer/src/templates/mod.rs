//! llama.cpp's built-in chat templates by name (`--chat-template llama3`), written in Jinja.
//!
//! llama-server renders these names with hand-written C++ (`src/llama-chat.cpp`, used without
//! `--jinja`); specd renders every chat template with minijinja, so each name has a Jinja
//! template here (`NAME.jinja`) that renders the same text. The tests compare them with prompts
//! llama-server rendered (`tests/named_templates.json`).

macro_rules! named {
    ($($name:literal,)*) => {
        &[$(($name, include_str!(concat!($name, ".jinja"))),)*]
    };
}

/// Every name with its Jinja source, sorted by name.
static NAMED: &[(&str, &str)] = named![
    "bailing",
    "bailing-think",
    "bailing2",
    "chatglm3",
    "chatglm4",
    "chatml",
    "command-r",
    "deepseek",
    "deepseek-ocr",
    "deepseek2",
    "deepseek3",
    "exaone-moe",
    "exaone3",
    "exaone4",
    "falcon3",
    "gemma",
    "gigachat",
    "glmedge",
    "gpt-oss",
    "granite",
    "granite-4.0",
    "granite-4.1",
    "grok-2",
    "hunyuan-dense",
    "hunyuan-moe",
    "hunyuan-vl",
    "kimi-k2",
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "llama3",
    "llama4",
    "megrez",
    "minicpm",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "monarch",
    "openchat",
    "orion",
    "pangu-embedded",
    "phi3",
    "phi4",
    "rwkv-world",
    "seed_oss",
    "smolvlm",
    "solar-open",
    "vicuna",
    "vicuna-orca",
    "yandex",
    "zephyr",
];

/// The Jinja source of the built-in template `name`.
pub fn named(name: &str) -> Option<&'static str> {
    NAMED.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The names of the built-in templates, sorted.
pub fn names() -> impl Iterator<Item = &'static str> {
    NAMED.iter().map(|(n, _)| *n)
}

/// Whether `source` is one of the built-in templates: llama-server renders those with its C++
/// renderer, which sees each message as its role and text only (no Jinja preparation).
pub fn is_builtin(source: &str) -> bool {
    NAMED.iter().any(|(_, s)| *s == source)
}
