//! The PEM files a TLS hop is configured with: certificate chains, CA
//! bundles and private keys, read with one size cap and checked before
//! any connection is made or accepted.
//!
//! The server (its listener and an `https://` carrier), the Redis store
//! (`rediss://`) and the PostgreSQL store (`sslmode`) all read their files
//! here, so a file is refused the same way, with the same limit and the
//! same words, on every hop. Each caller names what the file is for
//! (`what`: "CA file", "client key file") and wraps the error in its own
//! prefix (a config field, "Redis TLS", "PostgreSQL TLS").
//!
//! Only parsing: no TLS session is made here, and no crypto provider is
//! chosen (the workspace Cargo.toml says which one every binary uses).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// Largest certificate, key or CA file read, in bytes: a CA bundle of a few
/// hundred certificates fits; anything larger is not a PEM file.
pub const TLS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// Why a PEM file was refused. The message names what the file is for and
/// its path; the caller adds which setting or hop it belongs to.
#[derive(Debug, thiserror::Error)]
pub enum PemFileError {
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} {} is {size} bytes, more than {TLS_FILE_BYTES_MAX}", path.display())]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        size: u64,
    },
    #[error("the {what} {} is not PEM: {reason}", path.display())]
    NotPem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the {what} {} holds no PEM certificate", path.display())]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("the {what} {} holds no PEM private key: {reason}", path.display())]
    NoPrivateKey {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

/// A PEM file's bytes, unparsed: at most [`TLS_FILE_BYTES_MAX`], checked
/// before the file is read, so a wrong path (a log, a device) is refused
/// without reading it whole.
pub fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, PemFileError> {
    let read_error = |source| PemFileError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > TLS_FILE_BYTES_MAX {
        return Err(PemFileError::TooLarge {
            what,
            path: path.to_owned(),
            size,
        });
    }
    let pem = std::fs::read(path).map_err(read_error)?;
    // The file may have grown between the two calls.
    if pem.len() as u64 > TLS_FILE_BYTES_MAX {
        return Err(PemFileError::TooLarge {
            what,
            path: path.to_owned(),
            size: pem.len() as u64,
        });
    }
    Ok(pem)
}

/// The file's bytes, once they are known to hold at least one PEM
/// certificate and nothing that is not PEM: for a driver that takes the
/// bundle as bytes (redis-rs).
pub fn read_certificate_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, PemFileError> {
    let pem = read_pem(what, path)?;
    certificates_of(what, path, &pem)?;
    Ok(pem)
}

/// The certificates of a PEM file (a chain, leaf first, or a CA bundle);
/// refused when it holds none.
pub fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let pem = read_pem(what, path)?;
    certificates_of(what, path, &pem)
}

/// The file's bytes, once they are known to hold a PEM private key: for a
/// driver that takes the key as bytes (redis-rs).
pub fn read_private_key_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, PemFileError> {
    let pem = read_pem(what, path)?;
    private_key_of(what, path, &pem)?;
    Ok(pem)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_private_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, PemFileError> {
    let pem = read_pem(what, path)?;
    private_key_of(what, path, &pem)
}

fn certificates_of(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| PemFileError::NotPem {
            what,
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(PemFileError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certificates)
}

fn private_key_of(what: &'static str, path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, PemFileError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|error| PemFileError::NoPrivateKey {
        what,
        path: path.to_owned(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::tls::TestCertificates;

    fn generated() -> (tempfile::TempDir, TestCertificates) {
        let directory = tempfile::tempdir().unwrap();
        let certificates = TestCertificates::generate(directory.path()).unwrap();
        (directory, certificates)
    }

    #[test]
    fn certificates_and_keys_are_read_back() {
        let (_directory, certificates) = generated();
        assert_eq!(read_certificates("CA file", &certificates.ca_file).unwrap().len(), 1);
        let key = read_private_key("key file", &certificates.server_key_file).unwrap();
        assert!(!key.secret_der().is_empty());
        let pem = read_certificate_pem("CA file", &certificates.ca_file).unwrap();
        assert_eq!(pem, std::fs::read(&certificates.ca_file).unwrap());
        assert!(read_private_key_pem("key file", &certificates.client_key_file).is_ok());
    }

    #[test]
    fn a_file_over_the_cap_is_refused_before_it_is_parsed() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("huge.pem");
        let at_cap = vec![b'\n'; TLS_FILE_BYTES_MAX as usize];
        std::fs::write(&path, &at_cap).unwrap();
        assert!(read_pem("CA file", &path).is_ok(), "exactly the cap is read");
        std::fs::write(&path, [at_cap.as_slice(), b"\n"].concat()).unwrap();
        let error = read_certificates("CA file", &path).unwrap_err();
        assert!(matches!(error, PemFileError::TooLarge { size, .. } if size == TLS_FILE_BYTES_MAX + 1));
        assert!(error.to_string().contains("more than 1048576"), "{error}");
    }

    #[test]
    fn refusals_name_what_the_file_is_for_and_its_path() {
        let (directory, certificates) = generated();
        let missing = directory.path().join("missing.pem");
        let error = read_certificates("CA file", &missing).unwrap_err();
        assert!(matches!(error, PemFileError::Read { .. }));
        assert!(
            error
                .to_string()
                .starts_with(&format!("cannot read the CA file {}", missing.display())),
            "{error}"
        );
        // A key where a certificate is expected, and the other way round.
        let error = read_certificates("CA file", &certificates.server_key_file).unwrap_err();
        assert!(error.to_string().contains("holds no PEM certificate"), "{error}");
        let error = read_private_key("client key file", &certificates.client_cert_file).unwrap_err();
        assert!(
            error.to_string().starts_with("the client key file") && error.to_string().contains("no PEM private key"),
            "{error}"
        );
        let garbled = directory.path().join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let error = read_certificates("CA file", &garbled).unwrap_err();
        assert!(matches!(error, PemFileError::NotPem { .. }), "{error}");
    }
}
