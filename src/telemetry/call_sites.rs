//! Call sites of allocations (opt-in: `Config::track_call_sites`,
//! `XLOG_TRACK_CALLSITES=1`) and the C-string names the C ABI hands out.
//!
//! A call site is a short text chosen by the caller: `file:line` from C or
//! C++ (`xlog_allocate_at`, the C++ wrapper passes its caller's location), a
//! Python traceback summary from the Python package, or a label a thread
//! sets for every allocation it makes next (`xlog_set_call_site`, which is
//! how allocations made by a framework hook get one). Rust's
//! `#[track_caller]` location would name the FFI layer for every C caller,
//! so the library never guesses: no text given, no call site recorded.
//!
//! Texts are interned in a process-wide table like tags are: bounded
//! ([`MAX_CALL_SITES`], later ones read [`OVERFLOW_CALL_SITE`]) and never
//! freed, so the `const char*` the C ABI hands out stays valid for the life
//! of the process. Tag names get the same treatment here (the tag table is
//! bounded too).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::fast_hash::FastMap;
use crate::ids::Generation;
use crate::resource::{AllocTag, MAX_TAGS};

/// Most distinct call-site texts a process keeps (the overflow text
/// included).
pub const MAX_CALL_SITES: usize = 4096;
/// What a new call site is recorded as once the table is full.
pub const OVERFLOW_CALL_SITE: &str = "(other)";
/// Longest call-site text kept, in bytes; longer ones are cut at a
/// character boundary.
pub const MAX_CALL_SITE_LEN: usize = 1024;

/// An interned call-site text; 0 is "none".
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct CallSite(u32);

struct SiteTable {
    by_name: HashMap<Box<str>, u32>,
    /// Index 0 is unused ("none"), 1 is the overflow text.
    names: Vec<&'static CStr>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A process-lifetime C copy of `text` (interior NULs become `?`). Only
/// called for texts entering a bounded table, so the total is bounded.
fn leak_c(text: &str) -> &'static CStr {
    let c = CString::new(text.replace('\0', "?")).unwrap_or_default();
    Box::leak(c.into_boxed_c_str())
}

fn site_table() -> &'static Mutex<SiteTable> {
    static TABLE: OnceLock<Mutex<SiteTable>> = OnceLock::new();
    TABLE.get_or_init(|| {
        Mutex::new(SiteTable { by_name: HashMap::new(), names: vec![leak_c(""), leak_c(OVERFLOW_CALL_SITE)] })
    })
}

thread_local! {
    /// The label `set_thread_call_site` gave this thread.
    static THREAD_SITE: Cell<CallSite> = const { Cell::new(CallSite(0)) };
    /// The call site of the allocation this thread is making right now, on
    /// a runtime that tracks call sites: the log's `allocate` row writes it
    /// into `Detail` (see [`AllocationSite`]).
    static ALLOCATING_SITE: Cell<CallSite> = const { Cell::new(CallSite(0)) };
}

/// While alive, the allocation this thread is making has `site`: the
/// runtime sets it around its resource stack's `allocate` (only when it
/// tracks call sites), and the log, told of the allocation by the allocator, reads it
/// with [`AllocationSite::current`] for the `Detail` of the `allocate` row.
/// Dropping it restores the site before (nested runtimes on one thread).
pub struct AllocationSite {
    before: CallSite,
}

impl AllocationSite {
    pub fn enter(site: CallSite) -> AllocationSite {
        AllocationSite { before: ALLOCATING_SITE.with(|s| s.replace(site)) }
    }

    /// The site of the allocation under way on this thread (NONE: none,
    /// or its runtime does not track call sites).
    #[inline]
    pub fn current() -> CallSite {
        ALLOCATING_SITE.with(|s| s.get())
    }
}

impl Drop for AllocationSite {
    fn drop(&mut self) {
        ALLOCATING_SITE.with(|s| s.set(self.before));
    }
}

impl CallSite {
    pub const NONE: CallSite = CallSite(0);

    /// Intern `text` (empty = none).
    pub fn new(text: &str) -> CallSite {
        if text.is_empty() {
            return CallSite::NONE;
        }
        let mut end = text.len().min(MAX_CALL_SITE_LEN);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let text = &text[..end];
        let mut table = lock(site_table());
        if let Some(&id) = table.by_name.get(text) {
            return CallSite(id);
        }
        if table.names.len() >= MAX_CALL_SITES {
            return CallSite(1);
        }
        let id = table.names.len() as u32;
        table.names.push(leak_c(text));
        table.by_name.insert(text.into(), id);
        CallSite(id)
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The text as a C string, valid for the life of the process.
    pub fn c_name(self) -> &'static CStr {
        lock(site_table()).names.get(self.0 as usize).copied().unwrap_or(c"")
    }

    pub fn name(self) -> String {
        self.c_name().to_string_lossy().into_owned()
    }

    /// The label of this thread's next allocations (NONE when unset).
    pub fn thread_current() -> CallSite {
        THREAD_SITE.with(|s| s.get())
    }

    /// Give this thread's next allocations `site` (NONE clears it).
    pub fn set_thread_current(site: CallSite) {
        THREAD_SITE.with(|s| s.set(site));
    }
}

/// The name of `tag` as a C string, valid for the life of the process.
pub fn tag_c_name(tag: AllocTag) -> &'static CStr {
    static NAMES: OnceLock<Mutex<Vec<Option<&'static CStr>>>> = OnceLock::new();
    let index = tag.index();
    if index >= MAX_TAGS {
        return c"?";
    }
    let mut names = lock(NAMES.get_or_init(|| Mutex::new(vec![None; MAX_TAGS])));
    // Lock order: this table, then the tag table (inside `name`); the tag
    // table never calls back here.
    names[index].get_or_insert_with(|| leak_c(&tag.name()))
}

/// Where and when each live block of one runtime was allocated, for
/// runtimes that track call sites. Entries are added after the resource
/// handed the block out and removed after it took the block back; a
/// snapshot that misses an entry (a block allocated or freed meanwhile)
/// shows no call site for it.
#[derive(Default)]
pub struct SiteRecords {
    by_generation: Mutex<FastMap<Generation, (CallSite, Instant)>>,
}

impl SiteRecords {
    pub fn insert(&self, generation: Generation, site: CallSite) {
        lock(&self.by_generation).insert(generation, (site, Instant::now()));
    }

    pub fn remove(&self, generation: Generation) {
        lock(&self.by_generation).remove(&generation);
    }

    /// Look up many generations under one lock.
    pub fn lookup_all(&self, generations: impl Iterator<Item = Generation>) -> Vec<Option<(CallSite, Instant)>> {
        let map = lock(&self.by_generation);
        generations.map(|g| map.get(&g).copied()).collect()
    }
}
