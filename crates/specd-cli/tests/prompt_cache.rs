//! Prompt reuse across many conversations, over real HTTP against `specd serve` on the tiny
//! hybrid model: the slot choice (a request takes the slot whose memory it can really reuse,
//! never a slot whose conversation it would destroy for nothing), the prompt cache in RAM
//! (`--cache-ram`: more conversations than slots still reuse their history), and the cache's
//! partition by API key and `cache_salt` (a client never observes another's cached prefixes).

mod common;

use common::http::{metric, request, tokens};
use common::Server;
use serde_json::{json, Value};

/// One turn: the conversation so far (token ids) plus a new user part, greedy, 6 tokens.
fn turn(s: &Server, history: &[u64], new: &[u64], extra: &Value) -> (Value, Vec<u64>) {
    let prompt: Vec<u64> = history.iter().chain(new).copied().collect();
    let mut body = json!({
        "prompt": prompt, "n_predict": 6, "temperature": 0, "ignore_eos": true,
        "return_tokens": true,
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let r = s.ok("/completion", &body);
    let mut all = prompt;
    all.extend(tokens(&r));
    (r, all)
}

fn cache_n(r: &Value) -> u64 {
    r["timings"]["cache_n"].as_u64().unwrap()
}

/// A user part of conversation `c`, turn `t`: distinct across conversations from the first
/// token on, so only kept memory of the same conversation can serve it.
fn user(c: u64, t: u64) -> Vec<u64> {
    (0..5)
        .map(|i| 10 + (c * 31 + t * 7 + i * 3) % 200)
        .collect()
}

/// `conversations` conversations, `turns` turns each, interleaved round-robin; returns each
/// follow-up's (`cache_n`, history length before it) and every conversation's tokens.
fn run_round_robin(s: &Server, conversations: u64, turns: u64) -> (Vec<(u64, u64)>, Vec<Vec<u64>>) {
    let mut hist: Vec<Vec<u64>> = vec![Vec::new(); conversations as usize];
    let mut follow_ups = Vec::new();
    for t in 0..turns {
        for c in 0..conversations {
            let h = &hist[c as usize];
            let (r, all) = turn(s, h, &user(c, t), &json!({}));
            if t > 0 {
                follow_ups.push((cache_n(&r), h.len() as u64));
            }
            hist[c as usize] = all;
        }
    }
    (follow_ups, hist)
}

/// Every follow-up reuses its whole history but the last generated token (which the model has
/// not run yet when the previous turn ends).
fn assert_covered(follow_ups: &[(u64, u64)]) {
    for (i, &(cached, history)) in follow_ups.iter().enumerate() {
        assert!(
            cached + 1 >= history,
            "follow-up {i}: cache_n {cached} of a {history}-token history ({follow_ups:?})"
        );
    }
}

#[test]
fn eight_conversations_on_four_slots_reuse_their_history() {
    // Without the RAM cache, 8 conversations on 4 slots evict each other: follow-ups start over.
    let off = Server::start(&["-np", "4", "--cache-ram", "0", "--metrics"]);
    let (follow_ups, plain) = run_round_robin(&off, 8, 3);
    assert!(
        follow_ups.iter().all(|&(cached, _)| cached == 0),
        "{follow_ups:?}"
    );
    drop(off);

    let s = Server::start(&["-np", "4", "--cache-ram", "64", "--metrics"]);
    let (follow_ups, cached) = run_round_robin(&s, 8, 3);
    assert_covered(&follow_ups);
    // Restored memory continues exactly as memory processed from scratch.
    assert_eq!(cached, plain);
    let m = s.metrics();
    assert!(
        metric(&m, "specd:prompt_cache_ram_hits_total") >= 16.0,
        "{m}"
    );
    assert!(
        metric(&m, "specd:prompt_cache_ram_saves_total") >= 16.0,
        "{m}"
    );
    assert!(metric(&m, "specd:prompt_cache_ram_bytes") > 0.0, "{m}");
    assert_eq!(
        metric(&m, "specd:prompt_cache_ram_limit_bytes"),
        64.0 * 1048576.0
    );
}

#[test]
fn a_small_ram_cache_evicts_the_least_recently_used() {
    const MIB: f64 = 1048576.0;
    // The size of one saved conversation: two conversations on one slot save the first.
    let s = Server::start(&["-np", "1", "--metrics"]);
    run_round_robin(&s, 2, 1);
    let one = metric(&s.metrics(), "specd:prompt_cache_ram_bytes");
    assert!(one > 0.0 && one < MIB / 2.0, "{one}");
    drop(s);

    // A 1 MiB cache and two conversations more than it holds, on one slot.
    let n = (MIB / one) as u64 + 2;
    let s = Server::start(&["-np", "1", "--cache-ram", "1", "--metrics"]);
    let mut hist: Vec<Vec<u64>> = (0..n)
        .map(|c| turn(&s, &[], &user(c, 0), &json!({})).1)
        .collect();
    let m = s.metrics();
    let held = metric(&m, "specd:prompt_cache_ram_entries") as u64;
    assert!(metric(&m, "specd:prompt_cache_ram_bytes") <= MIB, "{m}");
    assert!(
        metric(&m, "specd:prompt_cache_ram_evictions_total") >= 1.0,
        "{m}"
    );
    assert_eq!(
        held,
        n - 2,
        "the last conversation is in the slot, the first was evicted"
    );
    // Follow-ups, most recent first: the slot's own conversation, then held ones from the
    // cache; the oldest were evicted (the first at once, more as the longer follow-up
    // memories replace shorter ones) and start over. Never a partial or wrong reuse.
    let mut reused = Vec::new();
    for c in (0..n).rev() {
        let h = hist[c as usize].clone();
        let (r, all) = turn(&s, &h, &user(c, 1), &json!({}));
        reused.push((c, cache_n(&r), h.len() as u64));
        hist[c as usize] = all;
    }
    let n_reused = reused
        .iter()
        .take_while(|&&(_, cached, history)| cached + 1 >= history)
        .count();
    assert!(
        reused[n_reused..].iter().all(|&(_, cached, _)| cached == 0),
        "{reused:?}"
    );
    assert!(n_reused >= 2 && n_reused < n as usize, "{reused:?}");
    let m = s.metrics();
    assert_eq!(
        metric(&m, "specd:prompt_cache_ram_hits_total") as usize,
        n_reused - 1,
        "{m}"
    );
    assert!(metric(&m, "specd:prompt_cache_ram_bytes") <= MIB, "{m}");
}

/// llama-server's `--cache-idle-slots` (on by default): with a unified memory a request that
/// starts on one slot saves each other idle slot's memory into the RAM cache and frees it, and
/// the conversation continues from the cache with the same tokens as one whose memory stayed in
/// its slot. Off, or with per-slot memory, idle slots keep their memory in place.
#[test]
fn idle_slots_go_to_the_ram_cache_when_a_request_starts() {
    let long: Vec<u64> = (0..40).map(|i| 60 + i).collect();
    let other: Vec<u64> = (0..8).map(|i| 500 + i).collect();
    const ENABLED: &str = "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__";
    const TAG: &str = "__TEST_TAG_CACHE_IDLE_SLOT__";
    let counts = |s: &Server| {
        let m = s.metrics();
        (
            metric(&m, "specd:prompt_cache_ram_saves_total") as u64,
            metric(&m, "specd:prompt_cache_ram_hits_total") as u64,
        )
    };
    // Conversation A on slot 0, then B on slot 1, then A again with no slot named.
    let run = |s: &Server| {
        let (first, _) = turn(s, &[], &long, &json!({"id_slot": 0}));
        let after_a = counts(s);
        turn(s, &[], &other, &json!({"id_slot": 1}));
        let after_b = counts(s);
        let (again, _) = turn(s, &[], &long, &json!({}));
        assert_eq!(tokens(&again), tokens(&first));
        assert_eq!(cache_n(&again), long.len() as u64 - 1, "{again}");
        (after_a, after_b, counts(s), tokens(&again))
    };
    let common = ["-np", "2", "--cache-ram", "64", "--metrics", "--verbose"];

    // Unified memory: B's start saves A's slot and frees it; A comes back from the cache (and
    // its start saves and frees B's slot in turn).
    let s = Server::start(&[&common[..], &["--kv-unified"]].concat());
    assert!(s.log_shows(ENABLED), "{}", s.log());
    let (a, b, end, unified) = run(&s);
    assert_eq!((a, b, end), ((0, 0), (1, 0), (2, 1)), "saves, hits");
    assert!(s.log_shows(TAG) && s.log_shows("updating prompt cache"));
    drop(s);

    // Off, and per-slot memory: nothing is saved while slots are free, A continues in place.
    for extra in [&["--kv-unified", "--no-cache-idle-slots"][..], &[]] {
        let s = Server::start(&[&common[..], extra].concat());
        let (a, b, end, kept) = run(&s);
        assert_eq!((a, b, end), ((0, 0), (0, 0), (0, 0)), "{extra:?}");
        assert_eq!(kept, unified);
        let log = s.log();
        assert!(!log.contains(ENABLED) && !log.contains(TAG), "{log}");
    }
}

#[test]
fn interleaved_conversations_sharing_a_system_prompt_keep_their_slots() {
    // The slot choice alone (no RAM cache): B's first turn shares A's system prompt, but the
    // recurrent state cannot go back there, so taking A's slot would gain nothing and destroy
    // A's history. B must take the empty slot; both then reuse everything on each follow-up.
    let s = Server::start(&["-np", "2", "--cache-ram", "0"]);
    let system: Vec<u64> = (0..12).map(|i| 300 + i).collect();
    let mut a = system.clone();
    let mut b = system.clone();
    let mut follow_ups = Vec::new();
    for t in 0..3 {
        for (c, h) in [(0, &mut a), (1, &mut b)] {
            let before = h.len() as u64;
            let (r, all) = turn(&s, h, &user(c, t), &json!({}));
            if t > 0 {
                follow_ups.push((cache_n(&r), before));
            }
            *h = all;
        }
    }
    assert_covered(&follow_ups);
}

#[test]
fn cache_partitions_by_api_key_and_salt() {
    let s = Server::start(&["-np", "1", "--api-key", "key-one,key-two"]);
    let prompt: Vec<u64> = (0..24).map(|i| 40 + i).collect();
    let body = json!({"prompt": prompt, "n_predict": 2, "temperature": 0, "id_slot": 0});
    let send = |key: &str, extra: &Value| -> Value {
        let mut b = body.clone();
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        let auth = format!("Bearer {key}");
        let r = request(
            &s.addr,
            "POST",
            "/completion",
            &[("Authorization", auth.as_str())],
            Some(b.to_string().as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let none = json!({});
    assert_eq!(cache_n(&send("key-one", &none)), 0);
    // The same key reuses its prompt; the other key, on the very same slot, sees nothing.
    assert_eq!(cache_n(&send("key-one", &none)), 23);
    assert_eq!(cache_n(&send("key-two", &none)), 0);
    // key-two's request replaced the slot's memory: key-one's prefix comes back only through
    // the RAM cache, still within key-one's partition.
    assert_eq!(cache_n(&send("key-one", &none)), 23);
    // A salt is a partition of its own within a key.
    let salt_a = json!({"cache_salt": "tenant-a"});
    assert_eq!(cache_n(&send("key-one", &salt_a)), 0);
    assert_eq!(cache_n(&send("key-one", &salt_a)), 23);
    assert_eq!(
        cache_n(&send("key-one", &json!({"cache_salt": "tenant-b"}))),
        0
    );
}

#[test]
fn cache_salt_must_be_a_non_empty_string() {
    let s = Server::start(&[]);
    for bad in [json!(""), json!(3), json!(["a"])] {
        let r = s.post(
            "/completion",
            &json!({"prompt": "hi", "n_predict": 1, "cache_salt": bad}),
        );
        let v = common::http::assert_error(&r, 400, "invalid_request_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cache_salt"),
            "{v}"
        );
    }
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                "cache_salt": "x"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
