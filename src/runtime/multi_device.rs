//! Several devices in one process: peer access between runtimes, and
//! blocks of one device used by streams of another.
//!
//! Contract (docs/design.md "Several devices"):
//! - **One runtime per device.** Each runtime keeps its own budget, pool,
//!   caches, stream pool and stats; nothing here merges them.
//! - **Peer access** is enabled once per pair with [`enable_peer_access`]
//!   (`xlog_enable_peer_access(rt_a, rt_b)`): both directions, idempotent,
//!   `UnsatisfiableDependency` naming both devices where the pair has no
//!   peer capability (`cuDeviceCanAccessPeer` = 0; on sim, a pair a test
//!   declared incapable). The runtimes remember each other (weakly: a
//!   closed peer is simply gone).
//! - **Cross-device uses** go through the ordinary calls: `prepare`,
//!   `finish`, `prepare_all`, `finish_all` on the runtime that owns the
//!   block (the block's device), with a stream id of a peer runtime.
//!   Stream ids are issued process-wide and never reused, so an id names
//!   one stream of one runtime. The runtime reaches this module only when
//!   its own stream pool does not know the id (the error branch of its
//!   resolve), so single-device calls pay nothing for it.
//! - A stream id of a runtime of *another device* without peer access is
//!   `UnsatisfiableDependency` naming both devices; an id no live runtime
//!   knows, or one of another runtime of the same device (independent sim
//!   runtimes), keeps the single-device error (`InvalidArgument`).
//! - **How the block's state tracks a foreign stream.** For each foreign
//!   stream F (of device B) that touches blocks of device A, A keeps a
//!   *bridge*: a stream P of device A that stands for F in A's tracking,
//!   and two reusable events, one of A (recorded on P) and one of B
//!   (recorded on F). The pool sees P as one more stream of A, so its rules
//!   (same-stream uses need no wait, a free waits for every reader, the
//!   first foreign use waits for the allocation) apply unchanged:
//!   - prepare: the pool queues the block's waits on P, then F waits on an
//!     event recorded on P after them (a GPU-side wait across devices:
//!     `cuStreamWaitEvent` accepts an event of another context);
//!   - finish: an event recorded on F after the work, P waits on it, and
//!     the pool records its use event on P, which therefore completes only
//!     after F's work. A's free (on the block's allocation stream) waits on
//!     that event, so it waits for B's readers and writers.
//!
//!   The bridge's events are re-recorded on every use: a wait captures the
//!   record current when it is queued, so one pair per bridge suffices; the
//!   bridge's lock keeps a record and its wait together.
//! - **Handles of another device or runtime.** A block handle whose
//!   `device` is not this runtime's ordinal, refused by the table, is
//!   reported as `InvalidArgument` naming both devices; one of this device
//!   live in another open runtime (independent sim runtimes of one
//!   ordinal) as `InvalidArgument` naming that runtime's device; only a
//!   handle no open runtime holds is a use after free
//!   (`explain_block_error`).
//! - Closing a runtime synchronises and destroys its bridges; a peer's
//!   close leaves them valid (they hold the peer device, not its runtime).
//!
//! Locks: a bridge's lock is taken before the pool's locks (never the other
//! way round); the directory and peer lists are taken alone. The peer's
//! lifecycle lock is taken shared, without blocking, as every call does.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};

use crate::device::{Device, RawEvent, RawStream};
use crate::fast_hash::FastMap;
use crate::resource::{BlockId, BlockUse, ResourceError, ResourceResult, StreamId, StreamRef};
use super::Runtime;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every runtime opened in this process (weakly), for naming the device of
/// a stream id on the error path.
fn directory() -> MutexGuard<'static, Vec<Weak<Runtime>>> {
    static DIRECTORY: OnceLock<Mutex<Vec<Weak<Runtime>>>> = OnceLock::new();
    lock(DIRECTORY.get_or_init(Mutex::default))
}

/// A runtime was opened (or opened again: CUDA shares one per ordinal).
pub(crate) fn register(rt: &Arc<Runtime>) {
    let mut dir = directory();
    dir.retain(|w| w.strong_count() > 0);
    if !dir.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(rt))) {
        dir.push(Arc::downgrade(rt));
    }
}

/// The open runtime other than `me` whose stream pool knows `id`.
fn owner_of(me: &Runtime, id: StreamId) -> Option<Arc<Runtime>> {
    let candidates: Vec<Arc<Runtime>> = directory().iter().filter_map(Weak::upgrade).collect();
    candidates.into_iter().find(|rt| !std::ptr::eq(&**rt, me) && !rt.is_closed() && rt.knows_stream(id))
}

/// A stream of a peer device standing in this device's tracking.
struct Bridge {
    /// A stream of this (the block's) device that stands for the foreign
    /// stream in the pool's tracking.
    proxy: RawStream,
    /// The foreign stream's device (events recorded on it come from it).
    peer_device: Arc<dyn Device>,
    /// (event of this device, recorded on `proxy`; event of the peer,
    /// recorded on the foreign stream), held together with the lock.
    events: Mutex<(RawEvent, RawEvent)>,
}

/// Per-runtime state of this module (a field of `Runtime`).
#[derive(Default)]
pub(crate) struct PeerLinks {
    /// Runtimes with peer access to this one.
    peers: RwLock<Vec<Weak<Runtime>>>,
    /// Bridges by the foreign stream's native handle (unique in the
    /// process on both backends while the stream lives).
    bridges: Mutex<FastMap<u64, Arc<Bridge>>>,
}

impl PeerLinks {
    fn has_peer(&self, other: &Runtime) -> bool {
        self.peers.read().unwrap_or_else(|p| p.into_inner()).iter().any(|w| std::ptr::eq(w.as_ptr(), other))
    }

    fn add_peer(&self, other: &Arc<Runtime>) {
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        peers.retain(|w| w.strong_count() > 0);
        if !peers.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(other))) {
            peers.push(Arc::downgrade(other));
        }
    }

    /// The open peer whose stream pool knows `id`, with the stream.
    fn peer_with_stream(&self, id: StreamId) -> Option<Arc<Runtime>> {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        peers.iter().filter_map(Weak::upgrade).find(|rt| !rt.is_closed() && rt.knows_stream(id))
    }

    /// The bridge for `foreign` (a stream of `peer`), made on first use.
    fn bridge(&self, own: &Arc<dyn Device>, peer: &Runtime, foreign: StreamRef) -> ResourceResult<Arc<Bridge>> {
        let key = peer.device().native_stream(foreign.raw);
        if let Some(b) = lock(&self.bridges).get(&key) {
            return Ok(b.clone());
        }
        let proxy = own.create_stream()?;
        let made = (|| -> ResourceResult<(RawEvent, RawEvent)> {
            let on_block_device = own.create_event()?;
            match peer.device().create_event() {
                Ok(on_peer) => Ok((on_block_device, on_peer)),
                Err(e) => {
                    own.destroy_event(on_block_device);
                    Err(e.into())
                }
            }
        })();
        let events = match made {
            Ok(events) => events,
            Err(e) => {
                let _ = own.destroy_stream(proxy);
                return Err(e);
            }
        };
        let bridge =
            Arc::new(Bridge { proxy, peer_device: peer.device().clone(), events: Mutex::new(events) });
        let mut bridges = lock(&self.bridges);
        // Another thread may have made one meanwhile: keep the first.
        if let Some(b) = bridges.get(&key) {
            let kept = b.clone();
            drop(bridges);
            destroy_bridge(own, &bridge);
            return Ok(kept);
        }
        bridges.insert(key, bridge.clone());
        Ok(bridge)
    }

    /// Close: wait for every bridge's queued work, then destroy them.
    pub(crate) fn shutdown(&self, own: &Arc<dyn Device>) {
        let bridges: Vec<Arc<Bridge>> = lock(&self.bridges).drain().map(|(_, b)| b).collect();
        for b in &bridges {
            let _ = own.synchronize_stream(b.proxy);
            destroy_bridge(own, b);
        }
        self.peers.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Bridges made so far (tests and stats).
    pub(crate) fn bridge_count(&self) -> usize {
        lock(&self.bridges).len()
    }
}

fn destroy_bridge(own: &Arc<dyn Device>, b: &Bridge) {
    let (on_block_device, on_peer) = *lock(&b.events);
    own.destroy_event(on_block_device);
    b.peer_device.destroy_event(on_peer);
    let _ = own.destroy_stream(b.proxy);
}

fn describe(rt: &Runtime) -> String {
    format!("device {} ({})", rt.device().ordinal(), rt.device().name())
}

/// Give `a` and `b` (runtimes of two devices) access to each other's
/// memory and let each use the other's streams on its blocks.
pub fn enable_peer_access(a: &Arc<Runtime>, b: &Arc<Runtime>) -> ResourceResult<()> {
    if Arc::ptr_eq(a, b) {
        return Err(ResourceError::InvalidArgument(format!(
            "peer access needs two runtimes; both handles are the runtime of {}",
            describe(a)
        )));
    }
    for rt in [a, b] {
        if rt.is_closed() {
            return Err(ResourceError::InvalidArgument("the runtime has been closed".into()));
        }
    }
    let (da, db) = (a.device(), b.device());
    if da.backend() != db.backend() {
        return Err(ResourceError::InvalidArgument(format!(
            "peer access between a {} runtime ({}) and a {} runtime ({}) is not possible",
            da.backend().name(),
            describe(a),
            db.backend().name(),
            describe(b)
        )));
    }
    if da.ordinal() == db.ordinal() {
        return Err(ResourceError::InvalidArgument(format!(
            "peer access needs two devices; both runtimes are of device {}",
            da.ordinal()
        )));
    }
    if a.peers().has_peer(b) && b.peers().has_peer(a) {
        return Ok(());
    }
    if !da.can_access_peer(&**db)? || !db.can_access_peer(&**da)? {
        return Err(ResourceError::UnsatisfiableDependency(format!(
            "{} and {} have no peer access to each other (cuDeviceCanAccessPeer reports 0 for the \
             pair): a block of one cannot be used by streams of the other; copy it instead",
            describe(a),
            describe(b)
        )));
    }
    da.enable_peer_access(&**db)?;
    db.enable_peer_access(&**da)?;
    // The arena's pages need the peer in their access lists.
    a.allocator.grant_peer(db.ordinal())?;
    b.allocator.grant_peer(da.ordinal())?;
    a.peers().add_peer(b);
    b.peers().add_peer(a);
    Ok(())
}

/// The error for stream `id`, unknown to `rt`'s own pool: an open runtime
/// of another device owns it but has no peer access with `rt`
/// (`UnsatisfiableDependency` naming both), or else `original`.
fn unknown_stream(rt: &Runtime, id: StreamId, original: ResourceError) -> ResourceError {
    match owner_of(rt, id) {
        Some(other) if other.device().ordinal() != rt.device().ordinal() => {
            ResourceError::UnsatisfiableDependency(format!(
                "stream {id} is a stream of {}, and the blocks are on {}: the two devices have no \
                 peer access (call xlog_enable_peer_access(rt_of_device_{}, rt_of_device_{}) first; \
                 it fails where the hardware cannot give it)",
                describe(&other),
                describe(rt),
                rt.device().ordinal(),
                other.device().ordinal()
            ))
        }
        _ => original,
    }
}

/// Run `f` with the peer runtime that owns `stream`, its stream and the
/// bridge for it; `original` is `rt`'s own error for the id.
fn with_bridge(
    rt: &Runtime,
    stream: StreamId,
    original: ResourceError,
    f: impl FnOnce(&Runtime, StreamRef, &Bridge) -> ResourceResult<()>,
) -> ResourceResult<()> {
    let Some(peer) = rt.peers().peer_with_stream(stream) else {
        return Err(unknown_stream(rt, stream, original));
    };
    peer.with_stream(stream, |foreign| {
        let bridge = rt.peers().bridge(rt.device(), &peer, foreign)?;
        f(&peer, foreign, &bridge)
    })
}

/// `prepare_all` on `rt` (the blocks' runtime) with `stream` of a peer.
#[cold]
#[inline(never)]
pub(crate) fn prepare_all(rt: &Runtime, stream: StreamId, uses: &[BlockUse], original: ResourceError) -> ResourceResult<()> {
    with_bridge(rt, stream, original, |peer, foreign, bridge| {
        let events = lock(&bridge.events);
        let proxy = StreamRef { id: stream, raw: bridge.proxy };
        rt.resource().prepare_block_uses(proxy, uses)?;
        rt.device().record_event(events.0, bridge.proxy)?;
        peer.device().stream_wait_event(foreign.raw, events.0)?;
        Ok(())
    })
}

/// `finish_all` on `rt` (the blocks' runtime) with `stream` of a peer.
#[cold]
#[inline(never)]
pub(crate) fn finish_all(rt: &Runtime, stream: StreamId, uses: &[BlockUse], original: ResourceError) -> ResourceResult<()> {
    with_bridge(rt, stream, original, |peer, foreign, bridge| {
        // A stale handle fails in the pool below; the record and the wait
        // queued before it change nothing anyone can see (a private event,
        // a wait that only delays the bridge's own stream).
        let events = lock(&bridge.events);
        peer.device().record_event(events.1, foreign.raw)?;
        rt.device().stream_wait_event(bridge.proxy, events.1)?;
        let proxy = StreamRef { id: stream, raw: bridge.proxy };
        rt.resource().finish_block_uses(proxy, uses)
    })
}

/// The open runtime other than `me` in whose table `block` is live.
/// Generations are unique in the process, so there is at most one.
fn runtime_holding(me: &Runtime, block: &BlockId) -> Option<Arc<Runtime>> {
    let candidates: Vec<Arc<Runtime>> = directory().iter().filter_map(Weak::upgrade).collect();
    candidates.into_iter().find(|rt| !std::ptr::eq(&**rt, me) && rt.holds_block(block))
}

/// A block handle whose generation `rt`'s table does not hold, explained:
/// one that names another device is an `InvalidArgument` naming both
/// devices, instead of the table's "not live here"; one of this device
/// that another open runtime holds live (on sim every open makes its own
/// runtime) is an `InvalidArgument` naming that runtime, not a use after
/// free. A handle no open runtime holds keeps the table's error, and so
/// does every other refusal (a live generation with forged fields).
#[cold]
#[inline(never)]
pub(crate) fn explain_block_error(rt: &Runtime, block: &BlockId, e: ResourceError) -> ResourceError {
    // Only a generation this runtime does not hold is explained: one it
    // holds with other fields (a forged handle) keeps the table's message.
    if !matches!(e, ResourceError::UseAfterFree { .. }) {
        return e;
    }
    let own = rt.device().ordinal();
    if block.device != own {
        return ResourceError::InvalidArgument(format!(
            "block generation {} (ptr {:#x}) is a block of device {}, but this is the runtime of device \
             {own}: pass a block to the runtime of its own device",
            block.generation, block.ptr, block.device
        ));
    }
    match runtime_holding(rt, block) {
        Some(owner) => ResourceError::InvalidArgument(format!(
            "block generation {} (ptr {:#x}) is a live block of another runtime of {} (an \
             independent runtime, as each sim open makes), not of this runtime of {}: pass a block \
             to the runtime that allocated it",
            block.generation,
            block.ptr,
            describe(&owner),
            describe(rt)
        )),
        None => e,
    }
}

/// `explain_block_error` for a launch, applied to the use the error is
/// about (the one whose generation it names).
#[cold]
#[inline(never)]
pub(crate) fn explain_uses_error(rt: &Runtime, uses: &[BlockUse], e: ResourceError) -> ResourceError {
    let names = |g: u64| match &e {
        ResourceError::UseAfterFree { generation, .. } => generation.0 == g,
        ResourceError::InvalidArgument(m) => m.contains(&format!("generation {g} ")),
        _ => false,
    };
    match uses.iter().find(|u| names(u.block.generation.0)) {
        Some(u) => explain_block_error(rt, &u.block, e),
        None => e,
    }
}
