//! `Prefer: wait` (docs/design.md#waiting) as a deployment sees it: the
//! waiter caps of `[server]` are the ones that apply, and across two
//! instances of the Label service on one shared store (Redis, a Redis
//! Cluster, PostgreSQL) a request waiting on one instance is woken by an
//! attempt on the other, through the store's notifications.
//!
//! The instances are the harness's [`TestServer`]s, given the same store
//! settings and the first one's in-process carrier simulator, whose script
//! makes the first attempt slow or makes it fail.

use crate::common::{
    ALICE, Options, Reply, TestServer, fresh_key, fresh_postgres_url, label_body, metric_value, order_id, pair,
    purchases_for,
};
use server::backend::StoreKind;
use server::carrier::{ScriptStep, SimulatedFault};
use std::sync::Arc;
use std::time::Duration;
use store_redis::testkit::{RedisCluster, RedisServer, shared_cluster, shared_server};

/// Requests waiting on the other instance in each case.
const WAITERS: usize = 4;
/// How long the carrier holds the first attempt: long enough for every
/// waiter to arrive and register, short enough to keep the test quick.
const FIRST_ATTEMPT_MS: u64 = 1_500;
/// How long the request that takes the only worker stalls with it: past
/// the first attempt's end, when the waiter is admitted again.
const BLOCKER_STALL_MS: u64 = 2 * FIRST_ATTEMPT_MS;
/// The wait every waiter asks for; far longer than the first attempt.
const PREFER: (&str, &str) = ("prefer", "wait=5");
/// How long a test waits for the first attempt to reach the carrier, or for
/// waiters to register, before failing.
const SETTLE_MS_MAX: u64 = 10_000;

/// Past the configured per-key cap a request is refused at once: the
/// server's `prefer_wait_waiters_per_key_max`, not the library's default of
/// 128, is what applies, and the refusal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_per_key_waiter_cap_applies() {
    let options = Options {
        extra_env: vec![(
            "IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX".to_owned(),
            "2".to_owned(),
        )],
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    server.delay_next_carrier_call(FIRST_ATTEMPT_MS * 2).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let first = server.post_label(Some(ALICE), Some(&key), &body);
    let rest = async {
        until_at_the_carrier(&server, 1).await;
        let waiters = (0..2).map(|_| server.post_label_with_headers(Some(ALICE), Some(&key), &body, &[PREFER]));
        let waiters = futures::future::join_all(waiters);
        let refused = async {
            until_waiting(&server, 2).await;
            let started = tokio::time::Instant::now();
            let refused = server
                .post_label_with_headers(Some(ALICE), Some(&key), &body, &[PREFER])
                .await;
            (refused, started.elapsed())
        };
        tokio::join!(waiters, refused)
    };
    let (first, (waiters, (refused, refused_after))) = tokio::join!(first, rest);
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(
        (refused.status, refused.problem_code().as_str()),
        (409, "request_in_progress")
    );
    assert!(
        refused_after < Duration::from_secs(1),
        "refused after {refused_after:?}"
    );
    assert_eq!(refused.header("preference-applied"), None, "it did not wait");
    assert_replays(&first, &waiters);
    let metrics = server.metrics_text().await;
    assert!(
        metric_value(&metrics, "idem_waits_total", &["outcome=\"refused_cap\""]) >= 1.0,
        "{metrics}"
    );
    assert!(metric_value(&metrics, "idem_waits_total", &["outcome=\"replayed\""]) >= 2.0);
    assert_eq!(purchases_for(&server.carrier_stats().await, order), 1);
    server.shutdown().await;
}

/// A waiter gives its admission worker up while it waits, and one that
/// becomes the attempt (the first attempt released the key) is admitted
/// again before it runs: with one worker, held by a request whose body is
/// still on its way, the waiter that becomes the attempt is shed with 503
/// `overloaded` and buys nothing, instead of running without a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_becomes_the_attempt_is_admitted_again_before_it_runs() {
    use tokio::io::AsyncWriteExt;
    let admission = |field: &str, value: &str| (format!("IDEM__SERVER__ADMISSION__{field}"), value.to_owned());
    let options = Options {
        extra_env: vec![
            admission("WORKERS", "1"),
            admission("TARGET_MS", "10"),
            admission("INTERVAL_MS", "10"),
            no_carrier_retries(),
        ],
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    // The first attempt fails at the carrier after a while: its key is
    // released, and the waiter becomes the attempt.
    server
        .carrier_script(&[ScriptStep {
            delay_ms: FIRST_ATTEMPT_MS,
            fault: SimulatedFault::Error,
        }])
        .await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let first = server.post_label(Some(ALICE), Some(&key), &body);
    let rest = async {
        // The first attempt holds no worker while at the carrier.
        until_at_the_carrier(&server, 1).await;
        let waiter = server.post_label_with_headers(Some(ALICE), Some(&key), &body, &[PREFER]);
        let blocker = async {
            until_waiting(&server, 1).await;
            // Takes the only worker, the one the waiter gave up, and keeps it
            // past the first attempt's end: stalled in its handler, after its
            // claim (a body sent slowly would not do: bodies are read before
            // admission). The first attempt passed that point already.
            fail::cfg(server::failpoints::AFTER_CLAIM, &format!("return({BLOCKER_STALL_MS})")).unwrap();
            let address = server.base.trim_start_matches("http://").to_owned();
            let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
            let body = label_body(order_id(), 1);
            let request = format!(
                "POST /v1/labels HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {ALICE}\r\n\
                 content-type: application/json\r\nidempotency-key: {}\r\ncontent-length: {}\r\n\r\n{body}",
                fresh_key(),
                body.len()
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            until_gauge(&server, "idem_http_requests_in_flight", 3).await;
            stream
        };
        tokio::join!(waiter, blocker)
    };
    let (first, (waiter, _blocker)) = tokio::join!(first, rest);
    fail::remove(server::failpoints::AFTER_CLAIM);
    assert_eq!(
        (first.status, first.problem_code().as_str()),
        (503, "downstream_unavailable")
    );
    assert_eq!(
        (waiter.status, waiter.problem_code().as_str()),
        (503, "overloaded"),
        "the waiter became the attempt with no worker free: {}",
        waiter.text()
    );
    assert_eq!(
        purchases_for(&server.carrier_stats().await, order),
        0,
        "nothing was bought"
    );
    server.shutdown().await;
}

/// Records and labels both instances share, kept alive for the test.
struct SharedStore {
    env: Vec<(String, String)>,
    _redis: Option<Arc<RedisServer>>,
    _cluster: Option<Arc<RedisCluster>>,
}

impl SharedStore {
    /// PostgreSQL: records and labels in one fresh database.
    async fn postgres() -> Self {
        Self {
            env: vec![
                pair("IDEM__STORE__KIND", "postgres"),
                pair("IDEM__STORE__POSTGRES__URL", fresh_postgres_url().await),
                no_carrier_retries(),
            ],
            _redis: None,
            _cluster: None,
        }
    }

    /// Redis records under a prefix of the test's own on the shared
    /// standalone server, or on the shared three-master Cluster; labels in
    /// a fresh PostgreSQL database, as a fleet on Redis keeps them.
    async fn redis(cluster: bool) -> Self {
        let (urls, redis, nodes) = if cluster {
            let nodes = shared_cluster().expect("a three-master Redis Cluster");
            (nodes.urls(), None, Some(nodes))
        } else {
            let server = shared_server().expect("a redis-server");
            (vec![server.url()], Some(server), None)
        };
        let urls: Vec<String> = urls.iter().map(|url| format!("\"{url}\"")).collect();
        Self {
            env: vec![
                pair("IDEM__STORE__KIND", "redis"),
                pair("IDEM__STORE__REDIS__URLS", format!("[{}]", urls.join(", "))),
                pair("IDEM__STORE__REDIS__CLUSTER", cluster),
                pair(
                    "IDEM__STORE__REDIS__KEY_PREFIX",
                    format!("\"w{:016x}:\"", rand::random::<u64>()),
                ),
                pair("IDEM__STORE__LABELS", "postgres"),
                pair("IDEM__STORE__POSTGRES__URL", fresh_postgres_url().await),
                no_carrier_retries(),
            ],
            _redis: redis,
            _cluster: nodes,
        }
    }

    /// Two instances on this store; the second calls the first's carrier
    /// simulator, so one script and one count of purchases serve both.
    async fn two_instances(&self) -> (TestServer, TestServer) {
        // The harness's embedded settings are overridden by the store's.
        let first = TestServer::start_with(
            StoreKind::Embedded,
            Options {
                extra_env: self.env.clone(),
                ..Options::default()
            },
        )
        .await;
        let second = TestServer::start_with(
            StoreKind::Embedded,
            Options {
                extra_env: self.env.clone(),
                carrier_url: Some(first.carrier.clone()),
                ..Options::default()
            },
        )
        .await;
        (first, second)
    }
}

/// The scripts here fail one carrier call per attempt, to release its key:
/// the carrier client must not cure it with a retry of its own.
fn no_carrier_retries() -> (String, String) {
    ("IDEM__CARRIER__RETRIES_MAX".to_owned(), "0".to_owned())
}

/// Waits until the carrier has been called `calls` times in all: the first
/// attempt holds its key from then on.
async fn until_at_the_carrier(server: &TestServer, calls: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SETTLE_MS_MAX);
    while server.carrier_stats().await.requests_total < calls {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt never reached the carrier"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `waiters` requests wait on `server` (its `idem_waiters`).
async fn until_waiting(server: &TestServer, waiters: usize) {
    until_gauge(server, "idem_waiters", waiters).await;
}

/// Waits until the gauge `metric` of `server` reaches `at_least`.
async fn until_gauge(server: &TestServer, metric: &str, at_least: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SETTLE_MS_MAX);
    loop {
        let value = metric_value(&server.metrics_text().await, metric, &[]);
        if value >= at_least as f64 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{metric} is {value}, not {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every waiter got the first attempt's answer, byte for byte, as a replay
/// that says its wait was applied.
fn assert_replays(first: &Reply, waiters: &[Reply]) {
    for waiter in waiters {
        assert_eq!(waiter.status, 201, "{}", waiter.text());
        assert_eq!(waiter.header("idempotent-replayed"), Some("true"));
        assert_eq!(waiter.header("preference-applied"), Some("wait=5"));
        assert_eq!(waiter.body, first.body, "a replay is the saved answer, byte for byte");
    }
}

/// `WAITERS` requests with `Prefer: wait` sent to `waiting_on` once the
/// first attempt (sent to `first_on`) is at the carrier: the first's reply
/// and the waiters'.
async fn first_and_waiters(
    first_on: &TestServer,
    waiting_on: &TestServer,
    key: &str,
    body: &str,
) -> (Reply, Vec<Reply>) {
    let calls_before = first_on.carrier_stats().await.requests_total;
    let first = first_on.post_label(Some(ALICE), Some(key), body);
    let waiters = async {
        until_at_the_carrier(first_on, calls_before + 1).await;
        let waiters = (0..WAITERS).map(|_| waiting_on.post_label_with_headers(Some(ALICE), Some(key), body, &[PREFER]));
        futures::future::join_all(waiters).await
    };
    tokio::join!(first, waiters)
}

/// A slow first attempt on one instance, waiters on the other: one carrier
/// purchase, and every waiter gets the first answer as a replay, woken by
/// the store when the first attempt completed.
async fn waiters_on_one_instance_get_the_answer_of_an_attempt_on_the_other(
    first_instance: &TestServer,
    second_instance: &TestServer,
) {
    first_instance.delay_next_carrier_call(FIRST_ATTEMPT_MS).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let started = tokio::time::Instant::now();
    let (first, waiters) = first_and_waiters(first_instance, second_instance, &key, &body).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_replays(&first, &waiters);
    // Answered when the first attempt ended, not at the end of their 5 s wait.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(purchases_for(&first_instance.carrier_stats().await, order), 1);
}

/// A first attempt on one instance that releases its key (the carrier
/// failed before selling: `503 downstream_unavailable`): exactly one waiter
/// on the other instance becomes the new attempt and buys, once; the others
/// replay its answer.
async fn when_the_attempt_on_one_instance_releases_one_waiter_on_the_other_runs(
    first_instance: &TestServer,
    second_instance: &TestServer,
) {
    let failing = ScriptStep {
        delay_ms: FIRST_ATTEMPT_MS,
        fault: SimulatedFault::Error,
    };
    first_instance.carrier_script(&[failing]).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let (first, waiters) = first_and_waiters(first_instance, second_instance, &key, &body).await;
    assert_eq!(
        (first.status, first.problem_code().as_str()),
        (503, "downstream_unavailable")
    );
    let ran: Vec<&Reply> = waiters
        .iter()
        .filter(|waiter| waiter.header("idempotent-replayed").is_none())
        .collect();
    let answers: Vec<(u16, Option<&str>)> = waiters
        .iter()
        .map(|waiter| (waiter.status, waiter.header("idempotent-replayed")))
        .collect();
    assert_eq!(ran.len(), 1, "exactly one waiter became the attempt: {answers:?}");
    let attempt = ran[0];
    assert_eq!(attempt.status, 201, "{}", attempt.text());
    let replays: Vec<Reply> = waiters
        .iter()
        .filter(|waiter| waiter.header("idempotent-replayed").is_some())
        .cloned()
        .collect();
    assert_replays(attempt, &replays);
    assert_eq!(purchases_for(&first_instance.carrier_stats().await, order), 1);
}

/// Both cases on one pair of instances (fresh keys and parcels each).
async fn waits_across_two_instances(store: SharedStore) {
    let (first_instance, second_instance) = store.two_instances().await;
    waiters_on_one_instance_get_the_answer_of_an_attempt_on_the_other(&first_instance, &second_instance).await;
    when_the_attempt_on_one_instance_releases_one_waiter_on_the_other_runs(&first_instance, &second_instance).await;
    second_instance.shutdown().await;
    first_instance.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_across_two_instances_on_redis() {
    waits_across_two_instances(SharedStore::redis(false).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_across_two_instances_on_a_redis_cluster() {
    waits_across_two_instances(SharedStore::redis(true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_across_two_instances_on_postgresql() {
    waits_across_two_instances(SharedStore::postgres().await).await;
}
