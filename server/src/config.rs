//! The server's configuration: a TOML file (`--config`), then environment
//! overrides, then validation.
//!
//! Every field can be overridden by an environment variable named
//! `IDEM__` plus the field's path in upper case with `__` between the parts:
//! `IDEM__SERVER__LISTEN=0.0.0.0:8080`, `IDEM__STORE__KIND=redis`,
//! `IDEM__STORE__REDIS__URLS='["redis://127.0.0.1:6379"]'`,
//! `IDEM__CALLERS='[{id = "fulfilment", token_sha256 = "…"}]'`. The value is
//! read as a TOML value when it is one (numbers, booleans, arrays, quoted
//! strings) and as a plain string otherwise; quote a string that looks like
//! a number (`IDEM__STORE__REDIS__KEY_PREFIX='"123"'`).
//!
//! Unknown fields, in the file or the environment, are refused: a typo must
//! not silently fall back to a default. Every refusal names the field.

use crate::admission::{
    ADMISSION_MS_MAX, ADMISSION_QUEUE_MAX_LIMIT, ADMISSION_WORKERS_MAX, AdmissionConfig, workers_for_postgres_pool,
};
use crate::carrier::CarrierRetries;
use crate::carrier::retry::{
    CARRIER_RETRIES_LIMIT, CARRIER_RETRIES_MAX_DEFAULT, CARRIER_RETRY_BACKOFF_MS_DEFAULT, CARRIER_RETRY_BACKOFF_MS_MAX,
};
use crate::redact::redact_secrets;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use store_core::waiting::{
    WAIT_POLL_INTERVAL_MS_DEFAULT, WAITERS_PER_INSTANCE_MAX_DEFAULT, WAITERS_PER_KEY_MAX_DEFAULT,
};
use store_core::{CallerId, PURGE_BATCH_MAX, Policy, WaitLimits};
use store_postgres::SslMode;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "IDEM__";
/// Separator between the parts of a field path in a variable name.
pub const ENV_SEPARATOR: &str = "__";

/// Default listen address: loopback only, so a first run exposes nothing.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default data directory of the embedded store (ignored by git).
pub const DATA_DIR_DEFAULT: &str = store_fdb::DATA_DIR_DEFAULT;
/// Largest request body the API reads, in bytes.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Default budget of one request, from its first byte to its answer.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 25_000;
/// Longest request budget accepted.
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;
/// Default cap on API requests in flight; beyond it the API answers 503 overloaded at once.
pub const IN_FLIGHT_MAX_DEFAULT: usize = 1_024;
/// Largest in-flight cap accepted.
pub const IN_FLIGHT_MAX_LIMIT: usize = 100_000;
/// Default time a client has to send a whole request head; also the
/// longest a keep-alive connection may sit idle between requests.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest header-read timeout accepted.
pub const HEADER_READ_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;
/// Default cap on open client connections; at the cap the server stops
/// accepting until one closes. Keep the process's file descriptor limit
/// (`ulimit -n`) above it.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4_096;
/// Largest connection cap accepted.
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;
/// Most waiters (`Prefer: wait`) on one key in one instance accepted for
/// `server.prefer_wait_waiters_per_key_max` (default: store-core's
/// `WAITERS_PER_KEY_MAX_DEFAULT`, 128). One commit wakes every waiter on
/// its key at once, and each reads the record again: past ten thousand,
/// one answer becomes a burst of store reads, not a wait.
pub const PREFER_WAIT_WAITERS_PER_KEY_LIMIT: usize = 10_000;
/// Most waiters in one instance accepted for `server.prefer_wait_waiters_max`
/// (default: store-core's `WAITERS_PER_INSTANCE_MAX_DEFAULT`, 4,096). Every
/// waiter holds a client connection, so this is [`CONNECTIONS_MAX_LIMIT`]:
/// a higher cap could never be reached.
pub const PREFER_WAIT_WAITERS_LIMIT: usize = CONNECTIONS_MAX_LIMIT;
/// Default time shutdown waits for requests and their work to finish.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 30_000;
/// Default time between readiness failing and the listener closing at
/// shutdown: long enough for a load balancer to see the probe fail and stop
/// sending (a couple of probe periods). Capped by the grace period.
pub const SHUTDOWN_READINESS_DELAY_MS_DEFAULT: u64 = 2_000;
/// `Retry-After` for store outages and overload, in seconds.
pub const RETRY_AFTER_S_DEFAULT: u64 = 1;
/// Longest `Retry-After` the config may set, in seconds.
pub const RETRY_AFTER_S_MAX: u64 = 3_600;
/// Default carrier call timeout (20 s inside the 30 s lease: docs/design.md#carrier-timeout).
pub const CARRIER_TIMEOUT_MS_DEFAULT: u64 = 20_000;
/// Longest carrier timeout accepted.
pub const CARRIER_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;
/// Default sweeper interval.
pub const SWEEPER_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// Shortest sweeper interval accepted.
pub const SWEEPER_INTERVAL_MS_MIN: u64 = 10;
/// Default records purged per batch.
pub const SWEEPER_BATCH_MAX_DEFAULT: usize = 1_000;
/// Default batches per sweeper run, so one run stays bounded.
pub const SWEEPER_BATCHES_PER_RUN_DEFAULT: usize = 100;
/// Default time a client has to finish the TLS handshake on an HTTPS
/// listener; past it the connection is closed (a slowloris handshake holds
/// a connection slot no longer than a slowloris header would).
pub const TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest TLS handshake timeout accepted.
pub const TLS_HANDSHAKE_TIMEOUT_MS_MAX: u64 = 60_000;
/// Longest simulated carrier latency accepted.
pub const SIMULATOR_LATENCY_MS_MAX: u64 = 10 * 60 * 1000;

/// The development caller's id.
pub const DEMO_CALLER_ID: &str = "demo";
/// The development caller's token. Only its SHA-256 is in the default
/// config; the server warns loudly whenever this token is accepted.
pub const DEMO_TOKEN: &str = "demo-token";

/// Why a configuration was refused; always names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("environment variable {variable}: {message}")]
    Environment { variable: String, message: String },
    #[error("config: {0}")]
    Shape(String),
    #[error("config field {field}: {message}")]
    Field { field: &'static str, message: String },
}

fn field_error(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    /// Who may call the API. The default is the one development caller.
    pub callers: Vec<CallerConfig>,
    /// `[policy]`: store-core's own type, checked as it is read.
    pub policy: Policy,
    pub store: StoreConfig,
    pub carrier: CarrierConfig,
    pub sweeper: SweeperConfig,
    pub log: LogConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `host:port`; port 0 picks a free port (tests).
    pub listen: String,
    pub request_timeout_ms: u64,
    /// The most API requests in flight, counting the work a request leaves
    /// running after its client hung up.
    pub in_flight_max: usize,
    /// The whole shutdown, from the signal: readiness delay, draining
    /// connections, and the idempotent work they left running.
    pub shutdown_grace_ms: u64,
    /// At shutdown, how long `/readyz` answers 503 before the listener
    /// closes (capped by `shutdown_grace_ms`).
    pub shutdown_readiness_delay_ms: u64,
    /// `Retry-After` on store outages, overload and timeouts.
    pub retry_after_s: u64,
    /// The longest a request's `Prefer: wait=N` waits for another attempt
    /// on its key before 409 (docs/design.md#waiting); 0 turns waiting off.
    /// The wait applied is also shorter than the request budget
    /// ([`ServerConfig::prefer_wait_applied_max_s`]), so a waiter answers
    /// before its request times out.
    pub prefer_wait_max_s: u64,
    /// The most requests waiting (`Prefer: wait`) on one key in this
    /// instance; past it a request gets its 409 at once
    /// (docs/design.md#wait-limits).
    pub prefer_wait_waiters_per_key_max: usize,
    /// The most requests waiting in this instance, all keys together; past
    /// it a request gets its 409 at once.
    pub prefer_wait_waiters_max: usize,
    /// Time a client has to send a whole request head, and the longest a
    /// keep-alive connection may sit idle; past it the connection is closed.
    pub header_read_timeout_ms: u64,
    /// The most client connections open at once.
    pub connections_max: usize,
    /// Accept the development caller (whose token is public) on an address
    /// other than loopback. Off: such a config is refused.
    pub allow_demo_caller_on_public_address: bool,
    /// Workers and the CoDel-bounded queue in front of them (`admission.rs`).
    pub admission: AdmissionConfig,
    /// HTTPS on the listener; off (plain HTTP) unless both files are set.
    pub tls: ServerTlsConfig,
}

/// Inbound HTTPS (`[server.tls]`): PEM files, read at startup.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTlsConfig {
    /// The server's certificate chain, leaf first. Empty: plain HTTP.
    pub cert_file: String,
    /// The certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout_ms: u64,
}

impl ServerConfig {
    /// The wait a `Prefer: wait` is granted at most: `prefer_wait_max_s`,
    /// and the longest whole number of seconds shorter than the request
    /// budget, so a waiter answers before its request times out (0, no
    /// waiting, when not even a second fits).
    pub fn prefer_wait_applied_max_s(&self) -> u64 {
        self.prefer_wait_max_s
            .min(self.request_timeout_ms.saturating_sub(1) / 1_000)
    }

    /// The waiter caps for the store's change hub, with store-core's
    /// fallback poll interval. [`Config::validate`] has checked them.
    pub fn prefer_wait_limits(&self) -> Result<WaitLimits, ConfigError> {
        WaitLimits::new(
            self.prefer_wait_waiters_per_key_max,
            self.prefer_wait_waiters_max,
            WAIT_POLL_INTERVAL_MS_DEFAULT,
        )
        .map_err(|error| field_error("server.prefer_wait_waiters_per_key_max", error.to_string()))
    }
}

impl ServerTlsConfig {
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty() || !self.key_file.is_empty()
    }
}

impl Default for ServerTlsConfig {
    fn default() -> Self {
        Self {
            cert_file: String::new(),
            key_file: String::new(),
            handshake_timeout_ms: TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    pub id: String,
    /// Hex SHA-256 of the caller's bearer token (`server hash-token < token-file`).
    pub token_sha256: String,
    /// Digests of tokens being rotated out, still accepted for the same
    /// caller: a token is rotated without changing the caller id, which
    /// scopes its keys, labels and carrier keys, so a retry that spans the
    /// rotation replays instead of buying again. Remove them once every
    /// client has the new token.
    #[serde(default)]
    pub retiring_token_sha256: Vec<String>,
}

/// Where records live (`store.kind`): the one list of backends the
/// server, its tests and the bench share (the bench's `--backend` and
/// `--store-kind` parse it too). Opening one is `backend::open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum StoreKind {
    Embedded,
    Redis,
    Postgres,
    Foundationdb,
    /// The reference store in memory (store-memory): volatile, for tests;
    /// only with the `memory-store` feature, and never a bench backend.
    #[value(skip)]
    Memory,
}

impl StoreKind {
    /// Every kind, whether or not this build has it ([`StoreKind::is_built`]).
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Embedded,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::Foundationdb,
        StoreKind::Memory,
    ];

    /// The durable kinds a test or the bench runs on this machine alone:
    /// the embedded store, and Redis and PostgreSQL on servers their
    /// testkits start. Not FoundationDB (it needs a cluster nobody here
    /// starts, and the default build leaves it out), not memory (volatile).
    pub const SELF_STARTED: [StoreKind; 3] = [StoreKind::Embedded, StoreKind::Redis, StoreKind::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Embedded => "embedded",
            StoreKind::Foundationdb => "foundationdb",
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::Memory => "memory",
        }
    }

    /// The server's cargo feature that builds this kind in, for the ones
    /// a default build leaves out.
    pub fn cargo_feature(self) -> Option<&'static str> {
        match self {
            StoreKind::Foundationdb => Some("foundationdb"),
            StoreKind::Memory => Some("memory-store"),
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Postgres => None,
        }
    }

    /// True when this build of the server can open the kind.
    pub fn is_built(self) -> bool {
        match self {
            StoreKind::Foundationdb => cfg!(feature = "foundationdb"),
            StoreKind::Memory => cfg!(feature = "memory-store"),
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Postgres => true,
        }
    }

    /// True when the records' store can commit a label in the record's
    /// own transaction; the others keep labels apart (embedded or
    /// PostgreSQL, `store.labels`).
    pub fn holds_labels(self) -> bool {
        match self {
            StoreKind::Embedded | StoreKind::Foundationdb | StoreKind::Postgres => true,
            StoreKind::Redis | StoreKind::Memory => false,
        }
    }
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        StoreKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| format!("unknown store kind {name:?}"))
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Where labels (the business effect) live, beside the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelsKind {
    /// In the records' own store, committed in one transaction with the
    /// record (embedded, FoundationDB, PostgreSQL).
    WithRecords,
    /// In the embedded store beside a Redis record store: two commits, one
    /// instance only (the embedded store is a local directory).
    Embedded,
    /// In PostgreSQL (`[store.postgres]`) beside a Redis record store: two
    /// commits, shared by every instance.
    Postgres,
}

impl LabelsKind {
    pub fn name(self) -> &'static str {
        match self {
            LabelsKind::WithRecords => "with_records",
            LabelsKind::Embedded => "embedded",
            LabelsKind::Postgres => "postgres",
        }
    }
}

/// `[store]`: the kind, where labels go, and each backend's section,
/// deserialised straight into the store crate's own config type (its
/// `Deserialize` keeps this file's field names; the checks that name a
/// field are [`Config::validate`]'s).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// Where labels live; absent: with the records, or for records that
    /// cannot hold them, in the embedded store (see [`StoreConfig::labels_kind`]).
    pub labels: Option<LabelsKind>,
    /// The embedded store: records with kind = "embedded", labels with kind = "redis" or "memory".
    pub embedded: store_fdb::EmbeddedConfig,
    pub redis: store_redis::RedisConfig,
    pub postgres: store_postgres::PostgresConfig,
    pub foundationdb: store_fdb::FoundationDbConfig,
}

/// `Debug` by hand: the URL may carry a password ([`redact_secrets`]).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CarrierConfig {
    /// Base URL of the carrier (`http://127.0.0.1:9090`, `https://...`).
    /// Empty: start the simulator in-process.
    pub url: String,
    /// For an `https://` carrier: trust only this PEM CA. Empty: the
    /// operating system's trust store.
    pub ca_file: String,
    /// Budget of one carrier call; must be shorter than the lease.
    pub timeout_ms: u64,
    /// `Retry-After` when the carrier gave no definite answer.
    pub retry_after_s: u64,
    /// Retries of a call that failed in a way a repeat may cure (a dropped
    /// connection, a 5xx), within `timeout_ms`; 0 turns them off.
    pub retries_max: u32,
    /// Upper bound of the first retry's random pause; doubled per retry.
    pub retry_backoff_ms: u64,
    pub simulator: SimulatorConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulatorConfig {
    /// Each call waits a uniform time in [latency_ms_min, latency_ms_max].
    pub latency_ms_min: u64,
    pub latency_ms_max: u64,
    /// A fraction of calls wait `slow_ms` instead: the distribution's tail.
    pub slow_rate: f64,
    pub slow_ms: u64,
    /// Fraction of calls answered 503 before any purchase.
    pub error_rate: f64,
    /// Fraction of purchases whose reply is dropped (connection closed).
    pub lost_reply_rate: f64,
    /// Seed of the simulator's random choices; 0 picks one at random.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweeperConfig {
    pub interval_ms: u64,
    pub batch_max: usize,
    pub batches_per_run_max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing filter (`info`, `server=debug,info`); RUST_LOG wins when set.
    pub level: String,
}

impl std::fmt::Debug for CarrierConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("CarrierConfig")
            .field("url", &redact_secrets(&self.url))
            .field("ca_file", &self.ca_file)
            .field("timeout_ms", &self.timeout_ms)
            .field("retry_after_s", &self.retry_after_s)
            .field("retries_max", &self.retries_max)
            .field("retry_backoff_ms", &self.retry_backoff_ms)
            .field("simulator", &self.simulator)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            callers: vec![CallerConfig::demo()],
            policy: Policy::default(),
            store: StoreConfig::default(),
            carrier: CarrierConfig::default(),
            sweeper: SweeperConfig::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: LISTEN_DEFAULT.to_owned(),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            in_flight_max: IN_FLIGHT_MAX_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            shutdown_readiness_delay_ms: SHUTDOWN_READINESS_DELAY_MS_DEFAULT,
            retry_after_s: RETRY_AFTER_S_DEFAULT,
            prefer_wait_max_s: idem_http::WAIT_CAP_S_DEFAULT,
            prefer_wait_waiters_per_key_max: WAITERS_PER_KEY_MAX_DEFAULT,
            prefer_wait_waiters_max: WAITERS_PER_INSTANCE_MAX_DEFAULT,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            allow_demo_caller_on_public_address: false,
            admission: AdmissionConfig::default(),
            tls: ServerTlsConfig::default(),
        }
    }
}

/// Tokens a caller may present at most (the current one and those being
/// rotated out).
pub const CALLER_TOKENS_MAX: usize = 8;

impl CallerConfig {
    /// A caller with one token.
    pub fn new(id: impl Into<String>, token_sha256: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            token_sha256: token_sha256.into(),
            retiring_token_sha256: Vec::new(),
        }
    }

    /// Every digest this caller is accepted with, current first.
    pub fn token_digests(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.token_sha256.as_str()).chain(self.retiring_token_sha256.iter().map(String::as_str))
    }

    /// The development caller: id `demo`, token `demo-token`.
    pub fn demo() -> Self {
        Self {
            id: DEMO_CALLER_ID.to_owned(),
            token_sha256: token_sha256(DEMO_TOKEN),
            retiring_token_sha256: Vec::new(),
        }
    }
}

/// Hex SHA-256 of a bearer token, as the config stores it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl StoreConfig {
    /// Where labels live: as configured, else with the records, or for
    /// records that cannot hold an effect (Redis, memory) in the embedded
    /// store.
    pub fn labels_kind(&self) -> LabelsKind {
        self.labels.unwrap_or(if self.kind.holds_labels() {
            LabelsKind::WithRecords
        } else {
            LabelsKind::Embedded
        })
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            kind: StoreKind::Embedded,
            labels: None,
            embedded: store_fdb::EmbeddedConfig::default(),
            redis: store_redis::RedisConfig::default(),
            postgres: store_postgres::PostgresConfig::default(),
            foundationdb: store_fdb::FoundationDbConfig::default(),
        }
    }
}

impl CarrierConfig {
    /// How the carrier client retries a call within its request.
    pub fn retries(&self) -> CarrierRetries {
        CarrierRetries {
            retries_max: self.retries_max,
            backoff_base: std::time::Duration::from_millis(self.retry_backoff_ms),
        }
    }
}

impl Default for CarrierConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            ca_file: String::new(),
            timeout_ms: CARRIER_TIMEOUT_MS_DEFAULT,
            retry_after_s: RETRY_AFTER_S_DEFAULT,
            retries_max: CARRIER_RETRIES_MAX_DEFAULT,
            retry_backoff_ms: CARRIER_RETRY_BACKOFF_MS_DEFAULT,
            simulator: SimulatorConfig::default(),
        }
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            latency_ms_min: 20,
            latency_ms_max: 80,
            slow_rate: 0.0,
            slow_ms: 0,
            error_rate: 0.0,
            lost_reply_rate: 0.0,
            seed: 0,
        }
    }
}

impl Default for SweeperConfig {
    fn default() -> Self {
        Self {
            interval_ms: SWEEPER_INTERVAL_MS_DEFAULT,
            batch_max: SWEEPER_BATCH_MAX_DEFAULT,
            batches_per_run_max: SWEEPER_BATCHES_PER_RUN_DEFAULT,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

impl Config {
    /// Reads the file (if any), applies `IDEM__*` overrides from `env`, and
    /// validates the result.
    pub fn load(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        for (variable, value) in env {
            apply_override(&mut table, &variable, &value)?;
        }
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| ConfigError::Shape(redact_secrets(error.message())))?;
        config.validate()?;
        Ok(config)
    }

    /// Loads from the file and this process's environment.
    pub fn from_process(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load(path, std::env::vars())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.server.listen.parse().map_err(|error| {
            field_error(
                "server.listen",
                format!("{:?} is not host:port: {error}", self.server.listen),
            )
        })
    }

    /// True when the development caller's token is accepted, however its
    /// digest is written (the digests are compared as bytes).
    pub fn has_demo_caller(&self) -> bool {
        let demo: [u8; 32] = Sha256::digest(DEMO_TOKEN.as_bytes()).into();
        self.callers
            .iter()
            .any(|caller| token_digest(&caller.token_sha256) == Some(demo))
    }

    /// Checks every field; the first refusal names its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        self.validate_server()?;
        self.validate_callers()?;
        self.validate_demo_caller_address()?;
        self.validate_carrier(&self.policy)?;
        self.validate_simulator()?;
        self.validate_sweeper()?;
        self.validate_store()
    }

    /// `[server.admission]` with the store's own default number of workers
    /// where none is configured: half the pool in front of PostgreSQL
    /// (`admission::workers_for_postgres_pool`); the other stores keep
    /// `AdmissionConfig::workers`'s default.
    pub fn admission(&self) -> AdmissionConfig {
        let store_default = match self.store.kind {
            StoreKind::Postgres => Some(workers_for_postgres_pool(self.store.postgres.pool_size)),
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Foundationdb | StoreKind::Memory => None,
        };
        AdmissionConfig {
            workers: self.server.admission.workers.or(store_default),
            ..self.server.admission
        }
    }

    fn validate_admission(&self) -> Result<(), ConfigError> {
        let admission = &self.admission();
        let workers = admission.workers() as u64;
        check_range("server.admission.workers", workers, 1, ADMISSION_WORKERS_MAX as u64)?;
        let queue_max = admission.queue_max as u64;
        check_range(
            "server.admission.queue_max",
            queue_max,
            0,
            ADMISSION_QUEUE_MAX_LIMIT as u64,
        )?;
        check_range(
            "server.admission.interval_ms",
            admission.interval_ms,
            1,
            ADMISSION_MS_MAX,
        )?;
        // CoDel's target is the short wait: never longer than the interval.
        check_range(
            "server.admission.target_ms",
            admission.target_ms,
            1,
            admission.interval_ms,
        )
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        self.validate_admission()?;
        let server = &self.server;
        check_range(
            "server.request_timeout_ms",
            server.request_timeout_ms,
            1,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.in_flight_max",
            server.in_flight_max as u64,
            1,
            IN_FLIGHT_MAX_LIMIT as u64,
        )?;
        check_range(
            "server.shutdown_grace_ms",
            server.shutdown_grace_ms,
            0,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.shutdown_readiness_delay_ms",
            server.shutdown_readiness_delay_ms,
            0,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.header_read_timeout_ms",
            server.header_read_timeout_ms,
            1,
            HEADER_READ_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.connections_max",
            server.connections_max as u64,
            1,
            CONNECTIONS_MAX_LIMIT as u64,
        )?;
        check_range("server.retry_after_s", server.retry_after_s, 1, RETRY_AFTER_S_MAX)?;
        check_range(
            "server.prefer_wait_max_s",
            server.prefer_wait_max_s,
            0,
            idem_http::WAIT_CAP_S_MAX,
        )?;
        self.validate_prefer_wait_waiters()?;
        self.validate_server_tls()
    }

    /// At least one waiter (0 would refuse every wait; `prefer_wait_max_s =
    /// 0` turns waiting off), at most the named limits, and no more per key
    /// than in the whole instance.
    fn validate_prefer_wait_waiters(&self) -> Result<(), ConfigError> {
        let server = &self.server;
        check_range(
            "server.prefer_wait_waiters_max",
            server.prefer_wait_waiters_max as u64,
            1,
            PREFER_WAIT_WAITERS_LIMIT as u64,
        )?;
        check_range(
            "server.prefer_wait_waiters_per_key_max",
            server.prefer_wait_waiters_per_key_max as u64,
            1,
            PREFER_WAIT_WAITERS_PER_KEY_LIMIT.min(server.prefer_wait_waiters_max) as u64,
        )
    }

    /// Both files or neither: half a TLS config must not fall back to plain HTTP.
    fn validate_server_tls(&self) -> Result<(), ConfigError> {
        let tls = &self.server.tls;
        check_range(
            "server.tls.handshake_timeout_ms",
            tls.handshake_timeout_ms,
            1,
            TLS_HANDSHAKE_TIMEOUT_MS_MAX,
        )?;
        if tls.cert_file.is_empty() && !tls.key_file.is_empty() {
            return Err(field_error(
                "server.tls.cert_file",
                "server.tls.key_file is set: set both or neither",
            ));
        }
        if tls.key_file.is_empty() && !tls.cert_file.is_empty() {
            return Err(field_error(
                "server.tls.key_file",
                "server.tls.cert_file is set: set both or neither",
            ));
        }
        Ok(())
    }

    fn validate_callers(&self) -> Result<(), ConfigError> {
        if self.callers.is_empty() {
            return Err(field_error("callers", "at least one caller is required"));
        }
        let (mut ids, mut digests) = (HashSet::new(), HashSet::new());
        for caller in &self.callers {
            CallerId::new(caller.id.as_str())
                .map_err(|error| field_error("callers.id", format!("{:?}: {error}", caller.id)))?;
            if caller.retiring_token_sha256.len() >= CALLER_TOKENS_MAX {
                let detail = format!("caller {:?}: at most {CALLER_TOKENS_MAX} tokens in all", caller.id);
                return Err(field_error("callers.retiring_token_sha256", detail));
            }
            for hex_digest in caller.token_digests() {
                let Some(digest) = token_digest(hex_digest) else {
                    return Err(field_error(
                        "callers.token_sha256",
                        format!(
                            "caller {:?}: must be 64 hex characters (server hash-token < token-file)",
                            caller.id
                        ),
                    ));
                };
                if !digests.insert(digest) {
                    return Err(field_error("callers.token_sha256", "one token appears twice"));
                }
            }
            if !ids.insert(caller.id.as_str()) {
                return Err(field_error("callers.id", format!("{:?} appears twice", caller.id)));
            }
        }
        Ok(())
    }

    fn validate_demo_caller_address(&self) -> Result<(), ConfigError> {
        self.check_demo_caller_address(self.listen_addr()?)
    }

    /// The development caller's token is public: on an address other than
    /// loopback it lets anyone in, so serving it on `address` takes an
    /// explicit flag. Checked on `server.listen` with the config, and again
    /// on the address of the listener the app is given (embedding code may
    /// bind its own).
    pub fn check_demo_caller_address(&self, address: SocketAddr) -> Result<(), ConfigError> {
        if !self.has_demo_caller() || address.ip().is_loopback() || self.server.allow_demo_caller_on_public_address {
            return Ok(());
        }
        Err(field_error(
            "server.allow_demo_caller_on_public_address",
            format!(
                "{address} is not a loopback address, and the development caller {DEMO_CALLER_ID:?} \
                 with the public token {DEMO_TOKEN:?} is accepted: anyone could call the API. Configure \
                 [[callers]] with your own token digests, or set this flag to true to run anyway"
            ),
        ))
    }

    fn validate_carrier(&self, policy: &Policy) -> Result<(), ConfigError> {
        let carrier = &self.carrier;
        check_range("carrier.timeout_ms", carrier.timeout_ms, 1, CARRIER_TIMEOUT_MS_MAX)?;
        check_range("carrier.retry_after_s", carrier.retry_after_s, 1, RETRY_AFTER_S_MAX)?;
        check_range(
            "carrier.retries_max",
            u64::from(carrier.retries_max),
            0,
            u64::from(CARRIER_RETRIES_LIMIT),
        )?;
        check_range(
            "carrier.retry_backoff_ms",
            carrier.retry_backoff_ms,
            1,
            CARRIER_RETRY_BACKOFF_MS_MAX,
        )?;
        // docs/design.md#lease-outlasts-call: an attempt must get its carrier answer (or give
        // up) while it still holds the lease, or two attempts run at once.
        if policy.lease_ms() <= carrier.timeout_ms {
            return Err(field_error(
                "policy.lease_ms",
                format!(
                    "the lease ({} ms) must be longer than carrier.timeout_ms ({} ms)",
                    policy.lease_ms(),
                    carrier.timeout_ms
                ),
            ));
        }
        if !carrier.url.is_empty() && !carrier.url.starts_with("http://") && !carrier.url.starts_with("https://") {
            return Err(field_error(
                "carrier.url",
                "must start with http:// or https:// (or be empty for the simulator)",
            ));
        }
        if !carrier.ca_file.is_empty() && !carrier.url.starts_with("https://") {
            return Err(field_error(
                "carrier.ca_file",
                "is set but carrier.url is not https://: the CA would never be used",
            ));
        }
        Ok(())
    }

    fn validate_simulator(&self) -> Result<(), ConfigError> {
        let simulator = &self.carrier.simulator;
        for (field, rate) in [
            ("carrier.simulator.slow_rate", simulator.slow_rate),
            ("carrier.simulator.error_rate", simulator.error_rate),
            ("carrier.simulator.lost_reply_rate", simulator.lost_reply_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(field_error(field, format!("{rate} is not a fraction between 0 and 1")));
            }
        }
        check_range(
            "carrier.simulator.latency_ms_max",
            simulator.latency_ms_max,
            0,
            SIMULATOR_LATENCY_MS_MAX,
        )?;
        check_range(
            "carrier.simulator.slow_ms",
            simulator.slow_ms,
            0,
            SIMULATOR_LATENCY_MS_MAX,
        )?;
        if simulator.latency_ms_min > simulator.latency_ms_max {
            return Err(field_error(
                "carrier.simulator.latency_ms_min",
                "must not exceed carrier.simulator.latency_ms_max",
            ));
        }
        Ok(())
    }

    fn validate_sweeper(&self) -> Result<(), ConfigError> {
        let sweeper = &self.sweeper;
        check_range(
            "sweeper.interval_ms",
            sweeper.interval_ms,
            SWEEPER_INTERVAL_MS_MIN,
            u64::from(u32::MAX),
        )?;
        check_range("sweeper.batch_max", sweeper.batch_max as u64, 1, PURGE_BATCH_MAX as u64)?;
        check_range(
            "sweeper.batches_per_run_max",
            sweeper.batches_per_run_max as u64,
            1,
            1_000_000,
        )
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        let store = &self.store;
        let labels = store.labels_kind();
        let uses_embedded = store.kind == StoreKind::Embedded || labels == LabelsKind::Embedded;
        if uses_embedded && store.embedded.path.as_os_str().is_empty() {
            return Err(field_error("store.embedded.path", "must name a directory"));
        }
        if let Some((name, min, max)) = store.embedded.sizes.out_of_range() {
            let field = match name {
                "cache_bytes" => "store.embedded.cache_bytes",
                "memtable_bytes" => "store.embedded.memtable_bytes",
                _ => "store.embedded.journal_bytes_max",
            };
            return Err(field_error(field, format!("must be {min} to {max}")));
        }
        self.validate_labels(labels)?;
        if store.kind == StoreKind::Redis {
            self.validate_redis_tls()?;
        }
        if store.kind == StoreKind::Postgres || labels == LabelsKind::Postgres {
            self.validate_postgres_tls()?;
        }
        match store.kind {
            StoreKind::Redis if store.redis.urls.is_empty() => Err(field_error(
                "store.redis.urls",
                "store.kind = \"redis\" needs at least one redis:// URL",
            )),
            StoreKind::Postgres if store.postgres.url.is_empty() => Err(field_error(
                "store.postgres.url",
                "store.kind = \"postgres\" needs a postgres:// URL",
            )),
            _ => Ok(()),
        }
    }
}

impl Config {
    /// The TLS files go with `rediss://` URLs, a client certificate with its key.
    fn validate_redis_tls(&self) -> Result<(), ConfigError> {
        let redis = &self.store.redis;
        let tls_urls = redis
            .urls
            .iter()
            .filter(|url| url.starts_with(store_redis::TLS_SCHEME))
            .count();
        if tls_urls != 0 && tls_urls != redis.urls.len() {
            return Err(field_error(
                "store.redis.urls",
                "mix redis:// and rediss://: every node speaks TLS or none does",
            ));
        }
        let tls = &redis.tls;
        let files = [&tls.ca_file, &tls.client_cert_file, &tls.client_key_file];
        if tls_urls == 0 && files.iter().any(|file| file.is_some()) {
            return Err(field_error(
                "store.redis.ca_file",
                "TLS files are set but store.redis.urls are redis://; use rediss:// for TLS",
            ));
        }
        if tls.client_cert_file.is_none() != tls.client_key_file.is_none() {
            return Err(field_error(
                "store.redis.client_key_file",
                "store.redis.client_cert_file and client_key_file go together: set both or neither",
            ));
        }
        Ok(())
    }

    /// One place says whether PostgreSQL is TLS: `sslmode`, with its CA file.
    fn validate_postgres_tls(&self) -> Result<(), ConfigError> {
        let postgres = &self.store.postgres;
        if postgres.url.contains("sslmode") {
            return Err(field_error(
                "store.postgres.url",
                "carries sslmode; set store.postgres.sslmode instead (disable, require or verify-full)",
            ));
        }
        match (postgres.ssl_mode, postgres.ca_file.is_none()) {
            (SslMode::Disable, false) => Err(field_error(
                "store.postgres.ca_file",
                "is set but store.postgres.sslmode is disable: set sslmode require or verify-full",
            )),
            (SslMode::Require | SslMode::VerifyFull, true) => Err(field_error(
                "store.postgres.ca_file",
                "store.postgres.sslmode require and verify-full need the CA that signed the server's certificate",
            )),
            _ => Ok(()),
        }
    }
}

/// The combinations a team would run: labels with the records wherever the
/// records' store can hold them in one transaction; beside records that
/// cannot (Redis, memory), in the embedded store or in PostgreSQL.
fn labels_combination_ok(kind: StoreKind, labels: LabelsKind) -> bool {
    if kind.holds_labels() {
        labels == LabelsKind::WithRecords
    } else {
        matches!(labels, LabelsKind::Embedded | LabelsKind::Postgres)
    }
}

impl Config {
    fn validate_labels(&self, labels: LabelsKind) -> Result<(), ConfigError> {
        let kind = self.store.kind;
        if !labels_combination_ok(kind, labels) {
            let detail = format!(
                "labels = \"{}\" cannot go with store.kind = \"{}\": with embedded, foundationdb or postgres \
                 records labels go with_records; with redis or memory records, in embedded or postgres",
                labels.name(),
                kind.name()
            );
            return Err(field_error("store.labels", &detail));
        }
        if labels == LabelsKind::Postgres && self.store.postgres.url.is_empty() {
            return Err(field_error(
                "store.postgres.url",
                "store.labels = \"postgres\" needs a postgres:// URL for the labels",
            ));
        }
        Ok(())
    }
}

/// The 32 bytes of a hex SHA-256 digest, in either case; `None` when it is
/// not 64 hex characters. Digests are compared as these bytes, never as
/// strings, so the case a digest is written in changes nothing.
pub fn token_digest(hex_digest: &str) -> Option<[u8; 32]> {
    if hex_digest.len() != 64 {
        return None;
    }
    hex::decode(hex_digest).ok()?.try_into().ok()
}

fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(field_error(field, format!("{value} is outside {min}..={max}")))
    }
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>().map_err(|error| ConfigError::Syntax {
        path: path.display().to_string(),
        message: syntax_error_message(&text, &error),
    })
}

/// Where the file is not TOML and why, without the offending line: toml's
/// own message quotes that line, and the line may hold a password.
fn syntax_error_message(text: &str, error: &toml::de::Error) -> String {
    let reason = redact_secrets(error.message().trim());
    let Some(span) = error.span() else {
        return reason;
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!("line {line}, column {column}: {reason}")
}

/// Applies one `IDEM__A__B=value` variable to the table; other variables
/// are ignored.
fn apply_override(table: &mut toml::Table, variable: &str, raw: &str) -> Result<(), ConfigError> {
    let Some(path) = variable.strip_prefix(ENV_PREFIX) else {
        return Ok(());
    };
    let env_error = |message: &str| ConfigError::Environment {
        variable: variable.to_owned(),
        message: message.to_owned(),
    };
    let parts: Vec<String> = path.split(ENV_SEPARATOR).map(str::to_ascii_lowercase).collect();
    if parts.iter().any(String::is_empty) {
        return Err(env_error("empty field name"));
    }
    let Some((leaf, sections)) = parts.split_last() else {
        return Err(env_error("empty field name"));
    };
    let mut current = table;
    for section in sections {
        let entry = current
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| env_error(&format!("{section} is not a section")))?;
    }
    current.insert(leaf.clone(), override_value(raw));
    Ok(())
}

/// A TOML value when the text is one, else the text as a string.
fn override_value(raw: &str) -> toml::Value {
    format!("value = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("value"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ADMISSION_WORKERS_DEFAULT;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn refusal(pairs: &[(&str, &str)]) -> String {
        Config::load(None, env(pairs)).expect_err("refused").to_string()
    }

    #[test]
    fn the_default_config_is_valid_and_has_only_the_demo_caller() {
        let config = Config::load(None, Vec::new()).unwrap();
        assert_eq!(config.callers, vec![CallerConfig::demo()]);
        assert!(config.has_demo_caller());
        assert_eq!(config.store.kind, StoreKind::Embedded);
        assert_eq!(config.listen_addr().unwrap().to_string(), LISTEN_DEFAULT);
    }

    #[test]
    fn environment_overrides_reach_every_kind_of_field() {
        let config = Config::load(
            None,
            env(&[
                ("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
                ("IDEM__POLICY__LEASE_MS", "45000"),
                ("IDEM__STORE__KIND", "redis"),
                ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:7000"]"#),
                ("IDEM__STORE__REDIS__KEY_PREFIX", r#""123""#),
                ("IDEM__CARRIER__SIMULATOR__ERROR_RATE", "0.25"),
                (
                    "IDEM__CALLERS",
                    &format!(r#"[{{id = "a", token_sha256 = "{}"}}]"#, token_sha256("t")),
                ),
                ("UNRELATED", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(config.server.listen, "127.0.0.1:0");
        assert_eq!(config.policy.lease_ms(), 45_000);
        assert_eq!(config.store.kind, StoreKind::Redis);
        assert_eq!(config.store.redis.urls, vec!["redis://127.0.0.1:7000".to_owned()]);
        assert_eq!(config.store.redis.key_prefix, "123");
        assert_eq!(config.carrier.simulator.error_rate, 0.25);
        assert_eq!(config.callers[0].id, "a");
        assert!(!config.has_demo_caller());
    }

    #[test]
    fn admission_workers_default_to_half_the_postgres_pool_and_a_configured_number_wins() {
        let workers = |pairs: &[(&str, &str)]| Config::load(None, env(pairs)).unwrap().admission().workers();
        assert_eq!(workers(&[]), ADMISSION_WORKERS_DEFAULT);
        let redis = [
            ("IDEM__STORE__KIND", "redis"),
            ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:7000"]"#),
        ];
        assert_eq!(workers(&redis), ADMISSION_WORKERS_DEFAULT);
        let postgres = |extra: Option<(&'static str, &'static str)>| {
            let mut pairs = vec![
                ("IDEM__STORE__KIND", "postgres"),
                ("IDEM__STORE__POSTGRES__URL", "postgres://idem@127.0.0.1:5432/idem"),
            ];
            pairs.extend(extra);
            workers(&pairs)
        };
        assert_eq!(postgres(None), 8, "half the default pool of 16");
        assert_eq!(postgres(Some(("IDEM__STORE__POSTGRES__POOL_SIZE", "40"))), 20);
        assert_eq!(postgres(Some(("IDEM__STORE__POSTGRES__POOL_SIZE", "1"))), 1);
        assert_eq!(postgres(Some(("IDEM__SERVER__ADMISSION__WORKERS", "30"))), 30);
        assert!(refusal(&[("IDEM__SERVER__ADMISSION__WORKERS", "0")]).contains("server.admission.workers"));
    }

    #[test]
    fn prefer_wait_is_bounded_by_its_cap_and_the_request_budget() {
        let off = Config::load(None, env(&[("IDEM__SERVER__PREFER_WAIT_MAX_S", "0")])).unwrap();
        assert_eq!(off.server.prefer_wait_applied_max_s(), 0);
        let above_cap = format!("{}", idem_http::WAIT_CAP_S_MAX + 1);
        assert!(refusal(&[("IDEM__SERVER__PREFER_WAIT_MAX_S", &above_cap)]).contains("server.prefer_wait_max_s"));
        let at_budget = Config::load(
            None,
            env(&[
                ("IDEM__SERVER__PREFER_WAIT_MAX_S", "30"),
                ("IDEM__SERVER__REQUEST_TIMEOUT_MS", "30000"),
            ]),
        )
        .unwrap();
        assert_eq!(
            at_budget.server.prefer_wait_applied_max_s(),
            29,
            "a whole second under the budget"
        );
        let short_budget = Config::load(None, env(&[("IDEM__SERVER__REQUEST_TIMEOUT_MS", "300")])).unwrap();
        assert_eq!(
            short_budget.server.prefer_wait_applied_max_s(),
            0,
            "no whole second fits: no waiting"
        );
    }

    #[test]
    fn the_waiter_caps_are_read_from_the_environment_and_bounded() {
        let defaults = Config::load(None, Vec::new())
            .unwrap()
            .server
            .prefer_wait_limits()
            .unwrap();
        assert_eq!(
            (defaults.waiters_per_key_max(), defaults.waiters_per_instance_max()),
            (WAITERS_PER_KEY_MAX_DEFAULT, WAITERS_PER_INSTANCE_MAX_DEFAULT)
        );
        let configured = Config::load(
            None,
            env(&[
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "2"),
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "50"),
            ]),
        )
        .unwrap();
        let limits = configured.server.prefer_wait_limits().unwrap();
        assert_eq!(
            (limits.waiters_per_key_max(), limits.waiters_per_instance_max()),
            (2, 50)
        );
        let per_key = "server.prefer_wait_waiters_per_key_max";
        let per_instance = "server.prefer_wait_waiters_max";
        let above_key_limit = (PREFER_WAIT_WAITERS_PER_KEY_LIMIT + 1).to_string();
        let above_instance_limit = (PREFER_WAIT_WAITERS_LIMIT + 1).to_string();
        for (pairs, field) in [
            (vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "0")], per_key),
            (vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "0")], per_instance),
            (
                vec![
                    (
                        "IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX",
                        above_key_limit.as_str(),
                    ),
                    ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "100000"),
                ],
                per_key,
            ),
            (
                vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", above_instance_limit.as_str())],
                per_instance,
            ),
            // More per key than in the whole instance.
            (
                vec![
                    ("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "10"),
                    ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "9"),
                ],
                per_key,
            ),
        ] {
            let refused = refusal(&pairs);
            assert!(refused.contains(field), "{pairs:?}: {refused}");
        }
    }

    #[test]
    fn refusals_name_the_field() {
        assert!(refusal(&[("IDEM__SERVER__LISTN", "x")]).contains("listn"));
        assert!(refusal(&[("IDEM__SERVER__LISTEN", "nowhere")]).contains("server.listen"));
        assert!(refusal(&[("IDEM__STORE__KIND", "mongodb")]).contains("mongodb"));
        assert!(refusal(&[("IDEM__CALLERS", "[]")]).contains("callers"));
        assert!(refusal(&[("IDEM__CARRIER__SIMULATOR__ERROR_RATE", "2")]).contains("carrier.simulator.error_rate"));
        assert!(refusal(&[("IDEM__CARRIER__RETRIES_MAX", "11")]).contains("carrier.retries_max"));
        assert!(refusal(&[("IDEM__CARRIER__RETRY_BACKOFF_MS", "0")]).contains("carrier.retry_backoff_ms"));
        assert!(Config::load(None, env(&[("IDEM__CARRIER__RETRIES_MAX", "0")])).is_ok());
        assert!(refusal(&[("IDEM__STORE__KIND", "postgres")]).contains("store.postgres.url"));
        assert!(refusal(&[("IDEM__SWEEPER__BATCH_MAX", "0")]).contains("sweeper.batch_max"));
        assert!(
            refusal(&[("IDEM__STORE__EMBEDDED__MEMTABLE_BYTES", "1000")]).contains("store.embedded.memtable_bytes")
        );
        assert!(
            refusal(&[("IDEM__STORE__EMBEDDED__JOURNAL_BYTES_MAX", "1048576")])
                .contains("store.embedded.journal_bytes_max")
        );
    }

    /// The backends' sections are their store crates' own config types;
    /// a misspelt field is refused there too, the flattened ones (the
    /// embedded sizes, the Redis TLS files) included, and the fields only
    /// code sets (faults, WAIT, the idle-in-transaction timeout) are not in
    /// the file.
    #[test]
    fn backend_sections_refuse_unknown_fields() {
        for (variable, field) in [
            ("IDEM__STORE__EMBEDDED__CACHE_BYTE", "cache_byte"),
            ("IDEM__STORE__EMBEDDED__FAULTS", "faults"),
            ("IDEM__STORE__REDIS__CA_FIL", "ca_fil"),
            ("IDEM__STORE__REDIS__WAIT", "wait"),
            (
                "IDEM__STORE__POSTGRES__IDLE_IN_TRANSACTION_TIMEOUT_MS",
                "idle_in_transaction_timeout_ms",
            ),
            ("IDEM__STORE__FOUNDATIONDB__PREFIX", "prefix"),
        ] {
            let message = refusal(&[(variable, "1")]);
            assert!(message.contains(field), "{variable}: {message}");
        }
        let config = Config::load(
            None,
            env(&[
                ("IDEM__STORE__EMBEDDED__CACHE_BYTES", "2097152"),
                ("IDEM__STORE__EMBEDDED__DURABILITY", "sync_all"),
                ("IDEM__STORE__REDIS__CA_FILE", r#""""#),
                ("IDEM__STORE__POSTGRES__POOL_WAIT_TIMEOUT_MS", "250"),
                ("IDEM__STORE__FOUNDATIONDB__KEY_PREFIX", "app"),
                ("IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE", r#""""#),
            ]),
        )
        .unwrap();
        assert_eq!(config.store.embedded.sizes.cache_bytes, 2_097_152);
        assert_eq!(config.store.embedded.durability, store_fdb::Durability::SyncAll);
        assert_eq!(config.store.redis.tls.ca_file, None, "an empty file name is unset");
        assert_eq!(config.store.postgres.pool_wait_timeout_ms, 250);
        assert_eq!(
            config.store.foundationdb.prefix,
            store_fdb::KeyPrefix::Bytes(b"app".to_vec())
        );
        assert_eq!(config.store.foundationdb.cluster_file, None);
    }

    #[test]
    fn every_store_kind_is_named_once() {
        for kind in StoreKind::ALL {
            assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
            let config = Config::load(None, env(&[("IDEM__STORE__KIND", kind.name())]));
            // Every name is a config value; some kinds need more settings.
            if let Err(error) = config {
                assert!(!error.to_string().contains("unknown variant"), "{kind}: {error}");
            }
        }
        assert!(
            StoreKind::SELF_STARTED
                .iter()
                .all(|kind| kind.cargo_feature().is_none())
        );
    }

    #[test]
    fn memory_records_keep_labels_apart_like_redis() {
        let memory = ("IDEM__STORE__KIND", "memory");
        let config = Config::load(None, env(&[memory])).unwrap();
        assert_eq!(config.store.labels_kind(), LabelsKind::Embedded);
        let with_records = refusal(&[memory, ("IDEM__STORE__LABELS", "with_records")]);
        assert!(with_records.contains("store.labels"), "{with_records}");
    }

    #[test]
    fn labels_go_only_where_a_team_would_put_them() {
        let redis = ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:6379"]"#);
        let postgres = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@127.0.0.1/idem");
        let with = |pairs: &[(&str, &str)]| Config::load(None, env(pairs)).map(|config| config.store.labels_kind());
        assert_eq!(with(&[]).unwrap(), LabelsKind::WithRecords);
        assert_eq!(
            with(&[("IDEM__STORE__KIND", "redis"), redis]).unwrap(),
            LabelsKind::Embedded
        );
        let split = [
            ("IDEM__STORE__KIND", "redis"),
            ("IDEM__STORE__LABELS", "postgres"),
            redis,
            postgres,
        ];
        assert_eq!(with(&split).unwrap(), LabelsKind::Postgres);
        // Labels in PostgreSQL need its URL; labels apart from records that
        // could hold them in one transaction are refused.
        let no_url = refusal(&[
            ("IDEM__STORE__KIND", "redis"),
            ("IDEM__STORE__LABELS", "postgres"),
            redis,
        ]);
        assert!(no_url.contains("store.postgres.url"), "{no_url}");
        let apart = refusal(&[("IDEM__STORE__LABELS", "postgres"), postgres]);
        assert!(apart.contains("store.labels"), "{apart}");
        let redis_with_records = refusal(&[
            ("IDEM__STORE__KIND", "redis"),
            ("IDEM__STORE__LABELS", "with_records"),
            redis,
        ]);
        assert!(redis_with_records.contains("store.labels"), "{redis_with_records}");
    }

    #[test]
    fn a_lease_not_longer_than_the_carrier_timeout_is_refused() {
        let message = refusal(&[
            ("IDEM__POLICY__LEASE_MS", "20000"),
            ("IDEM__CARRIER__TIMEOUT_MS", "20000"),
        ]);
        assert!(message.contains("policy.lease_ms"), "{message}");
        assert!(Config::load(None, env(&[("IDEM__POLICY__LEASE_MS", "20001")])).is_ok());
    }

    #[test]
    fn caller_tokens_must_be_digests_and_distinct() {
        let bad = r#"[{id = "a", token_sha256 = "demo-token"}]"#;
        assert!(refusal(&[("IDEM__CALLERS", bad)]).contains("callers.token_sha256"));
        let twice = format!(
            r#"[{{id = "a", token_sha256 = "{0}"}}, {{id = "b", token_sha256 = "{0}"}}]"#,
            token_sha256("same")
        );
        assert!(refusal(&[("IDEM__CALLERS", &twice)]).contains("appears twice"));
        // A token being rotated out is a digest like the current one, and
        // no other caller's.
        let retiring_twice = format!(
            r#"[{{id = "a", token_sha256 = "{0}"}}, {{id = "b", token_sha256 = "{1}", retiring_token_sha256 = ["{0}"]}}]"#,
            token_sha256("one"),
            token_sha256("two")
        );
        assert!(refusal(&[("IDEM__CALLERS", &retiring_twice)]).contains("appears twice"));
        let retiring_bad = format!(
            r#"[{{id = "a", token_sha256 = "{}", retiring_token_sha256 = ["x"]}}]"#,
            token_sha256("one")
        );
        assert!(refusal(&[("IDEM__CALLERS", &retiring_bad)]).contains("callers.token_sha256"));
    }

    #[test]
    fn tls_settings_that_contradict_each_other_are_refused() {
        // Inbound: both files or neither.
        assert!(refusal(&[("IDEM__SERVER__TLS__CERT_FILE", "/etc/idem/cert.pem")]).contains("server.tls.key_file"));
        assert!(refusal(&[("IDEM__SERVER__TLS__KEY_FILE", "/etc/idem/key.pem")]).contains("server.tls.cert_file"));
        assert!(
            refusal(&[("IDEM__SERVER__TLS__HANDSHAKE_TIMEOUT_MS", "0")]).contains("server.tls.handshake_timeout_ms")
        );
        // Redis: TLS files with redis:// URLs, mixed schemes, a certificate without its key.
        let redis = ("IDEM__STORE__KIND", "redis");
        let plain_url = ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:6379"]"#);
        let tls_url = ("IDEM__STORE__REDIS__URLS", r#"["rediss://127.0.0.1:6379"]"#);
        let ca = ("IDEM__STORE__REDIS__CA_FILE", "/etc/idem/redis-ca.pem");
        assert!(refusal(&[redis, plain_url, ca]).contains("store.redis.ca_file"));
        let mixed = (
            "IDEM__STORE__REDIS__URLS",
            r#"["rediss://127.0.0.1:1", "redis://127.0.0.1:2"]"#,
        );
        assert!(refusal(&[redis, mixed, ("IDEM__STORE__REDIS__CLUSTER", "true")]).contains("store.redis.urls"));
        let cert_only = ("IDEM__STORE__REDIS__CLIENT_CERT_FILE", "/etc/idem/client.pem");
        assert!(refusal(&[redis, tls_url, ca, cert_only]).contains("store.redis.client_key_file"));
        assert!(Config::load(None, env(&[redis, tls_url, ca])).is_ok());
        // PostgreSQL: sslmode in one place, a CA file exactly when it is TLS.
        let postgres = ("IDEM__STORE__KIND", "postgres");
        let url = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@db/idem");
        let url_sslmode = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@db/idem?sslmode=require");
        assert!(refusal(&[postgres, url_sslmode]).contains("store.postgres.url"));
        let verify_full = ("IDEM__STORE__POSTGRES__SSLMODE", "verify-full");
        let pg_ca = ("IDEM__STORE__POSTGRES__CA_FILE", "/etc/idem/pg-ca.pem");
        assert!(refusal(&[postgres, url, verify_full]).contains("store.postgres.ca_file"));
        assert!(refusal(&[postgres, url, pg_ca]).contains("store.postgres.ca_file"));
        assert!(refusal(&[postgres, url, ("IDEM__STORE__POSTGRES__SSLMODE", "verify-ca")]).contains("verify-ca"));
        let config = Config::load(None, env(&[postgres, url, verify_full, pg_ca])).unwrap();
        assert_eq!(config.store.postgres.ssl_mode, SslMode::VerifyFull);
        // Carrier: https:// is allowed, its CA file only with https://.
        let https = ("IDEM__CARRIER__URL", "https://carrier.example");
        let carrier_ca = ("IDEM__CARRIER__CA_FILE", "/etc/idem/carrier-ca.pem");
        assert!(Config::load(None, env(&[https, carrier_ca])).is_ok());
        assert!(refusal(&[carrier_ca]).contains("carrier.ca_file"));
        assert!(refusal(&[("IDEM__CARRIER__URL", "ftp://carrier")]).contains("carrier.url"));
    }

    #[test]
    fn the_example_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml");
        let config = Config::load(Some(&path), Vec::new()).unwrap();
        assert_eq!(config.store.kind, StoreKind::Embedded);
        // The waiter caps it shows are the defaults it says they are.
        let defaults = ServerConfig::default();
        assert_eq!(
            (
                config.server.prefer_wait_waiters_per_key_max,
                config.server.prefer_wait_waiters_max
            ),
            (
                defaults.prefer_wait_waiters_per_key_max,
                defaults.prefer_wait_waiters_max
            )
        );
    }

    /// The fleet configs DEPLOYMENT.md shows are configs the server takes.
    #[test]
    fn the_deployment_examples_load() {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        for (file, kind, labels) in [
            ("fleet-postgres.toml", StoreKind::Postgres, LabelsKind::WithRecords),
            ("fleet-redis-postgres.toml", StoreKind::Redis, LabelsKind::Postgres),
            (
                "fleet-foundationdb.toml",
                StoreKind::Foundationdb,
                LabelsKind::WithRecords,
            ),
        ] {
            let config =
                Config::load(Some(&deploy.join(file)), Vec::new()).unwrap_or_else(|error| panic!("{file}: {error}"));
            assert_eq!(
                (config.store.kind, config.store.labels_kind()),
                (kind, labels),
                "{file}"
            );
            assert!(!config.has_demo_caller(), "{file} keeps the public demo caller");
        }
    }
}
