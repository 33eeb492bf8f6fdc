//! Lease races.
//!
//! The spec's failure row "lease shorter than the slowest downstream call":
//! two attempts run at once, and only the fence (complete only while the
//! lease token matches) and the derived carrier key keep the result single.
//! The config refuses a lease that is not longer than the carrier timeout,
//! so the service is assembled in-process with that misconfiguration: a
//! 300 ms lease and a carrier that takes 900 ms (the simulator's latency).
//!
//! Over HTTP: attempt A waits on the carrier past its lease; retry B takes
//! the key over (and is told to retry, the carrier still selling A's label);
//! A's completion is then refused by its token (409, counted as lease lost in
//! /metrics); retry C takes over, gets A's label replayed by the carrier,
//! and commits it. One label, one purchase.
//!
//! At the label store: a stale lease's commit is refused whether it comes
//! before or after the winner's, on every backend.
//!
//! A lease runs out by moving the clock on the embedded store, which reads
//! the clock the test gives it; Redis and PostgreSQL decide by their
//! servers' clocks, so there the test waits (ARCHITECTURE.md, "Which clock
//! decides lease expiry").

use crate::support::backends::BackendSetup;
use crate::support::service::{Service, ServiceOptions};
use crate::support::{
    ALICE_ID, LabelPost, client, counters_exclusive, derived_key, label_body, metric_value, metrics_text,
    unique_order_id,
};
use server::backend::StoreKind;
use server::carrier::SimulatorConfig;
use server::labels::{Label, ShippingService, StoredLabel};
use server::request_context::RequestId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, Fingerprint, HeldLease, IdempotencyKey, ManualClock, Policy,
    SharedClock, SystemClock,
};

/// Shorter than the carrier: the misconfiguration under test.
const LEASE_MS: u64 = 300;
/// The simulated carrier's latency, three leases long.
const CARRIER_LATENCY_MS: u64 = 900;
/// When retry B arrives on a backend whose server's clock decides: after
/// A's lease ended, while A waits on the carrier.
const TAKEOVER_AT_MS: u64 = 450;
/// Longest wait for attempt A to reach the carrier.
const CARRIER_REACHED_WAIT_MS_MAX: u64 = 10_000;

/// How a test's leases run out.
enum LeaseTime {
    /// The store reads this clock: the test moves it.
    Manual(Arc<ManualClock>),
    /// The store's server decides by its own clock: the test waits.
    Wall,
}

impl LeaseTime {
    fn for_backend(backend: StoreKind) -> Self {
        if backend == StoreKind::Embedded {
            Self::Manual(ManualClock::starting_now())
        } else {
            Self::Wall
        }
    }

    /// The clock the service's stores and idempotency layer read.
    fn clock(&self) -> SharedClock {
        match self {
            Self::Manual(clock) => clock.clone(),
            Self::Wall => SystemClock::shared(),
        }
    }

    /// Lets `ms` pass for the store's leases.
    async fn pass(&self, ms: u64) {
        match self {
            Self::Manual(clock) => clock.advance_ms(ms),
            Self::Wall => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }
}

fn racing_options(clock: SharedClock) -> ServiceOptions {
    ServiceOptions {
        clock,
        policy: Policy::new(LEASE_MS, 60_000, 0).expect("policy"),
        carrier_timeout_ms: 5_000,
        simulator: SimulatorConfig {
            latency_ms_min: CARRIER_LATENCY_MS,
            latency_ms_max: CARRIER_LATENCY_MS,
            ..SimulatorConfig::default()
        },
        ..ServiceOptions::default()
    }
}

async fn lease_lost_counters(http: &reqwest::Client, base: &str) -> (f64, f64) {
    let metrics = metrics_text(http, base).await;
    (
        metric_value(&metrics, "idem_lease_lost_completions_total", &[]),
        metric_value(&metrics, "idem_http_requests_total", &["outcome=\"lease_lost\""]),
    )
}

/// Returns once A's lease has run out while A waits on the carrier: on a
/// moved clock, as soon as A reached the carrier; on a server's clock, at
/// `TAKEOVER_AT_MS`.
async fn until_a_waits_past_its_lease(lease_time: &LeaseTime, service: &Service, http: &reqwest::Client) {
    match lease_time {
        LeaseTime::Manual(_) => {
            let started = Instant::now();
            while service.carrier_stats(http).await.requests_total == 0 {
                assert!(
                    started.elapsed() < Duration::from_millis(CARRIER_REACHED_WAIT_MS_MAX),
                    "attempt A never reached the carrier"
                );
                tokio::task::yield_now().await;
            }
            lease_time.pass(LEASE_MS + 1).await;
        }
        LeaseTime::Wall => lease_time.pass(TAKEOVER_AT_MS).await,
    }
}

async fn slow_carrier_race(backend: StoreKind) {
    let setup = BackendSetup::start(backend).await;
    let lease_time = LeaseTime::for_backend(backend);
    let service = Service::start(&setup, racing_options(lease_time.clock())).await;
    let http = client();
    let order_id = unique_order_id();
    let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
    let before = lease_lost_counters(&http, &service.base).await;
    let post = LabelPost::new(&key, &body);
    let attempt_a = post.send(&http, &service.base);
    let retry_b = async {
        until_a_waits_past_its_lease(&lease_time, &service, &http).await;
        LabelPost::new(&key, &body).send(&http, &service.base).await
    };
    let (a, b) = tokio::join!(attempt_a, retry_b);
    let (a, b) = (a.expect("A answers"), b.expect("B answers"));
    // B meets A's purchase still running at the carrier: told so.
    assert_eq!(
        (b.status, b.code().as_str()),
        (409, "parcel_in_progress"),
        "{}",
        b.text()
    );
    assert_eq!(
        (a.status, a.code().as_str()),
        (409, "request_in_progress"),
        "{backend:?}: the stale attempt's completion must be refused: {}",
        a.text()
    );
    let after = lease_lost_counters(&http, &service.base).await;
    assert_eq!(after.0 - before.0, 1.0, "idem_lease_lost_completions_total");
    assert_eq!(
        after.1 - before.1,
        1.0,
        "idem_http_requests_total{{outcome=\"lease_lost\"}}"
    );

    let c = LabelPost::new(&key, &body)
        .send(&http, &service.base)
        .await
        .expect("C answers");
    assert_eq!(c.status, 201, "{}", c.text());
    let census = service.census().await;
    assert_eq!(census.labels_of(ALICE_ID, order_id, 1), [c.label_id()], "{backend:?}");
    assert_eq!(census.labels_total(), 1);
    let stats = service.carrier_stats(&http).await;
    // Atomic backends wrote nothing for A, so C asks the carrier again and
    // gets A's sale replayed; with Redis, A's label committed before its
    // record was refused, and C finds it at the label store instead.
    let expected_replays = if backend == StoreKind::Redis { 0 } else { 1 };
    assert_eq!(
        (stats.purchases_total, stats.deduplicated_repeats),
        (1, expected_replays),
        "{stats:?}"
    );
    eprintln!(
        "RELIABILITY lease_race backend={} stale_answer={} takeover_answer={} final_label_count=1 purchases=1 lease_lost_delta=1",
        backend.name(),
        a.status,
        b.status
    );
}

/// One test for the three backends, one after the other, so the counter
/// deltas it asserts are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_slower_than_the_lease_ends_with_one_label_and_the_stale_completion_refused() {
    let _counters = counters_exclusive().await;
    for backend in StoreKind::SELF_STARTED {
        slow_carrier_race(backend).await;
    }
}

fn stored_label(lease: &HeldLease, order_id: u64, label_id: String) -> StoredLabel {
    StoredLabel {
        label: Label {
            label_id,
            order_id,
            parcel_no: 1,
            label_version: 1,
            service: ShippingService::Ground,
            weight_g: 1_450,
            tracking_no: format!("GRD{order_id:09}001000000"),
            cost_cents: 530,
            created_at: "2026-11-29T13:31:55.763Z".to_owned(),
        },
        caller: lease.caller.as_str().to_owned(),
        created_by_key_sha256: lease.key.digest().to_string(),
    }
}

fn request_id(id: &str) -> RequestId {
    RequestId::new(id).expect("a sane request id")
}

async fn claim(service: &Service, request: &ClaimRequest) -> HeldLease {
    match service.records.claim(request).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected the lease, got {other:?}"),
    }
}

/// A takes the key, its lease ends, B takes it over; A's commit comes
/// before B's (`stale_first`) or after it.
async fn stale_commit_is_refused(backend: StoreKind, stale_first: bool) {
    let setup = BackendSetup::start(backend).await;
    let lease_time = LeaseTime::for_backend(backend);
    let lease_ms = 100;
    let options = ServiceOptions {
        policy: Policy::new(lease_ms, 60_000, 0).expect("policy"),
        clock: lease_time.clock(),
        ..ServiceOptions::default()
    };
    let service = Service::start(&setup, options).await;
    let order_id = unique_order_id();
    let key = IdempotencyKey::new(&derived_key(order_id, 1)).expect("key");
    let caller = CallerId::new(ALICE_ID).expect("caller");
    let fingerprint = Fingerprint::of_request("POST", "/v1/labels", label_body(order_id, 1).as_bytes());
    let lease_a = claim(&service, &ClaimRequest::new(caller.clone(), key.clone(), fingerprint)).await;
    lease_time.pass(lease_ms + 50).await;
    let lease_b = claim(&service, &ClaimRequest::new(caller, key, fingerprint)).await;
    let label_a = stored_label(&lease_a, order_id, format!("lbl_stale_{order_id}"));
    let label_b = stored_label(&lease_b, order_id, format!("lbl_winner_{order_id}"));
    let (stale, winner) = if stale_first {
        let stale = service
            .labels
            .commit(&lease_a, &label_a, &request_id("attempt-a"))
            .await
            .expect("stale commit");
        (
            stale,
            service
                .labels
                .commit(&lease_b, &label_b, &request_id("attempt-b"))
                .await
                .expect("winner commit"),
        )
    } else {
        let winner = service
            .labels
            .commit(&lease_b, &label_b, &request_id("attempt-b"))
            .await
            .expect("winner commit");
        (
            service
                .labels
                .commit(&lease_a, &label_a, &request_id("attempt-a"))
                .await
                .expect("stale commit"),
            winner,
        )
    };
    assert_eq!(stale, Fenced::LeaseLost, "{backend:?} stale_first={stale_first}");
    let Fenced::Applied(saved) = winner else {
        panic!("{backend:?}: the winner's commit must apply")
    };
    let census = service.census().await;
    let stored = census.labels_of(ALICE_ID, order_id, 1);
    assert_eq!(stored.len(), 1, "{backend:?} stale_first={stale_first}: {stored:?}");
    let saved_label: serde_json::Value = serde_json::from_slice(saved.body()).expect("saved label");
    assert_eq!(
        saved_label["label_id"].as_str(),
        Some(stored[0].as_str()),
        "the answer names the stored label"
    );
    // Only Redis, whose label commits before its record, can keep the stale
    // attempt's label (the winner then answers with it); atomic backends
    // never write anything for a refused commit.
    let expected = if backend == StoreKind::Redis && stale_first {
        &label_a
    } else {
        &label_b
    };
    assert_eq!(
        stored[0], expected.label.label_id,
        "{backend:?} stale_first={stale_first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lease_cannot_commit_at_the_label_store() {
    for backend in StoreKind::SELF_STARTED {
        for stale_first in [true, false] {
            stale_commit_is_refused(backend, stale_first).await;
        }
    }
}
