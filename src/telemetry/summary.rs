//! The text memory summary (`xlog_memory_summary`, `Runtime::memory_summary`):
//! totals, the per-tag table and the largest live blocks. Every figure is
//! printed as an exact byte count (so scripts and tests can find it) with a
//! human-readable size beside the totals.

use std::fmt::Write;

use super::{LiveBlock, Stats, TagStats, TotalCounts};

/// What the summary is made from.
pub struct SummaryInput<'a> {
    pub device: i32,
    pub backend: &'a str,
    pub stats: &'a Stats,
    pub totals: TotalCounts,
    pub tags: &'a [TagStats],
    pub blocks: &'a [LiveBlock],
    /// How many of the largest live blocks to list.
    pub top_n: usize,
}

/// `bytes` as "1.50 MiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

fn row(out: &mut String, label: &str, bytes: u64, extra: &str) {
    let _ = writeln!(out, "  {label:<10} {bytes:>16} B  {:>11}  {extra}", human(bytes));
}

/// The summary text (ends with a newline).
pub fn format(input: &SummaryInput<'_>) -> String {
    let s = input.stats;
    let t = &input.totals;
    let mut out = String::new();
    let _ = writeln!(out, "xlog memory summary: device {} ({})", input.device, input.backend);
    let _ = writeln!(out, "totals (device bytes)");
    row(&mut out, "live", s.live_bytes, &format!("{} blocks", s.live_blocks));
    row(&mut out, "live peak", t.peak_live_bytes, &format!("{} blocks at most", t.peak_live_blocks));
    row(&mut out, "cached", s.cached_bytes, &format!("{} blocks", s.cached_blocks));
    row(&mut out, "pending", s.pending_bytes, &format!("{} blocks", s.pending_blocks));
    row(&mut out, "held", s.outstanding_bytes, "live + cached + pending");
    row(&mut out, "held peak", s.peak_outstanding_bytes, "");
    row(&mut out, "reserved", s.reserved_bytes, "the driver's pool");
    if s.budget_limit > 0 {
        row(&mut out, "budget", s.budget_limit, &format!("{} B remaining", s.budget_remaining));
    } else {
        let _ = writeln!(out, "  {:<10} {:>16}", "budget", "none");
    }
    let _ = writeln!(
        out,
        "  allocations {}, frees {}, refused {}, cache hits {}, cache misses {}",
        s.allocations, s.deallocations, s.failed_allocations, s.cache_hits, s.cache_misses
    );

    let _ = writeln!(out, "per tag ({} tags, largest live first)", input.tags.len());
    let _ = writeln!(
        out,
        "  {:<24} {:>16} {:>11} {:>16} {:>12} {:>12}",
        "tag", "live bytes", "live blocks", "peak bytes", "allocations", "frees"
    );
    for tag in input.tags {
        let name = if tag.name.is_empty() { "(untagged)" } else { &tag.name };
        let _ = writeln!(
            out,
            "  {:<24} {:>16} {:>11} {:>16} {:>12} {:>12}",
            name, tag.live_bytes, tag.live_blocks, tag.peak_bytes, tag.allocations, tag.frees
        );
    }

    let mut largest: Vec<&LiveBlock> = input.blocks.iter().collect();
    largest.sort_by(|a, b| b.device_bytes.cmp(&a.device_bytes).then(a.sequence.cmp(&b.sequence)));
    largest.truncate(input.top_n);
    let _ = writeln!(out, "largest live blocks ({} of {})", largest.len(), input.blocks.len());
    let _ = writeln!(
        out,
        "  {:>16} {:>16} {:>7} {:>12} {:>20} {:>18}  {:<24} call site",
        "device bytes", "requested", "stream", "allocs ago", "generation", "ptr", "tag"
    );
    for b in largest {
        let name = if b.tag_name.is_empty() { "(untagged)" } else { &b.tag_name };
        let site = match (b.call_site, b.age) {
            (Some(site), Some(age)) => format!("{} ({:.3} s ago)", site.name(), age.as_secs_f64()),
            (Some(site), None) => site.name(),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "  {:>16} {:>16} {:>7} {:>12} {:>20} {:>#18x}  {:<24} {}",
            b.device_bytes, b.id.size, b.id.alloc_stream.0, b.allocations_since, b.id.generation.0, b.id.ptr, name, site
        );
    }
    out
}
