//! Regions of streams that go away (`Arena`'s half for stream churn).
//!
//! Contract:
//! - **A released stream's regions pass to the arena's keeper.** When an
//!   imported stream is released (its owner may destroy it right after),
//!   the host waits for it, every free into its regions is then complete,
//!   and the regions pass to the *keeper*: a stream the arena creates for
//!   this, on which no work runs. Every fence toward those regions (a
//!   take from them, a block freed into them, pages lent out of them)
//!   then names the keeper, never the released stream: on CUDA, a call
//!   that names a destroyed stream is undefined, and its handle may by
//!   then be another stream's. Fences through the keeper keep their
//!   meaning: a block freed into such a region makes the keeper wait on
//!   the GPU for the freeing stream, and whoever takes from the region
//!   waits for the keeper.
//! - **A stream that needs a new region takes over one of those first**
//!   (where it fits the block), made to wait on the GPU for the keeper,
//!   instead of reserving address space of its own. An engine that makes
//!   a stream per query so reuses the address space, the mapped pages and
//!   the layout of the queries before: without this, each query's stream
//!   reserved a region (the size of the device) and kept it.
//! - A thread's cached region (`HotRegion`) serves a stream only while the
//!   region is still that stream's (`RegionCell::owner`): a stream that
//!   later gets a released one's handle finds nothing cached for it.
//!
//! Pooled streams are never released to their owner (the pool keeps them),
//! so only imported streams come here.

use super::{lock, Arena, Carved};
use crate::device::RawStream;
use crate::resource::ResourceResult;

impl Arena {
    /// `stream` is going away: the host waits for it (every free into its
    /// regions is then complete), and its regions pass to the keeper.
    pub fn retire_stream(&self, stream: RawStream) -> ResourceResult<()> {
        let has_regions = self.streams.read().unwrap_or_else(|p| p.into_inner()).contains_key(&stream);
        if !has_regions {
            return Ok(());
        }
        self.device.synchronize_stream(stream)?;
        let keeper = self.keeper()?;
        let mut streams = self.streams.write().unwrap_or_else(|p| p.into_inner());
        let regions = streams.remove(&stream).unwrap_or_default();
        for (_, region) in &regions {
            let mut r = region.lock();
            // Its recent frees (same-size reuse for that stream) join the
            // free ranges, where anyone sees them.
            r.settle_recent();
            r.all_done();
            let seals: Vec<_> = r.seals.drain(..).map(|(event, _)| event).collect();
            lock(&self.spare).events.extend(seals);
            region.set_owner(&mut r, keeper);
        }
        streams.entry(keeper).or_default().extend(regions);
        Ok(())
    }

    /// The keeper stream, created at the first release.
    fn keeper(&self) -> ResourceResult<RawStream> {
        let mut keeper = lock(&self.keeper);
        if let Some(stream) = *keeper {
            return Ok(stream);
        }
        let stream = self.device.create_stream()?;
        *keeper = Some(stream);
        Ok(stream)
    }

    /// A region a released stream left, of `page`-byte pages, with a free
    /// range of `len` bytes, given to `stream` (which waits for the
    /// keeper on the GPU) with the block carved there; `None`: there is
    /// none (nothing changed).
    pub(super) fn take_over_released(&self, stream: RawStream, len: u64, page: u64) -> Option<Carved> {
        let keeper = (*lock(&self.keeper))?;
        // Under the write lock: no other stream takes the region over
        // meanwhile. The fence's two driver calls run under it; this
        // happens once per region.
        let mut streams = self.streams.write().unwrap_or_else(|p| p.into_inner());
        let kept = streams.get_mut(&keeper)?;
        // The block is carved under the same lock that found room for it:
        // other streams may take from a keeper's region at any time.
        let (at, region, addr, freed) = kept.iter().enumerate().find_map(|(i, (p, region))| {
            if *p != page {
                return None;
            }
            let (addr, freed) = region.try_lock()?.take(len)?;
            Some((i, region.clone(), addr, freed))
        })?;
        if !self.fence(keeper, stream) {
            region.lock().unreserve(addr, len, freed);
            return None;
        }
        kept.swap_remove(at);
        let carved = {
            let mut r = region.lock();
            region.set_owner(&mut r, stream);
            let missing = r.unmapped_in(addr, len);
            (region.clone(), addr, freed, missing)
        };
        streams.entry(stream).or_default().push((page, region));
        Some(carved)
    }

    /// Close: the keeper goes (its queue holds only waits on streams the
    /// runtime has waited for).
    pub(super) fn destroy_keeper(&self) {
        if let Some(stream) = lock(&self.keeper).take() {
            let _ = self.device.synchronize_stream(stream);
            let _ = self.device.destroy_stream(stream);
        }
    }
}
