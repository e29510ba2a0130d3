//! Google Cloud Vertex AI custom-container protocol, switched on as in llama-server by the
//! environment Vertex AI sets: `AIP_MODE=PREDICTION` makes the server listen on
//! `AIP_HTTP_PORT`, answer `AIP_HEALTH_ROUTE` like `/health`, and serve `AIP_PREDICT_ROUTE`
//! (default `/predict`): `{"instances": [...]}` where each instance names an endpoint in
//! `@requestFormat` (a path such as `/v1/chat/completions`, or its camelCase alias
//! `chatCompletions`) and carries that endpoint's body; the answer is `{"predictions": [...]}`,
//! one response body (or error object) per instance, instances run concurrently.

use crate::error::{ApiError, JsonBody};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

/// Most instances in one predict request (llama-server's bound).
const MAX_INSTANCES: usize = 128;

/// The Vertex AI settings from the environment (`None` unless `AIP_MODE=PREDICTION`).
#[derive(Debug, Clone, PartialEq)]
pub struct Vertex {
    pub predict_route: String,
    pub health_route: Option<String>,
    /// `AIP_HTTP_PORT` (8080 when unset), which replaces `--port`.
    pub port: u16,
}

impl Vertex {
    /// Reads `AIP_MODE`, `AIP_PREDICT_ROUTE`, `AIP_HEALTH_ROUTE` and `AIP_HTTP_PORT`.
    pub fn from_env() -> Result<Option<Vertex>, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Vertex>, String> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        if var("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let route = |v: String| {
            if v.starts_with('/') {
                v
            } else {
                format!("/{v}")
            }
        };
        let port = match var("AIP_HTTP_PORT") {
            Some(p) => p
                .trim()
                .parse()
                .map_err(|_| format!("AIP_HTTP_PORT '{p}' is not a port number"))?,
            None => 8080,
        };
        Ok(Some(Vertex {
            predict_route: var("AIP_PREDICT_ROUTE").map_or("/predict".into(), route),
            health_route: var("AIP_HEALTH_ROUTE").map(route),
            port,
        }))
    }
}

/// `@requestFormat` alias of an endpoint path: `/v1/chat/completions` → `chatCompletions`,
/// `/apply-template` → `applyTemplate`.
pub fn alias(path: &str) -> String {
    let p = path.strip_prefix("/v1").unwrap_or(path);
    let mut out = String::new();
    let mut upper = false;
    for c in p.trim_start_matches('/').chars() {
        if c == '{' || c == ':' {
            break; // path parameters
        }
        if matches!(c, '/' | '-' | '_') {
            upper = true;
        } else {
            out.extend(if upper {
                c.to_uppercase().collect::<Vec<_>>()
            } else {
                vec![c]
            });
            upper = false;
        }
    }
    out
}

fn error(e: ApiError) -> Value {
    json!({"error": e.object()})
}

/// The POST handler of the predict route.
pub async fn predict(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Response {
    let Some(instances) = body.get("instances").and_then(Value::as_array) else {
        return ApiError::invalid("request body must include an array field named instances")
            .into_response();
    };
    if instances.len() > MAX_INSTANCES {
        return ApiError::invalid(format!(
            "instances array exceeds maximum size of {MAX_INSTANCES}"
        ))
        .into_response();
    }
    let runs = instances
        .iter()
        .map(|inst| run_instance(st.clone(), headers.clone(), inst.clone()));
    let predictions = futures_util::future::join_all(runs).await;
    Json(json!({"predictions": predictions})).into_response()
}

/// One instance, dispatched to its endpoint through the API routes (without the middleware
/// the outer request already passed).
async fn run_instance(st: Arc<AppState>, headers: HeaderMap, inst: Value) -> Value {
    let Some(mut payload) = inst.as_object().cloned() else {
        return error(ApiError::invalid("each instance must be a JSON object"));
    };
    let Some(format) = payload
        .remove("@requestFormat")
        .and_then(|v| v.as_str().map(String::from))
    else {
        return error(ApiError::invalid(
            "each instance must include a string @requestFormat",
        ));
    };
    if payload.contains_key("stream") {
        // Predictions are whole responses.
        payload.insert("stream".into(), Value::Bool(false));
    }
    let paths = crate::post_paths();
    let path = match paths.iter().find(|p| alias(p) == format || **p == format) {
        Some(p) => *p,
        None => {
            return error(ApiError::invalid(format!(
                "no handler registered for @requestFormat: {format}"
            )))
        }
    };
    let mut req = Request::post(path);
    for (k, v) in &headers {
        if k != axum::http::header::CONTENT_LENGTH {
            req = req.header(k, v);
        }
    }
    let req = match req.body(Body::from(Value::Object(payload).to_string())) {
        Ok(r) => r,
        Err(e) => return error(ApiError::server(e.to_string())),
    };
    let res = match crate::api_routes(st).oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    match axum::body::to_bytes(res.into_body(), usize::MAX).await {
        Ok(b) if b.is_empty() => Value::Null,
        Ok(b) => serde_json::from_slice(&b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
        Err(e) => error(ApiError::server(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_camel_case_paths() {
        assert_eq!(alias("/v1/chat/completions"), "chatCompletions");
        assert_eq!(alias("/apply-template"), "applyTemplate");
        assert_eq!(alias("/completion"), "completion");
        assert_eq!(alias("/slots/{id_slot}"), "slots");
    }

    #[test]
    fn settings_come_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(Vertex::from_lookup(env(&[])), Ok(None));
        assert_eq!(Vertex::from_lookup(env(&[("AIP_MODE", "x")])), Ok(None));
        let v = Vertex::from_lookup(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", "9000"),
            ("AIP_HEALTH_ROUTE", "healthz"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(v.port, 9000);
        assert_eq!(v.predict_route, "/predict");
        assert_eq!(v.health_route.as_deref(), Some("/healthz"));
        assert!(
            Vertex::from_lookup(env(&[("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", "x")]))
                .is_err()
        );
    }
}
