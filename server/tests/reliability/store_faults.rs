//! The store fails under load and comes back.
//!
//! A Fulfilment client keeps 6 parcels in flight, each retried with its key
//! until it has its label, while the store goes away and returns:
//! - Redis frozen (SIGSTOP, connections open, nothing answers) and resumed;
//! - Redis killed (SIGKILL) and restarted on the same port (its AOF, fsynced
//!   per write, keeps the records);
//! - PostgreSQL stopped (`pg_ctl stop -m immediate`) and started again;
//! - the embedded store's disk full (a small tmpfs filled up) and freed.
//!
//! Every answer during the outage is a 503 with `Retry-After` (never a 500),
//! none takes longer than the request budget, the service recovers by itself
//! (same process, no restart) and every parcel ends with one label and one
//! purchase.

use crate::support::audit::{LabelCensus, census_embedded, open_embedded_at};
use crate::support::backends::{BackendSetup, fresh_database, pair};
use crate::support::process::start_server;
use crate::support::service::{Service, ServiceOptions};
use crate::support::{
    ALICE_ID, LabelPost, Reply, callers_env, client, derived_key, label_body, metric_value, metrics_text,
    unique_order_id,
};
use server::backend::StoreKind;
use server::carrier::{CarrierStats, read_stats};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use store_core::Policy;
use store_postgres::testkit::PostgresServer;

/// The request budget of the service under test.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Slack on top of the budget for the answer to travel and be read.
const ANSWER_SLACK_MS: u64 = 500;
/// Parcels in flight at once.
const IN_FLIGHT: usize = 6;
/// How long the store stays away.
const OUTAGE_MS: u64 = 1_500;
/// Longest the parcels may take to finish after the store returns.
const RECOVERY_MS_MAX: u64 = 30_000;

/// One answer, and when it came relative to the outage.
struct Observation {
    reply: Reply,
    took: Duration,
}

fn fault_options() -> ServiceOptions {
    ServiceOptions {
        // A lease only a little longer than the carrier timeout, so a lease
        // that could not be released during the outage ends soon.
        policy: Policy::new(1_500, 600_000, 0).expect("policy"),
        carrier_timeout_ms: 1_000,
        request_timeout_ms: REQUEST_TIMEOUT_MS,
        redis_response_timeout_ms: 300,
        ..ServiceOptions::default()
    }
}

/// Sends one attempt per unfinished parcel (up to `IN_FLIGHT`), files the answers.
async fn drive_round(http: &reqwest::Client, base: &str, pending: &mut Vec<u64>, log: &mut Vec<Observation>) {
    let batch: Vec<u64> = pending.iter().take(IN_FLIGHT).copied().collect();
    let sends = batch.iter().map(|&order_id| async move {
        let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
        let started = Instant::now();
        let reply = LabelPost::new(&key, &body).send(http, base).await.expect("an answer");
        (
            order_id,
            Observation {
                reply,
                took: started.elapsed(),
            },
        )
    });
    for (order_id, observation) in futures::future::join_all(sends).await {
        if observation.reply.status == 201 {
            pending.retain(|&pending_order| pending_order != order_id);
        }
        log.push(observation);
    }
    tokio::time::sleep(Duration::from_millis(25)).await;
}

/// Drives parcels, new ones while `outage` takes the store away and brings
/// it back, then until every parcel has its label.
async fn drive_through(base: &str, outage: impl Future<Output = ()>) -> (Vec<u64>, Vec<Observation>) {
    let http = client();
    let (mut orders, mut pending, mut log) = (Vec::new(), Vec::new(), Vec::new());
    let outage_over = AtomicBool::new(false);
    let drive = async {
        let deadline = Instant::now() + Duration::from_millis(OUTAGE_MS + RECOVERY_MS_MAX);
        while !(outage_over.load(Ordering::SeqCst) && pending.is_empty()) {
            if Instant::now() >= deadline {
                let last = log
                    .last()
                    .map(|observation: &Observation| observation.reply.text())
                    .unwrap_or_default();
                panic!("{} parcels never recovered; the last answer: {last}", pending.len());
            }
            while !outage_over.load(Ordering::SeqCst) && pending.len() < IN_FLIGHT {
                let order_id = unique_order_id();
                orders.push(order_id);
                pending.push(order_id);
            }
            drive_round(&http, base, &mut pending, &mut log).await;
        }
    };
    let outage = async {
        outage.await;
        outage_over.store(true, Ordering::SeqCst);
    };
    tokio::join!(drive, outage);
    (orders, log)
}

/// The answers' verdict and the audit; returns a summary line.
async fn judge(backend: &str, service: &Service, orders: &[u64], log: &[Observation]) -> String {
    let census = service.census().await;
    let stats = service.carrier_stats(&client()).await;
    judge_outage(backend, &census, &stats, orders, log)
}

/// Every answer is a label, a 409 or a 503 with `Retry-After` within the
/// budget, at least one 503 `store_unavailable` shows that the outage was
/// seen, and every parcel has one label and one purchase.
fn judge_outage(
    backend: &str,
    census: &LabelCensus,
    stats: &CarrierStats,
    orders: &[u64],
    log: &[Observation],
) -> String {
    let mut by_answer: BTreeMap<String, usize> = BTreeMap::new();
    for observation in log {
        let reply = &observation.reply;
        let answer = format!("{} {}", reply.status, reply.code());
        *by_answer.entry(answer).or_default() += 1;
        assert!(
            matches!(reply.status, 201 | 409 | 503),
            "{backend}: {} {}",
            reply.status,
            reply.text()
        );
        if reply.status == 503 {
            assert!(
                reply.retry_after().is_some_and(|s| s >= 1),
                "{backend}: 503 without Retry-After"
            );
        }
        assert!(
            observation.took <= Duration::from_millis(REQUEST_TIMEOUT_MS + ANSWER_SLACK_MS),
            "{backend}: an answer took {:?}",
            observation.took
        );
    }
    assert!(
        by_answer.get("503 store_unavailable").is_some_and(|&count| count > 0),
        "{backend}: the outage was never seen: {by_answer:?}"
    );
    for order_id in orders {
        assert_eq!(
            census.labels_of(ALICE_ID, *order_id, 1).len(),
            1,
            "{backend}: parcel {order_id}"
        );
        let purchases: Vec<u64> = stats
            .purchases_by_parcel
            .iter()
            .filter(|parcel| parcel.order_id == *order_id)
            .map(|parcel| parcel.purchases)
            .collect();
        assert_eq!(purchases, [1], "{backend}: parcel {order_id}");
    }
    let slowest = log.iter().map(|observation| observation.took).max().unwrap_or_default();
    format!(
        "RELIABILITY store_fault {backend} answers={by_answer:?} slowest_ms={} parcels={} (one label and one purchase each)",
        slowest.as_millis(),
        orders.len(),
    )
}

/// How often the binary checks its stores' readiness in these tests.
const READINESS_REFRESH_MS: u64 = 100;

/// `/readyz` answers from a background check: true once it is 200, asked
/// over a few checks' time (the last one may predate the recovery).
async fn ready_within_a_check(base: &str) -> bool {
    for _ in 0..20 {
        if readiness(base).await == 200 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(READINESS_REFRESH_MS)).await;
    }
    false
}

async fn readiness(base: &str) -> u16 {
    client()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_then_killed_mid_run_is_503_and_the_service_recovers_by_itself() {
    let mut setup = BackendSetup::start(StoreKind::Redis).await;
    let service = Service::start(&setup, fault_options()).await;
    let redis = setup.redis.as_mut().expect("redis");
    let freeze = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.pause().expect("SIGSTOP redis");
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        assert_eq!(readiness(&service.base).await, 503, "not ready while Redis is frozen");
        redis.resume().expect("SIGCONT redis");
    };
    let (orders, log) = drive_through(&service.base, freeze).await;
    eprintln!("{} (frozen)", judge("redis", &service, &orders, &log).await);

    let kill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.kill();
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        assert_eq!(readiness(&service.base).await, 503, "not ready while Redis is down");
        tokio::task::block_in_place(|| redis.restart()).expect("restart redis on the same port");
    };
    let (orders, log) = drive_through(&service.base, kill).await;
    eprintln!("{} (killed, restarted)", judge("redis", &service, &orders, &log).await);
    assert_eq!(readiness(&service.base).await, 200, "ready again");
}

/// `pg_ctl` of the test server's cluster, as its OS user when run as root
/// (the harness's own layout: `<directory>/data`, the socket in `<directory>`).
fn pg_ctl(server: &PostgresServer, arguments: &[&str]) {
    let bin = newest_postgres_bin();
    let running_as_root = std::fs::read_to_string("/proc/self/status")
        .map(|status| {
            status
                .lines()
                .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let mut command = if running_as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(bin.join("pg_ctl"));
        command
    } else {
        Command::new(bin.join("pg_ctl"))
    };
    let data = server.directory().join("data");
    let output = command
        .current_dir(server.directory())
        .args(arguments)
        .arg("--pgdata")
        .arg(&data)
        .output()
        .expect("run pg_ctl");
    assert!(
        output.status.success(),
        "pg_ctl {arguments:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn newest_postgres_bin() -> PathBuf {
    let root = Path::new(store_postgres::testkit::DEBIAN_POSTGRESQL_DIR);
    let newest = std::fs::read_dir(root)
        .expect("postgresql installed")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .expect("a postgresql version");
    root.join(newest.to_string()).join("bin")
}

/// The harness starts PostgreSQL with `synchronous_commit=off` (speed, for
/// a throw-away cluster), under which a commit acknowledged just before an
/// immediate stop can be lost: this test saw labels vanish that way. A
/// per-database setting outranks the command line, so this database gets
/// durable commits (the WAL written before the acknowledgement; the OS keeps
/// it through a database crash even with the cluster's fsync=off).
async fn make_commits_survive_a_server_crash(url: &str) {
    let database = url.rsplit('/').next().expect("a database name");
    let client = crate::support::audit::postgres_client(url).await;
    client
        .batch_execute(&format!("ALTER DATABASE {database} SET synchronous_commit = on"))
        .await
        .expect("ALTER DATABASE");
}

fn start_postgres_again(server: &PostgresServer) {
    let options = format!(
        "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
        server.port(),
        server.directory().display()
    );
    let log = server.directory().join("server.log");
    let log = log.to_str().expect("UTF-8 path");
    pg_ctl(server, &["start", "--wait", "--log", log, "-o", &options]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_run_is_503_and_the_service_recovers_by_itself() {
    let postgres = PostgresServer::start().expect("a PostgreSQL server of this test's own");
    let mut setup = BackendSetup::start(StoreKind::Embedded).await;
    setup.backend = StoreKind::Postgres;
    let url = fresh_database(&postgres).await;
    make_commits_survive_a_server_crash(&url).await;
    setup.postgres_url = Some(url);
    let service = Service::start(&setup, fault_options()).await;
    let outage = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::block_in_place(|| pg_ctl(&postgres, &["stop", "--mode", "immediate", "--wait"]));
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        assert_eq!(
            readiness(&service.base).await,
            503,
            "not ready while PostgreSQL is down"
        );
        tokio::task::block_in_place(|| start_postgres_again(&postgres));
    };
    let (orders, log) = drive_through(&service.base, outage).await;
    eprintln!("{}", judge("postgres", &service, &orders, &log).await);
    assert_eq!(readiness(&service.base).await, 200, "ready again");
}

/// A small tmpfs of this test's own, unmounted (lazily, the store may still
/// hold files there) when dropped.
struct SmallDisk {
    directory: tempfile::TempDir,
}

/// Size of the tmpfs the embedded store runs on.
const SMALL_DISK_MIB: u64 = 64;
/// Chunk written at a time while filling the disk.
const BALLAST_CHUNK_BYTES: usize = 1 << 20;

impl SmallDisk {
    fn mount() -> Self {
        let directory = tempfile::tempdir().expect("mount point");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={SMALL_DISK_MIB}m"),
                "idem-small-disk",
            ])
            .arg(directory.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN), as CI has"
        );
        Self { directory }
    }

    fn path(&self) -> &Path {
        self.directory.path()
    }

    /// Writes a ballast file until the disk is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let ballast = self.path().join("ballast");
        let mut file = std::fs::File::create(&ballast).expect("ballast");
        let chunk = vec![0u8; BALLAST_CHUNK_BYTES];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.sync_all();
        ballast
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.directory.path()).status();
    }
}

/// fjall refuses every write after a failed journal write ("poisoned");
/// the embedded engine then answers 503 `store_unavailable` at once and
/// reopens the directory (replaying the journal) once the failed opening's
/// transactions are gone: the service recovers by itself, in the same
/// process, when the disk has room again. The server and the carrier run as
/// processes of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_embedded_store_is_503_and_the_service_recovers_by_itself() {
    let disk = SmallDisk::mount();
    let mut setup = BackendSetup::start(StoreKind::Embedded).await;
    setup.data = tempfile::tempdir_in(disk.path()).expect("data directory on the small disk");
    let work = tempfile::tempdir().expect("working directory");
    let carrier = start_server(&["carrier", "--listen", "127.0.0.1:0"], &[], None, work.path()).await;
    let mut env = setup.env();
    env.extend([
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__SERVER__REQUEST_TIMEOUT_MS", REQUEST_TIMEOUT_MS),
        pair("IDEM__CALLERS", callers_env()),
        pair("IDEM__POLICY__LEASE_MS", 1_500),
        pair("IDEM__CARRIER__TIMEOUT_MS", 1_000),
        pair("IDEM__CARRIER__URL", &carrier.url),
        pair("IDEM__SERVER__READINESS_REFRESH_MS", READINESS_REFRESH_MS),
    ]);
    let server = start_server(&[], &env, None, work.path()).await;
    let outage = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ballast = tokio::task::block_in_place(|| disk.fill());
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        std::fs::remove_file(ballast).expect("free the disk");
    };
    let (orders, log) = drive_through(&server.url.clone(), outage).await;
    assert!(ready_within_a_check(&server.url).await, "ready again");
    assert!(
        server.log().contains("embedded store reopened"),
        "recovered by reopening the store: {}",
        server.log()
    );
    let exposition = metrics_text(&client(), &server.url).await;
    let reopens = metric_value(&exposition, "idem_embedded_reopens_total", &[]);
    assert!(reopens >= 1.0, "the reopen is counted: {reopens}");
    let _ = server.terminate().await.0;
    let stats = read_stats(&client(), &carrier.url).await.expect("carrier stats");
    let census = census_embedded(&open_embedded_at(&setup.embedded_path())).await;
    let summary = judge_outage("embedded", &census, &stats, &orders, &log);
    eprintln!("{summary} (disk full, freed)");
}
