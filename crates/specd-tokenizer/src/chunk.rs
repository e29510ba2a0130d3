//! Cutting a long text into pieces that tokenize independently.
//!
//! `tokenizers` keeps bookkeeping of many bytes per input byte while it encodes (the normalized
//! string's alignments, the pre-tokenizer's splits), so one 15 MB text took about 2.5 GB. BPE merges
//! never cross a pre-token, so encoding the text piece by piece gives the same ids as encoding it
//! whole — *if* every cut falls where the pre-tokenizer splits anyway. [`pieces`] cuts only at such
//! places, which hold for every split rule in `pretokenizer.rs` (GPT-2's, Llama 3's, Qwen2's,
//! Qwen3.5's, and the `default` sequence):
//!
//! 1. between an ASCII letter and an ASCII space, newline or ASCII punctuation other than `'`: every
//!    rule's word pattern (`\p{L}+`, with an optional *leading* character) ends at the letter; no
//!    pattern continues a letter run with those characters;
//! 2. after a single `\n` that has a visible character on both sides: no pattern reaches past a
//!    newline into a visible character (punctuation runs take *trailing* newlines only, whitespace
//!    patterns stop before visible text), and a lone newline is one pre-token whether or not the text
//!    ends after it (the only lookahead, `\s+(?!\S)`, gives the same one-character match).
//!
//! Matching from a cut onwards sees only the text after it (no rule looks behind), and the match
//! that ends at a cut is the same one with or without the text after it, so the pre-tokens — and
//! the ids — are unchanged. `tests/tokenizer.rs` checks it on random texts for every rule.
//! A text with no such place (one enormous word) is encoded whole.

/// Pieces of about `target` bytes (at least `target`, unless the text ends first), cut only at the
/// places described in the module docs. Concatenated, they are `text`.
pub fn pieces(text: &str, target: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = next_cut(rest, target.max(1)).unwrap_or(rest.len());
        let (head, tail) = rest.split_at(cut);
        rest = tail;
        Some(head)
    })
}

/// The first safe cut at or after byte `from` (never 0 or the end of `s`).
fn next_cut(s: &str, from: usize) -> Option<usize> {
    let b = s.as_bytes();
    (from.max(1)..b.len()).find(|&p| s.is_char_boundary(p) && safe_cut(s, p))
}

fn safe_cut(s: &str, p: usize) -> bool {
    let b = s.as_bytes();
    let (prev, cur) = (b[p - 1], b[p]);
    if prev.is_ascii_alphabetic() {
        return cur == b' ' || cur == b'\n' || (cur.is_ascii_punctuation() && cur != b'\'');
    }
    if prev == b'\n' && p >= 2 {
        let before = s[..p - 1].chars().next_back();
        let after = s[p..].chars().next();
        return before.is_some_and(visible) && after.is_some_and(visible);
    }
    false
}

/// A character no rule treats as whitespace: letters and digits of any script, ASCII punctuation.
fn visible(c: char) -> bool {
    c.is_alphanumeric() || c.is_ascii_graphic()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_concatenate_to_the_text_and_cut_where_safe() {
        let text = "fn main() {\n    let x = 1;\n}\nword  word\nend";
        for target in [1, 3, 7, 100] {
            let parts: Vec<&str> = pieces(text, target).collect();
            assert_eq!(parts.concat(), text);
            for w in parts.windows(2) {
                let (a, b) = (w[0].as_bytes(), w[1].as_bytes());
                let (l, r) = (a[a.len() - 1], b[0]);
                assert!(
                    (l.is_ascii_alphabetic()
                        && (r == b' ' || r == b'\n' || r.is_ascii_punctuation()))
                        || l == b'\n',
                    "cut between {:?} and {:?}",
                    l as char,
                    r as char
                );
            }
        }
        assert_eq!(pieces("", 4).count(), 0);
        assert_eq!(pieces("日本語のテキスト", 2).count(), 1);
        assert_eq!(pieces("  \n\n  ", 1).count(), 1);
    }
}
