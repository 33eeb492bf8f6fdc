//! The harness: a real server on an ephemeral loopback port, on the backend
//! a test names, with the in-process carrier simulator (or a given carrier);
//! an HTTP client whose every reply is checked against the OpenAPI document.

use serde_json::Value;
use server::backend::StoreKind;
use server::carrier::{CARRIER_SCRIPT_PATH, CarrierStats, ScriptStep, SimulatedFault, read_stats};
use server::config::Config;
use server::{App, RunningServer};
use std::sync::{Arc, OnceLock};
use store_core::{SharedClock, SystemClock};
use tempfile::TempDir;
use tokio::net::TcpListener;

pub use test_support::callers::{ALICE, BOB, callers_env, fresh_key, label_body, unique_order_id as order_id};
pub use test_support::http::{Reply, client, client_trusting, metric_value};

/// Settings a test may change; everything else is the default config.
#[derive(Debug, Clone)]
pub struct Options {
    pub lease_ms: u64,
    pub carrier_timeout_ms: u64,
    pub carrier_url: Option<String>,
    pub request_timeout_ms: u64,
    pub in_flight_max: usize,
    pub shutdown_grace_ms: u64,
    /// 0 in tests unless a test says, so that stopping a server is quick.
    pub shutdown_readiness_delay_ms: u64,
    pub extra_env: Vec<(String, String)>,
    /// The CA the test client trusts, for a server with `[server.tls]`.
    pub client_ca_file: Option<std::path::PathBuf>,
    /// The clock the stores and the idempotency layer read
    /// (`App::build_with_clock`); the system's when `None`.
    pub clock: Option<SharedClock>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lease_ms: 30_000,
            carrier_timeout_ms: 5_000,
            carrier_url: None,
            request_timeout_ms: 25_000,
            in_flight_max: 64,
            shutdown_grace_ms: 5_000,
            shutdown_readiness_delay_ms: 0,
            extra_env: Vec::new(),
            client_ca_file: None,
            clock: None,
        }
    }
}

/// Keeps a backend's server alive for as long as a test uses it.
#[allow(dead_code)]
enum BackendGuard {
    None,
    Redis(Arc<store_redis::testkit::RedisServer>),
}

pub struct TestServer {
    pub base: String,
    pub carrier: String,
    running: Option<RunningServer>,
    client: reqwest::Client,
    _data: TempDir,
    _guard: BackendGuard,
}

pub use test_support::process::pair;

/// A fresh database on the shared PostgreSQL server, its URL as a TOML string.
pub async fn fresh_postgres_url() -> String {
    let postgres = store_postgres::testkit::PostgresServer::shared();
    let database = postgres.create_database().await.expect("create a test database");
    format!("\"{}\"", database.url)
}

async fn backend_env(backend: StoreKind, data: &TempDir) -> (Vec<(String, String)>, BackendGuard) {
    let mut env = vec![
        pair("IDEM__STORE__EMBEDDED__PATH", data.path().join("store").display()),
        pair("IDEM__STORE__EMBEDDED__DURABILITY", "buffer"),
    ];
    let guard = match backend {
        StoreKind::Embedded => BackendGuard::None,
        // The reference store, through the registry like any backend; its
        // labels live in the embedded store beside it.
        StoreKind::Memory => {
            env.push(pair("IDEM__STORE__KIND", "memory"));
            BackendGuard::None
        }
        StoreKind::Redis => {
            let server = store_redis::testkit::shared_server().expect("start redis-server");
            env.push(pair("IDEM__STORE__KIND", "redis"));
            env.push(pair("IDEM__STORE__REDIS__URLS", format!("[\"{}\"]", server.url())));
            // Tests share one Redis; a prefix of their own keeps them apart.
            env.push(pair(
                "IDEM__STORE__REDIS__KEY_PREFIX",
                format!("\"t{:016x}:\"", rand::random::<u64>()),
            ));
            BackendGuard::Redis(server)
        }
        StoreKind::Postgres => {
            env.push(pair("IDEM__STORE__KIND", "postgres"));
            env.push(pair("IDEM__STORE__POSTGRES__URL", fresh_postgres_url().await));
            BackendGuard::None
        }
        #[cfg(feature = "foundationdb")]
        StoreKind::Foundationdb => {
            env.push(pair("IDEM__STORE__KIND", "foundationdb"));
            env.push(pair(
                "IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE",
                format!("\"{}\"", foundationdb_cluster_file()),
            ));
            // Tests share one cluster; a key prefix of their own keeps them apart.
            env.push(pair(
                "IDEM__STORE__FOUNDATIONDB__KEY_PREFIX",
                format!("\"t{:016x}\"", rand::random::<u64>()),
            ));
            BackendGuard::None
        }
        #[cfg(not(feature = "foundationdb"))]
        StoreKind::Foundationdb => panic!("the FoundationDB tests need the server's foundationdb feature"),
    };
    (env, guard)
}

/// The cluster file of the FoundationDB the tests run on: `FDB_CLUSTER_FILE`,
/// required, so a run without a cluster fails loudly instead of trying
/// FoundationDB's default cluster file.
#[cfg(feature = "foundationdb")]
pub fn foundationdb_cluster_file() -> String {
    std::env::var("FDB_CLUSTER_FILE").unwrap_or_else(|_| {
        panic!("FDB_CLUSTER_FILE is not set: run the FoundationDB tests through scripts/test-foundationdb")
    })
}

impl TestServer {
    pub async fn start(backend: StoreKind) -> Self {
        Self::start_with(backend, Options::default()).await
    }

    pub async fn start_with(backend: StoreKind, options: Options) -> Self {
        let data = tempfile::tempdir().expect("temporary directory");
        let (mut env, guard) = backend_env(backend, &data).await;
        env.extend([
            pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
            pair("IDEM__SERVER__REQUEST_TIMEOUT_MS", options.request_timeout_ms),
            pair("IDEM__SERVER__IN_FLIGHT_MAX", options.in_flight_max),
            pair("IDEM__SERVER__SHUTDOWN_GRACE_MS", options.shutdown_grace_ms),
            pair(
                "IDEM__SERVER__SHUTDOWN_READINESS_DELAY_MS",
                options.shutdown_readiness_delay_ms,
            ),
            pair("IDEM__CALLERS", callers_env()),
            pair("IDEM__POLICY__LEASE_MS", options.lease_ms),
            pair("IDEM__CARRIER__TIMEOUT_MS", options.carrier_timeout_ms),
            pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MIN", 0),
            pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MAX", 0),
        ]);
        if let Some(url) = &options.carrier_url {
            env.push(pair("IDEM__CARRIER__URL", url));
        }
        env.extend(options.extra_env.iter().cloned());
        let config = Config::load(None, env).expect("test config");
        let clock = options.clock.clone().unwrap_or_else(SystemClock::shared);
        let app = App::build_with_clock(config, clock).await.expect("app starts");
        let carrier = options
            .carrier_url
            .clone()
            .or_else(|| app.carrier_simulator_url())
            .expect("a carrier");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let running = app.start(listener).expect("serve");
        Self {
            base: running.base_url(),
            carrier,
            running: Some(running),
            client: match &options.client_ca_file {
                Some(ca_file) => client_trusting(ca_file),
                None => client(),
            },
            _data: data,
            _guard: guard,
        }
    }

    /// `POST /v1/labels` with an optional token and key.
    pub async fn post_label(&self, token: Option<&str>, key: Option<&str>, body: &str) -> Reply {
        self.post_label_with_headers(token, key, body, &[]).await
    }

    /// `POST /v1/labels` with an optional token and key, and more headers.
    pub async fn post_label_with_headers(
        &self,
        token: Option<&str>,
        key: Option<&str>,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = self
            .client
            .post(format!("{}/v1/labels", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        read_documented("POST", "/v1/labels", request.send().await.expect("server answers")).await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let pattern = if path.starts_with("/v1/labels/") {
            "/v1/labels/{label_id}"
        } else {
            path
        };
        read_documented("GET", pattern, request.send().await.expect("server answers")).await
    }

    pub async fn carrier_stats(&self) -> CarrierStats {
        read_stats(&self.client, &self.carrier).await.expect("carrier stats")
    }

    /// Makes the carrier's next call answer after `delay_ms`, normally.
    pub async fn delay_next_carrier_call(&self, delay_ms: u64) {
        let step = ScriptStep {
            delay_ms,
            fault: SimulatedFault::None,
        };
        self.carrier_script(&[step]).await;
    }

    /// Queues the carrier's behaviour for its next calls.
    pub async fn carrier_script(&self, steps: &[ScriptStep]) {
        let url = format!("{}{CARRIER_SCRIPT_PATH}", self.carrier);
        let body = serde_json::json!({ "steps": steps });
        let response = self.client.post(url).json(&body).send().await.expect("carrier answers");
        assert_eq!(response.status(), 204);
    }

    pub async fn metrics_text(&self) -> String {
        self.get("/metrics", None).await.text()
    }

    pub fn begin_shutdown(&self) {
        if let Some(running) = &self.running {
            running.begin_shutdown();
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await.expect("clean shutdown");
        }
    }
}

/// One answer, read whole and checked against the OpenAPI document.
pub async fn read_documented(method: &str, pattern: &str, response: reqwest::Response) -> Reply {
    let reply = Reply::read(response).await;
    assert_documented(method, pattern, &reply);
    reply
}

/// The API document, as the server serves it.
pub fn openapi() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| serde_json::to_value(server::openapi::document()).expect("document"))
}

/// Every status and content type a test sees must be documented for its route.
pub fn assert_documented(method: &str, pattern: &str, reply: &Reply) {
    let operation = &openapi()["paths"][pattern][method.to_ascii_lowercase()];
    assert!(
        operation.is_object(),
        "{method} {pattern} is not in the OpenAPI document"
    );
    let response = &operation["responses"][reply.status.to_string()];
    assert!(
        response.is_object(),
        "{method} {pattern} answered {} which is not documented",
        reply.status
    );
    let content_type = reply
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if reply.body.is_empty() {
        return;
    }
    let documented = response["content"]
        .as_object()
        .map(|content| content.contains_key(content_type));
    assert_eq!(
        documented,
        Some(true),
        "{method} {pattern} {} answered {content_type:?}, documented: {}",
        reply.status,
        response["content"]
    );
}

/// Purchases the carrier made for one parcel.
pub fn purchases_for(stats: &CarrierStats, order_id: u64) -> u64 {
    stats
        .purchases_by_parcel
        .iter()
        .filter(|parcel| parcel.order_id == order_id)
        .map(|parcel| parcel.purchases)
        .sum()
}
