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

use crate::admission::{AdmissionConfig, workers_for_postgres_pool};
use crate::auth::{CallerConfig, DEMO_CALLER_ID, DEMO_TOKEN, has_demo_caller, validate_callers};
use crate::carrier::CarrierConfig;
use crate::serving::ServerConfig;
use crate::setting::field_error;
use crate::sweeper::SweeperConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use store_core::Policy;
use store_core::redact::redact_secrets;
use store_registry::StoreConfig;

/// The refusal of a configuration, which names the field.
pub use crate::setting::ConfigError;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "IDEM__";
/// Separator between the parts of a field path in a variable name.
pub const ENV_SEPARATOR: &str = "__";

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

    /// True when the development caller's token is accepted.
    pub fn has_demo_caller(&self) -> bool {
        has_demo_caller(&self.callers)
    }

    /// Checks every field; the first refusal names its field.
    /// Each section is checked by the module that owns it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        self.admission().validate()?;
        self.server.validate()?;
        self.server.tls.validate()?;
        validate_callers(&self.callers)?;
        self.check_listener_address(self.listen_addr()?)?;
        self.carrier.validate(&self.policy)?;
        self.sweeper.validate()?;
        Ok(self.store.validate()?)
    }

    /// `[server.admission]` with the store's own default number of workers
    /// where none is configured: half the pool in front of PostgreSQL when
    /// its writes are not batched ([`StoreConfig::unbatched_records_pool_size`]).
    pub fn admission(&self) -> AdmissionConfig {
        AdmissionConfig {
            workers: self
                .server
                .admission
                .workers
                .or(self.store.unbatched_records_pool_size().map(workers_for_postgres_pool)),
            ..self.server.admission
        }
    }

    /// What only a loopback listener may serve: the development caller
    /// (unless flagged) and the in-process carrier simulator. Checked on
    /// `server.listen` with the config, and again on the address of the
    /// listener the app is given (embedding code may bind its own).
    pub fn check_listener_address(&self, address: SocketAddr) -> Result<(), ConfigError> {
        self.check_demo_caller_address(address)?;
        self.carrier.check_listener_address(address)
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
                 [[callers]] with your own token digests, the demo token's in neither token_sha256 nor \
                 retiring_token_sha256, or set this flag to true to run anyway"
            ),
        ))
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
mod tests;
