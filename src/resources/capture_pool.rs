//! `CapturePools`: the memory of CUDA graph captures made through xlog.
//!
//! Contract (DESIGN: "Stream capture"):
//! - A capture begun through the runtime is *active* until it is ended.
//!   While any capture is active, the pool asks the driver which capture
//!   each stream it touches takes part in; with none active it asks
//!   nothing (one atomic load on the hot path).
//! - A block allocated on a capturing stream comes from its capture's
//!   private memory: real device memory (never a graph allocation node),
//!   at an address that stays valid for every replay of the graph. Freed,
//!   inside the capture or later, its memory goes back to that capture's
//!   pool, never to the stream caches: a replay may still write it.
//! - An ordinary block freed while its allocation stream captures is parked
//!   in that capture's pool too (the graph's work may use it).
//! - A pool gives its memory back to the driver only when asked
//!   (`release`), after the caller destroyed every graph made from the
//!   capture, and only when none of its blocks is live; at close, all.
//! - A freed block is handed out again only to an allocation of the same
//!   capture on the same stream (stream order inside the graph makes that
//!   safe) with the same size class.
//! - A capture a framework began and announced (`announced_pools.rs`) is
//!   *orphaned* once the framework says no graph uses its memory any more
//!   (PyTorch's `releasePool`). An orphaned pool whose blocks are all free
//!   and whose capture has ended is *ready*: the caller takes it out
//!   (`take_ready_orphans`) and gives its memory back. Blocks still live at
//!   the release (a graph's output tensors) make it wait: the free of the
//!   last one makes it ready (`put` says so).
//! - Besides active captures, `watch` / `unwatch` count announcements
//!   still waiting for their capture: the same one atomic tells the hot
//!   path to ask the driver while either is non-zero.
//!
//! The bytes stay held (and charged to the budget) the whole time; the
//! free bytes of the pools count as cached.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::device::RawStream;
use crate::fast_hash::FastMap;

#[derive(Default)]
struct Pool {
    /// Freed memory: (stream it was freed on, pointer, device bytes).
    free: Vec<(RawStream, u64, u64)>,
    /// Blocks allocated from this capture still live.
    live: u64,
    /// Free bytes (the sum over `free`).
    free_bytes: u64,
    /// No graph uses this memory any more: give it back once no block is
    /// live (and the capture ended).
    orphaned: bool,
}

impl Pool {
    fn ready(&self) -> bool {
        self.orphaned && self.live == 0
    }
}

#[derive(Default)]
struct State {
    active: Vec<u64>,
    pools: FastMap<u64, Pool>,
}

#[derive(Default)]
pub(crate) struct CapturePools {
    /// Active captures plus watching announcements (see the contract).
    active: AtomicU32,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CapturePools {
    /// Whether a capture begun through the runtime (or adopted for an
    /// announcement) is still active, or an announcement waits for its
    /// capture.
    #[inline]
    pub fn any_active(&self) -> bool {
        self.active.load(Ordering::Acquire) != 0
    }

    /// An announcement waits for its capture: the pool asks the driver
    /// about every stream meanwhile (`unwatch` when it ended).
    pub fn watch(&self) {
        self.active.fetch_add(1, Ordering::AcqRel);
    }

    pub fn unwatch(&self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn begun(&self, id: u64) {
        let mut st = lock(&self.state);
        if !st.active.contains(&id) {
            st.active.push(id);
            st.pools.entry(id).or_default();
            self.active.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub fn ended(&self, id: u64) {
        let mut st = lock(&self.state);
        if let Some(i) = st.active.iter().position(|&c| c == id) {
            st.active.swap_remove(i);
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub fn is_active(&self, id: u64) -> bool {
        lock(&self.state).active.contains(&id)
    }

    /// Memory freed earlier in capture `id` on `stream` of exactly `class`
    /// bytes, now live again.
    pub fn take(&self, id: u64, stream: RawStream, class: u64) -> Option<u64> {
        let mut st = lock(&self.state);
        let pool = st.pools.get_mut(&id)?;
        let i = pool.free.iter().position(|&(s, _, bytes)| s == stream && bytes == class)?;
        let (_, ptr, bytes) = pool.free.swap_remove(i);
        pool.free_bytes -= bytes;
        pool.live += 1;
        Some(ptr)
    }

    /// New memory taken for a live block of capture `id`.
    pub fn add_live(&self, id: u64) {
        lock(&self.state).pools.entry(id).or_default().live += 1;
    }

    /// Memory freed into capture `id`'s pool; `was_live_here` when it was
    /// a block of that capture (rather than an ordinary block parked).
    /// Returns whether that made an orphaned pool ready to give back.
    pub fn put(&self, id: u64, stream: RawStream, ptr: u64, bytes: u64, was_live_here: bool) -> bool {
        let mut st = lock(&self.state);
        let pool = st.pools.entry(id).or_default();
        if was_live_here {
            pool.live = pool.live.saturating_sub(1);
        }
        pool.free.push((stream, ptr, bytes));
        pool.free_bytes += bytes;
        pool.ready()
    }

    /// No graph uses capture `id`'s memory any more (its announcement was
    /// released): it goes back once no block of it is live. False when
    /// there is no such pool (never allocated in, or released already).
    pub fn orphan(&self, id: u64) -> bool {
        match lock(&self.state).pools.get_mut(&id) {
            Some(pool) => {
                pool.orphaned = true;
                true
            }
            None => false,
        }
    }

    /// Orphaned pools whose capture ended and whose blocks are all free,
    /// taken out: (capture id, its memory as (pointer, bytes)).
    pub fn take_ready_orphans(&self) -> Vec<(u64, Vec<(u64, u64)>)> {
        let mut st = lock(&self.state);
        let State { active, pools } = &mut *st;
        let ready: Vec<u64> = pools.iter().filter(|(id, p)| p.ready() && !active.contains(id)).map(|(id, _)| *id).collect();
        ready
            .into_iter()
            .map(|id| {
                let pool = pools.remove(&id).expect("listed above");
                (id, pool.free.into_iter().map(|(_, ptr, bytes)| (ptr, bytes)).collect())
            })
            .collect()
    }

    /// Free bytes of every pool (they count as cached).
    pub fn free_bytes(&self) -> u64 {
        lock(&self.state).pools.values().map(|p| p.free_bytes).sum()
    }

    /// Take capture `id`'s pool out for release: its free memory, or why
    /// not (still active, live blocks, unknown).
    pub fn take_for_release(&self, id: u64) -> Result<Vec<(u64, u64)>, String> {
        let mut st = lock(&self.state);
        if st.active.contains(&id) {
            return Err(format!("capture {id} is still capturing: end it (xlog_capture_end) first"));
        }
        let Some(pool) = st.pools.get(&id) else {
            return Err(format!("capture {id} has no memory here (never begun through this runtime, or released already)"));
        };
        if pool.live > 0 {
            return Err(format!(
                "capture {id} still has {} live block(s): free them before releasing its memory",
                pool.live
            ));
        }
        let pool = st.pools.remove(&id).expect("looked up above");
        Ok(pool.free.into_iter().map(|(_, ptr, bytes)| (ptr, bytes)).collect())
    }

    /// Every pool's free memory, taken out (close).
    pub fn take_all(&self) -> Vec<(u64, u64)> {
        let mut st = lock(&self.state);
        let State { active, pools } = &mut *st;
        let mut out = Vec::new();
        for pool in pools.values_mut() {
            out.extend(pool.free.drain(..).map(|(_, ptr, bytes)| (ptr, bytes)));
            pool.free_bytes = 0;
        }
        pools.retain(|id, p| p.live > 0 || active.contains(id));
        out
    }
}
