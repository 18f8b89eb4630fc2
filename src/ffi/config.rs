//! The configuration a runtime is opened with: `xlog_config` filled from
//! defaults and the environment (`xlog_config_init`,
//! `xlog_config_from_env`), and checked field by field on the way in
//! (`config_of`, shared by `xlog_runtime_open` and
//! `xlog_interop_configure`). A config whose `struct_size` is not this
//! library's `sizeof(xlog_config)` is refused with the reason, so a caller
//! built against another header fails loudly instead of being misread.

// The C contract of each entry point (valid or NULL pointers) is in its doc
// comment, which is also the header's; no separate `# Safety` section.
#![allow(clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;

use super::types::*;
use super::{boundary, invalid, out_ptr, write_out, Entry};
use crate::config::{AllocatorKind, Config};
use crate::device::Backend;
use crate::error::ResourceError;

fn backend_of(value: xlog_backend) -> Result<Backend, ResourceError> {
    match value {
        XLOG_BACKEND_AUTO => Ok(Backend::Auto),
        XLOG_BACKEND_CUDA => Ok(Backend::Cuda),
        XLOG_BACKEND_SIM => Ok(Backend::Sim),
        other => Err(invalid(format!(
            "backend value {other} is not one of XLOG_BACKEND_AUTO (0), XLOG_BACKEND_CUDA (1), XLOG_BACKEND_SIM (2)"
        ))),
    }
}

pub(super) fn backend_code(b: Backend) -> xlog_backend {
    match b {
        Backend::Auto => XLOG_BACKEND_AUTO,
        Backend::Cuda => XLOG_BACKEND_CUDA,
        Backend::Sim => XLOG_BACKEND_SIM,
    }
}

fn allocator_of(value: xlog_allocator) -> Result<AllocatorKind, ResourceError> {
    match value {
        XLOG_ALLOCATOR_ASYNC => Ok(AllocatorKind::Async),
        XLOG_ALLOCATOR_DIRECT => Ok(AllocatorKind::Direct),
        other => Err(invalid(format!(
            "allocator value {other} is not one of XLOG_ALLOCATOR_ASYNC (0), XLOG_ALLOCATOR_DIRECT (1)"
        ))),
    }
}

/// Keep a C copy of a log path alive for the process, so a config filled
/// from the environment can point at it.
fn interned_path(path: &std::path::Path) -> *const c_char {
    static PATHS: once_cell::sync::Lazy<Mutex<HashMap<PathBuf, CString>>> =
        once_cell::sync::Lazy::new(|| Mutex::new(HashMap::new()));
    use std::os::unix::ffi::OsStrExt;
    let mut paths = PATHS.lock().unwrap_or_else(|p| p.into_inner());
    let c = paths.entry(path.to_path_buf()).or_insert_with(|| {
        CString::new(path.as_os_str().as_bytes()).unwrap_or_else(|_| CString::from(c"<invalid path>"))
    });
    c.as_ptr()
}

fn fill_config(out: &mut xlog_config, cfg: &Config) {
    *out = xlog_config {
        struct_size: std::mem::size_of::<xlog_config>() as u32,
        backend: backend_code(cfg.backend),
        allocator: match cfg.allocator {
            AllocatorKind::Async => XLOG_ALLOCATOR_ASYNC,
            AllocatorKind::Direct => XLOG_ALLOCATOR_DIRECT,
        },
        budget_bytes: cfg.budget_bytes,
        stream_pool_size: cfg.stream_pool_size,
        log_path: cfg.log_path.as_deref().map_or(std::ptr::null(), interned_path),
        sim_capacity_bytes: cfg.sim_capacity_bytes,
        wait_on_pressure: cfg.wait_on_pressure as u8,
        cache: cfg.cache as u8,
        pool_release_threshold: cfg.pool_release_threshold,
        track_call_sites: cfg.track_call_sites as u8,
        sim_devices: cfg.sim_devices,
        memory: if cfg.arena { XLOG_MEMORY_ARENA } else { XLOG_MEMORY_POOL },
    };
}

pub(crate) fn config_of(cfg: *const xlog_config) -> Result<Config, ResourceError> {
    if cfg.is_null() {
        return Config::from_env();
    }
    // SAFETY: non-NULL; the caller guarantees it points at an xlog_config.
    // Every field is plain data or a pointer we only read as a C string.
    let c = unsafe { &*cfg };
    if c.struct_size == 0 {
        let why = match Config::from_env() {
            Err(e) => e.to_string(),
            Ok(_) => "struct_size is 0: initialise the config with xlog_config_init".into(),
        };
        return Err(invalid(format!("config is not usable: {why}")));
    }
    let expected = std::mem::size_of::<xlog_config>() as u32;
    if c.struct_size != expected {
        return Err(invalid(format!(
            "config struct_size is {} but this library's xlog_config is {expected} bytes: \
             initialise it with xlog_config_init from the header matching the library",
            c.struct_size
        )));
    }
    if c.wait_on_pressure > 1 {
        return Err(invalid(format!("wait_on_pressure is {} (must be 0 or 1)", c.wait_on_pressure)));
    }
    if c.cache > 1 {
        return Err(invalid(format!("cache is {} (must be 0 or 1)", c.cache)));
    }
    if c.memory > XLOG_MEMORY_POOL {
        return Err(invalid(format!(
            "memory is {} (must be XLOG_MEMORY_ARENA {XLOG_MEMORY_ARENA} or XLOG_MEMORY_POOL {XLOG_MEMORY_POOL})",
            c.memory
        )));
    }
    if c.track_call_sites > 1 {
        return Err(invalid(format!("track_call_sites is {} (must be 0 or 1)", c.track_call_sites)));
    }
    let log_path = if c.log_path.is_null() {
        None
    } else {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: non-NULL; the caller guarantees a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(c.log_path) }.to_bytes();
        if bytes.is_empty() {
            None
        } else {
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
        }
    };
    let config = Config {
        backend: backend_of(c.backend)?,
        allocator: allocator_of(c.allocator)?,
        budget_bytes: c.budget_bytes,
        stream_pool_size: c.stream_pool_size,
        log_path,
        sim_capacity_bytes: c.sim_capacity_bytes,
        wait_on_pressure: c.wait_on_pressure == 1,
        cache: c.cache == 1,
        pool_release_threshold: c.pool_release_threshold,
        track_call_sites: c.track_call_sites == 1,
        sim_devices: c.sim_devices,
        arena: c.memory == XLOG_MEMORY_ARENA,
    };
    config.validate()?;
    Ok(config)
}

/// Fill `cfg` with defaults, then apply `XLOG_BACKEND`, `XLOG_BUDGET_BYTES`
/// and `XLOG_LOG_PATH`. If one of them is malformed, `cfg->struct_size` is
/// set to 0 (so `xlog_runtime_open` refuses it with the reason) and the
/// message is available from `xlog_last_error_message`.
#[no_mangle]
pub unsafe extern "C" fn xlog_config_init(cfg: *mut xlog_config) {
    boundary(Entry::Library("xlog_config_init"), |_| {
        // SAFETY: same contract as ours: `cfg` is NULL or points at a config.
        let _ = unsafe { xlog_config_from_env(cfg) };
        Ok(())
    })
}

/// `xlog_config_init` that also returns the status: XLOG_OK, or
/// XLOG_ERR_INVALID_ARGUMENT for a NULL `cfg` or a malformed variable.
#[no_mangle]
pub unsafe extern "C" fn xlog_config_from_env(cfg: *mut xlog_config) -> xlog_status {
    boundary("xlog_config_from_env", |_| {
        out_ptr(cfg, "cfg")?;
        let mut out = xlog_config {
            struct_size: 0,
            backend: 0,
            allocator: 0,
            budget_bytes: 0,
            stream_pool_size: 0,
            log_path: std::ptr::null(),
            sim_capacity_bytes: 0,
            wait_on_pressure: 0,
            cache: 0,
            pool_release_threshold: 0,
            track_call_sites: 0,
            sim_devices: 0,
            memory: 0,
        };
        let mut config = Config::default();
        let env = config.apply_env(|name| std::env::var_os(name));
        fill_config(&mut out, &config);
        if env.is_err() {
            out.struct_size = 0;
        }
        write_out(cfg, out);
        env
    })
}
