//! A plain HTTP/1.1 client for the servers the tests start, written on std's TCP stream so that
//! a test sees the bytes a server sends (status line, chunked bodies) without a client library
//! between them: GET with or without a bearer token, and POST of a JSON body as kube-scheduler
//! sends one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

/// A GET (`Connection: close`) with a 5 s budget: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    http_get_bearer(addr, path, None).await
}

/// [`http_get`] with `Authorization: Bearer TOKEN` when a token is given.
pub async fn http_get_bearer(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let path = path.to_owned();
    let header = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tokio::task::spawn_blocking(move || exchange(addr, "GET", &path, &header, None))
        .await
        .context("http task")?
}

/// A POST of a JSON body, as kube-scheduler calls the extender: status and body.
pub async fn http_post_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<(u16, String)> {
    let (path, body) = (path.to_owned(), body.to_string());
    tokio::task::spawn_blocking(move || exchange(addr, "POST", &path, "", Some(&body)))
        .await
        .context("http task")?
}

/// One request and its whole answer, blocking, with a 5 s budget for each step.
pub fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    json_body: Option<&str>,
) -> Result<(u16, String)> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let payload = match json_body {
        Some(body) => format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        None => "\r\n".to_owned(),
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}{payload}"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{method} {path}: no header end in the response"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("{method} {path}: bad status line"))?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut rest: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("bad chunked body"))?;
        let size = usize::from_str_radix(size.trim(), 16).context("chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after.get(..size).ok_or_else(|| anyhow!("short chunk"))?;
        out.push_str(chunk);
        rest = after.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_joined_and_a_short_chunk_is_an_error() {
        assert_eq!(
            dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            "abcde"
        );
        assert!(dechunk("9\r\nabc\r\n").is_err());
        assert!(dechunk("zz\r\n").is_err());
    }
}
