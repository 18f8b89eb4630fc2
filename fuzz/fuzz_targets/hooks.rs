//! Fuzz target for the framework hooks (`src/ffi/interop.rs`): PyTorch's
//! `xlog_torch_malloc` / `xlog_torch_free` / `xlog_torch_free_any_device` /
//! `xlog_torch_record_stream`,
//! the graph-pool hooks (`xlog_torch_begin_allocate_to_pool`,
//! `_end_allocate_to_pool`, `_release_pool`, without captures: their
//! bookkeeping, refusals and sweeps), CuPy's `xlog_cupy_malloc` / `xlog_cupy_free`, and the interop table
//! (`xlog_interop_configure`, `xlog_interop_runtime`,
//! `xlog_interop_live_blocks`), on four sim devices.
//!
//! The hooks hold process-wide state (one hook runtime per device, opened
//! on first use), so every input starts and ends with
//! `xlog_testing_interop_reset` of its devices: inputs stay independent and
//! replayable.
//!
//! A model of each device predicts the outcome where it is determined
//! (configure before/after first use, pointers the hooks did or did not hand
//! out, budget refusals, record_stream of dead pointers, calls from a host
//! callback) and bounds it where timing decides (pending frees, armed
//! faults). Checked throughout: returned pointers are aligned, distinct,
//! non-overlapping and writable; a failing call leaves a message naming it;
//! a failing free or record_stream on a device never used opens nothing;
//! the hook runtime's stats match the model; at the end, the reset reports
//! exactly the blocks the model still holds.

#![no_main]

use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use libfuzzer_sys::fuzz_target;
use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::interop::*;
use xlog_cuda::ffi::testing::*;
use xlog_cuda::ffi::types::*;

const MAX_OPS: usize = 300;
const DEVICES: [i32; 4] = [0, 1, 2, 3];
const SIM_ALIGNMENT: u64 = 256;
/// Foreign native streams the hooks see (each distinct one is a sim worker
/// thread, up to the runtime's pool size).
const NATIVES: [u64; 5] = [0, 0x1000, 0x2000, 0x3000, 0x4000];
/// What a never-configured device opens with (the environment, which this
/// target sets to the sim backend, and wait_on_pressure on).
const ENV_CAPACITY: u64 = 1 << 30;
const ENV_POOL: u32 = 16;

fn last_error() -> String {
    // SAFETY: NULL with cap 0 only sizes the message.
    let len = unsafe { xlog_last_error_message(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; len + 1];
    // SAFETY: `buf` has len + 1 writable bytes.
    unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn status_text(s: xlog_status) -> String {
    // SAFETY: never NULL, a static C string.
    unsafe { CStr::from_ptr(xlog_status_name(s)) }.to_string_lossy().into_owned()
}

fn rounded(bytes: u64) -> u64 {
    bytes.div_ceil(SIM_ALIGNMENT).saturating_mul(SIM_ALIGNMENT)
}

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |v, i| v | (self.byte() as u64) << (8 * i))
    }
}

#[derive(Copy, Clone)]
struct Setup {
    budget: u64,
    wait: bool,
    capacity: u64,
    pool: u32,
}

const ENV_SETUP: Setup = Setup { budget: 0, wait: true, capacity: ENV_CAPACITY, pool: ENV_POOL };

struct Dev {
    ordinal: i32,
    /// The hook runtime is open (first malloc, or xlog_interop_runtime).
    opened: bool,
    /// The config the next open uses.
    next: Setup,
    /// The config of the open runtime.
    setup: Setup,
    /// Live hook blocks: pointer -> bytes (a 0-byte request takes 1).
    live: BTreeMap<u64, u64>,
    /// Every byte allocated since the open, rounded: while this fits the
    /// arena, an allocation cannot fail for lack of device memory.
    ever_rounded: u64,
    /// Native streams imported by the hooks since the open.
    natives: HashSet<u64>,
    allocations: u64,
    deallocations: u64,
    failed: u64,
    /// A fault armed since the open (it may fire at any later call).
    faults_armed: bool,
    /// Announced graph pools: pool -> (users, origin streams of the begins
    /// still watching, in order, begins swept whose end may still come).
    /// Dropped with the runtime.
    pools: BTreeMap<(u64, u64), (u32, Vec<u64>, u32)>,
}

impl Dev {
    fn new(ordinal: i32) -> Dev {
        Dev {
            ordinal,
            opened: false,
            next: ENV_SETUP,
            setup: ENV_SETUP,
            live: BTreeMap::new(),
            ever_rounded: 0,
            natives: HashSet::new(),
            allocations: 0,
            deallocations: 0,
            failed: 0,
            faults_armed: false,
            pools: BTreeMap::new(),
        }
    }

    fn open(&mut self) {
        if !self.opened {
            self.opened = true;
            self.setup = self.next;
            self.ever_rounded = 0;
            self.natives.clear();
            self.pools.clear();
        }
    }

    /// An announcement watches: nothing cached goes back to the driver
    /// meanwhile, so pressure relief cannot be counted on.
    fn watching(&self) -> bool {
        self.pools.values().any(|(_, w, _)| !w.is_empty())
    }

    fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }
}

/// What a host callback that calls the hooks saw.
struct Reentry {
    device: i32,
    ptr: u64,
    malloc_null: AtomicU8,
    outcomes: std::sync::Mutex<Vec<(String, xlog_status, String)>>,
}

extern "C" fn reentrant_hooks(user: *mut c_void) {
    // SAFETY: `user` is a `Reentry` the harness keeps until the stream it
    // was enqueued on has been synchronized.
    let r = unsafe { &*(user as *const Reentry) };
    let p = xlog_torch_malloc(64, r.device, std::ptr::null_mut());
    let msg = last_error();
    r.malloc_null.store(u8::from(p.is_null() && msg.contains("host callback")), Ordering::SeqCst);
    let mut out = r.outcomes.lock().unwrap();
    xlog_torch_free(r.ptr as *mut c_void, 64, r.device, std::ptr::null_mut());
    out.push(("xlog_torch_free".into(), XLOG_ERR_STREAM_MISUSE, last_error()));
    let st = xlog_torch_record_stream(r.ptr as *mut c_void, r.device, 0x1000 as *mut c_void);
    out.push(("xlog_torch_record_stream".into(), st, last_error()));
    // SAFETY: NULL means "from the environment".
    let st = unsafe { xlog_interop_configure(r.device, std::ptr::null()) };
    out.push(("xlog_interop_configure".into(), st, last_error()));
    let mut rt = std::ptr::null_mut();
    let st = xlog_interop_runtime(r.device, &mut rt);
    out.push(("xlog_interop_runtime".into(), st, last_error()));
}

/// Which free hook an `op_free` calls.
#[derive(Copy, Clone, PartialEq, Eq)]
enum FreeHook {
    Torch,
    Cupy,
    /// `xlog_torch_free_any_device`: the pointer alone.
    AnyDevice,
}

struct Harness {
    devs: Vec<Dev>,
    /// Open handles from xlog_interop_runtime: (device index, handle).
    handles: Vec<(usize, usize)>,
    ops: Vec<String>,
}

impl Harness {
    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.ops.iter().rev().take(20).collect();
        let text: String = tail.into_iter().rev().map(|op| format!("  {op}\n")).collect();
        panic!("{what}\nlast calls (oldest first):\n{text}");
    }

    fn trace(&mut self, op: String) {
        if std::env::var_os("XLOG_FUZZ_TRACE").is_some_and(|v| v == "1") {
            eprintln!("{op}");
        }
        self.ops.push(op);
    }

    /// A failed call left a message naming it.
    fn expect_message(&self, name: &str) -> String {
        let msg = last_error();
        if !msg.starts_with(&format!("{name}: ")) {
            self.fail(format!("{name} failed but the message is {msg:?}"));
        }
        msg
    }

    fn pick_dev(&self, inp: &mut Input) -> usize {
        inp.below(self.devs.len())
    }

    /// A pointer: mostly a live one of the device, sometimes of another
    /// device, a freed one, a shifted one, NULL or garbage.
    fn pick_ptr(&self, inp: &mut Input, d: usize) -> u64 {
        let live: Vec<u64> = self.devs[d].live.keys().copied().collect();
        match inp.below(10) {
            0 => 0,
            1 => inp.u64() & !0xF,
            2 => {
                let all: Vec<u64> = self.devs.iter().flat_map(|x| x.live.keys().copied()).collect();
                if all.is_empty() { 0x1234_5600 } else { all[inp.below(all.len())] }
            }
            3 if !live.is_empty() => live[inp.below(live.len())] + SIM_ALIGNMENT,
            _ if !live.is_empty() => live[inp.below(live.len())],
            _ => 0x7700_0000 + SIM_ALIGNMENT * inp.below(16) as u64,
        }
    }

    fn pick_size(&self, inp: &mut Input) -> usize {
        match inp.below(10) {
            0 => 0,
            1 | 2 => 1 + inp.byte() as usize,
            3 | 4 => 256 * (1 + inp.below(16)),
            5 => 4096 * (1 + inp.below(64)),
            6 => (64 << 10) * (1 + inp.below(16)),
            7 => [usize::MAX, 1 << 40, (1 << 30) + 1, 1 << 20][inp.below(4)],
            _ => 1 + (inp.u64() % (1 << 16)) as usize,
        }
    }

    /// Stats of the device's hook runtime against the model.
    fn check_stats(&mut self, d: usize) {
        if !self.devs[d].opened {
            return;
        }
        let ordinal = self.devs[d].ordinal;
        let mut rt = std::ptr::null_mut();
        if xlog_interop_runtime(ordinal, &mut rt) != XLOG_OK {
            self.fail(format!("xlog_interop_runtime({ordinal}) of an open hook runtime: {}", last_error()));
        }
        let mut s = xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() };
        let st = xlog_get_stats(rt, &mut s);
        let closed = xlog_runtime_close(rt);
        if st != XLOG_OK || closed != XLOG_OK {
            self.fail(format!("stats of device {ordinal}: {} / {}: {}", status_text(st), status_text(closed), last_error()));
        }
        let dev = &self.devs[d];
        let bytes = dev.live_bytes();
        let rounded_bytes: u64 = dev.live.values().map(|&b| rounded(b)).sum();
        let counters = (s.allocations, s.deallocations, s.failed_allocations);
        if s.live_blocks != dev.live.len() as u64
            || s.live_bytes < bytes
            || s.live_bytes > rounded_bytes
            || counters != (dev.allocations, dev.deallocations, dev.failed)
            || s.log_lines_lost != 0
        {
            self.fail(format!(
                "device {ordinal}: stats {s:?}, model {} blocks of {bytes} bytes, counters {:?}",
                dev.live.len(),
                (dev.allocations, dev.deallocations, dev.failed)
            ));
        }
        if xlog_interop_live_blocks(ordinal) != dev.live.len() as u64 {
            self.fail(format!("xlog_interop_live_blocks({ordinal}) disagrees with the model"));
        }
    }

    fn op_configure(&mut self, inp: &mut Input) {
        let d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let null_cfg = inp.below(5) == 0;
        let setup = Setup {
            budget: [0, 64 << 10, 1 << 20, 4 << 20][inp.below(4)],
            wait: inp.below(2) == 0,
            capacity: [1 << 20, 16 << 20, 1 << 30][inp.below(3)],
            pool: [1, 2, 16][inp.below(3)],
        };
        let broken = inp.below(8) == 0;
        let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
        // SAFETY: writable storage for one config, fully initialised after.
        let mut cfg = unsafe {
            xlog_config_init(cfg.as_mut_ptr());
            cfg.assume_init()
        };
        cfg.struct_size = if broken { 3 } else { std::mem::size_of::<xlog_config>() as u32 };
        cfg.backend = XLOG_BACKEND_SIM;
        cfg.budget_bytes = setup.budget;
        cfg.wait_on_pressure = u8::from(setup.wait);
        cfg.sim_capacity_bytes = setup.capacity;
        cfg.stream_pool_size = setup.pool;
        cfg.log_path = std::ptr::null();
        self.trace(format!("xlog_interop_configure({ordinal}, null {null_cfg}, broken {broken})"));
        let ptr: *const xlog_config = if null_cfg { std::ptr::null() } else { &cfg };
        // SAFETY: NULL or a valid config.
        let st = unsafe { xlog_interop_configure(ordinal, ptr) };
        let expected = if self.devs[d].opened || (broken && !null_cfg) { XLOG_ERR_INVALID_ARGUMENT } else { XLOG_OK };
        if st != expected {
            self.fail(format!("xlog_interop_configure gave {}, expected {}: {}", status_text(st), status_text(expected), last_error()));
        }
        if st == XLOG_OK {
            self.devs[d].next = if null_cfg { ENV_SETUP } else { setup };
        } else {
            let msg = self.expect_message("xlog_interop_configure");
            let config_ok = null_cfg || !broken;
            if self.devs[d].opened && config_ok && !msg.contains("already in use") {
                self.fail(format!("configure after first use: {msg}"));
            }
        }
    }

    fn op_malloc(&mut self, inp: &mut Input, cupy: bool) {
        let d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let size = self.pick_size(inp);
        let native = if cupy { 0 } else { NATIVES[inp.below(NATIVES.len())] };
        let name = if cupy { "xlog_cupy_malloc" } else { "xlog_torch_malloc" };
        self.trace(format!("{name}({size}, device {ordinal}, stream {native:#x})"));
        let p = if cupy {
            xlog_cupy_malloc(std::ptr::null_mut(), size, ordinal)
        } else {
            xlog_torch_malloc(size, ordinal, native as *mut c_void)
        } as u64;
        if !cupy && size == 0 {
            // PyTorch's 0 bytes: NULL, as from its own allocator, with no
            // block, no stream import and the hooks not even opened.
            if p != 0 {
                self.fail(format!("xlog_torch_malloc(0) returned {p:#x}, not NULL"));
            }
            return;
        }
        self.devs[d].open();
        let dev = &self.devs[d];
        let bytes = (size as u64).max(1);
        let new_native = !dev.natives.contains(&native);
        let import_refused = new_native && dev.natives.len() >= dev.setup.pool as usize;
        let live = dev.live_bytes();
        let rounded_live: u64 = dev.live.values().map(|&b| rounded(b)).sum();
        let s = dev.setup;
        let must_refuse = (s.budget > 0 && live.saturating_add(bytes) > s.budget)
            || rounded(bytes) > s.capacity
            || import_refused;
        let budget_fits = s.budget == 0
            || if s.wait {
                rounded_live.saturating_add(rounded(bytes)) <= s.budget
            } else {
                dev.ever_rounded.saturating_add(rounded(bytes)) <= s.budget
            };
        let must_succeed = !must_refuse
            && !dev.faults_armed
            && !dev.watching()
            && budget_fits
            && dev.ever_rounded.saturating_add(rounded(bytes)) <= s.capacity;
        if p == 0 {
            if must_succeed {
                self.fail(format!("{name} returned NULL where the model has room: {}", last_error()));
            }
            self.expect_message(name);
            // The stream is imported before the allocation: a refused
            // import allocates nothing (and counts nothing); a refusal for
            // budget or memory comes after the import, and is counted.
            if !import_refused {
                self.devs[d].natives.insert(native);
                self.devs[d].failed += 1;
            }
            return;
        }
        if must_refuse {
            self.fail(format!("{name}({size}) succeeded where the model must refuse ({p:#x})"));
        }
        if !last_error().is_empty() {
            self.fail(format!("{name} succeeded but left the message {:?}", last_error()));
        }
        if p % SIM_ALIGNMENT != 0 {
            self.fail(format!("{name} returned {p:#x}, not {SIM_ALIGNMENT}-byte aligned"));
        }
        for dv in &self.devs {
            for (&q, &qb) in &dv.live {
                if dv.ordinal == ordinal && p < q + qb && q < p + bytes {
                    self.fail(format!("{p:#x}+{bytes} overlaps live hook block {q:#x}+{qb}"));
                }
            }
        }
        // SAFETY: the hooks just allocated [p, p + bytes) on a sim device,
        // whose memory is host memory of its arena.
        unsafe {
            (*(p as *const AtomicU8)).store(0xC3, Ordering::Relaxed);
            (*((p + bytes - 1) as *const AtomicU8)).store(0x3C, Ordering::Relaxed);
        }
        let dev = &mut self.devs[d];
        dev.natives.insert(native);
        dev.live.insert(p, bytes);
        dev.ever_rounded = dev.ever_rounded.saturating_add(rounded(bytes));
        dev.allocations += 1;
    }

    fn op_free(&mut self, inp: &mut Input, hook: FreeHook) {
        let mut d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let ptr = self.pick_ptr(inp, d);
        let name = match hook {
            FreeHook::Torch => "xlog_torch_free",
            FreeHook::Cupy => "xlog_cupy_free",
            FreeHook::AnyDevice => "xlog_torch_free_any_device",
        };
        self.trace(format!("{name}({ptr:#x}, device {ordinal})"));
        match hook {
            FreeHook::Torch => xlog_torch_free(ptr as *mut c_void, 4096, ordinal, std::ptr::null_mut()),
            FreeHook::Cupy => xlog_cupy_free(std::ptr::null_mut(), ptr as *mut c_void, ordinal),
            FreeHook::AnyDevice => xlog_torch_free_any_device(ptr as *mut c_void),
        }
        let msg = last_error();
        if hook == FreeHook::AnyDevice && ptr != 0 {
            // The device is found from the pointer: whichever holds it.
            match self.devs.iter().position(|dv| dv.live.contains_key(&ptr)) {
                Some(holder) => d = holder,
                None => {
                    if !msg.contains("not a live hook allocation of any device") {
                        self.fail(format!("{name} of a pointer no hooks hold: message {msg:?}"));
                    }
                    return;
                }
            }
        }
        let dev = &mut self.devs[d];
        let live = dev.live.contains_key(&ptr);
        if ptr == 0 {
            if !msg.is_empty() {
                self.fail(format!("{name}(NULL) left the message {msg:?}"));
            }
            return;
        }
        if !live {
            if !msg.contains("not allocated through the xlog framework hooks") {
                self.fail(format!("{name} of a pointer the hooks do not hold: message {msg:?}"));
            }
            if !dev.opened && xlog_interop_live_blocks(ordinal) != 0 {
                self.fail("a failing free opened the hooks".into());
            }
            return;
        }
        if msg.is_empty() {
            dev.live.remove(&ptr);
            dev.deallocations += 1;
        } else if !dev.faults_armed || !msg.starts_with(&format!("{name}: ")) {
            self.fail(format!("{name} of a live hook block failed: {msg:?}"));
        }
    }

    fn op_record_stream(&mut self, inp: &mut Input) {
        let d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let ptr = self.pick_ptr(inp, d);
        let native = NATIVES[inp.below(NATIVES.len())];
        self.trace(format!("xlog_torch_record_stream({ptr:#x}, device {ordinal}, stream {native:#x})"));
        let st = xlog_torch_record_stream(ptr as *mut c_void, ordinal, native as *mut c_void);
        let dev = &mut self.devs[d];
        let live = dev.live.contains_key(&ptr);
        let new_native = !dev.natives.contains(&native);
        let import_refused = new_native && dev.natives.len() >= dev.setup.pool as usize;
        let expected = if !live {
            XLOG_ERR_INVALID_ARGUMENT
        } else if import_refused {
            XLOG_ERR_POOL_EXHAUSTED
        } else {
            XLOG_OK
        };
        if st != expected {
            self.fail(format!("xlog_torch_record_stream gave {}, expected {}: {}", status_text(st), status_text(expected), last_error()));
        }
        if st == XLOG_OK {
            dev.natives.insert(native);
        } else {
            self.expect_message("xlog_torch_record_stream");
            if !self.devs[d].opened && xlog_interop_live_blocks(ordinal) != 0 {
                self.fail("a failing record_stream opened the hooks".into());
            }
        }
    }

    fn op_runtime(&mut self, inp: &mut Input) {
        let d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let null_out = inp.below(8) == 0;
        self.trace(format!("xlog_interop_runtime({ordinal}, null {null_out})"));
        let mut rt = std::ptr::null_mut();
        let out: *mut *mut xlog_runtime = if null_out { std::ptr::null_mut() } else { &mut rt };
        let st = xlog_interop_runtime(ordinal, out);
        if null_out {
            if st != XLOG_ERR_INVALID_ARGUMENT {
                self.fail(format!("xlog_interop_runtime(NULL out) gave {}", status_text(st)));
            }
            return;
        }
        if st != XLOG_OK {
            self.fail(format!("xlog_interop_runtime({ordinal}): {}", last_error()));
        }
        self.devs[d].open();
        self.handles.push((d, rt as usize));
        self.check_stats(d);
    }

    /// Use or close one of the handles from xlog_interop_runtime.
    fn op_handle(&mut self, inp: &mut Input) {
        if self.handles.is_empty() {
            return;
        }
        let i = inp.below(self.handles.len());
        let (d, h) = self.handles[i];
        let rt = h as *mut xlog_runtime;
        match inp.below(5) {
            0 => {
                self.trace(format!("xlog_runtime_close(interop handle of device {})", self.devs[d].ordinal));
                if xlog_runtime_close(rt) != XLOG_OK {
                    self.fail(format!("closing an interop handle: {}", last_error()));
                }
                self.handles.remove(i);
                // The hooks keep their own reference: still open.
                self.check_stats(d);
            }
            1 => {
                self.trace("xlog_drain(interop handle)".into());
                if xlog_drain(rt, std::ptr::null_mut()) != XLOG_OK && !self.devs[d].faults_armed {
                    self.fail(format!("xlog_drain on the hook runtime: {}", last_error()));
                }
            }
            2 => {
                let kind = [XLOG_FAULT_ALLOC, XLOG_FAULT_FREE, XLOG_FAULT_EVENT_RECORD][inp.below(3)];
                let nth = 1 + inp.below(3) as u64;
                self.trace(format!("xlog_sim_inject_fault(interop handle, {kind}, {nth})"));
                if xlog_sim_inject_fault(rt, kind, nth) != XLOG_OK {
                    self.fail(format!("inject a fault into the hook runtime: {}", last_error()));
                }
                self.devs[d].faults_armed = true;
            }
            3 => self.op_callback(d, rt),
            _ => self.check_stats(d),
        }
    }

    /// A host callback on the hook runtime that calls the hooks: every call
    /// is refused, and nothing changes.
    fn op_callback(&mut self, d: usize, rt: *mut xlog_runtime) {
        let ordinal = self.devs[d].ordinal;
        self.trace(format!("host callback calling the hooks of device {ordinal}"));
        let mut s = 0;
        if xlog_stream_acquire(rt, &mut s) != XLOG_OK {
            return; // the pool may be in use up to its size
        }
        let ptr = self.devs[d].live.keys().next().copied().unwrap_or(0x7700_0000);
        let r = Box::new(Reentry { device: ordinal, ptr, malloc_null: AtomicU8::new(0), outcomes: Default::default() });
        let user = &*r as *const Reentry as *mut c_void;
        if xlog_stream_enqueue_host(rt, s, Some(reentrant_hooks), user) != XLOG_OK
            || xlog_stream_synchronize(rt, s) != XLOG_OK
            || xlog_stream_release(rt, s) != XLOG_OK
        {
            self.fail(format!("enqueue/synchronize/release on the hook runtime: {}", last_error()));
        }
        if r.malloc_null.load(Ordering::SeqCst) != 1 {
            self.fail("xlog_torch_malloc from a host callback was not refused".into());
        }
        for (name, st, msg) in r.outcomes.lock().unwrap().iter() {
            if *st != XLOG_ERR_STREAM_MISUSE || !msg.starts_with(&format!("{name}: ")) || !msg.contains("host callback") {
                self.fail(format!("{name} from a host callback gave {} ({msg:?})", status_text(*st)));
            }
        }
        self.check_stats(d);
    }

    /// PyTorch's graph-pool hooks, without captures (`announced_pools.rs`):
    /// begin (one more user, watching; a begin sweeps the earlier watching
    /// begins of its own stream, which never met a capture: each still owes
    /// an end), end (the oldest watching begin stops, else an end a swept
    /// begin owed; with neither, refused), release (one user less; refused
    /// while every user still watches).
    fn op_pool(&mut self, inp: &mut Input) {
        let d = self.pick_dev(inp);
        let ordinal = self.devs[d].ordinal;
        let pool = [(0, 0), (1, 0), (2, 0), (0, 3)][inp.below(4)];
        let native = NATIVES[inp.below(NATIVES.len())];
        match inp.below(3) {
            0 => {
                self.trace(format!("xlog_torch_begin_allocate_to_pool({ordinal}, {pool:?}, stream {native:#x})"));
                let st = xlog_torch_begin_allocate_to_pool(ordinal, pool.0, pool.1, native as *mut c_void);
                if pool == (0, 0) {
                    if st != XLOG_ERR_INVALID_ARGUMENT {
                        self.fail(format!("begin of pool (0, 0) gave {}", status_text(st)));
                    }
                    self.expect_message("xlog_torch_begin_allocate_to_pool");
                    return;
                }
                self.devs[d].open();
                let dev = &self.devs[d];
                let import_refused =
                    native != 0 && !dev.natives.contains(&native) && dev.natives.len() >= dev.setup.pool as usize;
                if import_refused {
                    if st == XLOG_OK {
                        self.fail(format!("begin imported stream {native:#x} past the pool size"));
                    }
                    self.expect_message("xlog_torch_begin_allocate_to_pool");
                    return;
                }
                if st != XLOG_OK {
                    self.fail(format!("begin of {pool:?}: {}", last_error()));
                }
                let dev = &mut self.devs[d];
                if native != 0 {
                    dev.natives.insert(native);
                    for (_, watching, swept) in dev.pools.values_mut() {
                        let before = watching.len();
                        watching.retain(|&o| o != native);
                        *swept += (before - watching.len()) as u32;
                    }
                }
                let entry = dev.pools.entry(pool).or_insert((0, Vec::new(), 0));
                entry.0 += 1;
                entry.1.push(native);
            }
            1 => {
                self.trace(format!("xlog_torch_end_allocate_to_pool({ordinal}, {pool:?})"));
                let st = xlog_torch_end_allocate_to_pool(ordinal, pool.0, pool.1);
                let dev = &mut self.devs[d];
                let known = dev.opened && pool != (0, 0) && dev.pools.contains_key(&pool);
                let owed = known && {
                    let (_, watching, swept) = &dev.pools[&pool];
                    !watching.is_empty() || *swept > 0
                };
                if !owed {
                    if st != XLOG_ERR_INVALID_ARGUMENT {
                        self.fail(format!("end of {pool:?} with nothing to end gave {}", status_text(st)));
                    }
                    self.expect_message("xlog_torch_end_allocate_to_pool");
                    return;
                }
                if st != XLOG_OK {
                    self.fail(format!("end of {pool:?}: {}", last_error()));
                }
                let (_, watching, swept) = dev.pools.get_mut(&pool).expect("known");
                if !watching.is_empty() {
                    watching.remove(0);
                } else {
                    *swept -= 1;
                }
            }
            _ => {
                self.trace(format!("xlog_torch_release_pool({ordinal}, {pool:?})"));
                let mut released = u64::MAX;
                let st = xlog_torch_release_pool(ordinal, pool.0, pool.1, &mut released);
                let dev = &mut self.devs[d];
                let entry = if dev.opened && pool != (0, 0) { dev.pools.get(&pool).cloned() } else { None };
                let expected = match &entry {
                    None => XLOG_ERR_INVALID_ARGUMENT,
                    Some((users, watching, _)) if *users as usize <= watching.len() => XLOG_ERR_STREAM_MISUSE,
                    Some(_) => XLOG_OK,
                };
                if st != expected {
                    self.fail(format!("release of {pool:?} gave {}, expected {}: {}", status_text(st), status_text(expected), last_error()));
                }
                if st != XLOG_OK {
                    self.expect_message("xlog_torch_release_pool");
                    return;
                }
                if released != 0 {
                    self.fail(format!("release of {pool:?} without captures gave back {released} bytes"));
                }
                let (users, _, _) = dev.pools.get_mut(&pool).expect("known");
                *users -= 1;
                if *users == 0 {
                    dev.pools.remove(&pool);
                }
            }
        }
    }

    fn op_live_blocks(&mut self, inp: &mut Input) {
        let d = self.pick_dev(inp);
        let n = xlog_interop_live_blocks(self.devs[d].ordinal);
        if n != self.devs[d].live.len() as u64 {
            self.fail(format!("xlog_interop_live_blocks = {n}, model {}", self.devs[d].live.len()));
        }
    }

    /// Close every handle, then reset every device: the reset reports
    /// exactly the blocks the model still holds, and leaves the device
    /// configurable again.
    fn finish(&mut self, free_first: bool) {
        for (d, h) in std::mem::take(&mut self.handles) {
            if xlog_runtime_close(h as *mut xlog_runtime) != XLOG_OK {
                self.fail(format!("closing the handles of device {}: {}", self.devs[d].ordinal, last_error()));
            }
        }
        for d in 0..self.devs.len() {
            let ordinal = self.devs[d].ordinal;
            if self.devs[d].faults_armed {
                // Disarm what has not fired, so the frees and the close of
                // the reset cannot fail.
                let mut rt = std::ptr::null_mut();
                let mut ok = xlog_interop_runtime(ordinal, &mut rt) == XLOG_OK;
                for kind in [XLOG_FAULT_ALLOC, XLOG_FAULT_FREE, XLOG_FAULT_EVENT_RECORD] {
                    ok &= xlog_sim_inject_fault(rt, kind, 0) == XLOG_OK;
                }
                ok &= xlog_runtime_close(rt) == XLOG_OK;
                if !ok {
                    self.fail(format!("disarming the faults of device {ordinal}: {}", last_error()));
                }
                self.devs[d].faults_armed = false;
            }
            if free_first {
                for ptr in self.devs[d].live.keys().copied().collect::<Vec<_>>() {
                    xlog_torch_free(ptr as *mut c_void, 0, ordinal, std::ptr::null_mut());
                    if !last_error().is_empty() {
                        self.fail(format!("final free of {ptr:#x}: {}", last_error()));
                    }
                    self.devs[d].live.remove(&ptr);
                    self.devs[d].deallocations += 1;
                }
            }
            self.check_stats(d);
            let mut leaked = u64::MAX;
            if xlog_testing_interop_reset(ordinal, &mut leaked) != XLOG_OK {
                self.fail(format!("xlog_testing_interop_reset({ordinal}): {}", last_error()));
            }
            if leaked != self.devs[d].live.len() as u64 {
                self.fail(format!("the reset of device {ordinal} freed {leaked} blocks, the model holds {}", self.devs[d].live.len()));
            }
            if xlog_interop_live_blocks(ordinal) != 0 {
                self.fail(format!("device {ordinal} still has hook blocks after the reset"));
            }
        }
    }
}

fn setup_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Hooks never configured open from the environment: the sim
        // backend, no budget, no log.
        std::env::set_var("XLOG_BACKEND", "sim");
        std::env::remove_var("XLOG_BUDGET_BYTES");
        std::env::remove_var("XLOG_LOG_PATH");
    });
}

fn run(data: &[u8]) {
    setup_process();
    for device in DEVICES {
        let mut leaked = 0;
        assert_eq!(xlog_testing_interop_reset(device, &mut leaked), XLOG_OK, "{}", last_error());
    }
    let mut inp = Input { data, pos: 0 };
    let free_first = inp.below(2) == 0;
    let mut h = Harness { devs: DEVICES.iter().map(|&o| Dev::new(o)).collect(), handles: Vec::new(), ops: Vec::new() };
    let mut ops = 0;
    while !inp.exhausted() && ops < MAX_OPS {
        ops += 1;
        match inp.byte() % 17 {
            0 | 1 => h.op_configure(&mut inp),
            2..=4 => h.op_malloc(&mut inp, false),
            5 => h.op_malloc(&mut inp, true),
            6 | 7 => h.op_free(&mut inp, FreeHook::Torch),
            8 => h.op_free(&mut inp, FreeHook::AnyDevice),
            9 => h.op_free(&mut inp, FreeHook::Cupy),
            10 | 11 => h.op_record_stream(&mut inp),
            12 => h.op_runtime(&mut inp),
            13 | 14 => h.op_handle(&mut inp),
            15 => h.op_pool(&mut inp),
            _ => h.op_live_blocks(&mut inp),
        }
    }
    h.finish(free_first);
}

fuzz_target!(|data: &[u8]| {
    // As in c_abi: the model's frees go pending, so the hook runtimes
    // opened from the environment run with the cache off.
    static CACHE_OFF: std::sync::Once = std::sync::Once::new();
    CACHE_OFF.call_once(|| {
        std::env::set_var("XLOG_CACHE", "0");
        // The four hook devices are sim devices 0..=3.
        std::env::set_var("XLOG_SIM_DEVICES", DEVICES.len().to_string());
    });
    run(data);
});
