//! The arena under failing page calls (sim): a `cuMemMap` / `cuMemSetAccess`
//! (`FaultKind::Map`) or a `cuMemUnmap` / `cuMemRelease` (`FaultKind::Unmap`)
//! fails at the Nth call, for every N the workload reaches. The workload
//! runs three streams of changing sizes under a budget that forces lending
//! and recycling, frees blocks on other streams than their own, and trims.
//!
//! After every operation:
//! - the budget's charge, the held bytes and the device's physical bytes
//!   are equal;
//! - every live block still holds its data, and every page under it is
//!   mapped and granted to the device (a block on a page that was mapped
//!   but never granted would fault on a GPU).
//!
//! A failed map surfaces once, as a driver error of the allocation that
//! needed it, and that allocation changes nothing. A failed unmap or
//! release is absorbed: the page stays held and charged, and a later trim
//! gives it back. At the end, everything freed and trimmed, the device
//! holds nothing for the runtime.

use std::sync::Arc;

use xlog_cuda::device::sim::SimDevice;
use xlog_cuda::device::{Device, FaultKind};
use xlog_cuda::{Access, Backend, Config, DeviceBlock, ResourceError, Runtime, StreamId};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The arena's page: one of the sim's 2 MiB granules (`PAGE_GRANULES`).
const PAGE: u64 = 2 * MIB;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn open() -> Arc<Runtime> {
    let config =
        Config { backend: Backend::Sim, budget_bytes: 32 * MIB, sim_capacity_bytes: 256 * MIB, ..Config::default() };
    Runtime::open(0, &config).unwrap()
}

/// Every invariant of the module docs that holds after each operation.
fn check(rt: &Runtime, live: &[(DeviceBlock, u8)], what: &str) {
    let sim = rt.sim().unwrap();
    let physical = sim.physical_bytes();
    let held = rt.usage().outstanding_bytes();
    assert_eq!(held, physical, "{what}: held vs the device's physical bytes");
    assert_eq!(rt.budget().unwrap().reserved(), physical, "{what}: the charge is the device's number");
    for (b, tag) in live {
        let (ptr, size) = (b.id.ptr, b.id.size);
        for at in [ptr, ptr + size / 2, ptr + size - 1] {
            assert_eq!(sim.read(at, 1).unwrap(), vec![*tag], "{what}: block {ptr:#x} lost its data at {at:#x}");
            assert!(sim.access_of(at).contains(&0), "{what}: {at:#x} of a live block is mapped without access");
        }
    }
}

/// Whether `kind` is still armed on `sim`: direct page calls, up to
/// `max`, until one fails as injected (each undone).
fn still_armed(sim: &SimDevice, kind: FaultKind, max: u64) -> bool {
    let g = sim.vm_granularity();
    let va = sim.vm_reserve(g).unwrap();
    let page = sim.vm_create(g).unwrap();
    let mut armed = false;
    for _ in 0..max {
        match kind {
            FaultKind::Map => {
                if sim.vm_map(va, g, page).is_err() {
                    armed = true;
                    break;
                }
                sim.vm_unmap(va, g).unwrap();
            }
            _ => {
                sim.vm_map(va, g, page).unwrap();
                let failed = sim.vm_unmap(va, g).is_err();
                if failed {
                    sim.vm_unmap(va, g).unwrap();
                    armed = true;
                    break;
                }
            }
        }
    }
    sim.vm_release(page).unwrap();
    sim.vm_free(va, g).unwrap();
    armed
}

/// What one run saw.
#[derive(Default, Debug)]
struct Seen {
    driver_errors: u64,
    refusals: u64,
    allocations: u64,
}

/// The workload, with `kind` armed at its `nth` page call (0: none).
fn run(kind: FaultKind, nth: u64) -> (Seen, Arc<Runtime>) {
    let rt = open();
    let streams: Vec<StreamId> = (0..3).map(|_| rt.acquire_stream().unwrap()).collect();
    if nth > 0 {
        rt.sim().unwrap().inject_fault(kind, nth);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live: Vec<(DeviceBlock, u8)> = Vec::new();
    let mut seen = Seen::default();
    for op in 0..180u64 {
        let what = format!("[{kind:?} at {nth}] op {op}");
        match rng.below(10) {
            0..=4 => {
                // A size that changes: from half a page to four pages.
                let bytes = (1 + rng.below(16)) * 512 * KIB - rng.below(4) * KIB;
                let s = streams[rng.below(3) as usize];
                let before = (rt.usage().live_bytes, rt.usage().outstanding_bytes());
                match rt.allocate(bytes, s, "w") {
                    Ok(b) => {
                        let tag = (op % 250) as u8 + 1;
                        rt.sim().unwrap().fill(b.id.ptr, b.id.size, tag).unwrap();
                        live.push((b, tag));
                        seen.allocations += 1;
                    }
                    Err(ResourceError::Driver(msg)) => {
                        assert!(msg.contains("injected fault"), "{what}: {msg}");
                        assert_eq!(kind, FaultKind::Map, "{what}: only a map fails an allocation: {msg}");
                        assert_eq!(rt.usage().live_bytes, before.0, "{what}: the failed allocation left a live block");
                        seen.driver_errors += 1;
                    }
                    Err(ResourceError::OutOfBudget { .. }) => seen.refusals += 1,
                    Err(e) => panic!("{what}: {e}"),
                }
            }
            5..=8 if !live.is_empty() => {
                let (b, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                // Half the blocks used on another stream before the free.
                let on = streams[rng.below(3) as usize];
                if rng.below(2) == 0 {
                    rt.prepare(&b.id, on, Access::Read).unwrap();
                    rt.finish(&b.id, on, Access::Read).unwrap();
                }
                rt.deallocate(&b.id).unwrap();
            }
            _ => {
                rt.trim(rng.below(3) * PAGE).unwrap();
            }
        }
        check(&rt, &live, &what);
    }
    for (b, _) in live.drain(..) {
        rt.deallocate(&b.id).unwrap();
    }
    (seen, rt)
}

fn sweep(kind: FaultKind) {
    let (clean, rt) = run(kind, 0);
    assert_eq!(clean.driver_errors, 0);
    assert!(clean.refusals > 0 && clean.allocations > 60, "the workload must press on the budget: {clean:?}");
    finish(&rt, "clean run");
    let mut fired_runs = 0;
    // Every call of the first 24, then every tenth: the workload makes a
    // few hundred, and each run takes a while.
    let nths = (1..=24).chain((34..).step_by(10));
    for nth in nths {
        let (seen, rt) = run(kind, nth);
        let what = format!("[{kind:?} at {nth}]");
        let fired = !still_armed(rt.sim().unwrap(), kind, nth);
        if kind == FaultKind::Map {
            // Every map is made for an allocation: a fault that fired failed one.
            assert_eq!(seen.driver_errors, u64::from(fired), "{what}: the fault surfaced {} times", seen.driver_errors);
        }
        finish(&rt, &what);
        if !fired {
            break;
        }
        fired_runs += 1;
    }
    assert!(fired_runs >= 3, "the workload makes {kind:?} calls: {fired_runs}");
}

/// Everything freed: trims until the device holds nothing (a release the
/// fault failed is retried by the next trim), then closes.
fn finish(rt: &Runtime, what: &str) {
    rt.drain().unwrap();
    for _ in 0..3 {
        rt.trim(0).unwrap();
    }
    let sim = rt.sim().unwrap();
    assert_eq!(sim.physical_bytes(), 0, "{what}: pages left on the device after trim");
    assert_eq!(sim.mapped_bytes(), 0, "{what}: mappings left after trim");
    assert_eq!(rt.usage().outstanding_bytes(), 0, "{what}: held after trim");
    assert_eq!(rt.budget().unwrap().reserved(), 0, "{what}: charged after trim");
}

#[test]
fn a_failed_map_fails_its_allocation_and_changes_nothing() {
    sweep(FaultKind::Map);
}

#[test]
fn a_failed_unmap_or_release_keeps_the_page_held_until_a_later_trim() {
    sweep(FaultKind::Unmap);
}
