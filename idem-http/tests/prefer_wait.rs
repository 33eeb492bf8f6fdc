//! `Prefer: wait=N` (RFC 7240; docs/design.md#waiting): a request that finds
//! its key started by another attempt waits for that attempt to end, on the
//! embedded store's change hub.

mod common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Extensions, HeaderMap, StatusCode, header};
use axum::middleware::from_fn;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{BODY_BYTES_MAX, WorkSlot, take_work_slot};
use http_body_util::BodyExt;
use idem_http::{Idempotency, IdempotencyLayer, PREFERENCE_APPLIED_HEADER, REPLAYED_HEADER, SingleCaller};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use store_core::{CallerId, IdempotencyStore, Policy, WaitLimits};
use store_fdb::{EmbeddedConfig, EmbeddedStore};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

/// How long a test waits for its waiters to register before failing.
const WAITERS_REGISTER_MS_MAX: u64 = 10_000;

/// A route whose first `held_calls` calls each hold until `let_go` is
/// notified; the first answers `first_status`, every later one 201. Counts
/// its calls.
#[derive(Clone)]
struct GatedRoute {
    calls: Arc<AtomicUsize>,
    let_go: Arc<Notify>,
    first_status: StatusCode,
    held_calls: usize,
}

impl GatedRoute {
    fn new(first_status: StatusCode) -> Self {
        Self::holding(1, first_status)
    }

    fn holding(held_calls: usize, first_status: StatusCode) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            let_go: Arc::new(Notify::new()),
            first_status,
            held_calls,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn router(&self, idempotency: Idempotency) -> Router {
        let route = self.clone();
        let handler = move || {
            let route = route.clone();
            async move {
                let call = route.calls.fetch_add(1, Ordering::SeqCst);
                if call < route.held_calls {
                    route.let_go.notified().await;
                }
                let status = if call == 0 {
                    route.first_status
                } else {
                    StatusCode::CREATED
                };
                (status, format!("call {call}")).into_response()
            }
        };
        Router::new().route(
            "/orders",
            post(handler).layer(IdempotencyLayer::new(idempotency, BODY_BYTES_MAX)),
        )
    }
}

fn store() -> Arc<EmbeddedStore> {
    Arc::new(EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap())
}

fn idempotency(store: Arc<EmbeddedStore>) -> idem_http::IdempotencyBuilder {
    Idempotency::builder(store, SingleCaller(CallerId::new("shop").unwrap()))
}

async fn send(app: Router, prefer: Option<&str>) -> (StatusCode, HeaderMap, Bytes) {
    let mut request = Request::post("/orders").header("idempotency-key", "k");
    if let Some(prefer) = prefer {
        request = request.header("prefer", prefer);
    }
    let response: Response = app.oneshot(request.body(Body::from("{}")).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

/// Starts the first attempt and waits until the route runs it.
async fn start_first(route: &GatedRoute, app: &Router) -> tokio::task::JoinHandle<(StatusCode, HeaderMap, Bytes)> {
    let first = tokio::spawn(send(app.clone(), None));
    until_calls(route, 1).await;
    first
}

/// Waits until the route has been called `calls` times.
async fn until_calls(route: &GatedRoute, calls: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAITERS_REGISTER_MS_MAX);
    while route.calls() < calls {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the route ran {} times",
            route.calls()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `waiters` requests wait on the store's hub.
async fn until_waiting(store: &EmbeddedStore, waiters: usize) {
    let hub = store
        .record_changes()
        .expect("the embedded store reports record changes");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAITERS_REGISTER_MS_MAX);
    while hub.waiters() < waiters {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} waiters registered",
            hub.waiters()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A slow first attempt and 50 waiters: one effect, 50 replays of the
/// first answer, byte for byte, each saying which wait was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_waiters_get_the_first_attempts_answer() {
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let app = route.router(idempotency(store.clone()).build());
    let first = start_first(&route, &app).await;
    let waiters: Vec<_> = (0..50)
        .map(|_| tokio::spawn(send(app.clone(), Some("respond-async, wait=30"))))
        .collect();
    until_waiting(&store, 50).await;
    route.let_go.notify_one();
    let (status, headers, body) = first.await.unwrap();
    assert_eq!((status, headers.get(REPLAYED_HEADER)), (StatusCode::CREATED, None));
    for waiter in waiters {
        let (waiter_status, waiter_headers, waiter_body) = waiter.await.unwrap();
        assert_eq!(waiter_status, status);
        assert_eq!(waiter_body, body, "a replay is the saved answer, byte for byte");
        assert_eq!(waiter_headers[REPLAYED_HEADER], "true");
        assert_eq!(
            waiter_headers[PREFERENCE_APPLIED_HEADER], "wait=10",
            "wait=30 capped at the default 10 s"
        );
    }
    assert_eq!(route.calls(), 1, "the route ran once");
}

/// A first attempt that releases the key (a transient 503, not saved):
/// exactly one waiter becomes the new attempt; the others replay its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_first_attempt_releases_exactly_one_waiter_runs() {
    let store = store();
    let route = GatedRoute::new(StatusCode::SERVICE_UNAVAILABLE);
    let app = route.router(idempotency(store.clone()).build());
    let first = start_first(&route, &app).await;
    let waiters: Vec<_> = (0..5)
        .map(|_| tokio::spawn(send(app.clone(), Some("wait=10"))))
        .collect();
    until_waiting(&store, 5).await;
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);
    let mut ran = 0;
    for waiter in waiters {
        let (status, headers, body) = waiter.await.unwrap();
        assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"call 1"[..]));
        // Every waiter waited, the one that became the attempt too.
        assert_eq!(headers[PREFERENCE_APPLIED_HEADER], "wait=10");
        if headers.get(REPLAYED_HEADER).is_none() {
            ran += 1;
        }
    }
    assert_eq!(ran, 1, "one waiter became the new attempt");
    assert_eq!(route.calls(), 2);
}

/// A waiter whose wait ends before the first attempt: 409 with
/// `Retry-After`, as without waiting, and the wait it was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_past_its_wait_gets_409() {
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let app = route.router(idempotency(store.clone()).build());
    let first = start_first(&route, &app).await;
    let started = tokio::time::Instant::now();
    let (status, headers, _) = send(app.clone(), Some("wait=1")).await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert_eq!(headers[PREFERENCE_APPLIED_HEADER], "wait=1");
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    assert_eq!(route.calls(), 1);
}

/// Past the per-key waiter cap a request gets 409 at once, with no
/// `Preference-Applied`: it did not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_waiter_cap_a_request_gets_409_at_once() {
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let limits = WaitLimits::new(2, 64, 1_000).unwrap();
    let app = route.router(idempotency(store.clone()).wait_limits(limits).build());
    let first = start_first(&route, &app).await;
    let waiters: Vec<_> = (0..2)
        .map(|_| tokio::spawn(send(app.clone(), Some("wait=10"))))
        .collect();
    until_waiting(&store, 2).await;
    let started = tokio::time::Instant::now();
    let (status, headers, _) = send(app.clone(), Some("wait=10")).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once, not after {:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(headers.contains_key(header::RETRY_AFTER));
    assert_eq!(headers.get(PREFERENCE_APPLIED_HEADER), None);
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().1[REPLAYED_HEADER], "true");
    }
    assert_eq!(route.calls(), 1);
}

/// A cap of 0 turns waiting off: 409 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cap_of_zero_turns_waiting_off() {
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let app = route.router(idempotency(store.clone()).wait_cap_s(0).build());
    let first = start_first(&route, &app).await;
    let (status, headers, _) = send(app.clone(), Some("wait=10")).await;
    assert_eq!(
        (status, headers.get(PREFERENCE_APPLIED_HEADER)),
        (StatusCode::CONFLICT, None)
    );
    route.let_go.notify_one();
    first.await.unwrap();
}

/// A client that hangs up stops waiting: its place under the waiter caps is
/// freed at once, not when its wait would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_stops_waiting() {
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let app = route.router(idempotency(store.clone()).build());
    let first = start_first(&route, &app).await;
    let waiter = tokio::spawn(send(app.clone(), Some("wait=10")));
    until_waiting(&store, 1).await;
    waiter.abort();
    let hub = store
        .record_changes()
        .expect("the embedded store reports record changes");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while hub.waiters() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter still waits after its client left"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    assert_eq!(route.calls(), 1);
}

/// A waiter holds no work slot while it waits: the slot named with
/// `hold_during_work` is dropped when the wait starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_holds_no_work_slot() {
    let slots = Arc::new(Semaphore::new(2));
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let idempotency = idempotency(store.clone()).hold_during_work::<WorkSlot>().build();
    let app = route.router(idempotency).layer(from_fn(take_work_slot(slots.clone())));
    let first = start_first(&route, &app).await;
    let waiter = tokio::spawn(send(app.clone(), Some("wait=10")));
    until_waiting(&store, 1).await;
    assert_eq!(slots.available_permits(), 1, "only the first attempt holds a slot");
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    assert_eq!(waiter.await.unwrap().1[REPLAYED_HEADER], "true");
    assert_eq!(slots.available_permits(), 2);
}

/// A waiter holds no work slot, but one that becomes the attempt (the first
/// attempt released the key) takes one again before its route runs: work
/// never runs outside the application's cap on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_becomes_the_attempt_runs_holding_a_work_slot() {
    let slots = Arc::new(Semaphore::new(2));
    let store = store();
    let route = GatedRoute::holding(2, StatusCode::SERVICE_UNAVAILABLE);
    let regain_from = slots.clone();
    let idempotency = idempotency(store.clone())
        .hold_during_work_regaining::<WorkSlot, _, _, _>(move |_: &Extensions| {
            let slots = regain_from.clone();
            async move {
                match slots.acquire_owned().await {
                    Ok(permit) => Ok(WorkSlot(Arc::new(permit))),
                    Err(_closed) => Err(StatusCode::SERVICE_UNAVAILABLE),
                }
            }
        })
        .build();
    let app = route.router(idempotency).layer(from_fn(take_work_slot(slots.clone())));
    let first = start_first(&route, &app).await;
    let waiter = tokio::spawn(send(app.clone(), Some("wait=10")));
    until_waiting(&store, 1).await;
    assert_eq!(slots.available_permits(), 1, "the waiter holds no slot while it waits");
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);
    until_calls(&route, 2).await;
    assert_eq!(
        slots.available_permits(),
        1,
        "the waiter runs as the attempt holding a slot"
    );
    route.let_go.notify_one();
    let (status, headers, body) = waiter.await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"call 1"[..]));
    assert_eq!(headers.get(REPLAYED_HEADER), None);
    assert_eq!(slots.available_permits(), 2);
}

/// A waiter that becomes the attempt but is refused a work slot releases
/// the key it claimed and answers with the refusal: its route never runs,
/// and the next request takes the key over at once instead of meeting 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_refused_a_work_slot_releases_the_key_and_answers_the_refusal() {
    let store = store();
    let route = GatedRoute::new(StatusCode::SERVICE_UNAVAILABLE);
    let idempotency = idempotency(store.clone())
        .hold_during_work_regaining::<WorkSlot, _, _, _>(|_: &Extensions| async {
            Err::<WorkSlot, _>((
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                "overloaded",
            ))
        })
        .build();
    let app = route
        .router(idempotency)
        .layer(from_fn(take_work_slot(Arc::new(Semaphore::new(2)))));
    let first = start_first(&route, &app).await;
    let waiter = tokio::spawn(send(app.clone(), Some("wait=10")));
    until_waiting(&store, 1).await;
    route.let_go.notify_one();
    assert_eq!(first.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);
    let (status, headers, body) = waiter.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::SERVICE_UNAVAILABLE, &b"overloaded"[..])
    );
    assert_eq!(headers[header::RETRY_AFTER], "1");
    assert_eq!(route.calls(), 1, "the refused waiter did not run the route");
    let (status, _, body) = send(app.clone(), None).await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::CREATED, &b"call 1"[..]),
        "the key was released: the next request runs at once"
    );
}

/// The value of one sample (`name{labels}` as rendered) in a Prometheus
/// exposition.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Every wait is counted by how it ended, timed, and in the waiters gauge
/// while it lasts; the series exist at zero before the first wait. (The
/// only test of this binary that installs a recorder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_are_counted_by_outcome_timed_and_gauged() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder in this binary");
    let store = store();
    let route = GatedRoute::new(StatusCode::CREATED);
    let limits = WaitLimits::new(1, 64, 1_000).unwrap();
    let idempotency = idempotency(store.clone())
        .metric_prefix("waiting_")
        .unwrap()
        .wait_limits(limits)
        .build();
    idempotency.metric_names().register_at_zero();
    let at_start = recorder.render();
    for outcome in idem_http::metrics::WAIT_OUTCOMES {
        let series = format!("waiting_waits_total{{outcome=\"{}\"}}", outcome.label());
        assert_eq!(sample(&at_start, &series), Some(0.0), "{series}:\n{at_start}");
    }
    assert_eq!(sample(&at_start, "waiting_waiters"), Some(0.0), "{at_start}");
    let app = route.router(idempotency);
    let first = start_first(&route, &app).await;
    let waiter = tokio::spawn(send(app.clone(), Some("wait=10")));
    until_waiting(&store, 1).await;
    assert_eq!(sample(&recorder.render(), "waiting_waiters"), Some(1.0));
    // Past the per-key cap of 1: refused at once.
    assert_eq!(send(app.clone(), Some("wait=10")).await.0, StatusCode::CONFLICT);
    route.let_go.notify_one();
    first.await.unwrap();
    assert_eq!(waiter.await.unwrap().1[REPLAYED_HEADER], "true");
    let rendered = recorder.render();
    let count = |outcome: &str| sample(&rendered, &format!("waiting_waits_total{{outcome=\"{outcome}\"}}"));
    assert_eq!(count("replayed"), Some(1.0), "{rendered}");
    assert_eq!(count("refused_cap"), Some(1.0), "{rendered}");
    assert_eq!(count("timed_out"), Some(0.0), "{rendered}");
    assert_eq!(sample(&rendered, "waiting_waiters"), Some(0.0), "{rendered}");
    assert_eq!(
        sample(&rendered, "waiting_wait_duration_seconds_count{outcome=\"replayed\"}"),
        Some(1.0),
        "{rendered}"
    );
}
