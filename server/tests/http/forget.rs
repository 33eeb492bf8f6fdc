//! `server forget-unreadable-record` as an operator runs it: the real
//! binary and a config file naming the store, with a record made
//! unreadable beforehand through the store's own API (embedded) or by
//! writing to the server directly (Redis, PostgreSQL).

use crate::common::{Reply, fresh_key, label_body, order_id};
use std::path::{Path, PathBuf};
use store_core::testkit::{claim_request, response};
use store_core::{CallerId, ClaimOutcome, IDEMPOTENCY_KEY_BYTES_MAX, IdempotencyStore, Policy, StoreError};
use store_fdb::testkit::overwrite_with_unreadable_bytes;
use store_fdb::{EmbeddedConfig, EmbeddedStore};
use tempfile::TempDir;
use test_support::process::ServerProcess;
use tokio::process::Command;

const CALLER: &str = "alice";
const KEY: &str = "label:918273:1:v1";
const BODY: &str = r#"{"order_id":918273}"#;
/// Longest wait for a log line of the server process.
const LOG_WAIT_MS_MAX: u64 = 5_000;

/// What one run of the binary gave.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `server --config CONFIG forget-unreadable-record ARGS`.
async fn forget(config: &Path, args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_server"))
        .arg("--config")
        .arg(config)
        .arg("forget-unreadable-record")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run the server binary");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn caller() -> CallerId {
    CallerId::new(CALLER).unwrap()
}

fn key_sha256() -> String {
    claim_request(&caller(), KEY, BODY).key.digest().to_string()
}

/// A config file in `dir` whose `[store]` section is `store_section`.
fn config_file(dir: &Path, store_section: &str) -> PathBuf {
    let file = dir.join("idem.toml");
    std::fs::write(&file, store_section).expect("write the config file");
    file
}

fn embedded_config(dir: &TempDir) -> (PathBuf, EmbeddedConfig) {
    let data = dir.path().join("data");
    let section = format!(
        "[store]\nkind = \"embedded\"\n\n[store.embedded]\npath = \"{}\"\n",
        data.display()
    );
    (config_file(dir.path(), &section), EmbeddedConfig::new(data))
}

fn open_embedded(config: &EmbeddedConfig) -> EmbeddedStore {
    EmbeddedStore::open_embedded(config, Policy::default()).expect("open the embedded store")
}

/// Claims `KEY` for `CALLER` and completes it: a first run.
async fn run_once(store: &dyn IdempotencyStore) {
    let ClaimOutcome::Acquired(acquired) = store.claim(&claim_request(&caller(), KEY, BODY)).await.unwrap() else {
        panic!("the key was not acquired");
    };
    assert!(store.complete(&acquired.lease, response(1)).await.unwrap().is_applied());
}

async fn claim(store: &dyn IdempotencyStore) -> Result<ClaimOutcome, StoreError> {
    store.claim(&claim_request(&caller(), KEY, BODY)).await
}

fn assert_refused_as_bad_input(run: &Run, expected: &str) {
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains(expected), "expected {expected:?} in {}", run.stderr);
}

/// The whole operator's path on the embedded store: a wrong path refused,
/// bad input refused with exit 2, the command refused while another process holds the store, the
/// unreadable record deleted, a second run finding nothing, the key
/// claimable again, and then a readable record refused with exit 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_unreadable_record_clears_a_key_of_the_embedded_store() {
    let dir = TempDir::new().unwrap();
    let (config, store_config) = embedded_config(&dir);
    // A path with no store behind it is not made into an empty store.
    let nowhere = forget(&config, &["--caller", CALLER, "--key", KEY]).await;
    assert_eq!(nowhere.code, Some(1), "{}", nowhere.stderr);
    assert!(
        nowhere.stderr.contains("there is no embedded store at"),
        "{}",
        nowhere.stderr
    );
    assert!(!store_config.path.exists(), "the command created a store");

    let store = open_embedded(&store_config);
    run_once(&store).await;
    overwrite_with_unreadable_bytes(&store, &caller(), claim_request(&caller(), KEY, BODY).key.digest()).await;
    assert!(matches!(claim(&store).await, Err(StoreError::Corrupt(_))));

    // Held by this process, as a running server would hold it.
    let held = forget(&config, &["--caller", CALLER, "--key-sha256", &key_sha256()]).await;
    assert_eq!(held.code, Some(1), "{}", held.stderr);
    assert!(held.stderr.contains("locked by another process"), "{}", held.stderr);
    assert!(held.stderr.contains("stop the server"), "{}", held.stderr);
    drop(store);

    let digest = key_sha256();
    let too_long = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1);
    let not_hex = format!("{}z", &digest[1..]);
    let bad_inputs: [(&[&str], &str); 6] = [
        (
            &["--caller", CALLER, "--key-sha256", &digest[1..]],
            "64 hexadecimal digits",
        ),
        (&["--caller", CALLER, "--key-sha256", &not_hex], "'z' at position 63"),
        (&["--caller", CALLER, "--key", &too_long], "256 bytes, more than 255"),
        (&["--caller", "a:b", "--key", KEY], "--caller"),
        (
            &["--caller", CALLER, "--key", KEY, "--key-sha256", &digest],
            "cannot be used with",
        ),
        (&["--caller", CALLER], "--key-sha256"),
    ];
    for (args, expected) in bad_inputs {
        assert_refused_as_bad_input(&forget(&config, args).await, expected);
    }
    let store = open_embedded(&store_config);
    assert!(
        matches!(claim(&store).await, Err(StoreError::Corrupt(_))),
        "bad input changed the store"
    );
    drop(store);

    let deleted = forget(&config, &["--caller", CALLER, "--key-sha256", &digest]).await;
    assert_eq!(deleted.code, Some(0), "{}{}", deleted.stdout, deleted.stderr);
    assert!(
        deleted.stdout.contains("deleted: the unreadable record"),
        "{}",
        deleted.stdout
    );
    let again = forget(&config, &["--caller", CALLER, "--key", KEY]).await;
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(again.stdout.contains("not_found:"), "{}", again.stdout);

    let store = open_embedded(&store_config);
    match claim(&store).await.expect("claim after forget") {
        ClaimOutcome::Acquired(acquired) => {
            assert!(!acquired.takeover);
            assert!(store.complete(&acquired.lease, response(2)).await.unwrap().is_applied());
        }
        other => panic!("the key should be free, got {other:?}"),
    }
    drop(store);

    let readable = forget(&config, &["--caller", CALLER, "--key", KEY]).await;
    assert_eq!(readable.code, Some(3), "{}{}", readable.stdout, readable.stderr);
    assert!(readable.stderr.contains("readable: refusing"), "{}", readable.stderr);
    let store = open_embedded(&store_config);
    assert_eq!(claim(&store).await.unwrap(), ClaimOutcome::Replay(response(2)));
}

/// Redis records: the command opens only the record store (not the
/// embedded label directory a running server would hold), finds the record
/// by the key's digest under the configured prefix, and deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_unreadable_record_clears_a_key_of_redis() {
    let server = store_redis::testkit::RedisServer::start().expect("start redis-server");
    let dir = TempDir::new().unwrap();
    let prefix = "forget-test:";
    let section = format!(
        "[store]\nkind = \"redis\"\n\n[store.redis]\nurls = [\"{}\"]\nkey_prefix = \"{prefix}\"\n",
        server.url()
    );
    let config = config_file(dir.path(), &section);
    let redis_config = store_redis::RedisConfig {
        key_prefix: prefix.to_owned(),
        ..server.config()
    };
    let store = store_redis::RedisStore::connect(redis_config, Policy::default())
        .await
        .unwrap();
    run_once(&store).await;
    let record = store.keys(&caller(), &claim_request(&caller(), KEY, BODY).key).record;
    server.query::<()>(&["HSET", &record, "state", "bogus"]).unwrap();
    assert!(matches!(claim(&store).await, Err(StoreError::Corrupt(_))));

    let deleted = forget(&config, &["--caller", CALLER, "--key-sha256", &key_sha256()]).await;
    assert_eq!(deleted.code, Some(0), "{}{}", deleted.stdout, deleted.stderr);
    assert!(deleted.stdout.contains("deleted:"), "{}", deleted.stdout);
    assert!(matches!(claim(&store).await.unwrap(), ClaimOutcome::Acquired(_)));
}

/// PostgreSQL records: the command needs no migration of its own (the
/// server ran them), and deletes the row that breaks a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_unreadable_record_clears_a_key_of_postgres() {
    let database = store_postgres::testkit::PostgresServer::shared()
        .create_database()
        .await
        .expect("create a test database");
    let store = database.migrated_store(Policy::default(), &[]).await.unwrap();
    let dir = TempDir::new().unwrap();
    let section = format!(
        "[store]\nkind = \"postgres\"\n\n[store.postgres]\nurl = \"{}\"\n",
        database.url
    );
    let config = config_file(dir.path(), &section);
    run_once(&store).await;
    let connection = store.pool().get().await.unwrap();
    let digest = claim_request(&caller(), KEY, BODY).key.digest().0.to_vec();
    let changed = connection
        .execute(
            "UPDATE idempotency_keys SET response = '\\xdeadbeef' WHERE caller_id = $1 AND idem_key = $2",
            &[&CALLER, &digest],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
    drop(connection);
    assert!(matches!(claim(&store).await, Err(StoreError::Corrupt(_))));

    let deleted = forget(&config, &["--caller", CALLER, "--key", KEY]).await;
    assert_eq!(deleted.code, Some(0), "{}{}", deleted.stdout, deleted.stderr);
    assert!(deleted.stdout.contains("deleted:"), "{}", deleted.stdout);
    assert!(matches!(claim(&store).await.unwrap(), ClaimOutcome::Acquired(_)));
}

/// The operator's loop, on Redis records beside a running server: a
/// request meets the unreadable record and answers 500 `record_unreadable`;
/// its log line names the caller and the key's digest; the command, given
/// that digest while the server runs, deletes the record; the next request
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_line_of_an_unreadable_record_names_what_the_command_takes() {
    let redis = store_redis::testkit::RedisServer::start().expect("start redis-server");
    let dir = TempDir::new().unwrap();
    let prefix = "forget-loop:";
    let section = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\nkind = \"redis\"\nlabels = \"embedded\"\n\n\
         [store.redis]\nurls = [\"{}\"]\nkey_prefix = \"{prefix}\"\n\n[store.embedded]\npath = \"{}\"\n",
        redis.url(),
        dir.path().join("labels").display()
    );
    let config = config_file(dir.path(), &section);
    let server = crate::process::start(&["--config", config.to_str().unwrap()], &[], dir.path()).await;
    let key = fresh_key();
    let body = label_body(order_id(), 1);
    assert_eq!(post_label(&server.url, &key, &body).await.status, 201);

    let demo = CallerId::new("demo").unwrap();
    let digest = store_core::IdempotencyKey::new(&key).unwrap().digest();
    let record = store_redis::RecordKeys::of_digest(prefix, &demo, digest).record;
    redis.query::<()>(&["HSET", &record, "state", "bogus"]).unwrap();
    let unreadable = post_label(&server.url, &key, &body).await;
    assert_eq!(
        (unreadable.status, unreadable.problem_code().as_str()),
        (500, "record_unreadable")
    );
    let log = log_with(&server, "a stored record is unreadable").await;
    let line = log
        .lines()
        .find(|line| line.contains("a stored record is unreadable"))
        .unwrap_or_else(|| panic!("no log line for the unreadable record: {log}"));
    let logged_digest = line
        .split("key_sha256=")
        .nth(1)
        .and_then(|rest| rest.get(..64))
        .unwrap_or_else(|| panic!("the line has no key_sha256: {line}"));
    assert_eq!(logged_digest, digest.to_string());
    assert!(line.contains("caller=demo"), "{line}");

    let deleted = forget(&config, &["--caller", "demo", "--key-sha256", logged_digest]).await;
    assert_eq!(deleted.code, Some(0), "{}{}", deleted.stdout, deleted.stderr);
    let served = post_label(&server.url, &key, &body).await;
    assert_eq!(served.status, 201, "{}", served.text());
    drop(server);
}

/// The process's log once it has a line containing `text` (its stdout is
/// read by a task of its own), or as it is after `LOG_WAIT_MS_MAX`.
async fn log_with(server: &ServerProcess, text: &str) -> String {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(LOG_WAIT_MS_MAX);
    loop {
        let log = server.log();
        if log.contains(text) || tokio::time::Instant::now() >= deadline {
            return log;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn post_label(base: &str, key: &str, body: &str) -> Reply {
    crate::process::post(base, server::auth::DEMO_TOKEN, key, body).await
}

/// FoundationDB records (the server's `foundationdb` feature, on the
/// cluster scripts/test-foundationdb starts): the same transaction as on
/// the embedded engine, beside whatever else uses the cluster.
#[cfg(feature = "foundationdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_unreadable_record_clears_a_key_of_foundationdb() {
    use store_fdb::{FoundationDbConfig, FoundationDbNetwork, FoundationDbStore, KeyPrefix};
    let cluster_file = crate::common::foundationdb_cluster_file();
    let prefix = format!("t{:016x}", rand::random::<u64>());
    let network = FoundationDbNetwork::start().expect("start the FoundationDB network");
    let store_config = FoundationDbConfig {
        cluster_file: Some(cluster_file.clone()),
        prefix: KeyPrefix::Bytes(prefix.as_bytes().to_vec()),
        ..FoundationDbConfig::default()
    };
    let store = FoundationDbStore::open_foundationdb(network, &store_config, Policy::default())
        .await
        .expect("open the FoundationDB store");
    let dir = TempDir::new().unwrap();
    let section = format!(
        "[store]\nkind = \"foundationdb\"\n\n[store.foundationdb]\ncluster_file = \"{cluster_file}\"\nkey_prefix = \"{prefix}\"\n"
    );
    let config = config_file(dir.path(), &section);
    run_once(&store).await;
    overwrite_with_unreadable_bytes(&store, &caller(), claim_request(&caller(), KEY, BODY).key.digest()).await;
    assert!(matches!(claim(&store).await, Err(StoreError::Corrupt(_))));

    let deleted = forget(&config, &["--caller", CALLER, "--key-sha256", &key_sha256()]).await;
    assert_eq!(deleted.code, Some(0), "{}{}", deleted.stdout, deleted.stderr);
    assert!(deleted.stdout.contains("deleted:"), "{}", deleted.stdout);
    assert!(matches!(claim(&store).await.unwrap(), ClaimOutcome::Acquired(_)));
}
