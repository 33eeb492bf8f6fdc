//! The TLS material the server reads at startup: the listener's
//! certificate and key (`[server.tls]`) and an `https://` carrier's CA
//! (`carrier.ca_file`). Every file is read and parsed before the server
//! listens, so a missing, unreadable or malformed file stops the start
//! (exit code 2) with a message naming the field, the file and the cause,
//! never the first request.
//!
//! One crypto provider for the whole binary: aws-lc-rs (the workspace
//! Cargo.toml says why); rustls picks it from its crate features.

use crate::config::{CarrierConfig, ServerTlsConfig};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

/// Largest certificate, key or CA file read, in bytes.
pub const TLS_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// The only application protocol the listener speaks (ALPN): the server
/// serves HTTP/1.1 alone, so a client must not be offered h2.
pub const ALPN_HTTP_1_1: &[u8] = b"http/1.1";

/// Why TLS material was refused; names the config field and the file.
#[derive(Debug, thiserror::Error)]
#[error("{field} {path}: {reason}")]
pub struct TlsFileError {
    pub field: &'static str,
    pub path: String,
    pub reason: String,
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
    let chain = read_certificates("server.tls.cert_file", &config.cert_file)?;
    let key = read_private_key("server.tls.key_file", &config.key_file)?;
    let mut server_config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| TlsFileError {
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
    let certificates = read_certificates(field, &config.ca_file)?;
    certificates
        .iter()
        .map(|certificate| {
            reqwest::Certificate::from_der(certificate).map_err(|error| file_error(field, &config.ca_file, error))
        })
        .collect()
}

fn file_error(field: &'static str, path: &str, reason: impl ToString) -> TlsFileError {
    TlsFileError {
        field,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn read_pem(field: &'static str, path: &str) -> Result<Vec<u8>, TlsFileError> {
    let size = std::fs::metadata(Path::new(path))
        .map_err(|error| file_error(field, path, format!("cannot read: {error}")))?
        .len();
    if size > TLS_FILE_BYTES_MAX {
        return Err(file_error(
            field,
            path,
            format!("is {size} bytes, more than {TLS_FILE_BYTES_MAX}"),
        ));
    }
    std::fs::read(path).map_err(|error| file_error(field, path, format!("cannot read: {error}")))
}

fn read_certificates(field: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read_pem(field, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(field, path, format!("is not PEM: {error}")))?;
    if certificates.is_empty() {
        return Err(file_error(field, path, "holds no PEM certificate"));
    }
    Ok(certificates)
}

fn read_private_key(field: &'static str, path: &str) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let pem = read_pem(field, path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|error| file_error(field, path, format!("holds no PEM private key: {error}")))
}
