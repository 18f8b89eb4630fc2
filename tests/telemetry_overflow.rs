//! Per-tag counters once the process-wide tag table is full: new names
//! share the `(other)` bucket, which is counted like any tag. The table is
//! process-wide, so this binary holds this one test alone.

use xlog_cuda::resource::{AllocTag, MAX_TAGS, OVERFLOW_TAG_NAME};
use xlog_cuda::{Backend, Config, Runtime};

#[test]
fn tags_past_the_table_bound_are_counted_in_the_other_bucket() {
    let rt = Runtime::open(0, &Config { backend: Backend::Sim, ..Config::default() }).unwrap();
    let s = rt.acquire_stream().unwrap();
    let early = rt.allocate(256, s, "ov-early").unwrap();
    // Fill the table.
    for i in 0..MAX_TAGS {
        AllocTag::new(&format!("ov-filler-{i}"));
    }
    assert_eq!(AllocTag::interned(), MAX_TAGS);
    let late: Vec<_> = (0..5).map(|i| rt.allocate(1024, s, &format!("ov-late-{i}")).unwrap()).collect();
    rt.deallocate(&late[0].id).unwrap();
    let tags = rt.tag_stats().unwrap();
    assert_eq!(tags.len(), 2, "{tags:?}");
    let other = tags.iter().find(|t| &*t.name == OVERFLOW_TAG_NAME).expect("the (other) bucket");
    assert_eq!(other.tag, AllocTag::OVERFLOW);
    assert_eq!((other.allocations, other.frees, other.live_blocks), (5, 1, 4));
    assert_eq!(other.live_bytes, 4 * late[1].held);
    assert_eq!(other.peak_bytes, 5 * late[1].held);
    let early_stats = tags.iter().find(|t| &*t.name == "ov-early").unwrap();
    assert_eq!(early_stats.live_bytes, early.held);
    // The live list names the bucket too.
    let list = rt.live_blocks().unwrap();
    assert_eq!(list.iter().filter(|e| &*e.tag_name == OVERFLOW_TAG_NAME).count(), 4);
    assert!(rt.memory_summary(10).unwrap().contains(OVERFLOW_TAG_NAME));
    for b in &late[1..] {
        rt.deallocate(&b.id).unwrap();
    }
    rt.deallocate(&early.id).unwrap();
    rt.close().unwrap();
}
