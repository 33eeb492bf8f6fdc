//! Ambiguous commits.
//!
//! The embedded engine's seeded fault switch answers 5 % of the commits
//! that write with `commit_unknown_result`: half of them without committing,
//! half after committing for real. The label route is driven in-process
//! (`server::router` over the real label store) with one derived key per
//! parcel, each retried until it gets its answer. Afterwards: one label and
//! one carrier purchase per parcel (no duplicate effect), and every answer
//! given is the one the record saved (no lost completion).
//!
//! `IDEM_AMBIGUOUS_CREATES` sets the number of creates (CI default 1,000).

use crate::support::backends::BackendSetup;
use crate::support::service::{Service, ServiceOptions};
use crate::support::{
    ALICE_ID, LabelPost, Reply, client, derived_key, label_body, metric_value, scaled, seed, unique_order_id,
};
use futures::StreamExt;
use server::backend::StoreKind;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use store_core::{CallerId, IdempotencyKey, RecordState};
use store_fdb::FaultPlan;

/// Creates when `IDEM_AMBIGUOUS_CREATES` is not set.
pub const CREATES_CI_DEFAULT: usize = 1_000;
/// Commits answered "unknown result" without committing, per million.
const UNKNOWN_BEFORE_COMMIT_PPM: u32 = 25_000;
/// Commits that commit and are then answered "unknown result", per million.
const UNKNOWN_AFTER_COMMIT_PPM: u32 = 25_000;
/// Creates in flight at once.
const CONCURRENCY: usize = 32;
/// Attempts one create may take before the test gives up on it.
const ATTEMPTS_PER_CREATE_MAX: usize = 100;
/// Pause after a 409 or 503 before the next attempt.
const RETRY_PAUSE_MS: u64 = 20;

/// One create, retried with its key until it gets a 201.
async fn create(http: &reqwest::Client, base: &str, order_id: u64) -> (u64, Reply, usize) {
    let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
    for attempt in 1..=ATTEMPTS_PER_CREATE_MAX {
        let reply = LabelPost::new(&key, &body).send(http, base).await.expect("answer");
        match reply.status {
            201 => return (order_id, reply, attempt),
            409 | 503 => tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await,
            status => panic!("create {order_id}: {status} {}", reply.text()),
        }
    }
    panic!("create {order_id}: no answer in {ATTEMPTS_PER_CREATE_MAX} attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_commit_results_give_no_duplicate_effect_and_no_lost_completion() {
    let creates = scaled("IDEM_AMBIGUOUS_CREATES", CREATES_CI_DEFAULT);
    let faults = FaultPlan {
        unknown_before_commit_ppm: UNKNOWN_BEFORE_COMMIT_PPM,
        unknown_after_commit_ppm: UNKNOWN_AFTER_COMMIT_PPM,
        seed: seed("ambiguity"),
        ..FaultPlan::default()
    };
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let options = ServiceOptions {
        faults,
        ..ServiceOptions::default()
    };
    let service = Service::start(&setup, options).await;
    let http = client();
    let _counters = crate::support::counters_exclusive().await;
    let lost_before = lease_lost(&http, &service.base).await;
    let started = Instant::now();
    let orders: Vec<u64> = (0..creates).map(|_| unique_order_id()).collect();
    let answers: Vec<(u64, Reply, usize)> = futures::stream::iter(orders)
        .map(|order_id| create(&http, &service.base, order_id))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let took = started.elapsed();

    let census = service.census().await;
    let stats = service.carrier_stats(&http).await;
    let store = service.embedded.as_ref().expect("embedded");
    let counters = store.engine().fault_counters();
    let (unknown_before, unknown_after) = (
        counters.unknown_before_commit.load(Ordering::Relaxed),
        counters.unknown_after_commit.load(Ordering::Relaxed),
    );
    let caller = CallerId::new(ALICE_ID).expect("caller");
    let mut lost_completions = 0;
    for (order_id, answer, _) in &answers {
        let key = IdempotencyKey::new(&derived_key(*order_id, 1)).expect("key");
        let record = service.records.inspect(&caller, &key).await.expect("inspect");
        let saved_body = match record.map(|record| record.state) {
            Some(RecordState::Completed { response, .. }) => Some(response.body().to_vec()),
            _ => None,
        };
        let label_stored = census.labels_of(ALICE_ID, *order_id, 1) == [answer.label_id()];
        if saved_body.as_deref() != Some(answer.body.as_slice()) || !label_stored {
            lost_completions += 1;
        }
    }
    let purchases_above_one: u64 = stats
        .purchases_by_parcel
        .iter()
        .map(|p| p.purchases.saturating_sub(1))
        .sum();
    let attempts: usize = answers.iter().map(|(_, _, attempts)| attempts).sum();
    let lease_lost_completions = lease_lost(&http, &service.base).await - lost_before;
    eprintln!(
        "RELIABILITY ambiguity creates={creates} took_s={:.1} attempts={attempts} unknown_before_commit={unknown_before} \
         unknown_after_commit={unknown_after} labels={} parcels_with_more_than_one_label={} purchases={} \
         purchases_above_one={purchases_above_one} lost_completions={lost_completions} lease_lost_completions={lease_lost_completions}",
        took.as_secs_f64(),
        census.labels_total(),
        census.parcels_with_more_than_one_label(),
        stats.purchases_total,
    );
    assert_eq!(answers.len(), creates);
    assert!(unknown_before > 0 && unknown_after > 0, "the fault switch fired");
    assert_eq!(census.parcels_with_more_than_one_label(), 0);
    assert_eq!(census.labels_total(), creates);
    assert_eq!((stats.purchases_total as usize, purchases_above_one), (creates, 0));
    assert_eq!(lost_completions, 0);
    // A retried commit recognises its own earlier write; it never looks like
    // another attempt's takeover.
    assert_eq!(lease_lost_completions, 0.0);
}

async fn lease_lost(http: &reqwest::Client, base: &str) -> f64 {
    let metrics = crate::support::metrics_text(http, base).await;
    metric_value(&metrics, "idem_lease_lost_completions_total", &[])
}
