//! HTTP/1.1 connections. Header names go out title-cased (`Content-Type`,
//! `Access-Control-Allow-Origin`, `Process-Start-Time-Unix`), as llama-server writes them: some
//! clients look headers up case-sensitively (llama.cpp's own test suite does). `axum::serve`
//! cannot be told to, so connections are served by hyper directly.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// A socket the server accepts connections on (llama-server's `--host` may name several).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
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

/// Serves one connection until it closes (or the graceful shutdown closes it).
fn spawn_connection<S>(stream: S, app: &Router, graceful: &GracefulShutdown)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new()
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
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
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
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
            Stream::Tcp(s) => spawn_connection(s, &app, &graceful),
            #[cfg(unix)]
            Stream::Unix(s) => spawn_connection(s, &app, &graceful),
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
