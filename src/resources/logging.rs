//! `LoggingResource`: CSV telemetry of every allocation and free that
//! reaches the inner resource. The first six columns match RMM's logging
//! adaptor (`Thread,Time,Action,Pointer,Size,Stream`) so existing replay and
//! analysis tools read it; `Tag` follows. Placed under the budget, it sees
//! only calls the budget let through, so a refusal is logged once (by the
//! runtime's stats), not twice.
//!
//! The log path may name a regular file, a character device (`/dev/null`,
//! a terminal) or a FIFO that a reader already holds open. It is opened
//! non-blocking, so a FIFO without a reader is refused at once instead of
//! hanging the open; directories, block devices and sockets are refused.
//! Telemetry never fails an allocation: a line that cannot be written
//! (full disk, `/dev/full`, a FIFO whose reader is too slow) is dropped and
//! counted (`lines_lost`, `xlog_stats.log_lines_lost`), and the first such
//! failure is reported once on stderr.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::device::RawStream;
use crate::resource::{
    forward_to_inner, AllocTag, BlockId, ChargeGate, DeviceBlock, DeviceMemoryResource,
    ResourceError, ResourceResult, StreamRef, Trimmed,
};

pub const CSV_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Tag";

/// Lines are written in batches of about this many bytes (and at every
/// reap and at close).
const BUFFER_BYTES: usize = 8 << 10;

fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

/// Wall-clock time of day (UTC) as `HH:MM:SS.micros`, like RMM's log.
fn time_of_day() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}.{:06}", secs / 3600, secs / 60 % 60, secs % 60, now.subsec_micros())
}

/// Tags are user text: quote them when they hold CSV metacharacters.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// Open `path` for the log without ever blocking, and refuse what cannot
/// hold one.
fn open_log(path: &Path) -> ResourceResult<File> {
    let refuse = |why: String| ResourceError::InvalidArgument(format!("cannot create log file {}: {why}", path.display()));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        // Opening a FIFO for writing blocks until a reader opens it;
        // non-blocking, it fails at once (ENXIO) instead.
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => refuse("it is a FIFO (named pipe) that no process has open for reading".into()),
            _ => refuse(e.to_string()),
        })?;
    let kind = file.metadata().map_err(|e| refuse(e.to_string()))?.file_type();
    if kind.is_file() || kind.is_char_device() || kind.is_fifo() {
        Ok(file)
    } else {
        let what = if kind.is_block_device() { "a block device" } else { "not a regular file" };
        Err(refuse(format!("it is {what}; a log path must name a regular file, a character device or a FIFO")))
    }
}

/// Lines not yet written, and the file they go to.
struct Sink {
    file: File,
    buffer: Vec<u8>,
    buffered_lines: u64,
}

pub struct LoggingResource {
    inner: Arc<dyn DeviceMemoryResource>,
    path: PathBuf,
    sink: Mutex<Sink>,
    lines_lost: AtomicU64,
    failure_reported: AtomicBool,
}

impl LoggingResource {
    pub fn new(inner: Arc<dyn DeviceMemoryResource>, path: &Path) -> ResourceResult<Self> {
        let file = open_log(path)?;
        let mut buffer = Vec::with_capacity(BUFFER_BYTES);
        buffer.extend_from_slice(CSV_HEADER.as_bytes());
        buffer.push(b'\n');
        let log = LoggingResource {
            inner,
            path: path.to_path_buf(),
            sink: Mutex::new(Sink { file, buffer, buffered_lines: 1 }),
            lines_lost: AtomicU64::new(0),
            failure_reported: AtomicBool::new(false),
        };
        // The header at once: a log that cannot be written is reported now
        // (once, and counted), not at the first reap.
        log.flush();
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines that could not be written (or only in part) since the open.
    pub fn lines_lost(&self) -> u64 {
        self.lines_lost.load(Ordering::Relaxed)
    }

    fn sink(&self) -> MutexGuard<'_, Sink> {
        self.sink.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn line(&self, action: &str, ptr: u64, size: u64, stream: u32, tag: AllocTag) {
        let line = format!(
            "{},{},{action},{ptr:#x},{size},{stream},{}\n",
            thread_number(),
            time_of_day(),
            csv_field(&tag.name())
        );
        let mut sink = self.sink();
        sink.buffer.extend_from_slice(line.as_bytes());
        sink.buffered_lines += 1;
        if sink.buffer.len() >= BUFFER_BYTES {
            self.write_out(&mut sink);
        }
    }

    /// Write the buffered lines. Telemetry must never fail an allocation:
    /// on a write error they are dropped and counted, and the first failure
    /// is reported once on stderr.
    fn write_out(&self, sink: &mut Sink) {
        if sink.buffer.is_empty() {
            return;
        }
        let Sink { file, buffer, buffered_lines } = sink;
        if let Err(e) = file.write_all(buffer) {
            let lost = self.lines_lost.fetch_add(*buffered_lines, Ordering::Relaxed) + *buffered_lines;
            if !self.failure_reported.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "xlog: cannot write the log {}: {e}; {lost} line(s) lost so far, later losses are \
                     counted in xlog_stats.log_lines_lost without another message",
                    self.path.display()
                );
            }
        }
        buffer.clear();
        *buffered_lines = 0;
    }

    /// Log a block still live when the runtime closed.
    pub fn log_leak(&self, block: &crate::resource::LeakedBlock) {
        self.line("leak", block.id.ptr, block.id.size, block.id.alloc_stream.0, AllocTag::new(&block.tag));
    }

    pub fn flush(&self) {
        let mut sink = self.sink();
        self.write_out(&mut sink);
        let _ = sink.file.flush();
    }
}

impl Drop for LoggingResource {
    fn drop(&mut self) {
        self.flush();
    }
}

impl DeviceMemoryResource for LoggingResource {
    fn allocate_gated(
        &self,
        bytes: u64,
        stream: StreamRef,
        tag: AllocTag,
        gate: &dyn ChargeGate,
    ) -> ResourceResult<DeviceBlock> {
        let result = self.inner.allocate_gated(bytes, stream, tag, gate);
        match &result {
            Ok(b) => self.line("allocate", b.id.ptr, b.held, stream.id.0, tag),
            // A budget above refused the growth (and may retry after
            // relieving pressure): the refusal is the budget's, not logged
            // per attempt here.
            Err(ResourceError::OutOfBudget { .. }) => {}
            Err(_) => self.line("allocate failure", 0, bytes, stream.id.0, tag),
        }
        result
    }

    fn deallocate(&self, block: &BlockId) -> ResourceResult<DeviceBlock> {
        self.deallocate_released(block).0
    }

    fn deallocate_released(&self, block: &BlockId) -> (ResourceResult<DeviceBlock>, u64) {
        let (result, released) = self.inner.deallocate_released(block);
        if let Ok(b) = &result {
            self.line("free", block.ptr, b.held, block.alloc_stream.0, b.tag);
        }
        (result, released)
    }

    fn reap_pending(&self) -> ResourceResult<u64> {
        let r = self.inner.reap_pending();
        self.flush();
        r
    }

    fn trim(&self, keep_bytes: u64) -> ResourceResult<Trimmed> {
        self.inner.trim(keep_bytes)
    }

    fn relieve_pressure(&self, need: u64, wait: bool) -> ResourceResult<u64> {
        self.inner.relieve_pressure(need, wait)
    }

    fn retire_stream(&self, stream: RawStream) -> ResourceResult<u64> {
        self.inner.retire_stream(stream)
    }

    forward_to_inner!();
}
