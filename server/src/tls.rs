//! The TLS material the server reads at startup: the listener's
//! certificate and key (`[server.tls]`) and an `https://` carrier's CA
//! (`carrier.ca_file`). Every file is read and parsed before the server
//! listens, so a missing, unreadable or malformed file stops the start
//! (exit code 2) with a message naming the field, the file and the cause,
//! never the first request.
//!
//! One crypto provider for the whole binary: aws-lc-rs (the workspace
//! Cargo.toml says why); rustls picks it from its crate features.

use crate::carrier::CarrierConfig;
use crate::setting::{ConfigError, check_range, field_error};
use rustls::ServerConfig;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tls_files::{PemFileError, read_certificates, read_private_key};
use tokio_rustls::TlsAcceptor;

/// The only application protocol the listener speaks (ALPN): the server
/// serves HTTP/1.1 alone, so a client must not be offered h2.
pub const ALPN_HTTP_1_1: &[u8] = b"http/1.1";

/// Default time a client has to finish the TLS handshake on an HTTPS
/// listener; past it the connection is closed (a slowloris handshake holds
/// a connection slot no longer than a slowloris header would).
pub const TLS_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Longest TLS handshake timeout accepted.
pub const TLS_HANDSHAKE_TIMEOUT_MS_MAX: u64 = 60_000;

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

impl ServerTlsConfig {
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty() || !self.key_file.is_empty()
    }

    /// Both files or neither: half a TLS config must not fall back to plain HTTP.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let tls = self;
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

/// Why TLS material was refused; names the config field and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// Unreadable, too large, or not the PEM expected (tls-files, the one
    /// PEM reader of every hop, says which).
    #[error("{field}: {source}")]
    File {
        field: &'static str,
        #[source]
        source: PemFileError,
    },
    /// Read and parsed, but not usable as configured.
    #[error("{field} {path}: {reason}")]
    Unusable {
        field: &'static str,
        path: String,
        reason: String,
    },
}

/// The refusal of `field`'s file.
fn file_refused(field: &'static str) -> impl FnOnce(PemFileError) -> TlsFileError {
    move |source| TlsFileError::File { field, source }
}

/// The listener's TLS: the acceptor and the handshake's time limit.
#[derive(Clone)]
pub struct InboundTls {
    pub acceptor: TlsAcceptor,
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for InboundTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("InboundTls")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// The listener's TLS when `[server.tls]` names its files; `None` for plain HTTP.
pub fn inbound_tls(config: &ServerTlsConfig) -> Result<Option<InboundTls>, TlsFileError> {
    if !config.enabled() {
        return Ok(None);
    }
    let chain = read_certificates("certificate file", Path::new(&config.cert_file))
        .map_err(file_refused("server.tls.cert_file"))?;
    let key = read_private_key("key file", Path::new(&config.key_file)).map_err(file_refused("server.tls.key_file"))?;
    let mut server_config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| TlsFileError::Unusable {
            field: "server.tls.key_file",
            path: config.key_file.clone(),
            reason: format!("does not go with server.tls.cert_file {}: {error}", config.cert_file),
        })?;
    server_config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Ok(Some(InboundTls {
        acceptor: TlsAcceptor::from(Arc::new(server_config)),
        handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
    }))
}

/// The carrier's CA certificates when `carrier.ca_file` is set (the
/// client then trusts only them); empty: the operating system's trust store.
pub fn carrier_roots(config: &CarrierConfig) -> Result<Vec<reqwest::Certificate>, TlsFileError> {
    if config.ca_file.is_empty() {
        return Ok(Vec::new());
    }
    let field = "carrier.ca_file";
    let certificates = read_certificates("CA file", Path::new(&config.ca_file)).map_err(file_refused(field))?;
    certificates
        .iter()
        .map(|certificate| {
            reqwest::Certificate::from_der(certificate).map_err(|error| TlsFileError::Unusable {
                field,
                path: config.ca_file.clone(),
                reason: error.to_string(),
            })
        })
        .collect()
}
