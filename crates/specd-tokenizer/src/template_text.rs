//! How template values become text: `tojson`, `string`, `safe` and `{{ value }}`, as llama.cpp's
//! Jinja engine (common/jinja) writes them, which is what transformers' Python rendering writes
//! for the values real chat templates print (`json.dumps` with `", "` / `": "` separators and
//! key order kept, `True` / `False`, `None`).
//!
//! minijinja's own rules differ (`tojson` sorts keys and writes compact JSON; `true` prints as
//! `true`), and a model sees the difference in every tool list it is shown: these functions
//! replace minijinja's filters and formatter for chat templates. Floats follow llama.cpp where it
//! departs from Python (`tojson` writes six significant digits, `2.0` as `2`), so that prompts
//! equal llama-server's byte for byte.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;
use std::fmt::Write;

/// A template value as JSON (undefined and none become null).
fn to_json_value(v: &Value) -> Result<Json, Error> {
    if crate::template_caps::is_opaque(v) {
        return Ok(Json::Array(Vec::new()));
    }
    serde_json::to_value(v).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("value cannot be written as JSON: {e}"),
        )
    })
}

/// JSON text of `v`: `indent` (None: one line), separators between items and after keys, and
/// non-ASCII characters escaped as `\uXXXX` with `ensure_ascii`.
pub fn json_text(
    v: &Json,
    indent: Option<usize>,
    item_sep: &str,
    key_sep: &str,
    ensure_ascii: bool,
    sort_keys: bool,
) -> String {
    let mut out = String::new();
    let f = JsonFormat {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    f.write(&mut out, v, 0);
    out
}

struct JsonFormat<'a> {
    indent: Option<usize>,
    item_sep: &'a str,
    key_sep: &'a str,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonFormat<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn write(&self, out: &mut String, v: &Json, level: usize) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&number_json(n)),
            Json::String(s) => write_json_string(out, s, self.ensure_ascii),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1);
                }
                if !items.is_empty() {
                    self.newline(out, level);
                }
                out.push(']');
            }
            Json::Object(map) => {
                out.push('{');
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                for (i, (k, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    write_json_string(out, k, self.ensure_ascii);
                    out.push_str(self.key_sep);
                    self.write(out, item, level + 1);
                }
                if !entries.is_empty() {
                    self.newline(out, level);
                }
                out.push('}');
            }
        }
    }
}

/// A JSON string literal: `"`, `\` and control characters escaped (as Python's `json.dumps`);
/// with `ensure_ascii`, every non-ASCII character too, as UTF-16 `\uXXXX` escapes.
fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as `tojson` writes it: integers in full, floats as C++ streams write a double
/// (`%g`, six significant digits).
fn number_json(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => float_g(f),
        _ => n.to_string(),
    }
}

/// `%g` with precision 6, as `std::ostream << double` writes it: `2`, `0.75`, `0.123457`,
/// `1e-07`, `1.5e+20`.
pub fn float_g(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.into();
    }
    const P: i32 = 6;
    // The exponent after rounding to P significant digits decides the notation.
    let sci = format!("{:.*e}", (P - 1) as usize, f);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..P).contains(&exp) {
        let fixed = format!("{:.*}", (P - 1 - exp) as usize, f);
        trim_fraction(&fixed).to_string()
    } else {
        let m = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    }
}

/// Drops trailing zeros of a fraction, and the point if nothing is left after it.
fn trim_fraction(s: &str) -> &str {
    if !s.contains('.') {
        return s;
    }
    s.trim_end_matches('0').trim_end_matches('.')
}

/// A float as llama.cpp's engine prints it (`std::to_string`, trailing zeros dropped, one kept
/// after the point): `0.75`, `2.0`, `0.123457`.
pub fn float_str(f: f64) -> String {
    let s = format!("{f:.6}");
    let t = s.trim_end_matches('0');
    if t.ends_with('.') {
        format!("{t}0")
    } else {
        t.to_string()
    }
}

/// A value inside a printed list or mapping: strings quoted as Python's `repr` quotes them
/// (single quotes, or JSON quoting when the text holds a single quote).
fn repr(v: &Json) -> String {
    match v {
        Json::String(s) if s.contains('\'') => {
            let mut out = String::new();
            write_json_string(&mut out, s, false);
            out
        }
        Json::String(s) => format!("'{s}'"),
        other => json_str(other),
    }
}

/// `str()` of a JSON value, the way llama.cpp's engine converts values to strings.
fn json_str(v: &Json) -> String {
    match v {
        Json::Null => "None".into(),
        Json::Bool(b) => if *b { "True" } else { "False" }.into(),
        Json::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => float_str(f),
            _ => n.to_string(),
        },
        Json::String(s) => s.clone(),
        Json::Array(items) => {
            let parts: Vec<String> = items.iter().map(repr).collect();
            format!("[{}]", parts.join(", "))
        }
        Json::Object(map) => {
            let parts: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", repr(&Json::String(k.clone())), repr(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// `{{ value }}`: strings as they are, numbers and booleans as strings (`True`), lists as their
/// items one after the other; mappings, none and undefined print nothing.
pub fn print(out: &mut String, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_str(v)),
        ValueKind::Seq | ValueKind::Iterable => {
            for item in v.try_iter()? {
                print(out, &item)?;
            }
        }
        ValueKind::Bytes => out.push_str(&String::from_utf8_lossy(v.as_bytes().unwrap_or(&[]))),
        _ => {}
    }
    Ok(())
}

fn number_str(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        f64::try_from(v.clone()).map_or_else(|_| v.to_string(), float_str)
    }
}

/// The `string` filter: strings unchanged, `True` / `False`, `None`, numbers as `tojson` writes
/// them, lists and mappings as Python's `str()` writes them (`['a', 1]`, `{'k': True}`).
pub fn string_filter(v: &Value) -> Result<Value, Error> {
    Ok(Value::from(match v.kind() {
        ValueKind::String => return Ok(v.clone()),
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_json_value(v)?,
        _ => json_str(&to_json_value(v)?),
    }))
}

/// The `safe` filter: strings marked safe; other values as llama.cpp's engine writes them
/// (numbers, lists and mappings as JSON, `True` / `False`, `None`).
pub fn safe_filter(v: &Value) -> Result<Value, Error> {
    match v.kind() {
        ValueKind::String => Ok(Value::from_safe_string(
            v.as_str().unwrap_or_default().to_string(),
        )),
        ValueKind::Undefined => Ok(Value::from_safe_string(String::new())),
        ValueKind::None | ValueKind::Bool => string_filter(v),
        _ => Ok(Value::from_safe_string(json_text(
            &to_json_value(v)?,
            None,
            ", ",
            ": ",
            false,
            false,
        ))),
    }
}

fn number_json_value(v: &Value) -> Result<String, Error> {
    match to_json_value(v)? {
        Json::Number(n) => Ok(number_json(&n)),
        other => Ok(other.to_string()),
    }
}

/// The `tojson` filter with transformers' arguments, by position or name:
/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub fn tojson_filter(v: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    if args.len() > 4 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let arg = |pos: usize, name: &str| -> Result<Option<Value>, Error> {
        match kwargs.get::<Option<Value>>(name)? {
            Some(v) => Ok(Some(v)),
            None => Ok(args.get(pos).cloned()),
        }
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match arg(1, "indent")? {
        Some(i) if i.is_integer() => Some(usize::try_from(i).unwrap_or(0)),
        _ => None,
    };
    let separators: Vec<String> = match arg(2, "separators")? {
        Some(s) if !s.is_none() && !s.is_undefined() => s
            .try_iter()?
            .map(|p| {
                p.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| p.to_string())
            })
            .collect(),
        _ => Vec::new(),
    };
    kwargs.assert_all_used()?;
    // Python's defaults: `", "` between items on one line, `","` when indenting.
    let item_sep = separators
        .first()
        .map(String::as_str)
        .unwrap_or(if indent.is_some() { "," } else { ", " });
    let key_sep = separators.get(1).map(String::as_str).unwrap_or(": ");
    Ok(Value::from_safe_string(json_text(
        &to_json_value(v)?,
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_as_cpp_streams_write_them() {
        for (f, want) in [
            (2.0, "2"),
            (0.75, "0.75"),
            (0.1234567, "0.123457"),
            (1e-7, "1e-07"),
            (1.5e20, "1.5e+20"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (-0.5, "-0.5"),
            (0.0001, "0.0001"),
            (0.0, "0"),
        ] {
            assert_eq!(float_g(f), want, "{f}");
        }
        assert_eq!(float_str(2.0), "2.0");
        assert_eq!(float_str(0.1234567), "0.123457");
        assert_eq!(float_str(0.5), "0.5");
    }

    #[test]
    fn json_keeps_order_and_python_separators() {
        let v = json!({"z": 1, "a": [true, null, "é\n\"x\""], "m": {}});
        assert_eq!(
            json_text(&v, None, ", ", ": ", false, false),
            r#"{"z": 1, "a": [true, null, "é\n\"x\""], "m": {}}"#
        );
        assert_eq!(
            json_text(&v, None, ", ", ": ", true, true),
            r#"{"a": [true, null, "\u00e9\n\"x\""], "m": {}, "z": 1}"#
        );
        assert_eq!(
            json_text(
                &json!({"a": [1, 2], "b": []}),
                Some(2),
                ",",
                ": ",
                false,
                false
            ),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(
            json_text(&json!("😀\u{1}"), None, ", ", ": ", true, false),
            r#""\ud83d\ude00\u0001""#
        );
    }

    #[test]
    fn str_as_python() {
        let v = json!(["a", 1, 0.5, true, null, "it's", {"k": false}]);
        assert_eq!(
            json_str(&v),
            r#"['a', 1, 0.5, True, None, "it's", {'k': False}]"#
        );
    }
}
