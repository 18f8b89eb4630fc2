//! `CallGate`: lets the calls into one runtime run side by side, and lets
//! close wait for the calls in flight, without a lock word that every call
//! writes.
//!
//! Contract:
//! - [`CallGate::enter`] never blocks. It fails once [`CallGate::close`] has
//!   begun; otherwise the returned [`Pass`] keeps the gate open until it is
//!   dropped (a call may hold it across a blocking wait, e.g. a stream
//!   synchronisation, and close then waits for that wait to end).
//! - [`CallGate::close`] succeeds once: it makes every later `enter` fail,
//!   then waits until every pass taken before it has been dropped. A second
//!   close returns `false` at once.
//!
//! Launch calls (prepare/finish) take no pass: they close through the
//! allocator's shard locks instead (`StreamTracking::close_launches`).
//!
//! Why not a reader-writer lock: its state word is written by every reader,
//! so eight threads on eight streams bounce one cache line on every call.
//! Here each thread counts its passes in one of `STRIPES` counters (picked
//! once per thread), each on a cache line of its own.
//!
//! Why it is sound: `enter` increments its stripe, then reads `closed`;
//! `close` sets `closed`, then reads the stripes. Both sides use sequentially
//! consistent operations, so at least one of them sees the other: either the
//! caller sees `closed` (and backs out), or close sees the caller's count
//! (and waits for it). No call can pass the gate after close has found every
//! stripe at zero.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Stripe(AtomicU64);

pub struct CallGate {
    closed: AtomicBool,
    stripes: [Stripe; STRIPES],
}

/// Proof of a call in flight; the gate stays open while it lives.
pub struct Pass<'a> {
    stripe: &'a Stripe,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.stripe.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl Default for CallGate {
    fn default() -> Self {
        CallGate { closed: AtomicBool::new(false), stripes: Default::default() }
    }
}

impl CallGate {
    /// A pass for one call, or `None` once close has begun.
    #[inline]
    pub fn enter(&self) -> Option<Pass<'_>> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let stripe = &self.stripes[my_stripe()];
        stripe.0.fetch_add(1, Ordering::SeqCst);
        let pass = Pass { stripe };
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
        let mut pause = Duration::from_micros(1);
        while self.stripes.iter().any(|s| s.0.load(Ordering::SeqCst) != 0) {
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
