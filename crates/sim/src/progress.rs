//! A progress bar on stderr for long simulator runs: pods replayed out of the total, elapsed
//! time and an estimate of what is left, redrawn at most a few times a second. Shared by the
//! worker threads (an atomic counter; one thread draws at a time).

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the bar is redrawn at most.
const REDRAW: Duration = Duration::from_millis(250);
/// Width of the bar in characters.
const WIDTH: u64 = 40;

/// Counts replayed pods and draws the bar; hidden bars count but never draw.
#[derive(Debug)]
pub struct Progress {
    total: u64,
    done: AtomicU64,
    started: Instant,
    visible: bool,
    /// When the bar was last drawn (the lock also keeps two threads from drawing at once).
    last: Mutex<Option<Instant>>,
}

impl Progress {
    /// A bar for `total` pods, drawn when `visible`.
    pub fn new(total: u64, visible: bool) -> Self {
        Self {
            total,
            done: AtomicU64::new(0),
            started: Instant::now(),
            visible,
            last: Mutex::new(None),
        }
    }

    /// Counts `pods` more replayed pods, redrawing if it is time.
    pub fn inc(&self, pods: u64) {
        let done = self.done.fetch_add(pods, Ordering::Relaxed) + pods;
        if !self.visible {
            return;
        }
        let Ok(mut last) = self.last.try_lock() else {
            return;
        };
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < REDRAW) {
            return;
        }
        *last = Some(now);
        eprint!("\r{}", self.line(done, now.duration_since(self.started)));
        let _ = std::io::stderr().flush();
    }

    /// Pods counted so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Clears the bar's line.
    pub fn finish(&self) {
        if self.visible {
            eprint!("\r{:width$}\r", "", width = 100);
            let _ = std::io::stderr().flush();
        }
    }

    /// The bar's text for `done` pods after `elapsed`.
    fn line(&self, done: u64, elapsed: Duration) -> String {
        let total = self.total.max(1);
        let done = done.min(total);
        let filled = done * WIDTH / total;
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '-' })
            .collect();
        let seconds = elapsed.as_secs_f64();
        let eta = if done > 0 {
            seconds * (total - done) as f64 / done as f64
        } else {
            0.0
        };
        format!(
            "{seconds:6.1}s [{bar}] {:3}% {done}/{total} pods, eta {eta:.0}s",
            done * 100 / total
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_the_share_done() {
        let progress = Progress::new(200, false);
        progress.inc(50);
        assert_eq!(progress.done(), 50);
        let line = progress.line(50, Duration::from_secs(2));
        assert!(line.contains(" 25% 50/200 pods, eta 6s"), "{line}");
        assert!(line.contains(&format!("[{}{}]", "#".repeat(10), "-".repeat(30))));
    }
}
