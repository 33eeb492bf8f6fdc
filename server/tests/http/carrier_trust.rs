//! How far the carrier is trusted: a tiny carrier of our own answers what
//! a real one might on a bad day (a bad credential, a redirect, an echo of
//! another parcel, a malformed label id, an endless body), and only a
//! label that matches the request, or an explicit business refusal, may be
//! saved under the caller's key.

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, order_id};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use server::backend::StoreKind;
use server::carrier::{CARRIER_LABELS_PATH, CarrierClient, CarrierLabel, CarrierLabelRequest, CarrierOutcome};
use server::labels::ShippingService;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the test carrier answers to a purchase.
type Answer = Arc<dyn Fn(CarrierLabelRequest) -> Response + Send + Sync>;

#[derive(Clone)]
struct TestCarrier {
    answer: Arc<Mutex<Answer>>,
}

impl TestCarrier {
    fn answer_with(&self, answer: impl Fn(CarrierLabelRequest) -> Response + Send + Sync + 'static) {
        *self.answer.lock().unwrap() = Arc::new(answer);
    }
}

async fn purchase(State(carrier): State<TestCarrier>, body: Bytes) -> Response {
    let request: CarrierLabelRequest = serde_json::from_slice(&body).unwrap();
    let answer = carrier.answer.lock().unwrap().clone();
    answer(request)
}

/// Where the redirect points: it sells, so following it would buy.
async fn sell_elsewhere(body: Bytes) -> Response {
    let request: CarrierLabelRequest = serde_json::from_slice(&body).unwrap();
    sold(&label_for(&request))
}

/// A label as a well-behaved carrier sells it for `request`.
fn label_for(request: &CarrierLabelRequest) -> CarrierLabel {
    CarrierLabel {
        carrier_label_id: format!("lbl_{:016x}", request.order_id),
        tracking_no: format!("EXP{:09}001000042", request.order_id % 1_000_000_000),
        cost_cents: 1_295,
        order_id: request.order_id,
        parcel_no: request.parcel_no,
        label_version: request.label_version,
        service: request.service,
        weight_g: request.weight_g,
    }
}

fn sold(label: &CarrierLabel) -> Response {
    (StatusCode::CREATED, axum::Json(label)).into_response()
}

/// Starts the test carrier: it sells well-formed labels until told otherwise.
async fn test_carrier() -> (String, TestCarrier) {
    let carrier = TestCarrier {
        answer: Arc::new(Mutex::new(Arc::new(|request| sold(&label_for(&request))))),
    };
    let router = Router::new()
        .route(CARRIER_LABELS_PATH, post(purchase))
        .route("/elsewhere", post(sell_elsewhere))
        .with_state(carrier.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (base, carrier)
}

fn request() -> CarrierLabelRequest {
    CarrierLabelRequest {
        order_id: order_id(),
        parcel_no: 1,
        label_version: 1,
        service: ShippingService::Express,
        weight_g: 1_000,
    }
}

async fn buy(base: &str) -> CarrierOutcome {
    let client = CarrierClient::new(base, Duration::from_secs(5), Vec::new()).unwrap();
    client.buy("carrier:t:trust", &request()).await
}

/// A bad credential (401, 403), a wrong URL (404) or a media type the
/// carrier does not take (415) says nothing about the parcel: it is not a
/// refusal to save for 24 h, it is "no answer" (release, 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_and_routing_errors_are_not_refusals() {
    let (base, carrier) = test_carrier().await;
    for status in [401, 403, 404, 415] {
        carrier.answer_with(move |_| StatusCode::from_u16(status).unwrap().into_response());
        let outcome = buy(&base).await;
        assert!(
            matches!(
                outcome,
                CarrierOutcome::Indeterminate {
                    reason: "unexpected_status"
                }
            ),
            "{status}: {outcome:?}"
        );
    }
    carrier.answer_with(|_| (StatusCode::UNPROCESSABLE_ENTITY, "no such service to that address").into_response());
    let refused = buy(&base).await;
    assert_eq!(
        refused,
        CarrierOutcome::Rejected {
            status: 422,
            detail: "no such service to that address".into()
        }
    );
    // A long refusal is read to the detail limit only, and keeps its start.
    carrier.answer_with(|_| (StatusCode::UNPROCESSABLE_ENTITY, "refused ".repeat(10_000)).into_response());
    let CarrierOutcome::Rejected { status: 422, detail } = buy(&base).await else {
        panic!("not a refusal")
    };
    assert_eq!(detail.len(), server::carrier::client::CARRIER_DETAIL_BYTES_MAX);
    assert!(detail.starts_with("refused refused"), "{detail}");
}

/// The carrier is called at one URL; a redirect elsewhere (which would
/// re-send the purchase, with our key, to wherever it points) is not followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_followed() {
    let (base, carrier) = test_carrier().await;
    carrier.answer_with(|_| {
        let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
        response
            .headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("/elsewhere"));
        response
    });
    let outcome = buy(&base).await;
    assert!(
        matches!(
            outcome,
            CarrierOutcome::Indeterminate {
                reason: "unexpected_status"
            }
        ),
        "{outcome:?}"
    );
}

/// A label for another parcel, another service or another weight is not
/// the label we asked for, and must not be stored as ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_of_another_parcel_is_not_a_purchase() {
    let (base, carrier) = test_carrier().await;
    let mutations: [fn(&mut CarrierLabel); 5] = [
        |label| label.order_id += 1,
        |label| label.parcel_no += 1,
        |label| label.label_version += 1,
        |label| label.service = ShippingService::Ground,
        |label| label.weight_g += 1,
    ];
    for mutate in mutations {
        carrier.answer_with(move |request| {
            let mut label = label_for(&request);
            mutate(&mut label);
            sold(&label)
        });
        let outcome = buy(&base).await;
        assert!(
            matches!(outcome, CarrierOutcome::Indeterminate { reason: "malformed" }),
            "{outcome:?}"
        );
    }
}

/// A label id we cannot use as a path segment and a storage key (empty,
/// too long, a slash, a space) or a tracking number out of bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_label_id_or_tracking_number_is_not_a_purchase() {
    let (base, carrier) = test_carrier().await;
    let long = "l".repeat(server::labels::LABEL_ID_BYTES_MAX + 1);
    for (label_id, tracking_no) in [
        ("", "EXP1"),
        (long.as_str(), "EXP1"),
        ("../admin", "EXP1"),
        ("lbl 1", "EXP1"),
        ("lbl_1", ""),
        ("lbl_1", "EXP\n1"),
    ] {
        let (label_id, tracking_no) = (label_id.to_owned(), tracking_no.to_owned());
        carrier.answer_with(move |request| {
            let mut label = label_for(&request);
            label.carrier_label_id = label_id.clone();
            label.tracking_no = tracking_no.clone();
            sold(&label)
        });
        let outcome = buy(&base).await;
        assert!(
            matches!(outcome, CarrierOutcome::Indeterminate { reason: "malformed" }),
            "{outcome:?}"
        );
    }
}

/// The carrier's body is read up to a limit, not whole: a label padded
/// past it is not read (nor trusted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_body_over_the_limit_is_not_read_whole() {
    let (base, carrier) = test_carrier().await;
    carrier.answer_with(|request| {
        let mut label = serde_json::to_value(label_for(&request)).unwrap();
        label["padding"] = "x".repeat(server::carrier::client::CARRIER_BODY_BYTES_MAX).into();
        (StatusCode::CREATED, axum::Json(label)).into_response()
    });
    let outcome = buy(&base).await;
    assert!(
        matches!(outcome, CarrierOutcome::Indeterminate { reason: "malformed" }),
        "{outcome:?}"
    );
}

/// End to end: a carrier answering 401 (a rotated credential) must not
/// poison the key with a saved 502. The caller gets 503
/// `downstream_unavailable`, and once the carrier is fixed the retry with
/// the same key buys the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_401_releases_the_key_and_the_retry_buys() {
    let (base, carrier) = test_carrier().await;
    let options = Options {
        carrier_url: Some(base),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    carrier.answer_with(|_| StatusCode::UNAUTHORIZED.into_response());
    let key = fresh_key();
    let body = label_body(order_id(), 1);
    let refused = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(
        (refused.status, refused.problem_code().as_str()),
        (503, "downstream_unavailable"),
        "{}",
        refused.text()
    );
    carrier.answer_with(|request| sold(&label_for(&request)));
    let retry = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (201, None),
        "{}",
        retry.text()
    );
    server.shutdown().await;
}

/// End to end: a carrier label id that cannot be stored no longer leaves
/// the key answering 500: it is 503, and the retry buys once the carrier
/// answers well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_label_id_answers_503_not_500() {
    let (base, carrier) = test_carrier().await;
    let options = Options {
        carrier_url: Some(base),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    carrier.answer_with(|request| {
        let mut label = label_for(&request);
        label.carrier_label_id = "l".repeat(server::labels::LABEL_ID_BYTES_MAX + 1);
        sold(&label)
    });
    let key = fresh_key();
    let body = label_body(order_id(), 1);
    let first = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(
        (first.status, first.problem_code().as_str()),
        (503, "downstream_unavailable"),
        "{}",
        first.text()
    );
    carrier.answer_with(|request| sold(&label_for(&request)));
    let retry = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    server.shutdown().await;
}
