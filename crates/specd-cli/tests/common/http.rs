//! A small HTTP/1.1 client for the integration tests: requests go over a plain TCP socket, so a
//! test sees the exact status line and header names the server writes, and can also misbehave
//! (oversized bodies, a stream dropped half-way).

use super::Server;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

impl Server {
    pub fn get(&self, path: &str) -> Resp {
        request(&self.addr, "GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        request(
            &self.addr,
            "POST",
            path,
            &[],
            Some(body.to_string().as_bytes()),
        )
    }

    /// POST that must succeed; the JSON body.
    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body);
        assert_eq!(r.status, 200, "{path} {body}: {}\n{}", r.text(), self.log());
        r.json()
    }

    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200);
        r.text()
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

pub fn write_request(
    s: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
}

/// Reads a response head; returns status and headers.
pub fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one chunk of a chunked body (`None` at the end).
pub fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(line.trim(), 16).ok()?;
    if n == 0 {
        return None;
    }
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Resp {
    let mut s = connect(addr);
    write_request(&mut s, addr, method, path, headers, body);
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(&mut r) {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Resp {
        status,
        headers,
        body,
    }
}

pub fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn assert_error(r: &Resp, status: u16, ty: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["type"], ty, "{v}");
    assert_eq!(v["error"]["code"], status, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    v
}

/// Starts a streamed POST to `path` and reads up to the status line and headers (which must say
/// 200); the reader is positioned at the first chunk.
pub fn open_stream(addr: &str, path: &str, body: &str) -> BufReader<TcpStream> {
    let mut conn = connect(addr);
    write_request(&mut conn, addr, "POST", path, &[], Some(body.as_bytes()));
    let mut r = BufReader::new(conn);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    r
}
