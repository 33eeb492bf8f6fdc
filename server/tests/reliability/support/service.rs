//! The Label service in-process, assembled from the same public parts
//! `App::build` uses (stores, `LabelStore`, carrier client, `Idempotency`,
//! `server::router`), so a test can reach what a config cannot: the
//! embedded engine's fault switch, a policy the config would refuse (a lease
//! shorter than the carrier), and the stores themselves for auditing.

use super::audit::{LabelCensus, census_embedded, census_postgres, embedded_pairs, postgres_record_rows};
use super::backends::BackendSetup;
use super::{ALICE, ALICE_ID, BOB, BOB_ID};
use server::AppState;
use server::admission::AdmissionConfig;
use server::auth::Callers;
use server::auth::{CallerConfig, token_sha256};
#[cfg(feature = "foundationdb")]
use server::backend::OpenedStore;
use server::backend::StoreKind;
use server::backend::{self, OpenOptions};
use server::carrier::SimulatorConfig;
use server::carrier::{CarrierClient, CarrierServer};
use server::config::Config;
use server::idempotency;
use server::labels::LabelStore;
use server::limits::Limits;
use server::metrics::prometheus_handle;
use server::probes;
use server::readiness::{Checked, ReadinessCell};
use std::sync::Arc;
use std::time::Duration;
use store_core::{IdempotencyStore, Policy, SharedClock, SystemClock};
use store_fdb::{EmbeddedStore, FaultPlan};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the stores' readiness is checked (`/readyz` answers from it).
const READINESS_REFRESH_MS: u64 = 100;

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

pub struct Service {
    pub base: String,
    pub carrier_url: String,
    pub records: Arc<dyn IdempotencyStore>,
    pub labels: Arc<dyn LabelStore>,
    /// The embedded store (records with embedded, labels with redis).
    pub embedded: Option<Arc<EmbeddedStore>>,
    /// The record store itself, for the FoundationDB audits.
    #[cfg(feature = "foundationdb")]
    store: OpenedStore,
    /// The database, with PostgreSQL records.
    postgres_url: Option<String>,
    _carrier: CarrierServer,
    server: tokio::task::JoinHandle<()>,
}

impl Service {
    pub async fn start(setup: &BackendSetup, options: ServiceOptions) -> Self {
        let opened = open_stores(setup, &options).await;
        let (records, labels, embedded) = (opened.records, opened.labels, opened.embedded);
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
            readiness: ReadinessCell::new(Checked::Ready),
        };
        // Readiness as the served app keeps it: checked in the background,
        // often enough for the outage tests to see it go and come back.
        let readiness_refresh = Duration::from_millis(READINESS_REFRESH_MS);
        state.readiness.set(probes::check(&state, readiness_refresh).await);
        probes::spawn_refresh(state.clone(), readiness_refresh, CancellationToken::new());
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
            #[cfg(feature = "foundationdb")]
            store: opened.store,
            postgres_url: setup.postgres_url.clone(),
            _carrier: carrier,
            server,
        }
    }

    /// Every label the label store holds, by parcel.
    pub async fn census(&self) -> LabelCensus {
        if let Some(url) = &self.postgres_url {
            return census_postgres(url).await;
        }
        #[cfg(feature = "foundationdb")]
        if let OpenedStore::Foundationdb(store) = &self.store {
            return census_embedded(store.as_ref()).await;
        }
        census_embedded(self.embedded.as_ref().expect("labels in the embedded store")).await
    }

    /// What the carrier sold.
    pub async fn carrier_stats(&self, client: &reqwest::Client) -> server::carrier::CarrierStats {
        server::carrier::read_stats(client, &self.carrier_url)
            .await
            .expect("carrier stats")
    }

    /// Rows in the record store (records, tombstones, and with embedded
    /// every other key too): bad input must not change it.
    pub async fn record_store_rows(&self, setup: &BackendSetup) -> u64 {
        match setup.backend {
            StoreKind::Embedded => embedded_pairs(self.embedded.as_ref().expect("embedded")).await.len() as u64,
            StoreKind::Redis => {
                let redis = setup.redis.as_ref().expect("redis");
                redis.query::<u64>(&["DBSIZE"]).expect("DBSIZE")
            }
            StoreKind::Postgres => postgres_record_rows(setup.postgres_url.as_deref().expect("url")).await as u64,
            #[cfg(feature = "foundationdb")]
            StoreKind::Foundationdb => {
                let OpenedStore::Foundationdb(store) = &self.store else {
                    unreachable!("a FoundationDB setup opens FoundationDB")
                };
                let prefix = setup.foundationdb_prefix.as_deref().expect("prefix");
                super::audit::foundationdb_pairs(store, prefix.as_bytes()).await.len() as u64
            }
            other => panic!("the reliability tests do not run on {other}"),
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

/// The stores through the server's registry, on the setup's config, with
/// what a config cannot say: the embedded engine's fault plan, the test's
/// policy (which the config might refuse: a lease shorter than the
/// carrier's timeout) and its clock.
async fn open_stores(setup: &BackendSetup, options: &ServiceOptions) -> backend::Backends {
    let mut config = Config::load(None, setup.env()).expect("the setup's config");
    config.store.embedded.faults = options.faults;
    config.store.redis.response_timeout_ms = options.redis_response_timeout_ms;
    let open_options = OpenOptions {
        clock: options.clock.clone(),
        policy: Some(options.policy),
    };
    backend::open(&config.store, config.policy, &open_options)
        .await
        .expect("the stores open")
}
