//! The minijinja environment chat templates render in: HF's block trimming, Python's string
//! methods, the functions templates call (`raise_exception`, `strftime_now`), and llama.cpp's
//! rules for writing values ([`crate::template_text`]).

use crate::template_text;
use crate::TokenizerError;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use std::cell::Cell;

thread_local! {
    /// The local time a render runs at (`strftime_now`): set for the duration of one render.
    static NOW: Cell<Option<chrono::NaiveDateTime>> = const { Cell::new(None) };
}

/// Runs `f` with `now` as the time `strftime_now` formats.
pub(crate) fn at<T>(now: chrono::NaiveDateTime, f: impl FnOnce() -> T) -> T {
    let before = NOW.with(|c| c.replace(Some(now)));
    let out = f();
    NOW.with(|c| c.set(before));
    out
}

/// `strftime(format)` of the render's local time.
fn strftime_now(format: String) -> Result<Value, Error> {
    let now = NOW
        .with(Cell::get)
        .unwrap_or_else(|| chrono::Local::now().naive_local());
    let mut out = String::new();
    use std::fmt::Write;
    write!(out, "{}", now.format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format '{format}'"),
        )
    })?;
    Ok(Value::from(out))
}

/// `items` of a mapping; none and undefined have no items (llama.cpp's engine gives an empty
/// list where minijinja fails).
fn items(v: &Value) -> Result<Value, Error> {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => Ok(Value::from(Vec::<Value>::new())),
        ValueKind::Map => {
            let pairs: Vec<Value> = v
                .try_iter()?
                .map(|k| {
                    let item = v.get_item(&k).unwrap_or_default();
                    Value::from(vec![k, item])
                })
                .collect();
            Ok(Value::from(pairs))
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot convert value into pairs (it is {})", v.kind()),
        )),
    }
}

/// `length`, 0 for undefined (as llama.cpp's engine gives; minijinja fails).
fn length(v: &Value) -> Result<Value, Error> {
    if v.is_undefined() {
        return Ok(Value::from(0));
    }
    minijinja::filters::length(v).map(Value::from)
}

/// `source` with HF's `{% generation %}` … `{% endgeneration %}` tags (they mark the assistant's
/// text for training masks and render their body unchanged) written as an always-true `if`,
/// whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let open = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
        let close = inner
            .strip_suffix(['-', '+'])
            .map_or("", |_| &inner[inner.len() - 1..]);
        let word = inner[open.len()..inner.len() - close.len()].trim();
        match word {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Renders the template "chat" of `env` with `ctx`. llama.cpp's engine reads an undefined
/// operand of `+` next to a string as an empty string (firefunction-v2 appends its never-set
/// `functions` to the system prompt); minijinja, like Python's Jinja2, refuses. On exactly that
/// refusal the template is rendered again with every variable it reads but that neither it, the
/// context nor the environment defines bound to an empty string — the output llama-server
/// gives. (Within that second render such a variable also tests as defined; templates that
/// render the first time are never affected.)
pub(crate) fn render(env: &Environment<'_>, ctx: Value) -> Result<String, Error> {
    let t = env.get_template("chat")?;
    let err = match t.render(&ctx) {
        Ok(out) => return Ok(out),
        Err(e) => e,
    };
    let concat_with_undefined = err.kind() == ErrorKind::InvalidOperation
        && err.to_string().contains("operator on unsupported types")
        && err.to_string().contains("undefined");
    if !concat_with_undefined {
        return Err(err);
    }
    let mut vars = std::collections::BTreeMap::new();
    if let Ok(keys) = ctx.try_iter() {
        for k in keys {
            if let (Some(name), Ok(v)) = (k.as_str(), ctx.get_item(&k)) {
                vars.insert(name.to_string(), v);
            }
        }
    }
    let mut added = false;
    for name in t.undeclared_variables(false) {
        if !vars.contains_key(&name) && !env.globals().any(|(g, _)| g == name) {
            vars.insert(name, Value::from(""));
            added = true;
        }
    }
    if !added {
        return Err(err);
    }
    t.render(Value::from(vars))
}

/// An environment holding `source` as the template "chat".
pub(crate) fn environment(source: String) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    // HF renders chat templates with trim_blocks and lstrip_blocks.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Python string and dict methods (`.strip()`, `.startswith()`, `.items()`, …).
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        let mut s = String::new();
        template_text::print(&mut s, value)?;
        out.write_str(&s)
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_filter("tojson", template_text::tojson_filter);
    env.add_function("tojson", template_text::tojson_filter);
    env.add_filter("string", template_text::string_filter);
    env.add_filter("safe", template_text::safe_filter);
    env.add_filter("items", items);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned("chat", without_generation_tags(&source))?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    #[test]
    fn generation_tags_render_their_body() {
        assert_eq!(
            super::without_generation_tags(
                "a{%- generation -%}b{% endgeneration %}{{ c }}{%+ if x %}"
            ),
            "a{%- if true -%}b{% endif %}{{ c }}{%+ if x %}"
        );
    }
}
