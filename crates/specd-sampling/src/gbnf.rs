//! GBNF (llama.cpp's grammar format) → llguidance's Lark dialect.
//!
//! llguidance reads Lark, whose rule syntax differs from GBNF in three ways that matter: rules
//! are `name: …` instead of `name ::= …`, `[…]` means "optional" instead of a character class,
//! and upper-case names are terminals. GBNF's expressions otherwise carry over (`|`, `*`, `+`,
//! `?`, `{m,n}`, groups, string literals), so this is a token-level rewrite, not a parser.

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Str(String),
    Class(String),
    Any,
    Punct(String),
}

/// Converts a GBNF grammar (start rule `root`) to Lark (start rule `start`).
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    // Rules: a name followed by `::=` starts one; its body runs to the next such pair.
    let mut rules: Vec<(String, Vec<Tok>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Define)) => {
                rules.push((n.clone(), Vec::new()));
                i += 2;
            }
            (t, _) => {
                let Some(r) = rules.last_mut() else {
                    return Err(format!(
                        "expected a rule definition (`name ::= ...`), found {t:?}"
                    ));
                };
                r.1.push(t.clone());
                i += 1;
            }
        }
    }
    if rules.is_empty() {
        return Err("the grammar defines no rules".into());
    }
    let mut names: HashMap<String, String> = HashMap::new();
    for (k, (n, body)) in rules.iter().enumerate() {
        if body.is_empty() {
            return Err(format!("rule '{n}' has an empty body"));
        }
        let mut m: String = n
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        m = format!("g_{m}");
        if names.values().any(|v| *v == m) {
            m = format!("{m}_{k}");
        }
        if names.insert(n.clone(), m).is_some() {
            return Err(format!("rule '{n}' is defined twice"));
        }
    }
    let root = names.get("root").ok_or("the grammar has no 'root' rule")?;
    let mut out = format!("start: {root}\n");
    for (n, body) in &rules {
        out.push_str(&names[n]);
        out.push(':');
        for t in body {
            out.push(' ');
            match t {
                Tok::Name(r) => out.push_str(
                    names
                        .get(r)
                        .ok_or_else(|| format!("rule '{r}' is used but not defined"))?,
                ),
                Tok::Str(s) => out.push_str(&serde_json::to_string(s).map_err(|e| e.to_string())?),
                Tok::Class(c) => {
                    out.push('/');
                    out.push_str(&c.replace('/', "\\/"));
                    out.push('/');
                }
                Tok::Any => out.push_str("/(?s:.)/"),
                Tok::Punct(p) => out.push_str(p),
                Tok::Define => return Err("unexpected '::='".into()),
            }
        }
        out.push('\n');
    }
    Ok(out)
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let c: Vec<char> = src.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < c.len() {
        let ch = c[i];
        match ch {
            '#' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            _ if ch.is_whitespace() => i += 1,
            ':' if c.get(i + 1) == Some(&':') && c.get(i + 2) == Some(&'=') => {
                out.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match c.get(i) {
                        None | Some('\n') => return Err("unterminated string literal".into()),
                        Some('"') => break,
                        Some('\\') => {
                            let (v, n) = escape(&c, i)?;
                            s.push(v);
                            i += n;
                        }
                        Some(&x) => {
                            s.push(x);
                            i += 1;
                        }
                    }
                }
                i += 1;
                out.push(Tok::Str(s));
            }
            '[' => {
                // Kept as regex text: GBNF's class syntax is the regex one.
                let start = i;
                i += 1;
                if c.get(i) == Some(&'^') {
                    i += 1;
                }
                loop {
                    match c.get(i) {
                        None => return Err("unterminated character class".into()),
                        Some('\\') => i += 2,
                        Some(']') => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
                out.push(Tok::Class(c[start..i].iter().collect()));
            }
            '.' => {
                out.push(Tok::Any);
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(Tok::Punct(ch.to_string()));
                i += 1;
            }
            '{' => {
                let start = i;
                while i < c.len() && c[i] != '}' {
                    if !(c[i].is_ascii_digit() || c[i] == ',' || c[i] == '{' || c[i] == ' ') {
                        return Err(format!(
                            "bad repetition '{}'",
                            c[start..=i].iter().collect::<String>()
                        ));
                    }
                    i += 1;
                }
                if i == c.len() {
                    return Err("unterminated repetition".into());
                }
                i += 1;
                out.push(Tok::Punct(
                    c[start..i].iter().filter(|c| **c != ' ').collect(),
                ));
            }
            _ if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '-' || c[i] == '_') {
                    i += 1;
                }
                out.push(Tok::Name(c[start..i].iter().collect()));
            }
            _ => return Err(format!("unexpected character '{ch}' in grammar")),
        }
    }
    Ok(out)
}

/// One escape at `c[i] == '\\'` inside a string literal: the character and the length consumed.
fn escape(c: &[char], i: usize) -> Result<(char, usize), String> {
    let hex = |n: usize| -> Result<(char, usize), String> {
        let h: String = c
            .get(i + 2..i + 2 + n)
            .ok_or("truncated escape")?
            .iter()
            .collect();
        let v = u32::from_str_radix(&h, 16).map_err(|_| format!("bad escape \\{}{h}", c[i + 1]))?;
        Ok((
            char::from_u32(v).ok_or(format!("bad code point {v:#x}"))?,
            n + 2,
        ))
    };
    match c.get(i + 1) {
        Some('n') => Ok(('\n', 2)),
        Some('t') => Ok(('\t', 2)),
        Some('r') => Ok(('\r', 2)),
        Some('\\') => Ok(('\\', 2)),
        Some('"') => Ok(('"', 2)),
        Some('[') => Ok(('[', 2)),
        Some(']') => Ok((']', 2)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(o) => Err(format!("unknown escape \\{o}")),
        None => Err("truncated escape".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn converts_rules_classes_and_strings() {
        let g = "root ::= Answer ws\n# comment\nAnswer ::= (\"yes\" | \"no\\n\") [a-z/]* .\nws ::= [ \\t]{0,3}";
        let l = gbnf_to_lark(g).unwrap();
        assert!(l.starts_with("start: g_root\n"), "{l}");
        assert!(l.contains("g_root: g_answer g_ws"), "{l}");
        assert!(
            l.contains(r#"( "yes" | "no\n" ) /[a-z\/]/ * /(?s:.)/"#),
            "{l}"
        );
        assert!(l.contains("{0,3}"), "{l}");
    }

    #[test]
    fn reports_errors() {
        assert!(gbnf_to_lark("").is_err());
        assert!(gbnf_to_lark("start ::= \"a\"")
            .unwrap_err()
            .contains("root"));
        assert!(gbnf_to_lark("root ::= missing")
            .unwrap_err()
            .contains("missing"));
        assert!(gbnf_to_lark("root ::= \"unterminated").is_err());
        assert!(gbnf_to_lark("root ::= [abc").is_err());
        assert!(gbnf_to_lark("root ::= \"a\"\nroot ::= \"b\"").is_err());
    }
}
