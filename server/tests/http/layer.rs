//! The idempotency layer on a route of its own (any axum route can wear
//! it), the lease-lost path, and store outages (503, never 500).

use crate::common::{ALICE, Options, Reply, TestServer, client, fresh_key, label_body, metric_value, order_id};
use async_trait::async_trait;
use axum::extract::State;
use axum::handler::Handler;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use server::auth::{CallerConfig, token_sha256};
use server::auth::{Callers, require_caller};
use server::backend::StoreKind;
use server::error::ApiError;
use server::idempotency::{FinishPolicy, IdempotencyLayer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, IdempotencyKey, IdempotencyStore,
    KeyDigest, ManualClock, Policy, PurgeReport, Record, RecoveryPoint, SavedResponse, SharedClock, StoreError,
    SystemClock,
};
use store_fdb::{EmbeddedConfig, EmbeddedStore};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

/// What the test route does on its n-th call (0-based).
type Behaviour = Arc<dyn Fn(usize) -> BoxedAnswer + Send + Sync>;
type BoxedAnswer = std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;

#[derive(Clone)]
struct RouteState {
    calls: Arc<AtomicUsize>,
    behaviour: Behaviour,
}

async fn counted_route(State(state): State<RouteState>) -> Response {
    let call = state.calls.fetch_add(1, Ordering::SeqCst);
    (state.behaviour)(call).await
}

/// A route taking a JSON body, as most routes do: axum itself refuses
/// another media type with 415 before the handler runs.
async fn counted_json_route(State(state): State<RouteState>, Json(_body): Json<serde_json::Value>) -> Response {
    let call = state.calls.fetch_add(1, Ordering::SeqCst);
    (state.behaviour)(call).await
}

/// A server with one route, `POST /v1/orders`, wearing the layer.
async fn serve_route(
    store: Arc<dyn IdempotencyStore>,
    behaviour: impl Fn(usize) -> BoxedAnswer + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    serve_route_with(store, behaviour, FinishPolicy::default(), false).await
}

/// `serve_route` with a finishing policy, and optionally a JSON route.
async fn serve_route_with(
    store: Arc<dyn IdempotencyStore>,
    behaviour: impl Fn(usize) -> BoxedAnswer + Send + Sync + 'static,
    policy: FinishPolicy,
    json: bool,
) -> (String, Arc<AtomicUsize>) {
    serve_route_on_clock(store, SystemClock::shared(), behaviour, policy, json).await
}

/// `serve_route_with`, the layer reading `clock` (the one `store` reads).
async fn serve_route_on_clock(
    store: Arc<dyn IdempotencyStore>,
    clock: SharedClock,
    behaviour: impl Fn(usize) -> BoxedAnswer + Send + Sync + 'static,
    policy: FinishPolicy,
    json: bool,
) -> (String, Arc<AtomicUsize>) {
    let idempotency =
        server::idempotency::configure(store, TaskTracker::new(), 1, idem_http::WAIT_CAP_S_DEFAULT, clock);
    let callers = Callers::from_config(&[CallerConfig::new("alice", token_sha256(ALICE))]).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let state = RouteState {
        calls: calls.clone(),
        behaviour: Arc::new(behaviour),
    };
    let layer = IdempotencyLayer::new(idempotency, 1_024).with_finish_policy(policy);
    let route = if json {
        post(counted_json_route.layer(layer))
    } else {
        post(counted_route.layer(layer))
    };
    let router = Router::new()
        .route("/v1/orders", route)
        .layer(from_fn_with_state(callers, require_caller))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (base, calls)
}

fn embedded(policy: Policy) -> Arc<dyn IdempotencyStore> {
    Arc::new(EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), policy).unwrap())
}

async fn post_order(base: &str, key: &str, body: &str) -> Reply {
    let response = client()
        .post(format!("{base}/v1/orders"))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap().to_vec();
    Reply { status, headers, body }
}

fn created(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        let mut response = (StatusCode::CREATED, format!("{{\"order\":{call}}}")).into_response();
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("location", HeaderValue::from_static("/v1/orders/7"));
        headers.insert("x-not-saved", HeaderValue::from_static("per-attempt"));
        response
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_route_wearing_the_layer_runs_once_and_replays() {
    let (base, calls) = serve_route(embedded(Policy::default()), created).await;
    let key = fresh_key();
    let first = post_order(&base, &key, r#"{"item":1}"#).await;
    assert_eq!((first.status, first.header("x-not-saved")), (201, Some("per-attempt")));
    let repeat = post_order(&base, &key, r#"{ "item" : 1 }"#).await;
    assert_eq!(repeat.status, 201);
    assert_eq!(repeat.body, first.body);
    assert_eq!(repeat.header("location"), Some("/v1/orders/7"));
    assert_eq!(repeat.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        repeat.header("x-not-saved"),
        None,
        "only allow-listed headers are saved"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the route ran once");
    let reused = post_order(&base, &key, r#"{"item":2}"#).await;
    assert_eq!(
        (reused.status, reused.problem_code().as_str()),
        (422, "idempotency_key_reused")
    );
}

fn fails_validation_then_creates(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        match call {
            0 => ApiError::InvalidRequest { detail: "no".into() }.into_response(),
            1 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            _ => created(call).await,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failures_free_the_key_and_transient_answers_release_it() {
    let (base, calls) = serve_route(embedded(Policy::default()), fails_validation_then_creates).await;
    let key = fresh_key();
    let invalid = post_order(&base, &key, "first body").await;
    assert_eq!(
        (invalid.status, invalid.problem_code().as_str()),
        (400, "invalid_request")
    );
    // Abandoned: a different body under the same key is a fresh request.
    let failed = post_order(&base, &key, "second body").await;
    assert_eq!(failed.status, 503);
    // Released, not saved: the retry runs the route again at once.
    let retried = post_order(&base, &key, "second body").await;
    assert_eq!((retried.status, retried.header("idempotent-replayed")), (201, None));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

fn transient_answers_then_creates(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        match call {
            0 => StatusCode::TOO_MANY_REQUESTS.into_response(),
            1 => StatusCode::REQUEST_TIMEOUT.into_response(),
            2 => StatusCode::TOO_EARLY.into_response(),
            3 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            _ => created(call).await,
        }
    })
}

/// 408, 425, 429 and 503 say "nothing final happened, try again": they are
/// not saved (a 429 replayed for 24 h would refuse the key for good), the
/// key is released, and each retry runs the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_answers_are_not_saved_and_the_retry_runs() {
    let (base, calls) = serve_route(embedded(Policy::default()), transient_answers_then_creates).await;
    let key = fresh_key();
    for expected in [429, 408, 425, 503] {
        let reply = post_order(&base, &key, "{}").await;
        assert_eq!((reply.status, reply.header("idempotent-replayed")), (expected, None));
    }
    let created = post_order(&base, &key, "{}").await;
    assert_eq!((created.status, created.header("idempotent-replayed")), (201, None));
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// The policy is the route's: a route whose 429 is a final business answer
/// (a quota for this very request) can have it saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finishing_policy_is_per_route() {
    let policy = FinishPolicy::default().saving(StatusCode::TOO_MANY_REQUESTS);
    let (base, calls) = serve_route_with(
        embedded(Policy::default()),
        transient_answers_then_creates,
        policy,
        false,
    )
    .await;
    let key = fresh_key();
    let first = post_order(&base, &key, "{}").await;
    assert_eq!(first.status, 429);
    let repeat = post_order(&base, &key, "{}").await;
    assert_eq!(
        (repeat.status, repeat.header("idempotent-replayed")),
        (429, Some("true"))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A plain 500 after the route ran is final: the route may have done half
/// its work, so it is saved and replayed, never run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_after_the_route_ran_is_saved_not_run_again() {
    fn fails(_call: usize) -> BoxedAnswer {
        Box::pin(async { StatusCode::INTERNAL_SERVER_ERROR.into_response() })
    }
    let (base, calls) = serve_route(embedded(Policy::default()), fails).await;
    let key = fresh_key();
    assert_eq!(post_order(&base, &key, "{}").await.status, 500);
    let repeat = post_order(&base, &key, "{}").await;
    assert_eq!(
        (repeat.status, repeat.header("idempotent-replayed")),
        (500, Some("true"))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// axum's own 415 (the JSON extractor refusing the media type) comes
/// before the handler: nothing ran, the record is deleted, and the
/// corrected request (same body, right Content-Type) runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axums_own_415_frees_the_key() {
    let (base, calls) = serve_route_with(embedded(Policy::default()), created, FinishPolicy::default(), true).await;
    let key = fresh_key();
    let refused = post_order(&base, &key, r#"{"item":1}"#).await;
    assert_eq!(refused.status, 415);
    let corrected = client()
        .post(format!("{base}/v1/orders"))
        .bearer_auth(ALICE)
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"item":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(corrected.status().as_u16(), 201);
    assert!(corrected.headers().get("idempotent-replayed").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// axum's own 400 (the JSON extractor refusing a malformed body) comes
/// before the handler too: the record is deleted, so the corrected body
/// under the same key runs instead of meeting 422 `idempotency_key_reused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axums_own_400_frees_the_key_for_the_corrected_body() {
    let (base, calls) = serve_route_with(embedded(Policy::default()), created, FinishPolicy::default(), true).await;
    let key = fresh_key();
    let send = |body: &'static str| {
        client()
            .post(format!("{base}/v1/orders"))
            .bearer_auth(ALICE)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(send(r#"{"item":"#).await.unwrap().status().as_u16(), 400);
    let corrected = send(r#"{"item":1}"#).await.unwrap();
    assert_eq!(corrected.status().as_u16(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

fn created_too_large(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        let body = vec![b'x'; store_core::RESPONSE_BODY_BYTES_MAX + 1 + call];
        (StatusCode::CREATED, body).into_response()
    })
}

fn created_with_a_long_location(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        let mut response = created(call).await;
        let location = format!("/v1/orders/{}", "7".repeat(store_core::RESPONSE_HEADER_BYTES_MAX));
        response
            .headers_mut()
            .insert("location", HeaderValue::from_str(&location).unwrap());
        response
    })
}

/// An answer that cannot be saved (body over 1 MiB, an allowed header too
/// long) must not free the key after the route ran: the retry would run
/// the effect again. The key keeps a 500 `response_not_saved` problem
/// instead, and every repeat gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_cannot_be_saved_is_saved_as_response_not_saved_and_never_runs_again() {
    for behaviour in [
        created_too_large as fn(usize) -> BoxedAnswer,
        created_with_a_long_location,
    ] {
        let (base, calls) = serve_route(embedded(Policy::default()), behaviour).await;
        let key = fresh_key();
        let first = post_order(&base, &key, "{}").await;
        assert_eq!(
            (first.status, first.problem_code().as_str()),
            (500, "response_not_saved"),
            "{}",
            first.text()
        );
        assert_eq!(first.header("content-type"), Some("application/problem+json"));
        let repeat = post_order(&base, &key, "{}").await;
        assert_eq!(
            (
                repeat.status,
                repeat.problem_code().as_str(),
                repeat.header("idempotent-replayed")
            ),
            (500, "response_not_saved", Some("true"))
        );
        assert_eq!(repeat.body, first.body);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran once");
    }
}

/// A fixed instant years before any real reading of the system's clock: on
/// a manual clock started here, the store stamps records that a layer
/// reading the system's clock instead would take for long expired.
const MANUAL_CLOCK_START_MS: u64 = 1_000_000_000_000;

/// Call 0 says it started, then works until the test lets it go (past its
/// lease, on the test's clock); call 1 (the takeover) answers at once.
fn slow_then_fast(started: Arc<Notify>, let_go: Arc<Notify>) -> impl Fn(usize) -> BoxedAnswer + Send + Sync {
    move |call| {
        let (started, let_go) = (started.clone(), let_go.clone());
        Box::pin(async move {
            if call == 0 {
                started.notify_one();
                let_go.notified().await;
            }
            created(call).await
        })
    }
}

/// An attempt whose lease was taken over must not save its answer: it gets
/// the winner's saved answer (a replay), and the lease-lost counter moves.
/// The lease ends by moving the clock the store and the layer share (the
/// server's `configure` wires it), not by sleeping past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_answers_with_the_winners_response() {
    let handle = server::metrics::prometheus_handle().unwrap();
    let lost_before = metric_value(&handle.render(), "idem_lease_lost_completions_total", &[]);
    let takeovers_before = metric_value(&handle.render(), "idem_lease_takeovers_total", &[]);
    let policy = Policy::default();
    let clock = ManualClock::starting_at(MANUAL_CLOCK_START_MS);
    let store = EmbeddedStore::open_embedded_with_clock(&EmbeddedConfig::temporary(), policy, clock.clone()).unwrap();
    let (started, let_go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let behaviour = slow_then_fast(started.clone(), let_go.clone());
    let (base, calls) = serve_route_on_clock(
        Arc::new(store),
        clock.clone(),
        behaviour,
        FinishPolicy::default(),
        false,
    )
    .await;
    let key = fresh_key();
    let slow = tokio::spawn({
        let (base, key) = (base.clone(), key.clone());
        async move { post_order(&base, &key, "{}").await }
    });
    started.notified().await;
    clock.advance_ms(policy.lease_ms() + 1);
    let takeover = post_order(&base, &key, "{}").await;
    let_go.notify_one();
    let slow = slow.await.unwrap();
    assert_eq!(takeover.status, 201);
    assert_eq!(takeover.text(), r#"{"order":1}"#);
    assert_eq!(slow.status, 201, "{}", slow.text());
    assert_eq!(
        slow.text(),
        r#"{"order":1}"#,
        "the slow attempt must answer with the winner's response"
    );
    assert_eq!(slow.header("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let later = post_order(&base, &key, "{}").await;
    assert_eq!(later.text(), r#"{"order":1}"#);
    let rendered = handle.render();
    assert!(metric_value(&rendered, "idem_lease_lost_completions_total", &[]) >= lost_before + 1.0);
    assert!(metric_value(&rendered, "idem_lease_takeovers_total", &[]) >= takeovers_before + 1.0);
}

/// A store that is down.
struct DownStore;

fn down() -> StoreError {
    StoreError::Unavailable {
        detail: "connection refused".into(),
        source: None,
    }
}

#[async_trait]
impl IdempotencyStore for DownStore {
    fn backend_name(&self) -> &'static str {
        "down"
    }
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Err(down())
    }
    async fn checkpoint(&self, _: &HeldLease, _: RecoveryPoint) -> Result<Fenced, StoreError> {
        Err(down())
    }
    async fn complete(&self, _: &HeldLease, _: SavedResponse) -> Result<Fenced, StoreError> {
        Err(down())
    }
    async fn release(&self, _: &HeldLease) -> Result<Fenced, StoreError> {
        Err(down())
    }
    async fn abandon(&self, _: &HeldLease) -> Result<Fenced, StoreError> {
        Err(down())
    }
    async fn purge_expired(&self, _: usize) -> Result<PurgeReport, StoreError> {
        Err(down())
    }
    async fn inspect(&self, _: &CallerId, _: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        Err(down())
    }
    async fn forget_unreadable_record(&self, _: &CallerId, _: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        Err(down())
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Err(down())
    }
}

/// A store whose claims commit at once but answer late, as a store does
/// whose commit went through while its answer was still on the way.
struct LateAnsweringStore {
    inner: Arc<dyn IdempotencyStore>,
    claim_answer_delay: Duration,
}

#[async_trait]
impl IdempotencyStore for LateAnsweringStore {
    fn backend_name(&self) -> &'static str {
        "late-answering"
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(request).await;
        tokio::time::sleep(self.claim_answer_delay).await;
        outcome
    }
    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.inner.checkpoint(lease, point).await
    }
    async fn complete(&self, lease: &HeldLease, saved: SavedResponse) -> Result<Fenced, StoreError> {
        self.inner.complete(lease, saved).await
    }
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.inner.release(lease).await
    }
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.inner.abandon(lease).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(limit).await
    }
    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.inspect(caller, key).await
    }
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        self.inner.forget_unreadable_record(caller, key).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

/// A client that hangs up while its claim is committed but not yet
/// answered must not leave a lease that no attempt holds: the claim and
/// the route finish without it, and its retry gets the answer at once
/// instead of 409 until the lease (30 s here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_during_the_claim_leaves_no_orphaned_lease() {
    let store = Arc::new(LateAnsweringStore {
        inner: embedded(Policy::default()),
        claim_answer_delay: Duration::from_millis(300),
    });
    let (base, calls) = serve_route(store, created).await;
    let key = fresh_key();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let hung_up = impatient
        .post(format!("{base}/v1/orders"))
        .bearer_auth(ALICE)
        .header("idempotency-key", &key)
        .body("{}")
        .send()
        .await;
    assert!(hung_up.is_err_and(|error| error.is_timeout()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = post_order(&base, &key, "{}").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (201, Some("true")),
        "{}",
        retry.text()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A store whose claims commit but whose replies are lost, for the next
/// `replies_to_lose` claims: a Redis response timeout, a PostgreSQL
/// operation timeout during COMMIT, or an embedded sync error after the
/// write reached the journal.
struct ClaimReplyLosingStore {
    inner: Arc<dyn IdempotencyStore>,
    replies_to_lose: AtomicUsize,
    releases: AtomicUsize,
}

impl ClaimReplyLosingStore {
    fn new(replies_to_lose: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: embedded(Policy::default()),
            replies_to_lose: AtomicUsize::new(replies_to_lose),
            releases: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl IdempotencyStore for ClaimReplyLosingStore {
    fn backend_name(&self) -> &'static str {
        "claim-reply-losing"
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(request).await?;
        let lose = self
            .replies_to_lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
            .is_ok();
        if lose {
            return Err(StoreError::Unavailable {
                detail: "response timed out after the claim committed".into(),
                source: None,
            });
        }
        Ok(outcome)
    }
    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.inner.checkpoint(lease, point).await
    }
    async fn complete(&self, lease: &HeldLease, saved: SavedResponse) -> Result<Fenced, StoreError> {
        self.inner.complete(lease, saved).await
    }
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(lease).await
    }
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.inner.abandon(lease).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(limit).await
    }
    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.inspect(caller, key).await
    }
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        self.inner.forget_unreadable_record(caller, key).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

/// A claim that committed but whose reply was lost is re-sent with the
/// same token and gets its lease back: the request is served, and its
/// retry replays, instead of 503 then 409 for the whole lease (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_reply_is_resent_and_the_request_is_served() {
    let store = ClaimReplyLosingStore::new(1);
    let (base, calls) = serve_route(store, created).await;
    let key = fresh_key();
    let first = post_order(&base, &key, "{}").await;
    assert_eq!(
        (first.status, first.header("idempotent-replayed")),
        (201, None),
        "{}",
        first.text()
    );
    let retry = post_order(&base, &key, "{}").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (201, Some("true")),
        "{}",
        retry.text()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Every send of the claim loses its reply: the request answers 503, and
/// the lease nobody holds is released in the background, so the next
/// retry is served at once, not refused with 409 until the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_replies_are_all_lost_is_released_in_the_background() {
    let store = ClaimReplyLosingStore::new(server::idempotency::CLAIM_SENDS_MAX as usize);
    let (base, calls) = serve_route(store.clone(), created).await;
    let key = fresh_key();
    let first = post_order(&base, &key, "{}").await;
    assert_eq!(
        (first.status, first.problem_code().as_str()),
        (503, "store_unavailable")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let mut waited_ms = 0;
    while store.releases.load(Ordering::SeqCst) == 0 && waited_ms < 3_000 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited_ms += 20;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retry = post_order(&base, &key, "{}").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (201, None),
        "{}",
        retry.text()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A record no codec reads (a torn write, a bad disk, a foreign writer)
/// answers a clear 500 `record_unreadable`, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_answers_500_record_unreadable() {
    use store_fdb::{Engine, MaybeCommitted, RunOptions, Transaction};
    let store = Arc::new(EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap());
    let (base, calls) = serve_route(store.clone(), created).await;
    let key = fresh_key();
    assert_eq!(post_order(&base, &key, "{}").await.status, 201);
    let caller = CallerId::new("alice").unwrap();
    let slot = store
        .layout()
        .slot(&caller, IdempotencyKey::new(&key).unwrap().digest());
    let chunk = store.layout().record_chunk_key(&slot, 0);
    let chunk = &chunk;
    store
        .engine()
        .run(
            RunOptions::default(),
            |tx, _maybe_committed: MaybeCommitted| async move {
                tx.set(chunk, b"\xffnot a record")?;
                Ok(())
            },
        )
        .await
        .unwrap();
    let reply = post_order(&base, &key, "{}").await;
    assert_eq!(
        (reply.status, reply.problem_code().as_str()),
        (500, "record_unreadable"),
        "{}",
        reply.text()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "nothing ran again");
}

/// A store whose next `failures` completions fail before committing (a
/// connection blip at the moment the answer is saved).
struct CompletionFailingStore {
    inner: Arc<dyn IdempotencyStore>,
    failures: AtomicUsize,
}

#[async_trait]
impl IdempotencyStore for CompletionFailingStore {
    fn backend_name(&self) -> &'static str {
        "completion-failing"
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.inner.checkpoint(lease, point).await
    }
    async fn complete(&self, lease: &HeldLease, saved: SavedResponse) -> Result<Fenced, StoreError> {
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
            .is_ok();
        if fail {
            return Err(down());
        }
        self.inner.complete(lease, saved).await
    }
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.inner.release(lease).await
    }
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.inner.abandon(lease).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        self.inner.purge_expired(limit).await
    }
    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.inspect(caller, key).await
    }
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        self.inner.forget_unreadable_record(caller, key).await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

/// The route ran; saving its answer failed once without committing. The
/// layer must not free the key for a second run on that account: the
/// completion is sent again (it is fenced and idempotent), the answer is
/// saved, and the route ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_fails_once_is_sent_again_not_run_again() {
    let store = Arc::new(CompletionFailingStore {
        inner: embedded(Policy::default()),
        failures: AtomicUsize::new(1),
    });
    let (base, calls) = serve_route(store, created).await;
    let key = fresh_key();
    let first = post_order(&base, &key, "{}").await;
    assert_eq!(
        (first.status, first.header("idempotent-replayed")),
        (201, None),
        "{}",
        first.text()
    );
    let retry = post_order(&base, &key, "{}").await;
    assert_eq!((retry.status, retry.header("idempotent-replayed")), (201, Some("true")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_503_with_retry_after_never_500() {
    let (base, calls) = serve_route(Arc::new(DownStore), created).await;
    let reply = post_order(&base, &fresh_key(), "{}").await;
    assert_eq!(
        (reply.status, reply.problem_code().as_str()),
        (503, "store_unavailable")
    );
    assert_eq!(reply.retry_after_s(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing runs without a claimed key");
}

/// The real thing: the Redis server stops answering mid-run. The label
/// route and the readiness probe answer 503, and recover when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_redis_outage_is_503_and_recovers() {
    let redis = store_redis::testkit::RedisServer::start().expect("redis-server");
    let options = Options {
        extra_env: vec![
            ("IDEM__STORE__REDIS__URLS".into(), format!("[\"{}\"]", redis.url())),
            ("IDEM__STORE__REDIS__RESPONSE_TIMEOUT_MS".into(), "300".into()),
            // /readyz answers from a background check: a frequent one.
            ("IDEM__SERVER__READINESS_REFRESH_MS".into(), "100".into()),
        ],
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Redis, options).await;
    let body = label_body(order_id(), 1);
    redis.pause().expect("pause redis");
    let reply = server.post_label(Some(ALICE), Some(&fresh_key()), &body).await;
    assert_eq!(
        (reply.status, reply.problem_code().as_str()),
        (503, "store_unavailable"),
        "{}",
        reply.text()
    );
    assert!(reply.retry_after_s() >= 1);
    let ready = server.get("/readyz", None).await;
    assert_eq!(
        (ready.status, ready.problem_code().as_str()),
        (503, "store_unavailable")
    );
    redis.resume().expect("resume redis");
    let mut recovered = None;
    for _ in 0..50 {
        let reply = server.post_label(Some(ALICE), Some(&fresh_key()), &body).await;
        if reply.status == 201 {
            recovered = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered.is_some(), "the server recovers when Redis returns");
    server.shutdown().await;
}
