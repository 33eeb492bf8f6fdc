//! Connection settings, their named defaults and limits, and the pool they build.

use crate::tls::{TlsError, tls_connector};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::Deserialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;
use store_core::config_fields::empty_as_none;
use tokio_postgres::NoTls;

/// How a connection outside the pool (the change listener) connects: as
/// the pool's do.
#[derive(Clone)]
pub(crate) enum ListenerTls {
    Plain,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// How the store's connections plan their prepared statements
/// (`driver_config` says why; PostgreSQL 12 or later).
pub const PLAN_CACHE_MODE: &str = "force_generic_plan";
/// Connections the pool keeps open at most. Chosen by measurement: 48
/// connections gave a worse p99 than 16 at 1,000/s over HTTP on 2 cores
/// (BENCHMARKS.md, "The PostgreSQL pool size").
pub const POOL_SIZE_DEFAULT: usize = 16;
/// Largest pool accepted; PostgreSQL's own default `max_connections` is 100.
pub const POOL_SIZE_MAX: usize = 1_000;
/// How long opening one connection (TCP connect and startup) may take.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// How long a call waits for a free pooled connection before giving up.
pub const POOL_WAIT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Server-side limit on one statement, lock waits included.
pub const STATEMENT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Server-side limit on a transaction sitting idle, so a client that vanished
/// mid-transaction does not hold a row lock for long.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Client-side limit on one transaction attempt, for when the server or the
/// network stops answering altogether and no server-side timeout can fire.
pub const OPERATION_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest any of the timeouts above may be set to.
pub const TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;
/// Claims (and, separately, completions) in one batch at most, by default
/// (`claim_batch.rs`, `completion_batch.rs`). Batches grow only while calls
/// arrive faster than one batch's round trip and commit, so the bound
/// matters under load alone.
pub const BATCH_ITEMS_MAX_DEFAULT: usize = 64;
/// Largest batch size accepted (store-core's bound on any batch).
pub const BATCH_ITEMS_MAX: usize = store_core::batch::BATCH_ITEMS_MAX;
/// Claim batches (and, separately, completion batches) in flight at once,
/// by default: each holds one pooled connection for its round trip and
/// commit (store-core's `batch` module says why few).
pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 2;
/// Most batches in flight accepted (store-core's bound).
pub const BATCHES_IN_FLIGHT_MAX: usize = store_core::batch::BATCHES_IN_FLIGHT_MAX;

/// Whether the connection is TLS and what it checks. libpq's names; set in
/// [`PostgresConfig::ssl_mode`], never in the URL (a URL that carries
/// `sslmode` is refused, so there is one place that says it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP (a database on loopback or a private network).
    #[default]
    Disable,
    /// TLS; the server's certificate must chain to the CA file, its host
    /// name is not checked (libpq's `require` with a root certificate, i.e.
    /// `verify-ca`): for a server reached by an address its certificate
    /// does not name. Unlike libpq without a root certificate, the chain is
    /// always checked: an unverified TLS connection is not offered.
    Require,
    /// TLS; the certificate must chain to the CA file and name the host
    /// the URL connects to.
    VerifyFull,
}

impl SslMode {
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the database is and how long to wait for it. The server reads it
/// from its config's `[store.postgres]` section (`sslmode` there, `ca_file`
/// empty meaning unset); the idle-in-transaction timeout keeps its default
/// there (code may set it).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// A libpq-style URL or key=value string, e.g.
    /// `postgres://idem@127.0.0.1:5432/idem`.
    pub url: String,
    pub pool_size: usize,
    pub connect_timeout_ms: u64,
    /// How long a call waits for a free pooled connection.
    pub pool_wait_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    #[serde(skip)]
    pub idle_in_transaction_timeout_ms: u64,
    pub operation_timeout_ms: u64,
    #[serde(rename = "sslmode")]
    pub ssl_mode: SslMode,
    /// The PEM CA that signed the server's certificate; required with TLS.
    #[serde(deserialize_with = "empty_as_none")]
    pub ca_file: Option<PathBuf>,
    /// Claims (and, separately, completions) sent together in one batch
    /// at most: those that arrive while a batch is in flight go in the next
    /// one. 1 turns batching off (each is its own statement).
    pub batch_items_max: usize,
    /// Claim batches, and separately completion batches, running at once
    /// at most; each holds a pooled connection while it runs.
    pub batches_in_flight_max: usize,
}

/// No URL (the server's config refuses `store.kind = "postgres"` without
/// one), every other setting at its named default.
impl Default for PostgresConfig {
    fn default() -> Self {
        Self::new(String::new())
    }
}

/// Why a [`PostgresConfig`] was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("database url is not valid: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("pool size {0} is outside 1..={POOL_SIZE_MAX}")]
    PoolSize(usize),
    #[error("batch_items_max {0} is outside 1..={BATCH_ITEMS_MAX}")]
    BatchItems(usize),
    #[error("batches_in_flight_max {0} is outside 1..={BATCHES_IN_FLIGHT_MAX}")]
    BatchesInFlight(usize),
    #[error("{name} is {value} ms; it must be between 1 and {TIMEOUT_MS_MAX}")]
    Timeout { name: &'static str, value: u64 },
    #[error("connection pool could not be built: {0}")]
    Pool(String),
    #[error(
        "the database url sets sslmode; set it in the store's sslmode setting instead (disable, require or verify-full), so one place says it"
    )]
    SslModeInUrl,
    #[error("sslmode {} needs a CA file (the CA that signed the server's certificate)", .0.name())]
    CaFileRequired(SslMode),
    #[error("a CA file is set but sslmode is disable: the CA would never be used; set sslmode require or verify-full")]
    CaFileWithoutTls,
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl PostgresConfig {
    /// A config for `url` with every other setting at its named default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: POOL_SIZE_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            pool_wait_timeout_ms: POOL_WAIT_TIMEOUT_MS_DEFAULT,
            statement_timeout_ms: STATEMENT_TIMEOUT_MS_DEFAULT,
            idle_in_transaction_timeout_ms: IDLE_IN_TRANSACTION_TIMEOUT_MS_DEFAULT,
            operation_timeout_ms: OPERATION_TIMEOUT_MS_DEFAULT,
            ssl_mode: SslMode::Disable,
            ca_file: None,
            batch_items_max: BATCH_ITEMS_MAX_DEFAULT,
            batches_in_flight_max: BATCHES_IN_FLIGHT_DEFAULT,
        }
    }

    pub(crate) fn operation_timeout(&self) -> Duration {
        Duration::from_millis(self.operation_timeout_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_tls()?;
        if !(1..=POOL_SIZE_MAX).contains(&self.pool_size) {
            return Err(ConfigError::PoolSize(self.pool_size));
        }
        if !(1..=BATCH_ITEMS_MAX).contains(&self.batch_items_max) {
            return Err(ConfigError::BatchItems(self.batch_items_max));
        }
        if !(1..=BATCHES_IN_FLIGHT_MAX).contains(&self.batches_in_flight_max) {
            return Err(ConfigError::BatchesInFlight(self.batches_in_flight_max));
        }
        let timeouts = [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("pool_wait_timeout_ms", self.pool_wait_timeout_ms),
            ("statement_timeout_ms", self.statement_timeout_ms),
            ("idle_in_transaction_timeout_ms", self.idle_in_transaction_timeout_ms),
            ("operation_timeout_ms", self.operation_timeout_ms),
        ];
        match timeouts
            .into_iter()
            .find(|(_, value)| !(1..=TIMEOUT_MS_MAX).contains(value))
        {
            Some((name, value)) => Err(ConfigError::Timeout { name, value }),
            None => Ok(()),
        }
    }

    /// The TLS settings agree with each other and with the URL.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.url.contains("sslmode") {
            return Err(ConfigError::SslModeInUrl);
        }
        match (self.ssl_mode, &self.ca_file) {
            (SslMode::Disable, Some(_)) => Err(ConfigError::CaFileWithoutTls),
            (SslMode::Require | SslMode::VerifyFull, None) => Err(ConfigError::CaFileRequired(self.ssl_mode)),
            _ => Ok(()),
        }
    }

    /// The driver's config: the URL plus our timeouts and plan cache mode.
    /// The server-side settings travel as startup options, appended to any
    /// the URL carries.
    ///
    /// `plan_cache_mode = force_generic_plan`: every statement of the store
    /// is prepared once per connection and looks rows up by key, so one
    /// generic plan (an index probe) serves every execution. Left to choose,
    /// PostgreSQL planned most executions again as custom plans, a fifth of
    /// its CPU per request at 1,000/s (BENCHMARKS.md). `tests/plans.rs`
    /// checks that the generic plans probe the primary keys.
    fn driver_config(&self) -> Result<tokio_postgres::Config, ConfigError> {
        let mut config: tokio_postgres::Config = self.url.parse().map_err(ConfigError::Url)?;
        let options = format!(
            "{} -c statement_timeout={} -c idle_in_transaction_session_timeout={} -c plan_cache_mode={PLAN_CACHE_MODE}",
            config.get_options().unwrap_or_default(),
            self.statement_timeout_ms,
            self.idle_in_transaction_timeout_ms,
        );
        // Set whatever the mode: the driver's own default is `prefer`, which
        // would try TLS whenever a connector is given and the server offers it.
        let driver_ssl_mode = match self.ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        };
        config
            .ssl_mode(driver_ssl_mode)
            .options(options.trim_start())
            .connect_timeout(Duration::from_millis(self.connect_timeout_ms))
            .application_name("idem");
        Ok(config)
    }

    /// The driver settings and the TLS connector of the store's change
    /// listener (`notify.rs`): the pool's, for a connection of its own.
    pub(crate) fn listener_config(&self) -> Result<(tokio_postgres::Config, ListenerTls), ConfigError> {
        let tls = match (&self.ca_file, self.ssl_mode) {
            (Some(ca_file), SslMode::Require | SslMode::VerifyFull) => {
                ListenerTls::Rustls(tls_connector(ca_file, self.ssl_mode)?)
            }
            _ => ListenerTls::Plain,
        };
        Ok((self.driver_config()?, tls))
    }

    /// Builds the pool. No connection is opened until the first call, so a
    /// database that is down at startup surfaces as retryable errors later,
    /// not as a failure here; the CA file, though, is read and parsed here.
    pub(crate) fn build_pool(&self) -> Result<Pool, ConfigError> {
        self.validate()?;
        let manager_config = ManagerConfig {
            // A cheap liveness check on checkout; broken connections are
            // reported as closed by the driver and replaced.
            recycling_method: RecyclingMethod::Fast,
        };
        let driver_config = self.driver_config()?;
        let manager = match (&self.ca_file, self.ssl_mode) {
            (Some(ca_file), SslMode::Require | SslMode::VerifyFull) => {
                Manager::from_config(driver_config, tls_connector(ca_file, self.ssl_mode)?, manager_config)
            }
            _ => Manager::from_config(driver_config, NoTls, manager_config),
        };
        let connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_millis(self.pool_wait_timeout_ms)))
            .create_timeout(Some(connect_timeout))
            .recycle_timeout(Some(connect_timeout))
            .build()
            .map_err(|error| ConfigError::Pool(error.to_string()))
    }
}

impl fmt::Debug for PostgresConfig {
    /// The URL may carry a password, and configs end up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact_password(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("pool_wait_timeout_ms", &self.pool_wait_timeout_ms)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .field("idle_in_transaction_timeout_ms", &self.idle_in_transaction_timeout_ms)
            .field("operation_timeout_ms", &self.operation_timeout_ms)
            .field("ssl_mode", &self.ssl_mode)
            .field("ca_file", &self.ca_file)
            .field("batch_items_max", &self.batch_items_max)
            .field("batches_in_flight_max", &self.batches_in_flight_max)
            .finish()
    }
}

/// `postgres://user:secret@host/db` becomes `postgres://user:***@host/db`;
/// a string with a `password=` parameter anywhere is hidden whole.
fn redact_password(url: &str) -> String {
    if url.contains("password=") {
        return "<connection string with a password>".to_owned();
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@')
            && let Some(colon) = rest[..at].find(':')
        {
            return format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]);
        }
    }
    url.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_the_debug_form() {
        let config = PostgresConfig::new("postgres://idem:s3cret@db.internal:5432/idem");
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://idem:***@db.internal:5432/idem"), "{shown}");
        let keyword = format!("{:?}", PostgresConfig::new("host=db user=idem password=s3cret"));
        assert!(!keyword.contains("s3cret"), "{keyword}");
        assert!(format!("{:?}", PostgresConfig::new("postgres://idem@db/idem")).contains("idem@db"));
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        let mut config = PostgresConfig::new("postgres://idem@127.0.0.1/idem");
        assert!(config.validate().is_ok());
        config.pool_size = 0;
        assert!(matches!(config.validate(), Err(ConfigError::PoolSize(0))));
        config.pool_size = POOL_SIZE_DEFAULT;
        config.batches_in_flight_max = 0;
        assert!(matches!(config.validate(), Err(ConfigError::BatchesInFlight(0))));
        config.batches_in_flight_max = BATCHES_IN_FLIGHT_MAX + 1;
        assert!(config.validate().is_err());
        config.batches_in_flight_max = BATCHES_IN_FLIGHT_DEFAULT;
        config.statement_timeout_ms = 0;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Timeout {
                name: "statement_timeout_ms",
                ..
            })
        ));
        config.statement_timeout_ms = TIMEOUT_MS_MAX + 1;
        assert!(config.build_pool().is_err());
        config.statement_timeout_ms = STATEMENT_TIMEOUT_MS_DEFAULT;
        config.batch_items_max = 0;
        assert!(matches!(config.validate(), Err(ConfigError::BatchItems(0))));
        config.batch_items_max = BATCH_ITEMS_MAX + 1;
        assert!(matches!(config.validate(), Err(ConfigError::BatchItems(_))));
        config.batch_items_max = 1;
        assert!(config.validate().is_ok(), "1 is no batching, not an error");
    }

    #[test]
    fn tls_settings_must_agree() {
        let ca_file = Some(PathBuf::from("/etc/idem/postgres-ca.pem"));
        let mut config = PostgresConfig::new("postgres://idem@127.0.0.1/idem?sslmode=require");
        assert!(matches!(config.validate(), Err(ConfigError::SslModeInUrl)));
        config.url = "postgres://idem@127.0.0.1/idem".to_owned();
        config.ssl_mode = SslMode::VerifyFull;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::CaFileRequired(SslMode::VerifyFull))
        ));
        config.ca_file = ca_file;
        assert!(config.validate().is_ok());
        config.ssl_mode = SslMode::Disable;
        assert!(matches!(config.validate(), Err(ConfigError::CaFileWithoutTls)));
        // The CA file is read when the pool is built: a missing one is refused there.
        config.ssl_mode = SslMode::Require;
        let missing = config
            .build_pool()
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default();
        assert!(missing.contains("PostgreSQL TLS: cannot read the CA file"), "{missing}");
    }

    #[test]
    fn url_options_are_kept_and_timeouts_appended() {
        let mut config = PostgresConfig::new("postgres://idem@127.0.0.1/idem?options=-c%20search_path%3Dx");
        config.statement_timeout_ms = 1_234;
        let driver = config.driver_config().expect("valid url");
        let options = driver.get_options().unwrap_or_default();
        assert!(options.starts_with("-c search_path=x"), "{options}");
        assert!(options.contains("-c statement_timeout=1234"), "{options}");
        assert!(options.contains("-c plan_cache_mode=force_generic_plan"), "{options}");
        assert!(matches!(
            PostgresConfig::new("postgres://[::1").driver_config(),
            Err(ConfigError::Url(_))
        ));
    }
}
