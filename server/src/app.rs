//! The application: state, the router, and a server that starts on a given
//! listener and shuts down gracefully.
//!
//! [`router`] builds the axum `Router` from its parts, so tests can serve
//! it on `127.0.0.1:0`; [`App::build`] opens everything a config names
//! ([`App::build_with_clock`]: on a clock a test moves), and
//! [`App::serve`] / [`App::start`] run it.

use crate::admission::admit;
use crate::auth::{Callers, require_caller};
use crate::auth::{DEMO_CALLER_ID, DEMO_TOKEN};
use crate::backend::{self, BackendError, Backends, OpenOptions};
use crate::body_read::{BodyRead, read_body_first};
use crate::carrier::{CarrierClient, CarrierServer};
use crate::config::{Config, ConfigError};
use crate::connections::{ConnectionLimits, serve_connections};
use crate::error::ApiError;
use crate::idempotency::{self, IdempotencyLayer};
use crate::labels::BODY_BYTES_MAX;
use crate::labels::handlers::{create_label, get_label};
use crate::limits::{Limits, request_timeout, shed_overload};
use crate::media_type::require_json;
use crate::metrics::{LabelSets, WatchedAnswer, export_limits, prometheus_handle, register_at_zero};
use crate::observe::observe;
use crate::probes::{self, healthz, method_not_allowed, metrics, not_found, openapi_json, readyz};
use crate::readiness::{Checked, ReadinessCell};
use crate::request_context::request_context;
use crate::state::AppState;
use crate::sweeper;
use crate::tls::{InboundTls, TlsFileError, carrier_roots, inbound_tls};
use axum::Router;
use axum::handler::Handler;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use store_core::{SharedClock, StoreError, SystemClock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;

/// The label route: `POST` creates a label under an idempotency key.
pub const LABELS_ROUTE: &str = "/v1/labels";
/// One label: `GET`.
pub const LABEL_ROUTE: &str = "/v1/labels/{label_id}";
pub const HEALTHZ_ROUTE: &str = "/healthz";
pub const READYZ_ROUTE: &str = "/readyz";
pub const METRICS_ROUTE: &str = "/metrics";
pub const OPENAPI_ROUTE: &str = "/openapi.json";
/// Every route the router serves with its method: the `route` and `method`
/// label pairs of the request metrics, registered at zero at startup.
pub const ROUTES: [(&str, &str); 6] = [
    (LABELS_ROUTE, "POST"),
    (LABEL_ROUTE, "GET"),
    (HEALTHZ_ROUTE, "GET"),
    (READYZ_ROUTE, "GET"),
    (METRICS_ROUTE, "GET"),
    (OPENAPI_ROUTE, "GET"),
];

/// The whole HTTP API. The `/v1` routes sit behind the cap on requests in
/// flight, the request budget and authentication;
/// `POST /v1/labels` also refuses bodies not declared JSON, then wears the
/// idempotency layer. Probes, metrics and the document are open.
pub fn router(state: AppState, callers: Callers, limits: Limits) -> Router {
    let idempotent = IdempotencyLayer::new(state.idempotency.clone(), BODY_BYTES_MAX);
    let body_read = BodyRead {
        timeout: limits.body_read_timeout(),
        bytes_max: BODY_BYTES_MAX,
    };
    let api = Router::new()
        .route(
            LABELS_ROUTE,
            post(create_label.layer(ServiceBuilder::new().layer(from_fn(require_json)).layer(idempotent))),
        )
        .route(LABEL_ROUTE, get(get_label))
        // Before the layers: it must reach the routes' own method routers.
        .method_not_allowed_fallback(method_not_allowed)
        // Outermost first. One stack, not one `Router::layer` each: every
        // `from_fn` clones the service inside it on each request, and
        // `Router::layer` boxes each layer around the last, so a chain of
        // them cloned (allocated) every inner box again, per layer, per
        // request (BENCHMARKS.md, "Per-request counts").
        .layer(
            ServiceBuilder::new()
                .layer(from_fn_with_state(limits.clone(), shed_overload))
                .layer(from_fn_with_state(limits.clone(), request_timeout))
                .layer(from_fn_with_state(callers, require_caller))
                // Before admission: a slow body holds no worker (body_read.rs).
                .layer(from_fn_with_state(body_read, read_body_first))
                .layer(from_fn_with_state(limits.admission(), admit)),
        );
    Router::new()
        .merge(api)
        .route(HEALTHZ_ROUTE, get(healthz))
        .route(READYZ_ROUTE, get(readyz))
        .route(METRICS_ROUTE, get(metrics))
        .route(OPENAPI_ROUTE, get(openapi_json))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(
            ServiceBuilder::new()
                // Outermost: the request id is on every answer and in the
                // span of every line the request logs, the request line
                // included.
                .layer(from_fn(request_context))
                .layer(from_fn(observe)),
        )
        .with_state(state)
}

/// The label values of the metrics exported at zero, from the modules that
/// own them.
pub fn metric_label_sets(records_backend: &'static str) -> LabelSets {
    LabelSets {
        records_backend,
        shed_reasons: crate::admission::SHED_REASONS
            .iter()
            .map(|reason| reason.label())
            .collect(),
        carrier_outcomes: &crate::carrier::client::CARRIER_OUTCOME_LABELS,
        record_operations: &crate::instrumented::RECORD_OPERATIONS,
        store_results: &crate::instrumented::STORE_RESULTS,
        routes: &ROUTES,
        watched_answers: watched_answers(),
    }
}

/// The label route's 5xx answers, which the error alerts watch.
fn watched_answers() -> Vec<WatchedAnswer> {
    let retry_after_s = 1;
    [
        ApiError::store_unavailable(retry_after_s),
        ApiError::Overloaded {
            retry_after_s,
            retry_after_ms: None,
        },
        ApiError::from(idem_http::IdempotencyError::DeadlineExceeded { retry_after_s }),
        ApiError::RequestTimeout {
            limit_ms: 0,
            retry_after_s,
        },
        ApiError::DownstreamUnavailable { retry_after_s },
        ApiError::internal(String::new()),
    ]
    .iter()
    .map(|error| WatchedAnswer {
        route: LABELS_ROUTE,
        method: "POST",
        status: error.status().as_str().to_owned(),
        outcome: error.outcome(),
    })
    .collect()
}

/// Why the server did not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("carrier: {0}")]
    Carrier(String),
    /// A certificate, key or CA file of `[server.tls]` or `carrier.ca_file`.
    #[error("TLS: {0}")]
    Tls(#[from] TlsFileError),
    #[error("callers: {0}")]
    Callers(String),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("flushing the store at shutdown: {0}")]
    Flush(StoreError),
}

impl StartupError {
    /// A refused configuration (a field, a TLS file, a store's TLS that
    /// failed its handshake), as opposed to a failure while running: the
    /// binary exits with code 2 for these, as for any refused config.
    pub fn is_refused_config(&self) -> bool {
        matches!(
            self,
            StartupError::Config(_) | StartupError::Tls(_) | StartupError::Backend(BackendError::Tls { .. })
        )
    }
}

/// Everything a config names, opened and ready to serve.
pub struct App {
    config: Config,
    state: AppState,
    callers: Callers,
    limits: Limits,
    backends: Backends,
    carrier_server: Option<CarrierServer>,
    tasks: TaskTracker,
    /// `[server.tls]`, loaded: HTTPS on the listener.
    inbound_tls: Option<InboundTls>,
}

impl App {
    /// Opens the stores and the carrier (starting the simulator in-process
    /// when no carrier URL is configured), on the system's clock.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        Self::build_with_clock(config, SystemClock::shared()).await
    }

    /// [`App::build`] on `clock`: the one clock the embedded or FoundationDB
    /// store and the idempotency layer read, so a test can end a lease or a
    /// retention by moving a `store_core::ManualClock` instead of sleeping.
    /// Redis and PostgreSQL decide expiry by their servers' clocks and
    /// ignore it; so does the in-process carrier simulator, which stands
    /// for another company's service and keeps the system's clock.
    pub async fn build_with_clock(config: Config, clock: SharedClock) -> Result<Self, StartupError> {
        config.validate()?;
        // TLS files first: a bad one is refused before any store is opened.
        let inbound_tls = inbound_tls(&config.server.tls)?;
        let carrier_roots = carrier_roots(&config.carrier)?;
        let metrics = prometheus_handle().map_err(StartupError::Metrics)?;
        let callers = Callers::from_config(&config.callers).map_err(StartupError::Callers)?;
        let backends = backend::open(&config.store, config.policy, &OpenOptions::with_clock(clock.clone())).await?;
        register_at_zero(&metric_label_sets(backends.records.backend_name()));
        export_limits(config.server.in_flight_max);
        let (carrier_url, carrier_server) = start_carrier(&config).await?;
        let carrier = CarrierClient::new(
            &carrier_url,
            Duration::from_millis(config.carrier.timeout_ms),
            carrier_roots,
        )
        .map_err(StartupError::Carrier)?
        .with_retries(config.carrier.retries());
        let tasks = TaskTracker::new();
        let state = AppState {
            idempotency: idempotency::builder(
                backends.records.clone(),
                tasks.clone(),
                config.server.retry_after_s,
                config.server.prefer_wait_applied_max_s(),
                clock,
            )
            .wait_limits(config.server.prefer_wait_limits()?)
            .build(),
            labels: backends.labels.clone(),
            carrier: Arc::new(carrier),
            metrics,
            carrier_retry_after_s: config.carrier.retry_after_s,
            store_kind: config.store.kind.name(),
            embedded: backends.embedded.as_ref().map(|store| store.engine().clone()),
            shutting_down: CancellationToken::new(),
            policy: config.policy,
            readiness: ReadinessCell::new(Checked::Ready),
        };
        // The first check before serving, so a probe never sees a state
        // nobody checked; the background task keeps it fresh from then on.
        state
            .readiness
            .set(probes::check(&state, config.server.readiness_refresh()).await);
        let limits = Limits::new(
            config.server.in_flight_max,
            Duration::from_millis(config.server.request_timeout_ms),
            config.server.retry_after_s,
            &config.admission(),
        )
        .with_body_read_timeout(Duration::from_millis(config.server.body_read_timeout_ms));
        let app = Self {
            config,
            state,
            callers,
            limits,
            backends,
            carrier_server,
            tasks,
            inbound_tls,
        };
        app.log_startup(&carrier_url);
        Ok(app)
    }

    pub fn router(&self) -> Router {
        router(self.state.clone(), self.callers.clone(), self.limits.clone())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The in-process carrier simulator's URL, when one runs.
    pub fn carrier_simulator_url(&self) -> Option<String> {
        self.carrier_server.as_ref().map(CarrierServer::base_url)
    }

    fn log_startup(&self, carrier_url: &str) {
        tracing::info!(store = self.config.store.kind.name(), "{}", self.backends.description);
        let kind = self.config.store.kind;
        if !kind.holds_labels() {
            tracing::warn!(
                "store.kind = \"{}\": a label and its idempotency record do NOT commit atomically",
                kind.name()
            );
        }
        match &self.carrier_server {
            Some(_) => tracing::info!("carrier: in-process simulator at {carrier_url}"),
            None => tracing::info!("carrier: {carrier_url}"),
        }
        if self.config.has_demo_caller() {
            tracing::warn!(
                "DEVELOPMENT CALLER ENABLED: caller {DEMO_CALLER_ID:?} with the public token {DEMO_TOKEN:?} \
                 is accepted. Configure [[callers]] with your own token digests before exposing this server."
            );
        }
    }

    /// Serves on `listener` until `shutdown` completes, then, all inside
    /// `server.shutdown_grace_ms` from the signal: fails readiness at once
    /// and keeps serving for `server.shutdown_readiness_delay_ms` (so a load
    /// balancer stops sending before connections are refused), closes the
    /// listener, lets requests in flight and their idempotent work finish,
    /// then stops the carrier simulator and flushes the store. The sweeper
    /// starts no purge batch after the signal.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        self.config.check_listener_address(listener.local_addr()?)?;
        let stop = CancellationToken::new();
        // The sweeper stops at the signal, not after the drain: a purge
        // batch started then would compete with the requests draining.
        let sweeper_stop = stop.child_token();
        let sweeper = sweeper::spawn(self.backends.records.clone(), self.config.sweeper, sweeper_stop.clone());
        let readiness = probes::spawn_refresh(
            self.state.clone(),
            self.config.server.readiness_refresh(),
            stop.child_token(),
        );
        let (signalled, on_signal) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            shutdown.await;
            let _ = signalled.send(tokio::time::Instant::now());
        });
        let grace = Duration::from_millis(self.config.server.shutdown_grace_ms);
        let readiness_delay = Duration::from_millis(self.config.server.shutdown_readiness_delay_ms).min(grace);
        let draining = CancellationToken::new();
        let server = serve_connections(
            listener,
            self.router(),
            self.connection_limits(),
            self.inbound_tls.clone(),
            draining.clone(),
        );
        tokio::pin!(server);
        let signalled_at = tokio::select! {
            () = &mut server => None,
            at = on_signal => Some(at.unwrap_or_else(|_| tokio::time::Instant::now())),
        };
        let deadline = signalled_at.unwrap_or_else(tokio::time::Instant::now) + grace;
        self.state.shutting_down.cancel();
        sweeper_stop.cancel();
        if signalled_at.is_some() {
            tracing::info!(
                ?readiness_delay,
                ?grace,
                "shutting down: readiness fails now, the listener closes next"
            );
            tokio::select! {
                () = &mut server => {}
                () = tokio::time::sleep(readiness_delay) => {}
            }
            draining.cancel();
            tokio::select! {
                () = &mut server => {}
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("shutdown grace period over with requests still in flight");
                }
            }
        }
        self.tasks.close();
        if tokio::time::timeout_at(deadline, self.tasks.wait()).await.is_err() {
            tracing::warn!("shutdown grace period over with idempotent work still running");
        }
        stop.cancel();
        let _ = sweeper.await;
        let _ = readiness.await;
        if let Some(carrier) = self.carrier_server {
            carrier.stop().await;
        }
        self.backends.flush().map_err(StartupError::Flush)?;
        tracing::info!("stopped");
        Ok(())
    }

    fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_millis(self.config.server.header_read_timeout_ms),
            connections_max: self.config.server.connections_max,
            connections_per_peer_max: self.config.server.connections_per_peer_max(),
        }
    }

    /// Serves in a background task; for tests and embedding.
    pub fn start(self, listener: TcpListener) -> Result<RunningServer, StartupError> {
        let addr = listener.local_addr()?;
        let scheme = self.scheme();
        let stop = CancellationToken::new();
        let task = tokio::spawn(self.serve(listener, stop.clone().cancelled_owned()));
        Ok(RunningServer {
            addr,
            scheme,
            stop,
            task,
        })
    }

    /// `https` when `[server.tls]` is set, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.inbound_tls.is_some() { "https" } else { "http" }
    }
}

/// Connections the kernel queues for `accept`. std's and tokio's `bind`
/// ask for 128: a client that times out closes its connection and opens a
/// new one for the retry, and a burst of those overflowed 128, dropped SYNs
/// and made every retry wait a second for the SYN to be sent again (seen at
/// 2,000 requests/s: 7,797 listen overflows in one run). The kernel caps it
/// at `net.core.somaxconn` (4,096 by default since Linux 5.4).
pub const LISTEN_BACKLOG: u32 = 4_096;

/// Binds a listener with [`LISTEN_BACKLOG`].
pub fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn start_carrier(config: &Config) -> Result<(String, Option<CarrierServer>), StartupError> {
    if !config.carrier.url.is_empty() {
        return Ok((config.carrier.url.clone(), None));
    }
    let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let server = CarrierServer::start(&config.carrier.simulator, listener)
        .await
        .map_err(|error| StartupError::Carrier(format!("simulator: {error}")))?;
    Ok((server.base_url(), Some(server)))
}

/// A server running in the background.
pub struct RunningServer {
    addr: SocketAddr,
    scheme: &'static str,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), StartupError>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, or `https://` with `[server.tls]`.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Starts a graceful shutdown without waiting for it.
    pub fn begin_shutdown(&self) {
        self.stop.cancel();
    }

    /// Graceful shutdown, as on SIGTERM; waits until the store is flushed.
    pub async fn shutdown(self) -> Result<(), StartupError> {
        self.stop.cancel();
        match self.task.await {
            Ok(result) => result,
            Err(error) => Err(StartupError::Io(std::io::Error::other(error.to_string()))),
        }
    }
}
