//! `CallGate`: lets the calls into one runtime run side by side, and lets
//! close wait for the calls in flight, without a lock word that every call
//! writes and, where Linux's `membarrier` is available, without a single
//! read-modify-write on a call's path.
//!
//! Contract:
//! - [`CallGate::enter`] never blocks. It fails once [`CallGate::close`] has
//!   begun; otherwise the returned [`Pass`] keeps the gate open until it is
//!   dropped (a call may hold it across a blocking wait, e.g. a stream
//!   synchronisation, and close then waits for that wait to end). A thread
//!   may hold several passes at once.
//! - [`CallGate::close`] succeeds once: it makes every later `enter` fail,
//!   then waits until every pass taken before it has been dropped. A second
//!   close returns `false` at once.
//!
//! Launch calls (prepare/finish) take no pass: they close through the
//! allocator's shard locks instead (`StreamTracking::close_launches`).
//!
//! How a call counts itself. Each of the first `SLOTS` threads alive at
//! once owns a slot of the process (`ThreadSlot`), and every gate has a
//! counter per slot, on a cache line of its own, that only that thread
//! writes: entering stores count + 1 and then reads `closed`, leaving
//! stores count - 1, all plain loads and stores (an atomic increment cost
//! the allocate + free pair 13 ns of its 140 on the null device). Threads
//! past the first `SLOTS`, and every thread where the process barrier is
//! not available, count in one of `STRIPES` shared counters with
//! sequentially consistent increments instead.
//!
//! Why it is sound. Shared counters: `enter` increments, then reads
//! `closed`; `close` sets `closed`, then reads the counters; both sides use
//! sequentially consistent operations, so one of them sees the other.
//! Own slots: the CPU may let enter's read of `closed` pass its store
//! (a store buffer), so close pays for the order: it sets `closed`, then
//! makes the process barrier (`membarrier(2)`: a full barrier on every
//! CPU running one of our threads, before it returns), then reads the slots.
//! A caller whose read of `closed` came before the barrier on its CPU had
//! its store made visible by that barrier, so close sees its count and
//! waits; a caller whose read came after it sees `closed` and backs out.
//! (A compiler fence keeps the compiler from swapping the two.) So no call
//! passes the gate after close has found every counter at zero.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Whether the process barrier is available: asked for once per process
/// (membarrier's private expedited command needs a registration first).
fn register_process_barrier() -> bool {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{membarrier, MembarrierCommand};
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok())
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// A full memory barrier on every CPU that runs a thread of this process,
/// before it returns (a CPU that runs none has passed a context switch,
/// itself a barrier); `false` if it could not be made. A child of `fork`
/// inherits the registration flag but not the registration: it registers
/// again.
fn process_barrier() -> bool {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{membarrier, MembarrierCommand};
        membarrier(MembarrierCommand::PrivateExpedited).is_ok()
            || (membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
                && membarrier(MembarrierCommand::PrivateExpedited).is_ok())
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Threads with a counter of their own in every gate.
const SLOTS: usize = 64;
/// Shared counters for the others.
const STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Counter(AtomicU64);

pub struct CallGate {
    closed: AtomicBool,
    /// Whether the own slots are in use (the process barrier is available).
    own_slots: bool,
    slots: Box<[Counter]>,
    stripes: [Counter; STRIPES],
}

/// Proof of a call in flight; the gate stays open while it lives.
pub struct Pass<'a> {
    counter: &'a Counter,
    /// The counter is this thread's own slot (plain store), else shared.
    own: bool,
}

impl Drop for Pass<'_> {
    #[inline]
    fn drop(&mut self) {
        let c = &self.counter.0;
        if self.own {
            // Release: what the call did is before close sees it gone.
            c.store(c.load(Ordering::Relaxed) - 1, Ordering::Release);
        } else {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A thread's slot of the process: its index in every gate's `slots`
/// (`None` past the first `SLOTS` threads alive at once), given back when
/// the thread exits. A thread holds no pass when it exits (a pass lives
/// inside one call), so the next thread finds the counters at zero.
struct ThreadSlot(Option<usize>);

fn free_slots() -> &'static Mutex<Vec<usize>> {
    static FREE: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    FREE.get_or_init(|| Mutex::new((0..SLOTS).rev().collect()))
}

impl ThreadSlot {
    fn claim() -> ThreadSlot {
        ThreadSlot(free_slots().lock().unwrap_or_else(|p| p.into_inner()).pop())
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            free_slots().lock().unwrap_or_else(|p| p.into_inner()).push(i);
        }
    }
}

thread_local! {
    static SLOT: ThreadSlot = ThreadSlot::claim();
}

/// This thread's slot (`None`: none, or the thread-local is already gone
/// because the thread is exiting).
#[inline]
fn my_slot() -> Option<usize> {
    SLOT.try_with(|s| s.0).ok().flatten()
}

/// This thread's shared counter.
fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.try_with(|s| *s).unwrap_or(0)
}

impl Default for CallGate {
    fn default() -> Self {
        let own_slots = register_process_barrier();
        CallGate {
            closed: AtomicBool::new(false),
            own_slots,
            slots: (0..if own_slots { SLOTS } else { 0 }).map(|_| Counter::default()).collect(),
            stripes: Default::default(),
        }
    }
}

impl CallGate {
    /// A pass for one call, or `None` once close has begun.
    #[inline]
    pub fn enter(&self) -> Option<Pass<'_>> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let pass = match my_slot().filter(|_| self.own_slots) {
            Some(i) => {
                let counter = &self.slots[i];
                counter.0.store(counter.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                compiler_fence(Ordering::SeqCst);
                Pass { counter, own: true }
            }
            None => {
                let counter = &self.stripes[my_stripe()];
                counter.0.fetch_add(1, Ordering::SeqCst);
                Pass { counter, own: false }
            }
        };
        if self.closed.load(Ordering::SeqCst) {
            return None; // `pass` drops: the count goes back down
        }
        Some(pass)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Close the gate and wait for the passes already taken. `false` if it
    /// was closed before (nothing waited for).
    pub fn close(&self) -> bool {
        if self.closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        // Registered when the gate was made, so the barrier is available
        // (it fails only without the registration). Should it fail all
        // the same, give the callers' stores time to drain from their
        // CPUs' store buffers (nanoseconds) before reading the counters.
        if self.own_slots && !process_barrier() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut pause = Duration::from_micros(1);
        while self.slots.iter().chain(self.stripes.iter()).any(|c| c.0.load(Ordering::SeqCst) != 0) {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn enter_fails_after_close() {
        let gate = CallGate::default();
        assert!(gate.enter().is_some());
        assert!(gate.close());
        assert!(gate.enter().is_none());
        assert!(!gate.close(), "a second close reports that the gate was already closed");
    }

    #[test]
    fn close_waits_for_passes_in_flight() {
        let gate = Arc::new(CallGate::default());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let holder = {
            let (gate, done) = (gate.clone(), done.clone());
            std::thread::spawn(move || {
                let pass = gate.enter().expect("open");
                entered_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                done.store(true, Ordering::SeqCst);
                drop(pass);
            })
        };
        entered_rx.recv().unwrap();
        let closer = {
            let (gate, done) = (gate.clone(), done.clone());
            std::thread::spawn(move || {
                assert!(gate.close());
                // Close returned: the pass must have been dropped first.
                assert!(done.load(Ordering::SeqCst), "close returned while a call was in flight");
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!closer.is_finished(), "close did not wait for the pass in flight");
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        closer.join().unwrap();
    }

    /// The tests that take every slot of the process run one at a time.
    static SLOT_TESTS: Mutex<()> = Mutex::new(());

    #[test]
    fn threads_past_the_own_slots_share_counters_and_close_still_waits_for_all() {
        let _one_at_a_time = SLOT_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        // More threads than own slots, all in the gate at once: each holds
        // a pass until told to let go; close must wait for every one.
        let gate = Arc::new(CallGate::default());
        let threads = SLOTS + 24;
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let release = Arc::new(AtomicBool::new(false));
        let left = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (gate, entered_tx, release, left) = (gate.clone(), entered_tx.clone(), release.clone(), left.clone());
                std::thread::spawn(move || {
                    let pass = gate.enter().expect("open");
                    let nested = gate.enter().expect("a second pass on the same thread");
                    entered_tx.send(pass.own).unwrap();
                    while !release.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    drop(nested);
                    left.fetch_add(1, Ordering::SeqCst);
                    drop(pass);
                })
            })
            .collect();
        let own = (0..threads).filter(|_| entered_rx.recv().unwrap()).count();
        if gate.own_slots {
            assert!((1..=SLOTS).contains(&own), "{own} threads in own slots");
            assert!(own < threads, "threads past the slots use the shared counters");
        }
        let closer = {
            let (gate, left) = (gate.clone(), left.clone());
            std::thread::spawn(move || {
                assert!(gate.close());
                assert_eq!(left.load(Ordering::SeqCst), threads, "close returned with passes in flight");
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!closer.is_finished(), "close did not wait for the passes in flight");
        release.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap();
        }
        closer.join().unwrap();
    }

    #[test]
    fn slots_of_exited_threads_serve_new_threads() {
        let _one_at_a_time = SLOT_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        // Many more threads than slots over the gate's life, one after
        // another: each finds a slot (given back by the last), and the
        // counters are back at zero for close.
        let gate = Arc::new(CallGate::default());
        for _ in 0..4 * SLOTS {
            let g = gate.clone();
            let own = std::thread::spawn(move || g.enter().expect("open").own).join().unwrap();
            assert_eq!(own, gate.own_slots, "a thread alone gets a slot of its own where the barrier is available");
        }
        assert!(gate.close());
    }

    #[test]
    fn many_threads_never_pass_after_close() {
        let gate = Arc::new(CallGate::default());
        let closed_seen = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (gate, closed_seen) = (gate.clone(), closed_seen.clone());
                std::thread::spawn(move || {
                    while let Some(_pass) = gate.enter() {
                        assert!(!closed_seen.load(Ordering::SeqCst), "a pass after close returned");
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10));
        assert!(gate.close());
        closed_seen.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap();
        }
    }
}
