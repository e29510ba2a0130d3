//! The figures of `specd bench --server`: per phase, per multi-turn turn, as markdown tables
//! and as JSON (`--json`).

use super::client::{Outcome, Sample, Timings};
use serde::Serialize;

/// The figures of a load test (`--json`).
#[derive(Serialize)]
pub(super) struct LoadReport {
    pub(super) server: String,
    /// The first id in `/v1/models`, when the server has that endpoint.
    pub(super) model: Option<String>,
    pub(super) concurrency: usize,
    pub(super) n_predict: usize,
    pub(super) temperature: f64,
    pub(super) seed: u32,
    pub(super) stream: bool,
    pub(super) ignore_eos: bool,
    pub(super) single_turn: Option<PhaseReport>,
    pub(super) multi_turn: Option<MultiTurnReport>,
    /// Why each failed request failed.
    pub(super) errors: Vec<String>,
}

/// Figures over the requests of one phase.
#[derive(Serialize)]
pub(super) struct PhaseReport {
    /// Requests sent (failed ones included).
    pub(super) requests: usize,
    pub(super) failed: usize,
    pub(super) completion_tokens: u64,
    pub(super) wall_s: f64,
    /// Completion tokens over wall time: what the server delivers to all clients together.
    pub(super) throughput_tok_s: f64,
    /// Mean over requests of each request's own generation speed.
    pub(super) mean_decode_tok_s: Option<f64>,
    pub(super) p50_latency_s: Option<f64>,
    pub(super) p90_latency_s: Option<f64>,
    /// Streaming only.
    pub(super) mean_ttft_s: Option<f64>,
    /// `usage.prompt_tokens` summed: whole prompts.
    pub(super) prompt_tokens: u64,
    /// `timings.prompt_n` summed: prompt tokens the server actually processed (not reused).
    pub(super) prompt_n: Option<u64>,
    pub(super) draft_n: Option<u64>,
    pub(super) draft_n_accepted: Option<u64>,
    pub(super) acceptance_rate: Option<f64>,
}

/// Sum of the values present; None when none is.
pub(super) fn sum_some(it: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    it.fold(None, |acc, x| match (acc, x) {
        (a, None) => a,
        (a, Some(x)) => Some(a.unwrap_or(0) + x),
    })
}

pub(super) fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Nearest-rank percentile of sorted values.
pub(super) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl PhaseReport {
    pub(super) fn of<'a>(outcomes: impl Iterator<Item = &'a Outcome>, wall_s: f64) -> PhaseReport {
        let outcomes: Vec<&Outcome> = outcomes.collect();
        let ok: Vec<&Sample> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let completion_tokens = ok.iter().map(|s| s.completion_tokens()).sum();
        let mut lat: Vec<f64> = ok.iter().map(|s| s.latency_s).collect();
        lat.sort_by(f64::total_cmp);
        let decode: Vec<f64> = ok.iter().filter_map(|s| s.decode_tok_s()).collect();
        let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft_s).collect();
        let timing = |f: fn(&Timings) -> Option<u64>| {
            sum_some(ok.iter().map(|s| s.timings.as_ref().and_then(f)))
        };
        let draft_n = timing(|t| t.draft_n);
        let draft_n_accepted = timing(|t| t.draft_n_accepted);
        PhaseReport {
            requests: outcomes.len(),
            failed: outcomes.len() - ok.len(),
            completion_tokens,
            wall_s,
            throughput_tok_s: if wall_s > 0.0 {
                completion_tokens as f64 / wall_s
            } else {
                0.0
            },
            mean_decode_tok_s: mean(&decode),
            p50_latency_s: percentile(&lat, 0.5),
            p90_latency_s: percentile(&lat, 0.9),
            mean_ttft_s: mean(&ttft),
            prompt_tokens: ok.iter().filter_map(|s| s.prompt_tokens).sum(),
            prompt_n: timing(|t| t.prompt_n),
            draft_n,
            draft_n_accepted,
            acceptance_rate: match (draft_n, draft_n_accepted) {
                (Some(d), Some(a)) if d > 0 => Some(a as f64 / d as f64),
                _ => None,
            },
        }
    }
}

/// The multi-turn phase: overall figures and one row per turn.
#[derive(Serialize)]
pub(super) struct MultiTurnReport {
    pub(super) id: String,
    /// Copies of the conversation run at once (= concurrency).
    pub(super) conversations: usize,
    pub(super) turns_per_conversation: usize,
    /// Copies whose every turn succeeded.
    pub(super) completed_conversations: usize,
    pub(super) summary: PhaseReport,
    pub(super) turns: Vec<TurnReport>,
}

/// Means over the copies of one turn.
#[derive(Serialize)]
pub(super) struct TurnReport {
    /// 1-based.
    pub(super) turn: usize,
    pub(super) requests: usize,
    pub(super) failed: usize,
    /// The whole prompt (`usage.prompt_tokens`).
    pub(super) mean_prompt_tokens: Option<f64>,
    /// Prompt tokens processed (`timings.prompt_n`); below `mean_prompt_tokens` when the
    /// server reused the previous turns' memory.
    pub(super) mean_prompt_n: Option<f64>,
    pub(super) mean_completion_tokens: Option<f64>,
    pub(super) mean_latency_s: Option<f64>,
    pub(super) mean_ttft_s: Option<f64>,
    pub(super) mean_decode_tok_s: Option<f64>,
}

impl TurnReport {
    pub(super) fn of<'a>(turn: usize, outcomes: impl Iterator<Item = &'a Outcome>) -> TurnReport {
        let outcomes: Vec<&Outcome> = outcomes.collect();
        let ok: Vec<&Sample> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let m = |f: &dyn Fn(&Sample) -> Option<f64>| {
            mean(&ok.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
        };
        TurnReport {
            turn,
            requests: outcomes.len(),
            failed: outcomes.len() - ok.len(),
            mean_prompt_tokens: m(&|s| s.prompt_tokens.map(|x| x as f64)),
            mean_prompt_n: m(&|s| s.prompt_n().map(|x| x as f64)),
            mean_completion_tokens: m(&|s| Some(s.completion_tokens() as f64)),
            mean_latency_s: m(&|s| Some(s.latency_s)),
            mean_ttft_s: m(&|s| s.ttft_s),
            mean_decode_tok_s: m(&|s| s.decode_tok_s()),
        }
    }
}

pub(super) fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.digits$}"))
}

pub(super) fn print_report(r: &LoadReport) {
    println!(
        "server: {}  model: {}  concurrency: {}  n-predict: {}  temp: {}  seed: {}  stream: {}{}",
        r.server,
        r.model.as_deref().unwrap_or("?"),
        r.concurrency,
        r.n_predict,
        r.temperature,
        r.seed,
        if r.stream { "yes" } else { "no" },
        if r.ignore_eos { "  ignore-eos" } else { "" },
    );
    println!(
        "\n| phase | requests | failed | completion tok | wall s | tok/s (all clients) \
         | decode tok/s (mean per request) | p50 latency s | p90 latency s | mean TTFT s \
         | prompt tok | prompt_n (processed) | draft accepted |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let phases = [
        ("single-turn", r.single_turn.as_ref()),
        ("multi-turn", r.multi_turn.as_ref().map(|m| &m.summary)),
    ];
    for (name, p) in phases {
        let Some(p) = p else { continue };
        let drafts = match (p.draft_n, p.draft_n_accepted, p.acceptance_rate) {
            (Some(d), Some(a), Some(rate)) => format!("{a}/{d} ({rate:.2})"),
            _ => "-".into(),
        };
        println!(
            "| {name} | {} | {} | {} | {:.2} | {:.1} | {} | {} | {} | {} | {} | {} | {drafts} |",
            p.requests,
            p.failed,
            p.completion_tokens,
            p.wall_s,
            p.throughput_tok_s,
            opt(p.mean_decode_tok_s, 1),
            opt(p.p50_latency_s, 3),
            opt(p.p90_latency_s, 3),
            opt(p.mean_ttft_s, 3),
            p.prompt_tokens,
            p.prompt_n.map_or("-".into(), |x| x.to_string()),
        );
    }
    if let Some(m) = &r.multi_turn {
        println!(
            "\nmulti-turn `{}`: {} conversation(s) at once, {} completed; means per turn:",
            m.id, m.conversations, m.completed_conversations
        );
        println!(
            "| turn | requests | failed | prompt tok | prompt_n (processed) | reused | completion tok \
             | latency s | TTFT s | decode tok/s |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for t in &m.turns {
            let reused = match (t.mean_prompt_tokens, t.mean_prompt_n) {
                (Some(all), Some(n)) if all > 0.0 => format!("{:.0}%", 100.0 * (1.0 - n / all)),
                _ => "-".into(),
            };
            println!(
                "| {} | {} | {} | {} | {} | {reused} | {} | {} | {} | {} |",
                t.turn,
                t.requests,
                t.failed,
                opt(t.mean_prompt_tokens, 0),
                opt(t.mean_prompt_n, 0),
                opt(t.mean_completion_tokens, 1),
                opt(t.mean_latency_s, 3),
                opt(t.mean_ttft_s, 3),
                opt(t.mean_decode_tok_s, 1),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_sums() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 0.5), Some(5.0));
        assert_eq!(percentile(&v, 0.9), Some(9.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(
            sum_some([None, Some(2), None, Some(3)].into_iter()),
            Some(5)
        );
        assert_eq!(sum_some([None, None].into_iter()), None);
    }

    #[test]
    fn phase_figures() {
        let ok = |lat: f64, json: serde_json::Value| {
            let mut s = Sample {
                latency_s: lat,
                ..Sample::default()
            };
            s.read_counts(&json);
            Ok(s)
        };
        let outcomes = [
            ok(
                1.0,
                serde_json::json!({"usage": {"prompt_tokens": 5, "completion_tokens": 4}}),
            ),
            ok(
                2.0,
                serde_json::json!({"usage": {"prompt_tokens": 7, "completion_tokens": 6},
                "timings": {"prompt_n": 3, "draft_n": 4, "draft_n_accepted": 3}}),
            ),
            Err("boom".to_string()),
        ];
        let r = PhaseReport::of(outcomes.iter(), 2.0);
        assert_eq!((r.requests, r.failed, r.completion_tokens), (3, 1, 10));
        assert_eq!((r.prompt_tokens, r.prompt_n), (12, Some(3)));
        assert_eq!(r.throughput_tok_s, 5.0);
        assert_eq!(r.acceptance_rate, Some(0.75));
        assert_eq!((r.p50_latency_s, r.p90_latency_s), (Some(1.0), Some(2.0)));
    }
}
