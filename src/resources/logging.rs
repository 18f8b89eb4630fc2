//! `CsvLog`: CSV telemetry of the memory a runtime hands out and takes
//! back, and of what it takes from and gives back to the driver, so that
//! live, cached and pending bytes can all be rebuilt from the log.
//!
//! The log is the one observer of the allocator's events, handed to the
//! allocator (and to its memories) at construction: every row is written
//! by a method of `CsvLog` when the allocator reports the event (the
//! runtime reports only what happens at close: leaks, unreleased streams).
//!
//! Columns: `Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail`.
//! The first six are RMM's logging adaptor's, so its replay and analysis
//! tools read them (RMM's parser finds columns by name; it accepts the
//! actions `allocate`, `free` and `allocate failure` only, see
//! [`RMM_ACTIONS`]). Actions, with `Size` in device bytes:
//!
//! - `allocate` (RMM): a block handed to the caller; cached → live.
//!   `Detail` is the allocation's call site when the runtime tracks them
//!   (`Config::track_call_sites`, `XLOG_TRACK_CALLSITES=1`): `file:line`
//!   from C/C++, a traceback summary from Python, or the thread's label;
//!   empty otherwise.
//! - `free` (RMM): the caller gave it back; live → cached (with the cache
//!   off a `release` row follows at once).
//! - `allocate failure` (RMM): a refused allocation, written by the
//!   allocator once per failed call (after the budget's retries), with `Size` the
//!   request and `Detail` the reason (requested, live, cached, pending,
//!   limit).
//! - `reserve` (xlog): memory taken from the driver; → cached (the
//!   `allocate` row that follows moves it to live).
//! - `release` (xlog): memory handed back to the driver, stream-ordered;
//!   cached → pending.
//! - `retire` (xlog): pending frees the runtime saw complete; pending →
//!   gone. One row per completed batch: `Pointer` 0x0, `Detail` the number
//!   of blocks.
//! - `leak` (xlog): a block still live when the runtime closed (its `free`
//!   row follows: close frees it).
//! - `unreleased stream` (xlog): a pooled stream acquired and never
//!   released when the runtime closed: `Stream` its id, `Pointer` 0x0,
//!   `Size` 0, `Detail` its native handle. Moves no bytes.
//!
//! So live = Σallocate − Σfree, pending = Σrelease − Σretire and cached =
//! Σreserve − Σallocate + Σfree − Σrelease, per (Process, Device).
//! `Stream` is xlog's stream id on allocate/free/failure/reserve/leak and
//! unreleased stream rows, and 0 on release and retire rows.
//!
//! A log that survives a crash: every row is handed to the kernel (one
//! `write(2)`) before the call that made it returns, nothing is held in a
//! user-space buffer. A process that dies by SIGKILL, an abort or an
//! uncaught exception right after a call therefore leaves that call's rows
//! in the file, and a refusal's row is there before the refusal reaches the
//! caller: the log is wanted most after a crash. (Written to the OS, not
//! synced to the disk: the rows survive the process, not a power cut.) The
//! price is one system call per row; `cargo bench --bench overhead --
//! --logging-only` measures it.
//!
//! Sharing one file: the log is opened for appending and never truncated.
//! The header is written by whoever creates the file (or finds it empty).
//! Each row is one `write(2)` of a whole line on an `O_APPEND` descriptor,
//! so several runtimes (devices, processes) appending to one path never cut
//! each other's lines; their rows interleave by row, roughly in time order
//! (sort by Time, or group by Process and Device, for an exact order).
//!
//! The log path may name a regular file, a character device (`/dev/null`,
//! a terminal) or a FIFO that a reader already holds open. It is opened
//! non-blocking, so a FIFO without a reader is refused at once instead of
//! hanging the open; directories, block devices and sockets are refused.
//! Telemetry never fails an allocation: a line that cannot be written
//! (full disk, `/dev/full`, a FIFO whose reader is too slow) is dropped and
//! counted (`lines_lost`, `xlog_stats.log_lines_lost`), and the first such
//! failure is reported once on stderr.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::resource::{AllocTag, BlockState, DeviceBlock, ResourceError, ResourceResult};
use crate::telemetry::AllocationSite;

pub const CSV_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail";

/// The actions RMM's log parser accepts; keep only these rows to hand a
/// log to RMM's tools (docs/frameworks.md gives the filter).
pub const RMM_ACTIONS: [&str; 3] = ["allocate", "free", "allocate failure"];

/// The actions only xlog writes.
pub const XLOG_ACTIONS: [&str; 5] = ["reserve", "release", "retire", "leak", "unreleased stream"];

/// Capacity kept for the line being formatted: a row with a long refusal
/// reason fits without growing it.
const LINE_BYTES: usize = 512;

fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

/// Append the wall-clock time of day (UTC) as `HH:MM:SS.micros`, like
/// RMM's log.
fn push_time_of_day(line: &mut String) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() % 86_400;
    let _ = write!(line, "{:02}:{:02}:{:02}.{:06}", secs / 3600, secs / 60 % 60, secs % 60, now.subsec_micros());
}

/// Append a free-text field (tag, detail), quoted when it holds CSV
/// metacharacters.
fn push_csv_field(line: &mut String, text: &str) {
    if text.contains([',', '"', '\n', '\r']) {
        line.push('"');
        for part in text.split_inclusive('"') {
            line.push_str(part);
            if part.ends_with('"') {
                line.push('"');
            }
        }
        line.push('"');
    } else {
        line.push_str(text);
    }
}

/// Open `path` for appending without ever blocking, and refuse what cannot
/// hold a log. Returns the file and whether it needs the header (this open
/// created it, or found it empty).
fn open_log(path: &Path) -> ResourceResult<(File, bool)> {
    let refuse = |why: String| ResourceError::InvalidArgument(format!("cannot create log file {}: {why}", path.display()));
    let open = |create_new: bool| {
        let mut o = OpenOptions::new();
        o.append(true);
        if create_new {
            o.create_new(true);
        }
        // Opening a FIFO for writing blocks until a reader opens it;
        // non-blocking, it fails at once (ENXIO) instead.
        o.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)
    };
    let map = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENXIO) => refuse("it is a FIFO (named pipe) that no process has open for reading".into()),
        _ => refuse(e.to_string()),
    };
    // Create it if it is not there (the creator writes the header), else
    // append to what is there: another runtime's rows are never truncated.
    let (file, created) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (open(false).map_err(map)?, false),
        Err(e) => return Err(map(e)),
    };
    let meta = file.metadata().map_err(|e| refuse(e.to_string()))?;
    let kind = meta.file_type();
    if kind.is_file() {
        Ok((file, created || meta.len() == 0))
    } else if kind.is_char_device() || kind.is_fifo() {
        // A stream: every reader starts with a header.
        Ok((file, true))
    } else {
        let what = if kind.is_block_device() { "a block device" } else { "not a regular file" };
        Err(refuse(format!("it is {what}; a log path must name a regular file, a character device or a FIFO")))
    }
}

/// The file, and the line being formatted (kept to reuse its capacity).
struct Sink {
    file: File,
    line: String,
}

/// The CSV file of one runtime: each row is appended with one `write(2)`
/// as it is made. Shared by the allocator (which reports `allocate`,
/// `allocate failure` and `free`) and its memories (`reserve`, `release`,
/// `retire`).
pub struct CsvLog {
    path: PathBuf,
    device: i32,
    process: u32,
    sink: Mutex<Sink>,
    lines_lost: AtomicU64,
    failure_reported: AtomicBool,
}

impl CsvLog {
    /// Open (or create) the log at `path` for the runtime of `device`.
    pub fn open(path: &Path, device: i32) -> ResourceResult<Arc<CsvLog>> {
        let (file, needs_header) = open_log(path)?;
        let log = Arc::new(CsvLog {
            path: path.to_path_buf(),
            device,
            process: std::process::id(),
            sink: Mutex::new(Sink { file, line: String::with_capacity(LINE_BYTES) }),
            lines_lost: AtomicU64::new(0),
            failure_reported: AtomicBool::new(false),
        });
        if needs_header {
            // At once: a log that cannot be written is reported now (once,
            // and counted), not at the first row.
            let mut sink = log.sink();
            let Sink { file, line } = &mut *sink;
            line.clear();
            line.push_str(CSV_HEADER);
            line.push('\n');
            log.write_line(file, line);
        }
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

    /// Format one row and hand it to the kernel before returning.
    fn row(&self, action: &str, ptr: u64, size: u64, stream: u32, tag: &str, detail: &str) {
        let mut sink = self.sink();
        let Sink { file, line } = &mut *sink;
        line.clear();
        let _ = write!(line, "{},", thread_number());
        push_time_of_day(line);
        let _ = write!(line, ",{action},{ptr:#x},{size},{stream},");
        push_csv_field(line, tag);
        let _ = write!(line, ",{},{},", self.device, self.process);
        push_csv_field(line, detail);
        line.push('\n');
        self.write_line(file, line);
    }

    /// Memory taken from the driver (`ptr`, `bytes` device bytes) for an
    /// allocation on `stream`; `detail` says why where the caller knows
    /// (the arena: where the miss's other pages came from, and the soft
    /// cap).
    pub fn reserved(&self, ptr: u64, bytes: u64, stream: u32, detail: &str) {
        self.row("reserve", ptr, bytes, stream, "", detail);
    }

    /// Memory handed back to the driver (stream-ordered: pending until
    /// retired).
    pub fn released(&self, ptr: u64, bytes: u64) {
        self.row("release", ptr, bytes, 0, "", "");
    }

    /// Pending frees seen complete: `bytes` in `blocks` blocks left.
    pub fn retired(&self, bytes: u64, blocks: u64) {
        self.row("retire", 0, bytes, 0, "", &format!("{blocks} blocks"));
    }

    /// A block handed to the caller on `stream`. `Detail`: the call site,
    /// when the runtime tracks them (it names the allocation under way on
    /// this thread; see `AllocationSite`).
    // Out of line: a row costs a system call, and the allocate and free
    // paths without a log stay as small as they were.
    #[cold]
    #[inline(never)]
    pub fn allocated(&self, block: &DeviceBlock, stream: u32) {
        let site = AllocationSite::current();
        let detail = if site.is_none() { String::new() } else { site.name() };
        self.row("allocate", block.id.ptr, block.held, stream, &block.tag.name(), &detail);
    }

    /// A block the caller gave back (`freed`, its state after the free),
    /// then what the free itself gave the driver: a `release` row for a
    /// free queued to the driver, and a `retire` row too for a synchronous
    /// one (after the `free` row, so a running sum never goes below zero).
    // Out of line: a row costs a system call, and the allocate and free
    // paths without a log stay as small as they were.
    #[cold]
    #[inline(never)]
    pub fn freed(&self, freed: &DeviceBlock) {
        let block = &freed.id;
        self.row("free", block.ptr, freed.held, block.alloc_stream.0, &freed.tag.name(), "");
        match freed.state {
            BlockState::Pending => self.released(block.ptr, freed.held),
            BlockState::Retired if freed.held > 0 => {
                self.released(block.ptr, freed.held);
                self.retired(freed.held, 1);
            }
            _ => {}
        }
    }

    /// A refused allocation of `bytes` on `stream`, with the reason.
    // Out of line: a row costs a system call, and the allocate and free
    // paths without a log stay as small as they were.
    #[cold]
    #[inline(never)]
    pub fn refused(&self, bytes: u64, stream: u32, tag: AllocTag, reason: &str) {
        self.row("allocate failure", 0, bytes, stream, &tag.name(), reason);
    }

    /// A block still live when the runtime closed.
    pub fn leaked(&self, block: &crate::resource::LeakedBlock) {
        self.row("leak", block.id.ptr, block.id.size, block.id.alloc_stream.0, &block.tag, "");
    }

    /// A pooled stream acquired and never released when the runtime
    /// closed: `Stream` its id, `Pointer` and `Size` 0, `Detail` its native
    /// handle.
    pub fn unreleased_stream(&self, stream: u32, native: u64) {
        self.row("unreleased stream", 0, 0, stream, "", &format!("native {native:#x}"));
    }

    /// Write one whole line with one `write(2)` on the append descriptor
    /// (`write_all` loops only where a FIFO takes part of it). Telemetry
    /// must never fail an allocation: on a write error the line is dropped
    /// and counted, and the first failure is reported once on stderr.
    fn write_line(&self, file: &mut File, line: &str) {
        if let Err(e) = file.write_all(line.as_bytes()) {
            let lost = self.lines_lost.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.failure_reported.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "xlog: cannot write the log {}: {e}; {lost} line(s) lost so far, later losses are \
                     counted in xlog_stats.log_lines_lost without another message",
                    self.path.display()
                );
            }
        }
    }

    /// Nothing is buffered in user space (each row is written as it is
    /// made), so this only asks the `File` to flush, which is a no-op;
    /// kept so that callers that mark a point of completeness (reap,
    /// close) say so.
    pub fn flush(&self) {
        let _ = self.sink().file.flush();
    }
}
