//! `rediss://`: the certificate files of [`RedisTls`] read and checked
//! before any connection is made, and a failed TLS handshake told apart
//! from an unreachable server, so a wrong CA is a clear startup error
//! ("Redis TLS: ... UnknownIssuer") and not a store that looks down.

use crate::config::{RedisConfig, RedisTls};
use redis::{ClientTlsConfig, RedisError, TlsCertificates};
use std::error::Error as _;
use store_core::StoreError;
use tls_files::{PemFileError, read_certificate_pem, read_private_key_pem};

/// How every TLS refusal of this store begins, so a caller can tell them
/// from other refusals (the server exits with its "refused config" code).
pub const TLS_ERROR_PREFIX: &str = "Redis TLS";

/// The certificates to connect with: `None` for `redis://` URLs, or for
/// `rediss://` without files (the operating system's trust store then).
pub(crate) fn tls_certificates(config: &RedisConfig) -> Result<Option<TlsCertificates>, StoreError> {
    let tls: &RedisTls = &config.tls;
    if !config.uses_tls() || (tls.ca_file.is_none() && tls.client_cert_file.is_none()) {
        return Ok(None);
    }
    let root_cert = match &tls.ca_file {
        Some(path) => Some(read_certificate_pem("CA file", path).map_err(file_refused)?),
        None => None,
    };
    let client_tls = match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert_file), Some(key_file)) => Some(ClientTlsConfig {
            client_cert: read_certificate_pem("client certificate file", cert_file).map_err(file_refused)?,
            client_key: read_private_key_pem("client key file", key_file).map_err(file_refused)?,
        }),
        _ => None,
    };
    Ok(Some(TlsCertificates { client_tls, root_cert }))
}

/// A certificate or key file refused by the one PEM reader (tls-files),
/// which names the file and why.
fn file_refused(error: PemFileError) -> StoreError {
    refused(error.to_string())
}

fn refused(message: String) -> StoreError {
    StoreError::Refused {
        detail: format!("{TLS_ERROR_PREFIX}: {message}"),
        source: None,
    }
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
