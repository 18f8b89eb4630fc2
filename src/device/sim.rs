//! The sim backend: a host-simulated device, the embedded default where no
//! GPU or driver is present and the bed every test runs on.
//!
//! - Memory is real host memory (one arena, zero-filled and committed lazily
//!   by the OS), so host callbacks can read and write blocks.
//! - The heap is best-fit over free ranges, lowest address first, and a freed
//!   range is merged back the moment its stream reaches the free: addresses
//!   are reused eagerly, which is what stale-handle tests need.
//! - Each stream is a FIFO run by its own worker thread, so streams really
//!   run concurrently and a missing wait shows up as a race.
//! - Events complete when the worker passes them; a wait captures the
//!   event's latest record at enqueue time, as `cuStreamWaitEvent` does.
//! - Fault injection: fail the Nth subsequent alloc, free, event record or
//!   stream creation.
//! - Several devices: event handles name their device's instance, so a
//!   stream of one sim device can wait on another's event, as on CUDA; the
//!   process-wide part (device count, live devices, peer capability) is
//!   `sim_platform.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, ThreadId};

use super::faults::Faults;
use super::sim_platform;
use super::sim_capture::{SimCaptures, WaitKind};
pub(crate) use super::sim_vm::Claim;
use super::sim_vm::{SimVm, SIM_VM_GRANULARITY, SIM_VM_REGION_BYTES, SIM_VM_REGION_MAX};
use super::{Backend, CaptureMode, Device, DevicePtr, DeviceResult, HostCallbackScope, HostFn, PhysHandle, RawEvent, RawStream};
use crate::error::DeviceError;

/// The fault kinds (kept at this path for existing users such as the C ABI's
/// `xlog_sim_inject_fault`); the counters are shared with the CUDA backend.
pub use super::faults::FaultKind;

/// Alignment of every sim allocation (CUDA guarantees at least 256).
pub const SIM_ALIGNMENT: u64 = super::GRANULARITY;


/// A sim stream's native handle is `NATIVE_TAG | instance << 16 | raw`:
/// the 16-bit tag marks it as a sim handle, the 32-bit process-unique
/// device instance tells this device's streams from another sim device's,
/// and `raw` (16 bits) is the stream. Instances are never reused, so two
/// sim devices alive at once never share one; once 2^32 - 1 sim devices
/// have been created in a process, creating another fails (`Exhausted`)
/// rather than reuse an instance. A device makes at most 2^16 - 1 streams.
const NATIVE_TAG: u64 = 0x51A0_0000_0000_0000;
const NATIVE_TAG_MASK: u64 = 0xFFFF_0000_0000_0000;
const NATIVE_RAW_BITS: u32 = 16;
const MAX_RAW_STREAM: u64 = (1 << NATIVE_RAW_BITS) - 1;
const MAX_INSTANCE: u64 = u32::MAX as u64;
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// Test support: make `instance` the next sim device instance, so tests
/// reach the end of the instance space without 4 billion opens.
/// Process-wide: only for a test binary that runs nothing else meanwhile.
#[doc(hidden)]
pub fn set_next_instance_for_testing(instance: u64) {
    NEXT_INSTANCE.store(instance.max(1), Ordering::Relaxed);
}

/// A sim event handle is `instance << EVENT_INDEX_BITS | index` (index
/// from 1), so every event of the process names its device.
const EVENT_INDEX_BITS: u32 = 32;
const EVENT_INDEX_MASK: u64 = (1 << EVENT_INDEX_BITS) - 1;

/// Default bound on the foreign streams one sim device imports (each is a
/// worker thread until the device is dropped); the runtime sets it to its
/// stream pool size.
const DEFAULT_FOREIGN_STREAM_LIMIT: u32 = 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a host callback panicked while the sim held it;
    // the sim's own invariants are restored before any call that can panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Best-fit heap over the arena, in offsets from the arena base.
#[derive(Default)]
struct Heap {
    free_by_offset: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
    allocated: HashMap<u64, u64>,
    used: u64,
}

impl Heap {
    fn new(capacity: u64) -> Heap {
        let mut heap = Heap::default();
        if capacity > 0 {
            heap.insert_free(0, capacity);
        }
        heap
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.insert(offset, len);
        self.free_by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.free_by_offset.remove(&offset);
        self.free_by_size.remove(&(len, offset));
    }

    fn largest_free(&self) -> u64 {
        self.free_by_size.iter().next_back().map(|&(len, _)| len).unwrap_or(0)
    }

    fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let len = bytes.checked_add(SIM_ALIGNMENT - 1)? / SIM_ALIGNMENT * SIM_ALIGNMENT;
        let &(free_len, offset) = self.free_by_size.range((len, 0)..).next()?;
        self.remove_free(offset, free_len);
        if free_len > len {
            self.insert_free(offset + len, free_len - len);
        }
        self.allocated.insert(offset, len);
        self.used += len;
        Some(offset)
    }

    fn free(&mut self, offset: u64) -> bool {
        let Some(len) = self.allocated.remove(&offset) else {
            return false;
        };
        self.used -= len;
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&prev, &prev_len)) = self.free_by_offset.range(..start).next_back() {
            if prev + prev_len == start {
                self.remove_free(prev, prev_len);
                start = prev;
            }
        }
        if let Some(&next_len) = self.free_by_offset.get(&end) {
            self.remove_free(end, next_len);
            end += next_len;
        }
        self.insert_free(start, end - start);
        true
    }
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    /// Every epoch up to here has completed.
    completed_through: u64,
    /// Epochs above `completed_through` that completed early: records of one
    /// event on different streams complete out of order.
    completed_early: BTreeSet<u64>,
}

impl EventState {
    fn is_complete(&self, epoch: u64) -> bool {
        epoch <= self.completed_through || self.completed_early.contains(&epoch)
    }
}

#[derive(Default)]
struct SimEvent {
    state: Mutex<EventState>,
    changed: Condvar,
}

impl SimEvent {
    fn complete(&self, epoch: u64) {
        let mut st = lock(&self.state);
        st.completed_early.insert(epoch);
        loop {
            let next = st.completed_through + 1;
            if !st.completed_early.remove(&next) {
                break;
            }
            st.completed_through = next;
        }
        drop(st);
        self.changed.notify_all();
    }

    fn wait_for(&self, epoch: u64) {
        let mut st = lock(&self.state);
        while !st.is_complete(epoch) {
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

enum Task {
    Host(HostFn),
    Record(Arc<SimEvent>, u64),
    Wait(Arc<SimEvent>, u64),
    Free(u64),
    Shutdown,
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    /// The worker is running a task it took out (for `stream_query`).
    busy: bool,
}

struct SimStream {
    queue: Mutex<Queue>,
    ready: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
    worker_id: Mutex<Option<ThreadId>>,
}

impl SimStream {
    fn push(&self, task: Task) {
        lock(&self.queue).tasks.push_back(task);
        self.ready.notify_one();
    }
}

struct Shared {
    heap: Mutex<Heap>,
}

fn run_worker(stream: Arc<SimStream>, shared: Arc<Shared>) {
    loop {
        let task = {
            let mut q = lock(&stream.queue);
            q.busy = false;
            loop {
                if let Some(t) = q.tasks.pop_front() {
                    q.busy = true;
                    break t;
                }
                q = stream.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        match task {
            Task::Host(f) => {
                // A panicking callback must not kill the stream: the rest of
                // its queue (frees, event records) still has to run.
                let _in_callback = HostCallbackScope::enter();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                    eprintln!("xlog sim: a host callback panicked; the stream continues");
                }
            }
            Task::Record(ev, epoch) => ev.complete(epoch),
            Task::Wait(ev, epoch) => ev.wait_for(epoch),
            Task::Free(offset) => {
                lock(&shared.heap).free(offset);
            }
            Task::Shutdown => return,
        }
    }
}

#[derive(Default)]
struct Streams {
    /// Index = raw handle - 1; None once destroyed.
    slots: Vec<Option<Arc<SimStream>>>,
    /// Foreign native handle → raw stream made for it.
    imported: HashMap<u64, RawStream>,
}

/// The host-simulated device.
pub struct SimDevice {
    ordinal: i32,
    arena: Box<[AtomicU8]>,
    /// Arena offset of the first 256-aligned byte.
    align_pad: u64,
    capacity: u64,
    /// Bytes of the heap's arena (the capacity).
    heap_len: u64,
    shared: Arc<Shared>,
    streams: Mutex<Streams>,
    events: Mutex<Vec<Arc<SimEvent>>>,
    faults: Faults,
    next_worker: AtomicU64,
    /// Calls that named a stream already destroyed (undefined behaviour on
    /// CUDA, where the handle may by then be another stream's).
    destroyed_stream_calls: AtomicU64,
    /// Whether a new stream takes the handle of a destroyed one
    /// (`reuse_destroyed_stream_handles`).
    reuse_handles: AtomicBool,
    /// Process-unique id of this sim device (for native stream handles).
    instance: u64,
    /// Most foreign native streams `import_stream` adopts (see
    /// `set_foreign_stream_limit`).
    foreign_stream_limit: std::sync::atomic::AtomicU32,
    /// Stream capture (`sim_capture.rs`).
    captures: Mutex<SimCaptures>,
    /// The virtual-memory model (`sim_vm.rs`). Lock order: the heap, then
    /// this. Shared with the checks `access_check` makes for streams.
    vm: Arc<Mutex<SimVm>>,
    /// What those checks found (`touch_faults`).
    touches: Arc<Touches>,
}

/// The outcome of the stream-ordered access checks (`access_check`).
#[derive(Default)]
struct Touches {
    faults: AtomicU64,
    first: Mutex<Option<String>>,
}

impl SimDevice {
    /// A sim device with `capacity` bytes of memory. The arena is reserved
    /// up front and committed by the OS only as it is touched.
    pub fn new(ordinal: i32, capacity: u64) -> DeviceResult<Arc<SimDevice>> {
        // The heap's arena is the whole capacity, reserved up front (and
        // committed as touched); a device the host cannot reserve is
        // refused at open.
        let heap_len = capacity;
        let len = usize::try_from(heap_len)
            .ok()
            .and_then(|c| c.checked_add(SIM_ALIGNMENT as usize))
            .ok_or_else(|| DeviceError::Invalid(format!("sim capacity {capacity} bytes does not fit in memory")))?;
        let arena = bytemuck::allocation::try_zeroed_slice_box::<AtomicU8>(len).map_err(|_| {
            DeviceError::OutOfMemory {
                requested: capacity,
                detail: format!("host could not reserve a {capacity}-byte sim arena"),
            }
        })?;
        let instance = NEXT_INSTANCE
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| (i <= MAX_INSTANCE).then_some(i + 1))
            .map_err(|_| {
                DeviceError::Exhausted(format!(
                    "this process has created {MAX_INSTANCE} sim devices; instances are never reused \
                     (a native stream handle names its device by instance), so no more can be created"
                ))
            })?;
        let addr = arena.as_ptr() as u64;
        let align_pad = (SIM_ALIGNMENT - addr % SIM_ALIGNMENT) % SIM_ALIGNMENT;
        let device = Arc::new(SimDevice {
            ordinal,
            arena,
            align_pad,
            capacity,
            heap_len,
            shared: Arc::new(Shared { heap: Mutex::new(Heap::new(heap_len)) }),
            streams: Mutex::new(Streams::default()),
            events: Mutex::new(Vec::new()),
            faults: Faults::default(),
            next_worker: AtomicU64::new(0),
            destroyed_stream_calls: AtomicU64::new(0),
            reuse_handles: AtomicBool::new(false),
            instance,
            foreign_stream_limit: std::sync::atomic::AtomicU32::new(DEFAULT_FOREIGN_STREAM_LIMIT),
            captures: Mutex::new(SimCaptures::default()),
            vm: Arc::default(),
            touches: Arc::default(),
        });
        sim_platform::register(&device);
        Ok(device)
    }

    /// Process-unique id of this device (never reused): native stream and
    /// event handles carry it.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bound the foreign native streams `import_stream` adopts: each one
    /// runs a worker thread until this device is dropped, so an engine
    /// importing a new handle per step would otherwise grow threads without
    /// limit. Importing one more distinct handle then fails with
    /// `Exhausted`; handles imported before (and this device's own streams)
    /// can always be imported again.
    pub fn set_foreign_stream_limit(&self, limit: u32) {
        self.foreign_stream_limit.store(limit, Ordering::Relaxed);
    }

    /// Foreign native streams imported so far (each has a worker thread).
    pub fn foreign_streams(&self) -> usize {
        lock(&self.streams).imported.len()
    }

    /// Device memory in use: the heap's allocations (freed ranges count
    /// until their stream reaches the free) and every physical allocation
    /// of the virtual-memory model.
    pub fn bytes_in_use(&self) -> u64 {
        let heap = lock(&self.shared.heap);
        heap.used + lock(&self.vm).physical
    }

    /// Physical memory created through the virtual-memory calls and not
    /// released (what `cuMemCreate` holds on a GPU).
    pub fn physical_bytes(&self) -> u64 {
        lock(&self.vm).physical
    }

    /// Address ranges reserved through the virtual-memory calls and not
    /// freed (`cuMemAddressReserve`).
    pub fn reservations(&self) -> usize {
        lock(&self.vm).reservations()
    }

    /// From now on, a new stream gets the handle of a destroyed one where
    /// there is one, as on CUDA, whose handles are addresses the driver
    /// hands out again (then `destroyed_stream_calls` cannot see a call
    /// that names the old stream: it reaches the new one). By default
    /// every stream gets a handle of its own.
    pub fn reuse_destroyed_stream_handles(&self, reuse: bool) {
        self.reuse_handles.store(reuse, Ordering::Relaxed);
    }

    /// Calls so far that named a stream after it was destroyed: on CUDA
    /// each is undefined behaviour (the handle may be another stream's by
    /// then), so xlog must make none.
    pub fn destroyed_stream_calls(&self) -> u64 {
        self.destroyed_stream_calls.load(Ordering::Relaxed)
    }

    /// The devices granted access to the mapping holding `ptr`
    /// (`vm_set_access`); empty where nothing is mapped.
    pub fn access_of(&self, ptr: DevicePtr) -> Vec<i32> {
        lock(&self.vm).access_of(ptr)
    }

    /// Host bytes behind the virtual-memory reservations (device memory on
    /// a GPU, host heap here): what a measurement of the runtime's own
    /// memory leaves out.
    pub fn vm_backing_bytes(&self) -> u64 {
        lock(&self.vm).backing_bytes()
    }

    /// Bytes mapped through `vm_map` now.
    pub fn mapped_bytes(&self) -> u64 {
        lock(&self.vm).mapped_bytes()
    }

    /// A check, to queue on a stream (`Runtime::enqueue_host`), that
    /// `[ptr, ptr + len)` is mapped and that this device was granted access
    /// to it: what a kernel touching a block there would need on a GPU,
    /// where a miss is an illegal-address fault. Queued in stream order,
    /// it runs when the work queued before it would (behind the host), so
    /// a replay can check the arena's mappings against the blocks' use. A
    /// failure is counted (`touch_faults`), not returned.
    /// With `claim`, the check also takes (or gives back) the physical
    /// bytes behind the block, so physical memory that serves two blocks at
    /// once in stream order (or a live block remapped) fails it too.
    pub(crate) fn access_check(&self, ptr: DevicePtr, len: u64, claim: Claim) -> HostFn {
        let (vm, touches, ordinal) = (self.vm.clone(), self.touches.clone(), self.ordinal);
        Box::new(move || {
            if let Err(e) = lock(&vm).check_and_claim(ptr, len, ordinal, claim) {
                touches.faults.fetch_add(1, Ordering::Relaxed);
                lock(&touches.first).get_or_insert_with(|| format!("{len} bytes at {ptr:#x}: {e}"));
            }
        })
    }

    /// How many `access_check`s failed so far, and the first one's
    /// message.
    pub fn touch_faults(&self) -> (u64, Option<String>) {
        (self.touches.faults.load(Ordering::Relaxed), lock(&self.touches.first).clone())
    }

    /// Fail the `nth` call of `kind` from now (1 = the next one). 0 disarms.
    /// (Infallible here; `Device::inject_fault` is the backend-neutral form.)
    pub fn inject_fault(&self, kind: FaultKind, nth: u64) {
        self.faults.arm(kind, nth);
    }

    fn base(&self) -> u64 {
        self.arena.as_ptr() as u64 + self.align_pad
    }

    /// Run `f` over the cells behind `[ptr, ptr + len)`: the heap's arena
    /// or a mapped part of a virtual-memory reservation.
    fn with_cells<R>(&self, ptr: DevicePtr, len: u64, f: impl FnOnce(&[AtomicU8]) -> R) -> DeviceResult<R> {
        let base = self.base();
        if let Some(found) = lock(&self.vm).cells(ptr, len) {
            let (cells, start) = found?;
            return Ok(f(&cells[start..start + len as usize]));
        }
        let bad = || DeviceError::Invalid(format!(
            "sim access of {len} bytes at {ptr:#x} is outside the arena [{base:#x}, {:#x}) and every reservation",
            base + self.heap_len
        ));
        let offset = ptr.checked_sub(base).ok_or_else(bad)?;
        let end = offset.checked_add(len).ok_or_else(bad)?;
        if end > self.heap_len {
            return Err(bad());
        }
        let start = (offset + self.align_pad) as usize;
        Ok(f(&self.arena[start..start + len as usize]))
    }

    /// Copy `data` into device memory at `ptr` (as a kernel would write).
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> DeviceResult<()> {
        self.with_cells(ptr, data.len() as u64, |cells| {
            for (cell, &b) in cells.iter().zip(data) {
                cell.store(b, Ordering::Relaxed);
            }
        })
    }

    /// Copy `len` bytes of device memory at `ptr` out.
    pub fn read(&self, ptr: DevicePtr, len: u64) -> DeviceResult<Vec<u8>> {
        self.with_cells(ptr, len, |cells| cells.iter().map(|c| c.load(Ordering::Relaxed)).collect())
    }

    /// Fill `len` bytes at `ptr` with `value`.
    pub fn fill(&self, ptr: DevicePtr, len: u64, value: u8) -> DeviceResult<()> {
        self.with_cells(ptr, len, |cells| {
            for cell in cells {
                cell.store(value, Ordering::Relaxed);
            }
        })
    }

    pub fn write_u64(&self, ptr: DevicePtr, value: u64) -> DeviceResult<()> {
        self.write(ptr, &value.to_le_bytes())
    }

    pub fn read_u64(&self, ptr: DevicePtr) -> DeviceResult<u64> {
        let b = self.read(ptr, 8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn stream(&self, raw: RawStream) -> DeviceResult<Arc<SimStream>> {
        let streams = lock(&self.streams);
        match raw.checked_sub(1).and_then(|i| streams.slots.get(i as usize)) {
            Some(Some(stream)) => Ok(stream.clone()),
            Some(None) => {
                self.destroyed_stream_calls.fetch_add(1, Ordering::Relaxed);
                Err(DeviceError::Invalid(format!("sim stream {raw} was destroyed")))
            }
            None => Err(DeviceError::Invalid(format!("sim stream {raw} does not exist"))),
        }
    }

    /// An event of this device.
    fn own_event(&self, raw: RawEvent) -> DeviceResult<Arc<SimEvent>> {
        let missing = || DeviceError::Invalid(format!("sim event {raw:#x} does not exist on sim device {} (instance {})", self.ordinal, self.instance));
        if raw >> EVENT_INDEX_BITS != self.instance {
            return Err(missing());
        }
        let events = lock(&self.events);
        (raw & EVENT_INDEX_MASK)
            .checked_sub(1)
            .and_then(|i| events.get(i as usize))
            .cloned()
            .ok_or_else(missing)
    }

    /// An event of this device or of another live sim device of the
    /// process (waits and queries may cross devices, see `sim_platform`).
    fn event(&self, raw: RawEvent) -> DeviceResult<Arc<SimEvent>> {
        let instance = raw >> EVENT_INDEX_BITS;
        if instance == self.instance {
            return self.own_event(raw);
        }
        match sim_platform::device(instance) {
            Some(other) => other.own_event(raw),
            None => Err(DeviceError::Invalid(format!(
                "sim event {raw:#x} belongs to no live sim device (instance {instance})"
            ))),
        }
    }

    fn spawn_stream(&self) -> DeviceResult<RawStream> {
        let stream = Arc::new(SimStream {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            worker: Mutex::new(None),
            worker_id: Mutex::new(None),
        });
        let n = self.next_worker.fetch_add(1, Ordering::Relaxed);
        let (s, shared) = (stream.clone(), self.shared.clone());
        let handle = thread::Builder::new()
            .name(format!("xlog-sim-{}-stream-{n}", self.ordinal))
            .spawn(move || run_worker(s, shared))
            .map_err(|e| DeviceError::Driver {
                call: "sim stream create",
                code: -1,
                name: format!("could not start worker thread: {e}"),
            })?;
        *lock(&stream.worker_id) = Some(handle.thread().id());
        *lock(&stream.worker) = Some(handle);
        let mut streams = lock(&self.streams);
        if streams.slots.len() as u64 >= MAX_RAW_STREAM {
            drop(streams);
            SimDevice::stop_stream(&stream);
            return Err(DeviceError::Exhausted(format!(
                "sim device {} has made {MAX_RAW_STREAM} streams, the most one sim device can make",
                self.ordinal
            )));
        }
        if self.reuse_handles.load(Ordering::Relaxed) {
            if let Some(i) = streams.slots.iter().position(Option::is_none) {
                streams.slots[i] = Some(stream);
                return Ok(i as RawStream + 1);
            }
        }
        streams.slots.push(Some(stream));
        Ok(streams.slots.len() as RawStream)
    }

    fn stop_stream(stream: &SimStream) {
        stream.push(Task::Shutdown);
        let handle = lock(&stream.worker).take();
        let own = *lock(&stream.worker_id) == Some(thread::current().id());
        if let (Some(h), false) = (handle, own) {
            let _ = h.join();
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        sim_platform::unregister(self.instance);
        let slots = std::mem::take(&mut lock(&self.streams).slots);
        for stream in slots.into_iter().flatten() {
            SimDevice::stop_stream(&stream);
        }
    }
}

impl Device for SimDevice {
    fn backend(&self) -> Backend {
        Backend::Sim
    }

    fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn name(&self) -> String {
        format!("xlog sim device {} ({} bytes)", self.ordinal, self.capacity)
    }

    fn mem_info(&self) -> DeviceResult<(u64, u64)> {
        Ok((self.capacity.saturating_sub(self.bytes_in_use()), self.capacity))
    }

    fn create_stream(&self) -> DeviceResult<RawStream> {
        if self.faults.hit(FaultKind::StreamCreate) {
            return Err(DeviceError::InjectedFault("sim stream creation".into()));
        }
        self.spawn_stream()
    }

    fn destroy_stream(&self, raw: RawStream) -> DeviceResult<()> {
        let stream = {
            let mut streams = lock(&self.streams);
            let slot = raw
                .checked_sub(1)
                .and_then(|i| streams.slots.get_mut(i as usize))
                .ok_or_else(|| DeviceError::Invalid(format!("sim stream {raw} does not exist")))?;
            slot.take().ok_or_else(|| DeviceError::Invalid(format!("sim stream {raw} already destroyed")))?
        };
        SimDevice::stop_stream(&stream);
        Ok(())
    }

    fn import_stream(&self, native: u64) -> DeviceResult<RawStream> {
        if native & NATIVE_TAG_MASK == NATIVE_TAG {
            let instance = (native & !NATIVE_TAG_MASK) >> NATIVE_RAW_BITS;
            if instance != self.instance {
                return Err(DeviceError::Invalid(format!(
                    "native stream {native:#x} belongs to another sim device (instance {instance}, this is {})",
                    self.instance
                )));
            }
            let raw = native & ((1 << NATIVE_RAW_BITS) - 1);
            self.stream(raw)?;
            return Ok(raw);
        }
        let limit = self.foreign_stream_limit.load(Ordering::Relaxed) as usize;
        let full = |imported: usize| {
            DeviceError::Exhausted(format!(
                "sim device {} already runs a worker thread for each of {imported} imported foreign \
                 streams, its limit (the runtime's stream_pool_size); {native:#x} is not imported \
                 (open the runtime with a larger pool, or import streams imported before)",
                self.ordinal
            ))
        };
        {
            let streams = lock(&self.streams);
            if let Some(&raw) = streams.imported.get(&native) {
                return Ok(raw);
            }
            if streams.imported.len() >= limit {
                return Err(full(streams.imported.len()));
            }
        }
        let raw = self.spawn_stream()?;
        let mut streams = lock(&self.streams);
        // Another thread may have imported the same handle (or the last
        // allowed one) meanwhile: keep the first mapping, so one native
        // stream has one sim stream, and never pass the limit.
        let outcome = match streams.imported.get(&native) {
            Some(&kept) => Ok(kept),
            None if streams.imported.len() >= limit => Err(full(streams.imported.len())),
            None => {
                streams.imported.insert(native, raw);
                return Ok(raw);
            }
        };
        drop(streams);
        self.destroy_stream(raw)?;
        outcome
    }

    fn native_stream(&self, raw: RawStream) -> u64 {
        NATIVE_TAG | self.instance << NATIVE_RAW_BITS | raw
    }

    fn synchronize_stream(&self, raw: RawStream) -> DeviceResult<()> {
        let stream = self.stream(raw)?;
        lock(&self.captures).refuse_if_capturing(raw, "synchronize")?;
        if *lock(&stream.worker_id) == Some(thread::current().id()) {
            return Err(DeviceError::Invalid(format!(
                "synchronize of sim stream {raw} from its own host callback would deadlock"
            )));
        }
        let (tx, rx) = mpsc::channel::<()>();
        stream.push(Task::Host(Box::new(move || {
            let _ = tx.send(());
        })));
        rx.recv().map_err(|_| DeviceError::Invalid(format!("sim stream {raw} stopped")))
    }

    fn enqueue_host(&self, raw: RawStream, f: HostFn) -> DeviceResult<()> {
        let stream = self.stream(raw)?;
        if lock(&self.captures).capture_of(raw).is_some() {
            // Part of the graph, which the sim does not launch.
            return Ok(());
        }
        stream.push(Task::Host(f));
        Ok(())
    }

    fn alloc_async(&self, bytes: u64, raw: RawStream) -> DeviceResult<DevicePtr> {
        self.stream(raw)?;
        lock(&self.captures).refuse_if_capturing(raw, "stream-ordered allocation")?;
        self.alloc_sync(bytes)
    }

    fn free_async(&self, ptr: DevicePtr, raw: RawStream) -> DeviceResult<()> {
        let stream = self.stream(raw)?;
        lock(&self.captures).refuse_if_capturing(raw, "stream-ordered free")?;
        let offset = self.offset_of_allocation(ptr)?;
        if self.faults.hit(FaultKind::Free) {
            return Err(DeviceError::InjectedFault(format!("sim free of {ptr:#x}")));
        }
        stream.push(Task::Free(offset));
        Ok(())
    }

    fn alloc_sync(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        if bytes == 0 {
            return Err(DeviceError::Invalid("sim allocation of 0 bytes".into()));
        }
        if self.faults.hit(FaultKind::Alloc) {
            return Err(DeviceError::InjectedFault(format!("sim allocation of {bytes} bytes")));
        }
        let mut heap = lock(&self.shared.heap);
        // Physical memory of the virtual-memory model takes capacity too.
        let physical = lock(&self.vm).physical;
        let fits = bytes.checked_add(heap.used).and_then(|t| t.checked_add(physical)).is_some_and(|t| t <= self.capacity);
        let offset = if fits { heap.alloc(bytes) } else { None };
        match offset {
            Some(offset) => Ok(self.base() + offset),
            None => Err(DeviceError::OutOfMemory {
                requested: bytes,
                detail: format!(
                    "sim capacity {} bytes, {} in use, {} physical, largest free range {} bytes",
                    self.capacity,
                    heap.used,
                    physical,
                    heap.largest_free()
                ),
            }),
        }
    }

    fn free_sync(&self, ptr: DevicePtr) -> DeviceResult<()> {
        let offset = self.offset_of_allocation(ptr)?;
        if self.faults.hit(FaultKind::Free) {
            return Err(DeviceError::InjectedFault(format!("sim free of {ptr:#x}")));
        }
        lock(&self.shared.heap).free(offset);
        Ok(())
    }

    fn supports_vm(&self) -> bool {
        true
    }

    fn vm_granularity(&self) -> u64 {
        SIM_VM_GRANULARITY
    }

    fn vm_region_bytes(&self) -> u64 {
        // The whole device, as on CUDA (the arena's layout, and so what it
        // maps step after step, depends on it), within bounds: a region is
        // host address space the OS commits only as it is touched.
        self.capacity.clamp(SIM_VM_REGION_BYTES, SIM_VM_REGION_MAX).div_ceil(SIM_VM_GRANULARITY) * SIM_VM_GRANULARITY
    }

    fn vm_reserve(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        lock(&self.vm).reserve(bytes)
    }

    fn vm_free(&self, base: DevicePtr, bytes: u64) -> DeviceResult<()> {
        lock(&self.vm).free(base, bytes)
    }

    fn vm_create(&self, bytes: u64) -> DeviceResult<PhysHandle> {
        if self.faults.hit(FaultKind::Alloc) {
            return Err(DeviceError::InjectedFault(format!("sim physical allocation of {bytes} bytes")));
        }
        let heap = lock(&self.shared.heap);
        let mut vm = lock(&self.vm);
        let room = self.capacity.saturating_sub(heap.used).saturating_sub(vm.physical);
        vm.create(bytes, room)
    }

    fn vm_release(&self, handle: PhysHandle) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Unmap) {
            return Err(DeviceError::InjectedFault(format!("sim release of physical allocation {handle:#x}")));
        }
        lock(&self.vm).release(handle)
    }

    fn vm_map(&self, va: DevicePtr, bytes: u64, handle: PhysHandle) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Map) {
            return Err(DeviceError::InjectedFault(format!("sim map of {bytes} bytes at {va:#x}")));
        }
        lock(&self.vm).map(va, bytes, handle)
    }

    fn vm_set_access(&self, va: DevicePtr, bytes: u64, ordinal: i32) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Map) {
            return Err(DeviceError::InjectedFault(format!("sim access grant of {bytes} bytes at {va:#x}")));
        }
        lock(&self.vm).set_access(va, bytes, ordinal)
    }

    fn vm_unmap(&self, va: DevicePtr, bytes: u64) -> DeviceResult<()> {
        if self.faults.hit(FaultKind::Unmap) {
            return Err(DeviceError::InjectedFault(format!("sim unmap of {bytes} bytes at {va:#x}")));
        }
        lock(&self.vm).unmap(va, bytes)
    }

    fn stream_query(&self, raw: RawStream) -> DeviceResult<bool> {
        let stream = self.stream(raw)?;
        let mut q = lock(&stream.queue);
        // With the worker idle, event records and satisfied waits at the
        // front of the queue are done here: a GPU passes them as soon as
        // the work before them is done, and the answer should not depend
        // on how soon the worker thread is scheduled.
        while !q.busy {
            match q.tasks.front() {
                Some(Task::Record(ev, epoch)) => {
                    ev.complete(*epoch);
                }
                Some(Task::Wait(ev, epoch)) if lock(&ev.state).is_complete(*epoch) => {}
                _ => break,
            }
            q.tasks.pop_front();
        }
        Ok(q.tasks.is_empty() && !q.busy)
    }

    fn create_event(&self) -> DeviceResult<RawEvent> {
        let mut events = lock(&self.events);
        if events.len() as u64 >= u32::MAX as u64 {
            return Err(DeviceError::Exhausted(format!(
                "sim device {} has made {} events, the most one sim device can make",
                self.ordinal,
                u32::MAX
            )));
        }
        events.push(Arc::new(SimEvent::default()));
        Ok(self.instance << EVENT_INDEX_BITS | events.len() as RawEvent)
    }

    fn destroy_event(&self, _event: RawEvent) {
        // Sim events are tiny; slots are kept so handles stay unambiguous.
    }

    fn record_event(&self, event: RawEvent, raw: RawStream) -> DeviceResult<()> {
        let stream = self.stream(raw)?;
        // Only this device's events: cuEventRecord needs the event's context.
        let ev = self.own_event(event)?;
        if self.faults.hit(FaultKind::EventRecord) {
            return Err(DeviceError::InjectedFault(format!("sim record of event {event}")));
        }
        if lock(&self.captures).record(event, raw) {
            return Ok(());
        }
        let epoch = {
            let mut st = lock(&ev.state);
            st.recorded += 1;
            st.recorded
        };
        // On an idle stream (nothing queued, the worker waiting) every
        // earlier piece of work is done: the record completes at once, as
        // it would on a GPU, whenever the worker thread gets to run.
        let mut q = lock(&stream.queue);
        if q.tasks.is_empty() && !q.busy {
            ev.complete(epoch);
        } else {
            q.tasks.push_back(Task::Record(ev, epoch));
            drop(q);
            stream.ready.notify_one();
        }
        Ok(())
    }

    fn stream_wait_event(&self, raw: RawStream, event: RawEvent) -> DeviceResult<()> {
        let stream = self.stream(raw)?;
        let ev = self.event(event)?;
        if let WaitKind::Captured = lock(&self.captures).wait(raw, event)? {
            return Ok(());
        }
        let epoch = {
            let st = lock(&ev.state);
            if st.is_complete(st.recorded) {
                // Nothing to wait for: the record already completed.
                return Ok(());
            }
            st.recorded
        };
        stream.push(Task::Wait(ev, epoch));
        Ok(())
    }

    fn event_query(&self, event: RawEvent) -> DeviceResult<bool> {
        let ev = self.event(event)?;
        lock(&self.captures).check_not_captured(event, "query")?;
        let st = lock(&ev.state);
        Ok(st.is_complete(st.recorded))
    }

    fn event_synchronize(&self, event: RawEvent) -> DeviceResult<()> {
        let ev = self.event(event)?;
        lock(&self.captures).check_not_captured(event, "synchronize")?;
        let epoch = lock(&ev.state).recorded;
        ev.wait_for(epoch);
        Ok(())
    }

    fn begin_capture(&self, stream: RawStream, _mode: CaptureMode) -> DeviceResult<()> {
        self.stream(stream)?;
        lock(&self.captures).begin(stream)
    }

    fn end_capture(&self, stream: RawStream) -> DeviceResult<u64> {
        self.stream(stream)?;
        lock(&self.captures).end(stream)
    }

    fn capture_of(&self, stream: RawStream) -> DeviceResult<Option<u64>> {
        Ok(lock(&self.captures).capture_of(stream))
    }

    fn as_sim(&self) -> Option<&SimDevice> {
        Some(self)
    }

    fn faults(&self) -> Option<&Faults> {
        Some(&self.faults)
    }

    fn can_access_peer(&self, peer: &dyn Device) -> DeviceResult<bool> {
        Ok(peer.as_sim().is_some_and(|p| sim_platform::can_access_peer(self, p)))
    }

    fn enable_peer_access(&self, peer: &dyn Device) -> DeviceResult<()> {
        let Some(p) = peer.as_sim() else {
            return Err(DeviceError::Invalid(format!(
                "sim device {} cannot enable peer access to the {} device {}",
                self.ordinal,
                peer.backend().name(),
                peer.ordinal()
            )));
        };
        if !sim_platform::can_access_peer(self, p) {
            return Err(DeviceError::Invalid(format!(
                "sim device {} (instance {}) cannot access the memory of sim device {} (instance {}): \
                 the pair has no peer capability",
                self.ordinal, self.instance, p.ordinal, p.instance
            )));
        }
        // Nothing to map: sim memory is host memory every device can touch.
        Ok(())
    }
}

impl SimDevice {
    fn offset_of_allocation(&self, ptr: DevicePtr) -> DeviceResult<u64> {
        let offset = ptr.checked_sub(self.base()).filter(|o| *o < self.heap_len);
        match offset {
            Some(o) if lock(&self.shared.heap).allocated.contains_key(&o) => Ok(o),
            _ => Err(DeviceError::Invalid(format!("{ptr:#x} is not a live sim allocation"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn heap_reuses_freed_address_and_coalesces() {
        let mut heap = Heap::new(4096);
        let a = heap.alloc(100).unwrap();
        let b = heap.alloc(300).unwrap();
        assert_eq!(a, 0);
        assert_eq!(b, 256);
        assert!(heap.free(a));
        assert_eq!(heap.alloc(200), Some(0), "freed address is reused eagerly");
        assert!(heap.free(0));
        assert!(heap.free(b));
        assert!(!heap.free(b), "double free is refused");
        assert_eq!(heap.used, 0);
        assert_eq!(heap.largest_free(), 4096, "ranges coalesce back into one");
    }

    #[test]
    fn alloc_is_aligned_and_capacity_is_enforced() {
        let sim = SimDevice::new(0, 1 << 20).unwrap();
        let p = sim.alloc_sync(1).unwrap();
        assert_eq!(p % SIM_ALIGNMENT, 0);
        let err = sim.alloc_sync(2 << 20).unwrap_err();
        assert!(matches!(err, DeviceError::OutOfMemory { requested, .. } if requested == 2 << 20));
        sim.free_sync(p).unwrap();
        assert!(sim.free_sync(p).is_err());
    }

    #[test]
    fn async_free_reuses_address_only_after_stream_reaches_it() {
        let sim = SimDevice::new(0, 1 << 16).unwrap();
        let s = sim.create_stream().unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        sim.enqueue_host(s, Box::new(move || {
            while !g.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
        }))
        .unwrap();
        let p = sim.alloc_async(1 << 15, s).unwrap();
        sim.free_async(p, s).unwrap();
        let q = sim.alloc_async(1 << 15, s).unwrap();
        assert_ne!(p, q, "memory freed in stream order is not reused before the stream gets there");
        gate.store(true, Ordering::Release);
        sim.synchronize_stream(s).unwrap();
        let r = sim.alloc_async(1 << 15, s).unwrap();
        assert_eq!(r, p);
    }

    #[test]
    fn events_order_streams() {
        let sim = SimDevice::new(0, 1 << 16).unwrap();
        let (a, b) = (sim.create_stream().unwrap(), sim.create_stream().unwrap());
        let ptr = sim.alloc_sync(8).unwrap();
        let ev = sim.create_event().unwrap();
        let sim2 = sim.clone();
        sim.enqueue_host(a, Box::new(move || {
            thread::sleep(Duration::from_millis(30));
            sim2.write_u64(ptr, 42).unwrap();
        }))
        .unwrap();
        sim.record_event(ev, a).unwrap();
        assert!(!sim.event_query(ev).unwrap());
        sim.stream_wait_event(b, ev).unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let (sim3, seen2) = (sim.clone(), seen.clone());
        sim.enqueue_host(b, Box::new(move || {
            seen2.store(sim3.read_u64(ptr).unwrap(), Ordering::Release);
        }))
        .unwrap();
        sim.synchronize_stream(b).unwrap();
        assert_eq!(seen.load(Ordering::Acquire), 42);
        assert!(sim.event_query(ev).unwrap());
    }

    #[test]
    fn rerecording_an_event_does_not_release_earlier_waits() {
        let sim = SimDevice::new(0, 1 << 16).unwrap();
        let (a, b, c) = (sim.create_stream().unwrap(), sim.create_stream().unwrap(), sim.create_stream().unwrap());
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        sim.enqueue_host(a, Box::new(move || {
            while !g.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
        }))
        .unwrap();
        let ev = sim.create_event().unwrap();
        sim.record_event(ev, a).unwrap();
        sim.stream_wait_event(b, ev).unwrap();
        let passed = Arc::new(AtomicBool::new(false));
        let p = passed.clone();
        sim.enqueue_host(b, Box::new(move || p.store(true, Ordering::Release))).unwrap();
        // The same event recorded again on an idle stream completes at once;
        // the wait queued on b still refers to the record on a.
        sim.record_event(ev, c).unwrap();
        sim.synchronize_stream(c).unwrap();
        thread::sleep(Duration::from_millis(30));
        assert!(!passed.load(Ordering::Acquire), "b passed a wait whose record on a has not run");
        gate.store(true, Ordering::Release);
        sim.synchronize_stream(b).unwrap();
        assert!(passed.load(Ordering::Acquire));
    }

    #[test]
    fn streams_wait_on_events_of_another_sim_device() {
        let (a, b) = (SimDevice::new(0, 1 << 16).unwrap(), SimDevice::new(1, 1 << 16).unwrap());
        let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        a.enqueue_host(sa, Box::new(move || {
            while !g.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
        }))
        .unwrap();
        let ev = a.create_event().unwrap();
        a.record_event(ev, sa).unwrap();
        // b's stream waits on a's event; b itself can query it.
        b.stream_wait_event(sb, ev).unwrap();
        assert!(!b.event_query(ev).unwrap());
        let passed = Arc::new(AtomicBool::new(false));
        let p = passed.clone();
        b.enqueue_host(sb, Box::new(move || p.store(true, Ordering::Release))).unwrap();
        thread::sleep(Duration::from_millis(30));
        assert!(!passed.load(Ordering::Acquire), "b's stream passed a wait on a's unfinished event");
        gate.store(true, Ordering::Release);
        b.synchronize_stream(sb).unwrap();
        assert!(passed.load(Ordering::Acquire));
        assert!(b.event_query(ev).unwrap());
        // Recording stays on the event's own device, as cuEventRecord needs.
        assert!(matches!(b.record_event(ev, sb), Err(DeviceError::Invalid(_))));
        // An event of a device that is gone is refused, not misread.
        let c = SimDevice::new(2, 1 << 16).unwrap();
        let gone = c.create_event().unwrap();
        drop(c);
        assert!(matches!(a.stream_wait_event(sa, gone), Err(DeviceError::Invalid(_))));
    }

    #[test]
    fn peer_capability_is_per_pair_until_a_test_denies_it() {
        let (a, b, c) = (
            SimDevice::new(0, 1 << 16).unwrap(),
            SimDevice::new(1, 1 << 16).unwrap(),
            SimDevice::new(2, 1 << 16).unwrap(),
        );
        assert!(a.can_access_peer(&*b).unwrap());
        assert!(!a.can_access_peer(&*a).unwrap(), "a device is not its own peer");
        sim_platform::deny_peer(&a, &b);
        assert!(!a.can_access_peer(&*b).unwrap() && !b.can_access_peer(&*a).unwrap());
        assert!(a.enable_peer_access(&*b).is_err());
        assert!(a.can_access_peer(&*c).unwrap(), "other pairs are untouched");
        a.enable_peer_access(&*c).unwrap();
        a.enable_peer_access(&*c).unwrap();
    }

    #[test]
    fn faults_fire_once_on_the_nth_call() {
        let sim = SimDevice::new(0, 1 << 16).unwrap();
        sim.inject_fault(FaultKind::Alloc, 2);
        assert!(sim.alloc_sync(8).is_ok());
        assert!(matches!(sim.alloc_sync(8), Err(DeviceError::InjectedFault(_))));
        assert!(sim.alloc_sync(8).is_ok());
        sim.inject_fault(FaultKind::StreamCreate, 1);
        assert!(sim.create_stream().is_err());
        assert!(sim.create_stream().is_ok());
    }

    #[test]
    fn import_maps_native_handles() {
        let sim = SimDevice::new(0, 1 << 16).unwrap();
        let s = sim.create_stream().unwrap();
        assert_eq!(sim.import_stream(sim.native_stream(s)).unwrap(), s);
        let f = sim.import_stream(0xdead_beef).unwrap();
        assert_eq!(sim.import_stream(0xdead_beef).unwrap(), f);
        assert_ne!(f, s);
        let d = sim.import_stream(0).unwrap();
        assert_eq!(sim.import_stream(0).unwrap(), d);
        let other = SimDevice::new(0, 1 << 16).unwrap();
        let t = other.create_stream().unwrap();
        assert_ne!(other.native_stream(t), sim.native_stream(s));
        assert!(matches!(sim.import_stream(other.native_stream(t)), Err(DeviceError::Invalid(_))));
    }
}
