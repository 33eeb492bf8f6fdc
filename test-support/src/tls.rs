//! Test certificates (feature `tls`): a private CA, a server certificate
//! it signs for `127.0.0.1` and `localhost`, a client certificate it signs,
//! and a second, unrelated CA that a "wrong CA" test trusts instead.
//!
//! Everything is generated with rcgen when a test starts and written as PEM
//! files into a directory the caller owns (a test's temporary directory), so
//! no key is ever committed and every run has fresh ones. Keys are written
//! with mode 0600: PostgreSQL refuses a server key that others may read.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The names the server certificate is valid for: every address the test
/// servers listen on, by number and by name.
pub const SERVER_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];
/// Permissions of a written private key: the owner's only.
pub const PRIVATE_KEY_MODE: u32 = 0o600;

/// The PEM files of one generated set, all inside one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestCertificates {
    /// The CA that signed the server and client certificates.
    pub ca_file: PathBuf,
    /// A CA that signed nothing here: trusting it must fail every handshake.
    pub wrong_ca_file: PathBuf,
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl TestCertificates {
    /// Generates a fresh set and writes it into `directory` (which must exist).
    pub fn generate(directory: &Path) -> io::Result<Self> {
        let certificates = Self {
            ca_file: directory.join("ca.pem"),
            wrong_ca_file: directory.join("wrong-ca.pem"),
            server_cert_file: directory.join("server.pem"),
            server_key_file: directory.join("server.key"),
            client_cert_file: directory.join("client.pem"),
            client_key_file: directory.join("client.key"),
        };
        let (ca_pem, issuer) = certificate_authority("idem test CA")?;
        let (wrong_ca_pem, _) = certificate_authority("idem unrelated test CA")?;
        fs::write(&certificates.ca_file, ca_pem)?;
        fs::write(&certificates.wrong_ca_file, wrong_ca_pem)?;
        let server_names = SERVER_NAMES.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
        // Client use too: a Redis Cluster node presents its one certificate
        // to the other nodes on the TLS cluster bus, as a client.
        let server_usages = [ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let (server_pem, server_key) = leaf(&issuer, server_names, &server_usages)?;
        write_pair(
            &certificates.server_cert_file,
            &server_pem,
            &certificates.server_key_file,
            &server_key,
        )?;
        let (client_pem, client_key) = leaf(&issuer, Vec::new(), &[ExtendedKeyUsagePurpose::ClientAuth])?;
        write_pair(
            &certificates.client_cert_file,
            &client_pem,
            &certificates.client_key_file,
            &client_key,
        )?;
        Ok(certificates)
    }
}

fn certificate_authority(name: &str) -> io::Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::new()).map_err(io::Error::other)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().map_err(io::Error::other)?;
    let certificate = params.self_signed(&key).map_err(io::Error::other)?;
    Ok((certificate.pem(), Issuer::new(params, key)))
}

/// A certificate signed by `issuer` for `names`, and its key, both as PEM.
fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: Vec<String>,
    usages: &[ExtendedKeyUsagePurpose],
) -> io::Result<(String, String)> {
    let mut params = CertificateParams::new(names).map_err(io::Error::other)?;
    params.distinguished_name.push(DnType::CommonName, "idem test");
    params.use_authority_key_identifier_extension = true;
    params.extended_key_usages.extend(usages.iter().cloned());
    let key = KeyPair::generate().map_err(io::Error::other)?;
    let certificate = params.signed_by(&key, issuer).map_err(io::Error::other)?;
    Ok((certificate.pem(), key.serialize_pem()))
}

fn write_pair(cert_file: &Path, cert_pem: &str, key_file: &Path, key_pem: &str) -> io::Result<()> {
    fs::write(cert_file, cert_pem)?;
    fs::write(key_file, key_pem)?;
    fs::set_permissions(key_file, fs::Permissions::from_mode(PRIVATE_KEY_MODE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_set_is_pem_with_private_keys() {
        let directory = std::env::temp_dir().join(format!("idem-test-certs-{}", std::process::id()));
        fs::create_dir_all(&directory).unwrap();
        let certificates = TestCertificates::generate(&directory).unwrap();
        let ca = fs::read_to_string(&certificates.ca_file).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        assert_ne!(ca, fs::read_to_string(&certificates.wrong_ca_file).unwrap());
        let mode = fs::metadata(&certificates.server_key_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, PRIVATE_KEY_MODE);
        assert!(
            fs::read_to_string(&certificates.client_key_file)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        fs::remove_dir_all(&directory).unwrap();
    }
}
