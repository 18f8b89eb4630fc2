//! Fuzz target for the C ABI: each input is decoded into a sequence of
//! `xlog_*` calls (the exported functions of `src/ffi/`, gathered in
//! `ffi::api`, called as Rust functions) with arbitrary runtime handles
//! (open, closed, NULL, forged tokens), stream ids (live, released, never issued, 0, ids of other
//! runtimes), block handles (live, freed, with one field changed, forged),
//! sizes (0 to `u64::MAX`), enum values in and out of range, and configs
//! with any field wrong.
//!
//! A reference model of every runtime runs beside the library and predicts
//! each call's status, exactly where the outcome is determined (handle,
//! stream and block checks, budget arithmetic, pool bounds) and as a set of
//! allowed statuses where timing decides (out of memory while frees are
//! still queued, armed faults). After the sequence every runtime is drained
//! and checked: live bytes and blocks equal what the model holds, nothing is
//! pending, the counters match, the simulated device has all of its memory
//! back, and close reports exactly the model's live blocks as leaks. Every
//! host callback that was accepted must have run once all runtimes are
//! closed.
//!
//! Out-pointers are always valid or NULL (the harness owns them): the C
//! contract makes a garbage *pointer* the caller's undefined behaviour, while
//! garbage handles, ids and values must be rejected with a status.

#![no_main]

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};

use libfuzzer_sys::fuzz_target;
use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::testing::*;
use xlog_cuda::ffi::types::*;

/// Most calls one input makes, and most streams it may start (each sim
/// stream is a thread).
/// Sim devices the harness asks for (`XLOG_SIM_DEVICES`): valid opens use
/// ordinals 0..=3, wild ones also 3 and `i32::MAX`.
const SIM_DEVICES: i32 = 4;
const MAX_OPS: usize = 400;
const MAX_NEW_STREAMS: u32 = 24;
const MAX_OPEN_RUNTIMES: usize = 3;
/// Sim allocations are 256-byte aligned and rounded up to 256.
const SIM_ALIGNMENT: u64 = 256;
/// Largest host allocation AddressSanitizer will attempt; a bigger sim arena
/// fails to reserve (XLOG_ERR_OUT_OF_MEMORY) instead of being mapped.
const ASAN_MAX_ALLOCATION: u64 = 1 << 40;
/// The sim's native stream handles carry this tag in the top 16 bits.
const SIM_NATIVE_TAG: u64 = 0x51A0_0000_0000_0000;
const SIM_NATIVE_TAG_MASK: u64 = 0xFFFF_0000_0000_0000;

const fn bit(status: xlog_status) -> u32 {
    1 << status
}
const OK: u32 = bit(XLOG_OK);
const INVALID: u32 = bit(XLOG_ERR_INVALID_ARGUMENT);

// ----- input decoding -----

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

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        (self.u32() as u64) | (self.u32() as u64) << 32
    }

    fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }
}

// ----- host callbacks -----

/// Counts the callbacks that ran.
extern "C" fn count_callback(user: *mut c_void) {
    // SAFETY: `user` is the `callbacks_run` counter of the `Harness` that
    // enqueued it; the harness outlives every runtime it opened (it closes
    // them all, which runs every queued callback, before it is dropped).
    let counter = unsafe { &*(user as *const AtomicU64) };
    counter.fetch_add(1, Ordering::SeqCst);
}

/// A callback that calls back into the library from a stream worker: every
/// xlog call from a host callback is refused with STREAM_MISUSE (on CUDA a
/// host function must not call the driver; synchronizing its own stream
/// would deadlock), and none may hang or crash.
struct Reentry {
    rt: usize,
    stream: xlog_stream,
    sync_status: AtomicI32,
    stats_status: AtomicI32,
    ran: AtomicU8,
}

extern "C" fn reentrant_callback(user: *mut c_void) {
    // SAFETY: `user` points at a `Reentry` boxed by the harness and kept
    // until every runtime is closed (so every callback has run).
    let r = unsafe { &*(user as *const Reentry) };
    let rt = r.rt as *mut xlog_runtime;
    r.sync_status.store(xlog_stream_synchronize(rt, r.stream), Ordering::SeqCst);
    let mut stats = zero_stats();
    r.stats_status.store(xlog_get_stats(rt, &mut stats), Ordering::SeqCst);
    r.ran.store(1, Ordering::SeqCst);
}

/// The device bytes a block of `size` takes: rounded up to 256 (None when
/// that overflows).
fn device_bytes(size: u64) -> Option<u64> {
    size.checked_add(SIM_ALIGNMENT - 1).map(|b| b / SIM_ALIGNMENT * SIM_ALIGNMENT)
}

fn zero_stats() -> xlog_stats {
    xlog_stats { struct_size: std::mem::size_of::<xlog_stats>() as u32, ..Default::default() }
}

fn zero_block() -> xlog_block {
    xlog_block { ptr: std::ptr::null_mut(), size: 0, generation: 0, stream: 0, device: 0 }
}

fn same_block(a: &xlog_block, b: &xlog_block) -> bool {
    a.ptr == b.ptr && a.size == b.size && a.generation == b.generation && a.stream == b.stream && a.device == b.device
}

fn status_text(s: xlog_status) -> String {
    // SAFETY: xlog_status_name never returns NULL and returns a static
    // NUL-terminated string.
    unsafe { CStr::from_ptr(xlog_status_name(s)) }.to_string_lossy().into_owned()
}

fn allowed_text(mask: u32) -> String {
    (0..=10).filter(|s| mask & bit(*s) != 0).map(status_text).collect::<Vec<_>>().join("|")
}

/// This thread's last error message.
fn last_error() -> String {
    // SAFETY: NULL with cap 0 only sizes the message.
    let len = unsafe { xlog_last_error_message(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; len + 1];
    // SAFETY: `buf` has len + 1 writable bytes.
    let again = unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    assert_eq!(again, len, "last error length changed between two reads");
    assert_eq!(buf[len], 0, "last error message not NUL terminated");
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

// ----- the model -----

#[derive(Copy, Clone, PartialEq, Eq)]
enum Fault {
    Alloc = 0,
    Free = 1,
    EventRecord = 2,
    StreamCreate = 3,
}

struct RtModel {
    handle: usize,
    open: bool,
    device: i32,
    direct: bool,
    budget: u64,
    capacity: u64,
    pool_size: u32,
    pooled_in_use: u32,
    pooled_created: u32,
    /// Native handle → stream id, for imports not yet released.
    imported: HashMap<u64, xlog_stream>,
    /// Foreign native handles imported since the open, released or not:
    /// each is a sim worker thread, at most `pool_size` of them.
    foreign: HashSet<u64>,
    /// Native handles `xlog_stream_native` returned for this runtime.
    own_natives: HashSet<u64>,
    /// A fault of each kind armed (and maybe already fired).
    armed: [bool; 4],
    allocations: u64,
    deallocations: u64,
    failed_allocations: u64,
    log_path: Option<PathBuf>,
}

impl RtModel {
    fn armed(&self, f: Fault) -> bool {
        self.armed[f as usize]
    }

    fn driver_if(&self, faults: &[Fault]) -> u32 {
        if faults.iter().any(|f| self.armed(*f)) {
            bit(XLOG_ERR_DRIVER)
        } else {
            0
        }
    }
}

struct StreamRec {
    rt: usize,
    id: xlog_stream,
    live: bool,
    pooled: bool,
    native_key: Option<u64>,
    native: Option<u64>,
}

struct BlockRec {
    rt: usize,
    block: xlog_block,
    live: bool,
}

struct Harness {
    rts: Vec<RtModel>,
    streams: Vec<StreamRec>,
    blocks: Vec<BlockRec>,
    generations: HashSet<u64>,
    callbacks_run: Box<AtomicU64>,
    callbacks_enqueued: u64,
    reentries: Vec<Box<Reentry>>,
    new_streams: u32,
    log_dir: PathBuf,
    logs_made: u32,
    cuda_present: bool,
    ops: Vec<String>,
}

/// Status of a block handle in runtime `rt` per the model: OK when it is a
/// live block exactly, INVALID_ARGUMENT when its generation is live but a
/// field differs, USE_AFTER_FREE when the generation is not live there —
/// or INVALID_ARGUMENT when the handle names another device than the
/// runtime's (`rt_device`), or is exactly a live block of another runtime:
/// the runtime says it is a foreign handle.
fn block_status(blocks: &[BlockRec], rt: usize, rt_device: i32, b: &xlog_block) -> xlog_status {
    match blocks.iter().find(|r| r.live && r.rt == rt && r.block.generation == b.generation) {
        Some(r) if same_block(&r.block, b) => XLOG_OK,
        Some(_) => XLOG_ERR_INVALID_ARGUMENT,
        None if b.device != rt_device => XLOG_ERR_INVALID_ARGUMENT,
        None if blocks.iter().any(|r| r.live && r.rt != rt && same_block(&r.block, b)) => XLOG_ERR_INVALID_ARGUMENT,
        None => XLOG_ERR_USE_AFTER_FREE,
    }
}

impl Harness {
    fn new(cuda_present: bool) -> Harness {
        let log_dir = std::env::temp_dir().join(format!("xlog-fuzz-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&log_dir);
        Harness {
            rts: Vec::new(),
            streams: Vec::new(),
            blocks: Vec::new(),
            generations: HashSet::new(),
            callbacks_run: Box::new(AtomicU64::new(0)),
            callbacks_enqueued: 0,
            reentries: Vec::new(),
            new_streams: 0,
            log_dir,
            logs_made: 0,
            cuda_present,
            ops: Vec::new(),
        }
    }

    fn trace(&mut self, op: String) {
        if trace_enabled() {
            eprintln!("{op}");
        }
        self.ops.push(op);
    }

    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.ops.iter().rev().take(25).collect();
        let mut text = String::new();
        for op in tail.into_iter().rev() {
            text.push_str("  ");
            text.push_str(op);
            text.push('\n');
        }
        panic!("{what}\nlast calls (oldest first):\n{text}");
    }

    /// Check a status against the allowed set and the last-error contract:
    /// empty after success, "<function>: ..." after a failure.
    fn check(&self, name: &str, got: xlog_status, allowed: u32) -> xlog_status {
        let message = last_error();
        if trace_enabled() {
            eprintln!("    {name} -> {} {message}", status_text(got));
        }
        if !(0..=10).contains(&got) || allowed & bit(got) == 0 {
            self.fail(format!(
                "{name} returned {} but the model allows {} (message: {message:?})",
                status_text(got),
                allowed_text(allowed)
            ));
        }
        if got == XLOG_OK && !message.is_empty() {
            self.fail(format!("{name} succeeded but left the error message {message:?}"));
        }
        if got != XLOG_OK && !message.starts_with(&format!("{name}: ")) {
            self.fail(format!("{name} failed with {} but the message is {message:?}", status_text(got)));
        }
        got
    }

    /// The open runtime a handle value designates, if any.
    fn target(&self, handle: usize) -> Option<usize> {
        self.rts.iter().position(|r| r.open && r.handle == handle)
    }

    fn open_count(&self) -> usize {
        self.rts.iter().filter(|r| r.open).count()
    }

    fn pick_handle(&self, inp: &mut Input) -> usize {
        match inp.below(24) {
            0 => 0,
            1 => inp.u64() as usize,
            2 if !self.rts.is_empty() => {
                let h = self.rts[inp.below(self.rts.len())].handle;
                match inp.below(3) {
                    0 => h.wrapping_add(1),
                    1 => h.wrapping_add(16),
                    _ => h.wrapping_sub(16),
                }
            }
            _ => {
                // Mostly an open runtime, sometimes a closed one.
                let open: Vec<usize> = (0..self.rts.len()).filter(|&i| self.rts[i].open).collect();
                if !open.is_empty() && inp.below(6) != 0 {
                    self.rts[open[inp.below(open.len())]].handle
                } else if !self.rts.is_empty() {
                    self.rts[inp.below(self.rts.len())].handle
                } else {
                    inp.u64() as usize
                }
            }
        }
    }

    fn pick_stream(&self, inp: &mut Input, target: Option<usize>) -> xlog_stream {
        match inp.below(20) {
            0 => 0,
            1 => inp.u32(),
            2 if !self.streams.is_empty() => self.streams[inp.below(self.streams.len())].id.wrapping_add(1),
            _ => {
                let mine: Vec<usize> = (0..self.streams.len())
                    .filter(|&i| Some(self.streams[i].rt) == target && self.streams[i].live)
                    .collect();
                if !mine.is_empty() && inp.below(8) != 0 {
                    self.streams[mine[inp.below(mine.len())]].id
                } else if !self.streams.is_empty() {
                    self.streams[inp.below(self.streams.len())].id
                } else {
                    inp.u32()
                }
            }
        }
    }

    /// What prepare/finish on runtime `rt` answer for a stream id that is
    /// not one of its own: a live stream of an open runtime of another
    /// device is a stream of a device without peer access (the harness
    /// enables none): UNSATISFIABLE_DEPENDENCY; anything else INVALID_ARGUMENT.
    fn not_my_stream(&self, rt: usize, id: xlog_stream) -> u32 {
        let device = self.rts[rt].device;
        let foreign = self.streams.iter().any(|s| {
            s.live && s.id == id && s.rt != rt && self.rts[s.rt].open && self.rts[s.rt].device != device
        });
        if foreign {
            bit(XLOG_ERR_UNSATISFIABLE_DEPENDENCY)
        } else {
            INVALID
        }
    }

    fn stream_live_in(&self, rt: usize, id: xlog_stream) -> Option<usize> {
        self.streams.iter().position(|s| s.rt == rt && s.live && s.id == id)
    }

    /// A block handle: mostly one the library issued (live or freed, of any
    /// runtime), sometimes with one field changed, sometimes forged.
    fn pick_block(&self, inp: &mut Input, target: Option<usize>) -> xlog_block {
        if self.blocks.is_empty() || inp.below(24) == 0 {
            return xlog_block {
                ptr: inp.u64() as usize as *mut c_void,
                size: inp.u64(),
                generation: inp.u64() % 4096,
                stream: inp.u32(),
                device: inp.u32() as i32,
            };
        }
        let mine: Vec<usize> =
            (0..self.blocks.len()).filter(|&i| Some(self.blocks[i].rt) == target && self.blocks[i].live).collect();
        let mut b = if !mine.is_empty() && inp.below(8) != 0 {
            self.blocks[mine[inp.below(mine.len())]].block
        } else {
            self.blocks[inp.below(self.blocks.len())].block
        };
        match inp.below(28) {
            0 => b.ptr = (b.ptr as usize).wrapping_add(SIM_ALIGNMENT as usize) as *mut c_void,
            1 => b.ptr = (b.ptr as usize ^ (1 << inp.below(64))) as *mut c_void,
            2 => b.size = b.size.wrapping_add(1),
            3 => b.size = inp.u64(),
            4 => b.generation = b.generation.wrapping_add(1),
            5 => b.generation = b.generation.wrapping_sub(1),
            6 => b.stream = b.stream.wrapping_add(1),
            7 => b.device = b.device.wrapping_add(1),
            _ => {}
        }
        b
    }

    fn pick_access(&self, inp: &mut Input) -> xlog_access {
        match inp.below(16) {
            0 => 0,
            1 => 4 + inp.u32() % 1000,
            2 => u32::MAX,
            3..=7 => XLOG_ACCESS_READ,
            8..=11 => XLOG_ACCESS_WRITE,
            _ => XLOG_ACCESS_READ_WRITE,
        }
    }

    fn pick_size(&self, inp: &mut Input, rt: Option<&RtModel>) -> u64 {
        let (capacity, budget) = rt.map_or((1 << 20, 0), |r| (r.capacity, r.budget));
        match inp.below(12) {
            0 => 0,
            1 | 2 => 1 + inp.byte() as u64,
            3 | 4 => SIM_ALIGNMENT * (1 + inp.below(16) as u64),
            5 => inp.u16() as u64,
            6 => match inp.below(4) {
                0 => capacity,
                1 => capacity.wrapping_add(1),
                2 => capacity.saturating_sub(1),
                _ => capacity / 2,
            },
            7 => match inp.below(3) {
                0 => budget,
                1 => budget.wrapping_add(1),
                _ => budget / 2,
            },
            8 => [u64::MAX, 1 << 63, u64::MAX - 254, 1 << 40, u64::MAX / 2][inp.below(5)],
            9 => inp.u64(),
            _ => 64 * (1 + inp.below(64) as u64),
        }
    }

    /// Live blocks and their device bytes (sizes rounded up to 256, what
    /// the library counts with the cache off and for Direct).
    fn live_sum(&self, rt: usize) -> (u64, u64) {
        self.blocks
            .iter()
            .filter(|b| b.rt == rt && b.live)
            .fold((0, 0), |(n, bytes), b| (n + 1, bytes + device_bytes(b.block.size).unwrap_or(u64::MAX)))
    }

    // ----- operations -----

    fn op_open(&mut self, inp: &mut Input) {
        // One open in four is wild (any field may be out of range); the
        // others are valid, so that inputs get on to use their runtimes.
        let wild = inp.below(4) == 0;
        let device = if wild { [0, 1, 3, -1, i32::MIN, i32::MAX][inp.below(6)] } else { inp.below(4) as i32 };
        let use_null_cfg = wild && inp.below(8) == 0 && !self.cuda_present;
        let mut cfg = xlog_config {
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
        // SAFETY: `cfg` is a valid, writable xlog_config.
        let st = unsafe { xlog_config_from_env(&mut cfg) };
        self.check("xlog_config_from_env", st, OK);
        if cfg.struct_size as usize != std::mem::size_of::<xlog_config>() {
            self.fail(format!("xlog_config_from_env set struct_size {}", cfg.struct_size));
        }
        // `pick(valid, wild)`: a choice among valid values, or in a wild
        // open one among all values.
        let mut pick = |n_valid: usize, n_all: usize| if wild { inp.below(n_all) } else { inp.below(n_valid) };
        let choice = [pick(1, 8), pick(1, 6), pick(3, 5), pick(6, 7), pick(4, 6), pick(8, 13), pick(2, 4), pick(3, 5)];
        cfg.struct_size = match choice[0] {
            0..=4 => cfg.struct_size,
            5 => 0,
            6 => cfg.struct_size + 8,
            _ => inp.u32(),
        };
        cfg.backend = match choice[1] {
            0 | 1 => XLOG_BACKEND_SIM,
            2 => XLOG_BACKEND_CUDA,
            3 => XLOG_BACKEND_AUTO,
            4 => 3 + inp.u32() % 100,
            _ => u32::MAX,
        };
        if self.cuda_present && matches!(cfg.backend, XLOG_BACKEND_CUDA | XLOG_BACKEND_AUTO) {
            cfg.backend = XLOG_BACKEND_SIM;
        }
        cfg.allocator = match choice[2] {
            0 | 1 => XLOG_ALLOCATOR_ASYNC,
            2 | 3 => XLOG_ALLOCATOR_DIRECT,
            _ => 2 + inp.u32() % 100,
        };
        cfg.budget_bytes = match choice[3] {
            0 | 1 => 0,
            2 => 4096,
            3 => 1 << 16,
            4 => u64::MAX,
            5 => inp.u32() as u64,
            _ => 1,
        };
        cfg.stream_pool_size = match choice[4] {
            0..=3 => 1 + choice[4] as u32,
            4 => u32::MAX,
            _ => 0,
        };
        cfg.sim_capacity_bytes = match choice[5] {
            0 | 1 => 1 << 16,
            2 | 3 => 1 << 20,
            4 => 4096,
            5 => 255,
            6 => 16 << 20,
            7 => 1 << 30,
            8 => 0,
            9 => 1 << 41,
            10 => 1 << 62,
            11 => u64::MAX - 256,
            _ => [u64::MAX, u64::MAX - 255][inp.below(2)],
        };
        cfg.wait_on_pressure = match choice[6] {
            0 => 0,
            1 => 1,
            _ => 2 + inp.byte() % 254,
        };
        let log_choice = match choice[7] {
            0 | 1 => 3, // no log
            2 => 2,     // a log file
            3 => 0,     // "" = no log
            _ => 1,     // a path that cannot be created
        };
        let mut log_path = None;
        let log_c: Option<CString> = match log_choice {
            0 => Some(CString::new("").unwrap()),
            1 => Some(CString::new("/nonexistent-xlog-fuzz-dir/log.csv").unwrap()),
            2 => {
                self.logs_made += 1;
                let p = self.log_dir.join(format!("log-{}.csv", self.logs_made));
                let c = CString::new(p.to_str().unwrap()).unwrap();
                log_path = Some(p);
                Some(c)
            }
            _ => None,
        };
        cfg.log_path = log_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let null_out = wild && inp.below(8) == 0;

        // Expected status, in the order the library checks.
        let effective = if use_null_cfg {
            // Defaults (the fuzz script clears XLOG_*): auto backend, which
            // is sim here, 1 GiB, 16 streams, no budget, no log.
            xlog_config {
                struct_size: std::mem::size_of::<xlog_config>() as u32,
                backend: XLOG_BACKEND_AUTO,
                allocator: XLOG_ALLOCATOR_ASYNC,
                budget_bytes: 0,
                stream_pool_size: 16,
                log_path: std::ptr::null(),
                sim_capacity_bytes: 1 << 30,
                wait_on_pressure: 0,
                // XLOG_CACHE=0 (set once at start, see `run`).
                cache: 0,
                pool_release_threshold: u64::MAX,
                track_call_sites: 0,
                sim_devices: 1,
                // The arena, the default; with XLOG_CACHE=0 the pool serves.
                memory: XLOG_MEMORY_ARENA,
            }
        } else {
            cfg
        };
        if use_null_cfg {
            log_path = None;
        }
        let e = &effective;
        let expected: u32 = if null_out
            || e.struct_size as usize != std::mem::size_of::<xlog_config>()
            || e.wait_on_pressure > 1
            || e.backend > XLOG_BACKEND_SIM
            || e.allocator > XLOG_ALLOCATOR_DIRECT
            || e.stream_pool_size == 0
            || (e.backend != XLOG_BACKEND_CUDA && e.sim_capacity_bytes == 0)
            || device < 0
        {
            INVALID
        } else if e.backend == XLOG_BACKEND_CUDA {
            bit(XLOG_ERR_NO_DEVICE)
        } else if device >= SIM_DEVICES {
            // The sim simulates XLOG_SIM_DEVICES devices (set in `run`).
            bit(XLOG_ERR_NO_DEVICE)
        } else if e.sim_capacity_bytes > u64::MAX - SIM_ALIGNMENT {
            INVALID
        } else if e.sim_capacity_bytes > ASAN_MAX_ALLOCATION {
            bit(XLOG_ERR_OUT_OF_MEMORY)
        } else if log_choice == 1 && !use_null_cfg {
            INVALID
        } else {
            OK
        };
        self.trace(format!(
            "xlog_runtime_open(device {device}, cfg {}, out {}) backend {} allocator {} budget {} pool {} capacity {} wait {} log {log_choice}",
            if use_null_cfg { "NULL" } else { "set" },
            if null_out { "NULL" } else { "set" },
            e.backend,
            e.allocator,
            e.budget_bytes,
            e.stream_pool_size,
            e.sim_capacity_bytes,
            e.wait_on_pressure
        ));
        let mut out: *mut xlog_runtime = std::ptr::null_mut();
        let cfg_ptr: *const xlog_config = if use_null_cfg { std::ptr::null() } else { &cfg };
        let out_ptr: *mut *mut xlog_runtime = if null_out { std::ptr::null_mut() } else { &mut out };
        // SAFETY: `cfg_ptr` is NULL or a valid config whose log_path is NULL
        // or a live C string; `out_ptr` is NULL or valid.
        let st = unsafe { xlog_runtime_open(device, cfg_ptr, out_ptr) };
        self.check("xlog_runtime_open", st, expected);
        if st != XLOG_OK {
            if !null_out && !out.is_null() {
                self.fail("a failed xlog_runtime_open wrote its out-pointer".into());
            }
            return;
        }
        if out.is_null() || self.rts.iter().any(|r| r.handle == out as usize) {
            self.fail(format!("xlog_runtime_open returned handle {out:p}, NULL or not fresh"));
        }
        self.rts.push(RtModel {
            handle: out as usize,
            open: true,
            device,
            direct: e.allocator == XLOG_ALLOCATOR_DIRECT,
            budget: e.budget_bytes,
            capacity: e.sim_capacity_bytes,
            pool_size: e.stream_pool_size,
            pooled_in_use: 0,
            pooled_created: 0,
            imported: HashMap::new(),
            foreign: HashSet::new(),
            own_natives: HashSet::new(),
            armed: [false; 4],
            allocations: 0,
            deallocations: 0,
            failed_allocations: 0,
            log_path,
        });
    }

    /// Mark runtime `i` closed in the model after its close returned `st`.
    fn closed(&mut self, i: usize) {
        self.rts[i].open = false;
        for s in self.streams.iter_mut().filter(|s| s.rt == i) {
            s.live = false;
        }
        for b in self.blocks.iter_mut().filter(|b| b.rt == i) {
            b.live = false;
        }
    }

    fn op_close(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let report = inp.bool();
        let (want_blocks, want_bytes) = (inp.bool(), inp.bool());
        self.close_handle(handle, target, report, want_blocks, want_bytes);
    }

    fn close_handle(&mut self, handle: usize, target: Option<usize>, report: bool, want_blocks: bool, want_bytes: bool) {
        let name = if report { "xlog_runtime_close_report" } else { "xlog_runtime_close" };
        let expected = match target {
            None => INVALID,
            Some(i) => OK | self.rts[i].driver_if(&[Fault::Free, Fault::EventRecord]),
        };
        self.trace(format!("{name}({handle:#x}) target {target:?}"));
        let (mut leaked_blocks, mut leaked_bytes) = (u64::MAX, u64::MAX);
        let st = if report {
            let pb: *mut u64 = if want_blocks { &mut leaked_blocks } else { std::ptr::null_mut() };
            let py: *mut u64 = if want_bytes { &mut leaked_bytes } else { std::ptr::null_mut() };
            xlog_runtime_close_report(handle as *mut xlog_runtime, pb, py)
        } else {
            xlog_runtime_close(handle as *mut xlog_runtime)
        };
        self.check(name, st, expected);
        let Some(i) = target else { return };
        let (live_blocks, _) = self.live_sum(i);
        // The leak report names the blocks' requested sizes.
        let live_bytes: u64 =
            self.blocks.iter().filter(|b| b.rt == i && b.live).map(|b| b.block.size).sum();
        if st == XLOG_OK && report {
            if want_blocks && leaked_blocks != live_blocks {
                self.fail(format!("close reported {leaked_blocks} leaked blocks, the model holds {live_blocks}"));
            }
            if want_bytes && leaked_bytes != live_bytes {
                self.fail(format!("close reported {leaked_bytes} leaked bytes, the model holds {live_bytes}"));
            }
        }
        if st == XLOG_OK {
            if let Some(path) = self.rts[i].log_path.clone() {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let leak_lines = text.lines().filter(|l| l.split(',').nth(2) == Some("leak")).count() as u64;
                if leak_lines != live_blocks {
                    self.fail(format!("log {} has {leak_lines} leak lines, the model holds {live_blocks} live blocks", path.display()));
                }
            }
        }
        self.closed(i);
    }

    fn op_acquire(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let null_out = inp.below(24) == 0;
        let expected = if null_out {
            INVALID
        } else {
            match target {
                None => INVALID,
                Some(i) => {
                    let r = &self.rts[i];
                    if r.pooled_in_use >= r.pool_size {
                        bit(XLOG_ERR_POOL_EXHAUSTED)
                    } else if r.pooled_created == r.pooled_in_use {
                        if self.new_streams >= MAX_NEW_STREAMS {
                            return; // thread budget of this input spent
                        }
                        OK | r.driver_if(&[Fault::StreamCreate])
                    } else {
                        OK
                    }
                }
            }
        };
        self.trace(format!("xlog_stream_acquire({handle:#x}) target {target:?}"));
        let mut out: xlog_stream = 0;
        let p: *mut xlog_stream = if null_out { std::ptr::null_mut() } else { &mut out };
        let st = xlog_stream_acquire(handle as *mut xlog_runtime, p);
        self.check("xlog_stream_acquire", st, expected);
        if st != XLOG_OK {
            return;
        }
        let i = target.unwrap();
        if out == 0 || self.streams.iter().any(|s| s.id == out) {
            self.fail(format!("xlog_stream_acquire returned id {out}, 0 or reused"));
        }
        let r = &mut self.rts[i];
        if r.pooled_created == r.pooled_in_use {
            r.pooled_created += 1;
            self.new_streams += 1;
        }
        r.pooled_in_use += 1;
        self.streams.push(StreamRec { rt: i, id: out, live: true, pooled: true, native_key: None, native: None });
    }

    fn op_release(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let rec = target.and_then(|i| self.stream_live_in(i, id));
        // An imported stream is retired first (its pending frees sealed
        // with an event, its cached blocks freed): a fault of either kind
        // fails the release, and the stream stays imported.
        // An imported stream with live blocks of device memory allocated on
        // it is not released (their frees are ordered on it), changing
        // nothing.
        let blocks_on = |s: usize| {
            let (rt, sid) = (self.streams[s].rt, self.streams[s].id);
            self.blocks.iter().any(|b| b.live && b.rt == rt && b.block.stream == sid && b.block.size > 0)
        };
        let expected = match rec {
            Some(s) if !self.streams[s].pooled && !self.rts[self.streams[s].rt].direct && blocks_on(s) => {
                bit(XLOG_ERR_STREAM_MISUSE)
            }
            Some(s) if !self.streams[s].pooled => OK | self.rts[self.streams[s].rt].driver_if(&[Fault::Free, Fault::EventRecord]),
            Some(_) => OK,
            None => INVALID,
        };
        self.trace(format!("xlog_stream_release({handle:#x}, {id}) target {target:?}"));
        let st = xlog_stream_release(handle as *mut xlog_runtime, id);
        self.check("xlog_stream_release", st, expected);
        if st != XLOG_OK {
            return;
        }
        if let Some(s) = rec {
            let (rt, pooled, key) = (self.streams[s].rt, self.streams[s].pooled, self.streams[s].native_key);
            self.streams[s].live = false;
            if pooled {
                self.rts[rt].pooled_in_use -= 1;
            } else if let Some(k) = key {
                self.rts[rt].imported.remove(&k);
            }
        }
    }

    fn op_import(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let natives: Vec<u64> = self.streams.iter().filter_map(|s| s.native).collect();
        let native: u64 = match inp.below(8) {
            0 => 0,
            1 => 0x1000 * (1 + inp.below(4) as u64),
            2 if !natives.is_empty() => natives[inp.below(natives.len())],
            3 if !natives.is_empty() => natives[inp.below(natives.len())] ^ (1 << inp.below(24)),
            4 => SIM_NATIVE_TAG | inp.u32() as u64,
            _ => inp.u64(),
        };
        let null_out = inp.below(24) == 0;
        let mut known = None;
        let expected = if null_out {
            INVALID
        } else {
            match target {
                None => INVALID,
                Some(i) => {
                    let r = &self.rts[i];
                    if let Some(&id) = r.imported.get(&native) {
                        known = Some(id);
                        OK
                    } else if native & SIM_NATIVE_TAG_MASK == SIM_NATIVE_TAG {
                        if r.own_natives.contains(&native) {
                            OK
                        } else if self.rts.iter().enumerate().any(|(j, o)| j != i && o.own_natives.contains(&native)) {
                            INVALID
                        } else {
                            OK | INVALID
                        }
                    } else if r.foreign.contains(&native) {
                        OK // its worker is reused
                    } else if r.foreign.len() >= r.pool_size as usize {
                        bit(XLOG_ERR_POOL_EXHAUSTED)
                    } else {
                        if self.new_streams >= MAX_NEW_STREAMS {
                            return;
                        }
                        OK
                    }
                }
            }
        };
        self.trace(format!("xlog_stream_import({handle:#x}, {native:#x}) target {target:?}"));
        let mut out: xlog_stream = 0;
        let p: *mut xlog_stream = if null_out { std::ptr::null_mut() } else { &mut out };
        let st = xlog_stream_import(handle as *mut xlog_runtime, native as usize as *mut c_void, p);
        self.check("xlog_stream_import", st, expected);
        if st != XLOG_OK {
            return;
        }
        if let Some(id) = known {
            if out != id {
                self.fail(format!("importing native {native:#x} again gave id {out}, not {id}"));
            }
            return;
        }
        if out == 0 || self.streams.iter().any(|s| s.id == out) {
            self.fail(format!("xlog_stream_import returned id {out}, 0 or reused"));
        }
        let i = target.unwrap();
        if native & SIM_NATIVE_TAG_MASK != SIM_NATIVE_TAG && self.rts[i].foreign.insert(native) {
            // A foreign handle the sim has not seen makes a new stream.
            self.new_streams += 1;
        }
        self.rts[i].imported.insert(native, out);
        self.streams.push(StreamRec { rt: i, id: out, live: true, pooled: false, native_key: Some(native), native: None });
    }

    fn op_native(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let null_out = inp.below(24) == 0;
        let rec = target.and_then(|i| self.stream_live_in(i, id));
        let expected = if null_out || rec.is_none() { INVALID } else { OK };
        self.trace(format!("xlog_stream_native({handle:#x}, {id}) target {target:?}"));
        let mut out: *mut c_void = std::ptr::null_mut();
        let p: *mut *mut c_void = if null_out { std::ptr::null_mut() } else { &mut out };
        let st = xlog_stream_native(handle as *mut xlog_runtime, id, p);
        self.check("xlog_stream_native", st, expected);
        if st != XLOG_OK {
            return;
        }
        let s = rec.unwrap();
        let native = out as u64;
        if let Some(before) = self.streams[s].native {
            if before != native {
                self.fail(format!("stream {id} had native {before:#x}, now {native:#x}"));
            }
        }
        if native & SIM_NATIVE_TAG_MASK != SIM_NATIVE_TAG {
            self.fail(format!("sim native handle {native:#x} lacks the sim tag"));
        }
        self.streams[s].native = Some(native);
        let rt = self.streams[s].rt;
        self.rts[rt].own_natives.insert(native);
    }

    fn op_synchronize(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let ok = target.and_then(|i| self.stream_live_in(i, id)).is_some();
        self.trace(format!("xlog_stream_synchronize({handle:#x}, {id}) target {target:?}"));
        let st = xlog_stream_synchronize(handle as *mut xlog_runtime, id);
        self.check("xlog_stream_synchronize", st, if ok { OK } else { INVALID });
    }

    fn op_enqueue(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let kind = inp.below(8);
        let ok = target.and_then(|i| self.stream_live_in(i, id)).is_some();
        let (func, user): (xlog_host_fn, *mut c_void) = match kind {
            0 => (None, std::ptr::null_mut()),
            1 => {
                let r = Box::new(Reentry {
                    rt: handle,
                    stream: id,
                    sync_status: AtomicI32::new(-1),
                    stats_status: AtomicI32::new(-1),
                    ran: AtomicU8::new(0),
                });
                let p = &*r as *const Reentry as *mut c_void;
                self.reentries.push(r);
                (Some(reentrant_callback), p)
            }
            _ => (Some(count_callback), &*self.callbacks_run as *const AtomicU64 as *mut c_void),
        };
        let expected = if func.is_none() || !ok { INVALID } else { OK };
        self.trace(format!("xlog_stream_enqueue_host({handle:#x}, {id}, kind {kind}) target {target:?}"));
        let st = xlog_stream_enqueue_host(handle as *mut xlog_runtime, id, func, user);
        self.check("xlog_stream_enqueue_host", st, expected);
        match (kind, st) {
            (1, XLOG_OK) => {}
            (1, _) => {
                // Never enqueued: it must never run.
                self.reentries.last().unwrap().ran.store(2, Ordering::SeqCst);
            }
            (0, _) => {}
            (_, XLOG_OK) => self.callbacks_enqueued += 1,
            _ => {}
        }
    }

    fn op_allocate(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let bytes = self.pick_size(inp, target.map(|i| &self.rts[i]));
        let tag: Option<CString> = match inp.below(6) {
            0 => None,
            1 => Some(CString::new("").unwrap()),
            2 => {
                let n = inp.below(12);
                let raw: Vec<u8> = (0..n).map(|_| inp.byte().max(1)).collect();
                Some(CString::new(raw).unwrap())
            }
            3 => Some(CString::new("tag, \"quoted\"\nline").unwrap()),
            _ => Some(CString::new(format!("t{}", inp.below(100))).unwrap()),
        };
        let null_out = inp.below(32) == 0;
        let stream_ok = target.and_then(|i| self.stream_live_in(i, id)).is_some();
        let expected = if null_out || !stream_ok {
            INVALID
        } else {
            let i = target.unwrap();
            let r = &self.rts[i];
            let (_, live) = self.live_sum(i);
            // A size whose device bytes overflow is charged as u64::MAX.
            let charge = device_bytes(bytes).unwrap_or(u64::MAX);
            let over_budget = r.budget > 0 && live.checked_add(charge).is_none_or(|t| t > r.budget);
            if over_budget {
                bit(XLOG_ERR_OUT_OF_BUDGET)
            } else if bytes == 0 {
                OK
            } else {
                let mut allowed = bit(XLOG_ERR_OUT_OF_MEMORY) | r.driver_if(&[Fault::Alloc]);
                if r.budget > 0 {
                    // Pending frees are charged until reaped.
                    allowed |= bit(XLOG_ERR_OUT_OF_BUDGET);
                }
                let rounded = bytes.checked_add(SIM_ALIGNMENT - 1).map(|b| b / SIM_ALIGNMENT * SIM_ALIGNMENT);
                if rounded.is_some_and(|b| b <= r.capacity) {
                    allowed |= OK;
                }
                allowed
            }
        };
        self.trace(format!("xlog_allocate({handle:#x}, {bytes}, {id}, {tag:?}) target {target:?}"));
        let mut out = zero_block();
        let tag_ptr = tag.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let p: *mut xlog_block = if null_out { std::ptr::null_mut() } else { &mut out };
        // SAFETY: `tag_ptr` is NULL or a live C string; `p` NULL or valid.
        let st = unsafe { xlog_allocate(handle as *mut xlog_runtime, bytes, id, tag_ptr, p) };
        self.check("xlog_allocate", st, expected);
        let Some(i) = target else { return };
        if !stream_ok || null_out {
            return;
        }
        if st != XLOG_OK {
            self.rts[i].failed_allocations += 1;
            return;
        }
        self.rts[i].allocations += 1;
        let ptr = out.ptr as u64;
        if out.size != bytes || out.stream != id || out.device != self.rts[i].device || (ptr == 0) != (bytes == 0) {
            self.fail(format!("allocated block {out:?} does not match the request ({bytes} bytes on stream {id})"));
        }
        if ptr % SIM_ALIGNMENT != 0 {
            self.fail(format!("block pointer {ptr:#x} is not {SIM_ALIGNMENT}-byte aligned"));
        }
        if out.generation == 0 || !self.generations.insert(out.generation) {
            self.fail(format!("generation {} is 0 or was issued before", out.generation));
        }
        if bytes > 0 {
            for other in self.blocks.iter().filter(|b| b.rt == i && b.live && b.block.size > 0) {
                let (a0, a1) = (ptr, ptr + bytes);
                let (b0, b1) = (other.block.ptr as u64, other.block.ptr as u64 + other.block.size);
                if a0 < b1 && b0 < a1 {
                    self.fail(format!("new block [{a0:#x}, {a1:#x}) overlaps live block {:?}", other.block));
                }
            }
            // The block is real host memory on the sim: touch both ends (an
            // address outside the arena is an AddressSanitizer report).
            // SAFETY: the library just allocated [ptr, ptr + bytes) on the
            // sim backend, where device memory is host memory of the arena.
            unsafe {
                (*(ptr as *const AtomicU8)).store(0xA5, Ordering::Relaxed);
                (*((ptr + bytes - 1) as *const AtomicU8)).store(0x5A, Ordering::Relaxed);
            }
        }
        self.blocks.push(BlockRec { rt: i, block: out, live: true });
    }

    fn op_deallocate(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let b = self.pick_block(inp, target);
        let expected = match target {
            None => INVALID,
            Some(i) => match block_status(&self.blocks, i, self.rts[i].device, &b) {
                XLOG_OK => OK | self.rts[i].driver_if(&[Fault::Free]),
                s => bit(s),
            },
        };
        self.trace(format!("xlog_deallocate({handle:#x}, {b:?}) target {target:?}"));
        let st = xlog_deallocate(handle as *mut xlog_runtime, b);
        self.check("xlog_deallocate", st, expected);
        if st == XLOG_OK {
            let i = target.unwrap();
            self.rts[i].deallocations += 1;
            let rec = self.blocks.iter_mut().find(|r| r.rt == i && r.live && same_block(&r.block, &b)).unwrap();
            rec.live = false;
        }
    }

    fn op_validate(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let b = self.pick_block(inp, target);
        let expected = match target {
            None => INVALID,
            Some(i) => bit(block_status(&self.blocks, i, self.rts[i].device, &b)),
        };
        self.trace(format!("xlog_block_validate({handle:#x}, {b:?}) target {target:?}"));
        let st = xlog_block_validate(handle as *mut xlog_runtime, b);
        self.check("xlog_block_validate", st, expected);
    }

    fn op_prepare_finish(&mut self, inp: &mut Input, finish: bool) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let b = self.pick_block(inp, target);
        let id = self.pick_stream(inp, target);
        let access = self.pick_access(inp);
        let name = if finish { "xlog_finish" } else { "xlog_prepare" };
        let expected = if access == 0 || access > XLOG_ACCESS_READ_WRITE {
            INVALID
        } else {
            match target {
                None => INVALID,
                Some(i) if self.stream_live_in(i, id).is_none() => self.not_my_stream(i, id),
                Some(i) if self.rts[i].direct => bit(XLOG_ERR_STREAM_MISUSE),
                Some(i) => match block_status(&self.blocks, i, self.rts[i].device, &b) {
                    XLOG_OK => OK | self.rts[i].driver_if(&[Fault::EventRecord]),
                    s => bit(s),
                },
            }
        };
        self.trace(format!("{name}({handle:#x}, {b:?}, {id}, {access}) target {target:?}"));
        let rt = handle as *mut xlog_runtime;
        let st = if finish { xlog_finish(rt, b, id, access) } else { xlog_prepare(rt, b, id, access) };
        self.check(name, st, expected);
    }

    fn op_launch(&mut self, inp: &mut Input, finish: bool) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let id = self.pick_stream(inp, target);
        let n = inp.below(5);
        let mut uses: Vec<xlog_use> = Vec::with_capacity(n);
        for _ in 0..n {
            let block = self.pick_block(inp, target);
            let access = if inp.below(8) == 0 { self.pick_access(inp) } else { 1 + inp.below(3) as u32 };
            uses.push(xlog_use { block, access });
        }
        // Pointer/count pairs: the array itself, or NULL with a count (the
        // library must refuse NULL with n > 0 without reading it).
        let (ptr, count): (*const xlog_use, usize) = match inp.below(10) {
            0 => (std::ptr::null(), [1, 3, usize::MAX, (1 << 20) + 1][inp.below(4)]),
            1 => (std::ptr::null(), 0),
            _ => (if n == 0 && inp.bool() { std::ptr::null() } else { uses.as_ptr() }, n),
        };
        let name = if finish { "xlog_finish_all" } else { "xlog_prepare_all" };
        let used: &[xlog_use] = if ptr.is_null() { &[] } else { &uses[..count] };
        let expected = if ptr.is_null() && count > 0 {
            INVALID
        } else if used.iter().any(|u| u.access == 0 || u.access > XLOG_ACCESS_READ_WRITE) {
            INVALID
        } else {
            match target {
                None => INVALID,
                Some(i) if self.stream_live_in(i, id).is_none() => self.not_my_stream(i, id),
                Some(i) if self.rts[i].direct => bit(XLOG_ERR_STREAM_MISUSE),
                Some(i) => match used.iter().map(|u| block_status(&self.blocks, i, self.rts[i].device, &u.block)).find(|s| *s != XLOG_OK) {
                    Some(s) => bit(s),
                    None if used.is_empty() => OK,
                    None => OK | self.rts[i].driver_if(&[Fault::EventRecord]),
                },
            }
        };
        self.trace(format!("{name}({handle:#x}, {id}, {used:?}, n {count}) target {target:?}"));
        let rt = handle as *mut xlog_runtime;
        // SAFETY: `ptr` is NULL or points at `count` initialised uses.
        let st = unsafe {
            if finish {
                xlog_finish_all(rt, id, ptr, count)
            } else {
                xlog_prepare_all(rt, id, ptr, count)
            }
        };
        self.check(name, st, expected);
    }

    fn stats_of(&self, handle: usize) -> xlog_stats {
        let mut s = zero_stats();
        let st = xlog_get_stats(handle as *mut xlog_runtime, &mut s);
        self.check("xlog_get_stats", st, OK);
        s
    }

    /// Stats of open runtime `i` against the model and the invariants.
    fn check_stats(&self, i: usize, s: &xlog_stats) {
        let r = &self.rts[i];
        let (blocks, bytes) = self.live_sum(i);
        let fail = |what: &str| self.fail(format!("stats of runtime {i}: {what}: {s:?}"));
        if s.live_bytes != bytes || s.live_blocks != blocks {
            fail(&format!("live {} bytes in {} blocks, model {bytes} in {blocks}", s.live_bytes, s.live_blocks));
        }
        if s.outstanding_bytes != s.live_bytes + s.pending_bytes {
            fail("outstanding != live + pending");
        }
        if (s.pending_bytes == 0) != (s.pending_blocks == 0) {
            fail("pending bytes and pending blocks disagree");
        }
        if r.direct && s.pending_bytes != 0 {
            fail("the direct allocator has pending bytes");
        }
        if s.peak_outstanding_bytes < s.outstanding_bytes {
            fail("peak below outstanding");
        }
        if s.log_lines_lost != 0 {
            fail("log lines lost writing to a temporary file");
        }
        if (s.allocations, s.deallocations, s.failed_allocations)
            != (r.allocations, r.deallocations, r.failed_allocations)
        {
            fail(&format!(
                "counters (allocations, deallocations, failed) model ({}, {}, {})",
                r.allocations, r.deallocations, r.failed_allocations
            ));
        }
        let (limit, remaining) = if r.budget > 0 {
            (r.budget, r.budget.saturating_sub(s.outstanding_bytes))
        } else {
            (0, u64::MAX)
        };
        if s.budget_limit != limit || s.budget_remaining != remaining {
            fail(&format!("budget limit/remaining, model {limit}/{remaining}"));
        }
    }

    fn op_stats(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let null_out = inp.below(24) == 0;
        let expected = if null_out || target.is_none() { INVALID } else { OK };
        self.trace(format!("xlog_get_stats({handle:#x}) target {target:?}"));
        let mut s = zero_stats();
        let p: *mut xlog_stats = if null_out { std::ptr::null_mut() } else { &mut s };
        let st = xlog_get_stats(handle as *mut xlog_runtime, p);
        self.check("xlog_get_stats", st, expected);
        if st == XLOG_OK {
            self.check_stats(target.unwrap(), &s);
        }
    }

    fn op_reap_drain(&mut self, inp: &mut Input, drain: bool) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let want = inp.bool();
        let name = if drain { "xlog_drain" } else { "xlog_reap" };
        let before = target.map(|_| self.stats_of(handle));
        let expected = match target {
            None => INVALID,
            Some(i) => OK | self.rts[i].driver_if(&[Fault::EventRecord]),
        };
        self.trace(format!("{name}({handle:#x}) target {target:?}"));
        let mut reclaimed = u64::MAX;
        let p: *mut u64 = if want { &mut reclaimed } else { std::ptr::null_mut() };
        let rt = handle as *mut xlog_runtime;
        let st = if drain { xlog_drain(rt, p) } else { xlog_reap(rt, p) };
        self.check(name, st, expected);
        let (Some(i), Some(before)) = (target, before) else { return };
        let after = self.stats_of(handle);
        self.check_stats(i, &after);
        if st != XLOG_OK {
            return;
        }
        if want && reclaimed != before.pending_bytes - after.pending_bytes {
            self.fail(format!(
                "{name} reclaimed {reclaimed} bytes but pending went from {} to {}",
                before.pending_bytes, after.pending_bytes
            ));
        }
        if drain && !self.rts[i].armed(Fault::EventRecord) && after.pending_bytes != 0 {
            self.fail(format!("{} bytes still pending after xlog_drain", after.pending_bytes));
        }
    }

    fn op_fault(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let kind = match inp.below(8) {
            0 => 0,
            1 => 5 + inp.u32() % 100,
            n => 1 + (n as u32 - 2) % 4,
        };
        let nth = match inp.below(6) {
            0 => 0,
            1 => u64::MAX,
            _ => 1 + inp.below(4) as u64,
        };
        let expected = if !(1..=4).contains(&kind) || target.is_none() { INVALID } else { OK };
        self.trace(format!("xlog_sim_inject_fault({handle:#x}, {kind}, {nth}) target {target:?}"));
        let st = xlog_sim_inject_fault(handle as *mut xlog_runtime, kind, nth);
        self.check("xlog_sim_inject_fault", st, expected);
        if st == XLOG_OK {
            let i = target.unwrap();
            let f = [Fault::Alloc, Fault::Free, Fault::EventRecord, Fault::StreamCreate][kind as usize - 1];
            // Once armed, a fault may fire any time before it is disarmed.
            if nth == 0 {
                self.rts[i].armed[f as usize] = false;
            } else {
                self.rts[i].armed[f as usize] = true;
            }
        }
    }

    fn op_backend(&mut self, inp: &mut Input) {
        let handle = self.pick_handle(inp);
        let target = self.target(handle);
        let null_out = inp.below(8) == 0;
        let expected = if null_out || target.is_none() { INVALID } else { OK };
        self.trace(format!("xlog_runtime_backend({handle:#x}) target {target:?}"));
        let mut b: xlog_backend = u32::MAX;
        let p: *mut xlog_backend = if null_out { std::ptr::null_mut() } else { &mut b };
        let st = xlog_runtime_backend(handle as *mut xlog_runtime, p);
        self.check("xlog_runtime_backend", st, expected);
        if st == XLOG_OK && b != XLOG_BACKEND_SIM {
            self.fail(format!("xlog_runtime_backend gave {b} for a sim runtime"));
        }
    }

    fn op_misc(&mut self, inp: &mut Input) {
        match inp.below(5) {
            0 => {
                let s = inp.u32() as i32;
                let name = status_text(s);
                let want = match s {
                    0 => "XLOG_OK",
                    1 => "XLOG_ERR_INVALID_ARGUMENT",
                    2 => "XLOG_ERR_OUT_OF_BUDGET",
                    3 => "XLOG_ERR_OUT_OF_MEMORY",
                    4 => "XLOG_ERR_DRIVER",
                    5 => "XLOG_ERR_STREAM_MISUSE",
                    6 => "XLOG_ERR_USE_AFTER_FREE",
                    7 => "XLOG_ERR_UNSATISFIABLE_DEPENDENCY",
                    8 => "XLOG_ERR_POOL_EXHAUSTED",
                    9 => "XLOG_ERR_NO_DEVICE",
                    10 => "XLOG_ERR_INTERNAL",
                    _ => "XLOG_STATUS_UNKNOWN",
                };
                if name != want {
                    self.fail(format!("xlog_status_name({s}) = {name:?}, want {want:?}"));
                }
            }
            1 => {
                // SAFETY: xlog_version returns a static C string.
                let v = unsafe { CStr::from_ptr(xlog_version()) }.to_string_lossy().into_owned();
                if v != xlog_cuda::VERSION {
                    self.fail(format!("xlog_version() = {v:?}"));
                }
            }
            2 => {
                // The last error message into a short buffer: cut, and NUL
                // terminated, and the full length returned.
                let full = last_error();
                let cap = inp.below(40);
                let mut buf = [0x7Fu8; 40];
                let use_null = inp.below(4) == 0;
                let p = if use_null { std::ptr::null_mut() } else { buf.as_mut_ptr() as *mut c_char };
                // SAFETY: `p` is NULL or has 40 >= cap writable bytes.
                let n = unsafe { xlog_last_error_message(p, if use_null { inp.u64() as usize } else { cap }) };
                if n != full.len() {
                    self.fail(format!("xlog_last_error_message returned {n}, message is {} bytes", full.len()));
                }
                if !use_null && cap > 0 {
                    let k = full.len().min(cap - 1);
                    if buf[..k] != full.as_bytes()[..k] || buf[k] != 0 || buf[k + 1..].iter().any(|&b| b != 0x7F) {
                        self.fail(format!("xlog_last_error_message(cap {cap}) wrote {:?}", &buf[..]));
                    }
                }
                if use_null || cap == 0 {
                    if buf.iter().any(|&b| b != 0x7F) {
                        self.fail("xlog_last_error_message wrote with cap 0 or NULL".into());
                    }
                }
            }
            3 => {
                self.trace("xlog_config_from_env(NULL)".into());
                // SAFETY: NULL is refused without a write.
                let st = unsafe { xlog_config_from_env(std::ptr::null_mut()) };
                self.check("xlog_config_from_env", st, INVALID);
                // SAFETY: as above; the void form ignores the status.
                unsafe { xlog_config_init(std::ptr::null_mut()) };
            }
            _ => {
                let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
                // SAFETY: `cfg` is writable storage for one xlog_config.
                unsafe { xlog_config_init(cfg.as_mut_ptr()) };
                // SAFETY: zeroed then filled: every field is initialised.
                let cfg = unsafe { cfg.assume_init() };
                if cfg.struct_size as usize != std::mem::size_of::<xlog_config>()
                    || cfg.stream_pool_size != 16
                    || cfg.backend != XLOG_BACKEND_AUTO
                    || !cfg.log_path.is_null()
                {
                    self.fail(format!("xlog_config_init filled {cfg:?}"));
                }
            }
        }
    }

    /// Drain, check and close every open runtime, then check that every
    /// accepted callback ran.
    fn finish(&mut self) {
        for i in 0..self.rts.len() {
            if !self.rts[i].open {
                continue;
            }
            let h = self.rts[i].handle;
            let rt = h as *mut xlog_runtime;
            for kind in 1..=4 {
                let st = xlog_sim_inject_fault(rt, kind, 0);
                self.check("xlog_sim_inject_fault", st, OK);
            }
            self.rts[i].armed = [false; 4];
            self.trace(format!("final drain of runtime {i}"));
            let st = xlog_drain(rt, std::ptr::null_mut());
            self.check("xlog_drain", st, OK);
            let s = self.stats_of(h);
            self.check_stats(i, &s);
            if s.pending_bytes != 0 || s.pending_blocks != 0 {
                self.fail(format!("runtime {i}: pending after drain: {s:?}"));
            }
            // With nothing live the sim device must have all of its memory
            // back in one free range: the largest aligned block fits.
            let whole = self.rts[i].capacity / SIM_ALIGNMENT * SIM_ALIGNMENT;
            let budget = self.rts[i].budget;
            if s.live_blocks == 0 && whole > 0 && (budget == 0 || budget >= whole) {
                let stream = match self.streams.iter().find(|x| x.rt == i && x.live) {
                    Some(x) => Some(x.id),
                    None if self.rts[i].pooled_in_use < self.rts[i].pool_size => {
                        let mut id = 0;
                        let st = xlog_stream_acquire(rt, &mut id);
                        self.check("xlog_stream_acquire", st, OK);
                        self.rts[i].pooled_in_use += 1;
                        self.streams.push(StreamRec { rt: i, id, live: true, pooled: true, native_key: None, native: None });
                        Some(id)
                    }
                    None => None,
                };
                if let Some(stream) = stream {
                    self.trace(format!("final whole-device allocation of {whole} bytes on runtime {i}"));
                    let mut b = zero_block();
                    // SAFETY: NULL tag, valid out.
                    let st = unsafe { xlog_allocate(rt, whole, stream, std::ptr::null(), &mut b) };
                    if st != XLOG_OK {
                        self.fail(format!(
                            "runtime {i}: the sim device did not get its memory back: allocating all {whole} bytes gave {} ({})",
                            status_text(st),
                            last_error()
                        ));
                    }
                    let st = xlog_deallocate(rt, b);
                    self.check("xlog_deallocate", st, OK);
                    self.rts[i].allocations += 1;
                    self.rts[i].deallocations += 1;
                }
            }
            self.close_handle(h, Some(i), true, true, true);
        }
        let run = self.callbacks_run.load(Ordering::SeqCst);
        if run != self.callbacks_enqueued {
            self.fail(format!("{} host callbacks were accepted but {run} ran", self.callbacks_enqueued));
        }
        for r in &self.reentries {
            match r.ran.load(Ordering::SeqCst) {
                0 => self.fail(format!("an accepted reentrant callback on stream {} never ran", r.stream)),
                1 => {
                    let (sync, stats) = (r.sync_status.load(Ordering::SeqCst), r.stats_status.load(Ordering::SeqCst));
                    if sync != XLOG_ERR_STREAM_MISUSE || stats != XLOG_ERR_STREAM_MISUSE {
                        self.fail(format!(
                            "reentrant callback: synchronize of its own stream gave {}, stats {}",
                            status_text(sync),
                            status_text(stats)
                        ));
                    }
                }
                _ => {}
            }
        }
        for r in &self.rts {
            if let Some(p) = &r.log_path {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// XLOG_FUZZ_TRACE=1 prints every call with its status (to read what an
/// input does when replaying it).
fn trace_enabled() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("XLOG_FUZZ_TRACE").is_some_and(|v| v == "1"))
}

fn cuda_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        // The model assumes the documented defaults for a NULL config.
        for var in ["XLOG_BACKEND", "XLOG_BUDGET_BYTES", "XLOG_LOG_PATH"] {
            std::env::remove_var(var);
        }
        let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
        // SAFETY: writable storage for one config; then fully initialised.
        let mut cfg = unsafe {
            xlog_config_init(cfg.as_mut_ptr());
            cfg.assume_init()
        };
        cfg.backend = XLOG_BACKEND_CUDA;
        cfg.log_path = std::ptr::null();
        let mut rt = std::ptr::null_mut();
        // SAFETY: valid config and out-pointer.
        if unsafe { xlog_runtime_open(0, &cfg, &mut rt) } == XLOG_OK {
            xlog_runtime_close(rt);
            true
        } else {
            false
        }
    })
}

fn run(data: &[u8]) {
    let mut inp = Input { data, pos: 0 };
    let mut h = Harness::new(cuda_present());
    let mut ops = 0;
    while !inp.exhausted() && ops < MAX_OPS {
        ops += 1;
        match inp.byte() % 32 {
            0 | 1 => {
                if h.open_count() < MAX_OPEN_RUNTIMES {
                    h.op_open(&mut inp)
                } else {
                    h.op_close(&mut inp)
                }
            }
            2 => h.op_close(&mut inp),
            3 | 4 => h.op_acquire(&mut inp),
            5 => h.op_release(&mut inp),
            6 => h.op_import(&mut inp),
            7 => h.op_native(&mut inp),
            8 => h.op_synchronize(&mut inp),
            9 => h.op_enqueue(&mut inp),
            10..=13 => h.op_allocate(&mut inp),
            14..=16 => h.op_deallocate(&mut inp),
            17 => h.op_validate(&mut inp),
            18 => h.op_prepare_finish(&mut inp, false),
            19 => h.op_prepare_finish(&mut inp, true),
            20 | 21 => h.op_launch(&mut inp, false),
            22 | 23 => h.op_launch(&mut inp, true),
            24 => h.op_reap_drain(&mut inp, false),
            25 => h.op_reap_drain(&mut inp, true),
            26 => h.op_stats(&mut inp),
            27 => h.op_fault(&mut inp),
            28 => h.op_backend(&mut inp),
            _ => h.op_misc(&mut inp),
        }
    }
    h.finish();
}

fuzz_target!(|data: &[u8]| {
    // The model keeps the seed's free-to-driver semantics (frees go
    // pending): every runtime here runs with the cache off, the NULL-config
    // opens included. The cache has its own model (tests/common/model.rs).
    static CACHE_OFF: std::sync::Once = std::sync::Once::new();
    CACHE_OFF.call_once(|| {
        std::env::set_var("XLOG_CACHE", "0");
        std::env::set_var("XLOG_SIM_DEVICES", SIM_DEVICES.to_string());
    });
    run(data);
});
