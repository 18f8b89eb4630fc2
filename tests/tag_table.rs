//! The tag table is bounded: a program that allocates with a million
//! distinct tags (one per query, say) keeps at most `MAX_TAGS` names, the
//! early names stay readable, later new ones are recorded as `(other)`, and
//! the process does not grow with the number of tags.
//!
//! The table is process-wide, so this binary holds this one test alone.

use std::ffi::{c_char, CString};

use xlog_cuda::ffi::api::*;
use xlog_cuda::ffi::types::*;
use xlog_cuda::resource::{AllocTag, MAX_TAGS, OVERFLOW_TAG_NAME};

const DISTINCT_TAGS: usize = 1_000_000;

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    let n = unsafe { xlog_last_error_message(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Resident memory of this process in bytes (Linux).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_million_distinct_tags_keep_the_table_and_the_process_bounded() {
    let mut cfg = std::mem::MaybeUninit::<xlog_config>::zeroed();
    // SAFETY: writable storage for one config, fully initialised after.
    let mut cfg = unsafe {
        xlog_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.struct_size = std::mem::size_of::<xlog_config>() as u32;
    cfg.backend = XLOG_BACKEND_SIM;
    cfg.budget_bytes = 0;
    cfg.log_path = std::ptr::null();
    cfg.sim_capacity_bytes = 64 << 20;
    let mut rt = std::ptr::null_mut();
    // SAFETY: valid config and out-pointer.
    assert_eq!(unsafe { xlog_runtime_open(0, &cfg, &mut rt) }, XLOG_OK, "{}", last_error());
    let mut s = 0;
    assert_eq!(xlog_stream_acquire(rt, &mut s), XLOG_OK);

    let mut resident_after_warmup = 0;
    let mut first = None;
    for i in 0..DISTINCT_TAGS {
        // Long-ish names (about 60 bytes), as a query id with a prefix.
        let tag = CString::new(format!("query-{i:012}-join-output-partition-with-a-longer-name")).unwrap();
        let mut b = xlog_block { ptr: std::ptr::null_mut(), size: 0, generation: 0, stream: 0, device: 0 };
        // SAFETY: live C string and valid out-pointer.
        let st = unsafe { xlog_allocate(rt, 256, s, tag.as_ptr(), &mut b) };
        assert_eq!(st, XLOG_OK, "allocation {i}: {}", last_error());
        if i == 0 {
            first = Some(b); // kept live: its tag shows in the leak report
        } else {
            assert_eq!(xlog_deallocate(rt, b), XLOG_OK);
        }
        if i % 1024 == 1023 {
            assert_eq!(xlog_reap(rt, std::ptr::null_mut()), XLOG_OK);
        }
        if i == 2 * MAX_TAGS {
            resident_after_warmup = resident_bytes();
        }
    }
    assert_eq!(xlog_drain(rt, std::ptr::null_mut()), XLOG_OK);

    assert_eq!(AllocTag::interned(), MAX_TAGS, "the table holds exactly its bound");
    let grown = resident_bytes().saturating_sub(resident_after_warmup);
    // Unbounded, a million ~60-byte names cost well over 100 MiB here.
    assert!(grown < 16 << 20, "resident memory grew by {grown} bytes over {DISTINCT_TAGS} distinct tags");

    // Early names stay; new ones past the bound share the overflow bucket.
    let early = AllocTag::new("query-000000000000-join-output-partition-with-a-longer-name");
    assert_eq!(&*early.name(), "query-000000000000-join-output-partition-with-a-longer-name");
    let late = AllocTag::new("a-name-never-seen-before");
    assert_eq!(late, AllocTag::OVERFLOW);
    assert_eq!(&*late.name(), OVERFLOW_TAG_NAME);
    assert_eq!(AllocTag::interned(), MAX_TAGS);

    let _ = first;
    let (mut leaked_blocks, mut leaked_bytes) = (0, 0);
    assert_eq!(xlog_runtime_close_report(rt, &mut leaked_blocks, &mut leaked_bytes), XLOG_OK);
    assert_eq!((leaked_blocks, leaked_bytes), (1, 256));
}
