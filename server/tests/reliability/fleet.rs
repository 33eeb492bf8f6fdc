//! A fleet, not a process: three `server` processes on one shared store,
//! behind no load balancer but a client that sends each attempt of an
//! intent to the next instance (so every retry lands on another instance
//! than the last), a carrier process of their own that loses a share of its
//! replies after selling, intents sent twice at once, and one instance
//! killed with SIGKILL mid-run and started again.
//!
//! Combinations: Redis standalone with labels in PostgreSQL, a Redis Cluster
//! of three masters with labels in PostgreSQL, and PostgreSQL alone. The
//! audit: every intent ends with exactly one label, no parcel has two, the
//! carrier sold each parcel once, and every label can be read from every
//! instance. An embedded store, which is a local directory, refuses a second
//! process with a clear error.
//!
//! `IDEM_FLEET_INTENTS` sets the intents per combination (CI default 300).

use crate::support::audit::census_postgres;
use crate::support::backends::{durable_redis, fresh_database, pair};
use crate::support::process::{ServerProcess, start_carrier, start_server};
use crate::support::{
    ALICE, ALICE_ID, LabelPost, callers_env, client, derived_key, label_body, scaled, unique_order_id,
};
use futures::StreamExt;
use server::carrier::read_stats;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use store_postgres::testkit::PostgresServer;
use store_redis::testkit::{RedisCluster, RedisServer};
use tokio::sync::RwLock;

/// Intents per combination when `IDEM_FLEET_INTENTS` is not set.
pub const FLEET_INTENTS_CI_DEFAULT: usize = 300;
/// Server processes in the fleet.
const INSTANCES: usize = 3;
/// Intents in flight at once.
const CONCURRENT_INTENTS: usize = 24;
/// Every this many intents is sent twice at once.
const SENT_TWICE_EVERY: usize = 10;
/// A short lease, so a killed instance's keys are taken over quickly.
const LEASE_MS: u64 = 800;
/// Must stay under the lease.
const CARRIER_TIMEOUT_MS: u64 = 400;
/// Share of purchases whose reply the carrier drops after selling.
const LOST_REPLY_RATE: f64 = 0.05;
/// Pause between two attempts of an intent.
const RETRY_PAUSE_MS: u64 = 50;
/// How long one intent may take before the test gives up on it: CI runs
/// other test binaries on the same 2 cores, so this is generous.
const INTENT_MS_MAX: u64 = 60_000;
/// Answers kept per intent, shown when it gives up.
const ANSWERS_KEPT: usize = 8;
/// How long the killed instance stays down.
const DOWN_MS: u64 = 500;

/// Where a fleet keeps its records and labels.
#[derive(Debug, Clone, Copy)]
enum Combination {
    RedisWithPostgresLabels,
    RedisClusterWithPostgresLabels,
    Postgres,
}

/// The shared store of one run, kept alive for it.
struct SharedStore {
    env: Vec<(String, String)>,
    postgres_url: String,
    _redis: Option<RedisServer>,
    _cluster: Option<RedisCluster>,
}

impl SharedStore {
    async fn start(combination: Combination) -> Self {
        let postgres_url = fresh_database(PostgresServer::shared()).await;
        let mut env = vec![pair("IDEM__STORE__POSTGRES__URL", format!("\"{postgres_url}\""))];
        let (mut redis, mut cluster) = (None, None);
        match combination {
            Combination::Postgres => env.push(pair("IDEM__STORE__KIND", "postgres")),
            Combination::RedisWithPostgresLabels => {
                let server = durable_redis();
                env.push(pair("IDEM__STORE__REDIS__URLS", format!("[\"{}\"]", server.url())));
                redis = Some(server);
            }
            Combination::RedisClusterWithPostgresLabels => {
                let nodes = RedisCluster::start().expect("a three-master Redis Cluster");
                let urls: Vec<String> = nodes.urls().iter().map(|url| format!("\"{url}\"")).collect();
                env.push(pair("IDEM__STORE__REDIS__URLS", format!("[{}]", urls.join(", "))));
                env.push(pair("IDEM__STORE__REDIS__CLUSTER", "true"));
                cluster = Some(nodes);
            }
        }
        if redis.is_some() || cluster.is_some() {
            env.push(pair("IDEM__STORE__KIND", "redis"));
            env.push(pair("IDEM__STORE__LABELS", "postgres"));
        }
        Self {
            env,
            postgres_url,
            _redis: redis,
            _cluster: cluster,
        }
    }
}

/// The instances' URLs, which change when one is restarted.
type Urls = Arc<RwLock<Vec<String>>>;

/// One intent driven to its label, each attempt on the next instance, for
/// at most [`INTENT_MS_MAX`] (a time budget, not a count: connection errors
/// while an instance is down come back at once).
async fn drive_intent(http: reqwest::Client, urls: Urls, key: String, body: String, first: usize) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(INTENT_MS_MAX);
    let mut lately: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut attempt = 0;
    while tokio::time::Instant::now() < deadline {
        let url = {
            let urls = urls.read().await;
            urls[(first + attempt) % urls.len()].clone()
        };
        attempt += 1;
        let answer = match LabelPost::new(&key, &body).send(&http, &url).await {
            Ok(reply) if reply.status == 201 => return reply.label_id(),
            Ok(reply) if matches!(reply.status, 409 | 503) => format!("{} {} from {url}", reply.status, reply.code()),
            Ok(reply) => panic!("{key}: a retryable intent got {}: {}", reply.status, reply.text()),
            // The instance was killed under the request, or is down.
            Err(error) => format!("no answer from {url}: {error}"),
        };
        if lately.len() == ANSWERS_KEPT {
            lately.pop_front();
        }
        lately.push_back(answer);
        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
    }
    panic!("{key}: no label in {INTENT_MS_MAX} ms ({attempt} attempts); the last answers: {lately:#?}");
}

/// What the fleet answered for one intent: every copy's label.
struct Answered {
    order_id: u64,
    labels: Vec<String>,
}

async fn fleet_run(combination: Combination) {
    let intents = scaled("IDEM_FLEET_INTENTS", FLEET_INTENTS_CI_DEFAULT);
    let store = SharedStore::start(combination).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let carrier = start_carrier((0, 2), LOST_REPLY_RATE, dir.path()).await;
    let mut env = store.env.clone();
    env.extend([
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__CALLERS", callers_env()),
        pair("IDEM__POLICY__LEASE_MS", LEASE_MS),
        pair("IDEM__CARRIER__TIMEOUT_MS", CARRIER_TIMEOUT_MS),
        pair("IDEM__CARRIER__URL", &carrier.url),
    ]);
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        instances.push(start_server(&[], &env, None, dir.path()).await);
    }
    let urls: Urls = Arc::new(RwLock::new(
        instances.iter().map(|process| process.url.clone()).collect(),
    ));
    let http = client();
    let finished = Arc::new(AtomicUsize::new(0));
    let load = {
        let (http, urls, finished) = (http.clone(), urls.clone(), finished.clone());
        futures::stream::iter(0..intents)
            .map(move |number| {
                let (http, urls, finished) = (http.clone(), urls.clone(), finished.clone());
                async move {
                    let order_id = unique_order_id();
                    let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
                    let copies = if number % SENT_TWICE_EVERY == 0 { 2 } else { 1 };
                    let drives = (0..copies)
                        .map(|copy| drive_intent(http.clone(), urls.clone(), key.clone(), body.clone(), number + copy));
                    let labels = futures::future::join_all(drives).await;
                    finished.fetch_add(1, Ordering::Relaxed);
                    Answered { order_id, labels }
                }
            })
            .buffer_unordered(CONCURRENT_INTENTS)
            .collect::<Vec<Answered>>()
    };
    let load = tokio::spawn(load);
    // A third of the way in, kill one instance mid-request and bring it back.
    while finished.load(Ordering::Relaxed) < intents / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = instances.remove(1);
    victim.kill().await;
    tokio::time::sleep(Duration::from_millis(DOWN_MS)).await;
    let restarted = start_server(&[], &env, None, dir.path()).await;
    urls.write().await[1] = restarted.url.clone();
    instances.insert(1, restarted);
    let answered = load.await.expect("the load finishes");
    audit(combination, &http, &store, &carrier, &instances, &answered).await;
    for instance in instances {
        let status = instance.terminate().await.0;
        assert!(status.success(), "{combination:?}: an instance did not stop cleanly");
    }
    let _ = carrier.terminate().await.0;
}

async fn audit(
    combination: Combination,
    http: &reqwest::Client,
    store: &SharedStore,
    carrier: &ServerProcess,
    instances: &[ServerProcess],
    answered: &[Answered],
) {
    let census = census_postgres(&store.postgres_url).await;
    let stats = read_stats(http, &carrier.url).await.expect("carrier stats");
    let mut two_labels = 0;
    for intent in answered {
        let stored = census.labels_of(ALICE_ID, intent.order_id, 1);
        assert_eq!(
            stored.len(),
            1,
            "{combination:?}: order {} has labels {stored:?}",
            intent.order_id
        );
        for label in &intent.labels {
            assert_eq!(label, &stored[0], "{combination:?}: a copy was answered another label");
        }
        two_labels += usize::from(intent.labels.iter().any(|label| label != &intent.labels[0]));
    }
    assert_eq!(two_labels, 0);
    assert_eq!(
        census.labels_total(),
        answered.len(),
        "{combination:?}: labels beyond the intents"
    );
    assert_eq!(census.parcels_with_more_than_one_label(), 0, "{combination:?}");
    let bought_twice = stats
        .purchases_by_parcel
        .iter()
        .filter(|parcel| parcel.purchases > 1)
        .count();
    assert_eq!(bought_twice, 0, "{combination:?}: parcels bought twice");
    assert_eq!(
        stats.purchases_total as usize,
        answered.len(),
        "{combination:?}: one purchase per intent"
    );
    assert!(
        stats.replies_dropped > 0,
        "{combination:?}: the carrier lost no reply: {stats:?}"
    );
    for intent in answered {
        for instance in instances {
            let response = http
                .get(format!("{}/v1/labels/{}", instance.url, intent.labels[0]))
                .bearer_auth(ALICE)
                .send()
                .await
                .expect("read a label");
            assert_eq!(
                response.status().as_u16(),
                200,
                "{combination:?}: label {} not readable from {}",
                intent.labels[0],
                instance.url
            );
        }
    }
    eprintln!(
        "RELIABILITY fleet combination={combination:?} instances={INSTANCES} intents={} labels={} \
         purchases={} replies_dropped={} deduplicated_repeats={} bought_twice=0 readable_everywhere=yes",
        answered.len(),
        census.labels_total(),
        stats.purchases_total,
        stats.replies_dropped,
        stats.deduplicated_repeats
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_redis_with_labels_in_postgres() {
    fleet_run(Combination::RedisWithPostgresLabels).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_redis_cluster_with_labels_in_postgres() {
    fleet_run(Combination::RedisClusterWithPostgresLabels).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_postgres() {
    fleet_run(Combination::Postgres).await;
}

/// The embedded store is one process's directory: a second server on the
/// same path must refuse to start, saying why, instead of sharing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_one_embedded_store_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let env = vec![
        pair("IDEM__STORE__KIND", "embedded"),
        pair("IDEM__STORE__EMBEDDED__PATH", dir.path().join("store").display()),
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__CALLERS", callers_env()),
    ];
    let first = start_server(&[], &env, None, dir.path()).await;
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_server"))
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env_remove("RUST_LOG")
        .current_dir(dir.path())
        .output();
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second process exits")
        .expect("run the second process");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        !second.status.success(),
        "a second process opened the same embedded store:\n{said}"
    );
    assert!(
        said.to_lowercase().contains("lock"),
        "the refusal does not say the store is locked by another process:\n{said}"
    );
    let status = first.terminate().await.0;
    assert!(status.success());
}
