//! `rediss://` refusals at connect time, on real TLS servers: a CA that did
//! not sign the server's certificate, a missing client certificate where
//! the server requires one, missing or malformed files. Each is a
//! `Refused` error naming "Redis TLS" and the cause, from
//! `RedisStore::connect`, before any record is touched.

use std::path::PathBuf;
use store_core::StoreError;
use store_core::testkit::policy;
use store_redis::testkit::{ClientAuth, RedisCluster, RedisServer, TlsSetup};
use store_redis::{RedisConfig, RedisStore, RedisTls};

async fn refusal(config: RedisConfig) -> String {
    match RedisStore::connect(config, policy()).await {
        Ok(_) => panic!("the store connected"),
        Err(error @ StoreError::Refused { .. }) => error.to_string(),
        Err(other) => panic!("not a refusal: {other:?}"),
    }
}

fn trusting(config: RedisConfig, ca_file: PathBuf) -> RedisConfig {
    RedisConfig {
        tls: RedisTls {
            ca_file: Some(ca_file),
            ..config.tls.clone()
        },
        ..config
    }
}

#[tokio::test]
async fn a_wrong_ca_is_refused_at_connect_on_a_standalone_server() {
    let server = RedisServer::start_tls(TlsSetup::generate(ClientAuth::Optional).unwrap()).unwrap();
    let wrong_ca = server.tls().unwrap().certificates.wrong_ca_file.clone();
    let message = refusal(trusting(server.config(), wrong_ca.clone())).await;
    assert!(message.contains("Redis TLS"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(message.contains(&wrong_ca.display().to_string()), "{message}");
    // The right CA connects: the refusal was the CA's, not the server's.
    RedisStore::connect(server.config(), policy()).await.unwrap();
}

#[tokio::test]
async fn a_wrong_ca_is_refused_at_connect_on_a_cluster() {
    let cluster = RedisCluster::start_tls(TlsSetup::generate(ClientAuth::Optional).unwrap()).unwrap();
    let wrong_ca = cluster.nodes()[0].tls().unwrap().certificates.wrong_ca_file.clone();
    let message = refusal(trusting(cluster.config(), wrong_ca)).await;
    assert!(message.contains("Redis TLS"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_refuses_a_client_without_one() {
    let server = RedisServer::start_tls(TlsSetup::generate(ClientAuth::Required).unwrap()).unwrap();
    let without_certificate = RedisConfig {
        tls: RedisTls {
            client_cert_file: None,
            client_key_file: None,
            ..server.config().tls
        },
        ..server.config()
    };
    let error = RedisStore::connect(without_certificate, policy()).await.err();
    assert!(error.is_some(), "connected without the required client certificate");
    RedisStore::connect(server.config(), policy()).await.unwrap();
}

#[tokio::test]
async fn missing_or_malformed_files_are_refused_before_connecting() {
    let directory = tempfile::tempdir().unwrap();
    // Nothing listens here: a file error must come first.
    let config = RedisConfig::standalone("rediss://127.0.0.1:1");
    let missing = directory.path().join("missing.pem");
    let message = refusal(trusting(config.clone(), missing.clone())).await;
    assert!(message.contains("Redis TLS: cannot read the CA file"), "{message}");
    assert!(message.contains(&missing.display().to_string()), "{message}");
    let not_pem = directory.path().join("not-pem.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let message = refusal(trusting(config.clone(), not_pem)).await;
    assert!(message.contains("holds no PEM certificate"), "{message}");
    let certificates = test_support::tls::TestCertificates::generate(directory.path()).unwrap();
    let key_is_a_certificate = RedisConfig {
        tls: RedisTls {
            ca_file: Some(certificates.ca_file.clone()),
            client_cert_file: Some(certificates.client_cert_file.clone()),
            client_key_file: Some(certificates.client_cert_file.clone()),
        },
        ..config
    };
    let message = refusal(key_is_a_certificate).await;
    assert!(message.contains("holds no PEM private key"), "{message}");
}
