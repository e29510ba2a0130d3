//! What a tool's JSON schema says about one argument: the JSON types its value may take. XML
//! tool calls write values as raw text, and the schema decides whether that text is a string or
//! JSON.

use crate::ToolSpec;
use serde_json::Value;

/// The JSON types a value may take (`type`, also through `anyOf` / `oneOf`, `enum`, `const`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Types(Vec<String>);

impl Types {
    pub(crate) fn of(schema: &Value) -> Types {
        let mut t = Types::default();
        t.collect(schema);
        t
    }

    fn add(&mut self, s: &str) {
        if !self.0.iter().any(|x| x == s) {
            self.0.push(s.to_string());
        }
    }

    fn collect(&mut self, schema: &Value) {
        let Some(o) = schema.as_object() else {
            return;
        };
        match o.get("type") {
            Some(Value::String(s)) => self.add(s),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).for_each(|s| self.add(s)),
            _ => {}
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(a)) = o.get(key) {
                a.iter().for_each(|s| self.collect(s));
            }
        }
        let values = o
            .get("enum")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .chain(o.get("const").cloned());
        for v in values {
            self.add(match v {
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Bool(_) => "boolean",
                Value::Null => "null",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            });
        }
    }

    /// No type known: the value is read as JSON when it is JSON, else as a string.
    pub(crate) fn unknown(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn has(&self, t: &str) -> bool {
        self.0
            .iter()
            .any(|x| x == t || (t == "number" && x == "integer"))
    }

    pub(crate) fn only_string(&self) -> bool {
        !self.0.is_empty() && self.0.iter().all(|x| x == "string")
    }

    /// Whether a parsed JSON value is one of the types.
    fn admits(&self, v: &Value) -> bool {
        match v {
            Value::String(_) => self.has("string"),
            Value::Number(n) => {
                self.has("number") || (n.is_i64() || n.is_u64()) && self.has("integer")
            }
            Value::Bool(_) => self.has("boolean"),
            Value::Null => self.has("null"),
            Value::Array(_) => self.has("array"),
            Value::Object(_) => self.has("object"),
        }
    }
}

/// The schema of argument `key` of tool `name` (Null when the tool or the key is unknown).
pub(crate) fn arg_schema<'a>(tools: &'a [ToolSpec], name: &str, key: &str) -> &'a Value {
    static NONE: Value = Value::Null;
    tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"))
        .and_then(|p| p.get(key))
        .unwrap_or(&NONE)
}

/// An XML argument's raw text as the JSON value it stands for: a string-only argument is the
/// text itself; otherwise the text is read as JSON when that gives an allowed type (any type
/// when the schema says none), and falls back to the text as a string.
pub(crate) fn typed_value(raw: &str, types: &Types) -> Value {
    if types.only_string() {
        return Value::String(raw.to_string());
    }
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) if types.unknown() || types.admits(&v) => v,
        _ => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_read_type_unions_and_enums() {
        let t = Types::of(&json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}));
        assert!(t.has("integer") && t.has("null") && !t.has("string"));
        assert!(Types::of(&json!({"enum": ["a", "b"]})).only_string());
        assert!(Types::of(&json!({"type": ["string", "null"]})).has("null"));
        assert!(Types::of(&json!({})).unknown());
    }

    #[test]
    fn values_typed_by_schema() {
        let int = Types::of(&json!({"type": "integer"}));
        assert_eq!(typed_value("3", &int), json!(3));
        assert_eq!(typed_value("three", &int), json!("three"));
        let s = Types::of(&json!({"type": "string"}));
        assert_eq!(typed_value("3", &s), json!("3"));
        assert_eq!(
            typed_value("{\"a\": 1}", &Types::default()),
            json!({"a": 1})
        );
        assert_eq!(
            typed_value("true", &Types::of(&json!({"type": "boolean"}))),
            json!(true)
        );
        let arr = Types::of(&json!({"type": "array"}));
        assert_eq!(typed_value("[1, 2]", &arr), json!([1, 2]));
        assert_eq!(typed_value("1", &arr), json!("1"));
    }
}
