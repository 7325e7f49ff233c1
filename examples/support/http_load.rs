//! What the load examples share: one keep-alive HTTP/1.1 POST to the extender over a plain
//! `TcpStream` (the way kube-scheduler's client reuses its connection), and latency percentiles.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Result, bail};

/// One keep-alive HTTP/1.1 POST of `body` to `/scheduler/{verb}`; returns the response body of a
/// 200 answer and fails on any other status.
pub fn post(stream: &mut TcpStream, verb: &str, body: &str) -> Result<Vec<u8>> {
    write!(
        stream,
        "POST /scheduler/{verb} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") {
        bail!("unexpected status line: {line}");
    }
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse()?;
        }
    }
    let mut response = vec![0; length];
    reader.read_exact(&mut response)?;
    if !reader.buffer().is_empty() {
        bail!("server sent more than one response");
    }
    Ok(response)
}

/// Latency percentiles of one series, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: usize,
    pub p50: u128,
    pub p99: u128,
    pub p999: u128,
    pub max: u128,
}

impl Percentiles {
    /// Sorts `latencies` and reads the percentiles off it (nearest rank).
    pub fn of(latencies: &mut [Duration]) -> Self {
        if latencies.is_empty() {
            return Self::default();
        }
        latencies.sort_unstable();
        let at = |p: f64| {
            let index = ((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1);
            latencies[index.min(latencies.len() - 1)].as_micros()
        };
        Self {
            count: latencies.len(),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: latencies.last().map_or(0, Duration::as_micros),
        }
    }
}
