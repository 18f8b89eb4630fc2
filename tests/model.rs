//! Reference-model testing: random sequences of operations — allocate,
//! deallocate, validate, prepare / finish, prepare_all / finish_all, launches
//! with host kernels, reap, drain, stream acquire / release, host callbacks
//! and synchronize — including stale handles, double frees, forged handles,
//! released and never-issued stream ids, zero / absurd / over-budget sizes,
//! run against a sim runtime and the model in `common/model.rs`, comparing
//! the exact status and the byte counts after every step.
//!
//! Six stacks: Direct, the async pool with its stream-ordered cache (alone,
//! under a budget, under a budget and a logging layer) and with the cache
//! off (alone and under a budget). With the cache on the model knows every
//! cached block (the device under the runtime records each block the pool
//! gives back to the driver) and checks each allocation against the
//! hand-out rule, trim against its report, refusals against the state they
//! leave, and the budget invariant after every operation.
//!
//! 13,000 sequences per run in total (six stacks), 20–60 operations each,
//! generated from a fixed seed with ChaCha, so a run is reproducible; a
//! failure is shrunk to a minimal sequence and reported with the seed.
//! Replay or explore:
//!
//! ```text
//! PROPTEST_RNG_SEED=<seed> cargo test --release --test model -- <test name>
//! PROPTEST_CASES=<n>       cargo test --release --test model
//! ```
//!
//! Failure persistence is off: the seed is the record (see RELIABILITY.md).

mod common;

use std::sync::Mutex;
use std::time::Instant;

use common::model::{op, Harness, HarnessOpts, Op, Tally};
use common::StackKind;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, RngSeed, TestCaseError, TestRunner};

#[derive(Clone, Debug)]
struct Case {
    ops: Vec<Op>,
    /// Budget stacks only: wait for pending frees before refusing.
    wait_on_pressure: bool,
    /// Free everything and drain before close (else close reports leaks).
    free_all_at_end: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (prop::collection::vec(op(), 20..=60), any::<bool>(), prop::bool::weighted(0.7)).prop_map(
        |(ops, wait_on_pressure, free_all_at_end)| Case { ops, wait_on_pressure, free_all_at_end },
    )
}

fn run_case(kind: StackKind, case: &Case) -> Result<Tally, String> {
    let mut opts = HarnessOpts::for_stack(kind);
    opts.wait_on_pressure = case.wait_on_pressure && kind.has_budget();
    let mut h = Harness::open(kind, opts)?;
    for op in &case.ops {
        h.step(op)?;
    }
    if case.free_all_at_end {
        h.free_all_and_drain()?;
    }
    h.close()
}

/// The seed: `PROPTEST_RNG_SEED` when set, else this test's fixed one.
fn seed_and_cases(default_seed: u64, default_cases: u32) -> (u64, u32) {
    let env = Config::default();
    let seed = match env.rng_seed {
        RngSeed::Fixed(s) => s,
        RngSeed::Random => default_seed,
    };
    let cases = if std::env::var_os("PROPTEST_CASES").is_some() { env.cases } else { default_cases };
    (seed, cases)
}

fn run_model(kind: StackKind, test_name: &str, default_seed: u64, default_cases: u32) -> Tally {
    let (seed, cases) = seed_and_cases(default_seed, default_cases);
    let config = Config {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let tally = Mutex::new(Tally::default());
    let ops = Mutex::new(0u64);
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |c| match run_case(kind, &c) {
        Ok(t) => {
            tally.lock().unwrap().merge(&t);
            *ops.lock().unwrap() += c.ops.len() as u64;
            Ok(())
        }
        Err(e) => Err(TestCaseError::fail(e)),
    });
    if let Err(e) = result {
        panic!(
            "[{kind}] the runtime disagrees with the model (rng seed {seed}, ChaCha).\n\
             Replay: PROPTEST_RNG_SEED={seed} cargo test --release --test model -- {test_name}\n{e}"
        );
    }
    let tally = tally.into_inner().unwrap();
    let ops = ops.into_inner().unwrap();
    println!(
        "[{kind}] {cases} sequences, {ops} operations, seed {seed}, {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        tally.render()
    );
    tally
}

/// The run must really have exercised what it claims to test.
fn assert_exercised(kind: StackKind, t: &Tally, what: &[&str]) {
    for w in what {
        assert!(t.get(w) > 0, "[{kind}] no sequence exercised {w:?}: {}", t.render());
    }
}

const COMMON: [&str; 9] = [
    "allocate",
    "allocate zero",
    "free",
    "stale or double free",
    "forged handle",
    "unknown stream",
    "pool exhausted",
    "release",
    "host callback",
];

#[test]
fn budget_async_agrees_with_the_model() {
    let kind = StackKind::BudgetAsync;
    let t = run_model(kind, "budget_async_agrees_with_the_model", 0x5EED_0001, 4000);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &CACHE);
    assert_exercised(
        kind,
        &t,
        &["out of budget", "pending retired by a reap", "reap (bytes)", "launch", "stale handle", "drain"],
    );
}

#[test]
fn async_agrees_with_the_model() {
    let kind = StackKind::Async;
    let t = run_model(kind, "async_agrees_with_the_model", 0x5EED_0002, 3000);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &CACHE);
    assert_exercised(kind, &t, &["out of memory", "reap (bytes)", "launch", "prepare_all", "finish_all"]);
}

#[test]
fn direct_agrees_with_the_model() {
    let kind = StackKind::Direct;
    let t = run_model(kind, "direct_agrees_with_the_model", 0x5EED_0003, 2000);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &["out of memory", "tracking refused (Direct)", "reap (nothing)"]);
}

/// What the cache-on stacks must have exercised.
const CACHE: [&str; 7] = [
    "cache hit (own stream)",
    "cache hit (another stream)",
    "cache miss",
    "cached block released to the driver",
    "trim (released)",
    "trim (nothing)",
    "free",
];

#[test]
fn async_without_cache_agrees_with_the_model() {
    let kind = StackKind::AsyncNoCache;
    let t = run_model(kind, "async_without_cache_agrees_with_the_model", 0x5EED_0005, 1500);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &["out of memory", "reap (bytes)", "launch", "trim (nothing)"]);
}

#[test]
fn budget_async_without_cache_agrees_with_the_model() {
    let kind = StackKind::BudgetAsyncNoCache;
    let t = run_model(kind, "budget_async_without_cache_agrees_with_the_model", 0x5EED_0006, 1500);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &["out of budget", "pending retired by a reap", "reap (bytes)", "launch", "drain"]);
}

#[test]
fn budget_logging_async_agrees_with_the_model() {
    let kind = StackKind::BudgetLoggingAsync;
    let t = run_model(kind, "budget_logging_async_agrees_with_the_model", 0x5EED_0004, 1000);
    assert_exercised(kind, &t, &COMMON);
    assert_exercised(kind, &t, &CACHE);
    assert_exercised(kind, &t, &["out of budget", "launch"]);
}
