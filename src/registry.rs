//! One design for the tables that calls on a hot path look something up
//! in: a shared table under a read-write lock, an epoch that moves whenever
//! an answer the table gave may have stopped being true, and a per-thread
//! memo of the last answers, each stamped with the epoch it was read at.
//! A thread that finds its answer in its memo, stamped with the current
//! epoch, takes no lock and touches no shared cache line but the epoch's
//! (read-only). Three tables use it: the C boundary's runtime handles
//! (`ffi`), the framework hooks of each device (`hooks`), and each stream
//! pool's live stream ids (`stream_pool`).
//!
//! Contract:
//! - `Registry::read` gives the table for lookups, `Registry::write` for
//!   changes. A change that removes or replaces an entry (so that an
//!   answer given before stops being true) calls `Registry::invalidate`
//!   while it holds the write guard: the epoch moves under the write lock,
//!   so no answer read under an older epoch is used again, and an answer
//!   read under the read lock is stamped with the epoch that goes with it.
//! - `Memo::get(key, epoch)`: the value memoized for `key` when it was
//!   stamped `epoch`, borrowed (the borrow is what `remember` respects).
//!   `Memo::remember` keeps a value, the newest first, and hands back the
//!   one it pushed out for the caller to drop; it keeps nothing (and says
//!   so) while a value of the memo is borrowed (a call that resolves again inside the
//!   use of a memoized value), so a borrowed value never moves or dies.
//! - `Registry::resolve` is the usual round trip: the memo, else the table
//!   (then memoized), then `f` on the value.
//! - A memo belongs to one thread (it is not `Sync`); the values it holds
//!   keep what they refer to alive (an `Arc`) or are plain copies.

use std::cell::{Ref, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A table behind a read-write lock, with the epoch of its answers.
pub struct Registry<T> {
    /// Made by `init` on first use, so that a registry can be a plain
    /// `static` whose epoch a memo hit reads without any check.
    state: OnceLock<RwLock<T>>,
    init: fn() -> T,
    epoch: Epoch,
}

/// The epoch, on a cache line of its own: every memo hit of every thread
/// reads it, and the lock beside it is written by every lookup that
/// misses and by every change.
#[repr(align(64))]
struct Epoch(AtomicU64);

impl<T> Registry<T> {
    /// A registry whose table `init` makes on first use.
    pub const fn new(init: fn() -> T) -> Registry<T> {
        Registry { state: OnceLock::new(), init, epoch: Epoch(AtomicU64::new(0)) }
    }

    fn state(&self) -> &RwLock<T> {
        self.state.get_or_init(|| RwLock::new((self.init)()))
    }

    /// The epoch now: a memoized answer stamped with it is still true.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.0.load(Ordering::Acquire)
    }

    /// The table, for lookups. An answer read here is stamped with
    /// `epoch()` read while this guard is held.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.state().read().unwrap_or_else(|p| p.into_inner())
    }

    /// The table, for a change that only adds entries.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.state().write().unwrap_or_else(|p| p.into_inner())
    }

    /// Move the epoch on, for a change that removes or replaces entries:
    /// every answer memoized before is dead from now on. `held` is this
    /// registry's write guard, so the epoch moves under the write lock: a
    /// reader that saw the old state also saw the old epoch, and one that
    /// sees the new epoch sees the change.
    pub fn invalidate(&self, held: &mut RwLockWriteGuard<'_, T>) {
        let _ = held;
        self.epoch.0.fetch_add(1, Ordering::AcqRel);
    }

    /// `f` on the value of `key`: from `memo` while its answer is current,
    /// else found in the table by `find` (None: `f` is not run) and
    /// memoized.
    #[inline]
    pub fn resolve<K: PartialEq + Copy, V: Clone, R, const N: usize>(
        &self,
        memo: &Memo<K, V, N>,
        key: K,
        find: impl FnOnce(&T) -> Option<V>,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        if let Some(value) = memo.get(key, self.epoch()) {
            return Some(f(&value));
        }
        let (value, epoch) = {
            let table = self.read();
            (find(&table)?, self.epoch())
        };
        let _pushed_out = memo.remember(key, epoch, value.clone());
        Some(f(&value))
    }
}

struct Memoized<K, V> {
    key: K,
    epoch: u64,
    value: V,
}

/// One thread's last `N` answers from one or more registries (a key names
/// the registry where several share a memo).
pub struct Memo<K, V, const N: usize> {
    entries: RefCell<[Option<Memoized<K, V>>; N]>,
}

impl<K: PartialEq + Copy, V, const N: usize> Memo<K, V, N> {
    pub const fn new() -> Memo<K, V, N> {
        Memo { entries: RefCell::new([const { None }; N]) }
    }

    /// The value memoized for `key` at `epoch`, borrowed.
    #[inline]
    pub fn get(&self, key: K, epoch: u64) -> Option<Ref<'_, V>> {
        Ref::filter_map(self.entries.borrow(), |entries| {
            entries.iter().flatten().find(|e| e.key == key && e.epoch == epoch).map(|e| &e.value)
        })
        .ok()
    }

    /// Keep `value` as the answer for `key` at `epoch`, first: `Ok` with
    /// the value pushed out (the oldest, or the one `value` replaces), or
    /// `Err(value)`, keeping nothing, while a value of the memo is borrowed.
    pub fn remember(&self, key: K, epoch: u64, value: V) -> Result<Option<V>, V> {
        let Ok(mut entries) = self.entries.try_borrow_mut() else {
            return Err(value);
        };
        let slot = entries.iter().position(|e| e.as_ref().is_some_and(|e| e.key == key)).unwrap_or(N - 1);
        let old = entries[slot].take().map(|e| e.value);
        entries[..=slot].rotate_right(1);
        entries[0] = Some(Memoized { key, epoch, value });
        Ok(old)
    }

    /// Forget the answers whose key `matches`, handing them back for the
    /// caller to drop (nothing while a value of the memo is borrowed).
    pub fn forget(&self, matches: impl Fn(&K) -> bool) -> Vec<V> {
        let Ok(mut entries) = self.entries.try_borrow_mut() else {
            return Vec::new();
        };
        entries.iter_mut().filter(|e| e.as_ref().is_some_and(|e| matches(&e.key))).filter_map(|e| e.take().map(|e| e.value)).collect()
    }
}

impl<K: PartialEq + Copy, V, const N: usize> Default for Memo<K, V, N> {
    fn default() -> Self {
        Memo::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_memoized_answer_is_used_until_the_epoch_moves() {
        let registry = Registry::new(|| HashMap::from([(1u32, 10u64)]));
        let memo: Memo<u32, u64, 2> = Memo::new();
        let lookups = std::cell::Cell::new(0);
        let find = |t: &HashMap<u32, u64>| {
            lookups.set(lookups.get() + 1);
            t.get(&1).copied()
        };
        assert_eq!(registry.resolve(&memo, 1, find, |v| *v), Some(10));
        assert_eq!(registry.resolve(&memo, 1, find, |v| *v), Some(10));
        assert_eq!(lookups.get(), 1, "the second answer came from the memo");
        registry.write().insert(2, 20);
        assert_eq!(registry.resolve(&memo, 1, find, |v| *v), Some(10));
        assert_eq!(lookups.get(), 1, "an added entry leaves the memo good");
        {
            let mut table = registry.write();
            registry.invalidate(&mut table);
            table.insert(1, 11);
        }
        assert_eq!(registry.resolve(&memo, 1, find, |v| *v), Some(11));
        assert_eq!(lookups.get(), 2);
        {
            let mut table = registry.write();
            table.remove(&1);
            registry.invalidate(&mut table);
        }
        assert_eq!(registry.resolve(&memo, 1, find, |v| *v), None);
    }

    #[test]
    fn the_memo_keeps_the_newest_answers_and_nothing_while_one_is_borrowed() {
        let memo: Memo<u32, String, 2> = Memo::new();
        assert_eq!(memo.remember(1, 0, "a".into()), Ok(None));
        assert_eq!(memo.remember(2, 0, "b".into()), Ok(None));
        assert_eq!(memo.remember(3, 0, "c".into()), Ok(Some("a".into())), "the oldest goes");
        assert_eq!(memo.remember(2, 1, "b1".into()), Ok(Some("b".into())), "a key's answer is replaced");
        assert!(memo.get(2, 0).is_none(), "stamped with another epoch");
        let held = memo.get(2, 1).unwrap();
        assert_eq!(memo.remember(4, 1, "d".into()), Err("d".into()), "kept nothing while borrowed");
        assert!(memo.forget(|_| true).is_empty());
        assert_eq!(*held, "b1");
        drop(held);
        assert_eq!(memo.forget(|k| *k == 3), vec!["c".to_string()]);
        assert!(memo.get(3, 0).is_none() && memo.get(2, 1).is_some());
    }
}
