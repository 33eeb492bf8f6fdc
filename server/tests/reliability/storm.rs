//! A concurrency storm.
//!
//! 1,000 requests with one key and one body, all sent at once, while the
//! carrier takes 300 ms: exactly one carrier purchase and one label; the
//! first attempt's 201, and every other answer a 409 `request_in_progress`
//! or a byte-identical replay of that 201. On every backend (FoundationDB
//! with the server's `foundationdb` feature).
//!
//! `IDEM_STORM_REQUESTS` sets the number of requests (CI default 1,000).

use crate::support::backends::BackendSetup;
use crate::support::service::{Service, ServiceOptions};
use crate::support::{ALICE_ID, LabelPost, Reply, derived_key, label_body, scaled, unique_order_id};
use server::admission::AdmissionConfig;
use server::backend::StoreKind;
use server::carrier::SimulatorConfig;
use std::time::{Duration, Instant};

/// Requests when `IDEM_STORM_REQUESTS` is not set.
pub const STORM_REQUESTS_CI_DEFAULT: usize = 1_000;
/// Long enough that the storm arrives while the first attempt holds the lease.
const CARRIER_LATENCY_MS: u64 = 1_000;

fn storm_client(requests: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(requests)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// Opens `requests` connections to the server and leaves them idle in the
/// client's pool, so the storm's requests go out together: connecting on
/// the fly, the first request's claim committed before most other
/// connections were even accepted, and a store that detected no conflict
/// between concurrent claims of one key still passed (seen on FoundationDB
/// with the engine's reads made snapshot reads).
async fn open_connections(http: &reqwest::Client, base: &str, requests: usize) {
    let url = format!("{base}/healthz");
    let probes = futures::future::join_all((0..requests).map(|_| http.get(&url).send())).await;
    for probe in probes {
        let status = probe.expect("the health probe answers").status();
        assert_eq!(status, 200, "health probe before the storm");
    }
}

async fn storm(backend: StoreKind) {
    let requests = scaled("IDEM_STORM_REQUESTS", STORM_REQUESTS_CI_DEFAULT);
    let setup = BackendSetup::start(backend).await;
    let options = ServiceOptions {
        simulator: SimulatorConfig {
            latency_ms_min: CARRIER_LATENCY_MS,
            latency_ms_max: CARRIER_LATENCY_MS,
            ..SimulatorConfig::default()
        },
        in_flight_max: requests * 2,
        // Every request admitted: this test is about one key under a
        // storm, not about shedding (overload.rs is).
        admission: AdmissionConfig {
            workers: Some(requests * 2),
            ..AdmissionConfig::default()
        },
        ..ServiceOptions::default()
    };
    let service = Service::start(&setup, options).await;
    let http = storm_client(requests);
    let order_id = unique_order_id();
    let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
    let post = LabelPost::new(&key, &body);
    open_connections(&http, &service.base, requests).await;
    let started = Instant::now();
    let replies: Vec<Reply> = futures::future::join_all((0..requests).map(|_| post.send(&http, &service.base)))
        .await
        .into_iter()
        .map(|reply| reply.expect("every request is answered"))
        .collect();
    let took = started.elapsed();

    let firsts: Vec<&Reply> = replies.iter().filter(|r| r.status == 201 && !r.is_replay()).collect();
    assert_eq!(firsts.len(), 1, "{backend:?}: exactly one first run");
    let first = firsts[0];
    let (mut replays, mut in_progress) = (0, 0);
    for reply in &replies {
        match (reply.status, reply.is_replay()) {
            (201, false) => {}
            (201, true) => {
                assert_eq!(reply.body, first.body, "a replay differs from the first answer");
                assert_eq!(reply.header("location"), first.header("location"));
                replays += 1;
            }
            (409, _) => {
                assert_eq!(reply.code(), "request_in_progress", "{}", reply.text());
                assert!(reply.retry_after().is_some_and(|seconds| seconds >= 1));
                in_progress += 1;
            }
            (status, _) => panic!("{backend:?}: a storm request got {status}: {}", reply.text()),
        }
    }
    let stats = service.carrier_stats(&http).await;
    assert_eq!((stats.requests_total, stats.purchases_total), (1, 1), "{stats:?}");
    let census = service.census().await;
    assert_eq!(census.labels_of(ALICE_ID, order_id, 1), [first.label_id()]);
    assert_eq!(census.labels_total(), 1);
    eprintln!(
        "RELIABILITY storm backend={} requests={requests} took_ms={} first_runs=1 in_progress_409={in_progress} \
         replays={replays} carrier_requests={} purchases={} labels={}",
        backend.name(),
        took.as_millis(),
        stats.requests_total,
        stats.purchases_total,
        census.labels_total()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_key_buys_one_label_embedded() {
    storm(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_key_buys_one_label_redis() {
    storm(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_key_buys_one_label_postgres() {
    storm(StoreKind::Postgres).await;
}

#[cfg(feature = "foundationdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_key_buys_one_label_foundationdb() {
    storm(StoreKind::Foundationdb).await;
}

/// Requests for one parcel, each with a key of its own, sent at once.
const PARCEL_STORM_REQUESTS: usize = 50;

/// Many keys, one parcel: the downstream key comes from the intent, so
/// however many keys race for one parcel, the carrier sells one label and
/// every request ends with it. Every answer is that label (201) or a 503
/// `downstream_unavailable` (its carrier call met the first one in flight);
/// retried with the same key, each of those gets the label too.
async fn many_keys_one_parcel(backend: StoreKind) {
    let setup = BackendSetup::start(backend).await;
    let options = ServiceOptions {
        simulator: SimulatorConfig {
            latency_ms_min: 300,
            latency_ms_max: 300,
            ..SimulatorConfig::default()
        },
        ..ServiceOptions::default()
    };
    let service = Service::start(&setup, options).await;
    let http = storm_client(PARCEL_STORM_REQUESTS);
    let order_id = unique_order_id();
    let body = label_body(order_id, 1);
    let keys: Vec<String> = (0..PARCEL_STORM_REQUESTS)
        .map(|number| format!("{}:client-{number}", derived_key(order_id, 1)))
        .collect();
    let send_all = |keys: Vec<String>| {
        let (http, base, body) = (&http, &service.base, &body);
        futures::future::join_all(keys.into_iter().map(move |key| async move {
            let reply = LabelPost::new(&key, body).send(http, base).await.expect("answered");
            (key, reply)
        }))
    };
    let mut label_ids = std::collections::BTreeSet::new();
    let mut pending: Vec<String> = keys;
    for round in 0..5 {
        let mut retry = Vec::new();
        for (key, reply) in send_all(pending).await {
            match reply.status {
                201 => {
                    label_ids.insert(reply.label_id());
                }
                // Its carrier call met the first purchase in flight.
                409 if reply.code() == "parcel_in_progress" => retry.push(key),
                status => panic!("{backend:?} round {round}: {status}: {}", reply.text()),
            }
        }
        if retry.is_empty() {
            break;
        }
        pending = retry;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        label_ids.len(),
        1,
        "{backend:?}: one label for the parcel, got {label_ids:?}"
    );
    let stats = service.carrier_stats(&http).await;
    assert_eq!(stats.purchases_total, 1, "{backend:?}: one purchase, got {stats:?}");
    let census = service.census().await;
    assert_eq!(census.labels_of(ALICE_ID, order_id, 1).len(), 1, "{backend:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_for_one_parcel_buy_one_label_embedded() {
    many_keys_one_parcel(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_for_one_parcel_buy_one_label_redis() {
    many_keys_one_parcel(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_for_one_parcel_buy_one_label_postgres() {
    many_keys_one_parcel(StoreKind::Postgres).await;
}

#[cfg(feature = "foundationdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_for_one_parcel_buy_one_label_foundationdb() {
    many_keys_one_parcel(StoreKind::Foundationdb).await;
}
