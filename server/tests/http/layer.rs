//! The idempotency layer on a route of its own (any axum route can wear
//! it), the lease-lost path, and store outages (503, never 500).

use crate::common::{
    ALICE, Backend, Options, Reply, TestServer, client, fresh_key, label_body, metric_value, order_id,
};
use async_trait::async_trait;
use axum::Router;
use axum::extract::State;
use axum::handler::Handler;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use server::auth::{Callers, require_caller};
use server::config::{CallerConfig, token_sha256};
use server::error::ApiError;
use server::idempotency::{Idempotency, IdempotencyLayer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, HeldLease, IdempotencyKey, IdempotencyStore, Policy, PurgeReport,
    Record, RecoveryPoint, SavedResponse, StoreError,
};
use store_fdb::{EmbeddedConfig, EmbeddedStore};
use tokio_util::task::TaskTracker;

/// What the test route does on its n-th call (0-based).
type Behaviour = fn(usize) -> BoxedAnswer;
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

/// A server with one route, `POST /v1/orders`, wearing the layer.
async fn serve_route(store: Arc<dyn IdempotencyStore>, behaviour: Behaviour) -> (String, Arc<AtomicUsize>) {
    let idempotency = Idempotency::new(store, TaskTracker::new(), 1);
    let callers = Callers::from_config(&[CallerConfig::new("alice", token_sha256(ALICE))]).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let state = RouteState {
        calls: calls.clone(),
        behaviour,
    };
    let router = Router::new()
        .route(
            "/v1/orders",
            post(counted_route.layer(IdempotencyLayer::new(idempotency, 1_024))),
        )
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
    assert_eq!((reused.status, reused.code().as_str()), (422, "idempotency_key_reused"));
}

fn fails_validation_then_creates(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        match call {
            0 => ApiError::InvalidRequest { detail: "no".into() }.into_response(),
            1 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            _ => created(call).await,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failures_free_the_key_and_server_errors_release_it() {
    let (base, calls) = serve_route(embedded(Policy::default()), fails_validation_then_creates).await;
    let key = fresh_key();
    let invalid = post_order(&base, &key, "first body").await;
    assert_eq!((invalid.status, invalid.code().as_str()), (400, "invalid_request"));
    // Abandoned: a different body under the same key is a fresh request.
    let failed = post_order(&base, &key, "second body").await;
    assert_eq!(failed.status, 500);
    // Released, not saved: the retry runs the route again at once.
    let retried = post_order(&base, &key, "second body").await;
    assert_eq!((retried.status, retried.header("idempotent-replayed")), (201, None));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Call 0 works for longer than the lease; call 1 (the takeover) answers at once.
fn slow_then_fast(call: usize) -> BoxedAnswer {
    Box::pin(async move {
        if call == 0 {
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        created(call).await
    })
}

/// An attempt whose lease was taken over must not save its answer: it gets
/// the winner's saved answer (a replay), and the lease-lost counter moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_answers_with_the_winners_response() {
    let handle = server::metrics::prometheus_handle().unwrap();
    let lost_before = metric_value(&handle.render(), "idem_lease_lost_completions_total", &[]);
    let takeovers_before = metric_value(&handle.render(), "idem_lease_takeovers_total", &[]);
    let policy = Policy::new(200, 60_000, 0).unwrap();
    let (base, calls) = serve_route(embedded(policy), slow_then_fast).await;
    let key = fresh_key();
    let slow = post_order(&base, &key, "{}");
    let takeover = async {
        tokio::time::sleep(Duration::from_millis(350)).await;
        post_order(&base, &key, "{}").await
    };
    let (slow, takeover) = tokio::join!(slow, takeover);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_503_with_retry_after_never_500() {
    let (base, calls) = serve_route(Arc::new(DownStore), created).await;
    let reply = post_order(&base, &fresh_key(), "{}").await;
    assert_eq!((reply.status, reply.code().as_str()), (503, "store_unavailable"));
    assert_eq!(reply.retry_after(), 1);
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
        ],
        ..Options::default()
    };
    let server = TestServer::start_with(Backend::Redis, options).await;
    let body = label_body(order_id(), 1);
    redis.pause().expect("pause redis");
    let reply = server.post_label(Some(ALICE), Some(&fresh_key()), &body).await;
    assert_eq!(
        (reply.status, reply.code().as_str()),
        (503, "store_unavailable"),
        "{}",
        reply.text()
    );
    assert!(reply.retry_after() >= 1);
    let ready = server.get("/readyz", None).await;
    assert_eq!((ready.status, ready.code().as_str()), (503, "store_unavailable"));
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
