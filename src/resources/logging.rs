//! `LoggingResource`: CSV telemetry of every allocation and free that
//! reaches the inner resource. The first six columns match RMM's logging
//! adaptor (`Thread,Time,Action,Pointer,Size,Stream`) so existing replay and
//! analysis tools read it; `Tag` follows. Placed under the budget, it sees
//! only calls the budget let through, so a refusal is logged once (by the
//! runtime's stats), not twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::device::RawStream;
use crate::resource::{
    forward_to_inner, AllocTag, BlockId, ChargeGate, DeviceBlock, DeviceMemoryResource,
    ResourceError, ResourceResult, StreamRef, Trimmed,
};

pub const CSV_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Tag";

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

pub struct LoggingResource {
    inner: Arc<dyn DeviceMemoryResource>,
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
}

impl LoggingResource {
    pub fn new(inner: Arc<dyn DeviceMemoryResource>, path: &Path) -> ResourceResult<Self> {
        let file = File::create(path).map_err(|e| {
            ResourceError::InvalidArgument(format!("cannot create log file {}: {e}", path.display()))
        })?;
        let mut out = BufWriter::new(file);
        writeln!(out, "{CSV_HEADER}")
            .map_err(|e| ResourceError::InvalidArgument(format!("cannot write {}: {e}", path.display())))?;
        Ok(LoggingResource { inner, path: path.to_path_buf(), out: Mutex::new(out) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn line(&self, action: &str, ptr: u64, size: u64, stream: u32, tag: AllocTag) {
        let line = format!(
            "{},{},{action},{ptr:#x},{size},{stream},{}\n",
            thread_number(),
            time_of_day(),
            csv_field(&tag.name())
        );
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // Telemetry must never fail an allocation: a full disk loses lines.
        let _ = out.write_all(line.as_bytes());
    }

    /// Log a block still live when the runtime closed.
    pub fn log_leak(&self, block: &crate::resource::LeakedBlock) {
        self.line("leak", block.id.ptr, block.id.size, block.id.alloc_stream.0, AllocTag::new(&block.tag));
    }

    pub fn flush(&self) {
        let _ = self.out.lock().unwrap_or_else(|p| p.into_inner()).flush();
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
