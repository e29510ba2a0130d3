//! HTTP/1.1 connections. Header names go out title-cased (`Content-Type`,
//! `Access-Control-Allow-Origin`, `Process-Start-Time-Unix`), as llama-server writes them: some
//! clients look headers up case-sensitively (llama.cpp's own test suite does). `axum::serve`
//! cannot be told to, so connections are served by hyper directly.
//!
//! Each request carries [`Listening`]: whether it came on a loopback TCP listener (the `Host`
//! check applies there, see `host.rs`). And the answers hyper writes itself, without a body,
//! when it cannot parse a request (a NUL or another control byte in a header, a malformed
//! request line: 400; a head over its limit: 431; a too long URI: 414) get a JSON error body on
//! their way out ([`ParseErrorBodies`]): hyper has no hook for them, and such a request never
//! reaches the router.

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::ServiceExt;

/// Where a request came in: set on every request by the connection that read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listening {
    /// On a TCP listener bound to a loopback address.
    pub loopback_tcp: bool,
}

/// A socket the server accepts connections on (llama-server's `--host` may name several).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// Whether it is a TCP socket bound to a loopback address.
    fn is_loopback_tcp(&self) -> bool {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .is_ok_and(|a| a.ip().to_canonical().is_loopback()),
            #[cfg(unix)]
            Listener::Unix(_) => false,
        }
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                // Streamed tokens go out as soon as they are written.
                let _ = s.set_nodelay(true);
                Ok(Stream::Tcp(s))
            }
            #[cfg(unix)]
            Listener::Unix(l) => Ok(Stream::Unix(l.accept().await?.0)),
        }
    }
}

/// A connection whose writes fail once the peer has taken nothing for `timeout` (llama-server's
/// write timeout, `--timeout`): a client that stops reading a stream loses the connection, and
/// the dropped stream frees its slot.
struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Since when a write has been waiting for the peer.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    /// What a write that got `r` from the socket answers: waiting goes on until the timeout.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let timeout = self.timeout;
        let t = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match t.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} s (--timeout)",
                    timeout.as_secs()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, r)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, r)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, r)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, r)
    }
}

/// The JSON error body of an answer hyper wrote itself for a request it could not parse: the
/// head exactly as hyper wrote it (`head`), or None when it is not such an answer.
///
/// hyper's automatic answer is a bare head — status 400, 414 or 431, `Content-Length: 0`, no
/// `Content-Type` — written on its own, before the connection closes. The router's answers never
/// look like that: every error it answers has a JSON body (`error::json_errors`), so a 4xx head
/// with an empty body and no type can only be hyper's.
fn parse_error_answer(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let head_text = text.strip_suffix("\r\n\r\n")?;
    let (status_line, fields) = head_text.split_once("\r\n").unwrap_or((head_text, ""));
    let mut words = status_line.splitn(3, ' ');
    let version = words.next()?;
    let code: u16 = words.next()?.parse().ok()?;
    let message = match code {
        400 => "malformed HTTP request: the request line or a header is invalid (a control character such as NUL in a header, a header line without a name, a bad method or target)",
        414 => "the request target (URI) is too long",
        431 => "the request's header fields are too large",
        _ => return None,
    };
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let mut empty = false;
    let mut kept = Vec::new();
    for line in fields.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("content-type")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            empty = value.trim() == "0";
            continue;
        }
        kept.push(line);
    }
    if !empty {
        return None;
    }
    let body = serde_json::json!({
        "error": {"code": code, "message": message, "type": "invalid_request_error"}
    })
    .to_string();
    let mut out = format!("{status_line}\r\n");
    for line in kept {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

/// A connection whose automatic parse-error answers (see [`parse_error_answer`]) go out with a
/// JSON body: the head hyper hands over in one write is replaced by a whole answer, and the
/// write reports the head's length once all of it is written.
struct ParseErrorBodies<S> {
    inner: S,
    /// The replacement being written: its bytes, how many went out, the length to report.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> ParseErrorBodies<S> {
    fn new(inner: S) -> Self {
        ParseErrorBodies {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> ParseErrorBodies<S> {
    /// Writes the replacement of `first` (what hyper writes) if it is an automatic parse-error
    /// answer, or the rest of the replacement under way; None: `first` is to be written as is.
    fn poll_replaced(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
    ) -> Option<Poll<std::io::Result<usize>>> {
        if self.pending.is_none() {
            // Only a head written alone can be one; a response body never starts so.
            if !first.starts_with(b"HTTP/1.") {
                return None;
            }
            let answer = parse_error_answer(first)?;
            self.pending = Some((answer, 0, first.len()));
        }
        Some(self.drive(cx))
    }

    /// Writes the rest of the replacement.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some((bytes, done, report)) = self.pending.as_mut() {
            if *done == bytes.len() {
                let n = *report;
                self.pending = None;
                return Poll::Ready(Ok(n));
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => {
                    self.pending = None;
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *done += n,
                Poll::Ready(Err(e)) => {
                    self.pending = None;
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(0))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ParseErrorBodies<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ParseErrorBodies<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Some(r) = this.poll_replaced(cx, buf) {
            return r;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        // A head is replaced only when it is all of the write (hyper's answer is a head alone).
        if this.pending.is_some() || bufs.iter().filter(|b| !b.is_empty()).count() <= 1 {
            if let Some(r) = this.poll_replaced(cx, first) {
                return r;
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Serves one connection until it closes (or the graceful shutdown closes it). `timeout`:
/// llama-server's read / write timeout — for a request's head to arrive, and for the client to
/// take a part of the answer.
fn spawn_connection<S>(
    stream: S,
    app: &Router,
    graceful: &GracefulShutdown,
    timeout: Duration,
    listening: Listening,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stream = WriteTimeout {
        inner: ParseErrorBodies::new(stream),
        timeout,
        stalled: None,
    };
    let app = app
        .clone()
        .map_request(move |mut r: hyper::Request<Incoming>| {
            r.extensions_mut().insert(listening);
            r
        });
    let conn = http1::Builder::new()
        .title_case_headers(true)
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    let conn = graceful.watch(conn);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("connection: {e}");
        }
    });
}

/// Accepts connections on `listener` until `shutdown` resolves, then waits for the open ones
/// to finish (idle keep-alive connections are closed at once).
pub async fn serve(
    listener: Listener,
    app: Router,
    shutdown: impl Future<Output = ()>,
    timeout: Duration,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let listening = Listening {
        loopback_tcp: listener.is_loopback_tcp(),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok(s) => s,
            // The peer gave up before we took the connection: nothing to serve.
            Err(e) if is_connection_error(&e) => continue,
            // Out of file descriptors and the like: wait for some to be freed.
            Err(e) => {
                tracing::error!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match stream {
            Stream::Tcp(s) => spawn_connection(s, &app, &graceful, timeout, listening),
            #[cfg(unix)]
            Stream::Unix(s) => spawn_connection(s, &app, &graceful, timeout, listening),
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper's bare parse-error heads become whole JSON answers; anything else is left alone.
    #[test]
    fn parse_error_heads_get_json_bodies() {
        let head = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(parse_error_answer(head).unwrap()).unwrap();
        let (h, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(
            h.starts_with("HTTP/1.1 400 Bad Request\r\nDate: Tue"),
            "{h}"
        );
        assert!(h.contains("Content-Type: application/json"), "{h}");
        assert!(
            h.contains(&format!("Content-Length: {}", body.len())),
            "{h}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], 400);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let big = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(parse_error_answer(big).is_some());
        for other in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 12\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n{}",
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            b"{\"content\": \"HTTP/1.1 400\"}",
        ] {
            assert!(parse_error_answer(other).is_none());
        }
    }

    /// Writes the peer does not take fail once the timeout has passed.
    #[tokio::test]
    async fn write_times_out() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        let timeout = Duration::from_millis(100);
        let mut w = WriteTimeout {
            inner: s,
            timeout,
            stalled: None,
        };
        let buf = vec![0u8; 1 << 16];
        // The socket buffers fill up, then a write waits until the timeout fails it.
        let e = loop {
            let t0 = std::time::Instant::now();
            match std::future::poll_fn(|cx| Pin::new(&mut w).poll_write(cx, &buf)).await {
                Ok(_) => continue,
                Err(e) => {
                    assert!(t0.elapsed() >= timeout);
                    break e;
                }
            }
        };
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        drop(peer);
    }
}
