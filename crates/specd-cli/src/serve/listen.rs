//! The sockets `specd serve` listens on: llama-server's `--host` list.
//!
//! As in llama-server, `--host` is a comma-separated list (CSV quoting allowed); each entry is an
//! IP address or host name (bound with `--port`) or a UNIX socket path ending in `.sock`. The
//! same routes are served on every address. With several TCP addresses, IPv6 sockets are
//! IPv6-only, so `0.0.0.0,::` binds both families without the IPv6 socket claiming IPv4 too, and
//! `--port 0` is refused (each address would get a different port).

use anyhow::{bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};
use specd_server::Listener;
use std::net::SocketAddr;

/// One `--host` entry.
#[derive(Debug, PartialEq)]
pub enum Host {
    Tcp(String),
    Unix(String),
}

/// Splits `--host` like llama-server: CSV fields (`"a,b"` keeps its comma, `""` is a quote),
/// trimmed, empty ones dropped; at least one is needed.
pub fn parse_hosts(s: &str) -> Result<Vec<Host>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' if quoted => quoted = false,
            // A quote opens a quoted field only at its start.
            '"' if field.is_empty() => quoted = true,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    let hosts: Vec<Host> = fields
        .iter()
        .map(|f| f.trim())
        .filter(|f| !f.is_empty())
        .map(|f| {
            if f.ends_with(".sock") {
                Host::Unix(f.to_string())
            } else {
                Host::Tcp(f.to_string())
            }
        })
        .collect();
    if hosts.is_empty() {
        bail!("--host requires at least one address");
    }
    Ok(hosts)
}

/// Binds every host (in order) on `port`; returns each listener with the URL it serves.
pub async fn bind(hosts: &[Host], port: u16, reuse_port: bool) -> Result<Vec<(Listener, String)>> {
    let n_tcp = hosts.iter().filter(|h| matches!(h, Host::Tcp(_))).count();
    if port == 0 && n_tcp > 1 {
        bail!("--port 0 is not supported with multiple TCP addresses");
    }
    let mut out = Vec::with_capacity(hosts.len());
    for h in hosts {
        match h {
            Host::Tcp(host) => {
                let l = bind_tcp(host, port, n_tcp > 1, reuse_port).await?;
                let local = l.local_addr().context("reading the bound address")?;
                out.push((Listener::Tcp(l), format!("http://{local}")));
            }
            Host::Unix(path) => {
                #[cfg(unix)]
                {
                    let l = tokio::net::UnixListener::bind(path)
                        .with_context(|| format!("binding the UNIX socket {path}"))?;
                    out.push((Listener::Unix(l), format!("unix://{path}")));
                }
                #[cfg(not(unix))]
                bail!("--host {path}: UNIX sockets are not available on this system");
            }
        }
    }
    Ok(out)
}

/// Binds the first address `host` resolves to that accepts the bind (as getaddrinfo-based
/// servers do).
async fn bind_tcp(
    host: &str,
    port: u16,
    v6_only: bool,
    reuse_port: bool,
) -> Result<tokio::net::TcpListener> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving --host {host}"))?
        .collect();
    let mut last = None;
    for addr in &addrs {
        match bind_addr(*addr, v6_only, reuse_port) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e).with_context(|| format!("binding {host} port {port}")),
        None => bail!("--host {host} resolves to no address"),
    }
}

fn bind_addr(
    addr: SocketAddr,
    v6_only: bool,
    reuse_port: bool,
) -> std::io::Result<tokio::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // What tokio's own bind sets: a restarted server can take its port at once.
    s.set_reuse_address(true)?;
    #[cfg(unix)]
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        s.set_only_v6(v6_only)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    tokio::net::TcpListener::from_std(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_csv_fields() {
        let h =
            parse_hosts(" 127.0.0.1 , ::1,,/tmp/a,b.sock,\"/tmp/c,d.sock\",\"x\"\"y\"").unwrap();
        assert_eq!(
            h,
            [
                Host::Tcp("127.0.0.1".into()),
                Host::Tcp("::1".into()),
                Host::Tcp("/tmp/a".into()),
                Host::Unix("b.sock".into()),
                Host::Unix("/tmp/c,d.sock".into()),
                Host::Tcp("x\"y".into()),
            ]
        );
        assert!(parse_hosts(" , ").is_err());
    }
}
