//! `Prefer: wait=N` (RFC 7240; docs/design.md#waiting): a request that finds
//! its key started by another attempt waits for that attempt to end, on the
//! embedded store's change hub.

mod common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
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

/// A route whose first call holds until `let_go` is notified and answers
/// `first_status`; later calls answer 201 at once. Counts its calls.
#[derive(Clone)]
struct GatedRoute {
    calls: Arc<AtomicUsize>,
    let_go: Arc<Notify>,
    first_status: StatusCode,
}

impl GatedRoute {
    fn new(first_status: StatusCode) -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            let_go: Arc::new(Notify::new()),
            first_status,
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
                if call == 0 {
                    route.let_go.notified().await;
                    return (route.first_status, format!("call {call}")).into_response();
                }
                (StatusCode::CREATED, format!("call {call}")).into_response()
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
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAITERS_REGISTER_MS_MAX);
    while route.calls() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the first attempt never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first
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
