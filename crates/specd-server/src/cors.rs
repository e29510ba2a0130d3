//! CORS as llama-server does it (`--cors-origins`, `--cors-methods`, `--cors-headers`,
//! `--cors-credentials`), with one difference in the default:
//!
//! * **By default only loopback origins are allowed** (`http(s)://` with the host `localhost`,
//!   `127.0.0.1` or `[::1]`, any port — the rule of llama-server's `--cors-origins localhost`,
//!   which llama-server itself makes the default once its server tools are on). llama-server's
//!   own default, `*` with credentials, echoes any `Origin` back with
//!   `Access-Control-Allow-Credentials: true`: any web page the user opens may then drive the
//!   local server and read its answers (their prompts, the slots' text, `/props`), which without
//!   `--api-key` is everything. A browser on the same machine (the web UIs, `http://localhost:3000`
//!   dev servers) keeps working; `--cors-origins '*'` or a list of origins restores what a
//!   deployment asks for.
//! * every response names the allowed origin in `Access-Control-Allow-Origin`: with `*` and
//!   credentials on the request's `Origin` is echoed back (empty when there is none); with
//!   `localhost` (the default) only an origin whose host is `localhost`, `127.0.0.1` or `::1`
//!   is echoed (otherwise the header is left out); any other value is sent as given;
//! * an `OPTIONS` request on any path is a preflight: 200, an empty body, and
//!   `Access-Control-Allow-Credentials`, `-Methods`, `-Headers` — answered before routing and
//!   without an API key, since browsers send none with it. An origin that is not allowed gets
//!   neither `Access-Control-Allow-Origin` nor `Access-Control-Allow-Credentials` (llama-server
//!   sends the latter to every origin; alone it grants nothing, but a refused origin should read
//!   a refusal, not half a grant).
//!
//! Another difference: several comma-separated origins (which llama-server would send verbatim,
//! a value browsers reject) allow each of them — the request's `Origin` is echoed when listed.
//!
//! CORS only governs what a *cross-origin* page may read; a page that makes its own name resolve
//! to 127.0.0.1 (DNS rebinding) is same-origin and is stopped by the `Host` check instead
//! ([`crate::host`]).

use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The CORS settings of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// `*` (any), `localhost`, one origin, or a comma-separated list of origins.
    pub origins: String,
    /// `Access-Control-Allow-Methods` of a preflight.
    pub methods: String,
    /// `Access-Control-Allow-Headers` of a preflight.
    pub headers: String,
    /// Credentials allowed (with `*`: the request's origin is echoed instead of `*`).
    pub credentials: bool,
}

/// `--cors-origins` when none is given: loopback origins only (see the module doc).
pub const DEFAULT_ORIGINS: &str = "localhost";

impl Default for Cors {
    /// llama-server's defaults, except the origins: loopback only, not `*`.
    fn default() -> Self {
        Cors {
            origins: DEFAULT_ORIGINS.into(),
            methods: "GET, POST, DELETE, OPTIONS".into(),
            headers: "*".into(),
            credentials: true,
        }
    }
}

impl Cors {
    /// Checks that every value can be sent as a header value.
    pub fn validate(&self) -> Result<(), String> {
        for (flag, v) in [
            ("--cors-origins", &self.origins),
            ("--cors-methods", &self.methods),
            ("--cors-headers", &self.headers),
        ] {
            HeaderValue::from_str(v)
                .map_err(|_| format!("{flag} {v:?} is not a valid HTTP header value"))?;
        }
        Ok(())
    }

    /// The `Access-Control-Allow-Origin` of a response to a request from `origin`, if any.
    pub fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.origins == "*" && self.credentials {
            return Some(origin.cloned().unwrap_or(HeaderValue::from_static("")));
        }
        if self.origins == "localhost" {
            let o = origin?;
            let text = o.to_str().unwrap_or("");
            if is_localhost(text) {
                return Some(o.clone());
            }
            tracing::warn!("(CORS) skip non-localhost origin: {text}");
            return None;
        }
        let list: Vec<&str> = self
            .origins
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        if list.len() > 1 {
            let o = origin?;
            return list
                .iter()
                .any(|a| o.as_bytes() == a.as_bytes())
                .then(|| o.clone());
        }
        HeaderValue::from_str(&self.origins).ok()
    }
}

/// True for an `http(s)://` origin whose host is `localhost`, `127.0.0.1` or `[::1]`, with any
/// port.
pub fn is_localhost(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    if scheme != "http" && scheme != "https" {
        return false;
    }
    let authority = rest.split('/').next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return false;
        };
        match after {
            "" => (host, ""),
            _ => match after.strip_prefix(':') {
                Some(p) => (host, p),
                None => return false,
            },
        }
    } else {
        hostport.split_once(':').unwrap_or((hostport, ""))
    };
    (port.is_empty() || port.parse::<u16>().is_ok())
        && matches!(host, "localhost" | "127.0.0.1" | "::1")
}

/// The CORS middleware (outermost, so errors and unknown paths carry the headers too).
pub async fn layer(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let cors = &st.cfg.cors;
    let allow = cors.allow_origin(req.headers().get(header::ORIGIN));
    if req.method() == Method::OPTIONS {
        let mut res = (StatusCode::OK, [(header::CONTENT_TYPE, "text/html")], "").into_response();
        let h = res.headers_mut();
        // Credentials go only with an origin that is allowed: a refused one reads no grant.
        if let Some(v) = allow {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static(if cors.credentials { "true" } else { "false" }),
            );
        }
        for (name, v) in [
            (header::ACCESS_CONTROL_ALLOW_METHODS, &cors.methods),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, &cors.headers),
        ] {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(name, v);
            }
        }
        return res;
    }
    let mut res = next.run(req).await;
    if let Some(v) = allow {
        res.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_origins() {
        for o in [
            "http://localhost",
            "http://localhost:8080",
            "https://127.0.0.1",
            "http://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
            "http://user@localhost:1",
        ] {
            assert!(is_localhost(o), "{o}");
        }
        for o in [
            "localhost",
            "ftp://localhost",
            "http://web.mydomain.fr",
            "http://notlocalhost",
            "http://localhost.evil.com",
            "http://localhost:abc",
            "http://[::1",
            "http://[::2]:80",
            "http://127.0.0.2",
        ] {
            assert!(!is_localhost(o), "{o}");
        }
    }

    #[test]
    fn allowed_origin_by_setting() {
        let hv = HeaderValue::from_static;
        let default = Cors::default();
        assert_eq!(
            default.allow_origin(Some(&hv("http://localhost:5173"))),
            Some(hv("http://localhost:5173"))
        );
        assert_eq!(default.allow_origin(Some(&hv("https://evil.test"))), None);
        assert_eq!(default.allow_origin(Some(&hv("null"))), None);
        assert_eq!(default.allow_origin(None), None);
        let any = Cors {
            origins: "*".into(),
            ..Cors::default()
        };
        assert_eq!(any.allow_origin(Some(&hv("x.test"))), Some(hv("x.test")));
        assert_eq!(any.allow_origin(None), Some(hv("")));
        let star = Cors {
            credentials: false,
            ..any.clone()
        };
        assert_eq!(star.allow_origin(Some(&hv("x.test"))), Some(hv("*")));
        let one = Cors {
            origins: "http://a.test".into(),
            ..Cors::default()
        };
        assert_eq!(one.allow_origin(None), Some(hv("http://a.test")));
        let two = Cors {
            origins: "http://a.test, http://b.test".into(),
            ..Cors::default()
        };
        assert_eq!(
            two.allow_origin(Some(&hv("http://b.test"))),
            Some(hv("http://b.test"))
        );
        assert_eq!(two.allow_origin(Some(&hv("http://c.test"))), None);
        let local = Cors {
            origins: "localhost".into(),
            ..Cors::default()
        };
        assert_eq!(local.allow_origin(None), None);
        assert_eq!(local.allow_origin(Some(&hv("http://evil.test"))), None);
    }
}
