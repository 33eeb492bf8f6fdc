//! The store a preload fills, opened as `idem-bench store` opens it (the
//! store registry; a spawned redis-server or PostgreSQL server unless a URL
//! is given), and how its size on disk or in memory is measured.

use crate::cli::BackendArgs;
use crate::store_mode::embedded::durability_name;
use crate::store_mode::{KeepAlive, TargetError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use store_core::{BulkLoad, Policy};
use store_fdb::EmbeddedConfig;
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// A store ready to be filled.
pub struct PreloadTarget {
    pub backend: &'static str,
    /// Durability and deployment facts the figures depend on.
    pub notes: Vec<String>,
    pub store: Arc<dyn BulkLoad>,
    pub size: SizeProbe,
    /// How the preload tells when the store has absorbed what it wrote.
    pub rest: RestProbe,
    /// Spawned servers and the store itself, alive until the target drops.
    pub keep_alive: Vec<KeepAlive>,
}

/// When a store is at rest after a load: what it still owes for the
/// writes it has acknowledged, which the first requests after the load
/// would otherwise pay for.
pub enum RestProbe {
    /// fjall's level 0, flush queue and compactions: a load at tens of
    /// thousands of records a second leaves tables in level 0, and levels
    /// over their size, faster than compaction merges them, and fjall
    /// halts every write while level 0 holds 30 runs. Level 0 is not
    /// merged while a compaction holds level 1, so a level 0 below the
    /// trigger is not enough: at rest when level 0 is below fjall's
    /// compaction trigger ([`EMBEDDED_LEVEL_ZERO_TABLES_AT_REST`]), no
    /// memtable waits and no compaction runs.
    EmbeddedBacklog(store_fdb::EmbeddedEngine),
    /// FoundationDB's queues, from the cluster's status document: a commit
    /// is acknowledged once the logs have it, and the storage servers apply
    /// it and make it durable later, so a load leaves its last mutations
    /// queued in the storage servers' memory (and kept by the logs until
    /// then), and ratekeeper slows every transaction as that queue nears
    /// its target (`TARGET_BYTES_PER_STORAGE_SERVER`, 1,000e6, less
    /// `SPRING_BYTES_STORAGE_SERVER`, 100e6, in FoundationDB's server
    /// knobs). At rest when the worst storage and log queues are below
    /// [`FOUNDATIONDB_QUEUE_BYTES_AT_REST`] and no data is moving between
    /// servers.
    #[cfg(feature = "foundationdb")]
    FoundationDbQueues(store_fdb::FoundationDbEngine),
    /// At rest when the writes return (PostgreSQL, Redis).
    WhenWritten,
}

/// A FoundationDB queue below this is at rest: an idle one-process cluster's
/// worst storage queue held 19,518 bytes and its log queue 10,086 (read
/// with `status json` on 7.3.79); right after 300,000 records they held
/// 369 MB and 91 MB (bench/results/2026-12-05/foundationdb-preload-rest).
pub const FOUNDATIONDB_QUEUE_BYTES_AT_REST: u64 = 16 * 1024 * 1024;

/// A FoundationDB storage queue from which a preload stops sending batches
/// until it falls below again. Ratekeeper throttles every transaction as
/// the worst storage queue nears 900 MB (`TARGET_BYTES_PER_STORAGE_SERVER`
/// less `SPRING_BYTES_STORAGE_SERVER`); a load that runs into it has its
/// 5 MB batches held there for minutes, and a preload of 10M records failed
/// at 8.49M when one batch outlasted its 120 s budget (BENCHMARKS.md, "A day
/// of keys"). About a quarter of that (256 MiB against 900 MB) keeps the
/// load below the throttle, at the rate the storage server makes its writes
/// durable.
pub const FOUNDATIONDB_QUEUE_BYTES_PACE: u64 = 256 * 1024 * 1024;

/// Ratekeeper's name for "not limited": the limit is the workload itself
/// (`cluster.qos.performance_limited_by.name` of the status document).
const RATEKEEPER_UNLIMITED: &str = "workload";

/// What a FoundationDB cluster still owes for the writes it acknowledged,
/// read from its status document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundationDbBacklog {
    pub worst_storage_queue_bytes: u64,
    pub worst_log_queue_bytes: u64,
    /// Data distribution's bytes in flight and queued between servers
    /// (0 when the status document has no `moving_data` yet).
    pub moving_bytes: u64,
    /// What ratekeeper limits transactions by, when it is not the workload
    /// (a storage server's queue or durability lag, a log's queue...).
    pub ratekeeper_limited_by: Option<String>,
}

impl FoundationDbBacklog {
    /// From the status document (`cluster.qos`, `cluster.data.moving_data`);
    /// `None` when it has no queue figures (a cluster still recovering).
    pub fn from_status(status: &serde_json::Value) -> Option<Self> {
        let qos = &status["cluster"]["qos"];
        let moving = &status["cluster"]["data"]["moving_data"];
        let moving_part = |name: &str| moving[name].as_u64().unwrap_or(0);
        Some(Self {
            worst_storage_queue_bytes: qos["worst_queue_bytes_storage_server"].as_u64()?,
            worst_log_queue_bytes: qos["worst_queue_bytes_log_server"].as_u64()?,
            moving_bytes: moving_part("in_flight_bytes") + moving_part("in_queue_bytes"),
            ratekeeper_limited_by: qos["performance_limited_by"]["name"]
                .as_str()
                .filter(|name| *name != RATEKEEPER_UNLIMITED)
                .map(str::to_owned),
        })
    }

    /// Whether the cluster takes another batch without being throttled:
    /// its worst storage queue below [`FOUNDATIONDB_QUEUE_BYTES_PACE`] and
    /// ratekeeper limiting by nothing but the workload.
    pub fn keeps_pace(&self) -> bool {
        self.worst_storage_queue_bytes < FOUNDATIONDB_QUEUE_BYTES_PACE && self.ratekeeper_limited_by.is_none()
    }

    pub fn at_rest(&self) -> bool {
        self.worst_storage_queue_bytes < FOUNDATIONDB_QUEUE_BYTES_AT_REST
            && self.worst_log_queue_bytes < FOUNDATIONDB_QUEUE_BYTES_AT_REST
            && self.moving_bytes == 0
    }

    pub fn describe(&self) -> String {
        let limited_by = match &self.ratekeeper_limited_by {
            Some(reason) => format!(", ratekeeper limited by {reason}"),
            None => String::new(),
        };
        format!(
            "worst storage queue {} bytes, worst log queue {} bytes, {} bytes moving between servers{limited_by}",
            self.worst_storage_queue_bytes, self.worst_log_queue_bytes, self.moving_bytes
        )
    }
}

/// fjall's leveled compaction merges level 0 into level 1 from 4 tables on
/// (lsm-tree's `Strategy::default`, `l0_threshold`): fewer is a level 0 a
/// steady write rate leaves.
pub const EMBEDDED_LEVEL_ZERO_TABLES_AT_REST: usize = 4;

impl RestProbe {
    /// `None` when the store is at rest; otherwise what it still owes, for
    /// the progress line.
    pub async fn backlog(&self) -> Option<String> {
        match self {
            RestProbe::EmbeddedBacklog(engine) => {
                let backlog = engine.write_backlog();
                let at_rest = backlog.level_zero_tables < EMBEDDED_LEVEL_ZERO_TABLES_AT_REST
                    && backlog.sealed_memtables == 0
                    && backlog.compactions_running == 0;
                (!at_rest).then(|| {
                    format!(
                        "{} tables in level 0, {} memtables waiting for a flush, {} compactions running",
                        backlog.level_zero_tables, backlog.sealed_memtables, backlog.compactions_running
                    )
                })
            }
            #[cfg(feature = "foundationdb")]
            RestProbe::FoundationDbQueues(engine) => match foundationdb_backlog(engine).await {
                Ok(backlog) => (!backlog.at_rest()).then(|| backlog.describe()),
                Err(unread) => Some(unread),
            },
            RestProbe::WhenWritten => None,
        }
    }

    /// `None` when the store takes the next batch without throttling it;
    /// otherwise what it is behind on, for the progress line. Only
    /// FoundationDB is paced: fjall slows and halts its own writes while
    /// level 0 is long, and PostgreSQL and Redis write what they acknowledge.
    pub async fn behind(&self) -> Option<String> {
        match self {
            #[cfg(feature = "foundationdb")]
            RestProbe::FoundationDbQueues(engine) => match foundationdb_backlog(engine).await {
                Ok(backlog) => (!backlog.keeps_pace()).then(|| backlog.describe()),
                Err(unread) => Some(unread),
            },
            _ => None,
        }
    }
}

/// The cluster's backlog from its status document, or why it was not read.
#[cfg(feature = "foundationdb")]
async fn foundationdb_backlog(engine: &store_fdb::FoundationDbEngine) -> Result<FoundationDbBacklog, String> {
    let status = engine
        .status_json()
        .await
        .map_err(|error| format!("status unreadable: {error}"))?;
    match serde_json::from_slice(&status).map(|status| FoundationDbBacklog::from_status(&status)) {
        Ok(Some(backlog)) => Ok(backlog),
        Ok(None) => Err("no queue figures in the cluster's status yet".into()),
        Err(error) => Err(format!("status is not JSON: {error}")),
    }
}

/// How a backend's size is measured, before and after the load.
pub enum SizeProbe {
    /// The disk space of every file under the embedded store's directory
    /// (tables and journal).
    Directory(PathBuf),
    /// `pg_total_relation_size('idempotency_keys')`: the table, its TOAST
    /// and its two indexes.
    #[cfg(feature = "postgres")]
    Postgres(Arc<store_postgres::PostgresStore>),
    /// `used_memory` of `INFO memory`.
    #[cfg(feature = "redis")]
    Redis(String),
    /// Not measured, and why.
    Unmeasured(&'static str),
}

impl SizeProbe {
    /// What the figure is, for the report.
    pub fn method(&self) -> String {
        match self {
            SizeProbe::Directory(path) => format!("disk space of the files under {}", path.display()),
            #[cfg(feature = "postgres")]
            SizeProbe::Postgres(_) => "pg_total_relation_size('idempotency_keys'): table, TOAST and indexes".into(),
            #[cfg(feature = "redis")]
            SizeProbe::Redis(_) => "used_memory of INFO memory".into(),
            SizeProbe::Unmeasured(why) => format!("not measured: {why}"),
        }
    }

    /// The size now, in bytes; `None` when this backend is not measured.
    pub async fn bytes(&self) -> Result<Option<u64>, String> {
        match self {
            SizeProbe::Directory(path) => directory_bytes(path).map(Some).map_err(|error| error.to_string()),
            #[cfg(feature = "postgres")]
            SizeProbe::Postgres(store) => postgres_table_bytes(store).await.map(Some),
            #[cfg(feature = "redis")]
            SizeProbe::Redis(url) => redis_used_memory(url).await.map(Some),
            SizeProbe::Unmeasured(_) => Ok(None),
        }
    }
}

/// The disk space every regular file under `path` takes, recursively: its
/// allocated blocks, not its length, since fjall makes each journal a
/// sparse file of 64 MiB before writing to it.
pub fn directory_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += directory_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.blocks() * BLOCK_BYTES;
        }
    }
    Ok(total)
}

/// The unit of `st_blocks` (stat(2)), whatever the file system's block size.
const BLOCK_BYTES: u64 = 512;

#[cfg(feature = "postgres")]
async fn postgres_table_bytes(store: &store_postgres::PostgresStore) -> Result<u64, String> {
    let client = store.pool().get().await.map_err(|error| error.to_string())?;
    let row = client
        .query_one("SELECT pg_total_relation_size('idempotency_keys')", &[])
        .await
        .map_err(|error| error.to_string())?;
    let bytes: i64 = row.get(0);
    u64::try_from(bytes).map_err(|error| error.to_string())
}

#[cfg(feature = "redis")]
async fn redis_used_memory(url: &str) -> Result<u64, String> {
    let client = redis::Client::open(url).map_err(|error| error.to_string())?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|error| error.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut connection)
        .await
        .map_err(|error| error.to_string())?;
    used_memory(&info).ok_or_else(|| "INFO memory has no used_memory".to_owned())
}

/// `used_memory:N` of an `INFO memory` reply.
pub fn used_memory(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Opens the store `kind` names, with the same settings `idem-bench store`
/// takes.
pub async fn open(kind: StoreKind, args: &BackendArgs, policy: Policy) -> Result<PreloadTarget, TargetError> {
    match kind {
        StoreKind::Embedded => open_embedded(args, policy).await,
        StoreKind::Redis => open_redis(args, policy).await,
        StoreKind::Postgres => open_postgres(args, policy).await,
        StoreKind::Foundationdb => open_foundationdb(args, policy).await,
        other => Err(TargetError::unavailable(other.name(), "not a store preload fills")),
    }
}

async fn open_embedded(args: &BackendArgs, policy: Policy) -> Result<PreloadTarget, TargetError> {
    let mut config = match &args.embedded_dir {
        Some(dir) => EmbeddedConfig::new(dir),
        None => EmbeddedConfig::temporary(),
    };
    config.durability = args.embedded_durability.durability();
    let kept = if args.embedded_dir.is_some() {
        "kept"
    } else {
        "temporary: deleted at the end"
    };
    let notes = vec![
        format!("durability: {}", durability_name(config.durability)),
        format!("directory: {} ({kept})", config.path.display()),
    ];
    let store_config = StoreConfig {
        kind: StoreKind::Embedded,
        embedded: config.clone(),
        ..StoreConfig::default()
    };
    let OpenedStore::Embedded(store) = crate::store_mode::open_store(&store_config, policy).await? else {
        return Err(crate::store_mode::other_kind(StoreKind::Embedded));
    };
    Ok(PreloadTarget {
        backend: "embedded",
        notes,
        store: store.clone(),
        size: SizeProbe::Directory(config.path.clone()),
        rest: RestProbe::EmbeddedBacklog(store.engine().clone()),
        keep_alive: vec![Box::new(store)],
    })
}

#[cfg(feature = "redis")]
async fn open_redis(args: &BackendArgs, policy: Policy) -> Result<PreloadTarget, TargetError> {
    let address = crate::store_mode::redis::server_for(args)?;
    let store_config = StoreConfig {
        kind: StoreKind::Redis,
        redis: store_redis::RedisConfig::standalone(address.url.clone()),
        ..StoreConfig::default()
    };
    let OpenedStore::Redis(store) = crate::store_mode::open_store(&store_config, policy).await? else {
        return Err(crate::store_mode::other_kind(StoreKind::Redis));
    };
    let mut keep_alive: Vec<KeepAlive> = vec![Box::new(store.clone())];
    keep_alive.extend(address.guard);
    Ok(PreloadTarget {
        backend: "redis",
        notes: vec![format!("{}: {}", address.url, address.note)],
        store,
        size: SizeProbe::Redis(address.url),
        rest: RestProbe::WhenWritten,
        keep_alive,
    })
}

#[cfg(not(feature = "redis"))]
async fn open_redis(_: &BackendArgs, _: Policy) -> Result<PreloadTarget, TargetError> {
    Err(TargetError::NotBuilt("redis".into()))
}

#[cfg(feature = "postgres")]
async fn open_postgres(args: &BackendArgs, policy: Policy) -> Result<PreloadTarget, TargetError> {
    let address = crate::store_mode::postgres::database_for(args).await?;
    let store_config = StoreConfig {
        kind: StoreKind::Postgres,
        postgres: store_postgres::PostgresConfig::new(address.url.clone()),
        ..StoreConfig::default()
    };
    let OpenedStore::Postgres(store) = crate::store_mode::open_store(&store_config, policy).await? else {
        return Err(crate::store_mode::other_kind(StoreKind::Postgres));
    };
    store
        .migrate(&[])
        .await
        .map_err(|error| TargetError::unavailable("postgres", error))?;
    let mut keep_alive: Vec<KeepAlive> = vec![Box::new(store.clone())];
    keep_alive.extend(address.guard);
    Ok(PreloadTarget {
        backend: "postgres",
        notes: vec![address.note],
        store: store.clone(),
        size: SizeProbe::Postgres(store),
        rest: RestProbe::WhenWritten,
        keep_alive,
    })
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &BackendArgs, _: Policy) -> Result<PreloadTarget, TargetError> {
    Err(TargetError::NotBuilt("postgres".into()))
}

/// FoundationDB: the cluster `idem-bench store` would use, under the key
/// prefix it would choose. Its size is not measured: the cluster's
/// estimates (`status json`) lag behind writes by minutes and count every
/// prefix and replica.
#[cfg(feature = "foundationdb")]
async fn open_foundationdb(args: &BackendArgs, policy: Policy) -> Result<PreloadTarget, TargetError> {
    use crate::store_mode::foundationdb::{cluster_file, key_prefix};
    let (cluster_file, cluster_shown) = cluster_file(args);
    let prefix = key_prefix(args);
    let store_config = StoreConfig {
        kind: StoreKind::Foundationdb,
        foundationdb: store_fdb::FoundationDbConfig {
            cluster_file,
            prefix: store_fdb::KeyPrefix::Bytes(prefix.clone().into_bytes()),
            ..store_fdb::FoundationDbConfig::default()
        },
        ..StoreConfig::default()
    };
    let OpenedStore::Foundationdb(store) = crate::store_mode::open_store(&store_config, policy).await? else {
        return Err(crate::store_mode::other_kind(StoreKind::Foundationdb));
    };
    Ok(PreloadTarget {
        backend: "foundationdb",
        notes: vec![
            format!("cluster: {cluster_shown}"),
            format!("key prefix: {prefix:?} (left in place)"),
        ],
        store: store.clone(),
        size: SizeProbe::Unmeasured("FoundationDB's size estimates lag behind writes and cover the whole cluster"),
        rest: RestProbe::FoundationDbQueues(store.engine().clone()),
        keep_alive: vec![Box::new(store)],
    })
}

#[cfg(not(feature = "foundationdb"))]
async fn open_foundationdb(_: &BackendArgs, _: Policy) -> Result<PreloadTarget, TargetError> {
    Err(TargetError::NotBuilt("foundationdb".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cluster.qos` as `status json` prints it on an idle one-process
    /// cluster (7.3.79), with the other fields left out.
    fn status(storage_queue: u64, log_queue: u64, moving: Option<(u64, u64)>) -> serde_json::Value {
        let mut status = serde_json::json!({"cluster": {"qos": {
            "worst_queue_bytes_storage_server": storage_queue,
            "worst_queue_bytes_log_server": log_queue,
            "limiting_queue_bytes_storage_server": storage_queue,
            "performance_limited_by": {"name": "workload", "description": "The database is not being saturated by the workload."},
        }, "data": {}}});
        if let Some((in_flight, in_queue)) = moving {
            status["cluster"]["data"]["moving_data"] =
                serde_json::json!({"in_flight_bytes": in_flight, "in_queue_bytes": in_queue, "highest_priority": 0});
        }
        status
    }

    #[test]
    fn a_foundationdb_cluster_is_at_rest_with_short_queues_and_no_data_moving() {
        let idle = FoundationDbBacklog::from_status(&status(19_518, 10_086, None)).expect("queue figures");
        assert_eq!(idle.moving_bytes, 0);
        assert!(idle.at_rest(), "{}", idle.describe());
        let loaded = FoundationDbBacklog::from_status(&status(400_000_000, 10_086, Some((0, 0)))).unwrap();
        assert!(!loaded.at_rest());
        assert!(loaded.describe().contains("worst storage queue 400000000 bytes"));
        let logs_behind = FoundationDbBacklog::from_status(&status(0, FOUNDATIONDB_QUEUE_BYTES_AT_REST, None)).unwrap();
        assert!(!logs_behind.at_rest());
        let moving = FoundationDbBacklog::from_status(&status(0, 0, Some((1, 2)))).unwrap();
        assert_eq!(moving.moving_bytes, 3);
        assert!(!moving.at_rest());
    }

    #[test]
    fn a_preload_keeps_pace_while_the_storage_queue_is_short_and_ratekeeper_does_not_throttle() {
        let loading = FoundationDbBacklog::from_status(&status(FOUNDATIONDB_QUEUE_BYTES_PACE - 1, 90_000_000, None))
            .expect("queue figures");
        assert!(loading.keeps_pace(), "{}", loading.describe());
        assert!(!loading.at_rest(), "a queue that keeps pace is not yet at rest");
        let behind = FoundationDbBacklog::from_status(&status(FOUNDATIONDB_QUEUE_BYTES_PACE, 0, None)).unwrap();
        assert!(!behind.keeps_pace());
        let mut throttled = status(0, 0, None);
        throttled["cluster"]["qos"]["performance_limited_by"]["name"] = "storage_server_durability_lag".into();
        let throttled = FoundationDbBacklog::from_status(&throttled).unwrap();
        assert_eq!(
            throttled.ratekeeper_limited_by.as_deref(),
            Some("storage_server_durability_lag")
        );
        assert!(!throttled.keeps_pace());
        assert!(
            throttled
                .describe()
                .ends_with("ratekeeper limited by storage_server_durability_lag")
        );
    }

    #[test]
    fn a_status_without_queue_figures_is_no_backlog_reading() {
        let recovering = serde_json::json!({"cluster": {"recovery_state": {"name": "reading_coordinated_state"}}});
        assert_eq!(FoundationDbBacklog::from_status(&recovering), None);
    }

    #[test]
    fn used_memory_is_read_from_info() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\n";
        assert_eq!(used_memory(info), Some(1_048_576));
        assert_eq!(used_memory("# Memory\r\n"), None);
    }

    #[test]
    fn a_directory_counts_the_space_its_files_take_not_their_lengths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/written"), [7_u8; 100_000]).unwrap();
        let written = directory_bytes(dir.path()).unwrap();
        assert!(written >= 100_000, "{written}");
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(64 * 1024 * 1024).unwrap();
        let with_sparse = directory_bytes(dir.path()).unwrap();
        assert!(with_sparse < written + 1024 * 1024, "{with_sparse} after {written}");
    }
}
