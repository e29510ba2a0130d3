//! Errors as HTTP responses, in the OpenAI / llama-server shape:
//! `{"error": {"code": 400, "message": "...", "type": "invalid_request_error"}}`.

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
        }
    }
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
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
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
