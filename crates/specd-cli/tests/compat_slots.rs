//! Slot save / restore / erase (`POST /slots/{id}?action=…`, `--slot-save-path`) over real
//! HTTP, with llama-server's field names, status codes and file header.

use serde_json::{json, Value};

mod common;
use common::http::*;
use common::Server;

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

fn complete(s: &Server, slot: usize, prompt: impl Into<Value>) -> Value {
    s.ok(
        "/completion",
        &json!({"prompt": prompt.into(), "id_slot": slot, "cache_prompt": true, "n_predict": 8,
                "temperature": 0, "return_tokens": true}),
    )
}

#[test]
fn save_restore_erase() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let s = Server::start(&["-np", "2", "-c", "512", "--slot-save-path", d]);

    let first = complete(&s, 1, PROMPT);
    let n_prompt = first["timings"]["prompt_n"].as_u64().unwrap();
    assert!(n_prompt > 4);
    let save = s.ok("/slots/1?action=save", &json!({"filename": "slot1.bin"}));
    // The slot keeps the prompt and every generated token but the last (never decoded).
    let n_saved = save["n_saved"].as_u64().unwrap();
    assert_eq!(
        n_saved,
        n_prompt + first["tokens_predicted"].as_u64().unwrap() - 1
    );
    assert_eq!(save["id_slot"], 1);
    assert_eq!(save["filename"], "slot1.bin");
    assert!(save["timings"]["save_ms"].as_f64().is_some());
    let bytes = std::fs::read(dir.path().join("slot1.bin")).unwrap();
    assert_eq!(save["n_written"].as_u64(), Some(bytes.len() as u64));
    // llama.cpp's sequence-state header: magic 'ggsq', version, payload words.
    assert_eq!(&bytes[..4], &0x6767_7371u32.to_le_bytes());

    let restore = s.ok("/slots/0?action=restore", &json!({"filename": "slot1.bin"}));
    assert_eq!(restore["n_restored"].as_u64(), Some(n_saved));
    assert_eq!(restore["n_read"].as_u64(), Some(bytes.len() as u64));
    assert!(restore["timings"]["restore_ms"].as_f64().is_some());

    // Slot 0 continues the restored text without processing it again, and generates what
    // slot 1 (which holds the same memory) generates.
    // (Token ids: generated text need not tokenize back to the same tokens.)
    let mut ids = tokens(&s.ok("/tokenize", &json!({"content": PROMPT})));
    ids.extend(tokens(&first));
    ids.push(7);
    let on0 = complete(&s, 0, ids.clone());
    let on1 = complete(&s, 1, ids);
    assert_eq!(on0["timings"]["cache_n"].as_u64(), Some(n_saved), "{on0}");
    assert_eq!(on0["content"], on1["content"]);
    assert_eq!(on0["timings"]["cache_n"], on1["timings"]["cache_n"]);

    let erase = s.ok("/slots/1?action=erase", &json!({}));
    assert_eq!(erase["id_slot"], 1);
    assert!(erase["n_erased"].as_u64().unwrap() > 0);
    // Without a body, as llama.cpp's tests send it.
    let r = request(&s.addr, "POST", "/slots/1?action=erase", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["n_erased"], 0);
    let again = complete(&s, 1, PROMPT);
    assert_eq!(again["timings"]["prompt_n"].as_u64(), Some(n_prompt));
    assert_eq!(again["timings"]["cache_n"], 0);
}

#[test]
fn slot_action_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let s = Server::start(&["-np", "2", "--slot-save-path", d]);
    for (path, body, msg) in [
        (
            "/slots/0?action=save",
            json!({"filename": "../x.bin"}),
            "Invalid filename",
        ),
        (
            "/slots/0?action=save",
            json!({"filename": "a/b"}),
            "Invalid filename",
        ),
        ("/slots/0?action=jump", json!({}), "Invalid action"),
        (
            "/slots/x?action=save",
            json!({"filename": "a"}),
            "Invalid slot ID",
        ),
        (
            "/slots/7?action=save",
            json!({"filename": "a"}),
            "Invalid slot ID",
        ),
        (
            "/slots/0?action=restore",
            json!({"filename": "missing.bin"}),
            "Unable to restore slot",
        ),
    ] {
        let v = assert_error(&s.post(path, &body), 400, "invalid_request_error");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(msg), "{path}: {m}");
    }
    // A file that is not a slot save: refused, and the slot stays usable.
    std::fs::write(dir.path().join("junk.bin"), b"not a slot file at all").unwrap();
    let r = s.post("/slots/0?action=restore", &json!({"filename": "junk.bin"}));
    assert_error(&r, 400, "invalid_request_error");
    complete(&s, 0, PROMPT);

    // Without --slot-save-path: llama-server's 501.
    let plain = Server::start(&[]);
    let r = plain.post("/slots/0?action=save", &json!({"filename": "a.bin"}));
    let v = assert_error(&r, 501, "not_supported_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--slot-save-path"));
    // A malformed request is a 400 there too: it is validated before the capability check.
    for (path, body) in [
        ("/slots/x?action=save", json!({"filename": "a.bin"})),
        ("/slots/0?action=fly", json!({})),
        ("/slots/0?action=save", json!({"filename": "../a.bin"})),
        ("/slots/0?action=restore", json!({})),
    ] {
        let r = plain.post(path, &body);
        assert_error(&r, 400, "invalid_request_error");
    }
}
