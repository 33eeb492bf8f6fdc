//! `rediss://`: the certificate files of [`RedisTls`] read and checked
//! before any connection is made, and a failed TLS handshake told apart
//! from an unreachable server, so a wrong CA is a clear startup error
//! ("Redis TLS: ... UnknownIssuer") and not a store that looks down.

use crate::config::{RedisConfig, RedisTls};
use redis::{ClientTlsConfig, RedisError, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::error::Error as _;
use std::path::Path;
use store_core::StoreError;

/// How every TLS refusal of this store begins, so a caller can tell them
/// from other refusals (the server exits with its "refused config" code).
pub const TLS_ERROR_PREFIX: &str = "Redis TLS";

/// Largest certificate or key file read, in bytes: a CA bundle of a few
/// hundred certificates fits; anything larger is not a PEM file.
pub const TLS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The certificates to connect with: `None` for `redis://` URLs, or for
/// `rediss://` without files (the operating system's trust store then).
pub(crate) fn tls_certificates(config: &RedisConfig) -> Result<Option<TlsCertificates>, StoreError> {
    let tls: &RedisTls = &config.tls;
    if !config.uses_tls() || (tls.ca_file.is_none() && tls.client_cert_file.is_none()) {
        return Ok(None);
    }
    let root_cert = match &tls.ca_file {
        Some(path) => Some(read_certificates(path, "CA file")?),
        None => None,
    };
    let client_tls = match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert_file), Some(key_file)) => Some(ClientTlsConfig {
            client_cert: read_certificates(cert_file, "client certificate file")?,
            client_key: read_private_key(key_file)?,
        }),
        _ => None,
    };
    Ok(Some(TlsCertificates { client_tls, root_cert }))
}

fn refused(message: String) -> StoreError {
    StoreError::Refused {
        detail: format!("{TLS_ERROR_PREFIX}: {message}"),
        source: None,
    }
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    let size = std::fs::metadata(path)
        .map_err(|error| refused(format!("cannot read the {what} {}: {error}", path.display())))?
        .len();
    if size > TLS_FILE_BYTES_MAX {
        return Err(refused(format!(
            "the {what} {} is {size} bytes, more than {TLS_FILE_BYTES_MAX}",
            path.display()
        )));
    }
    std::fs::read(path).map_err(|error| refused(format!("cannot read the {what} {}: {error}", path.display())))
}

/// The file's bytes, once they are known to hold at least one PEM certificate.
fn read_certificates(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    let pem = read_pem(path, what)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| refused(format!("the {what} {} is not PEM: {error}", path.display())))?;
    if certificates.is_empty() {
        return Err(refused(format!(
            "the {what} {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(pem)
}

/// The file's bytes, once they are known to hold a PEM private key.
fn read_private_key(path: &Path) -> Result<Vec<u8>, StoreError> {
    let pem = read_pem(path, "client key file")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|error| {
        refused(format!(
            "the client key file {} holds no PEM private key: {error}",
            path.display()
        ))
    })?;
    Ok(pem)
}

/// The TLS failure inside a connection error, if that is what it was: a
/// certificate the CA file does not vouch for, a server that asked for a
/// client certificate we lack, a peer that does not speak TLS.
pub(crate) fn handshake_failure(error: &RedisError) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = error.source();
    while let Some(current) = cause {
        if let Some(tls_error) = current.downcast_ref::<rustls::Error>() {
            return Some(tls_error.to_string());
        }
        if let Some(io_error) = current.downcast_ref::<std::io::Error>()
            && let Some(tls_error) = io_error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls_error.to_string());
        }
        cause = current.source();
    }
    let text = error.to_string();
    (text.contains("certificate") || text.contains("TLS") || text.contains("tls")).then_some(text)
}

/// The startup error for a handshake that failed: names the hop, the cause
/// and the CA that was trusted.
pub(crate) fn handshake_refusal(config: &RedisConfig, cause: &str) -> StoreError {
    let trusted = match &config.tls.ca_file {
        Some(path) => format!("CA file {}", path.display()),
        None => "the operating system's trust store".to_owned(),
    };
    refused(format!("the TLS handshake failed: {cause} (trusting {trusted})"))
}
