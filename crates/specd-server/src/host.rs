//! DNS-rebinding protection: the `Host` check of a server listening on a loopback address.
//!
//! A web page cannot read a local server's answers across origins (CORS, [`crate::cors`]), but
//! it can make *its own* name resolve to 127.0.0.1 after the page has loaded (DNS rebinding):
//! its requests then reach the local server as same-origin requests, which CORS never checks,
//! and the page reads every answer. What still names the attacker is the `Host` header — the
//! browser sends the page's name. So a request that arrives on a loopback TCP listener is
//! answered only if its `Host` is a loopback name or address (`localhost`, any `127.x.x.x`,
//! `[::1]`, with any port) or a name given with `--allowed-hosts` (the name Vite,
//! webpack-dev-server and the MCP SDKs use for this list; neither llama-server nor vLLM has
//! one); others get a 403 with a JSON error. `--allowed-hosts '*'` turns the check off.
//!
//! * Only loopback TCP listeners are checked: a server bound to `0.0.0.0` or a LAN address was
//!   exposed on purpose and is reached under names this server cannot know (put `--api-key` on
//!   it); a UNIX socket is not reachable from a browser.
//! * A request without `Host` (HTTP/1.0) is answered: browsers always send one, so such a
//!   request cannot come from a rebinding page, and scripts that speak HTTP/1.0 keep working.
//!   Several `Host` headers, or one that is not text, are refused (400).
//! * An absolute request target (`GET http://name/ HTTP/1.1`) is checked by its authority,
//!   which HTTP says overrides `Host`.

use crate::error::{ApiError, ErrorKind};
use axum::http::{header, Request};
use std::net::IpAddr;

/// `--allowed-hosts`: the names a loopback listener answers besides the loopback ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// `*`: no check at all.
    pub any: bool,
    /// Lower-case names; one starting with `.` matches that domain and every name under it.
    pub names: Vec<String>,
    /// IP addresses given in the list.
    pub addrs: Vec<IpAddr>,
}

impl AllowedHosts {
    /// Parses `--allowed-hosts`: comma-separated names (`app.test`, `.test` for a domain and its
    /// subdomains), IP addresses (`[fd00::1]` or `fd00::1`), or `*` for any host. Ports are not
    /// part of an entry: any port matches.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut out = AllowedHosts::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                out.any = true;
                continue;
            }
            let bare = entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .unwrap_or(entry);
            if let Ok(ip) = bare.parse::<IpAddr>() {
                out.addrs.push(ip);
                continue;
            }
            let name = entry.to_ascii_lowercase();
            let label = name.strip_prefix('.').unwrap_or(&name);
            let valid = !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !valid {
                return Err(format!(
                    "--allowed-hosts: {entry:?} is not a host name, a '.domain' or an IP address \
                     (give names without scheme or port)"
                ));
            }
            out.names.push(name);
        }
        Ok(out)
    }

    /// Whether a request for `host` (a `Host` value: a name or address, maybe with a port) is
    /// answered.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(h) = host_of(host) else {
            return false;
        };
        if let Ok(ip) = h.parse::<IpAddr>() {
            return ip.to_canonical().is_loopback() || self.addrs.contains(&ip);
        }
        let h = h.to_ascii_lowercase();
        h == "localhost"
            || self.names.iter().any(|n| match n.strip_prefix('.') {
                Some(domain) => h == domain || h.ends_with(n.as_str()),
                None => h == *n,
            })
    }
}

/// The host of a `Host` value without its port (`[::1]:8080` → `::1`); None when malformed.
fn host_of(value: &str) -> Option<&str> {
    if let Some(v6) = value.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        return match after {
            "" => Some(host),
            _ => after.strip_prefix(':').filter(|p| is_port(p)).map(|_| host),
        };
    }
    match value.split_once(':') {
        Some((host, port)) if is_port(port) && !host.is_empty() => Some(host),
        Some(_) => None,
        None if value.is_empty() => None,
        None => Some(value),
    }
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// The check of one request: a 400 when its `Host` is malformed or given twice, a 403 when it
/// names a host that is not allowed.
pub fn check<B>(allowed: &AllowedHosts, req: &Request<B>) -> Result<(), ApiError> {
    if allowed.any {
        return Ok(());
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err(ApiError::invalid(
            "a request may carry only one Host header",
        ));
    }
    // An absolute request target's authority overrides Host (RFC 9112, 3.2.2).
    let host = match (req.uri().authority(), first) {
        (Some(a), _) => a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h),
        (None, Some(v)) => match v.to_str() {
            Ok(v) => v,
            Err(_) => return Err(ApiError::invalid("the Host header is not valid text")),
        },
        // No Host: not a browser (see the module doc).
        (None, None) => return Ok(()),
    };
    if allowed.allows(host) {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::Permission,
        format!(
            "Host {host:?} is not allowed: this server listens on a loopback address and answers \
             requests for localhost, 127.0.0.1 or [::1] only (protection against DNS rebinding); \
             start it with --allowed-hosts NAME to accept another name, or --allowed-hosts '*'"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_allowed_by_default() {
        let a = AllowedHosts::default();
        for h in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:18080",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(a.allows(h), "{h}");
        }
        for h in [
            "",
            "evil.test",
            "evil.test:8080",
            "localhost.evil.test",
            "notlocalhost",
            "192.168.1.10:8080",
            "[::2]:80",
            "::1",
            "localhost:",
            "localhost:abc",
            "localhost:8080:1",
            "[::1",
            "[::1]x",
            "0.0.0.0:8080",
        ] {
            assert!(!a.allows(h), "{h}");
        }
    }

    #[test]
    fn configured_names_and_wildcards() {
        let a = AllowedHosts::parse(" app.test , .corp.test,[fd00::1],10.0.0.2").unwrap();
        assert!(!a.any);
        for h in [
            "app.test",
            "APP.test:443",
            "corp.test",
            "x.corp.test:8080",
            "a.b.corp.test",
            "[fd00::1]:8080",
            "10.0.0.2:80",
            "localhost",
        ] {
            assert!(a.allows(h), "{h}");
        }
        for h in ["x.app.test", "evilcorp.test", "10.0.0.3", "[fd00::2]"] {
            assert!(!a.allows(h), "{h}");
        }
        assert!(AllowedHosts::parse("*").unwrap().allows("anything.test"));
        for bad in ["http://app.test", "app.test:8080", "a b", "."] {
            assert!(AllowedHosts::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_by_host_header_and_target() {
        let a = AllowedHosts::default();
        let refused = |r: Result<(), ApiError>| r.err().map(|e| (e.status().as_u16(), e.message));
        let req = |target: &str, hosts: &[&str]| {
            let mut b = Request::builder().uri(target);
            for h in hosts {
                b = b.header(header::HOST, *h);
            }
            b.body(()).unwrap()
        };
        assert_eq!(
            refused(check(&a, &req("/health", &["127.0.0.1:8080"]))),
            None
        );
        assert_eq!(refused(check(&a, &req("/health", &[]))), None);
        let (status, msg) = refused(check(&a, &req("/health", &["evil.test:8080"]))).unwrap();
        assert!(status == 403 && msg.contains("evil.test"), "{msg}");
        let r = refused(check(&a, &req("/health", &["localhost", "evil.test"])));
        assert_eq!(r.map(|r| r.0), Some(400));
        // The absolute target wins over Host.
        let r = refused(check(&a, &req("http://evil.test/health", &["localhost"])));
        assert_eq!(r.map(|r| r.0), Some(403));
        let r = check(&a, &req("http://localhost:1/health", &["evil.test"]));
        assert_eq!(refused(r), None);
        let any = AllowedHosts::parse("*").unwrap();
        assert_eq!(refused(check(&any, &req("/", &["a", "b"]))), None);
    }
}
