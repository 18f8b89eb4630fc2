//! Per-tag and whole-table allocation counters, the counting half of
//! `telemetry` (see its module docs for the contract). A module of its own
//! below `resource`, because the allocators embed it: it names tags by
//! their index in the process-wide tag table ([`TAG_SLOTS`] of them, the
//! table's bound), not by `AllocTag`, so it depends on nothing above it.
//!
//! A [`TableCounters`] belongs to one block table of an allocator (a shard
//! of the async pool, the Direct allocator's table) and is updated under the
//! lock that already guards that table, next to the block record it
//! describes: plain integer updates, no atomic, no lock of its own, and
//! nothing shared between threads that allocate on different streams. A
//! tag's counters are found by the tag's index in the process-wide tag
//! table (bounded by `MAX_TAGS`): a chunk of 64 tags is allocated the first
//! time a table counts one of them, and from then on finding a tag's
//! counters is two indexings.
//!
//! Reading sums the tables ([`CountSummary`]). Current values and counts
//! are exact sums. A peak is kept per table, so the summed peak is exact
//! when one table is in use (one allocating stream, the usual case under
//! PyTorch) and otherwise an upper bound (tables may have peaked at
//! different moments); an exact peak across streams would need a counter
//! every allocating thread writes, which is what the hot path avoids.

/// Tag indices counted: the tag table's bound (`resource::MAX_TAGS`,
/// checked equal there).
pub const TAG_SLOTS: usize = 4096;
/// Where an index past [`TAG_SLOTS`] is counted: the overflow bucket's
/// index (`AllocTag::OVERFLOW`).
pub const OVERFLOW_SLOT: usize = 1;

/// Tags per lazily allocated chunk.
const CHUNK: usize = 64;
const CHUNKS: usize = TAG_SLOTS.div_ceil(CHUNK);

#[derive(Copy, Clone, Default)]
struct TagCell {
    live_bytes: u64,
    peak_bytes: u64,
    allocations: u64,
    frees: u64,
}

type Chunks = [Option<Box<[TagCell; CHUNK]>>; CHUNKS];

/// The counters of one block table; the table's lock serialises updates.
#[derive(Default)]
pub struct TableCounters {
    /// None until the first count.
    chunks: Option<Box<Chunks>>,
    live_bytes: u64,
    peak_live_bytes: u64,
    live_blocks: u64,
    peak_live_blocks: u64,
}

impl TableCounters {
    #[inline(always)]
    fn cell(&mut self, tag: usize) -> &mut TagCell {
        // Tag indices are below TAG_SLOTS (the table is bounded); clamp so a
        // bad index lands in the overflow bucket instead of panicking.
        let index = if tag < TAG_SLOTS { tag } else { OVERFLOW_SLOT };
        let present = matches!(&self.chunks, Some(chunks) if chunks[index / CHUNK].is_some());
        if !present {
            self.add_chunk(index / CHUNK);
        }
        match &mut self.chunks {
            Some(chunks) => match &mut chunks[index / CHUNK] {
                Some(chunk) => &mut chunk[index % CHUNK],
                None => unreachable!("add_chunk added it"),
            },
            None => unreachable!("add_chunk added it"),
        }
    }

    /// The first count of a tag of chunk `c` in this table (off the hot path).
    #[cold]
    #[inline(never)]
    fn add_chunk(&mut self, c: usize) {
        let chunks = self.chunks.get_or_insert_with(|| Box::new(std::array::from_fn(|_| None)));
        chunks[c].get_or_insert_with(|| Box::new([TagCell::default(); CHUNK]));
    }

    /// A block of `held` device bytes under the tag of index `tag` became
    /// live.
    #[inline]
    pub fn allocated(&mut self, tag: usize, held: u64) {
        let cell = self.cell(tag);
        cell.allocations += 1;
        cell.live_bytes += held;
        cell.peak_bytes = cell.peak_bytes.max(cell.live_bytes);
        self.live_bytes += held;
        self.live_blocks += 1;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.peak_live_blocks = self.peak_live_blocks.max(self.live_blocks);
    }

    /// A block counted by `allocated` was freed.
    #[inline]
    pub fn freed(&mut self, tag: usize, held: u64) {
        let cell = self.cell(tag);
        // Only blocks counted by `allocated` are freed: no underflow.
        cell.frees += 1;
        cell.live_bytes -= held;
        self.live_bytes -= held;
        self.live_blocks -= 1;
    }

    /// Every peak restarts from its current value.
    pub fn reset_peak(&mut self) {
        self.peak_live_bytes = self.live_bytes;
        self.peak_live_blocks = self.live_blocks;
        for chunk in self.chunks.iter_mut().flat_map(|c| c.iter_mut()).flatten() {
            for cell in chunk.iter_mut() {
                cell.peak_bytes = cell.live_bytes;
            }
        }
    }

    /// Add this table's counters to `out`.
    pub fn add_to(&self, out: &mut CountSummary) {
        out.totals.live_bytes += self.live_bytes;
        out.totals.peak_live_bytes += self.peak_live_bytes;
        out.totals.live_blocks += self.live_blocks;
        out.totals.peak_live_blocks += self.peak_live_blocks;
        let Some(chunks) = &self.chunks else { return };
        for (c, chunk) in chunks.iter().enumerate() {
            let Some(chunk) = chunk else { continue };
            for (i, cell) in chunk.iter().enumerate().filter(|(_, cell)| cell.allocations > 0) {
                let index = c * CHUNK + i;
                let entry = match out.tags.binary_search_by_key(&index, |t| t.tag) {
                    Ok(at) => &mut out.tags[at],
                    Err(at) => {
                        out.tags.insert(at, TagCounts::new(index));
                        &mut out.tags[at]
                    }
                };
                entry.live_bytes += cell.live_bytes;
                entry.live_blocks += cell.allocations - cell.frees;
                entry.peak_bytes += cell.peak_bytes;
                entry.allocations += cell.allocations;
                entry.frees += cell.frees;
            }
        }
    }
}

/// Counters of one tag, summed over the tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagCounts {
    /// The tag's index in the tag table.
    pub tag: usize,
    /// Device bytes of the tag's live blocks.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Highest `live_bytes` since the runtime opened or the last
    /// `reset_peak` (summed per table: see the module docs).
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
}

impl TagCounts {
    fn new(tag: usize) -> TagCounts {
        TagCounts { tag, live_bytes: 0, live_blocks: 0, peak_bytes: 0, allocations: 0, frees: 0 }
    }
}

/// Whole-allocator counters, summed over the tables.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TotalCounts {
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub live_blocks: u64,
    pub peak_live_blocks: u64,
}

/// What `HeldMemory::count_tags` gathers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountSummary {
    /// By tag index.
    pub tags: Vec<TagCounts>,
    pub totals: TotalCounts,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_peaks_and_resets_per_table_and_sums_tables() {
        let (a, b) = (10, 11);
        let mut one = TableCounters::default();
        one.allocated(a, 100);
        one.allocated(a, 100);
        one.freed(a, 100);
        one.allocated(b, 7);
        let mut other = TableCounters::default();
        other.allocated(a, 50);
        let mut sum = CountSummary::default();
        one.add_to(&mut sum);
        other.add_to(&mut sum);
        let ta = sum.tags.iter().find(|t| t.tag == a).unwrap();
        assert_eq!((ta.live_bytes, ta.live_blocks, ta.peak_bytes, ta.allocations, ta.frees), (150, 2, 250, 3, 1));
        assert_eq!(sum.totals, TotalCounts { live_bytes: 157, peak_live_bytes: 250, live_blocks: 3, peak_live_blocks: 3 });
        one.reset_peak();
        let mut sum = CountSummary::default();
        one.add_to(&mut sum);
        assert_eq!(sum.totals.peak_live_bytes, 107);
        assert_eq!(sum.tags.iter().find(|t| t.tag == a).unwrap().peak_bytes, 100);
    }
}
