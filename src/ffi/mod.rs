//! The C boundary: one panic boundary used by every entry point, status
//! codes, the thread-local last-error message, and the runtime handle table.
//!
//! The entry points live one concept per file, as the header declares them
//! (a file's functions, in the order of the `mod` lines below, are the
//! header's): `library` (version, status names, last error), `config`,
//! `runtime` (open, close), `stats`, `stream`, `block` (allocate, free,
//! prepare/finish of one block), `launch` (the recorded-launch pair, peer
//! access), `capture`, `reclaim` (reap, trim, drain), `inspect` (live
//! blocks, tags, summary, call sites), `interop` (the framework hooks) and
//! `testing` (the test header's). `api` gathers the production ones for
//! Rust callers. Each file's contract is at its top.

// The order of the modules is the order of their declarations in the
// generated header (cbindgen reads them in this order): keep it.
pub mod library;
pub mod config;
pub mod runtime;
pub mod stats;
pub mod stream;
pub mod block;
pub mod launch;
pub mod capture;
pub mod reclaim;
pub mod inspect;
pub mod interop;
pub mod testing;
pub mod types;

pub mod api;

use std::cell::RefCell;
use crate::fast_hash::FastMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::ResourceError;
use crate::hooks::HookThread;
use crate::registry::{Memo, Registry};
use crate::resource::StreamId;
use crate::runtime::Runtime;
use types::*;

/// Everything the boundary keeps per thread, in one thread-local: in a
/// shared library every thread-local access is a call into the dynamic
/// loader, so a launch-path call reaches all of it with one.
struct FfiThread {
    /// The message of this thread's last failed call ("" after a success).
    last_error: RefCell<String>,
    /// The runtime this thread resolved last, so that a call on it needs
    /// neither the handle table's lock nor a reference-count change.
    last_runtime: Memo<usize, Arc<Runtime>, 1>,
    /// The framework hooks' per-thread state.
    hooks: HookThread,
}

thread_local! {
    static FFI: FfiThread = const {
        FfiThread {
            last_error: RefCell::new(String::new()),
            last_runtime: Memo::new(),
            hooks: HookThread::new(),
        }
    };
}

#[cfg(test)]
pub(crate) fn with_last_error<R>(f: impl FnOnce(&str) -> R) -> R {
    FFI.with(|t| f(&t.last_error.borrow()))
}

pub(crate) fn invalid(msg: String) -> ResourceError {
    ResourceError::InvalidArgument(msg)
}

/// A caller's stream id: 0 is never one.
pub(crate) fn stream_id(stream: xlog_stream) -> Result<StreamId, ResourceError> {
    if stream == 0 {
        return Err(invalid("stream 0 is never a valid stream id".into()));
    }
    Ok(StreamId(stream))
}

pub(crate) fn status_of(e: &ResourceError) -> xlog_status {
    match e {
        ResourceError::InvalidArgument(_) => XLOG_ERR_INVALID_ARGUMENT,
        ResourceError::OutOfBudget { .. } => XLOG_ERR_OUT_OF_BUDGET,
        ResourceError::OutOfMemory { .. } => XLOG_ERR_OUT_OF_MEMORY,
        ResourceError::Driver(_) => XLOG_ERR_DRIVER,
        ResourceError::StreamMisuse(_) => XLOG_ERR_STREAM_MISUSE,
        ResourceError::UseAfterFree { .. } => XLOG_ERR_USE_AFTER_FREE,
        ResourceError::UnsatisfiableDependency(_) => XLOG_ERR_UNSATISFIABLE_DEPENDENCY,
        ResourceError::PoolExhausted { .. } | ResourceError::Exhausted(_) => XLOG_ERR_POOL_EXHAUSTED,
        ResourceError::NoDevice(_) => XLOG_ERR_NO_DEVICE,
        ResourceError::Internal(_) => XLOG_ERR_INTERNAL,
    }
}

pub(crate) fn status_name(status: xlog_status) -> &'static std::ffi::CStr {
    match status {
        XLOG_OK => c"XLOG_OK",
        XLOG_ERR_INVALID_ARGUMENT => c"XLOG_ERR_INVALID_ARGUMENT",
        XLOG_ERR_OUT_OF_BUDGET => c"XLOG_ERR_OUT_OF_BUDGET",
        XLOG_ERR_OUT_OF_MEMORY => c"XLOG_ERR_OUT_OF_MEMORY",
        XLOG_ERR_DRIVER => c"XLOG_ERR_DRIVER",
        XLOG_ERR_STREAM_MISUSE => c"XLOG_ERR_STREAM_MISUSE",
        XLOG_ERR_USE_AFTER_FREE => c"XLOG_ERR_USE_AFTER_FREE",
        XLOG_ERR_UNSATISFIABLE_DEPENDENCY => c"XLOG_ERR_UNSATISFIABLE_DEPENDENCY",
        XLOG_ERR_POOL_EXHAUSTED => c"XLOG_ERR_POOL_EXHAUSTED",
        XLOG_ERR_NO_DEVICE => c"XLOG_ERR_NO_DEVICE",
        XLOG_ERR_INTERNAL => c"XLOG_ERR_INTERNAL",
        _ => c"XLOG_STATUS_UNKNOWN",
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

// ----- the panic boundary -----

/// The C return types of the entry points, and what each returns when the
/// call does not succeed: the boundary picks an entry point's fallback by
/// its return type (as rustls-ffi's `PanicOrDefault` does), so status,
/// pointer, count and void functions share one boundary.
pub(crate) trait Returned: Sized {
    /// What a successful body yields (for a status: nothing, XLOG_OK).
    type Value;
    /// A function that returns nothing has no other way to say it did
    /// nothing: its errors and panics also go to stderr.
    const ECHO: bool = false;
    fn succeeded(value: Self::Value) -> Self;
    /// The return for an error (its message already set).
    fn failed(e: &ResourceError) -> Self;
    /// The return for a panic (its message already set).
    fn panicked() -> Self;
}

/// A status: the error's status, XLOG_ERR_INTERNAL for a panic.
impl Returned for xlog_status {
    type Value = ();
    fn succeeded((): ()) -> Self {
        XLOG_OK
    }
    fn failed(e: &ResourceError) -> Self {
        status_of(e)
    }
    fn panicked() -> Self {
        XLOG_ERR_INTERNAL
    }
}

/// A pointer (the malloc hooks): NULL.
impl<T> Returned for *mut T {
    type Value = Self;
    fn succeeded(value: Self) -> Self {
        value
    }
    fn failed(_: &ResourceError) -> Self {
        std::ptr::null_mut()
    }
    fn panicked() -> Self {
        std::ptr::null_mut()
    }
}

/// A constant pointer (the library's strings): NULL.
impl<T> Returned for *const T {
    type Value = Self;
    fn succeeded(value: Self) -> Self {
        value
    }
    fn failed(_: &ResourceError) -> Self {
        std::ptr::null()
    }
    fn panicked() -> Self {
        std::ptr::null()
    }
}

/// Nothing (the free hooks): echoed on stderr.
impl Returned for () {
    type Value = ();
    const ECHO: bool = true;
    fn succeeded((): ()) {}
    fn failed(_: &ResourceError) {}
    fn panicked() {}
}

/// A count or a length: 0.
macro_rules! returned_count {
    ($($t:ty),*) => {$(
        impl Returned for $t {
            type Value = $t;
            fn succeeded(value: $t) -> $t {
                value
            }
            fn failed(_: &ResourceError) -> $t {
                0
            }
            fn panicked() -> $t {
                0
            }
        }
    )*};
}
returned_count!(u64, usize);

/// What an entry point may reach, which decides what the boundary does
/// before its body runs.
#[derive(Clone, Copy)]
pub(crate) enum Entry {
    /// An entry point that reaches a runtime or the hooks (every one but
    /// the four below): it clears this thread's last error, and is refused
    /// from inside a host callback.
    Runtime(&'static str),
    /// `xlog_version`, `xlog_status_name`, `xlog_last_error_message` and
    /// `xlog_config_init` (which only forwards to `xlog_config_from_env`,
    /// an `Entry::Runtime`): they work from a host callback, leave this
    /// thread's last error as it is (so the message of the call that
    /// failed can still be read), and reach this thread's state only to
    /// read that message (so they work while it is torn down, from another
    /// thread-local's destructor).
    Library(&'static str),
}

/// Every entry point is named by its C name: `boundary("xlog_allocate", …)`.
impl From<&'static str> for Entry {
    fn from(name: &'static str) -> Entry {
        Entry::Runtime(name)
    }
}

/// The one panic boundary: every exported function's body runs in it.
///
/// It runs `body` with this thread's `Call` state, turns its error into
/// the return type's fallback (`Returned`) with "NAME: error" as this
/// thread's last error, and a panic into that type's panic value with
/// "NAME: internal error (panic): …": since Rust 1.81 a panic escaping
/// `extern "C"` aborts the host process, and an engine must never die
/// because of us.
///
/// An `Entry::Runtime` call from inside an xlog host callback is refused
/// here, the one place that checks it, before `body` runs (so it changes
/// nothing): on both backends (`device::in_host_callback`), with
/// XLOG_ERR_STREAM_MISUSE or the type's fallback and the reason as the
/// last error (not echoed). Only the `Entry::Library` calls work there.
#[inline]
pub(crate) fn boundary<R: Returned>(
    entry: impl Into<Entry>,
    body: impl FnOnce(Call<'_>) -> Result<R::Value, ResourceError>,
) -> R {
    let (name, runtime) = match entry.into() {
        Entry::Runtime(name) => (name, true),
        Entry::Library(name) => (name, false),
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if !runtime {
            // No thread state unless the body asks for it: these work even
            // while it is torn down (from another thread-local's destructor).
            return settle(name, None, body(Call(None)));
        }
        // The call's one thread-local access.
        FFI.with(|t| {
            t.last_error.borrow_mut().clear();
            if crate::device::in_host_callback() {
                let e = ResourceError::in_host_callback();
                *t.last_error.borrow_mut() = format!("{name}: {e}");
                return R::failed(&e);
            }
            settle(name, Some(t), body(Call(Some(t))))
        })
    }));
    outcome.unwrap_or_else(|payload| {
        let message = format!("{name}: internal error (panic): {}", panic_text(&*payload));
        record(None, message, R::ECHO);
        R::panicked()
    })
}

/// The return for a body's outcome; an error becomes this thread's last
/// error.
#[inline]
fn settle<R: Returned>(name: &'static str, t: Option<&FfiThread>, outcome: Result<R::Value, ResourceError>) -> R {
    match outcome {
        Ok(value) => R::succeeded(value),
        Err(e) => {
            record(t, format!("{name}: {e}"), R::ECHO);
            R::failed(&e)
        }
    }
}

/// Make `message` this thread's last error (through `t`, else looked up),
/// and with `echo` print it on stderr too.
fn record(t: Option<&FfiThread>, message: String, echo: bool) {
    if echo {
        eprintln!("xlog: {message}");
    }
    match t {
        Some(t) => *t.last_error.borrow_mut() = message,
        // `try_with`: not while this thread's state is being torn down (a
        // panic there must not panic again outside the boundary).
        None => {
            let _ = FFI.try_with(|t| *t.last_error.borrow_mut() = message);
        }
    }
}

/// This thread's boundary state, handed to the body of every entry point:
/// its runtime and hook lookups need no thread-local access of their own
/// (one per call in all, which the allocation and launch paths count on).
/// An `Entry::Library` call gets none: it reaches no runtime.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a>(Option<&'a FfiThread>);

impl<'a> Call<'a> {
    /// Run `f` on the runtime of `handle`, through this thread's last
    /// resolution when it is still valid (see "runtime handles" below).
    #[inline]
    pub(crate) fn with_runtime<T>(
        self,
        handle: *mut xlog_runtime,
        f: impl FnOnce(&Runtime) -> Result<T, ResourceError>,
    ) -> Result<T, ResourceError> {
        with_runtime_in(self.thread(), handle, f)
    }

    /// This thread's hook state.
    #[inline]
    pub(crate) fn hooks(self) -> &'a HookThread {
        &self.thread().hooks
    }

    #[inline]
    fn thread(self) -> &'a FfiThread {
        self.0.expect("an Entry::Library call reaches no runtime and no hooks")
    }

    /// `f` on this thread's last error message.
    pub(crate) fn with_last_error<T>(self, f: impl FnOnce(&str) -> T) -> T {
        match self.0 {
            Some(t) => f(&t.last_error.borrow()),
            None => FFI.with(|t| f(&t.last_error.borrow())),
        }
    }
}

// ----- runtime handles -----
//
// A `xlog_runtime*` is a token, never a real pointer: tokens come from a
// counter, are never reused, and are looked up in a table on every call. A
// closed, forged or never-opened handle is therefore reported as an error
// instead of being dereferenced.

const TOKEN_STRIDE: usize = 16;
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(0x10_0000);

/// Open handles → runtimes (`registry.rs`: an unregister moves the
/// epoch, so a thread's memoized resolution dies with its handle).
fn handles() -> &'static Registry<FastMap<usize, Arc<Runtime>>> {
    static TABLE: Registry<FastMap<usize, Arc<Runtime>>> = Registry::new(FastMap::default);
    &TABLE
}

pub(crate) fn register_runtime(rt: Arc<Runtime>) -> *mut xlog_runtime {
    let token = NEXT_TOKEN.fetch_add(TOKEN_STRIDE, Ordering::Relaxed);
    handles().write().insert(token, rt);
    token as *mut xlog_runtime
}

fn not_open(handle: *mut xlog_runtime) -> ResourceError {
    if handle.is_null() {
        return ResourceError::InvalidArgument("runtime handle is NULL".into());
    }
    ResourceError::InvalidArgument(format!(
        "runtime handle {handle:p} is not open (already closed, or never returned by xlog_runtime_open)"
    ))
}

pub(crate) fn runtime_of(handle: *mut xlog_runtime) -> Result<Arc<Runtime>, ResourceError> {
    if handle.is_null() {
        return Err(not_open(handle));
    }
    handles().read().get(&(handle as usize)).cloned().ok_or_else(|| not_open(handle))
}

/// Run `f` on the runtime of `handle`, through this thread's last
/// resolution while it is still valid (borrowed: no lock, no reference
/// count touched).
#[inline]
fn with_runtime_in<T>(
    t: &FfiThread,
    handle: *mut xlog_runtime,
    f: impl FnOnce(&Runtime) -> Result<T, ResourceError>,
) -> Result<T, ResourceError> {
    let key = handle as usize;
    // NULL is never a key of the table: it falls through to `not_open`.
    handles().resolve(&t.last_runtime, key, |table| table.get(&key).cloned(), |rt| f(rt)).unwrap_or_else(|| Err(not_open(handle)))
}

pub(crate) fn unregister_runtime(handle: *mut xlog_runtime) -> Result<Arc<Runtime>, ResourceError> {
    if handle.is_null() {
        return Err(not_open(handle));
    }
    let removed = {
        let mut table = handles().write();
        let removed = table.remove(&(handle as usize));
        // A resolution memoized before is dead, and one made from now on
        // cannot find the handle.
        handles().invalidate(&mut table);
        removed
    };
    // This thread lets go of it now (other threads do at their next call).
    let mine = FFI.with(|t| t.last_runtime.forget(|&h| h == handle as usize));
    drop(mine);
    removed.ok_or_else(|| not_open(handle))
}

/// Put back a handle `unregister_runtime` took, for a close that was
/// refused before it changed anything: the caller's handle stays valid.
pub(crate) fn reregister_runtime(handle: *mut xlog_runtime, rt: Arc<Runtime>) {
    handles().write().insert(handle as usize, rt);
}

/// Store `value` through a caller's out-pointer: the one place the boundary
/// writes through one (so no exported function dereferences a raw pointer
/// argument itself).
pub(crate) fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: every caller checked `out` non-NULL with `out_ptr` first; the
    // C contract makes the caller responsible for it pointing at writable
    // storage of type T.
    unsafe { out.write(value) }
}

/// Require a non-NULL out-pointer.
pub(crate) fn out_ptr<T>(p: *mut T, what: &str) -> Result<(), ResourceError> {
    if p.is_null() {
        return Err(ResourceError::InvalidArgument(format!("{what} is NULL")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_header_matches_cbindgen_output() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/xlog_cuda.h"));
        let committed = include_str!("../../include/xlog_cuda.h");
        assert!(
            generated == committed,
            "include/xlog_cuda.h is out of date: regenerate with XLOG_WRITE_HEADER=1 cargo build and commit it"
        );
        let generated = include_str!(concat!(env!("OUT_DIR"), "/testing.h"));
        let committed = include_str!("../../include/xlog/testing.h");
        assert!(
            generated == committed,
            "include/xlog/testing.h is out of date: regenerate with XLOG_WRITE_HEADER=1 cargo build and commit it"
        );
    }

    #[test]
    fn the_headers_are_regenerated_when_any_source_changes() {
        // cbindgen reads every file of the crate (items outside src/ffi,
        // such as the sim's constants, have leaked into the header before),
        // so the build script must rerun on all of src/, not src/ffi only.
        let build = include_str!("../../build.rs");
        for watched in ["src", "cbindgen.toml", "Cargo.toml", "Cargo.lock"] {
            let line = format!("println!(\"cargo:rerun-if-changed={watched}\");");
            assert!(build.contains(&line), "build.rs does not rerun when {watched} changes");
        }
    }

    #[test]
    fn test_entry_points_are_only_in_the_testing_header() {
        let public = include_str!("../../include/xlog_cuda.h");
        let testing = include_str!("../../include/xlog/testing.h");
        for name in ["xlog_sim_inject_fault(", "xlog_debug_panic(", "xlog_fault;", "XLOG_FAULT_ALLOC "] {
            assert!(!public.contains(name), "the public header declares test-only {name}");
            assert!(testing.contains(name), "the testing header lacks {name}");
        }
        assert!(testing.contains("#include \"../xlog_cuda.h\""));
    }

    #[test]
    fn header_defines_only_prefixed_names() {
        let header = include_str!("../../include/xlog_cuda.h");
        for line in header.lines().filter(|l| l.starts_with("#define ")) {
            let name = line.split_whitespace().nth(1).unwrap_or("");
            assert!(name.starts_with("XLOG_"), "header defines an unprefixed name: {line}");
        }
        let version = env!("CARGO_PKG_VERSION");
        let expected = format!(
            "{}.{}.{}",
            super::types::XLOG_VERSION_MAJOR,
            super::types::XLOG_VERSION_MINOR,
            super::types::XLOG_VERSION_PATCH
        );
        assert_eq!(version, expected, "XLOG_VERSION_* constants must match Cargo.toml");
    }

    #[test]
    fn the_fallback_of_a_failed_or_panicking_call_comes_from_its_return_type() {
        use super::{boundary, Entry};
        use crate::error::ResourceError;
        let last = || super::with_last_error(|m| m.to_string());
        let refused = || ResourceError::InvalidArgument("no".into());
        let p: *mut u8 = boundary("xlog_test_ptr", |_| Err(refused()));
        assert!(p.is_null());
        assert_eq!(last(), "xlog_test_ptr: invalid argument: no");
        let p: *const u8 = boundary("xlog_test_cptr", |_| panic!("boom"));
        assert!(p.is_null());
        assert!(last().starts_with("xlog_test_cptr: internal error (panic): boom"), "{}", last());
        let n: u64 = boundary("xlog_test_u64", |_| Err(refused()));
        assert_eq!(n, 0);
        let n: usize = boundary("xlog_test_usize", |_| panic!("boom"));
        assert_eq!(n, 0);
        let s: super::types::xlog_status = boundary("xlog_test_status", |_| Err(refused()));
        assert_eq!(s, super::types::XLOG_ERR_INVALID_ARGUMENT);
        // A call that succeeds clears the message; a library call leaves it.
        let v: u64 = boundary("xlog_test_ok", |_| Ok(7));
        assert_eq!((v, last().as_str()), (7, ""));
        let _: super::types::xlog_status = boundary("xlog_test_status", |_| Err(refused()));
        let v: usize = boundary(Entry::Library("xlog_test_library"), |_| Ok(3));
        assert_eq!(v, 3);
        assert_eq!(last(), "xlog_test_status: invalid argument: no", "a library call keeps the last error");
    }

    #[test]
    fn panic_becomes_internal_status_with_message() {
        let status = super::testing::xlog_debug_panic();
        assert_eq!(status, super::types::XLOG_ERR_INTERNAL);
        let msg = super::with_last_error(|m| m.to_string());
        assert!(msg.contains("deliberate panic"), "{msg}");
    }
}
