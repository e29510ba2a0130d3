//! HTTP/1.1 connections. Header names go out title-cased (`Content-Type`,
//! `Access-Control-Allow-Origin`, `Process-Start-Time-Unix`), as llama-server writes them: some
//! clients look headers up case-sensitively (llama.cpp's own test suite does). `axum::serve`
//! cannot be told to, so connections are served by hyper directly.
//!
//! Each request carries [`Listening`]: whether it came on a loopback TCP listener (the `Host`
//! check applies there, see `host.rs`).

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
        inner: stream,
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
