//! The access log: one JSON line per request, written by a thread of its own
//! so that a slow disk never holds a request. Requests hand their line to a
//! bounded queue; when it is full the line is dropped and counted, never
//! waited for. SIGHUP reopens a file (for log rotation).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;

/// `[log].access`: where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    File(PathBuf),
}

/// Lines waiting for the writer; beyond this, lines are dropped.
const QUEUE_LINES: usize = 16_384;

/// Hands lines to the writer thread.
pub struct AccessLog {
    queue: SyncSender<String>,
    reopen: Arc<AtomicBool>,
    dropped: IntCounter,
}

enum Sink {
    Stdout(std::io::Stdout),
    File { path: PathBuf, out: BufWriter<File> },
}

fn open(path: &Path) -> std::io::Result<BufWriter<File>> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(BufWriter::new)
}

impl Sink {
    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => {
                let mut out = out.lock();
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")
            }
            Sink::File { out, .. } => {
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => out.flush(),
            Sink::File { out, .. } => out.flush(),
        }
    }

    fn reopen(&mut self) {
        if let Sink::File { path, out } = self {
            let _ = out.flush();
            match open(path) {
                Ok(fresh) => *out = fresh,
                Err(e) => log::error!("access log: cannot reopen {}: {e}", path.display()),
            }
        }
    }
}

impl AccessLog {
    /// Starts the writer; `None` when the log is off.
    pub fn start(target: &AccessLogTarget, dropped: IntCounter) -> std::io::Result<Option<Self>> {
        let sink = match target {
            AccessLogTarget::Off => return Ok(None),
            AccessLogTarget::Stdout => Sink::Stdout(std::io::stdout()),
            AccessLogTarget::File(path) => Sink::File {
                path: path.clone(),
                out: open(path)?,
            },
        };
        let (queue, lines) = sync_channel(QUEUE_LINES);
        let reopen = Arc::new(AtomicBool::new(false));
        let flag = reopen.clone();
        std::thread::Builder::new()
            .name("access log".into())
            .spawn(move || write_lines(sink, lines, flag))?;
        Ok(Some(AccessLog {
            queue,
            reopen,
            dropped,
        }))
    }

    /// Queues a line; drops and counts it when the queue is full.
    pub fn write(&self, line: String) {
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }

    /// The file is reopened before the next line (after a rotation).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }
}

fn write_lines(mut sink: Sink, lines: Receiver<String>, reopen: Arc<AtomicBool>) {
    let mut failed = false;
    while let Ok(line) = lines.recv() {
        if reopen.swap(false, Ordering::AcqRel) {
            sink.reopen();
        }
        let mut result = sink.write_line(&line);
        // Write what is queued, then flush once: a line is on disk as soon
        // as the queue runs dry.
        while result.is_ok() {
            match lines.try_recv() {
                Ok(next) => result = sink.write_line(&next),
                Err(_) => break,
            }
        }
        let result = result.and_then(|()| sink.flush());
        match (result, failed) {
            (Err(e), false) => {
                log::error!("access log: cannot write: {e}");
                failed = true;
            }
            (Ok(()), true) => failed = false,
            _ => {}
        }
    }
}

/// A JSON string: quotes, backslashes and control characters escaped.
pub fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Now as RFC 3339 in UTC with milliseconds: `2026-11-30T18:40:00.123Z`.
pub fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_strings() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\n");
        assert_eq!(s, "\"a\\\"b\\\\c\\u000a\"");
    }
}
