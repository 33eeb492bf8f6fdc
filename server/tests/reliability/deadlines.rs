//! Deadlines carried end to end (docs/design.md#deadlines), against the real
//! `server` binary: a request whose `Request-Timeout-Ms` has passed is
//! never claimed, and one whose deadline passes after its claim gives its
//! key back instead of holding it for a purchase nobody waits for.

use crate::support::backends::{BackendSetup, pair};
use crate::support::process::{ServerProcess, start_carrier, start_server};
use crate::support::{
    ALICE, ALICE_ID, Reply, callers_env, client, derived_key, label_body, metric_value, metrics_text, unique_order_id,
};
use server::backend::StoreKind;
use server::carrier::read_stats;
use std::time::Duration;
use store_core::{CallerId, IdempotencyKey, IdempotencyStore, Policy};
use store_fdb::{EmbeddedConfig, EmbeddedStore};

/// `POST /v1/labels`, with a `Request-Timeout-Ms` when given.
async fn post(http: &reqwest::Client, base: &str, key: &str, body: &str, timeout_ms: Option<u64>) -> Reply {
    let mut request = http
        .post(format!("{base}/v1/labels"))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(timeout_ms) = timeout_ms {
        request = request.header("request-timeout-ms", timeout_ms);
    }
    Reply::read(request.send().await.expect("the server answers")).await
}

/// The service on the embedded store, with `extra` settings, in front of a
/// carrier process answering after `carrier_latency_ms`.
async fn service(
    setup: &BackendSetup,
    carrier_latency_ms: u64,
    extra: &[(&str, &str)],
    failpoints: Option<&str>,
) -> (ServerProcess, ServerProcess) {
    let carrier = start_carrier((carrier_latency_ms, carrier_latency_ms), 0.0, setup.data.path()).await;
    let mut env = setup.env();
    env.extend([
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__CALLERS", callers_env()),
        pair("IDEM__CARRIER__URL", &carrier.url),
    ]);
    env.extend(extra.iter().map(|(name, value)| pair(name, value)));
    let service = start_server(&[], &env, failpoints, setup.data.path()).await;
    (service, carrier)
}

async fn purchases(http: &reqwest::Client, carrier: &ServerProcess) -> u64 {
    read_stats(http, &carrier.url)
        .await
        .expect("carrier stats")
        .purchases_total
}

/// One worker, held 600 ms by a first request (stalled right after its
/// claim); a second request that may wait only 200 ms is refused 503
/// `deadline_exceeded` and leaves no record, although admission control
/// (an interval of 1 s) would have let it wait for the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_deadline_passes_before_its_claim_is_never_claimed() {
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let settings = [
        ("IDEM__SERVER__ADMISSION__WORKERS", "1"),
        ("IDEM__SERVER__ADMISSION__INTERVAL_MS", "1000"),
        ("IDEM__SERVER__ADMISSION__TARGET_MS", "1000"),
    ];
    let (service, carrier) = service(&setup, 0, &settings, Some("label.after_claim=1*return(600)")).await;
    let http = client();
    let (first_order, late_order) = (unique_order_id(), unique_order_id());
    let late_key = derived_key(late_order, 1);
    let (first_key, first_body) = (derived_key(first_order, 1), label_body(first_order, 1));
    let first = post(&http, &service.url, &first_key, &first_body, None);
    let late = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        post(&http, &service.url, &late_key, &label_body(late_order, 1), Some(200)).await
    };
    let (first, late) = tokio::join!(first, late);
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(
        (late.status, late.code().as_str()),
        (503, "deadline_exceeded"),
        "{}",
        late.text()
    );
    assert!(late.retry_after().is_some(), "503 carries Retry-After");
    assert_eq!(purchases(&http, &carrier).await, 1, "only the first bought");
    let (status, log) = service.terminate().await;
    assert!(status.success(), "{log}");
    let store = EmbeddedStore::open_embedded(&EmbeddedConfig::new(setup.embedded_path()), Policy::default())
        .expect("the stopped service's store");
    let record = store
        .inspect(
            &CallerId::new(ALICE_ID).expect("caller"),
            &IdempotencyKey::new(&late_key).expect("key"),
        )
        .await
        .expect("inspect");
    assert!(record.is_none(), "the late request was claimed: {record:?}");
}

/// The carrier takes 1.5 s; a request that waits only 300 ms gets its 503
/// then, and its key is free again at once: the retry 400 ms later is not
/// refused 409 behind a purchase nobody waits for. Once the carrier's sale
/// is done, a retry gets the one label the carrier sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passes_during_the_carrier_call_releases_the_lease() {
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let (service, carrier) = service(&setup, 1_500, &[], None).await;
    let http = client();
    let order = unique_order_id();
    let (key, body) = (derived_key(order, 1), label_body(order, 1));
    let impatient = post(&http, &service.url, &key, &body, Some(300)).await;
    assert_eq!(impatient.status, 503, "{}", impatient.text());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let retry = post(&http, &service.url, &key, &body, Some(300)).await;
    assert_ne!(
        retry.code(),
        "request_in_progress",
        "the lease outlived the client's deadline: {}",
        retry.text()
    );
    // The carrier's one sale ends 1.5 s after the first call.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let patient = post(&http, &service.url, &key, &body, None).await;
    assert_eq!(patient.status, 201, "{}", patient.text());
    assert_eq!(purchases(&http, &carrier).await, 1, "one purchase for the parcel");
    // The first attempt's work outlived its client; the second's (the
    // carrier answered "in progress" at once) and the patient one's did not.
    let metrics = metrics_text(&http, &service.url).await;
    let done_for = |client: &str| metric_value(&metrics, "idem_work_done_total", &[&format!("client=\"{client}\"")]);
    assert_eq!((done_for("gone"), done_for("waiting")), (1.0, 2.0), "{metrics}");
    service.kill().await;
}
