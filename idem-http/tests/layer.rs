//! The application's hooks: who the caller is, how errors look, what the
//! attempt's task holds, a route's own lease and retention, and the clock.

mod common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::from_fn;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{BODY_BYTES_MAX, WorkSlot, take_work_slot};
use http_body_util::BodyExt;
use idem_http::{
    CallerIdentity, Idempotency, IdempotencyError, IdempotencyLayer, REPLAYED_HEADER, SingleCaller, retry_after_seconds,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use store_core::{CallerId, IdempotencyKey, IdempotencyStore, ManualClock, Policy};
use store_fdb::{EmbeddedConfig, EmbeddedStore, FdbStore, KEY_PREFIX_DEFAULT};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

fn embedded() -> EmbeddedStore {
    EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap()
}

fn counted_route(calls: Arc<AtomicUsize>) -> impl Fn() -> std::future::Ready<Response> + Clone + Send + 'static {
    move || {
        let call = calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready((StatusCode::CREATED, format!("call {call}")).into_response())
    }
}

fn router(idempotency: Idempotency, calls: Arc<AtomicUsize>) -> Router {
    let route = counted_route(calls);
    Router::new().route(
        "/orders",
        post(route).layer(IdempotencyLayer::new(idempotency, BODY_BYTES_MAX)),
    )
}

async fn send(app: &Router, request: axum::http::request::Builder) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let response = app
        .clone()
        .oneshot(request.body(Body::from("{}")).unwrap())
        .await
        .unwrap();
    into_parts(response).await
}

fn order(key: &str, caller: &str) -> axum::http::request::Builder {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("x-caller", caller)
}

fn caller_from_header(request: &Parts) -> Option<CallerId> {
    CallerId::new(request.headers.get("x-caller")?.to_str().ok()?).ok()
}

/// Keys are scoped by the caller the application names: the same key from
/// two callers is two requests; without a caller the layer claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_by_the_caller_the_application_names() {
    let calls = Arc::new(AtomicUsize::new(0));
    let idempotency = Idempotency::builder(Arc::new(embedded()), caller_from_header).build();
    let app = router(idempotency, calls.clone());
    let (status, headers, _) = send(&app, order("k", "alice")).await;
    assert_eq!((status, headers.get(REPLAYED_HEADER)), (StatusCode::CREATED, None));
    let (status, headers, _) = send(&app, order("k", "bob")).await;
    assert_eq!((status, headers.get(REPLAYED_HEADER)), (StatusCode::CREATED, None));
    let (status, headers, _) = send(&app, order("k", "alice")).await;
    assert_eq!(
        (status, &headers[REPLAYED_HEADER]),
        (StatusCode::CREATED, &HeaderValue::from_static("true"))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let anonymous = Request::post("/orders").header("idempotency-key", "k");
    let (status, _, _) = send(&app, anonymous).await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "no caller is a misconfigured route"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An application with its own error format replaces the rendering; the
/// status and `Retry-After` stay the middleware's to choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_replaces_the_error_rendering() {
    fn plain_text(error: IdempotencyError) -> Response {
        let mut response = (error.status(), format!("error {}", error.code())).into_response();
        response
            .headers_mut()
            .insert("x-error-code", HeaderValue::from_static(error.code()));
        response
    }
    let store = Arc::new(embedded());
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    let idempotency = Idempotency::builder(store, caller)
        .render_errors_with(plain_text)
        .build();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = router(idempotency, calls.clone());
    let (status, headers, body) = send(&app, Request::post("/orders")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["x-error-code"], "idempotency_key_missing");
    assert_eq!(&body[..], b"error idempotency_key_missing");
    send(&app, Request::post("/orders").header("idempotency-key", "k")).await;
    let reused = Request::post("/orders").header("idempotency-key", "k");
    let response = app
        .clone()
        .oneshot(reused.body(Body::from("other")).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.headers()["x-error-code"], "idempotency_key_reused");
}

/// The slot named with `hold_during_work` is held by the attempt's task
/// until the route is done, even after the client hung up: abandoned work
/// keeps counting against the application's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_holds_the_named_extension_until_the_work_is_done() {
    let slots = Arc::new(Semaphore::new(1));
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    let idempotency = Idempotency::builder(Arc::new(embedded()), caller)
        .hold_during_work::<WorkSlot>()
        .build();
    let slow_route = || async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        StatusCode::CREATED
    };
    let app = Router::new()
        .route(
            "/orders",
            post(slow_route.layer(IdempotencyLayer::new(idempotency, BODY_BYTES_MAX))),
        )
        .layer(from_fn(take_work_slot(slots.clone())));
    let request = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .unwrap();
    let hung_up = tokio::time::timeout(Duration::from_millis(100), app.clone().oneshot(request)).await;
    assert!(hung_up.is_err(), "the client gave up before the route was done");
    assert_eq!(slots.available_permits(), 0, "the route still runs, holding its slot");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(slots.available_permits(), 1, "the slot is freed when the work is done");
}

/// A route with its own lease and retention: a store handle opened with the
/// route's policy on the same engine, given through `with_store`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_gets_its_own_lease_and_retention_through_its_own_store_handle() {
    let store = embedded();
    let hour_ms = 3_600_000;
    let short_policy = Policy::new(1_000, hour_ms, 0).unwrap();
    let short: Arc<dyn IdempotencyStore> =
        Arc::new(FdbStore::new(store.engine().clone(), KEY_PREFIX_DEFAULT, short_policy));
    let store: Arc<dyn IdempotencyStore> = Arc::new(store);
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    let idempotency = Idempotency::builder(store.clone(), caller).build();
    let route = || async { StatusCode::CREATED };
    let app = Router::new()
        .route(
            "/orders",
            post(route.layer(IdempotencyLayer::new(idempotency.clone(), BODY_BYTES_MAX))),
        )
        .route(
            "/quotes",
            post(route.layer(IdempotencyLayer::new(idempotency.with_store(short), BODY_BYTES_MAX))),
        );
    for path in ["/orders", "/quotes"] {
        let key = format!("key-for-{path}");
        let request = Request::post(path)
            .header("idempotency-key", key)
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            app.clone().oneshot(request).await.unwrap().status(),
            StatusCode::CREATED
        );
    }
    let kept_ms = |path: &'static str| {
        let store = store.clone();
        async move {
            let caller = CallerId::new("shop").unwrap();
            let key = IdempotencyKey::new(&format!("key-for-{path}")).unwrap();
            let record = store.inspect(&caller, &key).await.unwrap().expect("a record");
            record.expires_at_ms - record.created_at_ms
        }
    };
    // Retention runs from completion, a few milliseconds after creation.
    let about = |kept_ms: u64, retention_ms: u64| (retention_ms..retention_ms + 10_000).contains(&kept_ms);
    let (orders_kept_ms, quotes_kept_ms) = (kept_ms("/orders").await, kept_ms("/quotes").await);
    assert!(
        about(orders_kept_ms, Policy::default().retention_ms()),
        "{orders_kept_ms}"
    );
    assert!(about(quotes_kept_ms, hour_ms), "{quotes_kept_ms}");
}

/// A fixed instant years before any real reading of the system's clock: a
/// store on a manual clock started here stamps records that a layer
/// reading the system's clock instead would take for long expired.
const MANUAL_CLOCK_START_MS: u64 = 1_000_000_000_000;

/// One call of a route that says when it started, then waits to be let go.
#[derive(Default)]
struct Gate {
    started: Notify,
    let_go: Notify,
}

/// The layer reads the clock it was given, the one its store reads. Here an
/// attempt's lease ends while it works (the test moves the clock, nobody
/// sleeps), a retry takes the key over, and the first attempt's fenced
/// completion is refused: it answers 409 with the winner's remaining lease
/// as `Retry-After`, measured on that clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_answered_by_the_clock_the_store_reads() {
    let clock = ManualClock::starting_at(MANUAL_CLOCK_START_MS);
    let policy = Policy::default();
    let store = EmbeddedStore::open_embedded_with_clock(&EmbeddedConfig::temporary(), policy, clock.clone()).unwrap();
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    let idempotency = Idempotency::builder(Arc::new(store), caller)
        .clock(clock.clone())
        .build();
    let gates: Arc<[Gate; 2]> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let route = {
        let (gates, calls) = (gates.clone(), calls.clone());
        move || {
            let (gates, call) = (gates.clone(), calls.fetch_add(1, Ordering::SeqCst));
            async move {
                let gate = &gates[call];
                gate.started.notify_one();
                gate.let_go.notified().await;
                (StatusCode::CREATED, format!("call {call}"))
            }
        }
    };
    let app = Router::new().route(
        "/orders",
        post(route.layer(IdempotencyLayer::new(idempotency, BODY_BYTES_MAX))),
    );
    let request = || {
        Request::post("/orders")
            .header("idempotency-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request()));
    gates[0].started.notified().await;
    clock.advance_ms(policy.lease_ms() + 1);
    let takeover = tokio::spawn(app.clone().oneshot(request()));
    gates[1].started.notified().await;
    gates[0].let_go.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CONFLICT);
    assert_eq!(
        first.headers()["retry-after"],
        retry_after_seconds(policy.lease_ms()).to_string().as_str(),
        "the winner's whole lease is left on the store's clock"
    );
    gates[1].let_go.notify_one();
    let (status, _, body) = into_parts(takeover.await.unwrap().unwrap()).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"call 1"[..]));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn into_parts(response: Response) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

/// The extractor names its rejection when a handler asks for an attempt on
/// a route without the layer.
#[tokio::test]
async fn the_attempt_extractor_refuses_a_route_without_the_layer() {
    let handler = |_attempt: idem_http::Attempt| async { StatusCode::CREATED };
    let app = Router::new().route("/orders", post(handler));
    let request = Request::post("/orders").body(Body::empty()).unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// `CallerIdentity` is object-safe and implemented by plain functions.
#[test]
fn a_function_is_a_caller_identity() {
    let identity: Box<dyn CallerIdentity> = Box::new(caller_from_header);
    let parts = Request::post("/")
        .header("x-caller", "carol")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(identity.caller(&parts).unwrap().as_str(), "carol");
}
