//! Tokenizer round trips, pre-tokenizer splits, special tokens and chat templates.

use specd_tokenizer::*;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const CORPUS: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nclass Heap:\n    def push(self, item):\n        self.items.append(item)\n\n# It's 2026 and we're testing 12345 numbers.\n";

fn spec(pre: &str, vocab: &TrainedVocab) -> TokenizerSpec {
    TokenizerSpec {
        model: "gpt2".into(),
        pre: pre.into(),
        tokens: vocab.tokens.clone(),
        token_types: vocab.token_types.clone(),
        merges: vocab.merges.clone(),
        eos_id: vocab
            .tokens
            .iter()
            .position(|t| t == "<|im_end|>")
            .map(|i| i as u32),
        bos_id: vocab
            .tokens
            .iter()
            .position(|t| t == "<|endoftext|>")
            .map(|i| i as u32),
        add_bos: false,
        chat_template: Some(CHATML_TEMPLATE.into()),
        ..Default::default()
    }
}

fn tokenizer(pre: &str) -> Tokenizer {
    let mut v = train_bpe(&CORPUS.repeat(4), 400, pre, &SPECIALS).unwrap();
    pad_vocab(&mut v, 512).unwrap();
    Tokenizer::from_spec(spec(pre, &v)).unwrap()
}

#[test]
fn training_is_deterministic_and_merges_compress() {
    let a = train_bpe(&CORPUS.repeat(4), 400, "qwen35", &SPECIALS).unwrap();
    let b = train_bpe(&CORPUS.repeat(4), 400, "qwen35", &SPECIALS).unwrap();
    assert_eq!(a, b);
    assert!(!a.merges.is_empty());
    let t = tokenizer("qwen35");
    let ids = t.encode("return fibonacci(n - 1)", false, false).unwrap();
    assert!(ids.len() < "return fibonacci(n - 1)".len() / 2, "{ids:?}");
}

#[test]
fn round_trips_any_text() {
    for pre in ["qwen35", "qwen2", "llama-bpe", "gpt2", "default"] {
        let t = tokenizer(pre);
        for s in [
            "",
            "hello world",
            "  leading\n\n\ttabs",
            "naïve café ☕ 日本語",
            "emoji 🦀🦀 and \u{0301} marks",
            "<|im_start|> not parsed",
        ] {
            let ids = t.encode(s, false, false).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), s, "pre {pre}");
        }
    }
}

#[test]
fn pre_tokenizer_splits_digits_per_rule() {
    // qwen2/qwen35 split every digit; llama-bpe groups of three; gpt2 keeps runs.
    let count = |pre: &str| {
        let t = tokenizer(pre);
        t.encode("x 1234567", false, false)
            .unwrap()
            .iter()
            .filter(|&&id| {
                t.token_text(id)
                    .unwrap()
                    .chars()
                    .all(|c| c.is_ascii_digit())
            })
            .count()
    };
    assert_eq!(count("qwen35"), 7);
    assert_eq!(count("qwen2"), 7);
    assert!(count("llama-bpe") >= 3);
    let rules = pretokenizer::split_rules("llama-bpe").unwrap();
    assert_eq!(rules.len(), 1);
    assert!(pretokenizer::split_rules("no-such-pre").is_err());
}

#[test]
fn specials_parse_only_when_asked() {
    let t = tokenizer("qwen35");
    let start = t.token_id("<|im_start|>").unwrap();
    let ids = t
        .encode("<|im_start|>user\nhi<|im_end|>", false, true)
        .unwrap();
    assert_eq!(ids[0], start);
    assert!(t.is_eog(*ids.last().unwrap()));
    let plain = t.encode("<|im_start|>user", false, false).unwrap();
    assert!(!plain.contains(&start));
    // Control tokens render as nothing unless asked.
    assert_eq!(t.decode(&ids, false).unwrap(), "user\nhi");
    assert_eq!(
        t.decode(&ids, true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>"
    );
    assert!(t.is_eog(t.token_id("<|endoftext|>").unwrap()));
}

#[test]
fn bos_is_added_when_the_file_says_so() {
    let mut v = train_bpe(CORPUS, 300, "llama-bpe", &SPECIALS).unwrap();
    pad_vocab(&mut v, 320).unwrap();
    let mut s = spec("llama-bpe", &v);
    s.add_bos = true;
    let t = Tokenizer::from_spec(s).unwrap();
    let ids = t.encode("hi", true, false).unwrap();
    assert_eq!(ids[0], t.bos_id().unwrap());
    assert_eq!(t.encode("hi", false, false).unwrap().len(), ids.len() - 1);
}

#[test]
fn malformed_metadata_is_an_error() {
    let v = train_bpe(CORPUS, 300, "qwen35", &SPECIALS).unwrap();
    let mut s = spec("qwen35", &v);
    s.model = "llama".into();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let mut s = spec("qwen35", &v);
    s.eos_id = Some(100_000);
    assert!(Tokenizer::from_spec(s).is_err());
    let mut s = spec("qwen35", &v);
    s.merges.push("nospace".into());
    assert!(Tokenizer::from_spec(s).is_err());
    let mut s = spec("qwen35", &v);
    s.token_types.pop();
    assert!(Tokenizer::from_spec(s).is_err());
    let mut s = spec("qwen35", &v);
    s.pre = "unheard-of".into();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::UnsupportedPre(_))
    ));
    assert!(pad_vocab(&mut v.clone(), 10).is_err());
}

#[test]
fn chat_template_renders_chatml_and_python_methods() {
    let t = ChatTemplate::new(CHATML_TEMPLATE).unwrap();
    let msgs = vec![
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "hi"),
    ];
    let s = t.render(&msgs, true, &Default::default()).unwrap();
    assert_eq!(s, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    let py = ChatTemplate::with_special_tokens("{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}{% if m.content.startswith(' a') %}!{% endif %}{% endfor %}", "<s>", "</s>").unwrap();
    assert_eq!(
        py.render(
            &[ChatMessage::new("user", " abc ")],
            false,
            &Default::default()
        )
        .unwrap(),
        "<s>ABC!"
    );
    let raising = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
    let e = raising
        .render(&msgs, false, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no system role"), "{e}");
    assert!(ChatTemplate::new("{% for %}").is_err());
    let parts: ChatMessage = serde_json::from_str(
        r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
    )
    .unwrap();
    assert_eq!(parts.content_text(), "a\nb");
    let image: ChatMessage = serde_json::from_str(
        r#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}"#,
    )
    .unwrap();
    assert!(t.render(&[image], true, &Default::default()).is_err());
}

/// FIM tokens: named by the metadata, else found by their text (Qwen's, as llama.cpp does) and
/// made control tokens; padding and the repo-level markers end a generation.
#[test]
fn fim_tokens_from_metadata_or_text() {
    let mut v = train_bpe(&CORPUS.repeat(4), 400, "qwen35", &SPECIALS).unwrap();
    let fim = [
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ];
    let base = v.tokens.len() as u32;
    for t in fim {
        v.tokens.push(t.to_string());
        // Stored as normal tokens: the text alone identifies them.
        v.token_types.push(TokenType::Normal.to_i32());
    }
    pad_vocab(&mut v, 512).unwrap();
    let t = Tokenizer::from_spec(spec("qwen35", &v)).unwrap();
    let f = t.fim();
    assert_eq!(f.pre, Some(base));
    assert_eq!(f.mid, Some(base + 1));
    assert_eq!(f.suf, Some(base + 2));
    assert_eq!(f.pad, Some(base + 3));
    assert_eq!(f.rep, Some(base + 4));
    assert_eq!(f.sep, Some(base + 5));
    assert!(t.is_control(base));
    assert!(!t.is_eog(base) && !t.is_eog(base + 1) && !t.is_eog(base + 2));
    assert!(t.is_eog(base + 3) && t.is_eog(base + 4) && t.is_eog(base + 5));
    // Parsed as one token only when special tokens are parsed.
    assert_eq!(t.encode("<|fim_prefix|>", false, true).unwrap(), vec![base]);
    assert!(t.encode("<|fim_prefix|>", false, false).unwrap().len() > 1);

    // The metadata wins over the text.
    let mut s = spec("qwen35", &v);
    s.fim.pre = Some(7);
    assert_eq!(Tokenizer::from_spec(s).unwrap().fim().pre, Some(7));
    // An id outside the vocabulary is refused.
    let mut s = spec("qwen35", &v);
    s.fim.sep = Some(10_000);
    assert!(Tokenizer::from_spec(s).is_err());
    // No FIM token, no FIM.
    let mut v = train_bpe(&CORPUS.repeat(4), 400, "qwen35", &SPECIALS).unwrap();
    pad_vocab(&mut v, 512).unwrap();
    assert_eq!(
        Tokenizer::from_spec(spec("qwen35", &v)).unwrap().fim(),
        FimTokens::default()
    );
}

/// Long texts are encoded in pieces cut where the pre-tokenizer splits anyway: for every split
/// rule, any text gives the same ids whatever the piece size (1 byte cuts at every safe place).
mod pieces {
    use super::*;
    use proptest::prelude::*;

    const FRAGMENTS: &[&str] = &[
        "ab",
        "Word",
        "x",
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        " \n",
        "'s",
        "'",
        "don't",
        "12",
        "3456",
        ";",
        "(",
        ")",
        "{}",
        "==",
        ".",
        "-",
        "_",
        "#",
        "$",
        "<|im_start|>",
        "<|im_end|>",
        "é",
        "\u{301}",
        "日本",
        "語",
        "。",
        "🦀",
        "\u{3000}",
        "\u{a0}",
        "def ",
        "return n\n",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
        #[test]
        fn piece_size_never_changes_the_ids(
            parts in prop::collection::vec(0..FRAGMENTS.len(), 0..120),
            piece in 1usize..24,
            parse_special in any::<bool>(),
        ) {
            let text: String = parts.iter().map(|&i| FRAGMENTS[i]).collect();
            for pre in ["qwen35", "qwen2", "llama-bpe", "gpt2", "default"] {
                let whole = tokenizer(pre);
                let mut cut = whole.clone();
                cut.set_piece_bytes(piece);
                let mut whole = whole;
                whole.set_piece_bytes(usize::MAX);
                prop_assert_eq!(
                    cut.encode(&text, true, parse_special).unwrap(),
                    whole.encode(&text, true, parse_special).unwrap(),
                    "pre {} text {:?}", pre, text
                );
            }
        }
    }

    #[test]
    fn a_long_code_text_gives_the_same_ids_in_pieces() {
        let text = CORPUS.repeat(300);
        for pre in ["qwen35", "default"] {
            let mut t = tokenizer(pre);
            t.set_piece_bytes(1000);
            let cut = t.encode(&text, false, false).unwrap();
            t.set_piece_bytes(usize::MAX);
            assert_eq!(cut, t.encode(&text, false, false).unwrap(), "pre {pre}");
        }
    }
}
