//! The sim backend's model of CUDA's virtual-memory API (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`,
//! `cuMemAddressFree`), so the arena (`resources/arena/`) runs, and is
//! checked, on the same physics as on a GPU.
//!
//! Contract:
//! - A reservation is address space backed by host memory (zero-filled and
//!   committed by the OS only as it is touched), so blocks mapped there can
//!   be read and written like any sim memory. It holds no device memory.
//! - Physical memory is created in multiples of the granularity
//!   ([`SIM_VM_GRANULARITY`], 2 MiB as on Hopper) and counts against the
//!   sim device's capacity together with its ordinary heap: creating past
//!   it is `OutOfMemory`, as `cuMemCreate` is on a full GPU.
//! - A mapping covers one whole physical allocation at a granularity-aligned
//!   offset of a reservation; the same address cannot be mapped twice, and
//!   an unmap must cover whole mappings. One physical allocation may be
//!   mapped at several addresses at once (as `cuMemMap` allows), and is
//!   released only once every mapping of it is gone. Reads and writes through
//!   `SimDevice::read`/`write`/`fill` of a reserved address that is not
//!   mapped fail: the sim's stand-in for a GPU fault.
//! - The host memory behind an address does not move with a remapping: what
//!   a new block finds there is unspecified, as on CUDA.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;

use super::{DevicePtr, DeviceResult, PhysHandle};
use crate::error::DeviceError;

/// Mapping granularity of the sim device (Hopper's).
pub(crate) const SIM_VM_GRANULARITY: u64 = 2 << 20;
/// Address space the arena reserves per stream region on sim, at least
/// and at most (the device's capacity between the two, as on CUDA): the
/// host backs it lazily; larger requests get a region of their own.
pub(crate) const SIM_VM_REGION_BYTES: u64 = 64 << 20;
pub(crate) const SIM_VM_REGION_MAX: u64 = 64 << 30;
/// Alignment of a reservation's base (a host page: block addresses are
/// offsets from it).
const RESERVATION_ALIGN: u64 = 4096;

/// Host memory standing for a reservation's addresses.
pub(crate) type Backing = Arc<Box<[AtomicU8]>>;

struct Reservation {
    /// `RESERVATION_ALIGN` bytes longer than the reservation so its base
    /// can be aligned.
    cells: Backing,
    /// Offset of the base inside `cells`.
    pad: u64,
    len: u64,
}

#[derive(Default)]
pub(crate) struct SimVm {
    reservations: BTreeMap<u64, Reservation>,
    /// Physical allocations: handle → bytes.
    handles: HashMap<PhysHandle, u64>,
    next_handle: PhysHandle,
    /// Bytes of every physical allocation (what the device holds for them).
    pub physical: u64,
    /// Mappings: address → (handle, bytes).
    mapped: BTreeMap<u64, (PhysHandle, u64)>,
    /// How many mappings each mapped handle has.
    in_use: HashMap<PhysHandle, u32>,
    /// Devices granted access to each mapping (by its address).
    access: HashMap<u64, Vec<i32>>,
    /// Bytes of physical allocations in use by a block, as stream-ordered
    /// checks claim them (`claim`): handle → start offset → (end offset,
    /// the block's address).
    claims: HashMap<PhysHandle, BTreeMap<u64, (u64, u64)>>,
}

/// What a stream-ordered check of a block does besides checking access.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Only check.
    None,
    /// The block starts being used: its physical bytes must be in use by
    /// no other block.
    Take,
    /// The block's use ends: it gives back the physical bytes it took,
    /// which must be the ones its addresses map now.
    Give,
}

fn invalid(msg: String) -> DeviceError {
    DeviceError::Invalid(msg)
}

impl SimVm {
    pub fn reserve(&mut self, bytes: u64) -> DeviceResult<DevicePtr> {
        if bytes == 0 || bytes % SIM_VM_GRANULARITY != 0 {
            return Err(invalid(format!(
                "sim reservation of {bytes} bytes is not a positive multiple of the granularity {SIM_VM_GRANULARITY}"
            )));
        }
        let len = usize::try_from(bytes + RESERVATION_ALIGN)
            .map_err(|_| invalid(format!("sim reservation of {bytes} bytes does not fit in memory")))?;
        let cells = bytemuck::allocation::try_zeroed_slice_box::<AtomicU8>(len).map_err(|_| {
            DeviceError::OutOfMemory { requested: bytes, detail: format!("host could not back a {bytes}-byte sim reservation") }
        })?;
        let addr = cells.as_ptr() as u64;
        let pad = (RESERVATION_ALIGN - addr % RESERVATION_ALIGN) % RESERVATION_ALIGN;
        let base = addr + pad;
        self.reservations.insert(base, Reservation { cells: Arc::new(cells), pad, len: bytes });
        Ok(base)
    }

    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    pub fn free(&mut self, base: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let Some(r) = self.reservations.get(&base) else {
            return Err(invalid(format!("{base:#x} is not a sim reservation")));
        };
        if r.len != bytes {
            return Err(invalid(format!("sim reservation at {base:#x} is {} bytes, not {bytes}", r.len)));
        }
        if self.mapped.range(base..base + bytes).next().is_some() {
            return Err(invalid(format!("sim reservation at {base:#x} still has mappings: unmap them first")));
        }
        self.reservations.remove(&base);
        Ok(())
    }

    /// Create `bytes` of physical memory; `room` is what the device's
    /// capacity leaves besides the existing physical allocations.
    pub fn create(&mut self, bytes: u64, room: u64) -> DeviceResult<PhysHandle> {
        if bytes == 0 || bytes % SIM_VM_GRANULARITY != 0 {
            return Err(invalid(format!(
                "sim physical allocation of {bytes} bytes is not a positive multiple of the granularity {SIM_VM_GRANULARITY}"
            )));
        }
        if bytes > room {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                detail: format!("sim device has {room} bytes left for physical memory ({} created)", self.physical),
            });
        }
        self.next_handle += 1;
        self.handles.insert(self.next_handle, bytes);
        self.physical += bytes;
        Ok(self.next_handle)
    }

    pub fn release(&mut self, handle: PhysHandle) -> DeviceResult<()> {
        if self.in_use.contains_key(&handle) {
            return Err(invalid(format!("sim physical allocation {handle} is still mapped")));
        }
        let bytes = self.handles.remove(&handle).ok_or_else(|| invalid(format!("{handle} is not a sim physical allocation")))?;
        self.physical -= bytes;
        Ok(())
    }

    /// The reservation holding `[va, va + bytes)`: its base.
    fn reservation_of(&self, va: u64, bytes: u64) -> Option<u64> {
        let (&base, r) = self.reservations.range(..=va).next_back()?;
        let end = va.checked_add(bytes)?;
        (end <= base + r.len).then_some(base)
    }

    pub fn map(&mut self, va: DevicePtr, bytes: u64, handle: PhysHandle) -> DeviceResult<()> {
        let Some(&size) = self.handles.get(&handle) else {
            return Err(invalid(format!("{handle} is not a sim physical allocation")));
        };
        if size != bytes {
            return Err(invalid(format!("sim map of {bytes} bytes from a {size}-byte physical allocation")));
        }
        let Some(base) = self.reservation_of(va, bytes) else {
            return Err(invalid(format!("sim map at {va:#x} ({bytes} bytes) is outside every reservation")));
        };
        if (va - base) % SIM_VM_GRANULARITY != 0 {
            return Err(invalid(format!("sim map at {va:#x} is not granularity-aligned")));
        }
        let overlaps = self.mapped.range(..va + bytes).next_back().is_some_and(|(&a, &(_, len))| a + len > va);
        if overlaps {
            return Err(invalid(format!("sim map at {va:#x} overlaps an existing mapping")));
        }
        self.mapped.insert(va, (handle, bytes));
        *self.in_use.entry(handle).or_default() += 1;
        Ok(())
    }

    pub fn unmap(&mut self, va: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let end = va.checked_add(bytes).ok_or_else(|| invalid(format!("sim unmap of {bytes} bytes at {va:#x} overflows")))?;
        let straddles = |a: u64, len: u64| a < va && a + len > va || a < end && a + len > end;
        if let Some((&a, &(_, len))) = self.mapped.range(..va).next_back() {
            if straddles(a, len) {
                return Err(invalid(format!("sim unmap of [{va:#x}, {end:#x}) cuts the mapping at {a:#x}")));
            }
        }
        let inside: Vec<(u64, PhysHandle, u64)> = self.mapped.range(va..end).map(|(&a, &(h, len))| (a, h, len)).collect();
        if inside.is_empty() {
            return Err(invalid(format!("sim unmap of [{va:#x}, {end:#x}): nothing is mapped there")));
        }
        if let Some(&(a, _, len)) = inside.last() {
            if a + len > end {
                return Err(invalid(format!("sim unmap of [{va:#x}, {end:#x}) cuts the mapping at {a:#x}")));
            }
        }
        for (a, h, _) in inside {
            self.mapped.remove(&a);
            if let Some(count) = self.in_use.get_mut(&h) {
                *count -= 1;
                if *count == 0 {
                    self.in_use.remove(&h);
                }
            }
            self.access.remove(&a);
        }
        Ok(())
    }

    /// Access is not enforced on sim (host memory), but recorded per
    /// mapping (`access_of`); the range must be mapped, as
    /// `cuMemSetAccess` requires.
    pub fn set_access(&mut self, va: DevicePtr, bytes: u64, ordinal: i32) -> DeviceResult<()> {
        self.check_mapped(va, bytes)?;
        let starts: Vec<u64> = self.mapped.range(..va + bytes).filter(|(&a, &(_, len))| a + len > va).map(|(&a, _)| a).collect();
        for a in starts {
            let list = self.access.entry(a).or_default();
            if !list.contains(&ordinal) {
                list.push(ordinal);
            }
        }
        Ok(())
    }

    /// The devices granted access to the mapping holding `ptr` (empty when
    /// nothing is mapped there).
    pub fn access_of(&self, ptr: u64) -> Vec<i32> {
        match self.mapped.range(..=ptr).next_back() {
            Some((&a, &(_, len))) if a + len > ptr => self.access.get(&a).cloned().unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Every granule of `[va, va + bytes)` is mapped, and device `ordinal`
    /// was granted access to each mapping there: what a kernel of that
    /// device touching the range needs (a GPU faults otherwise).
    pub fn check_accessible(&self, va: u64, bytes: u64, ordinal: i32) -> DeviceResult<()> {
        self.check_mapped(va, bytes)?;
        for (a, _, _) in self.mappings_over(va, bytes) {
            if !self.access.get(&a).is_some_and(|devices| devices.contains(&ordinal)) {
                return Err(invalid(format!("sim access at {a:#x}: mapped, but device {ordinal} was never granted access there")));
            }
        }
        Ok(())
    }

    /// The mappings that overlap `[va, va + bytes)`: (address, handle,
    /// length).
    fn mappings_over(&self, va: u64, bytes: u64) -> impl Iterator<Item = (u64, PhysHandle, u64)> + '_ {
        let end = va.saturating_add(bytes.max(1));
        let first = self.mapped.range(..=va).next_back().map_or(va, |(&a, _)| a);
        self.mapped.range(first..end).map(|(&a, &(h, len))| (a, h, len)).filter(move |&(a, _, len)| a + len > va)
    }

    /// The physical pieces behind `[va, va + bytes)` (all mapped): (handle,
    /// start offset, end offset).
    fn pieces(&self, va: u64, bytes: u64) -> Vec<(PhysHandle, u64, u64)> {
        let end = va + bytes.max(1);
        self.mappings_over(va, bytes).map(|(a, h, len)| (h, va.max(a) - a, end.min(a + len) - a)).collect()
    }

    /// `check_accessible`, then take or give back the physical bytes behind
    /// the block at `va` (`Claim`): physical memory used by two blocks at
    /// once, or a block's pages remapped while in use, is an error.
    pub fn check_and_claim(&mut self, va: u64, bytes: u64, ordinal: i32, claim: Claim) -> DeviceResult<()> {
        self.check_accessible(va, bytes, ordinal)?;
        if claim == Claim::None {
            return Ok(());
        }
        let pieces = self.pieces(va, bytes);
        for &(h, start, end) in &pieces {
            let claims = self.claims.entry(h).or_default();
            match claim {
                Claim::Take => {
                    if let Some((&s, &(e, other))) = claims.range(..end).next_back().filter(|(_, &(e, _))| e > start) {
                        return Err(invalid(format!(
                            "physical bytes [{s:#x}, {e:#x}) of allocation {h:#x} are in use by the block at {other:#x} \
                             while the block at {va:#x} takes [{start:#x}, {end:#x}) of them"
                        )));
                    }
                    claims.insert(start, (end, va));
                }
                Claim::Give => {
                    if claims.get(&start) != Some(&(end, va)) {
                        return Err(invalid(format!(
                            "the block at {va:#x} gives back [{start:#x}, {end:#x}) of allocation {h:#x}, which it \
                             did not take: its addresses were remapped while it was in use"
                        )));
                    }
                    claims.remove(&start);
                }
                Claim::None => {}
            }
        }
        Ok(())
    }

    /// Every granule of `[va, va + bytes)` is mapped.
    fn check_mapped(&self, va: u64, bytes: u64) -> DeviceResult<()> {
        let end = va.saturating_add(bytes.max(1));
        let mut at = va;
        while at < end {
            match self.mapped.range(..=at).next_back() {
                Some((&a, &(_, len))) if a + len > at => at = a + len,
                _ => {
                    return Err(invalid(format!(
                        "sim access at {at:#x} touches reserved address space that is not mapped \
                         (a GPU would fault here)"
                    )))
                }
            }
        }
        Ok(())
    }

    /// The host cells behind `[ptr, ptr + len)` of a reservation, when `ptr`
    /// is in one: the backing and the offset of `ptr` in it. An unmapped
    /// granule is an error.
    pub fn cells(&self, ptr: u64, len: u64) -> Option<DeviceResult<(Backing, usize)>> {
        let (&base, r) = self.reservations.range(..=ptr).next_back()?;
        if ptr >= base + r.len {
            return None;
        }
        if ptr.checked_add(len).map_or(true, |end| end > base + r.len) {
            return Some(Err(invalid(format!(
                "sim access of {len} bytes at {ptr:#x} runs past the reservation [{base:#x}, {:#x})",
                base + r.len
            ))));
        }
        if let Err(e) = self.check_mapped(ptr, len) {
            return Some(Err(e));
        }
        Some(Ok((r.cells.clone(), (r.pad + ptr - base) as usize)))
    }

    /// Host bytes backing the reservations (the sim's stand-in for device
    /// address space, allocated whole at `reserve`).
    pub fn backing_bytes(&self) -> u64 {
        self.reservations.values().map(|r| r.len + RESERVATION_ALIGN).sum()
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped.values().map(|&(_, len)| len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = SIM_VM_GRANULARITY;

    #[test]
    fn create_map_access_unmap_release() {
        let mut vm = SimVm::default();
        let base = vm.reserve(4 * G).unwrap();
        assert_eq!(base % RESERVATION_ALIGN, 0);
        let h1 = vm.create(G, 10 * G).unwrap();
        let h2 = vm.create(G, 10 * G).unwrap();
        assert_eq!(vm.physical, 2 * G);
        assert!(vm.cells(base, 16).unwrap().is_err(), "unmapped memory faults");
        vm.map(base, G, h1).unwrap();
        vm.map(base + G, G, h2).unwrap();
        vm.set_access(base, 2 * G, 0).unwrap();
        vm.set_access(base + G, G, 3).unwrap();
        assert_eq!((vm.access_of(base), vm.access_of(base + G + 5)), (vec![0], vec![0, 3]));
        assert!(vm.cells(base + G - 8, 16).unwrap().is_ok(), "an access across two mappings");
        assert!(vm.map(base, G, h2).is_err(), "an address maps once");
        assert!(vm.release(h1).is_err(), "a mapped handle cannot be released");
        assert!(vm.unmap(base + G / 2, G).is_err(), "an unmap covers whole mappings");
        vm.unmap(base, 2 * G).unwrap();
        assert_eq!(vm.mapped_bytes(), 0);
        vm.release(h1).unwrap();
        vm.release(h2).unwrap();
        assert_eq!(vm.physical, 0);
        vm.free(base, 4 * G).unwrap();
    }

    #[test]
    fn one_physical_allocation_mapped_twice_is_released_after_both_unmaps() {
        let mut vm = SimVm::default();
        let base = vm.reserve(4 * G).unwrap();
        let h = vm.create(G, 4 * G).unwrap();
        vm.map(base, G, h).unwrap();
        vm.map(base + 2 * G, G, h).unwrap();
        assert_eq!(vm.mapped_bytes(), 2 * G);
        assert_eq!(vm.physical, G, "two mappings, one physical allocation");
        vm.unmap(base, G).unwrap();
        assert!(vm.release(h).is_err(), "still mapped at its second address");
        vm.unmap(base + 2 * G, G).unwrap();
        vm.release(h).unwrap();
        assert_eq!(vm.physical, 0);
    }

    #[test]
    fn creation_past_the_room_is_out_of_memory() {
        let mut vm = SimVm::default();
        assert!(matches!(vm.create(2 * G, G), Err(DeviceError::OutOfMemory { .. })));
        assert!(vm.create(G + 1, 4 * G).is_err(), "only whole granules");
    }

    #[test]
    fn a_reservation_with_mappings_cannot_be_freed() {
        let mut vm = SimVm::default();
        let base = vm.reserve(2 * G).unwrap();
        let h = vm.create(G, 4 * G).unwrap();
        vm.map(base + G, G, h).unwrap();
        assert!(vm.free(base, 2 * G).is_err());
        vm.unmap(base + G, G).unwrap();
        vm.free(base, 2 * G).unwrap();
    }
}
