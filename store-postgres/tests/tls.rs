//! PostgreSQL over TLS on a real server with `ssl = on` and `hostssl` only:
//! what each `sslmode` checks, and that every refusal (a plain connection,
//! a wrong CA, a name the certificate does not carry, a missing CA file)
//! comes when the store is opened (its migrations, the server's startup
//! step), with a message that names PostgreSQL TLS and the cause.

use store_core::StoreError;
use store_core::testkit::{claim_request, policy, response, unique_caller};
use store_core::{ClaimOutcome, IdempotencyStore};
use store_postgres::testkit::{PostgresServer, TestDatabase};
use store_postgres::{MigrateError, PostgresConfig, PostgresStore, SslMode};

async fn database() -> TestDatabase {
    PostgresServer::shared_tls()
        .create_database()
        .await
        .expect("create a test database")
}

/// Opens the store as the server does at startup: build, then migrate.
async fn open(config: &PostgresConfig) -> Result<PostgresStore, String> {
    let store = PostgresStore::new(config, policy()).map_err(|error| error.to_string())?;
    match store.migrate(&[]).await {
        Ok(_) => Ok(store),
        Err(MigrateError::Store(error @ StoreError::Refused { .. })) => Err(with_causes(&error)),
        Err(other) => Err(format!("not a refusal: {other:?}")),
    }
}

/// The error and every cause below it, as a log line would show them.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(current) = cause {
        text = format!("{text}: {current}");
        cause = current.source();
    }
    text
}

async fn claim_and_complete(store: &PostgresStore) {
    let caller = unique_caller();
    let ClaimOutcome::Acquired(acquired) = store.claim(&claim_request(&caller, "k", "body")).await.unwrap() else {
        panic!("a new key is acquired");
    };
    assert!(store.complete(&acquired.lease, response(7)).await.unwrap().is_applied());
    match store.claim(&claim_request(&caller, "k", "body")).await.unwrap() {
        ClaimOutcome::Replay(saved) => assert_eq!(saved, response(7)),
        other => panic!("expected the replay, got {}", other.kind()),
    }
}

/// The URL of `database` under a host name the certificate does not carry,
/// still reaching 127.0.0.1 (`hostaddr`).
fn under_another_name(database: &TestDatabase) -> String {
    let port = PostgresServer::shared_tls().port();
    format!(
        "postgres://postgres@idem-db.invalid:{port}/{}?hostaddr=127.0.0.1",
        database.name
    )
}

#[tokio::test]
async fn verify_full_claims_and_completes_over_tls() {
    let config = database().await.config();
    assert_eq!(config.ssl_mode, SslMode::VerifyFull);
    claim_and_complete(&open(&config).await.unwrap()).await;
}

#[tokio::test]
async fn require_checks_the_chain_but_not_the_name_and_verify_full_checks_both() {
    let database = database().await;
    let renamed = PostgresConfig {
        url: under_another_name(&database),
        ..database.config()
    };
    let refused = open(&renamed).await.err().unwrap_or_default();
    assert!(refused.contains("PostgreSQL TLS"), "{refused}");
    assert!(refused.contains("not valid for name"), "{refused}");
    let required = PostgresConfig {
        ssl_mode: SslMode::Require,
        ..renamed
    };
    claim_and_complete(&open(&required).await.unwrap()).await;
}

#[tokio::test]
async fn a_wrong_ca_is_refused_when_the_store_opens() {
    let database = database().await;
    let wrong_ca = PostgresServer::shared_tls()
        .certificates()
        .unwrap()
        .wrong_ca_file
        .clone();
    for ssl_mode in [SslMode::VerifyFull, SslMode::Require] {
        let config = PostgresConfig {
            ssl_mode,
            ca_file: Some(wrong_ca.clone()),
            ..database.config()
        };
        let message = open(&config).await.err().unwrap_or_default();
        assert!(
            message.contains("PostgreSQL TLS: the TLS handshake failed") && message.contains("UnknownIssuer"),
            "{ssl_mode:?}: {message}"
        );
    }
}

#[tokio::test]
async fn a_plain_connection_is_refused_by_a_tls_only_server() {
    let database = database().await;
    let plain = PostgresConfig {
        ssl_mode: SslMode::Disable,
        ca_file: None,
        ..database.config()
    };
    let message = open(&plain).await.err().unwrap_or_default();
    assert!(message.contains("no encryption"), "{message}");
}

#[tokio::test]
async fn a_missing_or_malformed_ca_file_is_refused_before_connecting() {
    let directory = tempfile::tempdir().unwrap();
    let mut config = PostgresConfig {
        ssl_mode: SslMode::VerifyFull,
        ca_file: Some(directory.path().join("missing.pem")),
        ..PostgresConfig::new("postgres://postgres@127.0.0.1:1/idem")
    };
    let message = open(&config).await.err().unwrap_or_default();
    assert!(message.contains("PostgreSQL TLS: cannot read the CA file"), "{message}");
    let not_pem = directory.path().join("not-pem.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    config.ca_file = Some(not_pem);
    let message = open(&config).await.err().unwrap_or_default();
    assert!(message.contains("holds no PEM certificate"), "{message}");
}
