//! The sim "platform": what the sim devices of one process share, so that
//! several of them behave like the GPUs of one CUDA process.
//!
//! Contract:
//! - **Device count.** A process simulates `N` devices (`XLOG_SIM_DEVICES`,
//!   default 1; `Config::sim_devices` / `xlog_config.sim_devices` per open).
//!   Opening ordinal `>= N` fails with `NoDevice` naming `N`
//!   ([`check_ordinal`]), as `cuDeviceGet` does past the device count.
//! - **Independent devices per open.** Every open still makes its own
//!   `SimDevice` (own arena, capacity, streams, events), so tests run side
//!   by side; the platform never owns a device, it only *knows* the live
//!   ones, by their process-unique instance.
//! - **Events cross devices.** A sim event handle names the instance that
//!   created it (`instance << 32 | index`). A stream of one sim device can
//!   wait on an event of any live sim device of the process, and any device
//!   can query or synchronise it, as CUDA allows within one process
//!   (`cuStreamWaitEvent` accepts an event of another context). Recording
//!   an event stays limited to its own device's streams (`cuEventRecord`
//!   requires one context): sim refuses it too, so code tested here does
//!   not break on a GPU.
//! - **Peer capability.** Any two distinct sim devices can access each
//!   other's memory unless a test declared the pair incapable
//!   ([`deny_peer`]; `xlog_sim_deny_peer_access`), which stands in for
//!   `cuDeviceCanAccessPeer` answering 0. Pairs are kept by instance, so a
//!   declaration never leaks into another test's devices.
//!
//! Locks: the registry lock is taken alone, never while a sim device's own
//! locks are held, and only on the cross-device paths (a wait on a foreign
//! event, peer queries), never by single-device work.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use super::sim::SimDevice;
use crate::error::DeviceError;

/// Default number of simulated devices in a process.
pub(crate) const DEFAULT_SIM_DEVICES: u32 = 1;

/// Most simulated devices a process may declare (a sanity bound on
/// `XLOG_SIM_DEVICES`). Large on purpose: test suites give each test its
/// own sim ordinal (hook state is per device), and a sim device costs
/// nothing until it is opened.
pub(crate) const MAX_SIM_DEVICES: u32 = 1 << 16;

#[derive(Default)]
struct Registry {
    /// Live sim devices by instance.
    devices: HashMap<u64, Weak<SimDevice>>,
    /// Instance pairs (smaller first) declared without peer capability.
    no_peer: HashSet<(u64, u64)>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

fn pair(a: u64, b: u64) -> (u64, u64) {
    (a.min(b), a.max(b))
}

/// `NoDevice` unless `0 <= ordinal < devices`.
pub fn check_ordinal(ordinal: i32, devices: u32) -> Result<(), DeviceError> {
    if ordinal < 0 || ordinal as u32 >= devices {
        return Err(DeviceError::NoDevice(format!(
            "sim device ordinal {ordinal} is out of range: the sim backend has {devices} device(s) \
             (XLOG_SIM_DEVICES or sim_devices sets how many)"
        )));
    }
    Ok(())
}

/// A new sim device is live (called by `SimDevice::new`).
pub(super) fn register(device: &Arc<SimDevice>) {
    registry().devices.insert(device.instance(), Arc::downgrade(device));
}

/// A sim device is going away (called by its `Drop`): forget it and the
/// peer declarations that name it.
pub(super) fn unregister(instance: u64) {
    let mut reg = registry();
    reg.devices.remove(&instance);
    reg.no_peer.retain(|&(a, b)| a != instance && b != instance);
}

/// The live sim device of `instance`, if any.
pub(super) fn device(instance: u64) -> Option<Arc<SimDevice>> {
    registry().devices.get(&instance).and_then(Weak::upgrade)
}

/// Declare that the sim devices `a` and `b` cannot access each other's
/// memory (what `cuDeviceCanAccessPeer` reports for such a pair on CUDA).
pub fn deny_peer(a: &SimDevice, b: &SimDevice) {
    registry().no_peer.insert(pair(a.instance(), b.instance()));
}

/// Whether `a` can access `b`'s memory: distinct live devices not declared
/// incapable.
pub fn can_access_peer(a: &SimDevice, b: &SimDevice) -> bool {
    a.instance() != b.instance() && !registry().no_peer.contains(&pair(a.instance(), b.instance()))
}
