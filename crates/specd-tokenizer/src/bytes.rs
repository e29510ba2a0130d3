//! GPT-2's byte ↔ printable-character table used by byte-level BPE vocabularies.
//!
//! Written out here (it is 20 lines) because the `tokenizers` crate keeps its copy private and the
//! decoder needs it per token, without building a whole decoding pipeline.

use std::sync::OnceLock;

struct Tables {
    byte_to_char: [char; 256],
    char_to_byte: std::collections::HashMap<char, u8>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let printable = |b: u32| {
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
        };
        let mut byte_to_char = ['\0'; 256];
        let mut n = 0u32;
        for b in 0..256u32 {
            byte_to_char[b as usize] = if printable(b) {
                char::from_u32(b).unwrap_or('\0')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('\0')
            };
        }
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Tables {
            byte_to_char,
            char_to_byte,
        }
    })
}

/// The byte-level string of raw bytes (what a vocabulary entry looks like).
pub fn encode(bytes: &[u8]) -> String {
    let t = tables();
    bytes.iter().map(|&b| t.byte_to_char[b as usize]).collect()
}

/// Raw bytes of a byte-level vocabulary entry; `None` if it holds a character outside the table.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let t = tables();
    s.chars().map(|c| t.char_to_byte.get(&c).copied()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_is_a_bijection() {
        let all: Vec<u8> = (0..=255).collect();
        let s = super::encode(&all);
        assert_eq!(s.chars().count(), 256);
        assert_eq!(super::decode(&s).unwrap(), all);
        assert_eq!(super::encode(b" "), "\u{120}");
    }
}
