//! Errors as HTTP responses, in the OpenAI / llama-server shape:
//! `{"error": {"code": 400, "message": "...", "type": "invalid_request_error"}}` — or, on the
//! routes of Anthropic's API ([`is_anthropic_path`]), Anthropic's
//! `{"type": "error", "error": {"type": "...", "message": "..."}}`.
//!
//! Every error answer has such a body, the HTTP layer's included: [`json_errors`] rewrites what
//! axum's extractors and layers answer in plain text (or with no body), and `conn.rs` does the
//! same for the answers hyper writes itself when a request cannot be parsed (a NUL byte in a
//! header, an oversized head).

use crate::AppState;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Error kinds, named after llama-server's `error_type` (the `type` field of the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400 `invalid_request_error`: malformed JSON, bad parameters.
    InvalidRequest,
    /// 401 `authentication_error`: missing or wrong API key.
    Authentication,
    /// 404 `not_found_error`.
    NotFound,
    /// 413 `invalid_request_error`: the body is over the size limit.
    TooLarge,
    /// 408 `invalid_request_error`: the body did not arrive within `--timeout`.
    Timeout,
    /// 400 `exceed_context_size_error`: the prompt does not fit the slot's context.
    ExceedContext,
    /// 501 `not_supported_error`: an endpoint or feature this server has switched off.
    NotSupported,
    /// 503 `unavailable_error`: the engine is not running.
    Unavailable,
    /// 500 `server_error`.
    Server,
    /// 403 `permission_error`: the request may not be answered here (a `Host` the DNS-rebinding
    /// check refuses).
    Permission,
    /// Any other status the HTTP layer answers (405, 415, 431, …): `invalid_request_error` for
    /// a 4xx, `server_error` for a 5xx.
    Http(StatusCode),
}

impl ErrorKind {
    fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ExceedContext => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::NotSupported => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Server => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Permission => StatusCode::FORBIDDEN,
            ErrorKind::Http(s) => s,
        }
    }
    fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::TooLarge | ErrorKind::Timeout => {
                "invalid_request_error"
            }
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::ExceedContext => "exceed_context_size_error",
            ErrorKind::NotSupported => "not_supported_error",
            ErrorKind::Unavailable => "unavailable_error",
            ErrorKind::Server => "server_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::Http(s) if s.is_server_error() => "server_error",
            ErrorKind::Http(_) => "invalid_request_error",
        }
    }
    /// Anthropic's name for the kind (its `error.type`).
    fn anthropic_type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ExceedContext => "invalid_request_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::Timeout => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::Unavailable => "overloaded_error",
            ErrorKind::NotSupported | ErrorKind::Server => "api_error",
            ErrorKind::Http(s) if s.is_server_error() => "api_error",
            ErrorKind::Http(_) => "invalid_request_error",
        }
    }
    /// The kind of an error answer with this status.
    pub fn of_status(s: StatusCode) -> Self {
        match s {
            StatusCode::BAD_REQUEST => ErrorKind::InvalidRequest,
            StatusCode::UNAUTHORIZED => ErrorKind::Authentication,
            StatusCode::FORBIDDEN => ErrorKind::Permission,
            StatusCode::NOT_FOUND => ErrorKind::NotFound,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::TooLarge,
            StatusCode::REQUEST_TIMEOUT => ErrorKind::Timeout,
            StatusCode::NOT_IMPLEMENTED => ErrorKind::NotSupported,
            StatusCode::SERVICE_UNAVAILABLE => ErrorKind::Unavailable,
            StatusCode::INTERNAL_SERVER_ERROR => ErrorKind::Server,
            other => ErrorKind::Http(other),
        }
    }
}

/// Whether `path` is one of the routes of Anthropic's Messages API (`/v1/messages`,
/// `/v1/messages/count_tokens`), whose errors take Anthropic's shape.
pub fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// An error answer: kind, message and extra fields of the error object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// Extra members of the error object (`n_prompt_tokens`, `n_ctx`, `param`, …).
    pub extra: Map<String, Value>,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            extra: Map::new(),
        }
    }
    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }
    /// 500 `server_error`.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Server, message)
    }
    /// A generation's failure as the engine reports it: the request's grammar (over the grammar
    /// engine's limits while generating) is the request's error, anything else the server's.
    pub fn of_step(message: String) -> Self {
        // The engine reports failures as text; a grammar's carry SamplingError's prefix.
        if message.starts_with("invalid grammar") {
            Self::invalid(message)
        } else {
            Self::server(message)
        }
    }
    /// 400 `exceed_context_size_error` with llama-server's extra fields.
    pub fn exceed_context(n_prompt: usize, n_ctx: usize) -> Self {
        let mut e = Self::new(
            ErrorKind::ExceedContext,
            format!(
                "request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
            ),
        );
        e.extra.insert("n_prompt_tokens".into(), n_prompt.into());
        e.extra.insert("n_ctx".into(), n_ctx.into());
        e
    }
    /// Adds an extra member to the error object.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.into(), value.into());
        self
    }
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }
    /// The error object (the value of the body's `error` member).
    pub fn object(&self) -> Value {
        let mut o = self.extra.clone();
        o.insert("code".into(), self.status().as_u16().into());
        o.insert("message".into(), self.message.clone().into());
        o.insert("type".into(), self.kind.type_name().into());
        Value::Object(o)
    }
    /// The whole body.
    pub fn body(&self) -> Value {
        json!({ "error": self.object() })
    }
    /// The whole body in Anthropic's shape.
    pub fn anthropic_body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind.anthropic_type_name(), "message": self.message}})
    }
    /// The answer in the shape of the route `path` (Anthropic's on its routes).
    pub fn response_for(self, path: &str) -> Response {
        if is_anthropic_path(path) {
            self.into_anthropic_response()
        } else {
            self.into_response()
        }
    }
    /// The answer in Anthropic's shape.
    pub fn into_anthropic_response(self) -> Response {
        let body = self.anthropic_body();
        self.with_body(body)
    }
    fn with_body(self, body: Value) -> Response {
        let mut r = (self.status(), axum::Json(body)).into_response();
        // A body refused for its size, or not read to its end in time, may still be arriving:
        // the connection cannot carry another request after it, so the client is told to open
        // a new one.
        if matches!(self.kind, ErrorKind::TooLarge | ErrorKind::Timeout) {
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        self.with_body(body)
    }
}

/// Most bytes of a plain-text error body [`json_errors`] quotes as the message.
const QUOTED_BODY: usize = 1024;

/// Middleware: an error answer (4xx / 5xx) that is not JSON — axum's extractors answer their
/// rejections in plain text (`Path`, `Query`, a body over `DefaultBodyLimit`), and some layers
/// with no body at all — gets the JSON error body of its route's API, with the same status; its
/// text, when short, becomes the message. Answers already in JSON pass unchanged.
pub async fn json_errors(req: Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path().to_string();
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let (parts, body) = res.into_parts();
    // Rejection texts are short; a longer body is not quoted (nor read past the bound).
    let text = axum::body::to_bytes(body, QUOTED_BODY)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    let message = text.unwrap_or_else(|| {
        status
            .canonical_reason()
            .unwrap_or("the request failed")
            .to_string()
    });
    let mut r = ApiError::new(ErrorKind::of_status(status), message).response_for(&path);
    // Headers the answer carried (CORS, `Allow`, `Connection: close`) stay; the body's own go.
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            r.headers_mut().append(name.clone(), value.clone());
        }
    }
    r
}

/// A JSON request body as a [`Value`], with every rejection (wrong content, over the size limit,
/// malformed JSON) answered in the OpenAI error shape instead of axum's plain-text default.
pub struct JsonBody(pub Value);

impl FromRequest<Arc<AppState>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let timeout = state.cfg.timeout;
        let bytes = tokio::time::timeout(timeout, axum::body::Bytes::from_request(req, state))
            .await
            .map_err(|_| {
                ApiError::new(
                    ErrorKind::Timeout,
                    format!(
                        "the request body did not arrive within {} s (--timeout)",
                        timeout.as_secs()
                    ),
                )
            })?
            .map_err(|e| match e {
                BytesRejection::FailedToBufferBody(ref f)
                    if f.status() == StatusCode::PAYLOAD_TOO_LARGE =>
                {
                    ApiError::new(
                        ErrorKind::TooLarge,
                        "request body is larger than the server accepts",
                    )
                }
                other => ApiError::invalid(format!("cannot read the request body: {other}")),
            })?;
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(ApiError::invalid(
                "the request body is empty (expected JSON)",
            ));
        }
        // Parsing a large body takes a while: a request worker does it.
        let v: Value = state
            .limits
            .cpu(move || {
                serde_json::from_slice(&bytes)
                    .map_err(|e| ApiError::invalid(format!("malformed JSON in request body: {e}")))
            })
            .await?;
        if !v.is_object() {
            return Err(ApiError::invalid("the request body must be a JSON object"));
        }
        Ok(JsonBody(v))
    }
}
