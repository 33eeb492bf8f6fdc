//! The fleet a campaign runs: three `server` processes, each in a network
//! namespace of its own, one carrier simulator process, and the shared
//! store of the backend under test, all real processes this test starts.
//!
//! ```text
//!  namespace n0 ─┐                       ┌─ store address ── proxy ── PostgreSQL / Redis (127.0.0.1)
//!  namespace n1 ─┼─ veth ── bridge ──────┤                 └─ fdbserver × 3 (on the address itself)
//!  namespace n2 ─┘                       └─ carrier address ── proxy ── carrier simulator (127.0.0.1)
//! ```
//!
//! PostgreSQL and Redis listen on loopback (their test harnesses'), so a
//! [`FaultProxy`] on the stores' bridge address relays to them; FoundationDB
//! clients reach every process at the address it advertises, so its three
//! processes listen on the bridge address itself. The carrier has a proxy
//! too, which is how the campaign slows it down or loses its replies.

use crate::network::Network;
use std::net::SocketAddr;
use std::path::Path;
use store_postgres::testkit::{PostgresServer, ServerDurability};
use store_redis::testkit::RedisServer;
use test_support::callers::callers_env;
use test_support::fault_proxy::FaultProxy;
use test_support::process::{ProcessSpec, ServerProcess, pair};

/// Instances in the fleet.
pub const INSTANCES: usize = 3;
/// The port every instance listens on, inside its own namespace.
pub const INSTANCE_PORT: u16 = 8080;
/// A short lease, so a paused or killed instance's keys are taken over
/// within the campaign.
pub const LEASE_MS: u64 = 1_000;
/// Must stay under the lease.
pub const CARRIER_TIMEOUT_MS: u64 = 500;
/// The carrier simulator's latency range.
const CARRIER_LATENCY_MS: (u64, u64) = (20, 80);
/// Every create waits this long between the carrier's answer and its
/// commit (the `label.after_carrier` failpoint's stall, which sleeps
/// without blocking the runtime): a pause then lands in that window as
/// often as in the carrier call, and the window is where a late write
/// comes from. The whole create still ends well inside the lease.
pub const STALL_AFTER_CARRIER_MS: u64 = 400;
/// Share of purchases whose reply the simulator itself loses, always.
const CARRIER_LOST_REPLY_RATE: f64 = 0.02;
/// Each store call gives up after this long: a partition answers 503 in
/// seconds, not after the drivers' defaults.
const STORE_OPERATION_TIMEOUT_MS: u64 = 2_000;

/// Where the fleet keeps its records and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    RedisWithPostgresLabels,
    #[cfg(feature = "foundationdb")]
    Foundationdb,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::RedisWithPostgresLabels => "redis+postgres",
            #[cfg(feature = "foundationdb")]
            Backend::Foundationdb => "foundationdb",
        }
    }
}

/// Redis's append-only file fsync, for the Redis backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisFsync {
    EverySecond,
    Always,
}

impl RedisFsync {
    pub fn name(self) -> &'static str {
        match self {
            RedisFsync::EverySecond => "everysec",
            RedisFsync::Always => "always",
        }
    }
}

/// The shared stores, as started.
pub enum Stores {
    Postgres {
        server: PostgresServer,
        proxy: FaultProxy,
        /// The database, on loopback (for the label census).
        url: String,
    },
    Redis {
        redis: RedisServer,
        redis_proxy: FaultProxy,
        /// The labels' database server, kept running.
        _postgres: Box<PostgresServer>,
        postgres_proxy: FaultProxy,
        url: String,
    },
    #[cfg(feature = "foundationdb")]
    Foundationdb {
        cluster: crate::fdb::FdbCluster,
        prefix: String,
    },
}

/// One instance: its process while it runs, and where it answers.
pub struct Instance {
    pub process: Option<ServerProcess>,
    pub url: String,
}

/// The running fleet. Fields drop in order: instances, carrier, stores,
/// then the network they used.
pub struct Cluster {
    pub instances: Vec<Instance>,
    pub carrier: ServerProcess,
    pub carrier_proxy: FaultProxy,
    pub stores: Stores,
    /// `IDEM__*` of every instance.
    env: Vec<(String, String)>,
    pub dir: tempfile::TempDir,
    pub network: Network,
}

impl Cluster {
    pub async fn start(backend: Backend, redis_fsync: RedisFsync) -> Self {
        let network = Network::create(INSTANCES);
        let dir = tempfile::tempdir().expect("temporary directory");
        let stores = start_stores(backend, redis_fsync, &network, dir.path()).await;
        let carrier = start_carrier(dir.path()).await;
        let carrier_upstream: SocketAddr = carrier.url.trim_start_matches("http://").parse().expect("host:port");
        let carrier_proxy = FaultProxy::start(SocketAddr::new(network.carrier_address().into(), 0), carrier_upstream)
            .await
            .expect("the carrier's proxy");
        let mut env = store_env(&stores);
        env.extend([
            pair("IDEM__SERVER__LISTEN", format!("0.0.0.0:{INSTANCE_PORT}")),
            pair("IDEM__CALLERS", callers_env()),
            pair("IDEM__POLICY__LEASE_MS", LEASE_MS),
            pair("IDEM__CARRIER__TIMEOUT_MS", CARRIER_TIMEOUT_MS),
            pair("IDEM__CARRIER__URL", format!("http://{}", carrier_proxy.local_addr())),
            // A restart for the clock skew is a clean shutdown: no load
            // balancer to tell, so no delay before the listener closes.
            pair("IDEM__SERVER__SHUTDOWN_READINESS_DELAY_MS", 0),
        ]);
        let mut cluster = Self {
            instances: Vec::new(),
            carrier,
            carrier_proxy,
            stores,
            env,
            dir,
            network,
        };
        for index in 0..INSTANCES {
            let process = cluster.start_instance(index, None).await;
            let url = format!("http://{}:{INSTANCE_PORT}", cluster.network.instance_address(index));
            cluster.instances.push(Instance {
                process: Some(process),
                url,
            });
        }
        cluster
    }

    /// The instances' URLs, which stay the same across restarts.
    pub fn urls(&self) -> Vec<String> {
        self.instances.iter().map(|instance| instance.url.clone()).collect()
    }

    /// The carrier simulator, directly (for its sale book).
    pub fn carrier_url(&self) -> &str {
        &self.carrier.url
    }

    /// Starts instance `index` in its namespace, its clock moved by
    /// `clock_offset_ms` when given.
    pub async fn start_instance(&self, index: usize, clock_offset_ms: Option<i64>) -> ServerProcess {
        let namespace = self.network.namespace(index);
        let args = ["netns", "exec", namespace.as_str(), env!("CARGO_BIN_EXE_server")];
        let mut spec = ProcessSpec::new("ip", &args, self.dir.path())
            .env([("IDEM__LOG__LEVEL", "warn,server=info")])
            .env(self.env.iter().cloned());
        spec.env_removed
            .push(server::failpoints::CLOCK_OFFSET_VARIABLE.to_owned());
        let stall = format!("{}=return({STALL_AFTER_CARRIER_MS})", server::failpoints::AFTER_CARRIER);
        spec = spec.env([(server::failpoints::FAILPOINTS_VARIABLE, stall)]);
        if let Some(offset) = clock_offset_ms {
            spec = spec.env([(server::failpoints::CLOCK_OFFSET_VARIABLE, offset)]);
        }
        ServerProcess::start(spec)
            .await
            .unwrap_or_else(|error| panic!("instance {index} in {namespace}: {error}"))
    }

    /// The process id of instance `index`, while it runs.
    pub fn pid(&self, index: usize) -> u32 {
        self.instances[index]
            .process
            .as_ref()
            .and_then(ServerProcess::pid)
            .expect("the instance runs")
    }
}

/// `kill -SIGNAL pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

async fn start_carrier(dir: &Path) -> ServerProcess {
    let spec = ProcessSpec::new(
        env!("CARGO_BIN_EXE_server"),
        &["carrier", "--listen", "127.0.0.1:0"],
        dir,
    )
    .env([("IDEM__LOG__LEVEL", "warn,server=info")])
    .env([
        pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MIN", CARRIER_LATENCY_MS.0),
        pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MAX", CARRIER_LATENCY_MS.1),
        pair("IDEM__CARRIER__SIMULATOR__LOST_REPLY_RATE", CARRIER_LOST_REPLY_RATE),
    ]);
    ServerProcess::start(spec)
        .await
        .unwrap_or_else(|error| panic!("the carrier simulator: {error}"))
}

/// A durable PostgreSQL (fsync and synchronous commit on: an immediate
/// shutdown must keep what it acknowledged) with a fresh database, and its proxy
/// on the stores' address.
async fn start_postgres(network: &Network) -> (PostgresServer, FaultProxy, String) {
    let server = PostgresServer::start_with(ServerDurability::Durable).expect("start PostgreSQL");
    let database = server.create_database().await.expect("a database");
    let upstream = SocketAddr::from(([127, 0, 0, 1], server.port()));
    let proxy = FaultProxy::start(SocketAddr::new(network.store_address().into(), 0), upstream)
        .await
        .expect("PostgreSQL's proxy");
    (server, proxy, database.url)
}

async fn start_stores(backend: Backend, redis_fsync: RedisFsync, network: &Network, _dir: &Path) -> Stores {
    match backend {
        Backend::Postgres => {
            let (server, proxy, url) = start_postgres(network).await;
            Stores::Postgres { server, proxy, url }
        }
        Backend::RedisWithPostgresLabels => {
            let (postgres, postgres_proxy, url) = start_postgres(network).await;
            let redis = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", redis_fsync.name()])
                .expect("start redis-server");
            let upstream = SocketAddr::from(([127, 0, 0, 1], redis.port()));
            let redis_proxy = FaultProxy::start(SocketAddr::new(network.store_address().into(), 0), upstream)
                .await
                .expect("Redis's proxy");
            Stores::Redis {
                redis,
                redis_proxy,
                _postgres: Box::new(postgres),
                postgres_proxy,
                url,
            }
        }
        #[cfg(feature = "foundationdb")]
        Backend::Foundationdb => Stores::Foundationdb {
            cluster: crate::fdb::FdbCluster::start(network.store_address(), _dir).await,
            prefix: format!("t{:016x}", rand::random::<u64>()),
        },
    }
}

/// The database URL as the instances reach it (through the proxy).
fn proxied_postgres_url(proxy: &FaultProxy, url: &str) -> String {
    let database = url.rsplit('/').next().expect("a database name");
    format!("postgres://postgres@{}/{database}", proxy.local_addr())
}

fn store_env(stores: &Stores) -> Vec<(String, String)> {
    let postgres = |proxy: &FaultProxy, url: &str| {
        vec![
            pair(
                "IDEM__STORE__POSTGRES__URL",
                format!("\"{}\"", proxied_postgres_url(proxy, url)),
            ),
            pair(
                "IDEM__STORE__POSTGRES__OPERATION_TIMEOUT_MS",
                STORE_OPERATION_TIMEOUT_MS,
            ),
        ]
    };
    match stores {
        Stores::Postgres { proxy, url, .. } => {
            let mut env = postgres(proxy, url);
            env.push(pair("IDEM__STORE__KIND", "postgres"));
            env
        }
        Stores::Redis {
            redis_proxy,
            postgres_proxy,
            url,
            ..
        } => {
            let mut env = postgres(postgres_proxy, url);
            env.extend([
                pair("IDEM__STORE__KIND", "redis"),
                pair("IDEM__STORE__LABELS", "postgres"),
                pair(
                    "IDEM__STORE__REDIS__URLS",
                    format!("[\"redis://{}\"]", redis_proxy.local_addr()),
                ),
            ]);
            env
        }
        #[cfg(feature = "foundationdb")]
        Stores::Foundationdb { cluster, prefix } => vec![
            pair("IDEM__STORE__KIND", "foundationdb"),
            pair(
                "IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE",
                format!("\"{}\"", cluster.cluster_file().display()),
            ),
            pair("IDEM__STORE__FOUNDATIONDB__KEY_PREFIX", format!("\"{prefix}\"")),
        ],
    }
}

impl Stores {
    /// Every label row of the label store, as (caller, order, parcel, version, label id).
    pub async fn label_rows(&self) -> Vec<crate::history::LabelRow> {
        match self {
            Stores::Postgres { url, .. } | Stores::Redis { url, .. } => crate::history::postgres_label_rows(url).await,
            #[cfg(feature = "foundationdb")]
            Stores::Foundationdb { cluster, prefix } => crate::fdb::label_rows(cluster, prefix).await,
        }
    }
}
