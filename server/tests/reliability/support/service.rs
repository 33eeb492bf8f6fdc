//! The Label service in-process, assembled from the same public parts
//! `App::build` uses (stores, `LabelStore`, carrier client, `Idempotency`,
//! `server::router`), so a test can reach what a config cannot: the
//! embedded engine's fault switch, a policy the config would refuse (a lease
//! shorter than the carrier), and the stores themselves for auditing.

use super::audit::{LabelCensus, census_embedded, census_postgres, embedded_pairs, postgres_record_rows};
use super::backends::{Backend, BackendSetup};
use super::{ALICE, ALICE_ID, BOB, BOB_ID};
use server::AppState;
use server::admission::AdmissionConfig;
use server::auth::Callers;
use server::carrier::{CarrierClient, CarrierServer};
use server::config::{CallerConfig, SimulatorConfig, token_sha256};
use server::idempotency;
use server::instrumented::InstrumentedStore;
use server::labels::{FdbLabels, LABELS_MIGRATION, LabelStore, PostgresLabels, SplitLabels};
use server::limits::Limits;
use server::metrics::prometheus_handle;
use std::sync::Arc;
use std::time::Duration;
use store_core::{IdempotencyStore, Policy, SharedClock, SystemClock};
use store_fdb::{Durability, EmbeddedConfig, EmbeddedStore, FaultPlan};
use store_postgres::{PostgresConfig, PostgresStore};
use store_redis::{RedisConfig, RedisStore};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

/// What a test may set; the rest is the server's defaults.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    pub policy: Policy,
    pub faults: FaultPlan,
    pub carrier_timeout_ms: u64,
    pub simulator: SimulatorConfig,
    pub in_flight_max: usize,
    pub request_timeout_ms: u64,
    pub redis_response_timeout_ms: u64,
    pub admission: AdmissionConfig,
    /// The clock the embedded store and the idempotency layer read; Redis
    /// and PostgreSQL records ignore it (their servers' clocks decide).
    pub clock: SharedClock,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            faults: FaultPlan::default(),
            carrier_timeout_ms: 5_000,
            simulator: SimulatorConfig {
                latency_ms_min: 0,
                latency_ms_max: 0,
                ..SimulatorConfig::default()
            },
            in_flight_max: 4_096,
            request_timeout_ms: 25_000,
            redis_response_timeout_ms: 2_000,
            admission: AdmissionConfig::default(),
            clock: SystemClock::shared(),
        }
    }
}

/// How to look at the stores afterwards.
enum Audit {
    Embedded(Arc<EmbeddedStore>),
    Postgres(String),
    #[cfg(feature = "foundationdb")]
    Foundationdb(Arc<store_fdb::FoundationDbStore>),
}

pub struct Service {
    pub base: String,
    pub carrier_url: String,
    pub records: Arc<dyn IdempotencyStore>,
    pub labels: Arc<dyn LabelStore>,
    /// The embedded store (records with embedded, labels with redis).
    pub embedded: Option<Arc<EmbeddedStore>>,
    audit: Audit,
    _carrier: CarrierServer,
    server: tokio::task::JoinHandle<()>,
}

impl Service {
    pub async fn start(setup: &BackendSetup, options: ServiceOptions) -> Self {
        let (records, labels, embedded, audit) = open_stores(setup, &options).await;
        let carrier = CarrierServer::start(&options.simulator, listener().await)
            .await
            .expect("carrier simulator");
        let client = CarrierClient::new(
            &carrier.base_url(),
            Duration::from_millis(options.carrier_timeout_ms),
            Vec::new(),
        )
        .expect("carrier client");
        let state = AppState {
            idempotency: idempotency::configure(
                records.clone(),
                TaskTracker::new(),
                1,
                idem_http::WAIT_CAP_S_DEFAULT,
                options.clock.clone(),
            ),
            labels: labels.clone(),
            carrier: Arc::new(client),
            metrics: prometheus_handle().expect("metrics recorder"),
            carrier_retry_after_s: 1,
            store_kind: setup.backend.name(),
            embedded: embedded.as_ref().map(|store| store.engine().clone()),
            shutting_down: tokio_util::sync::CancellationToken::new(),
            policy: options.policy,
        };
        let callers = Callers::from_config(&[caller(ALICE_ID, ALICE), caller(BOB_ID, BOB)]).expect("callers");
        let limits = Limits::new(
            options.in_flight_max,
            Duration::from_millis(options.request_timeout_ms),
            1,
            &options.admission,
        );
        let router = server::router(state, callers, limits);
        let listener = listener().await;
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            base,
            carrier_url: carrier.base_url(),
            records,
            labels,
            embedded,
            audit,
            _carrier: carrier,
            server,
        }
    }

    /// Every label the label store holds, by parcel.
    pub async fn census(&self) -> LabelCensus {
        match &self.audit {
            Audit::Embedded(store) => census_embedded(store).await,
            Audit::Postgres(url) => census_postgres(url).await,
            #[cfg(feature = "foundationdb")]
            Audit::Foundationdb(store) => census_embedded(store.as_ref()).await,
        }
    }

    /// What the carrier sold.
    pub async fn carrier_stats(&self, client: &reqwest::Client) -> server::carrier::CarrierStats {
        let url = format!("{}{}", self.carrier_url, server::carrier::CARRIER_STATS_PATH);
        client
            .get(url)
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("stats JSON")
    }

    /// Rows in the record store (records, tombstones, and with embedded
    /// every other key too): bad input must not change it.
    pub async fn record_store_rows(&self, setup: &BackendSetup) -> u64 {
        match setup.backend {
            Backend::Embedded => embedded_pairs(self.embedded.as_ref().expect("embedded")).await.len() as u64,
            Backend::Redis => {
                let redis = setup.redis.as_ref().expect("redis");
                redis.query::<u64>(&["DBSIZE"]).expect("DBSIZE")
            }
            Backend::Postgres => postgres_record_rows(setup.postgres_url.as_deref().expect("url")).await as u64,
            #[cfg(feature = "foundationdb")]
            Backend::Foundationdb => {
                let Audit::Foundationdb(store) = &self.audit else {
                    unreachable!("a FoundationDB setup audits FoundationDB")
                };
                let prefix = setup.foundationdb_prefix.as_deref().expect("prefix");
                super::audit::foundationdb_pairs(store, prefix.as_bytes()).await.len() as u64
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn caller(id: &str, token: &str) -> CallerConfig {
    CallerConfig::new(id, token_sha256(token))
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port")
}

type Stores = (
    Arc<dyn IdempotencyStore>,
    Arc<dyn LabelStore>,
    Option<Arc<EmbeddedStore>>,
    Audit,
);

async fn open_stores(setup: &BackendSetup, options: &ServiceOptions) -> Stores {
    let embedded_config = EmbeddedConfig {
        durability: Durability::Buffer,
        faults: options.faults,
        ..EmbeddedConfig::new(setup.embedded_path())
    };
    match setup.backend {
        Backend::Embedded => {
            let store = Arc::new(
                EmbeddedStore::open_embedded_with_clock(&embedded_config, options.policy, options.clock.clone())
                    .expect("embedded"),
            );
            let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(store.clone()));
            let labels = Arc::new(FdbLabels::new(store.clone()));
            (records, labels, Some(store.clone()), Audit::Embedded(store))
        }
        Backend::Redis => {
            let redis = setup.redis.as_ref().expect("the setup's redis");
            let config = RedisConfig {
                response_timeout_ms: options.redis_response_timeout_ms,
                ..RedisConfig::standalone(redis.url())
            };
            let redis_store = RedisStore::connect(config, options.policy).await.expect("redis store");
            let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(Arc::new(redis_store)));
            let store = Arc::new(
                EmbeddedStore::open_embedded_with_clock(&embedded_config, options.policy, options.clock.clone())
                    .expect("embedded"),
            );
            let labels = Arc::new(SplitLabels::new(records.clone(), FdbLabels::new(store.clone())));
            (records, labels, Some(store.clone()), Audit::Embedded(store))
        }
        Backend::Postgres => {
            let url = setup.postgres_url.clone().expect("the setup's database");
            let store = PostgresStore::new(&PostgresConfig::new(url.clone()), options.policy).expect("postgres store");
            store.migrate(&[LABELS_MIGRATION]).await.expect("migrations");
            let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(Arc::new(store.clone())));
            let labels = Arc::new(PostgresLabels::new(store));
            (records, labels, None, Audit::Postgres(url))
        }
        #[cfg(feature = "foundationdb")]
        Backend::Foundationdb => {
            let store = super::backends::open_foundationdb(setup, options.policy).await;
            let store = Arc::new(store.with_clock(options.clock.clone()));
            let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(store.clone()));
            let labels = Arc::new(FdbLabels::new(store.clone()));
            (records, labels, None, Audit::Foundationdb(store))
        }
    }
}
