//! The Fulfilment client library (idem-client) against the real `server`
//! binary, through test-support's process harness: what the client must
//! do for exactly-once to hold, each against the failure it guards.
//!
//! - a lost reply: the retry carries the same key and gets the replay;
//! - the service killed mid-request and started again: the retry replays
//!   or completes, and the carrier sells one label;
//! - a 409, then the answer through `Prefer: wait`;
//! - a 422 is never retried, and comes back as a typed error;
//! - a service that sheds everything: the budget runs out and the client
//!   gives up at once with a typed error;
//! - `Retry-After` is waited (read from a `ManualClock`, not slept).
//!
//! Every server runs on the embedded store in its own directory, with a
//! carrier simulator process of its own that outlives it and counts what
//! it sold. The binary is built with failpoints (the server's
//! dev-dependency on itself), which park or stall a request at a step.

use idem_client::{GiveUpReason, IdemClient, IntentError, IntentKey, ManualClock, RetryBudget, RetryPolicy};
use server::carrier::{CarrierStats, read_stats};
use server::failpoints::{AFTER_CARRIER, AFTER_CLAIM, AFTER_COMMIT};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::callers::{ALICE, callers_env, label_body, unique_order_id};
use test_support::process::pair;

/// The path of CreateLabel.
const LABELS_PATH: &str = "/v1/labels";
/// Longest the harness waits for a failpoint to be reached.
const FAILPOINT_WAIT_MS_MAX: u64 = 30_000;
/// An attempt's deadline: a debug build on a busy 2-core machine answers
/// well within it, so a timeout in these tests is one the test made.
const ATTEMPT_TIMEOUT_MS: u64 = 5_000;
/// The whole intent's deadline in these tests.
const INTENT_TIMEOUT_MS: u64 = 60_000;

// The binary as a child process: the reliability suite's module, one
// place for how a test starts the server (failpoints and all).
#[path = "../reliability/support/process.rs"]
mod process;

use process::{ServerProcess, start_carrier, start_server};

/// One Label service with its carrier and its data, on a port that stays
/// the same across restarts (the client keeps its URL).
struct Service {
    carrier: ServerProcess,
    env: Vec<(String, String)>,
    data: tempfile::TempDir,
    url: String,
}

impl Service {
    /// The settings of every process of this service, plus `extra`.
    async fn new(extra: &[(&str, String)]) -> Self {
        let data = tempfile::tempdir().expect("temporary directory");
        let carrier = start_carrier((0, 2), 0.0, data.path()).await;
        let port = test_support::free_loopback_port().expect("a free port");
        let mut env = vec![
            pair("IDEM__SERVER__LISTEN", format!("127.0.0.1:{port}")),
            pair("IDEM__CALLERS", callers_env()),
            pair("IDEM__STORE__KIND", "embedded"),
            pair("IDEM__STORE__EMBEDDED__PATH", data.path().join("store").display()),
            pair("IDEM__STORE__EMBEDDED__DURABILITY", "buffer"),
            pair("IDEM__CARRIER__URL", &carrier.url),
        ];
        env.extend(extra.iter().map(|(name, value)| pair(name, value)));
        Self {
            carrier,
            env,
            data,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn start(&self, failpoints: Option<&str>) -> ServerProcess {
        start_server(&[], &self.env, failpoints, self.data.path()).await
    }

    async fn carrier_stats(&self) -> CarrierStats {
        read_stats(&test_support::http::client(), &self.carrier.url)
            .await
            .expect("carrier stats")
    }
}

/// One parcel of a fresh order, its derived key and body.
struct Parcel {
    order_id: u64,
    key: IntentKey,
    body: Vec<u8>,
}

impl Parcel {
    fn new() -> Self {
        let order_id = unique_order_id();
        let key = IntentKey::from_parts(&["label", &order_id.to_string(), "1", "v1"]).expect("a valid key");
        Self {
            order_id,
            key,
            body: label_body(order_id, 1).into_bytes(),
        }
    }
}

fn policy() -> idem_client::RetryPolicyBuilder {
    RetryPolicy::builder()
        .attempts_max(20)
        .attempt_timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS))
        .intent_timeout(Duration::from_millis(INTENT_TIMEOUT_MS))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
}

fn client(service: &Service, policy: RetryPolicy) -> IdemClient {
    IdemClient::builder(&service.url)
        .bearer_token(ALICE)
        .policy(policy)
        .build()
        .expect("a client")
}

/// The same, with pauses taken on `clock` (recorded, not slept).
fn client_on(service: &Service, policy: RetryPolicy, clock: Arc<ManualClock>) -> IdemClient {
    IdemClient::builder(&service.url)
        .bearer_token(ALICE)
        .policy(policy)
        .clock(clock)
        .build()
        .expect("a client")
}

/// Waits until `process` parks a request at a `return` failpoint.
async fn parked_at(process: &mut ServerProcess, point: &str) {
    let reached = process
        .wait_for_marked_line(Duration::from_millis(FAILPOINT_WAIT_MS_MAX))
        .await;
    assert_eq!(reached.as_deref(), Some(point), "log:\n{}", process.log());
}

/// The deadline of an attempt whose reply the lost-reply test holds back.
const LOST_REPLY_ATTEMPT_TIMEOUT_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_asked_again_with_the_same_key_and_replayed() {
    let service = Service::new(&[]).await;
    // The first answer is held back after the label and the record have
    // committed, past the client's deadline: to the client, a lost reply.
    let attempt_timeout = Duration::from_millis(LOST_REPLY_ATTEMPT_TIMEOUT_MS);
    let failpoint = format!("{AFTER_COMMIT}=1*return({})", 3 * LOST_REPLY_ATTEMPT_TIMEOUT_MS);
    let process = service.start(Some(&failpoint)).await;
    let parcel = Parcel::new();
    let client = client(&service, policy().attempt_timeout(attempt_timeout).build().unwrap());
    let done = client
        .post(LABELS_PATH, &parcel.key, parcel.body.clone())
        .await
        .unwrap_or_else(|error| panic!("{error}; log:\n{}", process.log()));
    assert!(done.attempts >= 2, "the first reply was lost: {done:?}");
    assert!(done.replayed, "the retry found the key's saved answer: {done:?}");
    assert_eq!(done.status, 201);
    let stats = service.carrier_stats().await;
    assert_eq!(stats.purchases_total, 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_killed_mid_request_and_restarted_sells_one_label() {
    // A short lease, so the retry after the restart takes the key over soon.
    let service = Service::new(&[
        ("IDEM__POLICY__LEASE_MS", "600".into()),
        ("IDEM__CARRIER__TIMEOUT_MS", "300".into()),
    ])
    .await;
    let mut process = service.start(Some(&format!("{AFTER_CARRIER}=return"))).await;
    let parcel = Parcel::new();
    // Attempts enough to span the restart; connection errors are retried.
    let patient = policy()
        .attempts_max(60)
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .build()
        .unwrap();
    let client = client(&service, patient);
    let intent = {
        let (client, key, body) = (client.clone(), parcel.key.clone(), parcel.body.clone());
        tokio::spawn(async move { client.post(LABELS_PATH, &key, body).await })
    };
    // The carrier has sold the label; nothing is recorded yet. Kill it there.
    parked_at(&mut process, AFTER_CARRIER).await;
    process.kill().await;
    let restarted = service.start(None).await;
    let done = intent
        .await
        .expect("the intent's task")
        .unwrap_or_else(|error| panic!("{error}; log:\n{}", restarted.log()));
    assert_eq!(done.status, 201, "{done:?}");
    assert!(done.attempts >= 2, "{done:?}");
    let stats = service.carrier_stats().await;
    assert_eq!(stats.purchases_total, 1, "one label sold for the parcel: {stats:?}");
    assert!(
        stats.purchases_by_parcel.iter().all(|parcel| parcel.purchases == 1),
        "{stats:?}"
    );
    // Asked again, the intent is answered from its key with the same label.
    let again = client
        .post(LABELS_PATH, &parcel.key, parcel.body.clone())
        .await
        .unwrap();
    assert!(again.replayed && again.body == done.body, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_is_retried_with_prefer_wait_and_gets_the_answer() {
    let service = Service::new(&[]).await;
    // The first attempt to claim the key holds it for 2 s.
    let process = service.start(Some(&format!("{AFTER_CLAIM}=1*return(2000)"))).await;
    let parcel = Parcel::new();
    let waiting = policy().prefer_wait(Some(Duration::from_secs(10))).build().unwrap();
    let client = client_on(&service, waiting, Arc::new(ManualClock::default()));
    // Two copies of the intent at once (a duplicate send): one claims, the
    // other meets the claim, gets 409, and its retry waits at the server.
    let (first, second) = tokio::join!(
        client.post(LABELS_PATH, &parcel.key, parcel.body.clone()),
        client.post(LABELS_PATH, &parcel.key, parcel.body.clone())
    );
    let log = || process.log();
    let (first, second) = (
        first.unwrap_or_else(|error| panic!("{error}\n{}", log())),
        second.unwrap_or_else(|error| panic!("{error}\n{}", log())),
    );
    let (holder, waiter) = if first.replayed {
        (second, first)
    } else {
        (first, second)
    };
    assert_eq!((holder.replayed, holder.attempts), (false, 1), "{holder:?}");
    assert_eq!(
        (waiter.replayed, waiter.waited, waiter.attempts),
        (true, true, 2),
        "{waiter:?}"
    );
    assert_eq!(waiter.body, holder.body);
    assert_eq!(service.carrier_stats().await.purchases_total, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_422_is_never_retried_and_says_what_to_fix() {
    let service = Service::new(&[]).await;
    let _process = service.start(None).await;
    let parcel = Parcel::new();
    let client = client(&service, policy().build().unwrap());
    let done = client
        .post(LABELS_PATH, &parcel.key, parcel.body.clone())
        .await
        .unwrap();
    assert!(!done.replayed);
    let other_body = format!(
        r#"{{"order_id":{},"parcel_no":1,"weight_g":999,"service":"ground"}}"#,
        parcel.order_id
    );
    let error = client
        .post(LABELS_PATH, &parcel.key, other_body.into_bytes())
        .await
        .unwrap_err();
    let IntentError::KeyReused { problem, attempts } = &error else {
        panic!("a 422 is a typed error: {error:?}");
    };
    assert_eq!(*attempts, 1, "never retried");
    assert_eq!(problem.code.as_deref(), Some("idempotency_key_reused"));
    assert!(error.to_string().contains("new label version"), "{error}");
}

/// A service that sheds every request: an in-flight cap of one, taken by a
/// request parked at a failpoint. It answers 503 `overloaded` with
/// `Retry-After: RETRY_AFTER_S`.
const RETRY_AFTER_S: u64 = 3;

async fn shedding_service() -> (Service, ServerProcess, tokio::task::JoinHandle<()>) {
    let service = Service::new(&[
        ("IDEM__SERVER__IN_FLIGHT_MAX", "1".into()),
        ("IDEM__SERVER__RETRY_AFTER_S", RETRY_AFTER_S.to_string()),
    ])
    .await;
    let mut process = service.start(Some(&format!("{AFTER_CLAIM}=return"))).await;
    let parked = {
        let (url, parcel) = (format!("{}{LABELS_PATH}", service.url), Parcel::new());
        tokio::spawn(async move {
            let _ = test_support::http::client()
                .post(url)
                .bearer_auth(ALICE)
                .header("idempotency-key", parcel.key.header_value())
                .header("content-type", "application/json")
                .body(parcel.body)
                .send()
                .await;
        })
    };
    parked_at(&mut process, AFTER_CLAIM).await;
    (service, process, parked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_service_that_sheds_everything_the_budget_runs_out_and_the_client_gives_up() {
    let (service, _process, parked) = shedding_service().await;
    let budget = Arc::new(RetryBudget::share_of_intents(0, 3).unwrap());
    let client = IdemClient::builder(&service.url)
        .bearer_token(ALICE)
        .policy(policy().attempts_max(50).build().unwrap())
        .budget(budget.clone())
        .clock(Arc::new(ManualClock::default()))
        .build()
        .unwrap();
    let started = Instant::now();
    let parcel = Parcel::new();
    let error = client.post(LABELS_PATH, &parcel.key, parcel.body).await.unwrap_err();
    assert_eq!(
        error,
        IntentError::GaveUp {
            reason: GiveUpReason::BudgetExhausted,
            attempts: 4,
            last: "unavailable"
        },
        "three paid retries, then none"
    );
    // The next intent of the same client does not retry at all.
    let next = Parcel::new();
    let error = client.post(LABELS_PATH, &next.key, next.body).await.unwrap_err();
    assert!(
        matches!(
            error,
            IntentError::GaveUp {
                reason: GiveUpReason::BudgetExhausted,
                attempts: 1,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(ATTEMPT_TIMEOUT_MS),
        "gave up promptly: {:?}",
        started.elapsed()
    );
    assert_eq!(service.carrier_stats().await.purchases_total, 0);
    parked.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_waited_before_every_retry() {
    let (service, _process, parked) = shedding_service().await;
    let clock = Arc::new(ManualClock::default());
    let attempts = 4;
    let client = client_on(
        &service,
        policy().attempts_max(attempts).build().unwrap(),
        clock.clone(),
    );
    let parcel = Parcel::new();
    let error = client.post(LABELS_PATH, &parcel.key, parcel.body).await.unwrap_err();
    assert!(
        matches!(
            error,
            IntentError::GaveUp {
                reason: GiveUpReason::AttemptsExhausted,
                attempts: 4,
                ..
            }
        ),
        "{error:?}"
    );
    let pauses = clock.pauses();
    assert_eq!(pauses.len(), attempts as usize - 1, "{pauses:?}");
    let backoff_cap = Duration::from_millis(500);
    for pause in &pauses {
        let told = Duration::from_secs(RETRY_AFTER_S);
        assert!(
            *pause >= told && *pause <= told + backoff_cap,
            "each pause is the server's Retry-After plus at most the backoff: {pauses:?}"
        );
    }
    parked.abort();
}
