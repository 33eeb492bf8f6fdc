//! The three backends as the tests run them: the embedded store in a
//! temporary directory, a real redis-server of the test's own (durable: AOF
//! with an fsync per write, so a restart on the same port keeps the records),
//! a fresh database on a real PostgreSQL server, and (with the server's
//! `foundationdb` feature) a key prefix of the test's own on the FoundationDB
//! cluster `FDB_CLUSTER_FILE` names, which scripts/test-foundationdb starts.

use server::backend::StoreKind;
use std::path::PathBuf;
use store_postgres::testkit::PostgresServer;
use store_redis::testkit::RedisServer;
use tempfile::TempDir;

/// Where one test's records and labels live.
pub struct BackendSetup {
    pub backend: StoreKind,
    pub data: TempDir,
    /// The test's own Redis, for `StoreKind::Redis`.
    pub redis: Option<RedisServer>,
    /// The test's database, for `StoreKind::Postgres`.
    pub postgres_url: Option<String>,
    /// The test's key prefix on the cluster, for `StoreKind::Foundationdb`.
    #[cfg(feature = "foundationdb")]
    pub foundationdb_prefix: Option<String>,
}

/// Redis with an append-only file fsynced on every write: a restart on the
/// same port finds every acknowledged record again.
pub fn durable_redis() -> RedisServer {
    RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"]).expect("start redis-server")
}

impl BackendSetup {
    /// Starts what the backend needs, on the shared PostgreSQL server for postgres.
    pub async fn start(backend: StoreKind) -> Self {
        let postgres_url = match backend {
            StoreKind::Postgres => Some(fresh_database(PostgresServer::shared()).await),
            _ => None,
        };
        Self {
            backend,
            data: data_directory(),
            redis: (backend == StoreKind::Redis).then(durable_redis),
            postgres_url,
            #[cfg(feature = "foundationdb")]
            foundationdb_prefix: (backend == StoreKind::Foundationdb)
                .then(|| format!("t{:016x}", rand::random::<u64>())),
        }
    }

    /// The embedded store's directory (records with embedded, labels with redis).
    pub fn embedded_path(&self) -> PathBuf {
        self.data.path().join("store")
    }

    /// `IDEM__STORE__*` settings for a server process or `Config::load`.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            pair("IDEM__STORE__KIND", self.backend.name()),
            pair("IDEM__STORE__EMBEDDED__PATH", self.embedded_path().display()),
            // A process crash (SIGKILL) loses nothing the OS has; fdatasync
            // per commit would only slow the tests down.
            pair("IDEM__STORE__EMBEDDED__DURABILITY", "buffer"),
        ];
        if let Some(redis) = &self.redis {
            env.push(pair("IDEM__STORE__REDIS__URLS", format!("[\"{}\"]", redis.url())));
        }
        if let Some(url) = &self.postgres_url {
            env.push(pair("IDEM__STORE__POSTGRES__URL", format!("\"{url}\"")));
        }
        #[cfg(feature = "foundationdb")]
        if let Some(prefix) = &self.foundationdb_prefix {
            env.push(pair(
                "IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE",
                format!("\"{}\"", foundationdb_cluster_file()),
            ));
            env.push(pair("IDEM__STORE__FOUNDATIONDB__KEY_PREFIX", format!("\"{prefix}\"")));
        }
        env
    }
}

/// The test's data directory; kept after the test (and its path printed)
/// when `IDEM_RELIABILITY_KEEP_DATA` is set, to look at what a failure left.
fn data_directory() -> TempDir {
    let mut directory = tempfile::tempdir().expect("temporary directory");
    if std::env::var_os("IDEM_RELIABILITY_KEEP_DATA").is_some() {
        directory.disable_cleanup(true);
        eprintln!("data directory kept: {}", directory.path().display());
    }
    directory
}

/// A new empty database on `server`.
pub async fn fresh_database(server: &PostgresServer) -> String {
    server.create_database().await.expect("create a test database").url
}

pub use test_support::process::pair;

/// The cluster file of the FoundationDB the tests run on: `FDB_CLUSTER_FILE`,
/// required, so a run without a cluster fails loudly instead of trying
/// FoundationDB's default cluster file.
#[cfg(feature = "foundationdb")]
pub fn foundationdb_cluster_file() -> String {
    std::env::var("FDB_CLUSTER_FILE").unwrap_or_else(|_| {
        panic!("FDB_CLUSTER_FILE is not set: run the FoundationDB tests through scripts/test-foundationdb")
    })
}

/// Opens the store a test's servers use on the cluster, from the test
/// process, through the store registry.
#[cfg(feature = "foundationdb")]
pub async fn open_foundationdb(
    setup: &BackendSetup,
    policy: store_core::Policy,
) -> std::sync::Arc<store_fdb::FoundationDbStore> {
    let config = server::config::Config::load(None, setup.env()).expect("the setup's config");
    let clock = store_core::SystemClock::shared();
    match store_registry::open_store(&config.store, policy, &clock).await {
        Ok(store_registry::OpenedStore::Foundationdb(store)) => store,
        Ok(_) => panic!("a FoundationDB setup opens FoundationDB"),
        Err(error) => panic!("open the FoundationDB store: {error}"),
    }
}
