//! The fault campaign (RELIABILITY.md, section 13): a fleet of three
//! `server` processes, each in a network namespace of its own, on a shared
//! store (PostgreSQL; Redis keys with PostgreSQL labels; with the
//! `foundationdb` feature, a three-process FoundationDB cluster), a carrier
//! simulator, and nemeses on a schedule drawn from a printed seed:
//! partitions from the store and from the carrier, SIGSTOP past the lease,
//! SIGKILL and restart, a clock moved ahead, the store crashed and
//! restarted, a slow carrier and lost carrier replies. The Fulfilment
//! client labels parcels throughout, each retry on another instance, and
//! every attempt goes into a JSON-lines history; the carrier's sale book
//! and the label store's rows are written at the end. A checker that reads
//! only those files then says whether each intent was done exactly once.
//!
//! Needs root (it creates network namespaces, a bridge and veth pairs, and
//! removes them however the test ends).
//!
//! | variable | what | default |
//! |---|---|---|
//! | `IDEM_FAULT_SEED` | replays a campaign (each prints its seed) | random |
//! | `IDEM_FAULT_SECONDS` | a long campaign: every nemesis in turn for this long | unset: the short campaign (the pause and two more) |
//! | `IDEM_FAULT_REDIS_FSYNC` | Redis's `appendfsync`, `everysec` or `always` | `everysec` |
//! | `IDEM_FAULT_DIR` | where the history and the other files are written (kept) | a temporary folder, kept when the check fails |
//! | `IDEM_FDB_BIN_DIR` | FoundationDB's `bin` folder (the `foundationdb` campaign) | `fdbserver` on `PATH` |

mod checker;
mod cluster;
#[cfg(feature = "foundationdb")]
mod fdb;
mod history;
mod nemesis;
mod network;
mod workload;

use crate::checker::Report;
use crate::cluster::{Backend, Cluster, RedisFsync};
use crate::history::{
    CAMPAIGN_FILE, CampaignInfo, FAULTS_FILE, HISTORY_FILE, JsonLines, LABELS_FILE, SALES_FILE, now_ms,
};
use crate::workload::Workload;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for every instance to be ready again after the last fault.
const READY_AGAIN_MS_MAX: u64 = 60_000;

/// What a campaign runs, from the environment.
struct Settings {
    seed: u64,
    long_seconds: Option<u64>,
    redis_fsync: RedisFsync,
    dir: Option<PathBuf>,
}

impl Settings {
    fn from_env() -> Self {
        let number = |name: &str| {
            std::env::var(name).ok().map(|value| {
                value
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}={value:?} is not a number"))
            })
        };
        let redis_fsync = match std::env::var("IDEM_FAULT_REDIS_FSYNC").as_deref() {
            Ok("always") => RedisFsync::Always,
            Ok("everysec") | Err(_) => RedisFsync::EverySecond,
            Ok(other) => panic!("IDEM_FAULT_REDIS_FSYNC={other:?}: everysec or always"),
        };
        Self {
            seed: number("IDEM_FAULT_SEED").unwrap_or_else(rand::random),
            long_seconds: number("IDEM_FAULT_SECONDS"),
            redis_fsync,
            dir: std::env::var_os("IDEM_FAULT_DIR").map(PathBuf::from),
        }
    }
}

/// Runs one campaign on `backend` and checks it.
async fn campaign(backend: Backend) -> Report {
    let settings = Settings::from_env();
    let wall = Instant::now();
    let schedule = match settings.long_seconds {
        Some(seconds) => nemesis::long_schedule(settings.seed, cluster::INSTANCES, seconds * 1_000),
        None => nemesis::short_schedule(settings.seed, cluster::INSTANCES),
    };
    let nemeses: Vec<&str> = schedule.iter().map(|planned| planned.nemesis.name()).collect();
    eprintln!(
        "FAULTS campaign backend={} seed={} nemeses={nemeses:?} (replay: IDEM_FAULT_SEED={}{})",
        backend.name(),
        settings.seed,
        settings.seed,
        settings
            .long_seconds
            .map(|seconds| format!(" IDEM_FAULT_SECONDS={seconds}"))
            .unwrap_or_default()
    );
    let (dir, kept) = output_dir(&settings, backend);
    let mut cluster = Cluster::start(backend, settings.redis_fsync).await;
    let history = Arc::new(JsonLines::create(&dir.join(HISTORY_FILE)));
    let faults = JsonLines::create(&dir.join(FAULTS_FILE));
    let workload = Workload::new(cluster.urls(), history.clone());
    let load_over = Arc::new(AtomicBool::new(false));
    let started_ms = now_ms();
    let (intents, ()) = tokio::join!(workload.load(load_over.clone()), async {
        nemesis::run(&mut cluster, &schedule, &faults).await;
        load_over.store(true, Ordering::Relaxed);
    });
    let load_ms = now_ms() - started_ms;
    wait_until_ready(&cluster).await;
    let unfinished = workload.heal(&intents).await;
    workload.replay_everywhere(&intents).await;
    write_end_state(&cluster, &dir).await;
    let info = CampaignInfo {
        backend: backend.name().to_owned(),
        redis_fsync: (backend == Backend::RedisWithPostgresLabels).then(|| settings.redis_fsync.name().to_owned()),
        seed: settings.seed,
        load_ms,
        started_ms,
        ended_ms: now_ms(),
    };
    std::fs::write(
        dir.join(CAMPAIGN_FILE),
        serde_json::to_string_pretty(&info).expect("json"),
    )
    .expect("campaign.json");
    drop(cluster);
    let report = checker::check(&dir);
    eprintln!("{}", report.table());
    eprintln!(
        "FAULTS wall_s={:.1} intents_unfinished_after_heal={unfinished} files={}",
        wall.elapsed().as_secs_f64(),
        dir.display()
    );
    assert_eq!(
        report.by_nemesis.values().map(|figures| figures.faults).sum::<usize>(),
        schedule.len(),
        "every planned fault is in the log"
    );
    if report.unpredicted().is_empty() {
        drop(kept);
    } else if let Some(mut temporary) = kept {
        temporary.disable_cleanup(true);
    }
    report
}

/// The campaign's folder: `IDEM_FAULT_DIR/<backend>-<seed>`, or a
/// temporary one (returned, to be removed unless the check fails).
fn output_dir(settings: &Settings, backend: Backend) -> (PathBuf, Option<tempfile::TempDir>) {
    let name = format!("{}-{}", backend.name().replace('+', "-"), settings.seed);
    match &settings.dir {
        Some(parent) => {
            let dir = parent.join(name);
            std::fs::create_dir_all(&dir).expect("the campaign's folder");
            (dir, None)
        }
        None => {
            let temporary = tempfile::Builder::new()
                .prefix(&format!("idem-faults-{name}-"))
                .tempdir()
                .expect("a temporary folder");
            (temporary.path().to_owned(), Some(temporary))
        }
    }
}

/// Every instance answers `/readyz` (after the last heal, restarted ones included).
async fn wait_until_ready(cluster: &Cluster) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_millis(READY_AGAIN_MS_MAX);
    for url in cluster.urls() {
        loop {
            let probe = http
                .get(format!("{url}/readyz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if probe.is_ok_and(|response| response.status().is_success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{url} not ready {READY_AGAIN_MS_MAX} ms after the heal"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The carrier's sale book and the label store's rows.
async fn write_end_state(cluster: &Cluster, dir: &std::path::Path) {
    let http = reqwest::Client::new();
    let sales = server::carrier::read_stats(&http, cluster.carrier_url())
        .await
        .expect("the carrier's sale book");
    std::fs::write(dir.join(SALES_FILE), serde_json::to_string(&sales).expect("json")).expect("sales.json");
    let labels = JsonLines::create(&dir.join(LABELS_FILE));
    for row in cluster.stores.label_rows().await {
        labels.append(&row);
    }
    labels.flush();
}

/// The campaign's verdict: no violation but those LIMITS.md predicts (on
/// Redis); none at all elsewhere.
fn assert_exactly_once(report: &Report) {
    let unpredicted = report.unpredicted();
    assert!(
        unpredicted.is_empty(),
        "{} violation(s) on {} (seed {}):\n{}",
        unpredicted.len(),
        report.info.backend,
        report.info.seed,
        report.table()
    );
    assert!(report.intents > 0, "the workload ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_on_postgres() {
    assert_exactly_once(&campaign(Backend::Postgres).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_on_redis_with_postgres_labels() {
    assert_exactly_once(&campaign(Backend::RedisWithPostgresLabels).await);
}

#[cfg(feature = "foundationdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_on_foundationdb() {
    assert_exactly_once(&campaign(Backend::Foundationdb).await);
}
