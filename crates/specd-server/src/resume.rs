//! Resumable streams, as llama-server has them (its web UI resumes a reply after a page reload).
//!
//! A streamed request that carries an `X-Conversation-Id` header is *detached* from its
//! connection: a task of its own pulls the response's server-sent events to the end and keeps
//! them in a buffer under that id, while passing them on to the client that asked. A client
//! that goes away therefore no longer cancels the generation; it, or another client, reads the
//! stream again with
//!
//! * `GET /v1/stream?conv_id=ID&from=N`: the buffered bytes from offset `N` (0: the start), then
//!   the live ones until the generation ends (404 once the session is gone; 400 when `N` lies in
//!   the part already dropped from the front of a full buffer);
//! * `DELETE /v1/stream?conv_id=ID`: stops the generation (its slot is cancelled) and drops the
//!   buffer; 204 whether or not there was one;
//! * `POST /v1/streams/lookup` with `{"conversation_ids": [...]}`: state of the sessions of the
//!   ids asked about (an id also matches `ID::<model>`), never a list of all of them.
//!
//! A new request under the same id replaces (and stops) the previous one. A buffer holds the
//! last 4 MiB of its stream; a finished session is kept 5 minutes. The ids are the client's, as
//! in llama-server: anyone who may use the server and knows an id can read that stream.

use crate::error::ApiError;
use crate::generate::unix_now;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The most bytes one session keeps; older ones are dropped from the front.
const MAX_BYTES: usize = 4 << 20;
/// How long a finished session stays readable.
const TTL: Duration = Duration::from_secs(300);
/// Events in flight to the requesting client before the generation waits for it (as an
/// undetached stream waits for a slow reader).
const LIVE_QUEUE: usize = 64;

/// The request header that names a conversation.
const HEADER: &str = "x-conversation-id";

/// The routes whose streams can be detached: those that generate. (The header on any other
/// request, `/tokenize` say, must not stop the conversation's stream.)
const GENERATING: [&str; 9] = [
    "/completion",
    "/completions",
    "/infill",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/responses",
    "/v1/responses",
    "/v1/messages",
];

/// A session's bytes: the kept tail of its stream and how much was dropped before it.
#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    dropped: usize,
    done: bool,
    /// Unix seconds of the end (0 while running).
    completed_at: u64,
    /// Monotonic end, for the expiry.
    ended: Option<std::time::Instant>,
}

impl Buffer {
    fn total(&self) -> usize {
        self.dropped + self.bytes.len()
    }

    fn append(&mut self, data: &[u8]) {
        if data.len() >= MAX_BYTES {
            let skip = data.len() - MAX_BYTES;
            self.dropped += self.bytes.len() + skip;
            self.bytes.clear();
            self.bytes.extend_from_slice(&data[skip..]);
            return;
        }
        let over = (self.bytes.len() + data.len()).saturating_sub(MAX_BYTES);
        if over > 0 {
            self.bytes.drain(..over);
            self.dropped += over;
        }
        self.bytes.extend_from_slice(data);
    }
}

/// One conversation's stream.
struct Session {
    id: String,
    started_at: u64,
    buf: Mutex<Buffer>,
    /// Bumped at every append and at the end: readers wait on it.
    changed: watch::Sender<u64>,
    /// Set by a stop (`DELETE`, or a newer request under the same id).
    cancel: watch::Sender<bool>,
}

impl Session {
    fn new(id: String) -> Self {
        Session {
            id,
            started_at: unix_now(),
            buf: Mutex::new(Buffer::default()),
            changed: watch::channel(0).0,
            cancel: watch::channel(false).0,
        }
    }

    /// The buffer; a panic elsewhere while it was held leaves bytes that are still valid.
    fn buf(&self) -> MutexGuard<'_, Buffer> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn append(&self, data: &[u8]) {
        self.buf().append(data);
        self.changed.send_modify(|v| *v += 1);
    }

    fn finish(&self) {
        {
            let mut b = self.buf();
            if b.done {
                return;
            }
            b.done = true;
            b.completed_at = unix_now();
            b.ended = Some(std::time::Instant::now());
        }
        self.changed.send_modify(|v| *v += 1);
    }

    fn stop(&self) {
        self.cancel.send_replace(true);
        self.finish();
    }

    fn expired(&self) -> bool {
        self.buf().ended.is_some_and(|t| t.elapsed() >= TTL)
    }

    fn describe(&self) -> Value {
        let b = self.buf();
        json!({
            "conversation_id": self.id,
            "is_done": b.done,
            "total_bytes": b.total(),
            "started_at": self.started_at,
            "completed_at": b.completed_at,
        })
    }

    /// The bytes from `offset` on: `Ok(None)` once the stream has ended and nothing is left,
    /// `Err(())` when `offset` lies in the dropped part. Waits for bytes while it runs.
    async fn read_from(&self, offset: usize) -> Result<Option<Bytes>, ()> {
        let mut changed = self.changed.subscribe();
        loop {
            {
                let b = self.buf();
                if offset < b.dropped {
                    return Err(());
                }
                if offset < b.total() {
                    return Ok(Some(Bytes::copy_from_slice(&b.bytes[offset - b.dropped..])));
                }
                if b.done {
                    return Ok(None);
                }
                changed.borrow_and_update();
            }
            if changed.changed().await.is_err() {
                return Ok(None);
            }
        }
    }
}

/// The live sessions, by conversation id. Expired ones are swept on every access, so no timer
/// thread is needed.
#[derive(Default)]
pub struct Streams {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl Streams {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        let mut m = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, s| !s.expired());
        m
    }

    /// A new session under `id`, stopping the one it replaces.
    fn open(&self, id: &str) -> Arc<Session> {
        let s = Arc::new(Session::new(id.to_string()));
        let previous = self.map().insert(id.to_string(), s.clone());
        if let Some(p) = previous {
            p.stop();
        }
        s
    }

    fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.map().get(id).cloned()
    }

    /// Removes `id`'s session if it is still `s` (a newer request may have replaced it).
    fn remove_if(&self, id: &str, s: &Arc<Session>) {
        let mut m = self.map();
        if m.get(id).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            m.remove(id);
        }
    }

    fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.map().remove(id)
    }

    /// Sessions whose id is one of `ids`, or one of them followed by `::` and a model name.
    fn matching(&self, ids: &[String]) -> Vec<Arc<Session>> {
        let m = self.map();
        let mut out = Vec::new();
        for id in ids.iter().filter(|i| !i.is_empty()) {
            let prefix = format!("{id}::");
            let mut found: Vec<_> = m
                .values()
                .filter(|s| s.id == *id || s.id.starts_with(&prefix))
                .cloned()
                .collect();
            found.sort_by(|a, b| a.id.cmp(&b.id));
            out.extend(found);
        }
        out
    }
}

fn conversation_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(HEADER)?.to_str().ok()?.trim();
    (!v.is_empty()).then(|| v.to_string())
}

fn is_event_stream(res: &Response) -> bool {
    res.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Middleware on the generation routes: a successful streamed answer to a request with an
/// `X-Conversation-Id` is detached from the connection (see the module's text); anything else
/// passes through untouched. The session is opened before the request runs, so a newer request
/// stops an older one at once, and removed again if the answer is no stream (an error).
pub(crate) async fn detach(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let id = conversation_id(req.headers())
        .filter(|_| req.method() == Method::POST && GENERATING.contains(&req.uri().path()));
    let Some(id) = id else {
        return next.run(req).await;
    };
    let session = st.streams.open(&id);
    let res = next.run(req).await;
    if !res.status().is_success() || !is_event_stream(&res) {
        st.streams.remove_if(&id, &session);
        session.finish();
        return res;
    }
    let (parts, body) = res.into_parts();
    let (live_tx, live_rx) = mpsc::channel::<Bytes>(LIVE_QUEUE);
    tokio::spawn(pump(body, session, live_tx));
    let live = futures_util::stream::unfold(live_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::from_parts(parts, Body::from_stream(live))
}

/// Pulls a detached stream to its end (or its stop) into the session, passing every piece on
/// to the requesting client while it listens. Stopping drops the body, which cancels the
/// generation's slot.
async fn pump(body: Body, session: Arc<Session>, live: mpsc::Sender<Bytes>) {
    let mut data = body.into_data_stream();
    let mut cancel = session.cancel.subscribe();
    let mut listening = true;
    loop {
        let piece = tokio::select! {
            p = data.next() => p,
            _ = cancel.wait_for(|c| *c) => break,
        };
        let Some(Ok(bytes)) = piece else { break };
        session.append(&bytes);
        if listening {
            tokio::select! {
                sent = live.send(bytes) => listening = sent.is_ok(),
                _ = cancel.wait_for(|c| *c) => break,
            }
        }
    }
    session.finish();
}

#[derive(Deserialize)]
pub(crate) struct StreamQuery {
    conv_id: Option<String>,
    from: Option<String>,
}

fn missing_id() -> Response {
    ApiError::invalid("Missing conversation id: pass it as ?conv_id=").into_response()
}

/// `GET /v1/stream?conv_id=ID&from=N`.
pub(crate) async fn read(
    State(st): State<Arc<AppState>>,
    Query(q): Query<StreamQuery>,
) -> Response {
    let Some(id) = q.conv_id.filter(|i| !i.is_empty()) else {
        return missing_id();
    };
    let Some(session) = st.streams.get(&id) else {
        return ApiError::new(
            crate::error::ErrorKind::NotFound,
            "Stream not found or expired",
        )
        .into_response();
    };
    let from = match q.from.as_deref().filter(|f| !f.is_empty()) {
        None => 0,
        Some(f) => match f.parse::<usize>() {
            Ok(n) => n,
            Err(_) => return ApiError::invalid("Invalid 'from' offset").into_response(),
        },
    };
    if from < session.buf().dropped {
        return ApiError::invalid("Stream offset lost, please restart").into_response();
    }
    let body = futures_util::stream::unfold((session, from), |(s, offset)| async move {
        match s.read_from(offset).await {
            Ok(Some(b)) => {
                let next = offset + b.len();
                Some((Ok::<_, std::convert::Infallible>(b), (s, next)))
            }
            // The reader fell behind a full buffer: the stream ends; the client restarts.
            Ok(None) | Err(()) => None,
        }
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// `DELETE /v1/stream?conv_id=ID`.
pub(crate) async fn stop(
    State(st): State<Arc<AppState>>,
    Query(q): Query<StreamQuery>,
) -> Response {
    let Some(id) = q.conv_id.filter(|i| !i.is_empty()) else {
        return missing_id();
    };
    match st.streams.remove(&id) {
        Some(s) => s.stop(),
        None => tracing::warn!(conv_id = %id, "stream stop: no such session"),
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /v1/streams/lookup`.
pub(crate) async fn lookup(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return ApiError::invalid(format!("invalid body: {e}")).into_response(),
    };
    let ids: Vec<String> = v
        .get("conversation_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let found: Vec<Value> = st
        .streams
        .matching(&ids)
        .iter()
        .map(|s| s.describe())
        .collect();
    axum::Json(Value::Array(found)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_keeps_the_tail() {
        let mut b = Buffer::default();
        b.append(&vec![1u8; MAX_BYTES - 10]);
        b.append(&[2u8; 30]);
        assert_eq!(b.bytes.len(), MAX_BYTES);
        assert_eq!(b.dropped, 20);
        assert_eq!(b.total(), MAX_BYTES + 20);
        assert_eq!(*b.bytes.last().unwrap(), 2);
        b.append(&vec![3u8; MAX_BYTES + 5]);
        assert_eq!(b.bytes.len(), MAX_BYTES);
        assert_eq!(b.total(), 2 * MAX_BYTES + 25);
        assert!(b.bytes.iter().all(|&x| x == 3));
    }

    #[tokio::test]
    async fn readers_see_appends_and_the_end() {
        let s = Arc::new(Session::new("c".into()));
        let r = {
            let s = s.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut off = 0;
                while let Ok(Some(b)) = s.read_from(off).await {
                    off += b.len();
                    got.extend_from_slice(&b);
                }
                got
            })
        };
        s.append(b"data: a\n\n");
        tokio::task::yield_now().await;
        s.append(b"data: b\n\n");
        s.finish();
        assert_eq!(r.await.unwrap(), b"data: a\n\ndata: b\n\n");
        assert_eq!(s.read_from(18).await, Ok(None));
    }

    #[test]
    fn lookup_matches_ids_and_their_model_variants() {
        let st = Streams::default();
        st.open("a");
        st.open("a::org/model");
        st.open("ab");
        let ids: Vec<_> = st
            .matching(&["a".to_string()])
            .iter()
            .map(|s| s.id.clone())
            .collect();
        assert_eq!(ids, ["a", "a::org/model"]);
        assert!(st.matching(&[String::new()]).is_empty());
    }

    #[test]
    fn a_new_request_stops_the_old_one() {
        let st = Streams::default();
        let old = st.open("c");
        let new = st.open("c");
        assert!(*old.cancel.borrow() && old.buf().done);
        assert!(!*new.cancel.borrow());
        st.remove_if("c", &old);
        assert!(st.get("c").is_some_and(|s| Arc::ptr_eq(&s, &new)));
    }
}
