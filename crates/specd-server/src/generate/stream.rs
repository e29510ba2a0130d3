//! Streamed responses: one generation's engine events turned into server-sent events by its
//! API dialect's [`StreamShape`], several generations merged into one stream.

use super::{hide_zero, Running};
use crate::error::ApiError;
use crate::scheduler::Event;
use crate::AppState;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use specd_spec::engine::TokenProbs;
use specd_spec::{LiveTimings, PromptProgress, SeqOutput};
use std::convert::Infallible;
use std::sync::Arc;

/// What one generation's stream looks like in an API dialect: the events its chunks, progress
/// reports and end become. Each shape holds one generation.
pub(crate) trait StreamShape: Send {
    /// The generation took slot `slot` (a later generation of a request starts after the
    /// response began).
    fn set_slot(&mut self, _slot: usize) {}

    /// Events for new tokens and their text.
    fn chunk(
        &mut self,
        st: &AppState,
        tokens: Vec<u32>,
        text: String,
        probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<SseEvent>;

    /// Events for a prompt-progress report (`return_progress`); `with_timings`: the request
    /// asked for `timings_per_token`.
    fn progress(&self, _p: &PromptProgress, _with_timings: bool) -> Vec<SseEvent> {
        Vec::new()
    }

    /// Events for the end of the generation; `per_token`: the request asked for
    /// `timings_per_token`.
    fn done(&mut self, st: &AppState, out: &SeqOutput, per_token: bool) -> Vec<SseEvent>;

    /// The event that reports an error and ends the stream.
    fn error(&self, e: &ApiError) -> SseEvent {
        data(json!({"error": e.object()}))
    }
}

/// A data-only event carrying `v` as JSON.
pub(crate) fn data(v: Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// One generation's events as a stream: `(events, failed)` per engine event, ending after its
/// last. Dropping it (the client went away) drops the event receiver, which cancels the slot.
fn events(
    st: Arc<AppState>,
    r: Running,
    shape: Box<dyn StreamShape>,
) -> impl Stream<Item = (Vec<SseEvent>, bool)> + Send {
    struct S {
        st: Arc<AppState>,
        r: Running,
        shape: Box<dyn StreamShape>,
    }
    stream::unfold(Some(S { st, r, shape }), |state| async move {
        let mut s = state?;
        loop {
            let ev = match s.r.next().await {
                Ok(ev) => ev,
                Err(e) => return Some(((vec![s.shape.error(&e)], true), None)),
            };
            match ev {
                Some(Event::Chunk {
                    tokens,
                    text,
                    probs,
                    timings,
                }) => {
                    if s.r.zero {
                        continue;
                    }
                    let p = s
                        .shape
                        .chunk(&s.st, tokens, text, &probs, timings.as_deref());
                    if !p.is_empty() {
                        return Some(((p, false), Some(s)));
                    }
                }
                Some(Event::Progress(p)) => {
                    return Some(((s.shape.progress(&p, s.r.timings), false), Some(s)))
                }
                Some(Event::Done(out)) => {
                    let mut out = *out;
                    if s.r.zero {
                        hide_zero(&mut out);
                    }
                    let p = s.shape.done(&s.st, &out, s.r.timings);
                    return Some(((p, false), None));
                }
                Some(Event::Failed(e)) => return Some(((vec![s.shape.error(&e)], true), None)),
                Some(Event::Started { slot, .. }) => {
                    s.r.slot = slot;
                    s.shape.set_slot(slot);
                }
                None => {
                    let e = ApiError::server("the engine dropped the request");
                    return Some(((vec![s.shape.error(&e)], true), None));
                }
            }
        }
    })
}

/// Streams generations as server-sent events, their chunks interleaved as they come (each
/// names its `index`); OpenAI streams end with `[DONE]` once all have finished. The first error
/// ends the stream. Dropping the stream (the client went away) drops the event receivers,
/// which cancels the slots.
pub(crate) fn sse(
    st: Arc<AppState>,
    runs: Vec<(Running, Box<dyn StreamShape>)>,
    done_marker: bool,
) -> Response {
    let merged = stream::select_all(
        runs.into_iter()
            .map(|(r, shape)| Box::pin(events(st.clone(), r, shape))),
    );
    let all = stream::unfold(Some(merged), move |state| async move {
        let mut merged = state?;
        match merged.next().await {
            Some((p, failed)) => Some((p, (!failed).then_some(merged))),
            None => done_marker.then(|| (vec![SseEvent::default().data("[DONE]")], None)),
        }
    });
    let all = all.flat_map(|evs| stream::iter(evs.into_iter().map(Ok::<_, Infallible>)));
    Sse::new(all).into_response()
}

pub(crate) fn into_response(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}
