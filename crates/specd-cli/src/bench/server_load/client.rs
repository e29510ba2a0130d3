//! The HTTP side of `specd bench --server`: one chat completion per fresh connection, plain
//! or streamed (SSE), and what its `usage` and `timings` say.

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest error body or response quoted in a message.
const SNIPPET_CHARS: usize = 400;

/// Where and how to reach the server.
#[derive(Clone)]
pub(super) struct Endpoint {
    /// `host:port` to connect to.
    addr: String,
    /// The `Host` header.
    authority: String,
    /// Path prefix before `/v1/...` (empty for a server at the root).
    base: String,
    api_key: Option<String>,
    /// The URL as given, for messages and the report.
    pub(super) url: String,
}

impl Endpoint {
    /// Parses `--server`: `[http://]HOST[:PORT][/PREFIX][/v1]`.
    pub(super) fn parse(url: &str, api_key: Option<String>) -> Result<Endpoint> {
        // `127.0.0.1:8080` is accepted for `http://127.0.0.1:8080`.
        let full = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        let uri: Uri = full
            .parse()
            .with_context(|| format!("--server: '{url}' is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                bail!("--server: https is not supported (plain HTTP client); use http://HOST:PORT")
            }
            other => bail!(
                "--server: unsupported scheme '{}' (use http://HOST:PORT)",
                other.unwrap_or("")
            ),
        }
        let auth = uri
            .authority()
            .with_context(|| format!("--server: '{url}' has no host"))?;
        let port = auth.port_u16().unwrap_or(80);
        // OpenAI clients are configured with a base URL ending in /v1; accept that form too.
        let path = uri.path().trim_end_matches('/');
        let base = path.strip_suffix("/v1").unwrap_or(path).to_string();
        Ok(Endpoint {
            addr: format!("{}:{port}", auth.host()),
            authority: auth.as_str().to_string(),
            base,
            api_key,
            url: url.to_string(),
        })
    }

    /// Sends one request on a fresh connection. A connection per request keeps failures
    /// independent; on loopback it costs far less than a millisecond.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| anyhow!("connecting to {}: timed out", self.addr))?
            .with_context(|| format!("connecting to {}", self.addr))?;
        // Requests are small and latency is what is measured: no Nagle delay.
        stream.set_nodelay(true)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        // The connection driver; it ends when the response has been read or dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(HOST, &self.authority);
        if let Some(k) = &self.api_key {
            req = req.header(AUTHORIZATION, format!("Bearer {k}"));
        }
        let body = match body {
            Some(b) => {
                req = req.header(CONTENT_TYPE, "application/json");
                Full::new(b)
            }
            None => Full::new(Bytes::new()),
        };
        let req = req.body(body).context("building the request")?;
        sender
            .send_request(req)
            .await
            .with_context(|| format!("{path}: sending the request"))
    }

    /// GET returning status and body text.
    async fn get(&self, path: &str) -> Result<(StatusCode, String)> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        let body = read_body(resp).await?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// POSTs a ready-made JSON body and reads the whole answer: its status and body.
    pub(super) async fn post_raw(&self, path: &str, body: Bytes) -> Result<(StatusCode, Bytes)> {
        let resp = self.send(Method::POST, path, Some(body)).await?;
        let status = resp.status();
        Ok((status, read_body(resp).await?))
    }

    /// GET of `path`: its status, timed from connecting to the last byte.
    pub(super) async fn get_timed(&self, path: &str) -> Result<(StatusCode, Duration)> {
        let t0 = Instant::now();
        let (status, _) = self.get(path).await?;
        Ok((status, t0.elapsed()))
    }

    /// `host:port` this endpoint connects to.
    pub(super) fn addr(&self) -> &str {
        &self.addr
    }

    /// Checks that the server answers before any measurement, and returns its model id
    /// (`/v1/models`) when it says one.
    pub(super) async fn probe(&self) -> Result<Option<String>> {
        let (status, body) = self
            .get("/health")
            .await
            .with_context(|| format!("cannot reach the server at {}", self.url))?;
        // 404: a server without /health (plain OpenAI-compatible) is fine.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            bail!(
                "the server at {} is not ready (HTTP 503): {}",
                self.url,
                snippet(body.as_bytes())
            );
        }
        let model = match self.get("/v1/models").await {
            Ok((s, body)) if s.is_success() => serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["data"][0]["id"].as_str().map(String::from)),
            _ => None,
        };
        Ok(model)
    }

    /// One chat completion, timed.
    pub(super) async fn chat(&self, messages: &[Value], o: &RequestOptions) -> Result<Sample> {
        let mut body = json!({
            "messages": messages,
            "max_tokens": o.max_tokens,
            "temperature": short_f64(o.temperature),
            "seed": o.seed,
            "stream": o.stream,
        });
        if o.stream {
            // Without this, OpenAI-style streams carry no token counts.
            body["stream_options"] = json!({"include_usage": true});
        }
        if o.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        let t0 = Instant::now();
        let resp = self
            .send(
                Method::POST,
                "/v1/chat/completions",
                Some(Bytes::from(body.to_string())),
            )
            .await?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = read_body(resp).await.unwrap_or_default();
            bail!("HTTP {status}: {}", snippet(&bytes));
        }
        if o.stream {
            read_stream(resp, t0).await
        } else {
            let bytes = read_body(resp).await?;
            let latency_s = t0.elapsed().as_secs_f64();
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow!("response is not JSON ({e}): {}", snippet(&bytes)))?;
            let message = v.pointer("/choices/0/message").ok_or_else(|| {
                anyhow!("response has no choices[0].message: {}", snippet(&bytes))
            })?;
            let mut s = Sample {
                latency_s,
                content: message["content"].as_str().unwrap_or("").to_string(),
                ..Sample::default()
            };
            s.read_counts(&v);
            Ok(s)
        }
    }
}

async fn read_body(resp: Response<Incoming>) -> Result<Bytes> {
    Ok(resp
        .into_body()
        .collect()
        .await
        .context("reading the response body")?
        .to_bytes())
}

/// Reads a server-sent event stream of chat chunks until `data: [DONE]`.
async fn read_stream(resp: Response<Incoming>, t0: Instant) -> Result<Sample> {
    let mut s = Sample::default();
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    while !done {
        let Some(frame) = body.frame().await else {
            break;
        };
        let Ok(data) = frame.context("reading the event stream")?.into_data() else {
            continue; // trailers
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim();
            if let Some(e) = line.strip_prefix("error:") {
                bail!("server error in the stream: {}", e.trim());
            }
            let Some(payload) = line.strip_prefix("data:").map(str::trim) else {
                continue; // blank separators, comments, `event:` lines
            };
            if payload == "[DONE]" {
                done = true;
                break;
            }
            let v: Value = serde_json::from_str(payload)
                .map_err(|e| anyhow!("event is not JSON ({e}): {}", snippet(payload.as_bytes())))?;
            if let Some(e) = v.get("error") {
                bail!("server error in the stream: {e}");
            }
            let delta = &v["choices"][0]["delta"];
            // Reasoning text counts for the first token; only `content` goes into the history.
            let text = delta["content"].as_str().unwrap_or("");
            let reasoning = delta["reasoning_content"].as_str().unwrap_or("");
            if s.ttft_s.is_none() && !(text.is_empty() && reasoning.is_empty()) {
                s.ttft_s = Some(t0.elapsed().as_secs_f64());
            }
            s.content.push_str(text);
            s.read_counts(&v);
        }
    }
    s.latency_s = t0.elapsed().as_secs_f64();
    if !done {
        bail!("the event stream ended before `data: [DONE]`");
    }
    Ok(s)
}

/// `x` as the shortest decimal that reads back as the same f32 (0.8, not 0.800000011920929).
pub(super) fn short_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// The start of a body, for error messages.
pub(super) fn snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    if s.chars().count() > SNIPPET_CHARS {
        format!("{}…", s.chars().take(SNIPPET_CHARS).collect::<String>())
    } else {
        s.to_string()
    }
}

/// What every request sends besides its messages.
#[derive(Clone)]
pub(super) struct RequestOptions {
    pub(super) max_tokens: usize,
    pub(super) temperature: f32,
    pub(super) seed: u32,
    pub(super) stream: bool,
    pub(super) ignore_eos: bool,
    pub(super) timeout: Duration,
}

/// llama.cpp's `timings` object (specd sends the same); every field is optional.
#[derive(Deserialize, Default, Clone)]
pub(super) struct Timings {
    pub(super) prompt_n: Option<u64>,
    pub(super) predicted_n: Option<u64>,
    pub(super) predicted_ms: Option<f64>,
    pub(super) draft_n: Option<u64>,
    pub(super) draft_n_accepted: Option<u64>,
}

/// One answered request.
#[derive(Default)]
pub(super) struct Sample {
    pub(super) latency_s: f64,
    /// Streaming: seconds until the first chunk with text.
    pub(super) ttft_s: Option<f64>,
    /// `usage.prompt_tokens`: the whole prompt, reused or not.
    pub(super) prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub(super) completion_tokens: Option<u64>,
    pub(super) timings: Option<Timings>,
    /// The assistant's reply (the next turn's history).
    pub(super) content: String,
}

impl Sample {
    /// Takes `usage` and `timings` from a response or stream chunk that has them.
    pub(super) fn read_counts(&mut self, v: &Value) {
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = u["prompt_tokens"].as_u64().or(self.prompt_tokens);
            self.completion_tokens = u["completion_tokens"].as_u64().or(self.completion_tokens);
        }
        if let Some(t) = v.get("timings") {
            // Malformed timings are ignored: they are extra information, not the answer.
            if let Ok(t) = serde_json::from_value::<Timings>(t.clone()) {
                self.timings = Some(t);
            }
        }
    }

    pub(super) fn completion_tokens(&self) -> u64 {
        self.completion_tokens
            .or_else(|| self.timings.as_ref().and_then(|t| t.predicted_n))
            .unwrap_or(0)
    }

    /// Generation speed of this request: the server's own `predicted_n / predicted_ms` when
    /// reported (excludes queueing and prompt processing), else tokens over latency.
    pub(super) fn decode_tok_s(&self) -> Option<f64> {
        if let Some(Timings {
            predicted_n: Some(n),
            predicted_ms: Some(ms),
            ..
        }) = &self.timings
        {
            if *ms > 0.0 && *n > 0 {
                return Some(*n as f64 * 1e3 / ms);
            }
        }
        let n = self.completion_tokens();
        (n > 0 && self.latency_s > 0.0).then(|| n as f64 / self.latency_s)
    }

    pub(super) fn prompt_n(&self) -> Option<u64> {
        self.timings.as_ref().and_then(|t| t.prompt_n)
    }
}

/// A request's result: the sample, or why it failed.
pub(super) type Outcome = std::result::Result<Sample, String>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        let e = Endpoint::parse("http://127.0.0.1:8080/", None).unwrap();
        assert_eq!((e.addr.as_str(), e.base.as_str()), ("127.0.0.1:8080", ""));
        let e = Endpoint::parse("localhost:9000/v1", None).unwrap();
        assert_eq!((e.addr.as_str(), e.base.as_str()), ("localhost:9000", ""));
        let e = Endpoint::parse("http://host/prefix/v1/", None).unwrap();
        assert_eq!((e.addr.as_str(), e.base.as_str()), ("host:80", "/prefix"));
        assert!(Endpoint::parse("https://host", None).is_err());
        assert!(Endpoint::parse("ftp://host", None).is_err());
        assert!(Endpoint::parse("http://", None).is_err());
        assert_eq!(short_f64(0.8), 0.8);
    }

    #[test]
    fn counts_from_usage_and_timings() {
        let mut s = Sample {
            latency_s: 2.0,
            ..Sample::default()
        };
        s.read_counts(&json!({
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            "timings": {"prompt_n": 30, "predicted_n": 10, "predicted_ms": 500.0, "draft_n": 8,
                        "draft_n_accepted": 6, "speculative": {}}
        }));
        assert_eq!(s.completion_tokens(), 10);
        assert_eq!(s.prompt_n(), Some(30));
        assert_eq!(s.decode_tok_s(), Some(20.0));
        // Without timings: tokens over latency.
        let mut s = Sample {
            latency_s: 2.0,
            ..Sample::default()
        };
        s.read_counts(&json!({"usage": {"prompt_tokens": 5, "completion_tokens": 4}}));
        assert_eq!(s.decode_tok_s(), Some(2.0));
    }
}
