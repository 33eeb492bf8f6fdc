//! The examples' applications, called in-process with
//! `tower::ServiceExt::oneshot`: the first request runs the route, a retry
//! with the same key replays it byte for byte with the replay header, and
//! a different body under the same key is refused with 422. The PostgreSQL
//! one runs against a real throw-away server (store-postgres's testkit).

#[allow(dead_code)]
#[path = "../examples/embedded.rs"]
mod embedded;
#[allow(dead_code)]
#[path = "../examples/postgres.rs"]
mod postgres;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use idem_http::{PROBLEM_JSON, Problem, REPLAYED_HEADER};
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

async fn post_order(app: &Router, key: Option<&str>, body: &str) -> Answer {
    let mut request = Request::post("/orders");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn problem_code(answer: &Answer) -> String {
    assert_eq!(answer.headers[header::CONTENT_TYPE], PROBLEM_JSON);
    serde_json::from_slice::<Problem>(&answer.body).unwrap().code
}

/// The behaviour both examples must show; `made` counts the route's runs.
async fn runs_once_replays_and_refuses_a_reused_key(app: Router, made: impl Fn() -> u64) {
    let first = post_order(&app, Some("order-1"), r#"{"item":"tea"}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.headers.get(REPLAYED_HEADER).is_none());
    assert_eq!(made(), 1, "the first request runs the route");

    let retry = post_order(&app, Some("order-1"), r#"{"item":"tea"}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.headers[REPLAYED_HEADER], "true");
    assert_eq!(retry.body, first.body, "the replay is byte for byte the first answer");
    assert_eq!(retry.headers[header::LOCATION], first.headers[header::LOCATION]);
    assert_eq!(made(), 1, "a retry does not run the route");

    let reused = post_order(&app, Some("order-1"), r#"{"item":"coffee"}"#).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem_code(&reused), "idempotency_key_reused");

    let missing = post_order(&app, None, r#"{"item":"tea"}"#).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(problem_code(&missing), "idempotency_key_missing");

    let another = post_order(&app, Some("order-2"), r#"{"item":"tea"}"#).await;
    assert_eq!(
        (another.status, made()),
        (StatusCode::CREATED, 2),
        "another key is another order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_example_runs_once_and_replays() {
    let orders = embedded::Orders::default();
    let app = embedded::app(embedded::open_store().unwrap(), orders.clone());
    runs_once_replays_and_refuses_a_reused_key(app, || orders.made()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_example_runs_once_and_replays() {
    let server = store_postgres::testkit::PostgresServer::start().expect("a throw-away PostgreSQL server");
    let database = server.create_database().await.expect("a fresh database");
    let store = postgres::open_store(&database.url).await.expect("the example's store");
    let orders = postgres::Orders::default();
    let app = postgres::app(store, orders.clone());
    runs_once_replays_and_refuses_a_reused_key(app, || orders.made()).await;
}
