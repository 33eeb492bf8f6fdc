//! TLS to PostgreSQL with rustls (tokio-postgres-rustls): the CA file read
//! and parsed when the pool is built, the two verifications of
//! [`SslMode`], and a failed handshake reported as such.
//!
//! A handshake that fails because of a certificate (the wrong CA, a name
//! the certificate does not carry, a server without TLS) is a refusal, not
//! unavailability: retrying will not fix it, and at startup the server
//! stops with "PostgreSQL TLS: ..." instead of waiting for a database that
//! is up all along.

use crate::config::SslMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use store_core::StoreError;
use tls_files::{PemFileError, read_certificates};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How every TLS refusal of this store begins, so a caller can tell them
/// from other refusals (the server exits with its "refused config" code).
pub const TLS_ERROR_PREFIX: &str = "PostgreSQL TLS";

/// Why the CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read, or holds no PEM certificate
    /// (tls-files, the one PEM reader, says which).
    #[error("PostgreSQL TLS: {0}")]
    File(#[from] PemFileError),
    #[error("PostgreSQL TLS: the CA file {path} {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// The connector for `ssl_mode`, trusting only the certificates of `ca_file`.
pub(crate) fn tls_connector(ca_file: &Path, ssl_mode: SslMode) -> Result<MakeRustlsConnect, TlsError> {
    let roots = Arc::new(root_store(ca_file)?);
    let builder = ClientConfig::builder();
    let config = match ssl_mode {
        SslMode::Require => {
            let full = WebPkiServerVerifier::builder(roots)
                .build()
                .map_err(|error| invalid(ca_file, format!("cannot verify with it: {error}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnlyVerifier { full }))
                .with_no_client_auth()
        }
        SslMode::VerifyFull | SslMode::Disable => builder.with_root_certificates(roots).with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

fn invalid(path: &Path, reason: String) -> TlsError {
    TlsError::Invalid {
        path: path.to_owned(),
        reason,
    }
}

fn root_store(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates("CA file", ca_file)? {
        roots
            .add(certificate)
            .map_err(|error| invalid(ca_file, format!("holds a certificate that is not a CA: {error}")))?;
    }
    Ok(roots)
}

/// `sslmode=require`: the whole WebPKI verification except the host name.
/// rustls checks the chain (to the CA file, in date, for server use) before
/// the name, so a name error means the chain passed.
#[derive(Debug)]
struct ChainOnlyVerifier {
    full: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnlyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .full
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.full.verify_tls12_signature(message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.full.verify_tls13_signature(message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.full.supported_verify_schemes()
    }
}

/// The refusal for a driver error that is a failed TLS handshake, naming
/// its cause ("invalid peer certificate: UnknownIssuer", "server does not
/// support TLS"); `None` for any other error.
pub(crate) fn handshake_refusal(error: &tokio_postgres::Error) -> Option<StoreError> {
    // The driver's error kinds are private; its message for this one is fixed.
    if error.to_string() != "error performing TLS handshake" {
        return None;
    }
    let mut causes = Vec::new();
    let mut cause = error.source();
    while let Some(current) = cause {
        causes.push(current.to_string());
        cause = current.source();
    }
    causes.dedup();
    Some(StoreError::Refused {
        detail: format!("{TLS_ERROR_PREFIX}: the TLS handshake failed: {}", causes.join(": ")),
        source: None,
    })
}
