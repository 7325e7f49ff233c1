//! What the load examples share: one keep-alive HTTP/1.1 POST to the extender over a plain
//! `TcpStream` (the way kube-scheduler's client reuses its connection), and latency percentiles
//! (an HDR histogram).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Result, bail};
use hdrhistogram::Histogram;

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

/// One series of latencies, recorded into an HDR histogram in microseconds at 3 significant
/// digits: constant memory however long a run lasts, and each percentile within 0.1 % of the
/// exact one.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Latencies {
    /// 1 µs to 10 minutes: `saturating_record` clamps to the bounds given here (it does not grow
    /// the histogram as `record` would), so they must hold every latency a run can see.
    pub fn new() -> Result<Self> {
        Ok(Self(Histogram::new_with_bounds(1, 600_000_000, 3)?))
    }

    pub fn record(&mut self, latency: Duration) {
        self.0
            .saturating_record(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    /// Adds another series' latencies (several clients' into one distribution).
    #[allow(
        dead_code,
        reason = "used by extender_load only; cluster_load shares this file"
    )]
    pub fn add(&mut self, other: &Self) -> Result<()> {
        self.0.add(&other.0)?;
        Ok(())
    }

    /// Nearest rank (the smallest recorded value with at least that share of the series at or
    /// below it), reported as the top of its histogram bucket.
    pub fn percentiles(&self) -> Percentiles {
        let h = &self.0;
        Percentiles {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Latency percentiles of one series, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}
