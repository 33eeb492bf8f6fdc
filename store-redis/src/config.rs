//! How to reach Redis and how careful to be with it.
//!
//! Every limit is a named constant; [`RedisConfig::validate`] checks them all
//! before a connection is made, so a bad setting is refused at startup with a
//! message that names it.

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use store_core::config_fields::empty_as_none;
use store_core::redact::redact_secrets;

/// Default time the client waits for one reply before reporting the store
/// unavailable. redis-rs 1.x would use 500 ms; this is set explicitly so that
/// a 1 MiB replay on a busy server does not time out.
pub const RESPONSE_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Longest response timeout accepted.
pub const RESPONSE_TIMEOUT_MS_MAX: u64 = 60_000;
/// How much longer than a `WAIT` timeout the response timeout must be, so the
/// client never gives up on a `WAIT` that the server is still allowed to run.
pub const RESPONSE_TIMEOUT_MARGIN_MS: u64 = 500;
/// Default time allowed for opening one connection.
pub const CONNECTION_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Longest connection timeout accepted.
pub const CONNECTION_TIMEOUT_MS_MAX: u64 = 30_000;
/// Longest `WAIT` timeout accepted. Zero is refused: to Redis it means "wait forever".
pub const WAIT_TIMEOUT_MS_MAX: u64 = 10_000;
/// Most replicas a `WAIT` may ask for.
pub const WAIT_REPLICAS_MAX: u32 = 16;
/// Longest key prefix, in bytes.
pub const KEY_PREFIX_BYTES_MAX: usize = 64;
/// Default key prefix.
pub const KEY_PREFIX_DEFAULT: &str = "idem:";
/// Most server addresses one configuration may list.
pub const URLS_COUNT_MAX: usize = 64;
/// Claim scripts in one pipeline at most, by default (`batch.rs`, on a
/// standalone server). Batches grow only while claims arrive faster than
/// one pipeline's round trip, so the bound matters under load alone.
pub const BATCH_ITEMS_MAX_DEFAULT: usize = 64;
/// Largest batch size accepted (store-core's bound on any batch).
pub const BATCH_ITEMS_MAX: usize = store_core::batch::BATCH_ITEMS_MAX;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no Redis URL is configured")]
    NoUrls,
    #[error("batch_items_max {0} is outside 1..={BATCH_ITEMS_MAX}")]
    BatchItems(usize),
    #[error("{count} Redis URLs are configured; at most {URLS_COUNT_MAX}")]
    TooManyUrls { count: usize },
    #[error("a standalone Redis takes exactly one URL, {count} are configured; set cluster for Redis Cluster")]
    StandaloneNeedsOneUrl { count: usize },
    #[error("key prefix must be at most {KEY_PREFIX_BYTES_MAX} bytes of printable ASCII without spaces, '{{' or '}}'")]
    KeyPrefix,
    #[error("response timeout must be between 1 and {RESPONSE_TIMEOUT_MS_MAX} ms")]
    ResponseTimeout,
    #[error("connection timeout must be between 1 and {CONNECTION_TIMEOUT_MS_MAX} ms")]
    ConnectionTimeout,
    #[error("WAIT needs 1 to {WAIT_REPLICAS_MAX} replicas and a timeout of 1 to {WAIT_TIMEOUT_MS_MAX} ms")]
    Wait,
    #[error("the Redis URLs mix redis:// and rediss://; every node of one deployment speaks TLS or none does")]
    MixedSchemes,
    #[error("TLS files (CA, client certificate) are configured but the URLs are redis://; use rediss:// for TLS")]
    TlsFilesWithoutRediss,
    #[error("a client certificate needs its key and a key its certificate: set both files or neither")]
    ClientCertificateWithoutKey,
    #[error("rediss://...#insecure (no certificate verification) is refused; trust the server's CA with a CA file")]
    InsecureTls,
    #[error(
        "response timeout {response_timeout_ms} ms must exceed the WAIT timeout {wait_timeout_ms} ms by at least {RESPONSE_TIMEOUT_MARGIN_MS} ms"
    )]
    ResponseTimeoutBelowWait {
        response_timeout_ms: u64,
        wait_timeout_ms: u64,
    },
}

/// `WAIT numreplicas timeout` after each successful write.
///
/// WAIT makes a write more likely to survive a failover; it does not make
/// Redis strongly consistent (see LIMITS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitConfig {
    pub replicas: u32,
    pub timeout_ms: u64,
}

/// The scheme of a Redis URL that speaks TLS.
pub const TLS_SCHEME: &str = "rediss://";

/// Certificates for `rediss://` URLs, as PEM files. Read and parsed when
/// the store connects, so a missing or malformed file is a startup error.
/// In a config file they sit beside the URLs, empty meaning unset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RedisTls {
    /// The CA that signed the servers' certificates. `None`: the operating
    /// system's trust store (rustls-native-certs).
    #[serde(deserialize_with = "empty_as_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate for servers that ask for one
    /// (`tls-auth-clients yes`), with its private key.
    #[serde(deserialize_with = "empty_as_none")]
    pub client_cert_file: Option<PathBuf>,
    #[serde(deserialize_with = "empty_as_none")]
    pub client_key_file: Option<PathBuf>,
}

impl RedisTls {
    fn has_files(&self) -> bool {
        self.ca_file.is_some() || self.client_cert_file.is_some() || self.client_key_file.is_some()
    }
}

/// Everything the Redis backend needs besides the [`store_core::Policy`].
/// The server reads it from its config's `[store.redis]` section (the TLS
/// files flat beside the URLs; `wait` is for code only). `Debug` by hand:
/// the URLs may carry passwords.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://host:port` addresses (`rediss://` for TLS). One for a
    /// standalone server; for a cluster, any nodes to learn the topology from.
    pub urls: Vec<String>,
    /// Certificates for `rediss://` URLs. serde's `flatten` with
    /// `deny_unknown_fields` works for one flattened struct of plain
    /// fields, as here.
    #[serde(flatten)]
    pub tls: RedisTls,
    /// Talk the Redis Cluster protocol.
    pub cluster: bool,
    /// Prepended to every key this store writes.
    pub key_prefix: String,
    /// How long to wait for one reply.
    pub response_timeout_ms: u64,
    /// How long to wait for one connection to open.
    pub connection_timeout_ms: u64,
    /// Optional `WAIT` after each successful write.
    #[serde(skip)]
    pub wait: Option<WaitConfig>,
    /// Run on a server whose `maxmemory-policy` may evict keys. Evicted
    /// records are forgotten keys and so duplicate effects: off by default.
    pub accept_eviction: bool,
    /// Claim scripts sent together in one pipeline at most, on a
    /// standalone server: the claims that arrive while a pipeline is in
    /// flight go in the next one. 1 turns batching off. Redis Cluster never
    /// batches (a pipeline must stay in one slot).
    pub batch_items_max: usize,
}

/// No URL (the server's config refuses `store.kind = "redis"` without
/// one), every other setting at its default.
impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            ..Self::standalone(String::new())
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| redact_secrets(url)).collect();
        formatter
            .debug_struct("RedisConfig")
            .field("urls", &urls)
            .field("tls", &self.tls)
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("response_timeout_ms", &self.response_timeout_ms)
            .field("connection_timeout_ms", &self.connection_timeout_ms)
            .field("wait", &self.wait)
            .field("accept_eviction", &self.accept_eviction)
            .field("batch_items_max", &self.batch_items_max)
            .finish()
    }
}

impl RedisConfig {
    /// A standalone server at `url`, with every other setting at its default.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            tls: RedisTls::default(),
            cluster: false,
            key_prefix: KEY_PREFIX_DEFAULT.to_owned(),
            response_timeout_ms: RESPONSE_TIMEOUT_MS_DEFAULT,
            connection_timeout_ms: CONNECTION_TIMEOUT_MS_DEFAULT,
            wait: None,
            accept_eviction: false,
            batch_items_max: BATCH_ITEMS_MAX_DEFAULT,
        }
    }

    /// A Redis Cluster reachable through `urls`, with every other setting at its default.
    pub fn cluster(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            ..Self::standalone(String::new())
        }
    }

    /// Checks every limit; the URLs themselves are parsed by the client.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_urls()?;
        self.validate_tls()?;
        if !key_prefix_is_valid(&self.key_prefix) {
            return Err(ConfigError::KeyPrefix);
        }
        if !(1..=RESPONSE_TIMEOUT_MS_MAX).contains(&self.response_timeout_ms) {
            return Err(ConfigError::ResponseTimeout);
        }
        if !(1..=CONNECTION_TIMEOUT_MS_MAX).contains(&self.connection_timeout_ms) {
            return Err(ConfigError::ConnectionTimeout);
        }
        if !(1..=BATCH_ITEMS_MAX).contains(&self.batch_items_max) {
            return Err(ConfigError::BatchItems(self.batch_items_max));
        }
        if let Some(wait) = self.wait {
            self.validate_wait(wait)?;
        }
        Ok(())
    }

    fn validate_urls(&self) -> Result<(), ConfigError> {
        let count = self.urls.len();
        if count == 0 {
            return Err(ConfigError::NoUrls);
        }
        if count > URLS_COUNT_MAX {
            return Err(ConfigError::TooManyUrls { count });
        }
        if !self.cluster && count != 1 {
            return Err(ConfigError::StandaloneNeedsOneUrl { count });
        }
        Ok(())
    }

    /// True when the URLs are `rediss://` (checked to be all or none by [`RedisConfig::validate`]).
    pub fn uses_tls(&self) -> bool {
        self.urls.first().is_some_and(|url| url.starts_with(TLS_SCHEME))
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let tls_urls = self.urls.iter().filter(|url| url.starts_with(TLS_SCHEME)).count();
        if tls_urls != 0 && tls_urls != self.urls.len() {
            return Err(ConfigError::MixedSchemes);
        }
        if tls_urls == 0 && self.tls.has_files() {
            return Err(ConfigError::TlsFilesWithoutRediss);
        }
        if self.tls.client_cert_file.is_some() != self.tls.client_key_file.is_some() {
            return Err(ConfigError::ClientCertificateWithoutKey);
        }
        if self.urls.iter().any(|url| url.contains("#insecure")) {
            return Err(ConfigError::InsecureTls);
        }
        Ok(())
    }

    fn validate_wait(&self, wait: WaitConfig) -> Result<(), ConfigError> {
        if !(1..=WAIT_REPLICAS_MAX).contains(&wait.replicas) || !(1..=WAIT_TIMEOUT_MS_MAX).contains(&wait.timeout_ms) {
            return Err(ConfigError::Wait);
        }
        if self.response_timeout_ms < wait.timeout_ms + RESPONSE_TIMEOUT_MARGIN_MS {
            return Err(ConfigError::ResponseTimeoutBelowWait {
                response_timeout_ms: self.response_timeout_ms,
                wait_timeout_ms: wait.timeout_ms,
            });
        }
        Ok(())
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        Duration::from_millis(self.response_timeout_ms)
    }

    pub(crate) fn connection_timeout(&self) -> Duration {
        Duration::from_millis(self.connection_timeout_ms)
    }
}

/// Braces are refused because Redis Cluster hashes only the text between the
/// first `{` and the next `}`: a brace in the prefix would move every key's
/// hash tag and split a record from its tombstone.
fn key_prefix_is_valid(prefix: &str) -> bool {
    prefix.len() <= KEY_PREFIX_BYTES_MAX
        && prefix
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(RedisConfig::standalone("redis://127.0.0.1:1").validate(), Ok(()));
        assert_eq!(
            RedisConfig::cluster(["redis://127.0.0.1:1", "redis://127.0.0.1:2"]).validate(),
            Ok(())
        );
    }

    #[test]
    fn key_prefixes_with_braces_spaces_or_excess_length_are_refused() {
        for bad in ["a{b", "a}b", "a b", "é", &"p".repeat(KEY_PREFIX_BYTES_MAX + 1)] {
            let config = RedisConfig {
                key_prefix: bad.to_owned(),
                ..RedisConfig::standalone("redis://127.0.0.1:1")
            };
            assert_eq!(config.validate(), Err(ConfigError::KeyPrefix), "{bad:?}");
        }
        let empty = RedisConfig {
            key_prefix: String::new(),
            ..RedisConfig::standalone("redis://127.0.0.1:1")
        };
        assert_eq!(empty.validate(), Ok(()));
    }

    #[test]
    fn batch_sizes_outside_their_bounds_are_refused() {
        for (batch_items_max, valid) in [
            (0, false),
            (1, true),
            (BATCH_ITEMS_MAX, true),
            (BATCH_ITEMS_MAX + 1, false),
        ] {
            let config = RedisConfig {
                batch_items_max,
                ..RedisConfig::standalone("redis://127.0.0.1:1")
            };
            let expected = if valid {
                Ok(())
            } else {
                Err(ConfigError::BatchItems(batch_items_max))
            };
            assert_eq!(config.validate(), expected, "{batch_items_max}");
        }
    }

    #[test]
    fn url_counts_are_checked() {
        let mut config = RedisConfig::standalone("redis://127.0.0.1:1");
        config.urls.push("redis://127.0.0.1:2".into());
        assert_eq!(config.validate(), Err(ConfigError::StandaloneNeedsOneUrl { count: 2 }));
        config.urls.clear();
        assert_eq!(config.validate(), Err(ConfigError::NoUrls));
    }

    #[test]
    fn tls_settings_must_agree_with_the_urls() {
        let ca = Some(PathBuf::from("/etc/idem/redis-ca.pem"));
        let plain_with_ca = RedisConfig {
            tls: RedisTls {
                ca_file: ca.clone(),
                ..RedisTls::default()
            },
            ..RedisConfig::standalone("redis://127.0.0.1:1")
        };
        assert_eq!(plain_with_ca.validate(), Err(ConfigError::TlsFilesWithoutRediss));
        let tls_with_ca = RedisConfig {
            urls: vec!["rediss://127.0.0.1:1".into()],
            ..plain_with_ca
        };
        assert_eq!(tls_with_ca.validate(), Ok(()));
        assert!(tls_with_ca.uses_tls());
        let mixed = RedisConfig::cluster(["rediss://127.0.0.1:1", "redis://127.0.0.1:2"]);
        assert_eq!(mixed.validate(), Err(ConfigError::MixedSchemes));
        let half_client = RedisConfig {
            tls: RedisTls {
                ca_file: ca,
                client_cert_file: Some(PathBuf::from("/etc/idem/client.pem")),
                client_key_file: None,
            },
            ..tls_with_ca.clone()
        };
        assert_eq!(half_client.validate(), Err(ConfigError::ClientCertificateWithoutKey));
        let insecure = RedisConfig::standalone("rediss://127.0.0.1:1/#insecure");
        assert_eq!(insecure.validate(), Err(ConfigError::InsecureTls));
    }

    #[test]
    fn wait_needs_replicas_a_nonzero_timeout_and_a_longer_response_timeout() {
        let with_wait = |replicas, timeout_ms| RedisConfig {
            wait: Some(WaitConfig { replicas, timeout_ms }),
            ..RedisConfig::standalone("redis://127.0.0.1:1")
        };
        assert_eq!(with_wait(1, 100).validate(), Ok(()));
        assert_eq!(with_wait(0, 100).validate(), Err(ConfigError::Wait));
        assert_eq!(with_wait(1, 0).validate(), Err(ConfigError::Wait));
        assert_eq!(
            with_wait(1, RESPONSE_TIMEOUT_MS_DEFAULT).validate(),
            Err(ConfigError::ResponseTimeoutBelowWait {
                response_timeout_ms: RESPONSE_TIMEOUT_MS_DEFAULT,
                wait_timeout_ms: RESPONSE_TIMEOUT_MS_DEFAULT
            })
        );
    }
}
