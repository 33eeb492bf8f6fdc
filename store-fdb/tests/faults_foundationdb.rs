//! FoundationDB's own client fault injection ("client buggify") under the
//! store: the client library makes requests fail at random, among them
//! commits reported `commit_unknown_result` that did commit. The audit is
//! the one the embedded engine's seeded faults run (`faults_embedded.rs`):
//! every intent's effect exactly once, every record completed.
//!
//! A binary of its own, with one test: network options apply to the whole
//! process, and fault injection must not leak into the other suites.
//! Compiled only with the `foundationdb` feature; needs a cluster
//! (`scripts/test-foundationdb` starts one).
#![cfg(feature = "foundationdb")]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use store_core::Policy;
use store_fdb::testkit::{audit_intents, fault_intents, foundationdb};
use store_fdb::{FoundationDbNetwork, NetworkOption};

/// Share of the client library's fault-injection sites that are active in
/// this process, in percent.
const BUGGIFY_SECTIONS_ACTIVATED_PERCENT: i32 = 100;
/// Share of the passes through an active site that inject its fault.
const BUGGIFY_SECTIONS_FIRED_PERCENT: i32 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_fault_injection_gives_no_duplicate_effects_and_no_lost_completions() {
    FoundationDbNetwork::start_with_options(vec![
        NetworkOption::ClientBuggifyEnable,
        NetworkOption::ClientBuggifySectionActivatedProbability(BUGGIFY_SECTIONS_ACTIVATED_PERCENT),
        NetworkOption::ClientBuggifySectionFiredProbability(BUGGIFY_SECTIONS_FIRED_PERCENT),
    ])
    .expect("start FoundationDB's client network with fault injection");
    let store = Arc::new(foundationdb().await.observed().store(Policy::default()));
    let intents = fault_intents();
    audit_intents(store.clone(), intents).await;
    let counters = store.engine().counters();
    let (runs, attempts, after_unknown) = (
        counters.runs.load(Ordering::Relaxed),
        counters.attempts.load(Ordering::Relaxed),
        counters.attempts_after_unknown_result.load(Ordering::Relaxed),
    );
    println!("{intents} intents: {runs} transactions, {attempts} attempts, {after_unknown} after an unknown result");
    assert!(attempts > runs, "no attempt was retried: the faults were not injected");
    assert!(
        after_unknown > 0,
        "no commit_unknown_result was injected, so the audit proved nothing about it"
    );
}
