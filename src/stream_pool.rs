//! Bounded pool of streams, plus foreign streams imported by native handle.
//!
//! Ids come from one process-wide counter: never reused, never 0, and an id
//! issued by one runtime is unknown to every other. A released pooled
//! stream goes back to the idle list and is handed out again under a new id.
//!
//! Ids are `uint32_t` in the C ABI, so the supply is finite: once ids
//! 1..=u32::MAX-1 have all been issued (about 4.3 billion acquires and
//! imports in one process), acquire and import fail with `Exhausted`
//! (XLOG_ERR_POOL_EXHAUSTED) instead of wrapping around to an id that a
//! caller may still hold. u32::MAX is never issued.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

use crate::device::{Device, RawStream};
use crate::fast_hash::FastMap;
use crate::registry::{Memo, Registry};
use crate::resource::{ResourceError, ResourceResult, StreamId, StreamRef};

/// The next id to issue; `u32::MAX` once every id has been issued (it then
/// stays there).
static NEXT_STREAM_ID: AtomicU32 = AtomicU32::new(1);

fn next_id() -> ResourceResult<StreamId> {
    let advance = |id: u32| (id < u32::MAX).then(|| id + 1);
    match NEXT_STREAM_ID.fetch_update(Ordering::Relaxed, Ordering::Relaxed, advance) {
        Ok(id) => Ok(StreamId(id)),
        Err(_) => Err(ResourceError::Exhausted(format!(
            "every stream id this process can issue (1..={}) has been issued, and ids are never \
             reused; no stream can be acquired or imported any more",
            u32::MAX - 1
        ))),
    }
}

/// Test support: make `id` the next stream id issued, so tests reach the
/// end of the id space without 4 billion acquires. Process-wide: only for
/// a test binary that runs nothing else meanwhile.
#[doc(hidden)]
pub fn set_next_stream_id_for_testing(id: u32) {
    NEXT_STREAM_ID.store(id.max(1), Ordering::Relaxed);
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Origin {
    Pooled,
    Imported { native: u64 },
}

#[derive(Copy, Clone)]
struct Entry {
    raw: RawStream,
    origin: Origin,
}

#[derive(Default)]
struct PoolState {
    active: FastMap<StreamId, Entry>,
    idle: Vec<RawStream>,
    created: Vec<RawStream>,
    pooled_in_use: u32,
    imported: FastMap<u64, StreamId>,
}

pub struct StreamPool {
    device: Arc<dyn Device>,
    capacity: u32,
    /// The pool's state; its epoch moves with every release and with
    /// shutdown, so a resolution a thread memoized is good only while no
    /// id it may name has died (`registry.rs`).
    state: Registry<PoolState>,
    /// This pool's identity in the per-thread memos, which serve every
    /// pool a thread uses.
    unique: u64,
}

/// Entries of the per-thread resolve memo.
const RESOLVE_CACHE: usize = 4;

thread_local! {
    /// The last streams this thread resolved, by (pool, id): resolving is
    /// on every allocate/prepare/finish, and a thread mostly works on a
    /// few streams.
    static RESOLVED: Memo<(u64, StreamId), RawStream, RESOLVE_CACHE> = const { Memo::new() };
    /// The last foreign stream this thread imported, by (pool, native
    /// handle): the framework hooks import theirs on every allocation.
    static IMPORTED: Memo<(u64, u64), StreamRef, 1> = const { Memo::new() };
}

/// What a pool holds, for stats and tests.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StreamPoolUsage {
    pub capacity: u32,
    pub in_use: u32,
    pub created: u32,
    pub imported: u32,
}

impl StreamPool {
    pub fn new(device: Arc<dyn Device>, capacity: u32) -> StreamPool {
        static NEXT_POOL: AtomicU64 = AtomicU64::new(1);
        let unique = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        StreamPool { device, capacity, state: Registry::new(PoolState::default), unique }
    }

    fn read(&self) -> RwLockReadGuard<'_, PoolState> {
        self.state.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, PoolState> {
        self.state.write()
    }

    /// A pooled stream: an idle one if any, else a new one while fewer than
    /// `capacity` exist, else `PoolExhausted`.
    pub fn acquire(&self) -> ResourceResult<StreamId> {
        let mut st = self.write();
        if st.pooled_in_use >= self.capacity {
            return Err(ResourceError::PoolExhausted { capacity: self.capacity });
        }
        // The id first: once ids are exhausted nothing else is touched.
        let id = next_id()?;
        let raw = match self.take_idle(&mut st) {
            Some(raw) => raw,
            None => {
                let raw = self.device.create_stream()?;
                st.created.push(raw);
                raw
            }
        };
        st.active.insert(id, Entry { raw, origin: Origin::Pooled });
        st.pooled_in_use += 1;
        Ok(id)
    }

    /// The most recently released idle stream that takes part in no
    /// capture, taken off the idle list. Release refuses a capturing
    /// stream, but a framework may begin a capture on a native stream
    /// behind the runtime's back (one it imported, which may be a pooled
    /// one), or join one into a capture by a wait: a stream the driver
    /// reports capturing (or cannot answer for) stays idle until its
    /// capture is over, so work queued by its next owner is never captured
    /// instead of run.
    fn take_idle(&self, st: &mut PoolState) -> Option<RawStream> {
        let usable = st.idle.iter().rposition(|&raw| matches!(self.device.capture_of(raw), Ok(None)))?;
        Some(st.idle.remove(usable))
    }

    /// `StreamMisuse`, naming the capture, while stream `id` (`raw`) takes
    /// part in a capture: releasing it would put a capturing stream back
    /// in the pool (and synchronizing or closing it would invalidate the
    /// capture).
    pub fn refuse_if_capturing(&self, id: StreamId, raw: RawStream, what: &str) -> ResourceResult<()> {
        match self.device.capture_of(raw)? {
            None => Ok(()),
            Some(capture) => Err(ResourceError::StreamMisuse(format!(
                "stream {id} takes part in capture {capture} (begun on it, or joined by a wait on work \
                 captured on another stream): {what} now would hand a capturing stream on, or \
                 invalidate the capture; end the capture first (xlog_capture_end, or the framework's \
                 own end of capture); nothing was changed"
            ))),
        }
    }

    /// The first stream of this pool (acquired, imported or idle) that
    /// takes part in a capture: (its description, the capture).
    pub fn first_capturing(&self) -> ResourceResult<Option<(String, u64)>> {
        let st = self.read();
        for (id, entry) in &st.active {
            if let Some(capture) = self.device.capture_of(entry.raw)? {
                return Ok(Some((format!("stream {id}"), capture)));
            }
        }
        for &raw in &st.idle {
            if let Some(capture) = self.device.capture_of(raw)? {
                return Ok(Some((format!("an idle pooled stream (native {:#x})", self.device.native_stream(raw)), capture)));
            }
        }
        Ok(None)
    }

    /// Give a stream back. Work already queued on it keeps running; the id
    /// is dead from now on. Refused (`StreamMisuse`, nothing changed) while
    /// the stream takes part in a capture.
    pub fn release(&self, id: StreamId) -> ResourceResult<()> {
        let mut st = self.write();
        let raw = st.active.get(&id).ok_or_else(|| ResourceError::unknown_stream(id))?.raw;
        // Under the write lock, so no acquire sees the stream meanwhile.
        self.refuse_if_capturing(id, raw, "releasing it")?;
        let entry = st.active.remove(&id).expect("looked up above");
        self.state.invalidate(&mut st);
        match entry.origin {
            Origin::Pooled => {
                st.idle.push(entry.raw);
                st.pooled_in_use -= 1;
            }
            Origin::Imported { native } => {
                st.imported.remove(&native);
            }
        }
        Ok(())
    }

    /// Adopt a foreign native stream; the same native handle maps to the
    /// same id until that id is released.
    pub fn import(&self, native: u64) -> ResourceResult<StreamId> {
        self.import_resolved(native).map(|s| s.id)
    }

    /// `import`, resolved: the id together with the stream resources order
    /// work on, so a caller that goes on to use the stream (the framework
    /// hooks' allocation) needs no second lookup through `resolve`.
    pub fn import_resolved(&self, native: u64) -> ResourceResult<StreamRef> {
        let known = IMPORTED.with(|memo| {
            self.state.resolve(
                memo,
                (self.unique, native),
                |st| st.imported.get(&native).and_then(|id| st.active.get(id).map(|e| StreamRef { id: *id, raw: e.raw })),
                |stream| *stream,
            )
        });
        if let Some(stream) = known {
            return Ok(stream);
        }
        let mut st = self.write();
        if let Some(&id) = st.imported.get(&native) {
            if let Some(e) = st.active.get(&id) {
                return Ok(StreamRef { id, raw: e.raw });
            }
        }
        let id = next_id()?;
        let raw = self.device.import_stream(native)?;
        st.active.insert(id, Entry { raw, origin: Origin::Imported { native } });
        st.imported.insert(native, id);
        Ok(StreamRef { id, raw })
    }

    /// Resolve a live id to the stream resources order work on.
    pub fn resolve(&self, id: StreamId) -> ResourceResult<StreamRef> {
        let raw = RESOLVED.with(|memo| {
            self.state.resolve(memo, (self.unique, id), |st| st.active.get(&id).map(|e| e.raw), |raw| *raw)
        });
        match raw {
            Some(raw) => Ok(StreamRef { id, raw }),
            None => Err(ResourceError::unknown_stream(id)),
        }
    }

    /// Whether `id` is a live imported (foreign) stream.
    pub fn is_imported(&self, id: StreamId) -> bool {
        self.read().active.get(&id).is_some_and(|e| matches!(e.origin, Origin::Imported { .. }))
    }

    pub fn native(&self, id: StreamId) -> ResourceResult<u64> {
        let s = self.resolve(id)?;
        Ok(self.device.native_stream(s.raw))
    }

    pub fn usage(&self) -> StreamPoolUsage {
        let st = self.read();
        StreamPoolUsage {
            capacity: self.capacity,
            in_use: st.pooled_in_use,
            created: st.created.len() as u32,
            imported: st.imported.len() as u32,
        }
    }

    /// The pooled streams acquired and not released, by id: (id, native
    /// handle). Imported streams are not among them: they are the caller's
    /// own native streams, adopted (the framework hooks import theirs and
    /// never release them).
    pub fn acquired(&self) -> Vec<(StreamId, u64)> {
        let st = self.read();
        let mut ids: Vec<(StreamId, u64)> = st
            .active
            .iter()
            .filter(|(_, e)| e.origin == Origin::Pooled)
            .map(|(id, e)| (*id, self.device.native_stream(e.raw)))
            .collect();
        ids.sort_unstable_by_key(|(id, _)| id.0);
        ids
    }

    /// Every stream work may be queued on: the ones we created and the
    /// imported ones still active.
    pub fn all_raw(&self) -> Vec<RawStream> {
        let st = self.read();
        let mut raws = st.created.clone();
        raws.extend(st.active.values().filter(|e| e.origin != Origin::Pooled).map(|e| e.raw));
        raws
    }

    /// Forget every id and destroy the streams this pool created. The
    /// caller has drained them first.
    pub fn shutdown(&self) -> ResourceResult<()> {
        let created = {
            let mut st = self.write();
            self.state.invalidate(&mut st);
            st.active.clear();
            st.imported.clear();
            st.idle.clear();
            st.pooled_in_use = 0;
            std::mem::take(&mut st.created)
        };
        let mut first_error = None;
        for raw in created {
            if let Err(e) = self.device.destroy_stream(raw) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
