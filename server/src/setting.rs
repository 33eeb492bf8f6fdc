//! What every section of the configuration shares: the refusal type,
//! which always names the field, and the range check. The sections
//! themselves live in the modules that own their settings (`config.rs`
//! only loads and assembles them), and import this from below.

use std::path::PathBuf;

/// `Retry-After` for store outages and overload, in seconds.
pub const RETRY_AFTER_S_DEFAULT: u64 = 1;

/// Longest `Retry-After` the config may set, in seconds.
pub const RETRY_AFTER_S_MAX: u64 = 3_600;

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

/// The store registry's refusal of a `[store]` field, as it is.
impl From<store_registry::FieldError> for ConfigError {
    fn from(error: store_registry::FieldError) -> Self {
        ConfigError::Field {
            field: error.field,
            message: error.message,
        }
    }
}

/// A refusal of `field`.
pub fn field_error(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        message: message.into(),
    }
}

/// Refuses `value` outside `min..=max`, naming `field`.
pub fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(field_error(field, format!("{value} is outside {min}..={max}")))
    }
}
