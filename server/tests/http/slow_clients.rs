//! Slow and idle clients at the connection level, below any route: a
//! client that trickles a request head (slowloris) is cut at the
//! header-read timeout, an idle keep-alive connection is closed after the
//! same time, and the connection cap keeps a flood of open connections
//! from costing more than `server.connections_max` tasks; other clients are
//! served all along.

use crate::common::{Options, TestServer};
use server::backend::StoreKind;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The header-read timeout these tests configure.
const HEADER_READ_TIMEOUT_MS: u64 = 500;
/// Time allowed past a timeout for the server to act on it.
const SLACK_MS: u64 = 1_000;

async fn server_with(extra: &[(&str, String)]) -> TestServer {
    let options = Options {
        extra_env: extra
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect(),
        ..Options::default()
    };
    TestServer::start_with(StoreKind::Embedded, options).await
}

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// What the server did with a connection within `limit`: `None` if it
/// stayed open and silent, else what it sent before closing (empty: it
/// closed without a word).
async fn what_the_server_sent(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut received = Vec::new();
    let read = tokio::time::timeout(limit, stream.read_to_end(&mut received)).await;
    match read {
        Err(_still_open) if received.is_empty() => None,
        _ => Some(String::from_utf8_lossy(&received).into_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_header_is_cut_at_the_timeout_while_others_are_served() {
    let server = server_with(&[(
        "IDEM__SERVER__HEADER_READ_TIMEOUT_MS",
        HEADER_READ_TIMEOUT_MS.to_string(),
    )])
    .await;
    let mut slow = connect(&server).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: idem\r\nx-trickle: ")
        .await
        .unwrap();
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(
            server.get("/healthz", None).await.status,
            200,
            "others are served meanwhile"
        );
    }
    let limit = Duration::from_millis(HEADER_READ_TIMEOUT_MS + SLACK_MS);
    let sent = what_the_server_sent(&mut slow, limit).await;
    let sent = sent.unwrap_or_else(|| panic!("a half-sent header still holds its connection after {limit:?}"));
    assert!(
        sent.is_empty() || sent.starts_with("HTTP/1.1 408"),
        "cut without serving the request: {sent:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(HEADER_READ_TIMEOUT_MS - 100),
        "not before the timeout"
    );
    // The rest of the head, too late: nothing is served.
    let _ = slow.write_all(b"1\r\n\r\n").await;
    let late = what_the_server_sent(&mut slow, Duration::from_millis(SLACK_MS)).await;
    assert!(
        !late.unwrap_or_default().contains("200 OK"),
        "a cut request is never served"
    );
    assert_eq!(server.get("/healthz", None).await.status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_timeout() {
    let server = server_with(&[(
        "IDEM__SERVER__HEADER_READ_TIMEOUT_MS",
        HEADER_READ_TIMEOUT_MS.to_string(),
    )])
    .await;
    let mut idle = connect(&server).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: idem\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 4_096];
    let read = tokio::time::timeout(Duration::from_millis(SLACK_MS), idle.read(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    assert!(
        answer[..read].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer[..read])
    );
    let limit = Duration::from_millis(HEADER_READ_TIMEOUT_MS + SLACK_MS);
    let closed = what_the_server_sent(&mut idle, limit).await;
    assert_eq!(
        closed.as_deref(),
        Some(""),
        "an idle connection is closed, silently, within {limit:?}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let server = server_with(&[
        ("IDEM__SERVER__CONNECTIONS_MAX", "2".to_owned()),
        // Both from this test's one address: its cap is the whole cap.
        ("IDEM__SERVER__CONNECTIONS_PER_PEER_MAX", "2".to_owned()),
        ("IDEM__SERVER__HEADER_READ_TIMEOUT_MS", "10000".to_owned()),
    ])
    .await;
    let first = connect(&server).await;
    let _second = connect(&server).await;
    // Give the server time to accept both, so they hold both slots.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = connect(&server).await;
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: idem\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let waiting = what_the_server_sent(&mut third, Duration::from_millis(SLACK_MS)).await;
    assert_eq!(waiting, None, "a third connection is not served while two are open");
    drop(first);
    let served = what_the_server_sent(&mut third, Duration::from_millis(5 * SLACK_MS)).await;
    assert!(
        served.as_deref().unwrap_or_default().starts_with("HTTP/1.1 200"),
        "served once a slot is free: {served:?}"
    );
    server.shutdown().await;
}
