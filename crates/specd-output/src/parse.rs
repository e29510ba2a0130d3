//! The streaming parser: generated text in, reasoning / content / tool-call deltas out. Text that
//! may still turn out to be markup (the start of `</think>`, `<tool_call>`, `</parameter>`) waits
//! in the buffer until the next text decides it; everything else goes out at once, so that the
//! deltas of any chunking of a text add up to the same message.

use crate::schema::{arg_schema, typed_value, Types};
use crate::{Delta, OutputConfig, ReasoningFormat, ToolFormat};
use serde_json::Value;
use std::hash::{BuildHasher, Hasher};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
/// A function or parameter name longer than this is not markup (the text is content).
const MAX_NAME: usize = 256;

#[derive(Debug)]
enum State {
    /// Nothing read yet: a `<think>` here opens the reasoning.
    Start,
    /// Inside `<think>…`; `skip_ws`: the whitespace that opens it is not reasoning.
    Reasoning {
        skip_ws: bool,
    },
    /// After `</think>`: the whitespace before the answer is dropped.
    AfterReasoning,
    Content,
    /// After `<tool_call>`: the call's header decides whether it is one.
    CallOpen,
    /// Hermes: the JSON of a call, up to `</tool_call>`; `seen`: bytes already searched for
    /// it (a call re-emitting a whole file must not be searched again at every token).
    Hermes {
        seen: usize,
    },
    /// XML: inside `<function=…>`, between parameters; `any`: a parameter was written.
    Function {
        any: bool,
    },
    /// XML: inside `<parameter=KEY>`.
    Param(Param),
    /// XML: after `</function>`, before `</tool_call>`.
    FunctionDone,
    /// After a call: another call, or content.
    AfterCall,
}

#[derive(Debug)]
struct Param {
    /// `"KEY":` (with the `{` or `,` before it).
    head: String,
    types: Types,
    /// A string-only value streams as it is generated; any other waits for its end.
    streamed: bool,
    /// The newline that follows `<parameter=KEY>` is markup, not value.
    skip_nl: bool,
    /// The value so far (values that wait).
    value: String,
}

#[derive(Debug)]
pub(crate) struct Parser {
    cfg: OutputConfig,
    buf: String,
    state: State,
    /// Calls started so far (the next call's index).
    calls: usize,
    /// The name of the call being read.
    name: String,
    ids: std::collections::hash_map::RandomState,
}

/// How many trailing bytes of `buf` could be the start of one of `pats` (they are held back).
fn held(buf: &str, pats: &[&str]) -> usize {
    let b = buf.as_bytes();
    let longest = pats.iter().map(|p| p.len()).max().unwrap_or(0);
    for n in (1..=longest.min(b.len())).rev() {
        let tail = &b[b.len() - n..];
        if pats
            .iter()
            .any(|p| p.len() > n && p.as_bytes().starts_with(tail))
        {
            return n;
        }
    }
    0
}

/// A JSON string's body (without its quotes): escaping works char by char, so the bodies of the
/// pieces of a text concatenate to the body of the whole.
fn json_body(s: &str) -> String {
    let q = Value::String(s.to_string()).to_string();
    q[1..q.len() - 1].to_string()
}

impl Parser {
    pub(crate) fn new(cfg: OutputConfig) -> Self {
        let state = match cfg.reasoning {
            ReasoningFormat::None => State::Content,
            _ if cfg.in_reasoning => State::Reasoning { skip_ws: true },
            _ => State::Start,
        };
        // Thoughts left in the content begin with the tag the prompt opened them with, as
        // llama-server shows them.
        let buf = match cfg.reasoning {
            ReasoningFormat::None if cfg.in_reasoning => "<think>\n".to_string(),
            _ => String::new(),
        };
        Parser {
            cfg,
            buf,
            state,
            calls: 0,
            name: String::new(),
            ids: Default::default(),
        }
    }

    pub(crate) fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    pub(crate) fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// A call id as llama-server makes them: 32 random letters and digits.
    fn new_id(&self) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut h = self.ids.build_hasher();
        h.write_usize(self.calls);
        let mut x = h.finish();
        (0..32)
            .map(|i| {
                if i % 8 == 0 {
                    h.write_u64(x);
                    x = h.finish();
                }
                let c = ALNUM[(x % ALNUM.len() as u64) as usize] as char;
                x /= ALNUM.len() as u64;
                c
            })
            .collect()
    }

    fn tools_on(&self) -> bool {
        self.cfg.tool_format.is_some()
    }

    fn take(&mut self, n: usize) -> String {
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }

    fn skip_ws(&mut self) {
        let n = self.buf.len() - self.buf.trim_start().len();
        self.buf.drain(..n);
    }

    fn args(&self, out: &mut Vec<Delta>, s: String) {
        out.push(Delta::ToolCallArguments {
            index: self.calls - 1,
            arguments: s,
        });
    }

    /// One step of the state machine; false when it waits for more text (or, at the end, when
    /// all is out).
    fn step(&mut self, out: &mut Vec<Delta>, eof: bool) -> bool {
        match &mut self.state {
            State::Start => {
                let t = self.buf.trim_start();
                if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                    self.buf = rest.to_string();
                    self.state = State::Reasoning { skip_ws: true };
                    true
                } else if THINK_OPEN.starts_with(t) && !eof {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
            State::Reasoning { skip_ws } => {
                if *skip_ws {
                    let n = self.buf.len() - self.buf.trim_start().len();
                    self.buf.drain(..n);
                    if self.buf.is_empty() {
                        return false;
                    }
                    *skip_ws = false;
                }
                let mut ends = vec![THINK_CLOSE];
                if self.tools_on() {
                    // A call may end the thinking (llama.cpp's Qwen3.5 parser too).
                    ends.push(CALL_OPEN);
                }
                let found = ends
                    .iter()
                    .filter_map(|e| self.buf.find(e).map(|i| (i, *e)))
                    .min();
                if let Some((i, end)) = found {
                    let r = self.take(i);
                    if !r.is_empty() {
                        out.push(Delta::Reasoning(r));
                    }
                    self.buf.drain(..end.len());
                    self.state = if end == THINK_CLOSE {
                        State::AfterReasoning
                    } else {
                        State::CallOpen
                    };
                    return true;
                }
                let keep = if eof { 0 } else { held(&self.buf, &ends) };
                let n = self.buf.len() - keep;
                if n == 0 {
                    return false;
                }
                let r = self.take(n);
                out.push(Delta::Reasoning(r));
                true
            }
            State::AfterReasoning => {
                self.skip_ws();
                if self.buf.is_empty() {
                    return false;
                }
                self.state = State::Content;
                true
            }
            State::Content => self.content(out, eof),
            State::CallOpen => match self.cfg.tool_format {
                Some(ToolFormat::Hermes) => {
                    let t = self.buf.trim_start();
                    if t.is_empty() && !eof {
                        return false;
                    }
                    if t.starts_with('{') {
                        self.state = State::Hermes { seen: 0 };
                    } else {
                        self.not_a_call(out);
                    }
                    true
                }
                _ => self.xml_header(out, eof),
            },
            State::Hermes { seen } => {
                let from = *seen;
                self.hermes(out, eof, from)
            }
            State::Function { any } => {
                let any = *any;
                let t = self.buf.trim_start();
                let ws = self.buf.len() - t.len();
                if let Some(rest) = t.strip_prefix(PARAM_OPEN) {
                    let Some(gt) = rest.find('>') else {
                        if rest.len() > MAX_NAME || eof {
                            self.end_call(out, any);
                            self.state = State::Content;
                            return true;
                        }
                        return false;
                    };
                    let key = rest[..gt].to_string();
                    self.buf.drain(..ws + PARAM_OPEN.len() + gt + 1);
                    let types = Types::of(arg_schema(&self.cfg.tools, &self.name, &key));
                    let head = format!("{}{}:", if any { "," } else { "{" }, Value::String(key));
                    let streamed = types.only_string();
                    if streamed {
                        self.args(out, format!("{head}\""));
                    }
                    self.state = State::Param(Param {
                        head,
                        types,
                        streamed,
                        skip_nl: true,
                        value: String::new(),
                    });
                    true
                } else if let Some(rest) = t.strip_prefix(FUNCTION_CLOSE) {
                    self.buf = rest.to_string();
                    self.end_call(out, any);
                    self.state = State::FunctionDone;
                    true
                } else if !eof && (PARAM_OPEN.starts_with(t) || FUNCTION_CLOSE.starts_with(t)) {
                    false
                } else {
                    // Not a parameter: the call ends here, what follows is content.
                    self.end_call(out, any);
                    self.state = State::Content;
                    true
                }
            }
            State::Param(_) => self.param(out, eof),
            State::FunctionDone => {
                let t = self.buf.trim_start();
                if let Some(rest) = t.strip_prefix(CALL_CLOSE) {
                    self.buf = rest.to_string();
                    self.state = State::AfterCall;
                    true
                } else if !eof && CALL_CLOSE.starts_with(t) {
                    false
                } else {
                    self.state = State::AfterCall;
                    true
                }
            }
            State::AfterCall => {
                let t = self.buf.trim_start();
                if let Some(rest) = t.strip_prefix(CALL_OPEN) {
                    self.buf = rest.to_string();
                    self.state = State::CallOpen;
                    true
                } else if !eof && CALL_OPEN.starts_with(t) {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
        }
    }

    fn content(&mut self, out: &mut Vec<Delta>, eof: bool) -> bool {
        if self.tools_on() {
            if let Some(i) = self.buf.find(CALL_OPEN) {
                // The text before a call stays as it is, whitespace and all (llama-server).
                let c = self.take(i);
                if !c.is_empty() {
                    out.push(Delta::Content(c));
                }
                self.buf.drain(..CALL_OPEN.len());
                self.state = State::CallOpen;
                return true;
            }
        }
        let keep = if eof || !self.tools_on() {
            0
        } else {
            held(&self.buf, &[CALL_OPEN])
        };
        let n = self.buf.len() - keep;
        if n == 0 {
            return false;
        }
        let c = self.take(n);
        out.push(Delta::Content(c));
        true
    }

    /// The text after `<tool_call>` is no call: the tag goes out as content.
    fn not_a_call(&mut self, out: &mut Vec<Delta>) {
        out.push(Delta::Content(CALL_OPEN.to_string()));
        self.state = State::Content;
    }

    fn start_call(&mut self, out: &mut Vec<Delta>, name: String) {
        out.push(Delta::ToolCallStart {
            index: self.calls,
            id: self.new_id(),
            name: name.clone(),
        });
        self.calls += 1;
        self.name = name;
    }

    fn end_call(&self, out: &mut Vec<Delta>, any: bool) {
        self.args(out, if any { "}" } else { "{}" }.to_string());
    }

    fn known(&self, name: &str) -> bool {
        self.cfg.tools.is_empty() || self.cfg.tools.iter().any(|t| t.name == name)
    }

    /// `<function=NAME>` after `<tool_call>`.
    fn xml_header(&mut self, out: &mut Vec<Delta>, eof: bool) -> bool {
        let t = self.buf.trim_start();
        let ws = self.buf.len() - t.len();
        let Some(rest) = t.strip_prefix(FUNCTION_OPEN) else {
            if !eof && FUNCTION_OPEN.starts_with(t) {
                return false;
            }
            self.not_a_call(out);
            return true;
        };
        let Some(gt) = rest.find('>') else {
            if !eof && rest.len() <= MAX_NAME && !rest.contains('\n') {
                return false;
            }
            self.not_a_call(out);
            return true;
        };
        let name = rest[..gt].trim().to_string();
        if name.is_empty() || !self.known(&name) {
            self.not_a_call(out);
            return true;
        }
        self.buf.drain(..ws + FUNCTION_OPEN.len() + gt + 1);
        self.start_call(out, name);
        self.state = State::Function { any: false };
        true
    }

    fn param(&mut self, out: &mut Vec<Delta>, eof: bool) -> bool {
        let State::Param(p) = &mut self.state else {
            return false;
        };
        if p.skip_nl {
            if self.buf.is_empty() && !eof {
                return false;
            }
            if self.buf.starts_with('\n') {
                self.buf.remove(0);
            }
            p.skip_nl = false;
        }
        let end = self.buf.find(PARAM_CLOSE);
        let (n, closed) = match end {
            Some(i) => (i, true),
            None if eof => (self.buf.len(), true),
            None => (
                self.buf.len() - held(&self.buf, &["\n</parameter>", PARAM_CLOSE]),
                false,
            ),
        };
        if !closed {
            if n == 0 {
                return false;
            }
            let piece: String = self.buf.drain(..n).collect();
            if p.streamed {
                let s = json_body(&piece);
                self.args(out, s);
            } else {
                p.value.push_str(&piece);
            }
            return true;
        }
        let mut piece: String = self.buf.drain(..n).collect();
        if end.is_some() {
            self.buf.drain(..PARAM_CLOSE.len());
        }
        // The newline before `</parameter>` is markup.
        if piece.ends_with('\n') {
            piece.pop();
        } else if p.value.ends_with('\n') && piece.is_empty() {
            p.value.pop();
        }
        let s = if p.streamed {
            format!("{}\"", json_body(&piece))
        } else {
            p.value.push_str(&piece);
            format!("{}{}", p.head, typed_value(&p.value, &p.types))
        };
        self.args(out, s);
        self.state = State::Function { any: true };
        true
    }

    /// A Hermes call: `{"name": …, "arguments": …}` up to `</tool_call>`.
    fn hermes(&mut self, out: &mut Vec<Delta>, eof: bool, seen: usize) -> bool {
        // The tag may have begun in the part already searched.
        let mut from = seen.saturating_sub(CALL_CLOSE.len() - 1);
        while !self.buf.is_char_boundary(from) {
            from -= 1;
        }
        let (json_end, close) = match self.buf[from..].find(CALL_CLOSE).map(|i| i + from) {
            Some(i) => (i, Some(i + CALL_CLOSE.len())),
            None if eof => (self.buf.len(), None),
            None => {
                self.state = State::Hermes {
                    seen: self.buf.len(),
                };
                return false;
            }
        };
        let call = serde_json::from_str::<Value>(self.buf[..json_end].trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = match v.get("arguments") {
                    None => Value::Object(Default::default()),
                    // Some models write the arguments as a JSON string.
                    Some(Value::String(s)) => serde_json::from_str(s).ok()?,
                    Some(a) => a.clone(),
                };
                args.is_object().then_some((name, args))
            })
            .filter(|(name, _)| self.known(name));
        match call {
            Some((name, args)) => {
                self.buf.drain(..close.unwrap_or(json_end));
                self.start_call(out, name);
                self.args(out, args.to_string());
                self.state = State::AfterCall;
            }
            None => self.not_a_call(out),
        }
        true
    }
}
