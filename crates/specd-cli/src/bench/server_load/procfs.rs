//! The server's memory as Linux reports it: `VmRSS` / `VmHWM` from `/proc/PID/status`, and the
//! process that listens on a TCP port (`/proc/net/tcp*` socket inodes matched against
//! `/proc/*/fd` links) when no `--server-pid` is given. Read by hand: these are a few text
//! lines, and a procfs crate would be a dependency for two fields.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// Resident memory of a process, in KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rss {
    /// `VmRSS`: resident now.
    pub(super) now_kib: u64,
    /// `VmHWM`: the most it has been resident.
    pub(super) peak_kib: u64,
}

/// Reads `/proc/PID/status`; an error when the process is gone or the kernel has no such file.
pub(super) fn rss(pid: u32) -> Result<Rss> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_status(&text).with_context(|| format!("{path}: no VmRSS / VmHWM lines"))
}

fn parse_status(text: &str) -> Option<Rss> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Rss {
        now_kib: field("VmRSS:")?,
        peak_kib: field("VmHWM:")?,
    })
}

/// The process listening on TCP `port` (any local address, IPv4 or IPv6). Only processes this
/// user may inspect are found, which is what `/proc/PID/status` needs anyway.
pub(super) fn pid_listening_on(port: u16) -> Result<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        bail!("no socket listens on port {port} (per /proc/net/tcp); pass --server-pid");
    }
    let targets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let procs = std::fs::read_dir("/proc").context("reading /proc")?;
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if holds_socket(&entry.path(), &targets) {
            return Ok(pid);
        }
    }
    bail!("port {port} is listened on by a process this user cannot inspect; pass --server-pid")
}

/// Inodes of the sockets in LISTEN state (`0A`) on `port` in one `/proc/net/tcp*` table.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            let listening = *f.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

fn holds_socket(proc_dir: &Path, targets: &[String]) -> bool {
    let Ok(fds) = std::fs::read_dir(proc_dir.join("fd")) else {
        return false; // another user's process, or gone
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .ok()
            .and_then(|l| l.to_str().map(|s| targets.iter().any(|t| t == s)))
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let text = "Name:\tspecd\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   42000 kB\n";
        assert_eq!(
            parse_status(text),
            Some(Rss {
                now_kib: 42000,
                peak_kib: 51234
            })
        );
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn listening_sockets_by_port() {
        // Header, a listener on 0x1F90 = 8080, a connection from that port (state 01).
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0\n";
        assert_eq!(listening_inodes(table, 8080), vec![4242]);
        assert!(listening_inodes(table, 8081).is_empty());
    }

    #[test]
    fn finds_own_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(pid_listening_on(port).unwrap(), std::process::id());
        assert!(rss(std::process::id()).unwrap().now_kib > 0);
    }
}
