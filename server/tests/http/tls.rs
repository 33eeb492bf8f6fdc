//! TLS on every hop, against real peers with certificates the test
//! generates (test_support::tls):
//!
//! - inbound HTTPS: a client that trusts the test CA is served (probe and a
//!   label bought end to end); a plain HTTP client on the TLS port is cut
//!   without an answer; a client that never finishes its handshake is cut
//!   at the handshake timeout, and one that finished it but trickles its
//!   header is still cut at the header-read timeout;
//! - an `https://` carrier (the real simulator behind a TLS terminator),
//!   trusted through `carrier.ca_file`, and refused under another CA;
//! - startup: a missing certificate file, or a store whose CA is wrong
//!   (PostgreSQL with `ssl = on`, Redis with its TLS port), stops the
//!   binary with exit code 2 and a message naming the hop and the cause.

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, order_id};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use server::backend::StoreKind;
use server::carrier::SimulatorConfig;
use server::carrier::{CarrierClient, CarrierLabelRequest, CarrierOutcome, CarrierServer};
use server::labels::ShippingService;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use test_support::tls::TestCertificates;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

/// The handshake and header-read timeouts the slow-client tests configure.
const SHORT_TIMEOUT_MS: u64 = 500;
/// Time allowed past a timeout for the server to act on it.
const SLACK_MS: u64 = 1_000;

fn certificates() -> (TempDir, TestCertificates) {
    let directory = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::generate(directory.path()).unwrap();
    (directory, certificates)
}

fn tls_env(certificates: &TestCertificates) -> Vec<(String, String)> {
    vec![
        (
            "IDEM__SERVER__TLS__CERT_FILE".to_owned(),
            certificates.server_cert_file.display().to_string(),
        ),
        (
            "IDEM__SERVER__TLS__KEY_FILE".to_owned(),
            certificates.server_key_file.display().to_string(),
        ),
    ]
}

async fn https_server(certificates: &TestCertificates, extra: &[(&str, String)]) -> TestServer {
    let mut extra_env = tls_env(certificates);
    extra_env.extend(extra.iter().map(|(name, value)| (name.to_string(), value.clone())));
    let options = Options {
        extra_env,
        client_ca_file: Some(certificates.ca_file.clone()),
        ..Options::default()
    };
    TestServer::start_with(StoreKind::Embedded, options).await
}

fn address(server: &TestServer) -> String {
    server.base.trim_start_matches("https://").to_owned()
}

/// What the server sent before closing, if it closed within `limit`.
async fn sent_before_close<S: AsyncReadExt + Unpin>(stream: &mut S, limit: Duration) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut received)).await {
        Ok(_) => Some(received),
        Err(_still_open) => None,
    }
}

/// A TLS client connection to `server` that trusts the test CA.
async fn tls_client(server: &TestServer, ca_file: &Path) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address(server)).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.expect("TLS handshake")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_a_client_that_trusts_the_ca() {
    let (_directory, certificates) = certificates();
    let server = https_server(&certificates, &[]).await;
    assert!(server.base.starts_with("https://"), "{}", server.base);
    assert_eq!(server.get("/healthz", None).await.status, 200);
    let created = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    // A client that trusts another CA is refused by its own TLS stack.
    let stranger = crate::common::client_trusting(&certificates.wrong_ca_file);
    let error = stranger
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .expect_err("a server whose CA the client does not trust");
    assert!(error.is_connect(), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_client_on_the_tls_port_is_cut_without_an_answer() {
    let (_directory, certificates) = certificates();
    let server = https_server(&certificates, &[]).await;
    let mut plain = TcpStream::connect(address(&server)).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: idem\r\n\r\n")
        .await
        .unwrap();
    let sent = sent_before_close(&mut plain, Duration::from_millis(SLACK_MS * 5))
        .await
        .expect("the server closes a connection that does not speak TLS");
    assert!(
        !String::from_utf8_lossy(&sent).contains("HTTP/1.1"),
        "a plain request was answered: {sent:?}"
    );
    assert_eq!(server.get("/healthz", None).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_finishes_is_cut_at_the_handshake_timeout() {
    let (_directory, certificates) = certificates();
    let server = https_server(
        &certificates,
        &[("IDEM__SERVER__TLS__HANDSHAKE_TIMEOUT_MS", SHORT_TIMEOUT_MS.to_string())],
    )
    .await;
    let mut silent = TcpStream::connect(address(&server)).await.unwrap();
    // The first bytes of a TLS record header (a ClientHello), then nothing.
    silent.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let started = Instant::now();
    assert_eq!(
        server.get("/healthz", None).await.status,
        200,
        "others are served meanwhile"
    );
    let limit = Duration::from_millis(SHORT_TIMEOUT_MS + SLACK_MS);
    let sent = sent_before_close(&mut silent, limit).await;
    assert!(
        sent.is_some(),
        "a stalled handshake still holds its connection after {limit:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(SHORT_TIMEOUT_MS - 100),
        "not before the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_handshake_a_trickled_header_is_cut_at_the_header_read_timeout() {
    let (_directory, certificates) = certificates();
    let server = https_server(
        &certificates,
        &[("IDEM__SERVER__HEADER_READ_TIMEOUT_MS", SHORT_TIMEOUT_MS.to_string())],
    )
    .await;
    let mut slow = tls_client(&server, &certificates.ca_file).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: idem\r\nx-trickle: ")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    let started = Instant::now();
    let limit = Duration::from_millis(SHORT_TIMEOUT_MS + SLACK_MS);
    let sent = sent_before_close(&mut slow, limit)
        .await
        .unwrap_or_else(|| panic!("a half-sent header over TLS still holds its connection after {limit:?}"));
    let sent = String::from_utf8_lossy(&sent);
    assert!(
        sent.is_empty() || sent.starts_with("HTTP/1.1 408"),
        "cut without serving the request: {sent:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(SHORT_TIMEOUT_MS - 100));
}

/// Terminates TLS on a loopback port and relays each connection to
/// `backend` in plain TCP: the real carrier simulator behind real TLS.
async fn tls_terminator(certificates: &TestCertificates, backend: String) -> String {
    let chain = rustls::pki_types::CertificateDer::pem_file_iter(&certificates.server_cert_file)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&certificates.server_key_file).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                let Ok(mut client) = acceptor.accept(client).await else {
                    return;
                };
                if let Ok(mut upstream) = TcpStream::connect(&backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    url
}

async fn simulator() -> CarrierServer {
    let config = SimulatorConfig {
        latency_ms_min: 0,
        latency_ms_max: 0,
        ..SimulatorConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    CarrierServer::start(&config, listener).await.unwrap()
}

fn carrier_roots(ca_file: &Path) -> Vec<reqwest::Certificate> {
    reqwest::Certificate::from_pem_bundle(&std::fs::read(ca_file).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_carrier_is_trusted_through_its_ca_file_and_no_other() {
    let (_directory, certificates) = certificates();
    let carrier = simulator().await;
    let https_url = tls_terminator(
        &certificates,
        carrier.base_url().trim_start_matches("http://").to_owned(),
    )
    .await;
    let request = CarrierLabelRequest {
        order_id: order_id(),
        parcel_no: 1,
        label_version: 1,
        service: ShippingService::Express,
        weight_g: 1_000,
    };
    let timeout = Duration::from_secs(5);
    let trusting = CarrierClient::new(&https_url, timeout, carrier_roots(&certificates.ca_file)).unwrap();
    let bought = trusting.buy("carrier:tls:1", &request).await;
    assert!(
        matches!(bought, CarrierOutcome::Purchased { replayed: false, .. }),
        "{bought:?}"
    );
    let wrong = CarrierClient::new(&https_url, timeout, carrier_roots(&certificates.wrong_ca_file)).unwrap();
    let refused = wrong.buy("carrier:tls:2", &request).await;
    assert_eq!(
        refused,
        CarrierOutcome::Indeterminate {
            reason: "connection_error"
        }
    );

    // End to end: the Label service buys through the https:// carrier.
    let options = Options {
        carrier_url: Some(https_url),
        client_ca_file: Some(certificates.ca_file.clone()),
        extra_env: vec![(
            "IDEM__CARRIER__CA_FILE".to_owned(),
            certificates.ca_file.display().to_string(),
        )],
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let created = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    carrier.stop().await;
}

/// Runs the binary with `env` until it exits; its exit code and output.
async fn run_to_exit(env: &[(&str, String)]) -> (Option<i32>, String) {
    let directory = tempfile::tempdir().unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_server"))
            .current_dir(directory.path())
            .env_remove("RUST_LOG")
            .env("IDEM__SERVER__LISTEN", "127.0.0.1:0")
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .output(),
    )
    .await
    .expect("the server exits at startup")
    .unwrap();
    let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    (output.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_mismatched_certificate_file_is_refused_at_startup() {
    let (directory, certificates) = certificates();
    let missing = directory.path().join("missing.pem").display().to_string();
    let (code, text) = run_to_exit(&[
        ("IDEM__SERVER__TLS__CERT_FILE", missing.clone()),
        (
            "IDEM__SERVER__TLS__KEY_FILE",
            certificates.server_key_file.display().to_string(),
        ),
    ])
    .await;
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("server.tls.cert_file") && text.contains(&missing),
        "{text}"
    );
    // The client's key does not go with the server's certificate.
    let (code, text) = run_to_exit(&[
        (
            "IDEM__SERVER__TLS__CERT_FILE",
            certificates.server_cert_file.display().to_string(),
        ),
        (
            "IDEM__SERVER__TLS__KEY_FILE",
            certificates.client_key_file.display().to_string(),
        ),
    ])
    .await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("server.tls.key_file"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_postgres_ca_stops_the_server_at_startup() {
    let postgres = store_postgres::testkit::PostgresServer::shared_tls();
    let database = postgres.create_database().await.unwrap();
    let certificates = postgres.certificates().unwrap();
    let base = [
        ("IDEM__STORE__KIND", "postgres".to_owned()),
        ("IDEM__STORE__POSTGRES__URL", database.url.clone()),
        ("IDEM__STORE__POSTGRES__SSLMODE", "verify-full".to_owned()),
    ];
    let mut wrong = base.to_vec();
    wrong.push((
        "IDEM__STORE__POSTGRES__CA_FILE",
        certificates.wrong_ca_file.display().to_string(),
    ));
    let (code, text) = run_to_exit(&wrong).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("PostgreSQL TLS") && text.contains("UnknownIssuer"),
        "{text}"
    );
    // With the right CA the same server opens its store (and serves; the
    // in-process test below stops it).
    let options = Options {
        extra_env: base
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .chain([(
                "IDEM__STORE__POSTGRES__CA_FILE".to_owned(),
                certificates.ca_file.display().to_string(),
            )])
            .collect(),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let created = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_ca_stops_the_server_at_startup() {
    // TLS only, and a client certificate required (mutual TLS).
    let redis = store_redis::testkit::shared_tls_server().unwrap();
    let tls = redis.tls().unwrap();
    let settings = |ca_file: &Path| {
        vec![
            ("IDEM__STORE__KIND", "redis".to_owned()),
            ("IDEM__STORE__REDIS__URLS", format!("[\"{}\"]", redis.url())),
            ("IDEM__STORE__REDIS__CA_FILE", ca_file.display().to_string()),
            (
                "IDEM__STORE__REDIS__CLIENT_CERT_FILE",
                tls.certificates.client_cert_file.display().to_string(),
            ),
            (
                "IDEM__STORE__REDIS__CLIENT_KEY_FILE",
                tls.certificates.client_key_file.display().to_string(),
            ),
        ]
    };
    let (code, text) = run_to_exit(&settings(&tls.certificates.wrong_ca_file)).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("Redis TLS") && text.contains("UnknownIssuer"), "{text}");
    // With the right CA: records in Redis over TLS, a label bought end to end.
    let options = Options {
        extra_env: settings(&tls.certificates.ca_file)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let created = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
}
