//! Every answer carries a request id (the caller's, when it is sane), a
//! saved answer the id of the request that did the work, and a W3C
//! `traceparent` from the caller reaches the carrier in the same trace.

use crate::common::{ALICE, Options, TestServer, client, fresh_key, label_body, order_id};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use server::backend::StoreKind;
use server::carrier::{CARRIER_LABELS_PATH, CarrierLabel, CarrierLabelRequest};
use std::sync::{Arc, Mutex};

fn is_generated_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn get_with(server: &TestServer, path: &str, request_id: Option<&str>) -> reqwest::Response {
    let mut request = client().get(format!("{}{path}", server.base));
    if let Some(id) = request_id {
        request = request.header("x-request-id", id);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_a_request_id_and_a_sane_incoming_one_is_kept() {
    let server = TestServer::start(StoreKind::Embedded).await;
    // Generated when absent, on answers of every kind.
    for path in ["/healthz", "/v1/labels/nope", "/nowhere", "/metrics"] {
        let response = get_with(&server, path, None).await;
        let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(is_generated_id(&id), "{path}: {id}");
    }
    // Two requests, two ids.
    let first = get_with(&server, "/healthz", None).await;
    let second = get_with(&server, "/healthz", None).await;
    assert_ne!(first.headers()["x-request-id"], second.headers()["x-request-id"]);
    // A sane incoming id is kept.
    let kept = get_with(&server, "/healthz", Some("fulfilment-4711.retry_2:a")).await;
    assert_eq!(kept.headers()["x-request-id"], "fulfilment-4711.retry_2:a");
    // An insane one (too long, or bytes outside the charset) is replaced.
    let long = "a".repeat(server::request_context::REQUEST_ID_BYTES_MAX + 1);
    for insane in [long.as_str(), "has space", "semi;colon", "quote\"d", ""] {
        let response = get_with(&server, "/healthz", Some(insane)).await;
        let id = response.headers()["x-request-id"].to_str().unwrap();
        assert!(is_generated_id(id), "{insane:?} -> {id}");
    }
    server.shutdown().await;
}

/// What the capturing carrier saw: the `traceparent` of each purchase.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

async fn capture(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> Response {
    let traceparent = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    seen.0.lock().unwrap().push(traceparent);
    let request: CarrierLabelRequest = serde_json::from_slice(&body).unwrap();
    let label = CarrierLabel {
        carrier_label_id: format!("lbl_{:016x}", request.order_id),
        tracking_no: format!("GRD{:09}001000042", request.order_id % 1_000_000_000),
        cost_cents: 510,
        order_id: request.order_id,
        parcel_no: request.parcel_no,
        label_version: request.label_version,
        service: request.service,
        weight_g: request.weight_g,
    };
    (StatusCode::CREATED, axum::Json(label)).into_response()
}

async fn capturing_carrier() -> (String, Seen) {
    let seen = Seen::default();
    let router = Router::new()
        .route(CARRIER_LABELS_PATH, post(capture))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (base, seen)
}

async fn create(server: &TestServer, traceparent: Option<&str>) -> u16 {
    let mut request = client()
        .post(format!("{}/v1/labels", server.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", fresh_key())
        .header("content-type", "application/json")
        .body(label_body(order_id(), 1));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.unwrap().status().as_u16()
}

/// `00-<trace id>-<parent id>-<flags>`, lowercase hex, ids not all zero.
fn parse(traceparent: &str) -> (String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert!(
        parts[1].len() == 32 && parts[2].len() == 16 && parts[3].len() == 2,
        "{traceparent}"
    );
    assert!(
        traceparent
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{traceparent}"
    );
    assert_ne!(parts[1], "0".repeat(32));
    assert_ne!(parts[2], "0".repeat(16));
    (parts[1].to_owned(), parts[2].to_owned(), parts[3].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_reaches_the_carrier_in_the_same_trace() {
    let (carrier, seen) = capturing_carrier().await;
    let options = Options {
        carrier_url: Some(carrier),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(create(&server, Some(incoming)).await, 201);
    // Invalid ones start a trace of their own, as does none at all.
    for invalid in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    ] {
        assert_eq!(create(&server, Some(invalid)).await, 201);
    }
    assert_eq!(create(&server, None).await, 201);
    let seen = seen.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 6);
    let sent: Vec<(String, String, String)> = seen
        .iter()
        .map(|traceparent| parse(traceparent.as_deref().expect("a traceparent on every carrier call")))
        .collect();
    let (trace_id, parent_id, flags) = &sent[0];
    assert_eq!(
        trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
        "the caller's trace continues"
    );
    assert_ne!(
        parent_id, "00f067aa0ba902b7",
        "the parent is our span, not the caller's"
    );
    assert_eq!(flags, "01", "the caller's sampling decision is kept");
    for (trace_id, _, _) in &sent[1..] {
        assert_ne!(
            trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
            "an invalid header starts a new trace"
        );
    }
    server.shutdown().await;
}

async fn create_with_request_id(server: &TestServer, key: &str, order_id: u64, request_id: &str) -> reqwest::Response {
    client()
        .post(format!("{}/v1/labels", server.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .header("x-request-id", request_id)
        .body(label_body(order_id, 1))
        .send()
        .await
        .unwrap()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|value| value.to_str().unwrap())
}

/// A saved answer names the attempt that did the work (`Original-Request`,
/// Stripe's convention), on the first run and on every replay, while each
/// answer's own `x-request-id` is its own request's. A new key for a parcel
/// that has its label is its own work: its answer names its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_answer_names_the_request_that_did_the_work_on_every_replay() {
    for backend in StoreKind::SELF_STARTED {
        let server = TestServer::start(backend).await;
        let (key, order) = (fresh_key(), order_id());
        let first = create_with_request_id(&server, &key, order, "fulfilment-1.try-1").await;
        assert_eq!(first.status(), 201, "{backend:?}");
        assert_eq!(
            header(&first, "original-request"),
            Some("fulfilment-1.try-1"),
            "{backend:?}"
        );
        let replay = create_with_request_id(&server, &key, order, "fulfilment-1.try-2").await;
        assert_eq!(header(&replay, "idempotent-replayed"), Some("true"), "{backend:?}");
        assert_eq!(
            header(&replay, "x-request-id"),
            Some("fulfilment-1.try-2"),
            "{backend:?}"
        );
        assert_eq!(
            header(&replay, "original-request"),
            Some("fulfilment-1.try-1"),
            "{backend:?}"
        );
        let other_key = create_with_request_id(&server, &fresh_key(), order, "fulfilment-2.try-1").await;
        assert_eq!(other_key.status(), 201, "{backend:?}");
        assert_eq!(header(&other_key, "idempotent-replayed"), None, "{backend:?}");
        assert_eq!(
            header(&other_key, "original-request"),
            Some("fulfilment-2.try-1"),
            "{backend:?}"
        );
        server.shutdown().await;
    }
}
